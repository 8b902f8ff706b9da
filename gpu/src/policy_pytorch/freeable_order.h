// policy:pytorch: the order PyTorch 2.11 releases freeable private pools in
// (docs/pytorch-allocator.md §14.5). PyTorch keeps them in graph_pools_freeable, a
// ska::flat_hash_map (c10/util/flat_hash_map.h, sherwood_v3_table) keyed by MempoolId_t with
// MempoolIdHash (first, or second when first is 0), and walks it slot by slot; the walk shows in
// the trace and in the addresses handed out later. FreeableOrder is gpu/'s reproduction of that
// table's slot placement:
//   - 2^k buckets (none before the first insert; 4 at the first growth, then doubled; never
//     shrunk), max_lookups = max(4, k) probes, so buckets + max_lookups - 1 usable slots;
//   - the desired slot is Fibonacci hashing, (hash * 11400714819323198485) >> (64 - k);
//   - insert: walk while the slot's distance from its desired slot is >= ours; grow (and insert
//     again) when we reached max_lookups or the table would be more than half full; else take an
//     empty slot, or Robin Hood: take the slot and carry its entry on, growing when a carried
//     entry's distance reaches max_lookups in a slot it could not take;
//   - growth re-inserts the entries in slot order into the new table;
//   - erase: empty the slot and shift the following displaced entries back by one.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "cachet/types.h"

namespace cachet::gpu::detail {

struct PrivatePool;

class FreeableOrder {
 public:
  void insert(PoolId id, PrivatePool* pool);  // no effect when `id` is already there
  void erase(PoolId id);                      // no effect when `id` is not there
  bool contains(PoolId id) const;
  std::size_t size() const { return count_; }
  // The pools in PyTorch's iteration order (slot order).
  std::vector<PrivatePool*> in_order() const;
  std::vector<PoolId> ids_in_order() const;

 private:
  struct Slot {
    std::int8_t distance = -1;  // from the desired slot; -1: empty
    PoolId id;
    PrivatePool* pool = nullptr;
  };
  static std::uint64_t hash(PoolId id) { return id.first != 0 ? id.first : id.second; }
  std::size_t desired(PoolId id) const;
  void emplace(Slot entry);
  void grow();
  void rehash(std::size_t buckets);

  std::vector<Slot> slots_;  // buckets_ + max_lookups_ - 1 usable slots
  std::size_t buckets_ = 0;
  int log2_buckets_ = 0;
  int max_lookups_ = 3;  // ska's value before the first insert
  std::size_t count_ = 0;
};

}  // namespace cachet::gpu::detail

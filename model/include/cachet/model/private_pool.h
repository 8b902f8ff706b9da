// cachet/model/private_pool.h: PyTorch 2.11's private pools (docs/pytorch-allocator.md §14).
//
// A private pool is a small and a large BlockPool of its own, named by a PoolId. Allocations go
// to it while it is active (use_mem_pool, or a CUDA graph capture: Allocator::
// begin_allocate_to_pool); blocks return to it when freed, whenever that happens. Its segments
// go back to the device only after its last user released it (use_count 0, "freeable") and
// only by release_cached_blocks (empty_cache, a MemPool's destructor, the last retry of malloc).
// The pool itself is forgotten when, freeable, its device allocation count is 0; if blocks of it
// are still mapped then (expandable segments only, §14.8.1) the object stays, orphaned.
//
// Invariants (Allocator::check_invariants, docs/invariants.md): [INV-SEG-3] the blocks of a
// segment share its pool, so a private pool's blocks never reach another pool, and every block's
// pool is a known or an orphaned one; [INV-PRIV-1] use_count >= 0 and the pool is freeable
// exactly at 0; [INV-PRIV-2] for a pool that never reserved an expandable segment,
// device_allocs equals its number of segments.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "cachet/types.h"
#include "cachet/model/block.h"

namespace cachet::model {

struct PrivatePool {
  explicit PrivatePool(PoolId pool_id) : id(pool_id) {}
  PrivatePool(const PrivatePool&) = delete;
  PrivatePool& operator=(const PrivatePool&) = delete;

  PoolId id;
  // Users: the MemPool object, each use_mem_pool context, each graph captured into it
  // (create_or_incref_pool +1, release_pool -1; born at 1, §14.4).
  int use_count = 1;
  // PyTorch's cudaMalloc_count: +1 per successful alloc_block into the pool (a cudaMalloc, or one
  // growth of an expandable segment), -1 per release_block or unmap_block (§14.5). Expandable
  // segments can unmap more ranges than they grew by: PyTorch's assertion (§14.8).
  int device_allocs = 0;
  // It reserved an expandable segment (find_expandable_block): from then on device_allocs no
  // longer follows its segments ([INV-PRIV-2] does not apply).
  bool had_expandable = false;
  BlockPool large{false, this};
  BlockPool small{true, this};
};

// PyTorch keeps the freeable pools in a ska::flat_hash_map keyed by MempoolIdHash (first, or
// second when first is 0) and releases them in that map's iteration order, which shows in the
// trace (§14.5). FreeableOrder reproduces that order: open addressing with Robin Hood probing,
// Fibonacci hashing over a power-of-two slot count that starts at 4 and doubles when the map
// would be more than half full, backward-shift erase; it never shrinks.
class FreeableOrder {
 public:
  void insert(PrivatePool* p);
  void erase(const PrivatePool* p);
  bool contains(const PrivatePool* p) const;
  std::size_t size() const { return count_; }
  // The pools in PyTorch's iteration order.
  std::vector<PrivatePool*> in_order() const;

 private:
  struct Slot {
    std::int8_t distance = -1;  // -1: empty
    PrivatePool* pool = nullptr;
  };
  static std::uint64_t hash(const PrivatePool* p) {
    return p->id.first != 0 ? p->id.first : p->id.second;
  }
  std::size_t index_for(std::uint64_t h) const {
    return static_cast<std::size_t>((11400714819323198485ull * h) >> shift_);
  }
  void grow();
  void rehash(std::size_t buckets);
  void emplace(PrivatePool* p);
  std::vector<Slot> slots_;     // buckets + max_lookups - 1 usable slots
  std::size_t buckets_ = 0;
  int shift_ = 63;
  int max_lookups_ = 4;
  std::size_t count_ = 0;
};

// PyTorch keeps the pools marked use_on_oom in a ska::flat_hash_set of ids with the same hash as
// graph_pools_freeable (§15.2), so they are walked in the order FreeableOrder gives. A PoolIdOrder
// holds one stand-in PrivatePool per id, there only to carry the id into that order.
class PoolIdOrder {
 public:
  void insert(PoolId id);  // no effect when already there
  void erase(PoolId id);   // no effect when not there
  bool empty() const { return order_.size() == 0; }
  std::vector<PoolId> in_order() const;

 private:
  std::vector<std::unique_ptr<PrivatePool>> stand_ins_;
  FreeableOrder order_;
};

}  // namespace cachet::model

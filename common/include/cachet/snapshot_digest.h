// cachet/snapshot_digest.h: a 64-bit digest of a snapshot (cachet/snapshot.h), for checks that
// compare two allocators' snapshots after every operation (the lockstep harness) without building
// them: each allocator feeds SnapshotDigest its own segments and blocks, walking its own
// structures (model::Allocator::snapshot_digest, gpu/'s CachingAllocator::snapshot_digest), and
// digest(snapshot) gives the same value for the snapshot it would build. Equal snapshots have
// equal digests; different ones differ but for a 64-bit collision. Only the encoding is shared
// here: what each side feeds it is that side's own reading of its state.
//
// A segment's blocks come first, in address order, then the segment itself (its sizes are sums
// over its blocks); the segments may come in any order (the digest is their sum: a snapshot lists
// them in address order, so their order carries nothing).
#pragma once

#include <cstdint>

#include "cachet/snapshot.h"
#include "cachet/types.h"

namespace cachet {

class SnapshotDigest {
 public:
  // One block of the segment under way, in address order.
  void block(std::uint64_t address, Bytes size, Bytes requested_size, BlockState state) {
    add(address);
    add(size);
    add(requested_size);
    add(static_cast<std::uint64_t>(state) + 1);
  }
  // Ends the segment whose blocks were given since the last one.
  void segment(std::uint64_t address, Bytes total_size, StreamId stream, bool is_large, bool is_expandable,
               PoolId pool_id, bool is_sleeping, Bytes backup_size) {
    add(address);
    add(total_size);
    add(stream);
    add((is_large ? 1u : 0u) | (is_expandable ? 2u : 0u) | (is_sleeping ? 4u : 0u));
    add(pool_id.first);
    add(pool_id.second);
    add(backup_size);
    sum_ += mix(cur_);
    ++segments_;
    cur_ = kSeed;
  }
  std::uint64_t value() const { return mix(sum_ ^ mix(segments_ + kSeed)); }

 private:
  static constexpr std::uint64_t kSeed = 0x9e3779b97f4a7c15ull;
  static std::uint64_t mix(std::uint64_t x) {  // splitmix64's finalizer
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return x;
  }
  void add(std::uint64_t v) { cur_ = mix(cur_ ^ v) + kSeed; }
  std::uint64_t cur_ = kSeed;
  std::uint64_t sum_ = 0;
  std::uint64_t segments_ = 0;
};

// The digest of a snapshot built: what an allocator's snapshot_digest() must equal.
inline std::uint64_t digest(const Snapshot& snapshot) {
  SnapshotDigest d;
  for (const SegmentSnapshot& s : snapshot) {
    for (const BlockSnapshot& b : s.blocks) d.block(b.address, b.size, b.requested_size, b.state);
    d.segment(s.address, s.total_size, s.stream, s.is_large, s.is_expandable, s.pool_id, s.is_sleeping,
              s.backup_size);
  }
  return d.value();
}

}  // namespace cachet

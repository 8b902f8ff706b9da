// cachet/snapshot.h: torch.cuda.memory_snapshot()'s segments and blocks.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "cachet/types.h"

namespace cachet {

enum class BlockState : std::uint8_t {
  ActiveAllocated,    // "active_allocated": handed out
  ActivePendingFree,  // "active_pending_free": freed, waiting for stream-use events
  Inactive,           // "inactive": free, in its pool
};

std::string_view to_string(BlockState s);
std::optional<BlockState> block_state_from_string(std::string_view s);

struct BlockSnapshot {
  std::uint64_t address = 0;
  Bytes size = 0;
  Bytes requested_size = 0;  // stale on free blocks, as PyTorch reports it
  BlockState state = BlockState::Inactive;
  friend bool operator==(const BlockSnapshot&, const BlockSnapshot&) = default;
};

struct SegmentSnapshot {
  std::uint64_t address = 0;
  Bytes total_size = 0;
  StreamId stream = 0;
  bool is_large = false;       // segment_type "large" (else "small")
  bool is_expandable = false;
  PoolId pool_id;  // segment_pool_id: its pool (docs/pytorch-allocator.md §14.1)
  // cachet's marks (docs/sleep-wake.md §5), absent from PyTorch's snapshots: the segment is
  // asleep (its addresses reserved, no memory behind them; its blocks keep their states), and
  // the bytes of its blocks backed up on the host.
  bool is_sleeping = false;
  Bytes backup_size = 0;
  std::vector<BlockSnapshot> blocks;  // address order, tiling the segment

  Bytes allocated_size() const;  // sum of active_allocated block sizes
  Bytes active_size() const;     // sum of active_* block sizes
  Bytes requested_size() const;  // sum of requested sizes of active blocks
  friend bool operator==(const SegmentSnapshot&, const SegmentSnapshot&) = default;
};

// Segments sorted by address, as memory_snapshot() lists them.
using Snapshot = std::vector<SegmentSnapshot>;

}  // namespace cachet

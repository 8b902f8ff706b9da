#include "cachet/snapshot.h"

namespace cachet {

std::string_view to_string(BlockState s) {
  switch (s) {
    case BlockState::ActiveAllocated: return "active_allocated";
    case BlockState::ActivePendingFree: return "active_pending_free";
    case BlockState::Inactive: return "inactive";
  }
  return "unknown";
}

std::optional<BlockState> block_state_from_string(std::string_view s) {
  if (s == "active_allocated") return BlockState::ActiveAllocated;
  if (s == "active_pending_free") return BlockState::ActivePendingFree;
  if (s == "inactive") return BlockState::Inactive;
  return std::nullopt;
}

Bytes SegmentSnapshot::allocated_size() const {
  Bytes n = 0;
  for (const auto& b : blocks)
    if (b.state == BlockState::ActiveAllocated) n += b.size;
  return n;
}

Bytes SegmentSnapshot::active_size() const {
  Bytes n = 0;
  for (const auto& b : blocks)
    if (b.state != BlockState::Inactive) n += b.size;
  return n;
}

Bytes SegmentSnapshot::requested_size() const {
  Bytes n = 0;
  for (const auto& b : blocks)
    if (b.state != BlockState::Inactive) n += b.requested_size;
  return n;
}

}  // namespace cachet

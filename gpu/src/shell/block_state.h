// gpu/src/shell/block_state.h: the state of a block, the same five in both policies
// (policy:pytorch's Block, policy:cachet's CBlock). Every block is in exactly one BlockState, the
// only record of what it is; no boolean says it again. docs/pytorch-allocator.md §2.5, §6, §7.
//   Allocated       handed out by malloc; in the policy's active table. record_stream() adds
//                   stream uses only in this state.
//   AwaitingEvents  freed after other streams used it: one event per using stream was recorded
//                   and event_count (> 0) of them are outstanding; still in the active table, in
//                   no free set, reused by nobody (the snapshot's active_pending_free).
//   Free            mapped and reusable: in its pool's size-ordered free set (policy:pytorch: out
//                   of it only between the best fit that found it and the carve that hands it
//                   out).
//   Unmapped        addresses with no memory behind them (policy:pytorch: expandable segments
//                   only; policy:cachet: the reservation's unmapped pages); in the address-ordered
//                   unmapped set.
//   Deferred        policy:pytorch: freed after other streams used it while a capture or
//                   use_mem_pool was under way, so no event could be recorded; it keeps its stream
//                   uses, stays in the active table and waits in the policy's deferred list until
//                   no capture is under way (docs/pytorch-allocator.md §14.7; the snapshot's
//                   active_pending_free). policy:cachet the same while any pool is active (R12,
//                   cachet/gpu/policy_cachet.h), then events on every stream it was used on.
// The legal transitions, [INV-STATE-1] (set_state aborts on any other: a policy bug, never bad
// input):
//   born Free               a new cudaMalloc segment (§3.2), a split's new block, the mapped
//                           pieces an unmap leaves
//   born Unmapped           a new reservation, the unmapped rest of a map (§7)
//   Free -> Allocated               the block handed out (§2.4)
//   Allocated -> Free               free() with no stream uses: free_block at once (§2.5)
//   Allocated -> AwaitingEvents     free() with stream uses, after its events are recorded (§6)
//   AwaitingEvents -> Free          its last event completed (§6)
//   Allocated -> Deferred           free() with stream uses while a capture is under way (§14.7)
//   Deferred -> AwaitingEvents      no capture under way any more: events on its remaining uses
//   Deferred -> Free                the same, when every use was made during a capture (§14.7)
//   Free -> Unmapped                its pages unmapped (§3.4, §7)
//   Unmapped -> Free                its pages mapped (§7)
//   Free or Unmapped -> gone        merged into a neighbour in the same state (§2.5), or given
//                                   back to the device (§3.4, §7)
// What each policy's invariants() checks against the other fields: [INV-POOL-1] the state names
// the one container the block is in; [INV-EVENT-1] event_count > 0 exactly in AwaitingEvents;
// [INV-EVENT-3] stream uses only in Allocated and Deferred (never empty there); [INV-MAP-1] an
// Unmapped block is not active.
#pragma once

#include <cstdint>

#include "cachet/gpu/backend.h"
#include "cachet/snapshot.h"

namespace cachet::gpu::detail {

// Not the snapshot's cachet::BlockState (active_allocated, active_pending_free, inactive), which
// shows only mapped blocks: snapshot_state() maps one to the other.
enum class BlockState : std::uint8_t { Allocated, AwaitingEvents, Free, Unmapped, Deferred };

const char* state_name(BlockState s);

// [INV-STATE-1]: the transitions of the table above, one bit per (from, to) pair.
constexpr unsigned transition_bit(BlockState from, BlockState to) {
  return 1u << (5 * static_cast<unsigned>(from) + static_cast<unsigned>(to));
}
inline constexpr unsigned kLegalTransitions =
    transition_bit(BlockState::Free, BlockState::Allocated) |            // handed out
    transition_bit(BlockState::Allocated, BlockState::Free) |            // freed, no stream uses
    transition_bit(BlockState::Allocated, BlockState::AwaitingEvents) |  // freed with stream uses
    transition_bit(BlockState::AwaitingEvents, BlockState::Free) |       // last event completed
    transition_bit(BlockState::Free, BlockState::Unmapped) |             // pages unmapped
    transition_bit(BlockState::Unmapped, BlockState::Free) |             // pages mapped
    transition_bit(BlockState::Allocated, BlockState::Deferred) |        // freed in a capture (§14.7)
    transition_bit(BlockState::Deferred, BlockState::AwaitingEvents) |   // capture over, events
    transition_bit(BlockState::Deferred, BlockState::Free);              // capture over, no uses left

constexpr bool legal_transition(BlockState from, BlockState to) {
  return (kLegalTransitions & transition_bit(from, to)) != 0;
}
// A block is born, and leaves (merged or given back), only Free or Unmapped.
constexpr bool born_or_gone(BlockState s) { return s == BlockState::Free || s == BlockState::Unmapped; }

// Print the ID ([INV-STATE-1]), the block and what went wrong, and abort (an allocator bug: its
// state can no longer be trusted, so nothing is thrown back through it). Out of line, off the
// hot path.
[[noreturn]] void illegal_transition(BlockState from, BlockState to, DevicePtr ptr);
[[noreturn]] void illegal_birth_or_removal(const char* what, BlockState s, DevicePtr ptr);

// The one writer of a block's state (each policy's block type holds one: Block::set_state,
// CBlock::set_state). A check costs one bit test on the hot path.
inline void check_transition(BlockState from, BlockState to, DevicePtr ptr) {
  if (!legal_transition(from, to)) [[unlikely]]
    illegal_transition(from, to, ptr);
}
inline void check_born_or_gone(const char* what, BlockState s, DevicePtr ptr) {
  if (!born_or_gone(s)) [[unlikely]]
    illegal_birth_or_removal(what, s, ptr);
}

// The state memory_snapshot() shows (§8) for a mapped block.
constexpr cachet::BlockState snapshot_state(BlockState s) {
  return s == BlockState::Allocated                                        ? cachet::BlockState::ActiveAllocated
         : s == BlockState::AwaitingEvents || s == BlockState::Deferred ? cachet::BlockState::ActivePendingFree
                                                                         : cachet::BlockState::Inactive;
}

}  // namespace cachet::gpu::detail

// The block states of gpu/ (gpu/src/shell/block_state.h), shared by both policies: the legal
// transitions ([INV-STATE-1]) against the table written out by hand from the header's comment
// (docs/pytorch-allocator.md §2.5, §6, §7), and the abort on anything else.
#include <gtest/gtest.h>

#include "shell/block_state.h"

namespace {

using cachet::gpu::detail::BlockState;
using cachet::gpu::detail::born_or_gone;
using cachet::gpu::detail::check_born_or_gone;
using cachet::gpu::detail::check_transition;
using cachet::gpu::detail::legal_transition;
using cachet::gpu::detail::snapshot_state;

constexpr BlockState kAll[] = {BlockState::Allocated, BlockState::AwaitingEvents, BlockState::Free,
                               BlockState::Unmapped, BlockState::Deferred};

TEST(BlockState, LegalTransitionsAreExactlyTheTable) {
  // Rows: from; columns: to; in the order Allocated, AwaitingEvents, Free, Unmapped, Deferred.
  const bool table[5][5] = {
      {false, true, true, false, true},     // Allocated -> AwaitingEvents (free with stream uses), Free,
                                            //   Deferred (free with stream uses in a capture, §14.7)
      {false, false, true, false, false},   // AwaitingEvents -> Free (last event completed)
      {true, false, false, true, false},    // Free -> Allocated (handed out), Unmapped (pages unmapped)
      {false, false, true, false, false},   // Unmapped -> Free (pages mapped)
      {false, true, true, false, false}};   // Deferred -> AwaitingEvents, Free (capture over, §14.7)
  for (int f = 0; f < 5; ++f)
    for (int t = 0; t < 5; ++t)
      EXPECT_EQ(legal_transition(kAll[f], kAll[t]), table[f][t]) << "from " << f << " to " << t;
}

TEST(BlockState, BornAndGoneOnlyFreeOrUnmapped) {
  EXPECT_FALSE(born_or_gone(BlockState::Allocated));
  EXPECT_FALSE(born_or_gone(BlockState::AwaitingEvents));
  EXPECT_TRUE(born_or_gone(BlockState::Free));
  EXPECT_TRUE(born_or_gone(BlockState::Unmapped));
  EXPECT_FALSE(born_or_gone(BlockState::Deferred));
}

TEST(BlockState, SnapshotShowsPyTorchsThreeStates) {
  EXPECT_EQ(snapshot_state(BlockState::Allocated), cachet::BlockState::ActiveAllocated);
  EXPECT_EQ(snapshot_state(BlockState::AwaitingEvents), cachet::BlockState::ActivePendingFree);
  EXPECT_EQ(snapshot_state(BlockState::Free), cachet::BlockState::Inactive);
  EXPECT_EQ(snapshot_state(BlockState::Deferred), cachet::BlockState::ActivePendingFree);
}

TEST(BlockStateDeathTest, IllegalTransitionAborts) {
  check_transition(BlockState::Free, BlockState::Allocated, 0x1000);  // legal: returns
  EXPECT_DEATH(check_transition(BlockState::Free, BlockState::AwaitingEvents, 0x1000),
               "\\[INV-STATE-1\\] block at 0x1000: Free -> AwaitingEvents is not a legal transition");
  EXPECT_DEATH(check_transition(BlockState::Unmapped, BlockState::Allocated, 0x2000),
               "Unmapped -> Allocated");
  EXPECT_DEATH(check_born_or_gone("removed", BlockState::Allocated, 0x3000),
               "\\[INV-STATE-1\\] block at 0x3000: removed in state Allocated");
}

}  // namespace

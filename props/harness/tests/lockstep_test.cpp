// The lockstep harness: agreement on a small sequence, and a planted
// disagreement it must report.
#include <gtest/gtest.h>

#include "cachet/lockstep.h"

namespace cachet::lockstep {
namespace {

TEST(Lockstep, AgreesOnASmallSequence) {
  Options o;
  o.capacity = 1 * GiB;
  PytorchLockstep ls(o);
  const auto ops = parse_ops(R"(alloc 1000 s0
alloc 3000000 s1
record h0 s2
free h0
alloc 600000000 s0
alloc 600000000 s0
complete s2
alloc 100 s0
free h1
free h1
free h9
fraction 0.5
empty_cache
)");
  EXPECT_EQ(ls.run(ops), std::nullopt);
  EXPECT_EQ(ls.handle_count(), 4u);
  EXPECT_FALSE(ls.live(1));
  EXPECT_GE(ls.model().stats().num_ooms, 1);
}

TEST(Lockstep, ReportsADisagreement) {
  PytorchLockstep ls(Options{});
  ASSERT_EQ(ls.apply(Allocate{1000, 0, {}}), std::nullopt);
  ls.model().malloc(512, 0);  // behind the runner's back: the stats now differ
  auto d = ls.apply(Allocate{1000, 0, {}});
  ASSERT_TRUE(d.has_value());
  EXPECT_NE(d->find("differ"), std::string::npos) << *d;
}

TEST(Lockstep, ComparesTraceEventsInOrder) {
  PytorchLockstep ls(Options{});
  ASSERT_EQ(ls.apply(Allocate{1000, 0, {}}), std::nullopt);
  // The sut's trace is on, and holds only the last op's events (segment_alloc, alloc) and the
  // snapshot event of the comparison's memory_snapshot().
  const auto t = ls.sut().trace();
  ASSERT_EQ(t.size(), 3u);
  EXPECT_EQ(t[2].action, TraceAction::Snapshot);
  EXPECT_EQ(t[0].action, TraceAction::SegmentAlloc);
  EXPECT_EQ(t[1].action, TraceAction::Alloc);
  // Behind the runner's back the model sees a stream use: its free waits for an event (one
  // event), the sut's completes at once (two): no result or device call differs, the trace does.
  ls.model().record_stream(ls.address(0), 1);
  auto d = ls.apply(Free{0});
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->rfind("trace events differ at event #1 of this op (model 1 events, sut 2)", 0), 0u) << *d;
  EXPECT_NE(d->find("model: (no more events)"), std::string::npos) << *d;
  EXPECT_NE(d->find("sut:   free_completed addr 0x"), std::string::npos) << *d;
}

// Ids addressing (recordings): an id is bound only when its allocation returns memory, so a
// free of an OOMed id is skipped and later ids still name the right blocks.
TEST(Lockstep, IdsAddressing) {
  Options o;
  o.capacity = 1 * GiB;
  PytorchLockstep ls(o);
  const auto ops = parse_ops(R"(alloc h10 1000 s0
alloc h11 2000000000 s0
alloc h12 3000 s0
free h11
free h10
record h12 s1
)");
  EXPECT_EQ(ls.run(ops), std::nullopt);
  EXPECT_EQ(ls.handle_count(), 2u);
  EXPECT_FALSE(ls.live(10));
  EXPECT_FALSE(ls.live(11));
  EXPECT_TRUE(ls.live(12));
  EXPECT_EQ(ls.live_handles(), std::vector<Handle>{12});
  EXPECT_EQ(ls.requested(12), 3000u);
}

// Pool and capture ops: both sides answer "not supported yet (issue 16)", nothing applied.
TEST(Lockstep, PoolOpsAreNotSupportedYet) {
  PytorchLockstep ls(Options{});
  const auto d = ls.apply(ops::UseMemPoolBegin{0});
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->rfind("not supported yet (issue 16): use_pool p0\n", 0), 0u) << *d;
  EXPECT_EQ(ls.last_sut().kind, Outcome::Kind::Unsupported);
  EXPECT_EQ(ls.last_model().kind, Outcome::Kind::Unsupported);
  EXPECT_EQ(show(ls.last_sut()), "not supported yet (issue 16): use_pool p0");
  EXPECT_EQ(ls.apply(Allocate{1000, 0, {}}), std::nullopt);  // and the pair goes on
}

// A pair runs its own policy only.
TEST(Lockstep, PairAndPolicyMustMatch) {
  Options o;
  o.config.policy = Policy::Cachet;
  EXPECT_THROW(PytorchLockstep{o}, std::invalid_argument);
  EXPECT_THROW(CachetLockstep{Options{}}, std::invalid_argument);
  EXPECT_NO_THROW(CachetLockstep{o});
  EXPECT_TRUE(visit_policy(Policy::Cachet, []<class LS>(std::type_identity<LS>) {
    return std::is_same_v<LS, CachetLockstep>;
  }));
}

}  // namespace
}  // namespace cachet::lockstep

// The lockstep harness: text round trip, agreement on a small sequence, and a planted
// disagreement it must report.
#include <gtest/gtest.h>

#include "cachet/lockstep.h"

namespace cachet::lockstep {
namespace {

TEST(Lockstep, ShowParseRoundTrip) {
  const std::vector<Op> ops{Allocate{1048577, 2}, Free{3}, RecordStream{1, 3}, CompleteEvents{1},
                            EmptyCache{}, SetMemoryFraction{0.123456789012345}};
  const std::string text = show(ops);
  EXPECT_EQ(parse_ops("# comment\n\n" + text), ops);
  EXPECT_FALSE(parse_op("alloc 12"));
  EXPECT_FALSE(parse_op("free 3"));
  EXPECT_THROW(parse_ops("alloc 1 s0\nbogus\n"), std::invalid_argument);
}

TEST(Lockstep, AgreesOnASmallSequence) {
  Options o;
  o.capacity = 1 * GiB;
  Lockstep ls(o);
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
  Lockstep ls(Options{});
  ASSERT_EQ(ls.apply(Allocate{1000, 0}), std::nullopt);
  ls.model().malloc(512, 0);  // behind the runner's back: the stats now differ
  auto d = ls.apply(Allocate{1000, 0});
  ASSERT_TRUE(d.has_value());
  EXPECT_NE(d->find("differ"), std::string::npos) << *d;
}

TEST(Lockstep, ComparesTraceEventsInOrder) {
  Lockstep ls(Options{});
  ASSERT_EQ(ls.apply(Allocate{1000, 0}), std::nullopt);
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

TEST(Lockstep, CaseFileRoundTrip) {
  Case c;
  c.config = "max_split_size_mb:128,garbage_collection_threshold:0.5";
  c.capacity = 256 * MiB;
  c.ops = {Allocate{1000, 1}, Free{0}, EmptyCache{}, SetMemoryFraction{0.25}};
  const std::string text = show_case(c);
  EXPECT_EQ(text.rfind("# config: max_split_size_mb:128,garbage_collection_threshold:0.5\n# capacity: 268435456\n", 0),
            0u);
  const Case back = parse_case("# a comment\n" + text);
  EXPECT_EQ(back.config, c.config);
  EXPECT_EQ(back.capacity, c.capacity);
  EXPECT_EQ(back.ops, c.ops);
  EXPECT_EQ(parse_case("alloc 1 s0\n").capacity, 8 * GiB);  // defaults
  EXPECT_THROW(parse_case("# capacity: lots\n"), std::invalid_argument);
}

}  // namespace
}  // namespace cachet::lockstep

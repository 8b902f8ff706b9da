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

}  // namespace
}  // namespace cachet::lockstep

#include <gtest/gtest.h>

#include <set>

#include "cachet/stats.h"
#include "cachet/trace.h"

namespace cachet {
namespace {

TEST(Stats, FlattenHasPyTorchs122SortedKeys) {
  DeviceStats s;
  auto kv = flatten(s);
  ASSERT_EQ(kv.size(), 122u);
  std::set<std::string> keys;
  for (const auto& [k, v] : kv) keys.insert(k);
  EXPECT_EQ(keys.size(), 122u);
  EXPECT_TRUE(keys.count("allocated_bytes.all.current"));
  EXPECT_TRUE(keys.count("inactive_split_bytes.small_pool.peak"));
  EXPECT_TRUE(keys.count("oversize_segments.freed"));
  EXPECT_TRUE(keys.count("num_sync_all_streams"));
  EXPECT_EQ(kv.front().first, "active.all.allocated");
  EXPECT_EQ(kv.back().first, "segment.small_pool.peak");
  EXPECT_TRUE(std::is_sorted(kv.begin(), kv.end()));
}

TEST(Stats, IncreaseDecreaseFollowPyTorch) {
  Stat st;
  st.increase(10);
  st.increase(5);
  st.decrease(12);
  EXPECT_EQ(st, (Stat{3, 15, 15, 12}));
  st.reset_peak();
  EXPECT_EQ(st.peak, 3);
  st.reset_accumulated();
  EXPECT_EQ(st, (Stat{3, 3, 0, 0}));
}

TEST(Stats, UnflattenInvertsFlatten) {
  DeviceStats s;
  s.allocated_bytes[2].increase(4096);
  s.num_ooms = 3;
  s.max_split_size = 41943040;
  s.oversize_segments.increase(1);
  std::map<std::string, std::int64_t> kv;
  for (auto& [k, v] : flatten(s)) kv[k] = v;
  kv["bogus"] = 1;
  std::vector<std::string> unknown;
  EXPECT_EQ(unflatten(kv, &unknown), s);
  EXPECT_EQ(unknown, std::vector<std::string>{"bogus"});
}

TEST(Trace, ActionNamesRoundTrip) {
  for (auto a : {TraceAction::Alloc, TraceAction::FreeRequested, TraceAction::FreeCompleted,
                 TraceAction::SegmentAlloc, TraceAction::SegmentFree, TraceAction::SegmentMap,
                 TraceAction::SegmentUnmap, TraceAction::Snapshot, TraceAction::Oom})
    EXPECT_EQ(trace_action_from_string(to_string(a)), a);
  EXPECT_EQ(to_string(TraceAction::FreeCompleted), "free_completed");
  EXPECT_FALSE(trace_action_from_string("segment_mapped"));
}

}  // namespace
}  // namespace cachet

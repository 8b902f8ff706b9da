// The op vocabulary (cachet/ops.h): every op's line, written out by hand, parses to the op and
// prints back the same; the recordings' pool and capture ops; the two addressings; case files.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "cachet/ops.h"

namespace cachet::ops {
namespace {

TEST(Ops, EveryOpHasOneLine) {
  const std::vector<std::pair<Op, std::string>> rows{
      {Allocate{1048577, 2, {}}, "alloc 1048577 s2"},
      {Allocate{28, 877637248, 2}, "alloc h2 28 s877637248"},
      {Free{3}, "free h3"},
      {RecordStream{1, 3}, "record h1 s3"},
      {CompleteEvents{1}, "complete s1"},
      {CompleteAllEvents{}, "complete_all"},
      {EmptyCache{}, "empty_cache"},
      {SetMemoryFraction{0.123456789012345}, "fraction 0.123456789012345"},
      {SetMemoryFraction{0.5}, "fraction 0.5"},
      {UseMemPoolBegin{4}, "use_pool p4"},
      {UseMemPoolEnd{4}, "end_pool p4"},
      {ReleasePool{0}, "release_pool p0"},
      {CaptureBegin{0, 2, std::nullopt}, "capture_begin g0 s2 pool new"},
      {CaptureBegin{3, 1, 0}, "capture_begin g3 s1 pool g0"},
      {CaptureEnd{3}, "capture_end g3"},
      {GraphReset{1}, "graph_reset g1"},
      {SetTag{"weights"}, "tag weights"},
      {SetTag{"default"}, "tag default"},
      {Sleep{{}, {}}, "sleep tags all backup none"},
      {Sleep{{}, {"weights"}}, "sleep tags all backup weights"},
      {Sleep{{"weights", "kv_cache"}, {"weights"}}, "sleep tags weights,kv_cache backup weights"},
      {Wake{{}}, "wake tags all"},
      {Wake{{"kv-cache.1", "w_2"}}, "wake tags kv-cache.1,w_2"},
      {WaitStream{2, 1}, "wait_stream s2 s1"},
      {Kernel{3}, "kernel s3"},
      {SetAllocatorSettings{"graph_capture_record_stream_reuse:True"}, "cfg graph_capture_record_stream_reuse:True"},
  };
  for (const auto& [op, line] : rows) {
    EXPECT_EQ(show(op), line);
    const auto back = parse_op(line);
    ASSERT_TRUE(back.has_value()) << line;
    EXPECT_EQ(*back, op) << line;
  }
}

TEST(Ops, PoolOpsAreMarked) {
  EXPECT_TRUE(is_pool_op(UseMemPoolBegin{0}));
  EXPECT_TRUE(is_pool_op(CaptureBegin{0, 1, std::nullopt}));
  EXPECT_TRUE(is_pool_op(GraphReset{0}));
  EXPECT_FALSE(is_pool_op(Allocate{1, 0, {}}));
  EXPECT_FALSE(is_pool_op(CompleteAllEvents{}));
  EXPECT_FALSE(is_pool_op(Sleep{}));
}

TEST(Ops, SleepOpsAreMarked) {
  EXPECT_TRUE(is_sleep_op(SetTag{"weights"}));
  EXPECT_TRUE(is_sleep_op(Sleep{}));
  EXPECT_TRUE(is_sleep_op(Wake{}));
  EXPECT_FALSE(is_sleep_op(Allocate{1, 0, {}}));
  EXPECT_FALSE(is_sleep_op(UseMemPoolBegin{0}));
}

TEST(Ops, StreamOpsAreMarked) {
  EXPECT_TRUE(is_stream_op(WaitStream{1, 2}));
  EXPECT_TRUE(is_stream_op(Kernel{1}));
  EXPECT_FALSE(is_stream_op(SetAllocatorSettings{"expandable_segments:True"}));
  EXPECT_FALSE(is_stream_op(CaptureBegin{0, 1, std::nullopt}));
  EXPECT_FALSE(is_pool_op(WaitStream{1, 2}));
}

TEST(Ops, RejectsMalformedLines) {
  for (const char* bad : {"alloc 12", "free 3", "alloc x s0", "alloc 1 0", "record h1", "fraction", "fraction 0.5x",
                          "use_pool 3", "capture_begin g0 s1", "capture_begin g0 s1 pool", "capture_begin g0 s1 pool 2",
                          "graph_reset p1", "bogus", "complete_all s1", "alloc h1 2 3 s0", "tag", "tag all", "tag none",
                          "tag a b", "tag a,b", "tag we!ghts", "sleep", "sleep tags all", "sleep tags backup none",
                          "sleep tags a,a backup none", "sleep tags a, backup none", "sleep tags none backup none",
                          "sleep tags all backup all", "wake", "wake tags", "wake tags none", "wake all",
                          "wake tags ,a", "wait_stream s1", "wait_stream 1 2", "wait_stream s1 s2 s3", "kernel",
                          "kernel 2", "kernel s1 s2", "cfg", "cfg a b"})
    EXPECT_FALSE(parse_op(bad).has_value()) << bad;
}

TEST(Ops, ParseOpsNamesTheBadLine) {
  try {
    (void)parse_ops("alloc 1 s0\n# c\n\nbogus op\n");
    FAIL() << "no exception";
  } catch (const std::invalid_argument& e) {
    const std::string m = e.what();
    EXPECT_EQ(m.rfind("line 4: not an op: 'bogus op' (expected one of: alloc <bytes> s<stream>", 0), 0u) << m;
  }
}

TEST(Ops, Addressing) {
  EXPECT_EQ(addressing(parse_ops("alloc 1 s0\nfree h0\n")), Addressing::Handles);
  EXPECT_EQ(addressing(parse_ops("alloc h7 1 s0\nfree h7\n")), Addressing::Ids);
  EXPECT_EQ(addressing({}), Addressing::Handles);
  try {
    (void)parse_ops("alloc 1 s0\nalloc h1 2 s0\n");
    FAIL() << "no exception";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()).rfind("line 2: the list mixes", 0), 0u) << e.what();
  }
}

TEST(Ops, CaseFileRoundTrip) {
  Case c;
  c.config = "max_split_size_mb:128,garbage_collection_threshold:0.5";
  c.capacity = 256 * MiB;
  c.ops = {Allocate{1000, 1, {}}, Free{0}, EmptyCache{}, SetMemoryFraction{0.25}, UseMemPoolBegin{1}};
  const std::string text = show_case(c);
  EXPECT_EQ(text,
            "# config: max_split_size_mb:128,garbage_collection_threshold:0.5\n# capacity: 268435456\n"
            "alloc 1000 s1\nfree h0\nempty_cache\nfraction 0.25\nuse_pool p1\n");
  const Case back = parse_case("# a comment\n" + text);
  EXPECT_EQ(back.config, c.config);
  EXPECT_EQ(back.capacity, c.capacity);
  EXPECT_EQ(back.ops, c.ops);
  EXPECT_EQ(parse_case("alloc 1 s0\n").capacity, 8 * GiB);  // defaults
  EXPECT_EQ(parse_case("alloc 1 s0\n").config, "");
  EXPECT_THROW((void)parse_case("# capacity: lots\n"), std::invalid_argument);
  EXPECT_FALSE(back.events_when_recorded);
}

// t<k>: the thread of an alloc or a use_pool (docs/pytorch-allocator.md §14.10.2); absent: 0.
TEST(Ops, Threads) {
  EXPECT_EQ(parse_op("alloc 1000 s1 t2"), Op(Allocate{1000, 1, {}, 2}));
  EXPECT_EQ(parse_op("alloc h7 1000 s1 t3"), Op(Allocate{1000, 1, 7, 3}));
  EXPECT_EQ(parse_op("alloc 1000 s1"), Op(Allocate{1000, 1, {}, 0}));
  EXPECT_EQ(parse_op("use_pool p4 t1"), Op(UseMemPoolBegin{4, 1}));
  EXPECT_EQ(show(Allocate{1000, 1, {}, 2}), "alloc 1000 s1 t2");
  EXPECT_EQ(show(Allocate{1000, 1, 7, 3}), "alloc h7 1000 s1 t3");
  EXPECT_EQ(show(Allocate{1000, 1, {}, 0}), "alloc 1000 s1");
  EXPECT_EQ(show(UseMemPoolBegin{4, 1}), "use_pool p4 t1");
  EXPECT_EQ(show(UseMemPoolBegin{4, 0}), "use_pool p4");
  EXPECT_EQ(parse_op("alloc 1000 s1 tx"), std::nullopt);
  EXPECT_EQ(parse_op("alloc 1000 s1 t99999999999"), std::nullopt);
  EXPECT_EQ(parse_op("end_pool p4 t1"), std::nullopt);  // only alloc and use_pool name a thread
}

// "# events: when-recorded": every event completes when recorded (props_gpu_test's cases).
TEST(Ops, CaseFileEventsWhenRecorded) {
  Case c;
  c.config = "expandable_segments:True";
  c.ops = {Allocate{1073741824, 1, {}}, RecordStream{0, 0}};
  c.events_when_recorded = true;
  const std::string text = show_case(c);
  EXPECT_EQ(text,
            "# config: expandable_segments:True\n# capacity: 8589934592\n# events: when-recorded\n"
            "alloc 1073741824 s1\nrecord h0 s0\n");
  const Case back = parse_case(text);
  EXPECT_TRUE(back.events_when_recorded);
  EXPECT_EQ(back.ops, c.ops);
  try {
    (void)parse_case("# events: sometimes\n");
    ADD_FAILURE() << "a bad events line was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()),
              "bad events line: '# events: sometimes' (expected '# events: when-recorded', or no events line: "
              "events then complete only at complete ops)");
  }
}

// "# device total: N": a device of N bytes with the capacity as a cap (props_gpu_test's cases).
TEST(Ops, CaseFileDeviceTotal) {
  Case c;
  c.ops = {Allocate{9 * GiB, 0, {}}};
  c.events_when_recorded = true;
  c.device_total = 85899345920;  // 80 GiB
  const std::string text = show_case(c);
  EXPECT_EQ(text,
            "# config: \n# capacity: 8589934592\n# events: when-recorded\n# device total: 85899345920\n"
            "alloc 9663676416 s0\n");
  const Case back = parse_case(text);
  EXPECT_EQ(back.device_total, std::optional<Bytes>(85899345920));
  EXPECT_EQ(back.capacity, 8 * GiB);
  EXPECT_EQ(back.ops, c.ops);
  EXPECT_EQ(parse_case("alloc 1 s0\n").device_total, std::nullopt);  // default: none
  for (const char* bad : {"# device total: 0\n", "# device total: lots\n"}) {
    try {
      (void)parse_case(bad);
      ADD_FAILURE() << "accepted: " << bad;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("expected '# device total: <bytes>', a whole number above 0"),
                std::string::npos)
          << e.what();
    }
  }
}

}  // namespace
}  // namespace cachet::ops

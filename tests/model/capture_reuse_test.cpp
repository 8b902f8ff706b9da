// graph_capture_record_stream_reuse:True (docs/pytorch-allocator.md §14.10.1): the capture graph
// (cachet/model/capture_graph.h) and frees during a capture on several streams. Values worked by
// hand from §14.10.1; the first test is PyTorch's test_graph_capture_reclaim_2_streams, whose
// recording (tests/data/oracle-issue23/results/res_reclaim_2_streams.json.gz) shows the same
// offsets: the block freed before the join is not reused (a3 at +1024), after it it is (a4 at +512).
#include "cachet/errors.h"
#include "cachet/model/capture_graph.h"
#include "harness.h"

namespace cachet::model::test {
namespace {

PoolRoute capture(StreamId s) { return PoolRoute{PoolRoute::Kind::CaptureStream, s}; }
constexpr PoolId kGraph{1, 0};

TEST(CaptureGraph, ForkKernelJoinAndEnd) {
  CaptureGraphs g;
  EXPECT_EQ(g.begin(1), 1u);
  EXPECT_FALSE(g.capture_of(2).has_value());
  g.wait_stream(2, 1);  // fork: stream 2 joins with stream 1's (empty) dependencies
  EXPECT_EQ(g.capture_of(2), std::optional<CaptureId>(1));
  EXPECT_TRUE(g.terminals(2).empty());
  g.kernel(2);  // node 1
  EXPECT_EQ(g.terminals(2), (std::set<NodeId>{1}));
  EXPECT_THROW(g.check_end(1), UsageError);  // stream 2's kernel is not joined back
  EXPECT_THROW(g.begin(2), UsageError);      // stream 2 captures already
  g.kernel(1);  // node 2, on the origin: still not after node 1
  EXPECT_THROW(g.end(1), UsageError);
  EXPECT_EQ(g.capture_of(2), std::optional<CaptureId>(1));  // the refusal changed nothing
  g.wait_stream(1, 2);  // join: the origin depends on nodes 2 and 1
  EXPECT_EQ(g.terminals(1), (std::set<NodeId>{1, 2}));
  g.kernel(1);  // node 3 after both
  std::set<NodeId> visited;
  g.add_ancestors(g.terminals(1), visited);
  EXPECT_EQ(visited, (std::set<NodeId>{1, 2, 3}));
  g.end(1);
  EXPECT_FALSE(g.capture_of(1).has_value());
  EXPECT_FALSE(g.capture_of(2).has_value());  // a joined stream stops capturing with the capture
  EXPECT_FALSE(g.any());
}

TEST(CaptureGraph, RefusesIsolationAndMerge) {
  CaptureGraphs g;
  g.begin(1);
  g.begin(2);
  EXPECT_THROW(g.wait_stream(1, 2), UsageError);  // two captures would merge
  EXPECT_THROW(g.wait_stream(1, 3), UsageError);  // a capture waits on work outside it
  g.wait_stream(3, 4);                            // no capture involved: nothing
  EXPECT_FALSE(g.capture_of(3).has_value());
  g.kernel(4);  // not capturing: no node
  EXPECT_TRUE(g.terminals(4).empty());
}

// test_graph_capture_reclaim_2_streams (ops_reclaim_2_streams after the generator's tensors):
// a1 is used on stream 2 by a kernel and freed; stream 1 depends on nothing yet, so a3 cannot have
// it; once stream 1 waited on stream 2 and ran a kernel, a4 gets a1's block, no event.
TEST(CaptureReuse, ReclaimTwoStreams) {
  Device d(conf("graph_capture_record_stream_reuse:True"));
  d.alloc.begin_allocate_to_pool(kGraph, capture(1));
  const auto a0 = d.malloc(32, 1);
  const auto a1 = d.malloc(32, 1);
  d.alloc.wait_stream(2, 1);
  const auto a2 = d.malloc(32, 2);  // stream 2 joined the capture: the graph's pool
  d.alloc.kernel(2);
  d.alloc.record_stream(a1, 2);
  d.free(a1);  // markers: stream 1's terminals (none) and stream 2's (its kernel)
  const auto a3 = d.malloc(32, 1);
  EXPECT_EQ(a1 - a0, 512u);
  EXPECT_EQ(a3 - a0, 1024u);  // not reused: stream 1 is not ordered after the kernel
  EXPECT_EQ(d.alloc.stats().active_bytes[0].current, 4 * 512);  // a1 still active (deferred)
  d.alloc.wait_stream(1, 2);
  d.alloc.kernel(1);
  const auto a4 = d.malloc(32, 1);
  EXPECT_EQ(a4, a1);  // reused during the capture
  const auto& t = d.alloc.trace();
  ASSERT_GE(t.size(), 2u);
  EXPECT_EQ(t[t.size() - 2].action, TraceAction::FreeCompleted);
  EXPECT_EQ(t[t.size() - 2].addr, a1);
  EXPECT_EQ(d.alloc.stats().active_bytes[0].current, 4 * 512);
  const Snapshot s = d.alloc.snapshot();
  ASSERT_EQ(s.size(), 2u);  // stream 1's and stream 2's segments, both the graph's
  EXPECT_EQ(s[0].pool_id, kGraph);
  EXPECT_EQ(s[1].pool_id, kGraph);
  EXPECT_EQ(s[1].stream, 2u);
  (void)a2;
  d.alloc.end_allocate_to_pool(kGraph);
  d.alloc.check_invariants();
}

// The same sequence with the option off: the free waits for the end of the capture (§14.7).
TEST(CaptureReuse, OffWaitsForTheEnd) {
  Device d;
  d.alloc.begin_allocate_to_pool(kGraph, capture(1));
  const auto a0 = d.malloc(32, 1);
  const auto a1 = d.malloc(32, 1);
  d.alloc.wait_stream(2, 1);
  d.alloc.kernel(2);
  d.alloc.record_stream(a1, 2);
  d.free(a1);
  d.alloc.wait_stream(1, 2);
  d.alloc.kernel(1);
  const auto a4 = d.malloc(32, 1);
  EXPECT_EQ(a4 - a0, 1024u);
  d.alloc.end_allocate_to_pool(kGraph);
  d.alloc.check_invariants();
}

// A capture ends only with its forked streams joined back; refused, nothing changes.
TEST(CaptureReuse, EndRefusesAnUnjoinedStream) {
  Device d;
  d.alloc.begin_allocate_to_pool(kGraph, capture(1));
  d.alloc.wait_stream(2, 1);
  d.alloc.kernel(2);
  EXPECT_THROW(d.alloc.end_allocate_to_pool(kGraph), UsageError);
  EXPECT_TRUE(d.alloc.capture_underway());
  EXPECT_THROW(d.alloc.begin_allocate_to_pool(PoolId{2, 0}, capture(2)), UsageError);  // 2 captures
  EXPECT_EQ(d.alloc.pool_use_count(kGraph), 1);
  d.alloc.wait_stream(1, 2);
  d.alloc.end_allocate_to_pool(kGraph);
  EXPECT_FALSE(d.alloc.capture_underway());
  d.malloc(32, 2);  // stream 2 no longer captures: the default pool
  EXPECT_EQ(d.alloc.snapshot().back().pool_id, PoolId{});
}

// A marker that the allocating stream's work is not ordered after keeps the block deferred: a
// kernel on stream 1 after the free but without waiting on stream 2 is not enough.
TEST(CaptureReuse, OwnKernelAloneIsNotEnough) {
  Device d(conf("graph_capture_record_stream_reuse:True"));
  d.alloc.begin_allocate_to_pool(kGraph, capture(1));
  const auto a0 = d.malloc(32, 1);
  const auto a1 = d.malloc(32, 1);
  d.alloc.wait_stream(2, 1);
  d.alloc.kernel(2);
  d.alloc.record_stream(a1, 2);
  d.alloc.kernel(1);
  d.free(a1);  // markers: stream 1's kernel and stream 2's
  d.alloc.kernel(1);
  EXPECT_EQ(d.malloc(32, 1) - a0, 1024u);
  d.alloc.wait_stream(1, 2);
  EXPECT_EQ(d.malloc(32, 1), a1);  // now after both
  d.alloc.end_allocate_to_pool(kGraph);
}

}  // namespace
}  // namespace cachet::model::test

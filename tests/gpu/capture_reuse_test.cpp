// graph_capture_record_stream_reuse:True in gpu/'s policy:pytorch on the host backend, whose
// simulated capture graph (cachet/gpu/host_backend.h, "Captures") gpu/ reads as it reads
// cudaStreamGetCaptureInfo on a device (docs/pytorch-allocator.md §14.10.1). Values worked by hand;
// the first test is PyTorch's test_graph_capture_reclaim_2_streams, as recorded in
// tests/data/oracle-issue23/results/res_reclaim_2_streams.json.gz (a3 at +1024, a4 reuses a1).
#include <gtest/gtest.h>

#include "cachet/errors.h"
#include "gpu_test_support.h"

namespace cachet::test {
namespace {

constexpr PoolId kGraph{1, 0};
PoolRoute capture_on(StreamId s) { return PoolRoute{PoolRoute::Kind::CaptureStream, s}; }
std::uint64_t addr(void* p) { return reinterpret_cast<std::uintptr_t>(p); }

// The runner's part: the device's capture begins with the pool and ends before it.
void begin(HostAlloc& h, StreamId s) {
  h.a->begin_allocate_to_pool(kGraph, capture_on(s));
  ASSERT_TRUE(h.sim->capture_begin(s).is_ok());
}
void end(HostAlloc& h, StreamId s) {
  ASSERT_TRUE(h.sim->capture_end(s).is_ok());
  h.a->end_allocate_to_pool(kGraph);
}

TEST(GpuCaptureReuse, ReclaimTwoStreams) {
  HostAlloc h = host_alloc("graph_capture_record_stream_reuse:True");
  h.a->set_trace(true);
  begin(h, 1);
  void* a0 = h.a->allocate(32, 1);
  void* a1 = h.a->allocate(32, 1);
  ASSERT_TRUE(h.sim->wait_stream(2, 1).is_ok());
  void* a2 = h.a->allocate(32, 2);
  h.sim->kernel(2);
  h.a->record_stream(a1, 2);
  h.a->free(a1);
  void* a3 = h.a->allocate(32, 1);
  EXPECT_EQ(addr(a1) - addr(a0), 512u);
  EXPECT_EQ(addr(a3) - addr(a0), 1024u);  // stream 1 is not ordered after stream 2's kernel
  EXPECT_EQ(cur(h.a->stats().active_bytes), 4 * 512);
  ASSERT_TRUE(h.sim->wait_stream(1, 2).is_ok());
  h.sim->kernel(1);
  void* a4 = h.a->allocate(32, 1);
  EXPECT_EQ(a4, a1);  // reused during the capture, no event
  const auto t = h.a->trace();
  ASSERT_GE(t.size(), 2u);
  EXPECT_EQ(t[t.size() - 2].action, TraceAction::FreeCompleted);
  EXPECT_EQ(t[t.size() - 2].addr, addr(a1));
  const Snapshot s = h.a->snapshot();
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(s[0].pool_id, kGraph);
  EXPECT_EQ(s[1].pool_id, kGraph);  // stream 2 joined the capture: its allocation is the graph's
  EXPECT_EQ(s[1].stream, 2u);
  (void)a2;
  end(h, 1);
}

TEST(GpuCaptureReuse, OffWaitsForTheEnd) {
  HostAlloc h = host_alloc();
  begin(h, 1);
  void* a0 = h.a->allocate(32, 1);
  void* a1 = h.a->allocate(32, 1);
  ASSERT_TRUE(h.sim->wait_stream(2, 1).is_ok());
  h.sim->kernel(2);
  h.a->record_stream(a1, 2);
  h.a->free(a1);
  ASSERT_TRUE(h.sim->wait_stream(1, 2).is_ok());
  h.sim->kernel(1);
  EXPECT_EQ(addr(h.a->allocate(32, 1)) - addr(a0), 1024u);
  end(h, 1);
}

TEST(GpuCaptureReuse, OwnKernelAloneIsNotEnough) {
  HostAlloc h = host_alloc("graph_capture_record_stream_reuse:True");
  begin(h, 1);
  void* a0 = h.a->allocate(32, 1);
  void* a1 = h.a->allocate(32, 1);
  ASSERT_TRUE(h.sim->wait_stream(2, 1).is_ok());
  h.sim->kernel(2);
  h.a->record_stream(a1, 2);
  h.sim->kernel(1);
  h.a->free(a1);
  h.sim->kernel(1);
  EXPECT_EQ(addr(h.a->allocate(32, 1)) - addr(a0), 1024u);
  ASSERT_TRUE(h.sim->wait_stream(1, 2).is_ok());
  EXPECT_EQ(h.a->allocate(32, 1), a1);
  end(h, 1);
}

// The simulated driver: an unjoined fork, waiting on work outside the capture, two captures.
TEST(GpuCaptureReuse, HostSimRefusals) {
  HostAlloc h = host_alloc();
  ASSERT_TRUE(h.sim->capture_begin(1).is_ok());
  ASSERT_TRUE(h.sim->capture_begin(5).is_ok());
  EXPECT_FALSE(h.sim->capture_begin(1).is_ok());
  EXPECT_FALSE(h.sim->wait_stream(1, 3).is_ok());  // isolation
  EXPECT_FALSE(h.sim->wait_stream(1, 5).is_ok());  // merge
  ASSERT_TRUE(h.sim->wait_stream(2, 1).is_ok());
  h.sim->kernel(2);
  const auto st = h.sim->capture_end(1);
  EXPECT_EQ(st.message, "cudaStreamEndCapture(stream 1): stream 2 joined the capture and its work was not joined back "
                        "into the origin (cudaErrorStreamCaptureUnjoined); make the origin wait on it first");
  EXPECT_TRUE(h.sim->capture_info(2).value.capturing);  // nothing changed
  ASSERT_TRUE(h.sim->wait_stream(1, 2).is_ok());
  EXPECT_TRUE(h.sim->capture_end(1).is_ok());
  EXPECT_FALSE(h.sim->capture_info(2).value.capturing);
  EXPECT_TRUE(h.sim->capture_end(5).is_ok());
}

}  // namespace
}  // namespace cachet::test

// Device calls while a CUDA graph is being captured (docs/pytorch-allocator.md §14.7, §14.8.2):
// the CUDA backends (cachet/gpu/cuda_backend.h) under a real stream capture. Label gpu; every test
// skips without a CUDA device.
//
// What PyTorch 2.11 does, and so what is expected: cudaMalloc (and the VMM calls of a growth) run
// in relaxed capture mode when the current stream is capturing, so the capture stays valid; no
// event is recorded on a capturing stream nor queried or waited for while the current stream
// captures; giving memory back (cudaFree, cuMemUnmap) is refused, and the allocator's state is
// unchanged. The sizes are PyTorch's rules worked by hand: a 4 MiB request gets a 20 MiB segment
// (§1.3), with expandable segments one 20 MiB page (§7).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "cachet/config.h"
#include "cachet/errors.h"
#include "cachet/gpu/allocator.h"
#include "cachet/gpu/cuda_backend.h"

namespace cachet {
namespace {

using gpu::CurrentStream;

bool have_device() { return gpu::cuda_device_count() > 0; }

std::int64_t reserved(const CachingAllocator& a) { return a.stats().reserved_bytes[0].current; }

// A non-blocking stream that captures in `mode` from construction to end().
class Capture {
 public:
  explicit Capture(cudaStreamCaptureMode mode = cudaStreamCaptureModeGlobal) {
    EXPECT_EQ(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking), cudaSuccess);
    EXPECT_EQ(cudaStreamBeginCapture(s_, mode), cudaSuccess);
  }
  ~Capture() {
    if (!ended_) (void)end();
    (void)cudaStreamDestroy(s_);
  }
  Capture(const Capture&) = delete;
  Capture& operator=(const Capture&) = delete;

  cudaStream_t stream() const { return s_; }
  StreamId id() const { return static_cast<StreamId>(reinterpret_cast<std::uintptr_t>(s_)); }
  bool active() const {
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    return cudaStreamIsCapturing(s_, &st) == cudaSuccess && st == cudaStreamCaptureStatusActive;
  }
  // Ends the capture; true when it produced a valid graph (it was not invalidated).
  bool end() {
    ended_ = true;
    cudaGraph_t g = nullptr;
    const cudaError_t e = cudaStreamEndCapture(s_, &g);
    if (g) (void)cudaGraphDestroy(g);
    (void)cudaGetLastError();
    return e == cudaSuccess && g != nullptr;
  }

 private:
  cudaStream_t s_ = nullptr;
  bool ended_ = false;
};

std::unique_ptr<CachingAllocator> allocator(const std::string& conf) {
  Config c = parse_config(conf).config;
  c.validate = true;
  return CachingAllocator::for_cuda_device(0, c);
}

#define SKIP_WITHOUT_DEVICE() \
  if (!have_device()) GTEST_SKIP() << "no CUDA device or driver"

TEST(CaptureDeviceCalls, CudaMallocOnTheCapturingStreamKeepsTheCapture) {
  SKIP_WITHOUT_DEVICE();
  gpu::CudaRuntimeBackend b(0);
  Capture cap;
  gpu::Result<gpu::DevicePtr> r;
  {
    CurrentStream cs(cap.id());
    r = b.malloc(2 * MiB);
  }
  ASSERT_TRUE(r.is_ok()) << r.status.message;
  EXPECT_TRUE(cap.active());
  EXPECT_EQ(cudaMemsetAsync(reinterpret_cast<void*>(r.value), 0, 2 * MiB, cap.stream()), cudaSuccess);
  EXPECT_TRUE(cap.end()) << "the capture was invalidated";
  EXPECT_TRUE(b.free(r.value).is_ok());
}

// Without a current stream the backend calls cudaMalloc as PyTorch does on a stream that is not
// capturing: under a global-mode capture the driver refuses and invalidates the capture (the
// failure issue 16 reports from the plug-in before this rule).
TEST(CaptureDeviceCalls, WithoutTheCurrentStreamTheDriverRefuses) {
  SKIP_WITHOUT_DEVICE();
  gpu::CudaRuntimeBackend b(0);
  Capture cap;
  auto r = b.malloc(2 * MiB);
  EXPECT_FALSE(r.is_ok());
  EXPECT_NE(r.status.message.find("cudaErrorStreamCaptureUnsupported"), std::string::npos) << r.status.message;
  EXPECT_FALSE(cap.end());
}

TEST(CaptureDeviceCalls, NoEventIsRecordedQueriedOrAwaitedDuringACapture) {
  SKIP_WITHOUT_DEVICE();
  gpu::CudaRuntimeBackend b(0);
  auto e = b.event_create();
  ASSERT_TRUE(e.is_ok());
  Capture cap;
  const gpu::Status rec = b.event_record(e.value, cap.id());
  EXPECT_FALSE(rec.is_ok());
  EXPECT_NE(rec.message.find("cudaEventRecord refused: stream 0x"), std::string::npos) << rec.message;
  EXPECT_NE(rec.message.find("is capturing a CUDA graph"), std::string::npos) << rec.message;
  EXPECT_NE(rec.message.find("§14.7"), std::string::npos) << rec.message;
  {
    CurrentStream cs(cap.id());
    auto q = b.event_query(e.value);
    EXPECT_FALSE(q.is_ok());
    EXPECT_NE(q.status.message.find("cudaEventQuery refused"), std::string::npos) << q.status.message;
    const gpu::Status w = b.event_synchronize(e.value);
    EXPECT_NE(w.message.find("cudaEventSynchronize refused"), std::string::npos) << w.message;
  }
  EXPECT_TRUE(cap.active());
  EXPECT_TRUE(cap.end());
  // After the capture the same calls work.
  cudaStream_t other = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking), cudaSuccess);
  const StreamId oid = static_cast<StreamId>(reinterpret_cast<std::uintptr_t>(other));
  EXPECT_TRUE(b.event_record(e.value, oid).is_ok());
  EXPECT_TRUE(b.event_synchronize(e.value).is_ok());
  auto q = b.event_query(e.value);
  EXPECT_TRUE(q.is_ok() && q.value);
  b.event_destroy(e.value);
  (void)cudaStreamDestroy(other);
}

// A stream first seen while it captures (torch.cuda.graph's own capture stream is new to the
// allocator when nothing ran on it before): it is accepted and the capture stays valid (asking
// cudaStreamGetDevice about it would invalidate the capture: seen on the H100 run of 2026-11-25).
TEST(CaptureDeviceCalls, StreamFirstSeenDuringItsCapture) {
  SKIP_WITHOUT_DEVICE();
  gpu::CudaRuntimeBackend b(0);
  Capture cap;
  EXPECT_TRUE(b.stream_valid(cap.id()));
  EXPECT_TRUE(cap.active());
  EXPECT_TRUE(cap.end()) << "the capture was invalidated";
}

// Through the allocator: a capture grows the default pool with a new segment, and empty_cache
// during the capture is a DeviceError that leaves the allocator as it was and the capture valid.
void allocate_and_release_during_capture(const std::string& conf) {
  auto a = allocator(conf);
  a->free(a->allocate(4 * MiB, 0));  // a cached segment on stream 0, made before the capture
  ASSERT_EQ(reserved(*a), 20 * MiB);
  Capture cap;
  void* p = nullptr;
  {
    CurrentStream cs(cap.id());
    p = a->allocate(4 * MiB, cap.id());  // a new segment (stream pools are separate, §2.2)
    EXPECT_EQ(reserved(*a), 40 * MiB);
    EXPECT_EQ(cudaMemsetAsync(p, 0, 4 * MiB, cap.stream()), cudaSuccess);
    const auto stats = a->stats();
    const auto snap = a->snapshot();
    ASSERT_EQ(snap.size(), 2u);
    try {
      a->empty_cache();
      ADD_FAILURE() << "empty_cache during a capture gave memory back";
    } catch (const DeviceError& e) {
      EXPECT_NE(std::string(e.what()).find("§14.8.2"), std::string::npos) << e.what();
    }
    EXPECT_EQ(reserved(*a), 40 * MiB);
    EXPECT_EQ(a->stats().num_device_free, stats.num_device_free);
    EXPECT_EQ(a->snapshot(), snap);
    EXPECT_TRUE(a->invariants().empty());
  }
  EXPECT_TRUE(cap.end()) << "the capture was invalidated";
  a->free(p);
  a->empty_cache();
  EXPECT_EQ(reserved(*a), 0);
}

// A free whose block was used on the capturing stream needs an event recorded there: refused,
// the block stays allocated and nothing else moves; after the capture the free goes through.
TEST(CaptureDeviceCalls, AllocatorFreeWithAStreamUseOnTheCapturingStream) {
  SKIP_WITHOUT_DEVICE();
  auto a = allocator("");
  void* p = a->allocate(1 * MiB, 0);
  Capture cap;
  a->record_stream(p, cap.id());
  const auto before = a->stats();
  try {
    a->free(p);
    ADD_FAILURE() << "free recorded an event on a capturing stream";
  } catch (const DeviceError& e) {
    EXPECT_NE(std::string(e.what()).find("cudaEventRecord refused: stream 0x"), std::string::npos) << e.what();
  }
  EXPECT_EQ(a->stats(), before);
  EXPECT_TRUE(a->invariants().empty());
  EXPECT_TRUE(cap.active());
  EXPECT_TRUE(cap.end());
  a->free(p);  // the stream no longer captures: its event is recorded
  EXPECT_EQ(a->stats().allocated_bytes[0].current, 0);
  EXPECT_EQ(a->stats().active_bytes[0].current, 1 * MiB);  // waiting for the event (§6)
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  a->empty_cache();  // synchronizes the events, completes the free, releases the segment
  EXPECT_EQ(reserved(*a), 0);
}

// Without a current stream (the plug-in's empty_cache has none), giving memory back during a
// global-mode capture reaches the driver, which refuses it and invalidates the capture, as under
// PyTorch (§14.8.2): a DeviceError naming the driver's error, the allocator unchanged.
void release_refused_by_the_driver(const std::string& conf) {
  auto a = allocator(conf);
  a->free(a->allocate(4 * MiB, 0));
  ASSERT_EQ(reserved(*a), 20 * MiB);
  Capture cap;
  const auto snap = a->snapshot();
  try {
    a->empty_cache();
    ADD_FAILURE() << "the driver gave memory back during a capture";
  } catch (const DeviceError& e) {
    EXPECT_NE(std::string(e.what()).find("cudaErrorStreamCapture"), std::string::npos) << e.what();
  }
  EXPECT_EQ(reserved(*a), 20 * MiB);
  EXPECT_EQ(a->snapshot(), snap);
  EXPECT_TRUE(a->invariants().empty());
  EXPECT_FALSE(cap.end());  // the driver invalidated it
  a->empty_cache();
  EXPECT_EQ(reserved(*a), 0);
}

TEST(CaptureDeviceCalls, DriverRefusesCudaFree) {
  SKIP_WITHOUT_DEVICE();
  release_refused_by_the_driver("");
}

TEST(CaptureDeviceCalls, DriverRefusesUnmap) {
  SKIP_WITHOUT_DEVICE();
  release_refused_by_the_driver("expandable_segments:True");
}

TEST(CaptureDeviceCalls, AllocatorCudaMalloc) {
  SKIP_WITHOUT_DEVICE();
  allocate_and_release_during_capture("");
}

TEST(CaptureDeviceCalls, AllocatorExpandableSegments) {
  SKIP_WITHOUT_DEVICE();
  allocate_and_release_during_capture("expandable_segments:True");
}

}  // namespace
}  // namespace cachet

namespace cachet {
namespace {

std::uint64_t addr_of(void* p) { return reinterpret_cast<std::uintptr_t>(p); }
StreamId id_of(cudaStream_t s) { return static_cast<StreamId>(reinterpret_cast<std::uintptr_t>(s)); }

// graph_capture_record_stream_reuse:True on a real capture (docs/pytorch-allocator.md §14.10.1):
// the CUDA backend's capture_info and node_dependencies (cudaStreamGetCaptureInfo,
// cudaGraphNodeGetDependencies) give gpu/ the graph. PyTorch's test_graph_capture_reclaim_2_streams
// with memset nodes as the kernels, values as recorded in
// tests/data/oracle-issue23/results/res_reclaim_2_streams.json.gz: a1, used on the forked stream 2
// and freed, is not reused before stream 1 joins stream 2 (a3 at +1024) and is after (a4 == a1).
// With the option off, a4 is a new block. Runs in validate mode.
void reclaim_two_streams(bool reuse) {
  auto a = allocator(reuse ? "graph_capture_record_stream_reuse:True" : "");
  cudaStream_t s1 = nullptr, s2 = nullptr;
  cudaEvent_t fork = nullptr, join = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming), cudaSuccess);
  ASSERT_EQ(cudaEventCreateWithFlags(&join, cudaEventDisableTiming), cudaSuccess);
  const StreamId id1 = id_of(s1), id2 = id_of(s2);
  const PoolId graph{1, 0};
  // CUDAGraph::capture_begin: beginAllocateToPool, then cudaStreamBeginCapture.
  a->begin_allocate_to_pool(graph, PoolRoute{PoolRoute::Kind::CaptureStream, id1});
  ASSERT_EQ(cudaStreamBeginCapture(s1, cudaStreamCaptureModeGlobal), cudaSuccess);
  void* a0 = nullptr;
  void* a1 = nullptr;
  void* a2 = nullptr;
  void* a3 = nullptr;
  void* a4 = nullptr;
  {
    CurrentStream cs(id1);
    a0 = a->allocate(32, id1);
    a1 = a->allocate(32, id1);
  }
  ASSERT_EQ(cudaEventRecord(fork, s1), cudaSuccess);  // s2.wait_stream(s1): s2 joins the capture
  ASSERT_EQ(cudaStreamWaitEvent(s2, fork, 0), cudaSuccess);
  {
    CurrentStream cs(id2);
    a2 = a->allocate(32, id2);  // the graph's pool: s2 captures into its capture
  }
  ASSERT_EQ(cudaMemsetAsync(a1, 0, 32, s2), cudaSuccess);  // a node on s2 that uses a1
  a->record_stream(a1, id2);
  {
    CurrentStream cs(id1);
    a->free(a1);
    a3 = a->allocate(32, id1);
  }
  EXPECT_EQ(addr_of(a1) - addr_of(a0), 512u);
  EXPECT_EQ(addr_of(a3) - addr_of(a0), 1024u);
  ASSERT_EQ(cudaEventRecord(join, s2), cudaSuccess);  // s1.wait_stream(s2)
  ASSERT_EQ(cudaStreamWaitEvent(s1, join, 0), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(a0, 0, 32, s1), cudaSuccess);  // a node on s1 after the join
  {
    CurrentStream cs(id1);
    a4 = a->allocate(32, id1);
  }
  if (reuse)
    EXPECT_EQ(a4, a1);
  else
    EXPECT_EQ(addr_of(a4) - addr_of(a0), 1536u);
  const Snapshot snap = a->snapshot();
  ASSERT_EQ(snap.size(), 2u);  // s1's and s2's segments, both the graph's
  EXPECT_EQ(snap[0].pool_id, graph);
  EXPECT_EQ(snap[1].pool_id, graph);
  cudaGraph_t g = nullptr;
  EXPECT_EQ(cudaStreamEndCapture(s1, &g), cudaSuccess);  // joined: a valid graph
  a->end_allocate_to_pool(graph);
  if (g) (void)cudaGraphDestroy(g);
  EXPECT_TRUE(a->invariants().empty());
  for (void* p : {a0, a2, a3, a4}) a->free(p);
  a->release_pool(graph);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  a->empty_cache();
  EXPECT_EQ(reserved(*a), 0);
  (void)cudaEventDestroy(fork);
  (void)cudaEventDestroy(join);
  (void)cudaStreamDestroy(s1);
  (void)cudaStreamDestroy(s2);
}

TEST(CaptureDeviceCalls, RecordStreamReuseReclaimsAfterTheJoin) {
  SKIP_WITHOUT_DEVICE();
  reclaim_two_streams(true);
}

TEST(CaptureDeviceCalls, RecordStreamReuseOffWaitsForTheEnd) {
  SKIP_WITHOUT_DEVICE();
  reclaim_two_streams(false);
}

}  // namespace
}  // namespace cachet

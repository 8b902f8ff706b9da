// c10_tracker_test (label unit; no GPU, no torch): the trace trackers of cachet's c10 backend
// (python/c10/history.cpp, "trace trackers") over a host-simulated device, as ProcessGroupNCCL's
// register hook (TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK=1) uses them: it registers a
// segment with NCCL at SEGMENT_ALLOC and deregisters it at SEGMENT_FREE, for the pools named by
// TraceEntry::mempool_. The tracker here checks what that needs, at the moment it is called:
//
//   - the segment's memory is still there at SEGMENT_FREE (the host device reads it) and already
//     there at SEGMENT_ALLOC: native calls the trackers before cudaFree and after cudaMalloc;
//   - the entry names the pool owning the segment (the private pool's id, {0, 0} for the default
//     pools), as native's owner_MempoolId();
//   - every SEGMENT_FREE names a segment registered by a SEGMENT_ALLOC and not yet freed (NCCL's
//     deregisterSegment refuses any other), and after each scenario the registered segments are
//     exactly the allocator's: none dangling, none missing;
//
// through every path that gives segments back: empty_cache, a private pool's release and
// emptyCache(id), an allocation's retry, sleep (the memory goes, the addresses stay) and wake, a
// failing device free (the segment stays: registered again), and a tracker's own failure (raised
// after the call, nothing lost), call into the allocator (refused) or free of a tensor it held
// (made after the call).
#include <gtest/gtest.h>

#include <c10/core/Allocator.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/util/Exception.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backend_testing.h"
#include "cachet/errors.h"
#include "cachet/gpu/allocator.h"
#include "cachet/gpu/fault_backend.h"
#include "cachet/gpu/host_backend.h"
#include "cachet/tags.h"
#include "torch_common.h"

namespace {

namespace cc = c10::cuda::CUDACachingAllocator;
namespace cda = c10::CachingDeviceAllocator;
using cachet::MiB;
using TA = cda::TraceEntry;

constexpr cudaStream_t kStream = nullptr;

// Device 0: a host-simulated device with the VMM calls (cachet_sleep:True), behind a fault
// injector, every operation checked (cachet_validate).
struct Device {
  std::shared_ptr<cachet::gpu::HostSim> sim;
  cachet::gpu::FaultInjector* faults = nullptr;
  cachet::CachingAllocator* a = nullptr;
};

Device& device0() {
  static Device d = [] {
    Device r;
    cachet::gpu::HostOptions o;
    o.capacity = 512 * MiB;
    auto inj = std::make_unique<cachet::gpu::FaultInjector>(cachet::gpu::make_host_memory(o, &r.sim));
    r.faults = inj.get();
    cachet::Config c;
    c.sleep = true;
    c.validate = true;
    auto a = std::make_unique<cachet::CachingAllocator>(std::move(inj), c);
    cachet::torch_common::register_allocator(0, a.get());
    r.a = a.release();
    return r;
  }();
  return d;
}

cc::CUDAAllocator& A() {
  (void)device0();
  return cachet::c10_testing::allocator();
}

// What the tracker saw of one segment entry.
struct Seen {
  int action;
  std::uint64_t addr;
  std::uint64_t size;
  c10::MempoolId_t pool;
  bool memory_there;  // the device had memory at addr when the tracker was called
  friend bool operator==(const Seen&, const Seen&) = default;
};

std::ostream& operator<<(std::ostream& os, const Seen& s) {
  return os << "{" << (s.action == TA::SEGMENT_ALLOC ? "segment_alloc" : "segment_free") << " 0x" << std::hex
            << s.addr << std::dec << " " << s.size << " pool (" << s.pool.first << ", " << s.pool.second << ") "
            << (s.memory_there ? "memory there" : "MEMORY GONE") << "}";
}

// The tracker's state (trackers stay attached for the process, as PyTorch's).
struct Tracker {
  std::vector<Seen> seen;                            // segment entries, in order
  std::map<std::uint64_t, std::uint64_t> registered;  // NCCL's view: segment -> size
  std::vector<std::string> errors;                    // what NCCL's hook would have refused
  bool throw_at_alloc = false;                        // a segment_alloc throws
  bool call_allocator = false;                        // the tracker calls into the allocator
  void* drop_at_alloc = nullptr;                      // a segment_alloc frees this (a tensor it held)
};
Tracker g;

void track(const TA& te) {
  if (te.action_ != TA::SEGMENT_ALLOC && te.action_ != TA::SEGMENT_FREE) return;
  unsigned char byte = 0;
  const bool there = device0().sim->read(te.addr_, &byte, 1).is_ok();
  g.seen.push_back({static_cast<int>(te.action_), te.addr_, te.size_, te.mempool_, there});
  if (te.action_ == TA::SEGMENT_ALLOC) {
    if (!g.registered.emplace(te.addr_, te.size_).second) g.errors.push_back("registered twice");
  } else if (g.registered.erase(te.addr_) == 0) {
    g.errors.push_back("segment_free of a segment not registered (NCCL: \"is not registered\")");
  }
  if (g.call_allocator) (void)cachet::c10_testing::malloc(0, 1000, kStream);
  if (te.action_ == TA::SEGMENT_ALLOC && g.drop_at_alloc != nullptr)
    A().raw_delete(std::exchange(g.drop_at_alloc, nullptr));
  if (te.action_ == TA::SEGMENT_ALLOC && g.throw_at_alloc) TORCH_CHECK(false, "tracker refuses ", te.addr_);
}

void attach_once() {
  static const bool attached = [] {
    A().attachAllocatorTraceTracker(&track);
    return true;
  }();
  (void)attached;
}

// Each test starts with no cached segment, an empty record, and NCCL's view equal to the
// allocator's (the segments holding other tests' live blocks).
class Trackers : public ::testing::Test {
 protected:
  void SetUp() override {
    attach_once();
    device0().faults->clear();
    cachet::c10_testing::empty_cache();
    g.seen.clear();
    g.errors.clear();
    g.throw_at_alloc = false;
    g.call_allocator = false;
    g.drop_at_alloc = nullptr;
    expect_registered_is_allocators();
  }
  void TearDown() override {
    device0().faults->clear();
    expect_registered_is_allocators();
    EXPECT_TRUE(device0().a->invariants().empty());
  }
  // NCCL's registrations are the allocator's segments (their bases and sizes), no more, no less.
  static void expect_registered_is_allocators() {
    std::map<std::uint64_t, std::uint64_t> want;
    for (const auto& s : A().snapshot({0, 0}, false).segments)
      want[static_cast<std::uint64_t>(s.address)] = static_cast<std::uint64_t>(s.total_size);
    EXPECT_EQ(g.registered, want) << "NCCL's registrations differ from the allocator's segments";
    EXPECT_TRUE(g.errors.empty()) << g.errors.front();
  }
  static std::uint64_t addr(void* p) { return reinterpret_cast<std::uint64_t>(p); }
};

const c10::MempoolId_t kDefault{0, 0};

TEST_F(Trackers, EmptyCacheFreeIsHeardBeforeTheMemoryGoes) {
  void* p = cachet::c10_testing::malloc(0, 40 * MiB, kStream);
  A().raw_delete(p);
  cachet::c10_testing::empty_cache();
  const std::vector<Seen> want = {{TA::SEGMENT_ALLOC, addr(p), 40 * MiB, kDefault, true},
                                  {TA::SEGMENT_FREE, addr(p), 40 * MiB, kDefault, true}};
  EXPECT_EQ(g.seen, want);
}

TEST_F(Trackers, AnAllocationsRetryFreeIsHeardBeforeTheMemoryGoes) {
  const auto reserved = static_cast<cachet::Bytes>(device0().a->stats().reserved_bytes[0].current);
  const cachet::Bytes big = ((512 * MiB - reserved) * 6 / 10) / (2 * MiB) * (2 * MiB);  // two do not fit
  void* p = cachet::c10_testing::malloc(0, big, kStream);
  A().raw_delete(p);
  void* q = cachet::c10_testing::malloc(0, big + 2 * MiB, kStream);  // the retry frees p's segment
  ASSERT_GE(A().getDeviceStats(0).num_alloc_retries, 1);
  ASSERT_EQ(g.seen.size(), 3u);
  EXPECT_EQ(g.seen[1], (Seen{TA::SEGMENT_FREE, addr(p), big, kDefault, true}));
  EXPECT_EQ(g.seen[2].action, TA::SEGMENT_ALLOC);
  EXPECT_EQ(g.seen[2].addr, addr(q));
  A().raw_delete(q);
}

TEST_F(Trackers, APrivatePoolsSegmentsNameThePool) {
  const c10::MempoolId_t id{0, 7001};
  A().createOrIncrefPool(0, id, nullptr);
  A().beginAllocateToPool(0, id, [](cudaStream_t) { return true; });
  void* p = cachet::c10_testing::malloc(0, 6 * MiB, kStream);
  A().endAllocateToPool(0, id);
  A().raw_delete(p);
  cachet::c10_testing::empty_cache(id);  // still in use: nothing goes
  EXPECT_EQ(g.seen.size(), 1u);
  device0().a->release_pool({id.first, id.second});  // releasePool (asks CUDA for the stream)
  device0().a->release_pool({id.first, id.second});  // the user beginAllocateToPool added
  cachet::c10_testing::empty_cache(id);                // ~MemPool's emptyCache(id)
  const std::vector<Seen> want = {{TA::SEGMENT_ALLOC, addr(p), 20 * MiB, id, true},  // a large block's segment
                                  {TA::SEGMENT_FREE, addr(p), 20 * MiB, id, true}};
  EXPECT_EQ(g.seen, want);
}

TEST_F(Trackers, SleepDropsRegistrationsBeforeTheMemoryGoesAndWakeMakesThemAgain) {
  void* live = cachet::c10_testing::malloc(0, 30 * MiB, kStream);
  void* cached = cachet::c10_testing::malloc(0, 50 * MiB, kStream);
  A().raw_delete(cached);
  g.seen.clear();
  EXPECT_EQ(device0().a->sleep({}, {}), 80 * MiB);
  // Both segments go (the cached one too), each heard of with its memory still there.
  ASSERT_EQ(g.seen.size(), 2u);
  for (const Seen& s : g.seen) {
    EXPECT_EQ(s.action, TA::SEGMENT_FREE);
    EXPECT_TRUE(s.memory_there) << s;
  }
  EXPECT_TRUE(g.registered.find(addr(live)) == g.registered.end());
  // The sleeping free segment's addresses go at empty_cache: nothing more to deregister.
  cachet::c10_testing::empty_cache();
  EXPECT_EQ(g.seen.size(), 2u);
  EXPECT_TRUE(g.errors.empty()) << g.errors.front();
  device0().a->wake({});
  ASSERT_EQ(g.seen.size(), 3u);
  EXPECT_EQ(g.seen[2], (Seen{TA::SEGMENT_ALLOC, addr(live), 30 * MiB, kDefault, true}));
  A().raw_delete(live);
}

TEST_F(Trackers, AFailingDeviceFreeKeepsTheSegmentRegistered) {
  void* p = cachet::c10_testing::malloc(0, 24 * MiB, kStream);
  A().raw_delete(p);
  cachet::gpu::FaultPlan plan;
  plan.cls = cachet::gpu::CallClass::Free;
  plan.fail_kth = 1;
  device0().faults->set_plan(plan);
  EXPECT_THROW(cachet::c10_testing::empty_cache(), c10::Error);
  device0().faults->clear();
  const std::vector<Seen> want = {{TA::SEGMENT_ALLOC, addr(p), 24 * MiB, kDefault, true},
                                  {TA::SEGMENT_FREE, addr(p), 24 * MiB, kDefault, true},
                                  {TA::SEGMENT_ALLOC, addr(p), 24 * MiB, kDefault, true}};
  EXPECT_EQ(g.seen, want) << "the segment stayed: heard of as still there";
  cachet::c10_testing::empty_cache();
  EXPECT_EQ(g.seen.size(), 4u);
}

TEST_F(Trackers, ATrackersFailureIsRaisedAfterTheCallAndLosesNothing) {
  g.throw_at_alloc = true;
  const auto before = A().getDeviceStats(0).allocated_bytes[0].current;
  try {
    cachet::c10_testing::malloc(0, 12 * MiB, kStream);
    FAIL() << "the tracker's error was not raised";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("tracker refuses"), std::string::npos) << e.what();
  }
  g.throw_at_alloc = false;
  EXPECT_EQ(A().getDeviceStats(0).allocated_bytes[0].current, before) << "the allocation went back";
  void* again = cachet::c10_testing::malloc(0, 1000, kStream);  // no error left behind
  A().raw_delete(again);
}

TEST_F(Trackers, ATrackerCallingTheAllocatorIsRefused) {
  g.call_allocator = true;
  try {
    cachet::c10_testing::malloc(0, 20 * MiB, kStream);  // a new segment: the tracker allocates
    FAIL() << "the tracker's call was not refused";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("called from a trace tracker"), std::string::npos) << e.what();
  }
  g.call_allocator = false;
}

// A tensor a tracker drops (its deleter runs in the tracker, under the allocator's lock) is freed
// once the call that ran the tracker returns: no deadlock, no error, nothing lost.
TEST_F(Trackers, AFreeFromATrackerIsMadeAfterTheCall) {
  void* held = cachet::c10_testing::malloc(0, 4 * MiB, kStream);
  const auto before = A().getDeviceStats(0).allocated_bytes[0].current;
  g.drop_at_alloc = held;
  void* p = cachet::c10_testing::malloc(0, 30 * MiB, kStream);  // a new segment: the tracker frees `held`
  EXPECT_EQ(g.drop_at_alloc, nullptr);
  EXPECT_EQ(A().getDeviceStats(0).allocated_bytes[0].current, before + static_cast<std::int64_t>(30 * MiB) -
                                                                  static_cast<std::int64_t>(4 * MiB));
  A().raw_delete(p);
}

}  // namespace

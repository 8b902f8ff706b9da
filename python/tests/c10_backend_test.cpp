// c10_backend_test (label unit; no GPU, no torch): cachet's c10 backend (python/c10/, backend.h,
// compiled with CACHET_C10_TESTING) over a host-simulated device. What PyTorch sees through
// c10::cuda::CUDACachingAllocator::CUDAAllocator must be cachet's own answers, unchanged:
// DeviceStats field for field, snapshot segments and blocks, the trace with the stacks PyTorch's
// context recorder gave (by the k-th event of each address), OutOfMemoryError with cachet's
// text and the observers called once, the private-pool calls, the deleter, the install door.
// Calls that ask CUDA for the current device or stream (allocate, raw_alloc, emptyCache) are
// the GPU tests' (python/tests/, python/c10/gpu_smoke.py).
#include <gtest/gtest.h>

#include <c10/core/Allocator.h>
#include <c10/core/AllocatorConfig.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/util/Exception.h>
#include <torch/headeronly/version.h>

#include <cstdint>
#include <memory>
#include <regex>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "backend_testing.h"
#include "cachet/errors.h"
#include "cachet/gpu/allocator.h"
#include "cachet/gpu/host_backend.h"
#include "cachet/stats.h"
#include "torch_common.h"

extern "C" int cachet_c10_install(const char* running_torch_version);
extern "C" int cachet_c10_installed(void);

namespace {

namespace cc = c10::cuda::CUDACachingAllocator;
namespace cda = c10::CachingDeviceAllocator;
using cachet::MiB;

constexpr cudaStream_t kStream = nullptr;  // the legacy default stream (StreamId 0)

// One host-simulated device 0 behind the shared per-device allocators, for every test (the
// allocators are never destroyed, as in the libraries; tests use their own sizes and pools).
struct Device {
  std::shared_ptr<cachet::gpu::HostSim> sim;
  cachet::CachingAllocator* a = nullptr;
};

Device& device0() {
  static Device d = [] {
    Device r;
    cachet::gpu::HostOptions o;
    o.capacity = 512 * MiB;
    auto a = std::make_unique<cachet::CachingAllocator>(cachet::gpu::make_host_memory(o, &r.sim));
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

void expect_same(const c10::CachingAllocator::Stat& got, const cachet::Stat& want, const std::string& what) {
  EXPECT_EQ(got.current, want.current) << what;
  EXPECT_EQ(got.peak, want.peak) << what;
  EXPECT_EQ(got.allocated, want.allocated) << what;
  EXPECT_EQ(got.freed, want.freed) << what;
}

void expect_same(const c10::CachingAllocator::StatArray& got, const cachet::StatArray& want, const std::string& what) {
  for (size_t i = 0; i < got.size(); ++i) expect_same(got[i], want[i], what + "[" + std::to_string(i) + "]");
}

// A context as PyTorch's recorder makes them (CapturedTraceback), numbered.
struct TestContext : c10::GatheredContext {
  explicit TestContext(int n) : n(n) {}
  int n;
};
int g_next_context = 1;
std::shared_ptr<c10::GatheredContext> record_context() { return std::make_shared<TestContext>(g_next_context++); }
int id_of(const std::shared_ptr<c10::GatheredContext>& c) {
  auto* t = dynamic_cast<TestContext*>(c.get());
  return t ? t->n : 0;
}

void history(bool on, size_t max_entries = 100000, std::vector<std::string> skip = {},
             cc::RecordContext level = cc::RecordContext::ALL) {
  A().recordHistory(on, on ? &record_context : nullptr, max_entries, on ? level : cc::RecordContext::NEVER, false,
                    skip);
}

using TA = cda::TraceEntry;

// The device trace of a snapshot as (action, context) pairs.
std::vector<std::pair<int, int>> trace_of(const cc::SnapshotInfo& s) {
  std::vector<std::pair<int, int>> got;
  if (s.device_traces.empty()) return got;
  for (const auto& e : s.device_traces[0]) got.emplace_back(static_cast<int>(e.action_), id_of(e.context_));
  return got;
}

TEST(C10Backend, NameAndDeleter) {
  EXPECT_EQ(A().name(), "cachet");
  EXPECT_EQ(A().raw_deleter(), cachet::c10_testing::deleter());
  A().enable(false);
  EXPECT_NE(A().raw_deleter(), cachet::c10_testing::deleter()) << "disabled: cudaFree's deleter, as native";
  EXPECT_FALSE(A().isEnabled());
  A().enable(true);
  EXPECT_EQ(A().raw_deleter(), cachet::c10_testing::deleter());
}

// Stats that differ from each other (allocated vs active vs requested, inactive splits), so a
// field copied into the wrong place shows.
TEST(C10Backend, DeviceStatsAreCachetsFieldForField) {
  Device& d = device0();
  void* p1 = cachet::c10_testing::malloc(0, 1000, kStream);
  void* p2 = cachet::c10_testing::malloc(0, 3 * MiB + 7, kStream);
  void* p3 = cachet::c10_testing::malloc(0, 5000, kStream);
  const auto other = reinterpret_cast<cudaStream_t>(0x77);
  d.a->record_stream(p3, reinterpret_cast<cachet::StreamId>(other));
  A().raw_delete(p3);  // pending its event: active, not allocated
  A().raw_delete(p1);  // an inactive split
  const cachet::DeviceStats want = d.a->stats();
  const cda::DeviceStats got = A().getDeviceStats(0);
  ASSERT_NE(want.active_bytes[0].current, want.allocated_bytes[0].current);
  ASSERT_NE(want.requested_bytes[0].current, want.allocated_bytes[0].current);
  ASSERT_GT(want.inactive_split[0].current, 0);
  expect_same(got.allocation, want.allocation, "allocation");
  expect_same(got.segment, want.segment, "segment");
  expect_same(got.active, want.active, "active");
  expect_same(got.inactive_split, want.inactive_split, "inactive_split");
  expect_same(got.allocated_bytes, want.allocated_bytes, "allocated_bytes");
  expect_same(got.reserved_bytes, want.reserved_bytes, "reserved_bytes");
  expect_same(got.active_bytes, want.active_bytes, "active_bytes");
  expect_same(got.inactive_split_bytes, want.inactive_split_bytes, "inactive_split_bytes");
  expect_same(got.requested_bytes, want.requested_bytes, "requested_bytes");
  expect_same(got.oversize_allocations, want.oversize_allocations, "oversize_allocations");
  expect_same(got.oversize_segments, want.oversize_segments, "oversize_segments");
  EXPECT_EQ(got.num_alloc_retries, want.num_alloc_retries);
  EXPECT_EQ(got.num_ooms, want.num_ooms);
  EXPECT_EQ(got.num_sync_all_streams, want.num_sync_all_streams);
  EXPECT_EQ(got.num_device_alloc, want.num_device_alloc);
  EXPECT_EQ(got.num_device_free, want.num_device_free);
  EXPECT_EQ(got.max_split_size, -1);
  A().resetPeakStats(0);
  EXPECT_EQ(A().getDeviceStats(0).allocated_bytes[0].peak, d.a->stats().allocated_bytes[0].current);
  A().resetAccumulatedStats(0);
  EXPECT_EQ(A().getDeviceStats(0).allocation[0].allocated, 0);
  d.sim->complete_all_events();
  A().raw_delete(p2);
}

TEST(C10Backend, SnapshotSegmentsAndBlocksAreCachets) {
  Device& d = device0();
  void* p = cachet::c10_testing::malloc(0, 2 * MiB + 100, kStream);
  const cachet::Snapshot want = d.a->snapshot();
  const cc::SnapshotInfo got = A().snapshot({0, 0}, false);
  ASSERT_EQ(got.segments.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    const auto& g = got.segments[i];
    const auto& w = want[i];
    EXPECT_EQ(g.device, 0);
    EXPECT_EQ(g.address, w.address);
    EXPECT_EQ(g.total_size, w.total_size);
    EXPECT_EQ(g.allocated_size, w.allocated_size());
    EXPECT_EQ(g.active_size, w.active_size());
    EXPECT_EQ(g.requested_size, w.requested_size());
    EXPECT_EQ(g.is_large, w.is_large);
    EXPECT_EQ(g.is_expandable, w.is_expandable);
    EXPECT_EQ(g.owner_private_pool_id, (c10::MempoolId_t{w.pool_id.first, w.pool_id.second}));
    ASSERT_EQ(g.blocks.size(), w.blocks.size());
    for (size_t b = 0; b < w.blocks.size(); ++b) {
      EXPECT_EQ(g.blocks[b].size, w.blocks[b].size);
      EXPECT_EQ(g.blocks[b].requested_size, w.blocks[b].requested_size);
      EXPECT_EQ(g.blocks[b].allocated, w.blocks[b].state == cachet::BlockState::ActiveAllocated);
      EXPECT_EQ(g.blocks[b].active, w.blocks[b].state != cachet::BlockState::Inactive);
    }
  }
  EXPECT_TRUE(got.device_traces.empty()) << "include_traces = false";
  EXPECT_EQ(got.config_metadata.max_split_size, SIZE_MAX);
  EXPECT_EQ(got.config_metadata.roundup_power2_divisions.size(), 16u);
  A().raw_delete(p);
}

// The recorder's contexts come back unchanged: each alloc event with the stack of the
// allocation, each free with the free's, a segment allocation with the allocation it served,
// a live block with its allocation's; the k-th event of an address with the k-th call's.
TEST(C10Backend, HistoryGivesBackTheRecordersContexts) {
  history(true);
  g_next_context = 1;
  void* p = cachet::c10_testing::malloc(0, 30 * MiB, kStream);   // context 1: segment_alloc, alloc
  A().raw_delete(p);                                               // context 2: free_requested, free_completed
  void* q = cachet::c10_testing::malloc(0, 30 * MiB, kStream);   // context 3: alloc at the same address
  ASSERT_EQ(p, q);
  const cc::SnapshotInfo s = A().snapshot({0, 0}, true);
  ASSERT_EQ(s.device_traces.size(), 1u);
  // No snapshot entry at the end: native takes the trace before the snapshot records its own.
  const std::vector<std::pair<int, int>> want = {
      {TA::SEGMENT_ALLOC, 1}, {TA::ALLOC, 1}, {TA::FREE_REQUESTED, 2}, {TA::FREE_COMPLETED, 2}, {TA::ALLOC, 3}};
  EXPECT_EQ(trace_of(s), want);
  EXPECT_EQ(s.device_traces[0][1].addr_, reinterpret_cast<size_t>(p));
  EXPECT_EQ(s.device_traces[0][1].size_, 30 * MiB);
  int live = 0;
  for (const auto& seg : s.segments)
    for (const auto& b : seg.blocks)
      if (b.allocated) live = id_of(b.context_when_allocated);
  EXPECT_EQ(live, 3) << "the live block carries its allocation's context";

  A().raw_delete(q);
  history(false);
}

// Turning the history on again starts from an empty trace (as native's); max_entries keeps the
// newest entries, skip_actions leaves actions out.
TEST(C10Backend, MaxEntriesAndSkipActions) {
  history(false);
  history(true, 2, {"free_completed"});
  g_next_context = 1;
  void* p = cachet::c10_testing::malloc(0, 40 * MiB, kStream);  // 1: segment_alloc, alloc
  A().raw_delete(p);                                              // 2: free_requested (free_completed skipped)
  const cc::SnapshotInfo s = A().snapshot({0, 0}, true);
  const std::vector<std::pair<int, int>> want = {{TA::ALLOC, 1}, {TA::FREE_REQUESTED, 2}};
  EXPECT_EQ(trace_of(s), want);
  const std::vector<std::pair<int, int>> next = {{TA::FREE_REQUESTED, 2}, {TA::SNAPSHOT, 0}};
  EXPECT_EQ(trace_of(A().snapshot({0, 0}, true)), next) << "the first snapshot's entry, newest two";
  history(false);
  EXPECT_FALSE(A().isHistoryEnabled());
}

// Where native's snapshot entries sit (NativeCachingAllocator::snapshot takes each device's
// trace() before DeviceCachingAllocator::snapshot records SNAPSHOT): a snapshot's trace never
// holds its own entry; the next one's holds it, after everything recorded before the call, with
// no context. getExpandableSegmentSizes records none (native's reads its segments only).
TEST(C10Backend, SnapshotEntriesSitWhereNativePutsThem) {
  history(false);
  cachet::c10_testing::empty_cache();
  history(true);
  g_next_context = 1;
  void* p = cachet::c10_testing::malloc(0, 1000, kStream);  // 1: segment_alloc, alloc
  const cc::SnapshotInfo s1 = A().snapshot({0, 0}, true);
  const std::vector<std::pair<int, int>> first = {{TA::SEGMENT_ALLOC, 1}, {TA::ALLOC, 1}};
  EXPECT_EQ(trace_of(s1), first);
  (void)A().getExpandableSegmentSizes(0);
  A().raw_delete(p);  // 2: free_requested, free_completed
  const cc::SnapshotInfo s2 = A().snapshot({0, 0}, true);
  const std::vector<std::pair<int, int>> second = {{TA::SEGMENT_ALLOC, 1}, {TA::ALLOC, 1}, {TA::SNAPSHOT, 0},
                                                   {TA::FREE_REQUESTED, 2}, {TA::FREE_COMPLETED, 2}};
  EXPECT_EQ(trace_of(s2), second);
  ASSERT_EQ(s2.device_traces[0].size(), second.size());
  EXPECT_EQ(s2.device_traces[0][2].size_, 1024u) << "the snapshot entry's size: the active bytes then";
  EXPECT_EQ(s2.device_traces[0][2].addr_, 0u);
  history(false);
}

// Segment frees carry the context native's release_block / unmap_block record them with:
// `context ? context : block->context_when_segment_allocated`, the context being the caller's:
// a malloc's (its free-and-retry, release_cached_blocks), emptyCache's (gathered at ALL). And a
// free completed late (record_stream) carries the context of the call that completed it (the
// next malloc's process_events), as native's free_block(block, context).
TEST(C10Backend, SegmentFreesAndLateFreesCarryTheCallersContext) {
  Device& d = device0();
  history(false);
  cachet::c10_testing::empty_cache();
  const cachet::Bytes reserved = d.a->stats().reserved_bytes[0].current;
  const cachet::Bytes avail = 512 * MiB - static_cast<cachet::Bytes>(reserved);
  const cachet::Bytes big = (avail * 6 / 10) / (2 * MiB) * (2 * MiB);  // two do not fit, one does
  history(true);
  g_next_context = 1;
  void* p = cachet::c10_testing::malloc(0, big, kStream);  // 1: segment_alloc, alloc
  A().raw_delete(p);                                        // 2: free_requested, free_completed (cached)
  void* q = cachet::c10_testing::malloc(0, big + 2 * MiB, kStream);  // 3: retry frees 1's segment
  ASSERT_NE(q, nullptr);
  EXPECT_GE(A().getDeviceStats(0).num_alloc_retries, 1);
  const auto other = reinterpret_cast<cudaStream_t>(0x77);
  d.a->record_stream(q, reinterpret_cast<cachet::StreamId>(other));
  A().raw_delete(q);                                        // 4: free_requested; completion waits for its event
  d.sim->complete_all_events();
  void* r = cachet::c10_testing::malloc(0, 1000, kStream);  // 5: free_completed of q, then its own
  A().raw_delete(r);                                        // 6
  cachet::c10_testing::empty_cache();                       // 7: segment_free of q's and r's segments
  const auto t = trace_of(A().snapshot({0, 0}, true));
  const std::vector<std::pair<int, int>> want = {
      {TA::SEGMENT_ALLOC, 1}, {TA::ALLOC, 1},          {TA::FREE_REQUESTED, 2}, {TA::FREE_COMPLETED, 2},
      {TA::SEGMENT_FREE, 3},  {TA::SEGMENT_ALLOC, 3},  {TA::ALLOC, 3},          {TA::FREE_REQUESTED, 4},
      {TA::FREE_COMPLETED, 5}, {TA::SEGMENT_ALLOC, 5}, {TA::ALLOC, 5},          {TA::FREE_REQUESTED, 6},
      {TA::FREE_COMPLETED, 6}, {TA::SEGMENT_FREE, 7},  {TA::SEGMENT_FREE, 7}};
  EXPECT_EQ(t, want);
  history(false);
}

// Recorded with context="alloc" (level ALLOC), frees gather no context (native's free and
// emptyCache gather at ALL): a free takes its block's allocation context, a segment freed by
// emptyCache its segment's allocation context; at level STATE no entry keeps one.
TEST(C10Backend, WithoutTheCallersContextTheBlocksOrTheSegments) {
  history(false);
  cachet::c10_testing::empty_cache();
  history(true, 100000, {}, cc::RecordContext::ALLOC);
  g_next_context = 1;
  void* p = cachet::c10_testing::malloc(0, 40 * MiB, kStream);  // 1: segment_alloc, alloc
  A().raw_delete(p);                                              // no context: the block's (1)
  cachet::c10_testing::empty_cache();                             // no context: the segment's (1)
  EXPECT_EQ(g_next_context, 2) << "neither free nor emptyCache gathered a context";
  const std::vector<std::pair<int, int>> want = {{TA::SEGMENT_ALLOC, 1}, {TA::ALLOC, 1}, {TA::FREE_REQUESTED, 1},
                                                 {TA::FREE_COMPLETED, 1}, {TA::SEGMENT_FREE, 1}};
  EXPECT_EQ(trace_of(A().snapshot({0, 0}, true)), want);
  history(false);
  history(true, 100000, {}, cc::RecordContext::STATE);
  void* q = cachet::c10_testing::malloc(0, 40 * MiB, kStream);
  A().raw_delete(q);
  cachet::c10_testing::empty_cache();
  for (const auto& [action, ctx] : trace_of(A().snapshot({0, 0}, true))) EXPECT_EQ(ctx, 0) << action;
  history(false);
}

TEST(C10Backend, OutOfMemoryIsOutOfMemoryErrorWithCachetsTextAndObserversOnce) {
  Device& d = device0();
  static std::vector<std::int64_t> calls;  // the observer stays attached after the test
  A().attachOutOfMemoryObserver([](int64_t device, size_t size, size_t, size_t) {
    calls.push_back(device);
    calls.push_back(static_cast<std::int64_t>(size));
  });
  std::string cachet_text;
  try {
    d.a->allocate(4096 * MiB, 0);
  } catch (const cachet::OutOfMemory& e) {
    cachet_text = e.what();
  }
  ASSERT_EQ(cachet_text.rfind("CUDA out of memory. Tried to allocate ", 0), 0u) << cachet_text;
  try {
    cachet::c10_testing::malloc(0, 4096 * MiB, kStream);
    FAIL() << "no exception";
  } catch (const c10::OutOfMemoryError& e) {
    // The same text, but for the device's free memory and the process's memory in use, which the
    // first refusal changed on a real device (its last retry gave the cached segments back): the
    // request part word for word, the rest with its figures masked.
    const auto head = [](const std::string& t) { return t.substr(0, t.find(". GPU ")); };
    const auto masked = [](const std::string& t) {
      return std::regex_replace(t, std::regex("[0-9]+(\\.[0-9]+)?"), "#");
    };
    EXPECT_EQ(head(e.msg()), head(cachet_text));
    EXPECT_EQ(masked(e.msg()), masked(cachet_text));
  }
  // "Tried to allocate 4.00 GiB" is not exact: the observer gets the requested size
  EXPECT_EQ(calls, (std::vector<std::int64_t>{0, static_cast<std::int64_t>(4096 * MiB)}));
  EXPECT_EQ(A().getDeviceStats(0).num_ooms, 2);
  // "Tried to allocate 600.00 MiB" is: the observer gets the segment size asked, as native's
  calls.clear();
  EXPECT_THROW(cachet::c10_testing::malloc(0, 600 * MiB - 100, kStream), c10::OutOfMemoryError);
  EXPECT_EQ(calls, (std::vector<std::int64_t>{0, static_cast<std::int64_t>(600 * MiB)}));
}

TEST(C10Backend, PrivatePools) {
  const c10::MempoolId_t id{0, 4242};
  A().createOrIncrefPool(0, id, nullptr);
  EXPECT_EQ(A().getPoolUseCount(0, id), 1);
  A().beginAllocateToPool(0, id, [](cudaStream_t) { return true; });
  EXPECT_EQ(A().getPoolUseCount(0, id), 2);
  void* p = cachet::c10_testing::malloc(0, 4 * MiB, kStream);
  A().endAllocateToPool(0, id);
  const cc::SnapshotInfo s = A().snapshot(id, false);
  ASSERT_EQ(s.segments.size(), 1u) << "snapshot(id) lists that pool's segments only";
  EXPECT_EQ(s.segments[0].owner_private_pool_id, id);
  EXPECT_TRUE(A().checkPoolLiveAllocations(0, id, {p}));
  EXPECT_FALSE(A().checkPoolLiveAllocations(0, id, {}));
  EXPECT_FALSE(A().checkPoolLiveAllocations(0, id, {p, reinterpret_cast<void*>(0x1000)}));
  EXPECT_THROW(A().checkPoolLiveAllocations(0, {0, 999999}, {}), c10::Error) << "an unknown pool";
  A().raw_delete(p);
  EXPECT_TRUE(A().checkPoolLiveAllocations(0, id, {}));
  EXPECT_THROW(A().endAllocateToPool(0, id), c10::Error) << "cachet's refusal as c10::Error";
  A().setUseOnOOM(0, id, false);  // what ~MemPool calls: never refused
}

// cuDNN's benchmark: cacheInfo is gpu/'s largest_free_block (largest = 0 on entry) or the larger
// of the caller's figure and largest_cached_block.
TEST(C10Backend, CacheInfoIsGpusLargestBlock) {
  Device& d = device0();
  void* p = cachet::c10_testing::malloc(0, 50 * MiB, kStream);
  A().raw_delete(p);  // a cached 50 MiB block
  size_t largest = 0;
  A().cacheInfo(0, &largest);
  EXPECT_EQ(largest, d.a->largest_free_block());
  largest = 1;
  A().cacheInfo(0, &largest);
  EXPECT_EQ(largest, d.a->largest_cached_block());
  EXPECT_GE(largest, 50 * MiB);
  largest = 1ull << 40;
  A().cacheInfo(0, &largest);
  EXPECT_EQ(largest, 1ull << 40);
}

// torch.multiprocessing's sender: the segment's base and size.
TEST(C10Backend, BaseAllocationIsTheSegments) {
  void* p = cachet::c10_testing::malloc(0, 1000, kStream);
  void* q = cachet::c10_testing::malloc(0, 1000, kStream);
  size_t size = 0;
  void* base = A().getBaseAllocation(q, &size);
  EXPECT_EQ(base, A().getBaseAllocation(p, nullptr));
  EXPECT_EQ(size, 2 * MiB) << "a small segment";
  EXPECT_LE(static_cast<char*>(base), static_cast<char*>(q));
  EXPECT_LT(static_cast<char*>(q), static_cast<char*>(base) + size);
  EXPECT_THROW(A().getBaseAllocation(reinterpret_cast<void*>(0x1234), nullptr), c10::Error);
  A().raw_delete(p);
  A().raw_delete(q);
}

// Graph trees: a pool's state, restored; the restored allocations come back as DataPtrs whose
// deleter is raw_deleter() (graph trees compare them) and free through cachet.
TEST(C10Backend, CheckpointAndRestore) {
  const c10::MempoolId_t id{77, 0};
  A().createOrIncrefPool(0, id, nullptr);
  A().beginAllocateToPool(0, id, [](cudaStream_t) { return true; });
  void* p1 = cachet::c10_testing::malloc(0, 3 * MiB, kStream);
  void* p2 = cachet::c10_testing::malloc(0, 5 * MiB, kStream);
  A().endAllocateToPool(0, id);
  std::shared_ptr<cc::AllocatorState> state = A().getCheckpointState(0, id);
  ASSERT_TRUE(state);
  A().raw_delete(p2);
  A().beginAllocateToPool(0, id, [](cudaStream_t) { return true; });
  void* p3 = cachet::c10_testing::malloc(0, 1 * MiB + 1, kStream);
  A().endAllocateToPool(0, id);
  EXPECT_TRUE(A().checkPoolLiveAllocations(0, id, {p1, p3}));
  cc::CheckpointDelta delta = A().setCheckpointPoolState(0, state);
  EXPECT_EQ(std::unordered_set<void*>(delta.ptrs_freed.begin(), delta.ptrs_freed.end()),
            (std::unordered_set<void*>{p1, p3}));
  std::unordered_set<void*> back;
  for (const auto& dp : delta.dataptrs_allocd) {
    back.insert(dp.get());
    EXPECT_EQ(dp.get_deleter(), A().raw_deleter());
    EXPECT_EQ(dp.device(), c10::Device(c10::DeviceType::CUDA, 0));
  }
  EXPECT_EQ(back, (std::unordered_set<void*>{p1, p2}));
  EXPECT_TRUE(A().checkPoolLiveAllocations(0, id, {p1, p2}));
  delta.dataptrs_allocd.clear();  // their deleter frees them through cachet
  EXPECT_TRUE(A().checkPoolLiveAllocations(0, id, {}));
  struct Other : cc::AllocatorState {};
  EXPECT_THROW(A().setCheckpointPoolState(0, std::make_shared<Other>()), c10::Error);
  A().setNoSplit(0, id);
  A().setUseOnOOM(0, id, true);
  A().setUseOnOOM(0, id, false);
  device0().a->release_pool({id.first, id.second});  // releasePool asks CUDA for the current stream
}

TEST(C10Backend, FreeOfAnUnknownPointerIsAnError) {
  (void)device0();
  EXPECT_THROW(A().raw_delete(reinterpret_cast<void*>(0x1234)), c10::Error);
  A().raw_delete(nullptr);  // nothing
}

// Last: installing makes it c10's CUDA allocator (no CUDA call is needed for that).
TEST(C10Backend, InstallIsTheDoorNativeUses) {
  EXPECT_EQ(cachet_c10_installed(), 0);
  ASSERT_EQ(cachet_c10_install("2.9.0"), 1);
  ASSERT_EQ(cachet_c10_install(TORCH_VERSION), 0) << cachet::torch_common::last_error_copy();
  EXPECT_EQ(cachet_c10_installed(), 1);
  EXPECT_EQ(cc::get(), &A());
  EXPECT_EQ(c10::GetAllocator(c10::DeviceType::CUDA), static_cast<c10::Allocator*>(&A()));
}

// torch.cuda.memory._set_allocator_settings reaches cachet once it is installed: PyTorch's parse,
// then cachet's, applied to the allocators and to those created later.
TEST(C10Backend, RuntimeSettingsReachCachet) {
  ASSERT_EQ(cachet_c10_installed(), 1);
  c10::CachingAllocator::setAllocatorSettings("max_split_size_mb:64");
  EXPECT_EQ(device0().a->config().max_split_size, 64 * MiB);
  EXPECT_EQ(cachet::torch_common::state().config.max_split_size, 64 * MiB);
  EXPECT_EQ(A().snapshot({0, 0}, false).config_metadata.last_allocator_settings, "max_split_size_mb:64");
  c10::CachingAllocator::setAllocatorSettings("max_split_size_mb:128,garbage_collection_threshold:0.5");
  EXPECT_EQ(device0().a->config().max_split_size, 128 * MiB);
  EXPECT_EQ(device0().a->config().garbage_collection_threshold, 0.5);
}

}  // namespace

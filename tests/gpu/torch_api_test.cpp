// What PyTorch's CUDAAllocator interface asks of cachet::CachingAllocator beyond malloc, free and
// the pools (docs/pytorch-allocator.md §15), on the host backend, in validate mode (invariants
// after every operation): cacheInfo (largest_free_block), getBaseAllocation (base_allocation), a
// MemPool with its own allocator (create_or_incref_pool with a gpu::SegmentSource), setUseOnOOM,
// setNoSplit, and the checkpoints of CUDA graph trees. Values computed by hand from PyTorch's rules.
// Synthetic addresses: cudaMalloc hands out 0x7f0000000000 upwards, each segment 2 MiB aligned.
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cachet/errors.h"
#include "gpu_test_support.h"

namespace cachet::test {
namespace {

constexpr std::uint64_t kBase = 0x7f0000000000;
constexpr PoolId kPool1{0, 1};
constexpr PoolId kPool2{0, 2};
constexpr PoolId kGraph{1, 0};

void* at(std::uint64_t a) { return reinterpret_cast<void*>(static_cast<std::uintptr_t>(a)); }
std::uint64_t addr(const void* p) { return reinterpret_cast<std::uintptr_t>(p); }
PoolRoute this_thread() { return PoolRoute{}; }

HostAlloc cachet_alloc(const std::string& conf = "", Bytes capacity = kH200) {
  return host_alloc(conf.empty() ? "policy:cachet" : "policy:cachet," + conf, capacity);
}

template <class E, class F>
std::string message_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  return "(nothing thrown)";
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// ----------------------------------------------------------------- cacheInfo (§15.4)

TEST(LargestFreeBlock, NothingCachedReportsTheDevicesFreeMemory) {
  auto h = host_alloc("", 1 * GiB);
  EXPECT_EQ(h.a->largest_cached_block(), 0u);
  EXPECT_EQ(h.a->largest_free_block(), 1 * GiB);  // cudaMemGetInfo's free bytes
  void* p = h.a->allocate(3 * MiB, 0);             // a 20 MiB segment, 17 MiB of it cached
  EXPECT_EQ(h.a->largest_cached_block(), 17 * MiB);
  EXPECT_EQ(h.a->largest_free_block(), 1 * GiB - 20 * MiB);
  h.a->free(p);
  EXPECT_EQ(h.a->largest_cached_block(), 20 * MiB);
}

TEST(LargestFreeBlock, TheLargestCachedBlockOfAnyPoolWhenLargerThanTheDevicesFreeMemory) {
  auto h = host_alloc("", 24 * MiB);
  CachingAllocator& a = *h.a;
  a.create_or_incref_pool(kPool1);
  a.begin_allocate_to_pool(kPool1, this_thread());
  void* p = a.allocate(3 * MiB, 0);  // the pool's 20 MiB segment: 17 MiB cached in the pool
  a.end_allocate_to_pool(kPool1);
  EXPECT_EQ(a.largest_cached_block(), 17 * MiB);
  EXPECT_EQ(a.largest_free_block(), 17 * MiB);  // the device has 4 MiB left
  void* s = a.allocate(1024, 0);                // the default small pool: 2 MiB, 2,096,128 cached
  EXPECT_EQ(a.largest_free_block(), 17 * MiB);
  a.free(p);
  EXPECT_EQ(a.largest_free_block(), 20 * MiB);
  a.free(s);
  a.release_pool(kPool1);  // use_mem_pool's user
  a.release_pool(kPool1);  // the MemPool's
  a.empty_cache();
  EXPECT_EQ(a.largest_cached_block(), 0u);
  EXPECT_EQ(a.largest_free_block(), 24 * MiB);
}

TEST(LargestFreeBlock, SmallPoolBlocksCount) {
  auto h = host_alloc("", 2 * MiB);
  void* s = h.a->allocate(1024, 0);  // takes the whole device: 2,096,128 bytes cached
  EXPECT_EQ(h.a->largest_cached_block(), 2 * MiB - 1024);
  EXPECT_EQ(h.a->largest_free_block(), 2 * MiB - 1024);
  h.a->free(s);
}

TEST(LargestFreeBlock, PolicyCachetKeepsTheContract) {
  auto h = cachet_alloc("", 1 * GiB);
  EXPECT_EQ(h.a->largest_cached_block(), 0u);
  EXPECT_EQ(h.a->largest_free_block(), 1 * GiB);
  void* p = h.a->allocate(3 * MiB, 0);
  h.a->free(p);
  EXPECT_GE(h.a->largest_cached_block(), 3 * MiB);  // the freed block, merged with any free neighbours
  EXPECT_EQ(h.a->largest_free_block(), std::max(h.sim->mem_get_info().value.free, h.a->largest_cached_block()));
}

// ----------------------------------------------------------------- getBaseAllocation (§15.4)

TEST(BaseAllocation, TheSegmentsBaseAndSize) {
  auto h = host_alloc();
  CachingAllocator& a = *h.a;
  void* x = a.allocate(3 * MiB, 0);  // [x 3 MiB][rest 17 MiB] of one 20 MiB segment
  void* y = a.allocate(5 * MiB, 0);  // [x][y 5 MiB][rest 12 MiB]
  EXPECT_EQ(addr(x), kBase);
  EXPECT_EQ(addr(y), kBase + 3 * MiB);
  Bytes size = 0;
  EXPECT_EQ(a.base_allocation(y, &size), at(kBase));
  EXPECT_EQ(size, 20 * MiB);
  EXPECT_EQ(a.base_allocation(x, nullptr), at(kBase));
  void* z = a.allocate(30 * MiB, 0);  // its own 30 MiB segment, right after the first
  EXPECT_EQ(a.base_allocation(z, &size), at(kBase + 20 * MiB));
  EXPECT_EQ(size, 30 * MiB);
  a.free(x);
  a.free(y);
  a.free(z);
}

TEST(BaseAllocation, OnlyLiveAllocations) {
  auto h = host_alloc();
  CachingAllocator& a = *h.a;
  void* x = a.allocate(3 * MiB, 0);
  Bytes size = 7;
  EXPECT_TRUE(contains(message_of<UsageError>([&] { a.base_allocation(at(kBase + 512), &size); }),
                       "invalid device pointer"));
  EXPECT_EQ(size, 7u);
  a.free(x);
  EXPECT_TRUE(contains(message_of<UsageError>([&] { a.base_allocation(x, &size); }), "invalid device pointer"));
  // Freed with a stream use: waiting for events, no longer an allocation.
  void* y = a.allocate(3 * MiB, 0);
  a.record_stream(y, 5);
  a.free(y);
  EXPECT_TRUE(contains(message_of<UsageError>([&] { a.base_allocation(y, &size); }), "invalid device pointer"));
}

TEST(BaseAllocation, ExpandableSegmentsAreRefusedWithPyTorchsMessage) {
  auto h = host_alloc("expandable_segments:True");
  void* x = h.a->allocate(3 * MiB, 0);
  EXPECT_TRUE(contains(message_of<UsageError>([&] { h.a->base_allocation(x, nullptr); }),
                       "Tensors allocated with expandable_segments:True cannot be shared between processes."));
  h.a->free(x);
}

TEST(BaseAllocation, PolicyCachetRefusesClearly) {
  auto h = cachet_alloc();
  void* x = h.a->allocate(3 * MiB, 0);
  EXPECT_TRUE(contains(message_of<UsageError>([&] { h.a->base_allocation(x, nullptr); }), "policy:pytorch"));
  EXPECT_TRUE(contains(message_of<UsageError>([&] { h.a->base_allocation(at(addr(x) + 512), nullptr); }),
                       "invalid device pointer"));
  h.a->free(x);
}

// ----------------------------------------------------------------- a MemPool's own allocator (§15.1)

// A MemPool's allocator as a test sees it: bump addresses from 0x500000000000 (never reused),
// every call logged, nullptr once `capacity` would be exceeded.
struct TestSource : gpu::SegmentSource {
  struct Call {
    bool allocate;
    std::uint64_t ptr;
    Bytes size;
    DeviceIndex device;
    StreamId stream;
    bool operator==(const Call&) const = default;
  };
  explicit TestSource(Bytes cap = 1 * GiB) : capacity(cap) {}
  void* allocate(Bytes size, DeviceIndex device, StreamId stream) override {
    if (used + size > capacity) {
      calls.push_back({true, 0, size, device, stream});
      return nullptr;
    }
    const std::uint64_t p = next;
    next += size;
    used += size;
    calls.push_back({true, p, size, device, stream});
    return at(p);
  }
  void release(void* ptr, Bytes size, DeviceIndex device, StreamId stream) override {
    used -= size;
    calls.push_back({false, addr(ptr), size, device, stream});
  }
  Bytes capacity;
  Bytes used = 0;
  std::uint64_t next = 0x500000000000;
  std::vector<Call> calls;
};
constexpr std::uint64_t kSrc = 0x500000000000;

// test_mempool_with_allocator: 1 MiB allocations in a pool with its own allocator: one 2 MiB
// segment holds two, the third makes a second; they go back to the allocator with the pool.
TEST(PoolSource, SegmentsComeFromTheSourceAndGoBackToIt) {
  auto h = host_alloc();
  CachingAllocator& a = *h.a;
  auto src = std::make_shared<TestSource>();
  a.create_or_incref_pool(kPool1, src);
  EXPECT_EQ(a.pool_use_count(kPool1), 1);
  a.begin_allocate_to_pool(kPool1, this_thread());
  void* x = a.allocate(1 * MiB, 3);
  void* y = a.allocate(1 * MiB, 3);
  EXPECT_EQ(a.snapshot().size(), 1u);
  void* z = a.allocate(1 * MiB, 3);
  a.end_allocate_to_pool(kPool1);
  EXPECT_EQ(addr(x), kSrc);
  EXPECT_EQ(addr(y), kSrc + 1 * MiB);
  EXPECT_EQ(addr(z), kSrc + 2 * MiB);
  EXPECT_EQ(a.snapshot().size(), 2u);
  EXPECT_EQ(src->calls, (std::vector<TestSource::Call>{{true, kSrc, 2 * MiB, 0, 3}, {true, kSrc + 2 * MiB, 2 * MiB, 0, 3}}));
  EXPECT_EQ(h.sim->used(), 0u);  // nothing from the device
  const DeviceStats st = a.stats();
  EXPECT_EQ(cur(st.segment), 2);
  EXPECT_EQ(cur(st.reserved_bytes), static_cast<std::int64_t>(4 * MiB));
  EXPECT_EQ(st.num_device_alloc, 2);
  a.free(x);
  a.free(y);
  a.free(z);
  a.release_pool(kPool1);
  a.release_pool(kPool1);
  EXPECT_EQ(src->calls.size(), 2u);  // kept while the pool has users, and until emptied
  a.empty_cache(kPool1);             // the MemPool's destructor
  EXPECT_EQ(src->calls, (std::vector<TestSource::Call>{{true, kSrc, 2 * MiB, 0, 3},
                                                        {true, kSrc + 2 * MiB, 2 * MiB, 0, 3},
                                                        {false, kSrc, 2 * MiB, 0, 3},
                                                        {false, kSrc + 2 * MiB, 2 * MiB, 0, 3}}));
  EXPECT_EQ(src->used, 0u);
  EXPECT_EQ(cur(a.stats().reserved_bytes), 0);
  EXPECT_EQ(a.stats().num_device_free, 2);
  EXPECT_THROW(a.pool_use_count(kPool1), UsageError);  // forgotten: no segment left
}

// Expandable segments never apply to a pool with its own allocator: a 19.5 MiB request takes a
// 20 MiB segment from the source, unsplit (the large pool keeps remainders over 1 MiB only).
TEST(PoolSource, ExpandableSegmentsDoNotApplyToIt) {
  auto h = host_alloc("expandable_segments:True");
  CachingAllocator& a = *h.a;
  auto src = std::make_shared<TestSource>();
  a.create_or_incref_pool(kPool1, src);
  a.begin_allocate_to_pool(kPool1, this_thread());
  void* x = a.allocate(19 * MiB + 512 * KiB, 0);
  a.end_allocate_to_pool(kPool1);
  EXPECT_EQ(addr(x), kSrc);
  EXPECT_EQ(src->calls, (std::vector<TestSource::Call>{{true, kSrc, 20 * MiB, 0, 0}}));
  EXPECT_EQ(cur(a.stats().allocated_bytes), static_cast<std::int64_t>(20 * MiB));
  EXPECT_FALSE(a.snapshot().at(0).is_expandable);
  Bytes size = 0;
  EXPECT_EQ(a.base_allocation(x, &size), at(kSrc));  // a cudaMalloc-like segment: shareable
  EXPECT_EQ(size, 20 * MiB);
  // The default pool keeps expandable segments: the same request maps 20 MiB and splits.
  void* y = a.allocate(19 * MiB + 512 * KiB, 0);
  EXPECT_EQ(cur(a.stats().allocated_bytes), static_cast<std::int64_t>(40 * MiB - 512 * KiB));
  EXPECT_EQ(h.sim->used(), 20 * MiB);
  a.free(x);
  a.free(y);
}

TEST(PoolSource, NoMemoryFromTheSourceIsAnOutOfMemory) {
  auto h = host_alloc();
  CachingAllocator& a = *h.a;
  auto src = std::make_shared<TestSource>(16 * MiB);
  a.create_or_incref_pool(kPool1, src);
  a.begin_allocate_to_pool(kPool1, this_thread());
  EXPECT_THROW(a.allocate(3 * MiB, 0), OutOfMemory);  // a 20 MiB segment: more than the source has
  a.end_allocate_to_pool(kPool1);
  EXPECT_EQ(a.stats().num_ooms, 1);
  EXPECT_EQ(cur(a.stats().reserved_bytes), 0);
  EXPECT_EQ(h.sim->used(), 0u);
  // allocate, then the two retries of malloc's path (§3.1), all asking the source.
  ASSERT_FALSE(src->calls.empty());
  for (const auto& c : src->calls) EXPECT_EQ(c, (TestSource::Call{true, 0, 20 * MiB, 0, 0}));
}

TEST(PoolSource, OnlyANewPoolTakesASource) {
  auto h = host_alloc();
  CachingAllocator& a = *h.a;
  auto src = std::make_shared<TestSource>();
  a.create_or_incref_pool(kPool1);
  EXPECT_TRUE(contains(message_of<PyTorchFailsHere>([&] { a.create_or_incref_pool(kPool1, src); }),
                       "!allocator INTERNAL ASSERT FAILED"));
  EXPECT_EQ(a.pool_use_count(kPool1), 1);
  EXPECT_THROW(a.create_or_incref_pool(PoolId{}, src), UsageError);
  a.create_or_incref_pool(kPool1, nullptr);  // no source: one more user
  EXPECT_EQ(a.pool_use_count(kPool1), 2);
}

TEST(PoolSource, TheAllocatorsDestructorGivesItsSegmentsBack) {
  auto src = std::make_shared<TestSource>();
  {
    auto h = host_alloc();
    h.a->create_or_incref_pool(kPool1, src);
    h.a->begin_allocate_to_pool(kPool1, this_thread());
    (void)h.a->allocate(3 * MiB, 0);
    h.a->end_allocate_to_pool(kPool1);
  }
  EXPECT_EQ(src->calls.back(), (TestSource::Call{false, kSrc, 20 * MiB, 0, 0}));
  EXPECT_EQ(src->used, 0u);
}

TEST(PoolSource, PolicyCachetRefusesClearly) {
  auto h = cachet_alloc();
  auto src = std::make_shared<TestSource>();
  EXPECT_TRUE(contains(message_of<UsageError>([&] { h.a->create_or_incref_pool(kPool1, src); }), "policy:pytorch"));
  EXPECT_THROW(h.a->pool_use_count(kPool1), UsageError);  // nothing created
  h.a->create_or_incref_pool(kPool1, nullptr);
  EXPECT_EQ(h.a->pool_use_count(kPool1), 1);
}

// ----------------------------------------------------------------- graph trees' checkpoints (§15.3)

struct Ev {
  TraceAction action;
  std::uint64_t addr;
  Bytes size;
  bool operator==(const Ev&) const = default;
};
std::vector<Ev> events(const CachingAllocator& a) {
  std::vector<Ev> out;
  for (const TraceEvent& e : a.trace()) out.push_back({e.action, e.addr, e.size});
  return out;
}

// A graph's pool: [a 4 MiB][free 6][c 2][free 8] in one 20 MiB segment at S.
struct GraphPool {
  HostAlloc h;
  void* a = nullptr;
  void* c = nullptr;
  explicit GraphPool(const std::string& conf = "") : h(host_alloc(conf)) {
    CachingAllocator& al = *h.a;
    al.set_trace(true);
    al.create_or_incref_pool(kGraph);
    al.begin_allocate_to_pool(kGraph, this_thread());
    a = al.allocate(4 * MiB - 100, 0);  // requested 4,194,204 B, a 4 MiB block
    void* b = al.allocate(6 * MiB, 0);
    c = al.allocate(2 * MiB, 0);
    al.free(b);
    al.end_allocate_to_pool(kGraph);
  }
};

TEST(Checkpoint, HoldsThePoolsSegmentsAndBlocks) {
  GraphPool g;
  auto cp = g.h.a->checkpoint_pool(kGraph);
  EXPECT_EQ(cp->id, kGraph);
  ASSERT_EQ(cp->segments.size(), 1u);
  const auto& s = cp->segments[0];
  EXPECT_FALSE(s.is_small);
  EXPECT_FALSE(s.expandable);
  using B = PoolCheckpoint::BlockState;
  auto same = [](const B& x, const B& y) {
    return x.ptr == y.ptr && x.size == y.size && x.allocated == y.allocated && x.mapped == y.mapped;
  };
  const std::vector<B> want{{at(kBase), 4 * MiB, true, true},
                            {at(kBase + 4 * MiB), 6 * MiB, false, true},
                            {at(kBase + 10 * MiB), 2 * MiB, true, true},
                            {at(kBase + 12 * MiB), 8 * MiB, false, true}};
  ASSERT_EQ(s.blocks.size(), want.size());
  for (std::size_t i = 0; i < want.size(); ++i) EXPECT_TRUE(same(s.blocks[i], want[i])) << i;
  EXPECT_THROW(g.h.a->checkpoint_pool(kPool2), UsageError);
}

// After the checkpoint, a dies and d (8 MiB) takes the last free block; then the tree goes back
// to the checkpoint with d stale: every allocation of the pool is freed, the checkpoint's blocks
// allocated again (requested size = block size), its free blocks freed.
TEST(Checkpoint, RestoreMakesThePoolMatchTheCheckpoint) {
  GraphPool g;
  CachingAllocator& a = *g.h.a;
  auto cp = a.checkpoint_pool(kGraph);
  a.free(g.a);  // [free 10][c 2][free 8]
  a.begin_allocate_to_pool(kGraph, this_thread());
  void* d = a.allocate(8 * MiB, 0);
  a.end_allocate_to_pool(kGraph);
  EXPECT_EQ(addr(d), kBase + 12 * MiB);
  EXPECT_TRUE(a.pool_live_allocations_are(kGraph, {g.c, d}));
  a.clear_trace();

  const CheckpointDelta delta = a.restore_pool(*cp, {d});
  EXPECT_EQ(delta.freed, (std::vector<void*>{d, g.c}));
  EXPECT_EQ(delta.allocated, (std::vector<std::pair<void*, Bytes>>{{at(kBase), 4 * MiB}, {at(kBase + 10 * MiB), 2 * MiB}}));
  using A = TraceAction;
  const std::uint64_t S = kBase;
  EXPECT_EQ(events(a), (std::vector<Ev>{{A::FreeRequested, S + 12 * MiB, 8 * MiB},
                                        {A::FreeCompleted, S + 12 * MiB, 8 * MiB},
                                        {A::FreeRequested, S + 10 * MiB, 2 * MiB},
                                        {A::FreeCompleted, S + 10 * MiB, 2 * MiB},
                                        {A::Alloc, S, 4 * MiB},
                                        {A::Alloc, S + 4 * MiB, 6 * MiB},
                                        {A::Alloc, S + 10 * MiB, 2 * MiB},
                                        {A::Alloc, S + 12 * MiB, 8 * MiB},
                                        {A::FreeRequested, S + 4 * MiB, 6 * MiB},
                                        {A::FreeCompleted, S + 4 * MiB, 6 * MiB},
                                        {A::FreeRequested, S + 12 * MiB, 8 * MiB},
                                        {A::FreeCompleted, S + 12 * MiB, 8 * MiB}}));
  const DeviceStats st = a.stats();
  EXPECT_EQ(cur(st.allocation), 2);
  EXPECT_EQ(cur(st.allocated_bytes), static_cast<std::int64_t>(6 * MiB));
  EXPECT_EQ(cur(st.requested_bytes), static_cast<std::int64_t>(6 * MiB));  // 4 MiB - 100 before
  EXPECT_EQ(cur(st.active_bytes), static_cast<std::int64_t>(6 * MiB));
  EXPECT_EQ(cur(st.inactive_split), 2);
  EXPECT_EQ(cur(st.inactive_split_bytes), static_cast<std::int64_t>(14 * MiB));
  EXPECT_EQ(cur(st.segment), 1);
  EXPECT_EQ(cur(st.reserved_bytes), static_cast<std::int64_t>(20 * MiB));
  EXPECT_EQ(st.num_device_alloc, 1);
  // checkPoolLiveAllocations: exactly the checkpoint's allocations, as a set.
  EXPECT_TRUE(a.pool_live_allocations_are(kGraph, {at(S), at(S + 10 * MiB)}));
  EXPECT_TRUE(a.pool_live_allocations_are(kGraph, {at(S + 10 * MiB), at(S), at(S)}));
  EXPECT_FALSE(a.pool_live_allocations_are(kGraph, {at(S)}));
  EXPECT_FALSE(a.pool_live_allocations_are(kGraph, {at(S), at(S + 10 * MiB), d}));
  EXPECT_THROW((void)a.pool_live_allocations_are(kPool2, {}), UsageError);
  // The restored allocations are ordinary ones.
  a.free(at(S));
  a.free(at(S + 10 * MiB));
  EXPECT_TRUE(a.pool_live_allocations_are(kGraph, {}));
}

TEST(Checkpoint, RestoreOfAnExpandableSegment) {
  GraphPool g("expandable_segments:True");  // [a 4][free 6][c 2][free 8][unmapped rest]
  CachingAllocator& a = *g.h.a;
  const std::uint64_t S = addr(g.a);
  auto cp = a.checkpoint_pool(kGraph);
  ASSERT_EQ(cp->segments.size(), 1u);
  ASSERT_EQ(cp->segments[0].blocks.size(), 5u);
  EXPECT_TRUE(cp->segments[0].expandable);
  EXPECT_FALSE(cp->segments[0].blocks[4].mapped);
  a.free(g.a);
  a.free(g.c);  // the pool's mapped 20 MiB are one free block again
  const CheckpointDelta delta = a.restore_pool(*cp, {});
  EXPECT_TRUE(delta.freed.empty());
  EXPECT_EQ(delta.allocated, (std::vector<std::pair<void*, Bytes>>{{at(S), 4 * MiB}, {at(S + 10 * MiB), 2 * MiB}}));
  EXPECT_EQ(cur(a.stats().allocated_bytes), static_cast<std::int64_t>(6 * MiB));
  EXPECT_EQ(cur(a.stats().reserved_bytes), static_cast<std::int64_t>(20 * MiB));
  // Grown since the checkpoint: PyTorch's walk would fail.
  a.begin_allocate_to_pool(kGraph, this_thread());
  void* e = a.allocate(30 * MiB, 0);
  a.end_allocate_to_pool(kGraph);
  a.free(e);
  EXPECT_TRUE(contains(message_of<PyTorchFailsHere>([&] { a.restore_pool(*cp, {}); }), "mapped bytes"));
}

TEST(Checkpoint, RefusalsChangeNothing) {
  GraphPool g;
  CachingAllocator& a = *g.h.a;
  auto cp = a.checkpoint_pool(kGraph);
  void* outside = a.allocate(3 * MiB, 0);  // the default pool
  const auto stats_before = a.stats();
  const auto trace_before = a.trace().size();
  auto unchanged = [&] {
    EXPECT_EQ(a.stats().allocated_bytes, stats_before.allocated_bytes);
    EXPECT_EQ(a.stats().allocation, stats_before.allocation);
    EXPECT_EQ(a.trace().size(), trace_before);
    EXPECT_TRUE(a.pool_live_allocations_are(kGraph, {g.a, g.c}));
  };
  EXPECT_TRUE(contains(message_of<UsageError>([&] { a.restore_pool(*cp, {outside}); }), "not an allocation of this pool"));
  unchanged();
  PoolCheckpoint moved = *cp;
  for (auto& b : moved.segments[0].blocks) b.ptr = at(addr(b.ptr) + 64 * MiB);
  EXPECT_TRUE(contains(message_of<PyTorchFailsHere>([&] { a.restore_pool(moved, {}); }), "could not find"));
  unchanged();
  PoolCheckpoint other = *cp;
  other.id = kPool2;
  EXPECT_THROW(a.restore_pool(other, {}), UsageError);
  unchanged();
  // An allocation of the pool used on another stream: PyTorch's free would leave it waiting.
  a.record_stream(g.c, 9);
  EXPECT_TRUE(contains(message_of<PyTorchFailsHere>([&] { a.restore_pool(*cp, {}); }), "used on other streams"));
  unchanged();
  // Freed after that use: it waits for events; neither a checkpoint nor a restore may see it.
  a.free(g.c);
  EXPECT_TRUE(contains(message_of<PyTorchFailsHere>([&] { a.checkpoint_pool(kGraph); }),
                       "Events should have synchronized when checkpointing block"));
  EXPECT_TRUE(contains(message_of<PyTorchFailsHere>([&] { a.restore_pool(*cp, {}); }), "waits for stream-use events"));
  g.h.sim->complete_all_events();
  a.free(outside);  // malloc or empty_cache would process the events; a free does not
  EXPECT_THROW(a.restore_pool(*cp, {}), PyTorchFailsHere);
  void* again = a.allocate(512, 0);  // processes the events: c is free
  a.free(again);
  // Every user released the pool: PyTorch refuses a freeable pool.
  a.release_pool(kGraph);
  a.release_pool(kGraph);
  EXPECT_TRUE(contains(message_of<PyTorchFailsHere>([&] { a.restore_pool(*cp, {}); }), "freeable"));
  (void)a.checkpoint_pool(kGraph);  // PyTorch checkpoints a freeable pool that is still known
}

TEST(Checkpoint, PolicyCachetChecksLiveAllocationsAndRefusesCheckpoints) {
  auto h = cachet_alloc();
  CachingAllocator& a = *h.a;
  a.create_or_incref_pool(kGraph);
  a.begin_allocate_to_pool(kGraph, this_thread());
  void* x = a.allocate(3 * MiB, 0);
  void* y = a.allocate(1000, 0);
  a.end_allocate_to_pool(kGraph);
  void* z = a.allocate(3 * MiB, 0);  // the default pool
  EXPECT_TRUE(a.pool_live_allocations_are(kGraph, {x, y}));
  EXPECT_FALSE(a.pool_live_allocations_are(kGraph, {x, y, z}));
  EXPECT_FALSE(a.pool_live_allocations_are(kGraph, {x}));
  a.free(y);
  EXPECT_TRUE(a.pool_live_allocations_are(kGraph, {x}));
  EXPECT_THROW((void)a.pool_live_allocations_are(kPool2, {}), UsageError);
  EXPECT_TRUE(contains(message_of<UsageError>([&] { a.checkpoint_pool(kGraph); }), "policy:pytorch"));
  a.free(x);
  a.free(z);
}

// ----------------------------------------------------------------- setUseOnOOM, setNoSplit (§15.2)

// test_mempool_limited_memory_with_allocator: the device is full; the default pool finds no block
// and no segment, and takes the free block of the pool marked use_on_oom (b's address) before
// any retry.
TEST(UseOnOom, TheDefaultPoolTakesAFreeBlockOfAMarkedPool) {
  auto h = host_alloc("", 40 * MiB);
  CachingAllocator& a = *h.a;
  a.create_or_incref_pool(kPool1);
  a.set_use_on_oom(kPool1, true);
  a.begin_allocate_to_pool(kPool1, this_thread());
  void* b = a.allocate(20 * MiB, 0);
  a.end_allocate_to_pool(kPool1);
  a.release_pool(kPool1);  // use_mem_pool's user
  a.free(b);
  void* x = a.allocate(20 * MiB, 0);  // the device's last 20 MiB
  EXPECT_EQ(addr(x), kBase + 20 * MiB);
  void* c = a.allocate(20 * MiB, 0);
  EXPECT_EQ(c, b);
  DeviceStats st = a.stats();
  EXPECT_EQ(st.num_alloc_retries, 0);
  EXPECT_EQ(st.num_ooms, 0);
  EXPECT_EQ(cur(st.allocated_bytes), static_cast<std::int64_t>(40 * MiB));
  EXPECT_EQ(a.pool_use_count(kPool1), 1);
  // The block stays the pool's: a live allocation of the pool, and back to the pool when freed.
  EXPECT_TRUE(a.pool_live_allocations_are(kPool1, {c}));
  EXPECT_EQ(a.snapshot().at(0).pool_id, kPool1);
  a.free(c);
  EXPECT_TRUE(a.pool_live_allocations_are(kPool1, {}));
  a.set_use_on_oom(kPool1, false);
  EXPECT_THROW(a.allocate(20 * MiB, 0), OutOfMemory);  // unmarked: the pool keeps its block
  st = a.stats();
  EXPECT_EQ(st.num_alloc_retries, 1);
  EXPECT_EQ(st.num_ooms, 1);
  a.free(x);
}

// PyTorch walks its use_on_oom_pools hash set: ids {0, 1} and {0, 2} sit in slots 2 and 0 of
// its 4 buckets, so {0, 2} lends first.
TEST(UseOnOom, PoolsAreTriedInPyTorchsOrder) {
  auto h = host_alloc("", 60 * MiB);
  CachingAllocator& a = *h.a;
  std::vector<void*> blocks;
  for (PoolId id : {kPool1, kPool2}) {
    a.create_or_incref_pool(id);
    a.set_use_on_oom(id, true);
    a.begin_allocate_to_pool(id, this_thread());
    blocks.push_back(a.allocate(20 * MiB, 0));
    a.end_allocate_to_pool(id);
    a.free(blocks.back());
  }
  void* x = a.allocate(20 * MiB, 0);
  void* c = a.allocate(20 * MiB, 0);
  EXPECT_EQ(addr(blocks[1]), kBase + 20 * MiB);
  EXPECT_EQ(c, blocks[1]);
  void* d = a.allocate(20 * MiB, 0);
  EXPECT_EQ(d, blocks[0]);
  a.free(c);
  a.free(d);
  a.free(x);
}

// Inside a private pool there is no fallback; and the fallback is tried after a failed segment
// only: a default-pool allocation that fits in the device gets its own segment.
TEST(UseOnOom, OnlyForTheDefaultPoolsAndOnlyWhenTheDeviceRefuses) {
  auto h = host_alloc("", 40 * MiB);
  CachingAllocator& a = *h.a;
  a.create_or_incref_pool(kPool1);
  a.set_use_on_oom(kPool1, true);
  a.begin_allocate_to_pool(kPool1, this_thread());
  void* b = a.allocate(20 * MiB, 0);
  a.end_allocate_to_pool(kPool1);
  a.free(b);
  void* x = a.allocate(20 * MiB, 0);
  EXPECT_EQ(addr(x), kBase + 20 * MiB);  // a new segment, not b's block
  a.create_or_incref_pool(kPool2);
  a.begin_allocate_to_pool(kPool2, this_thread());
  EXPECT_THROW(a.allocate(20 * MiB, 0), OutOfMemory);
  a.end_allocate_to_pool(kPool2);
  a.free(x);
}

TEST(UseOnOom, AMarkedPoolThatIsActiveFailsInPyTorch) {
  auto h = host_alloc("", 20 * MiB);
  CachingAllocator& a = *h.a;
  a.create_or_incref_pool(kPool1);
  a.set_use_on_oom(kPool1, true);
  a.begin_allocate_to_pool(kPool1, PoolRoute{PoolRoute::Kind::CaptureStream, 7});
  void* x = a.allocate(20 * MiB, 0);  // stream 0: the default pool
  EXPECT_TRUE(contains(message_of<PyTorchFailsHere>([&] { a.allocate(20 * MiB, 0); }), "already recording to mempool_id"));
  EXPECT_EQ(a.pool_use_count(kPool1), 2);
  a.end_allocate_to_pool(kPool1);
  a.free(x);
  EXPECT_THROW(a.set_use_on_oom(PoolId{}, true), UsageError);
}

// test_mempool_no_split: every segment of the pool holds exactly one block.
TEST(NoSplit, BlocksOfThePoolAreNeverSplit) {
  auto h = host_alloc();
  CachingAllocator& a = *h.a;
  a.create_or_incref_pool(kPool1);
  a.set_no_split(kPool1);
  a.begin_allocate_to_pool(kPool1, this_thread());
  void* x = a.allocate(1 * MiB, 0);  // a 2 MiB small segment, taken whole
  void* y = a.allocate(1 * MiB, 0);  // another
  void* z = a.allocate(3 * MiB, 0);  // a 20 MiB segment, taken whole
  a.end_allocate_to_pool(kPool1);
  EXPECT_EQ(addr(x), kBase);
  EXPECT_EQ(addr(y), kBase + 2 * MiB);
  EXPECT_EQ(addr(z), kBase + 4 * MiB);
  const Snapshot snap = a.snapshot();
  ASSERT_EQ(snap.size(), 3u);
  for (const auto& seg : snap) EXPECT_EQ(seg.blocks.size(), 1u);
  DeviceStats st = a.stats();
  EXPECT_EQ(cur(st.allocated_bytes), static_cast<std::int64_t>(24 * MiB));
  EXPECT_EQ(cur(st.requested_bytes), static_cast<std::int64_t>(5 * MiB));
  EXPECT_EQ(cur(st.inactive_split), 0);
  // The default pool still splits.
  void* w = a.allocate(1 * MiB, 0);
  EXPECT_EQ(cur(a.stats().allocated_bytes), static_cast<std::int64_t>(25 * MiB));
  EXPECT_EQ(a.snapshot().back().blocks.size(), 2u);
  // A freed block of the pool is reused whole by a smaller request.
  a.free(x);
  a.begin_allocate_to_pool(kPool1, this_thread());
  void* v = a.allocate(4096, 0);
  a.end_allocate_to_pool(kPool1);
  EXPECT_EQ(v, x);
  EXPECT_EQ(cur(a.stats().allocated_bytes), static_cast<std::int64_t>(25 * MiB));
  for (void* p : {v, y, z, w}) a.free(p);
  EXPECT_THROW(a.set_no_split(PoolId{}), UsageError);
}

TEST(UseOnOomAndNoSplit, PolicyCachetRefusesClearly) {
  auto h = cachet_alloc();
  h.a->create_or_incref_pool(kPool1);
  EXPECT_TRUE(contains(message_of<UsageError>([&] { h.a->set_use_on_oom(kPool1, true); }), "policy:pytorch"));
  h.a->set_use_on_oom(kPool1, false);  // a MemPool's destructor unmarks: nothing to do
  EXPECT_TRUE(contains(message_of<UsageError>([&] { h.a->set_no_split(kPool1); }), "policy:pytorch"));
}

}  // namespace
}  // namespace cachet::test

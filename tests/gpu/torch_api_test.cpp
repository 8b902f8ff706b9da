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

}  // namespace
}  // namespace cachet::test

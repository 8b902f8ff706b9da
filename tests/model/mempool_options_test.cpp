// A MemPool's options in the model (docs/pytorch-allocator.md §15.2): use_on_oom (setUseOnOOM,
// try_mempool_fallback) and no_split (setNoSplit), with values worked out by hand from PyTorch's
// rules: the scenarios of PyTorch's test_mempool_limited_memory_with_allocator and
// test_mempool_no_split. Synthetic addresses from 0x7f0000000000, segments 2 MiB aligned.
#include "cachet/errors.h"
#include "harness.h"

namespace cachet::model::test {
namespace {

constexpr PoolRoute kThread{PoolRoute::Kind::CurrentThread, 0};
constexpr std::uint64_t kBase = 0x7f0000000000;
constexpr Bytes kMiB = 1024 * 1024;
constexpr PoolId kPool1{0, 1};
constexpr PoolId kPool2{0, 2};

// A pool's 20 MiB block, freed: cached in the pool.
std::uint64_t cache_in_pool(Device& d, PoolId id) {
  d.alloc.create_or_incref_pool(id);
  d.alloc.set_use_on_oom(id, true);
  d.alloc.begin_allocate_to_pool(id, kThread);
  const auto b = d.malloc(20 * kMiB);
  d.alloc.end_allocate_to_pool(id);
  d.alloc.release_pool(id);
  d.free(b);
  return b;
}

TEST(UseOnOom, TheDefaultPoolBorrowsAFreeBlockBeforeAnyRetry) {
  Device d(Config{}, 40 * kMiB);
  const auto b = cache_in_pool(d, kPool1);
  const auto x = d.malloc(20 * kMiB);  // the device's last 20 MiB
  EXPECT_EQ(x, kBase + 20 * kMiB);
  const auto c = d.malloc(20 * kMiB);  // no block, no segment: the pool's block
  EXPECT_EQ(c, b);
  EXPECT_EQ(d.alloc.stats().num_alloc_retries, 0);
  EXPECT_EQ(d.alloc.stats().num_ooms, 0);
  EXPECT_EQ(d.alloc.stats().allocated_bytes[0].current, static_cast<std::int64_t>(40 * kMiB));
  EXPECT_EQ(d.alloc.pool_use_count(kPool1), 1);
  const Snapshot s = d.alloc.snapshot();
  EXPECT_EQ(s.at(0).pool_id, kPool1);  // still the pool's block
  d.free(c);
  EXPECT_EQ(d.alloc.snapshot().at(0).pool_id, kPool1);
  d.alloc.set_use_on_oom(kPool1, false);
  EXPECT_THROW(d.malloc(20 * kMiB), OutOfMemory);
  EXPECT_EQ(d.alloc.stats().num_alloc_retries, 1);
  d.free(x);
}

// PyTorch's hash set holds {0, 1} in slot 2 and {0, 2} in slot 0 of its 4 buckets.
TEST(UseOnOom, PoolsLendInPyTorchsOrder) {
  Device d(Config{}, 60 * kMiB);
  const auto b1 = cache_in_pool(d, kPool1);
  const auto b2 = cache_in_pool(d, kPool2);
  const auto x = d.malloc(20 * kMiB);
  EXPECT_EQ(d.malloc(20 * kMiB), b2);
  EXPECT_EQ(d.malloc(20 * kMiB), b1);
  d.free(b1);
  d.free(b2);
  d.free(x);
}

TEST(UseOnOom, NotInsideAPrivatePool) {
  Device d(Config{}, 40 * kMiB);
  cache_in_pool(d, kPool1);
  const auto x = d.malloc(20 * kMiB);
  d.alloc.create_or_incref_pool(kPool2);
  d.alloc.begin_allocate_to_pool(kPool2, kThread);
  EXPECT_THROW(d.malloc(20 * kMiB), OutOfMemory);
  d.alloc.end_allocate_to_pool(kPool2);
  d.free(x);
}

TEST(UseOnOom, AnActiveMarkedPoolIsWherePyTorchFails) {
  Device d(Config{}, 20 * kMiB);
  d.alloc.create_or_incref_pool(kPool1);
  d.alloc.set_use_on_oom(kPool1, true);
  d.alloc.begin_allocate_to_pool(kPool1, PoolRoute{PoolRoute::Kind::CaptureStream, 7});
  const auto x = d.malloc(20 * kMiB);  // stream 0: the default pool
  EXPECT_THROW(d.malloc(20 * kMiB), PyTorchFailure);
  d.alloc.end_allocate_to_pool(kPool1);
  d.free(x);
  EXPECT_THROW(d.alloc.set_use_on_oom(PoolId{}, true), UsageError);
}

TEST(NoSplit, EverySegmentOfThePoolHoldsOneBlock) {
  Device d;
  d.alloc.create_or_incref_pool(kPool1);
  d.alloc.set_no_split(kPool1);
  d.alloc.begin_allocate_to_pool(kPool1, kThread);
  const auto x = d.malloc(1 * kMiB);  // a 2 MiB small segment, whole
  const auto y = d.malloc(1 * kMiB);
  const auto z = d.malloc(3 * kMiB);  // a 20 MiB segment, whole
  d.alloc.end_allocate_to_pool(kPool1);
  EXPECT_EQ(x, kBase);
  EXPECT_EQ(y, kBase + 2 * kMiB);
  EXPECT_EQ(z, kBase + 4 * kMiB);
  const Snapshot s = d.alloc.snapshot();
  ASSERT_EQ(s.size(), 3u);
  for (const auto& seg : s) EXPECT_EQ(seg.blocks.size(), 1u);
  EXPECT_EQ(d.alloc.stats().allocated_bytes[0].current, static_cast<std::int64_t>(24 * kMiB));
  EXPECT_EQ(d.alloc.stats().requested_bytes[0].current, static_cast<std::int64_t>(5 * kMiB));
  const auto w = d.malloc(1 * kMiB);  // the default pool splits
  EXPECT_EQ(d.alloc.stats().allocated_bytes[0].current, static_cast<std::int64_t>(25 * kMiB));
  d.free(x);
  d.alloc.begin_allocate_to_pool(kPool1, kThread);
  EXPECT_EQ(d.malloc(4096), x);  // the whole 2 MiB block again
  d.alloc.end_allocate_to_pool(kPool1);
  EXPECT_EQ(d.alloc.stats().allocated_bytes[0].current, static_cast<std::int64_t>(25 * kMiB));
  for (auto p : {x, y, z, w}) d.free(p);
  EXPECT_THROW(d.alloc.set_no_split(PoolId{}), UsageError);
}

}  // namespace
}  // namespace cachet::model::test

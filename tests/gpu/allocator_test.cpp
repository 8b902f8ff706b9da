// Unit tests of cachet::CachingAllocator on the host backend. Expected values are PyTorch
// 2.11's, from the probe tables of docs/pytorch-allocator.md (§1.4, §1.5; § numbers below refer
// to it) and the probe recordings in tests/data/probe/probe-torch-2.11-h200.tar.gz (copied here
// as literals, file named per test).
// Every allocator here runs in validate mode: each operation ends with invariants().
// Cases that do not pin PyTorch's exact pointers or stats (pointer diagnostics, errors, stream
// uses, the memory cap, OOM messages) are TEST_Ps over both policies (suffix /pytorch, /cachet);
// the probe tables and PyTorch-exact sequences run on policy:pytorch only.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cachet/errors.h"
#include "cachet/summary.h"
#include "gpu_test_support.h"

namespace cachet::test {
namespace {

constexpr Bytes MiB_ = MiB;

// A case run over both policies: alloc() builds a validate-mode host allocator of the policy.
class BothPolicies : public ::testing::TestWithParam<Policy> {
 protected:
  bool cachet() const { return GetParam() == Policy::Cachet; }
  HostAlloc alloc(const std::string& conf = "") const {
    if (!cachet()) return host_alloc(conf);
    return host_alloc(conf.empty() ? "policy:cachet" : "policy:cachet," + conf);
  }
};

std::string policy_name(const ::testing::TestParamInfo<Policy>& info) {
  return info.param == Policy::Cachet ? "cachet" : "pytorch";
}

#define CACHET_BOTH_POLICIES(Suite)                                                             \
  class Suite : public BothPolicies {};                                                         \
  INSTANTIATE_TEST_SUITE_P(Policies, Suite, ::testing::Values(Policy::PyTorch, Policy::Cachet), \
                           policy_name)

// §1.4 (rounding.json): request -> (block, segment) from an empty cache.
struct RoundRow {
  Bytes request, block, segment;
};
TEST(Rounding, ProbeTable14) {
  const RoundRow rows[] = {
      {1, 512, 2097152},          {511, 512, 2097152},          {512, 512, 2097152},
      {513, 1024, 2097152},       {1000, 1024, 2097152},        {1024, 1024, 2097152},
      {1048575, 1048576, 2097152}, {1048576, 1048576, 2097152}, {1048577, 1049088, 20971520},
      {2 * MiB_, 2 * MiB_, 20971520}, {5 * MiB_, 5 * MiB_, 20971520}, {10 * MiB_ - 1, 10485760, 10485760},
      {10 * MiB_ + 1, 10486272, 12582912}, {12 * MiB_ + 1, 12583424, 14680064},
      {19 * MiB_, 20971520, 20971520}, {21 * MiB_, 23068672, 23068672},
      {100 * MiB_ + 1, 104858112, 106954752},
  };
  for (const auto& r : rows) {
    auto h = host_alloc();
    void* p = h.a->allocate(r.request, 0);
    const auto s = h.a->stats();
    EXPECT_EQ(cur(s.allocated_bytes), static_cast<std::int64_t>(r.block)) << r.request;
    EXPECT_EQ(cur(s.reserved_bytes), static_cast<std::int64_t>(r.segment)) << r.request;
    EXPECT_EQ(cur(s.requested_bytes), static_cast<std::int64_t>(r.request)) << r.request;
    h.a->free(p);
  }
}

// §1.5 (roundup.json): roundup_power2_divisions, block size per config.
TEST(Rounding, ProbeTable15) {
  struct Row {
    const char* conf;
    Bytes request, block;
  };
  const Row rows[] = {
      {"", 100000, 100352},
      {"roundup_power2_divisions:1", 1 * MiB_ + 1, 1049088},
      {"roundup_power2_divisions:4", 100000, 114688},
      {"roundup_power2_divisions:4", 1 * MiB_ + 1, 1310720},
      {"roundup_power2_divisions:4", 9 * MiB_ + 1, 10 * MiB_},
      {"roundup_power2_divisions:4", 84 * MiB_, 96 * MiB_},
      {"roundup_power2_divisions:8", 100000, 106496},
      {"roundup_power2_divisions:8", 3 * MiB_ + 1, 3407872},
      {"roundup_power2_divisions:8", 300 * MiB_ + 7, 320 * MiB_},
      {"roundup_power2_divisions:[256:1,512:2,>:8]", 600 * MiB_ + 7, 768 * MiB_},
      {"roundup_power2_divisions:[256:1,512:2,>:8]", 300 * MiB_ + 7, 314573312},
      {"roundup_power2_divisions:[64:8,128:2,256:2,512:2,1024:1,>:1]", 300 * MiB_ + 7, 384 * MiB_},
      {"roundup_power2_divisions:[2:16]", 1 * MiB_ + 1, 1114112},
      {"roundup_power2_divisions:[2:16]", 5 * MiB_ + 1, 5243392},
      {"roundup_power2_divisions:8", 1200, 1536},
  };
  for (const auto& r : rows) {
    auto h = host_alloc(r.conf);
    void* p = h.a->allocate(r.request, 0);
    EXPECT_EQ(cur(h.a->stats().allocated_bytes), static_cast<std::int64_t>(r.block)) << r.conf << " " << r.request;
    h.a->free(p);
  }
}

TEST(Rounding, NineMiBWithFourDivisionsGetsAnExactTenMiBSegment) {
  auto h = host_alloc("roundup_power2_divisions:4");
  h.a->allocate(9 * MiB_ + 1, 0);
  EXPECT_EQ(cur(h.a->stats().reserved_bytes), static_cast<std::int64_t>(10 * MiB_));
}

// small_pack.json: 4 x 512 KiB fill one 2 MiB segment; the 5th opens a second; freeing #1
// and #2 merges a 1 MiB hole; 700 KiB best-fits into it leaving 331,776 B.
TEST(Pools, SmallPackAndMerge) {
  auto h = host_alloc();
  std::vector<void*> p;
  for (int i = 0; i < 5; ++i) p.push_back(h.a->allocate(512 * KiB, 0));
  EXPECT_EQ(cur(h.a->stats().segment), 2);
  h.a->free(p[0]);
  h.a->free(p[1]);
  void* q = h.a->allocate(716800, 0);
  EXPECT_EQ(q, p[0]);
  const Snapshot snap = h.a->snapshot();
  ASSERT_EQ(snap.size(), 2u);
  ASSERT_EQ(snap[0].blocks.size(), 4u);
  EXPECT_EQ(snap[0].blocks[0].size, 716800u);
  EXPECT_EQ(snap[0].blocks[1].size, 331776u);
  EXPECT_EQ(snap[0].blocks[1].state, BlockState::Inactive);
}

// large_split.json: a=9MiB, b=10.5MiB, c=10.6MiB, del a, del c, d=3MiB, e=2MiB, del b,d,e,
// empty_cache, f=19MiB, g=18.5MiB: allocated / reserved / inactive_split_bytes / segments.
TEST(Pools, LargeSplitSequence) {
  auto h = host_alloc();
  auto& a = *h.a;
  auto check = [&](const char* step, std::int64_t alloc, std::int64_t res, std::int64_t isb, std::int64_t seg) {
    const auto s = a.stats();
    EXPECT_EQ(cur(s.allocated_bytes), alloc) << step;
    EXPECT_EQ(cur(s.reserved_bytes), res) << step;
    EXPECT_EQ(cur(s.inactive_split_bytes), isb) << step;
    EXPECT_EQ(cur(s.segment), seg) << step;
  };
  void* pa = a.allocate(9 * MiB_, 0);
  check("a=9MiB", 9437184, 20971520, 11534336, 1);
  void* pb = a.allocate(10 * MiB_ + 512 * KiB, 0);
  check("b=10.5MiB", 20971520, 20971520, 0, 1);
  void* pc = a.allocate(static_cast<Bytes>(10.6 * MiB_), 0);
  check("c=10.6MiB", 32086528, 33554432, 1467904, 2);
  a.free(pa);
  check("del a", 22649344, 33554432, 10905088, 2);
  a.free(pc);
  check("del c", 11534336, 33554432, 9437184, 2);
  void* pd = a.allocate(3 * MiB_, 0);
  check("d=3MiB", 14680064, 33554432, 6291456, 2);
  void* pe = a.allocate(2 * MiB_, 0);
  check("e=2MiB", 16777216, 33554432, 4194304, 2);
  a.free(pb);
  a.free(pd);
  a.free(pe);
  check("del b,d,e", 0, 33554432, 0, 2);
  a.empty_cache();
  check("empty_cache", 0, 0, 0, 0);
  EXPECT_EQ(a.stats().num_device_free, 2);
  void* pf = a.allocate(19 * MiB_, 0);
  check("f=19MiB", 20971520, 20971520, 0, 1);
  a.free(pf);
  a.allocate(static_cast<Bytes>(18.5 * MiB_), 0);
  check("g=18.5MiB", 19398656, 20971520, 1572864, 1);
}

// streams.json: a block freed on one stream is not reused by another.
TEST(Streams, BlocksStayOnTheirStream) {
  auto h = host_alloc();
  void* a = h.a->allocate(4 * MiB_, 0);
  h.a->free(a);
  void* b = h.a->allocate(4 * MiB_, 7);
  EXPECT_NE(a, b);
  EXPECT_EQ(cur(h.a->stats().segment), 2);
  void* c = h.a->allocate(4 * MiB_, 0);
  EXPECT_EQ(c, a);
}

// record_stream.json: after free the block is active_pending_free; allocated drops, active
// stays; a same-size alloc does not reuse it; once the event completes the next malloc does.
CACHET_BOTH_POLICIES(StreamUses);
TEST_P(StreamUses, RecordStreamKeepsTheBlockUntilTheEventCompletes) {
  auto h = alloc();
  void* x = h.a->allocate(4 * MiB_, 0);
  h.a->record_stream(x, 5);
  h.a->free(x);
  auto s = h.a->stats();
  EXPECT_EQ(cur(s.allocated_bytes), 0);
  EXPECT_EQ(cur(s.active_bytes), static_cast<std::int64_t>(4 * MiB_));
  Snapshot snap = h.a->snapshot();
  ASSERT_EQ(snap.size(), 1u);
  EXPECT_EQ(snap[0].blocks[0].state, BlockState::ActivePendingFree);
  void* y = h.a->allocate(4 * MiB_, 0);
  EXPECT_NE(y, x);
  h.a->free(y);
  h.sim->complete_events(5);
  void* z = h.a->allocate(4 * MiB_, 0);
  EXPECT_EQ(z, x);
  EXPECT_EQ(cur(h.a->stats().active_bytes), static_cast<std::int64_t>(4 * MiB_));
}

TEST_P(StreamUses, EmptyCacheSynchronizesPendingEvents) {
  auto h = alloc();
  void* x = h.a->allocate(1000, 0);
  h.a->record_stream(x, 3);
  h.a->free(x);
  h.a->empty_cache();  // synchronize_and_free_events then release
  const auto s = h.a->stats();
  EXPECT_EQ(s.num_sync_all_streams, 1);
  EXPECT_EQ(cur(s.reserved_bytes), 0);
  EXPECT_EQ(cur(s.active), 0);
}

// env.json: torch.empty(1) + empty_cache.
TEST(Stats, EmptyOneThenEmptyCache) {
  auto h = host_alloc();
  void* p = h.a->allocate(4, 0);
  h.a->free(p);
  h.a->empty_cache();
  const auto s = h.a->stats();
  EXPECT_EQ(s.allocated_bytes[0].allocated, 512);
  EXPECT_EQ(s.allocated_bytes[0].freed, 512);
  EXPECT_EQ(s.requested_bytes[0].allocated, 4);
  EXPECT_EQ(s.reserved_bytes[0].allocated, 2097152);
  EXPECT_EQ(s.inactive_split_bytes[0].peak, 2096640);
  EXPECT_EQ(s.num_device_alloc, 1);
  EXPECT_EQ(s.num_device_free, 1);
  EXPECT_EQ(s.num_sync_all_streams, 1);
  EXPECT_EQ(s.max_split_size, -1);
}

// max_split.json with max_split_size_mb:40.
TEST(Oversize, MaxSplitRules) {
  auto h = host_alloc("max_split_size_mb:40");
  auto& a = *h.a;
  EXPECT_EQ(a.stats().max_split_size, 41943040);
  void* pa = a.allocate(50 * MiB_, 0);
  EXPECT_EQ(a.stats().oversize_allocations.current, 1);
  EXPECT_EQ(a.stats().oversize_segments.current, 1);
  a.free(pa);
  void* pb = a.allocate(45 * MiB_, 0);  // reuses the 50 MiB block unsplit
  EXPECT_EQ(pb, pa);
  EXPECT_EQ(cur(a.stats().allocated_bytes), 52428800);
  a.free(pb);
  void* pc = a.allocate(30 * MiB_, 0);  // must not take the oversize block
  EXPECT_EQ(cur(a.stats().reserved_bytes), 83886080);
  a.free(pc);
  void* pd = a.allocate(static_cast<Bytes>(29.9 * MiB_), 0);
  EXPECT_EQ(pd, pc);
  EXPECT_EQ(cur(a.stats().allocated_bytes), 31457280);
  a.free(pd);
  void* pe = a.allocate(41 * MiB_, 0);
  EXPECT_EQ(pe, pa);
  a.free(pe);
  a.allocate(25 * MiB_, 0);
  EXPECT_EQ(cur(a.stats().inactive_split_bytes), 5242880);
}

TEST(Oversize, NonSplitRoundingAllowance) {
  {
    auto h = host_alloc("max_split_size_mb:40");
    h.a->free(h.a->allocate(100 * MiB_, 0));
    h.a->allocate(70 * MiB_, 0);  // 100 >= 70 + 20: new segment
    EXPECT_EQ(cur(h.a->stats().reserved_bytes), 178257920);
  }
  {
    auto h = host_alloc("max_split_size_mb:40,max_non_split_rounding_mb:40");
    h.a->free(h.a->allocate(100 * MiB_, 0));
    h.a->allocate(70 * MiB_, 0);
    EXPECT_EQ(cur(h.a->stats().reserved_bytes), 104857600);
  }
  {  // the boundary is >=: a block of exactly request + allowance is refused
    auto h = host_alloc("max_split_size_mb:40");
    h.a->free(h.a->allocate(90 * MiB_, 0));
    h.a->allocate(70 * MiB_, 0);
    EXPECT_EQ(cur(h.a->stats().segment), 2);
  }
}

// retry_paths.json: fraction 120 MiB, max_split_size_mb:40.
TEST(Retry, ReleaseAvailableCachedBlocks) {
  {
    auto h = host_alloc("max_split_size_mb:40");
    h.a->set_memory_fraction(static_cast<double>(120 * MiB_) / static_cast<double>(kH200));
    h.a->free(h.a->allocate(110 * MiB_, 0));
    h.a->allocate(60 * MiB_, 0);  // the 110 MiB block is released; not a retry
    const auto s = h.a->stats();
    EXPECT_EQ(s.num_alloc_retries, 0);
    EXPECT_EQ(cur(s.reserved_bytes), static_cast<std::int64_t>(60 * MiB_));
  }
  {
    auto h = host_alloc("max_split_size_mb:40");
    h.a->set_memory_fraction(static_cast<double>(120 * MiB_) / static_cast<double>(kH200));
    h.a->free(h.a->allocate(50 * MiB_, 0));
    h.a->allocate(100 * MiB_, 0);  // 50 released, not enough -> release_cached_blocks, retry
    const auto s = h.a->stats();
    EXPECT_EQ(s.num_alloc_retries, 1);
    EXPECT_EQ(s.num_sync_all_streams, 1);
  }
}

CACHET_BOTH_POLICIES(MemoryCap);
TEST_P(MemoryCap, CapIsInclusiveAndRetryCountedWhenCapRefuses) {
  auto h = alloc();
  h.a->set_memory_fraction(static_cast<double>(40 * MiB_) / static_cast<double>(kH200));
  h.a->allocate(20 * MiB_, 0);
  h.a->allocate(20 * MiB_, 0);  // exactly at the cap: succeeds
  EXPECT_EQ(cur(h.a->stats().reserved_bytes), static_cast<std::int64_t>(40 * MiB_));
  EXPECT_THROW(h.a->allocate(1, 0), OutOfMemory);
  const auto s = h.a->stats();
  EXPECT_EQ(s.num_alloc_retries, 1);
  EXPECT_EQ(s.num_ooms, 1);
  EXPECT_EQ(s.num_device_alloc, 2);
}

// gc.json: fraction 400 MiB, threshold 0.6: only the oldest block is freed, no sync.
TEST(GarbageCollection, OldestBlockFirst) {
  auto h = host_alloc("garbage_collection_threshold:0.6");
  auto& a = *h.a;
  a.set_memory_fraction(static_cast<double>(400 * MiB_) / static_cast<double>(kH200));
  void* pa = a.allocate(90 * MiB_, 0);
  void* pb = a.allocate(80 * MiB_, 0);
  void* pc = a.allocate(60 * MiB_, 0);
  a.free(pa);
  for (int i = 0; i < 5; ++i) a.free(a.allocate(12 * MiB_, 1));
  a.free(pb);
  a.free(pc);
  EXPECT_EQ(cur(a.stats().reserved_bytes), 253755392);
  a.allocate(100 * MiB_, 0);
  const auto s = a.stats();
  EXPECT_EQ(cur(s.reserved_bytes), 264241152);
  EXPECT_EQ(s.num_device_free, 1);
  EXPECT_EQ(s.num_sync_all_streams, 0);
}

// expandable.json, one stream then a second.
TEST(Expandable, GrowthUnmapAndPerStreamSegments) {
  auto h = host_alloc("expandable_segments:True");
  auto& a = *h.a;
  void* pa = a.allocate(1, 0);
  EXPECT_EQ(cur(a.stats().reserved_bytes), 2097152);
  void* pb = a.allocate(1 * MiB_ + 1, 0);
  EXPECT_EQ(cur(a.stats().reserved_bytes), 23068672);
  void* pc = a.allocate(30 * MiB_, 0);
  EXPECT_EQ(cur(a.stats().reserved_bytes), 44040192);
  void* pd = a.allocate(30 * MiB_, 0);
  EXPECT_EQ(cur(a.stats().reserved_bytes), 85983232);
  EXPECT_EQ(a.stats().num_device_alloc, 4);
  a.free(pc);
  a.empty_cache();  // the 30 MiB hole covers no whole 20 MiB page
  EXPECT_EQ(cur(a.stats().reserved_bytes), 85983232);
  void* pe = a.allocate(25 * MiB_, 0);
  EXPECT_EQ(pe, pc);
  EXPECT_EQ(cur(a.stats().allocated_bytes), 58721280);
  void* pf = a.allocate(5 * MiB_, 1);
  EXPECT_EQ(cur(a.stats().reserved_bytes), 106954752);
  EXPECT_EQ(cur(a.stats().segment), 0);
  for (void* p : {pa, pb, pd, pe, pf}) a.free(p);
  const auto before = a.stats().num_device_free;
  a.empty_cache();
  EXPECT_EQ(cur(a.stats().reserved_bytes), 0);
  EXPECT_EQ(a.stats().num_device_free - before, 3);
  EXPECT_TRUE(a.snapshot().empty());
}

// Expandable segments reserve address space for 1.125 x the device's total memory (§7). A device
// that reports 0 bytes (the host backend given no capacity) leaves nothing to map: the allocator
// refuses the configuration with a UsageError naming the cause and the fixes, at construction and
// at a runtime configure (which changes nothing), instead of failing a CACHET_CHECK in map_block
// on the first allocation.
TEST(Expandable, NoDeviceMemoryIsAClearError) {
  const std::string want =
      "expandable_segments:True reserves address space for 1.125 x the device's total memory, and "
      "device 0 reports 0 bytes (cudaMemGetInfo's total): nothing could be mapped. Give the device its "
      "memory (the host backend: HostOptions::capacity or total_memory) or use expandable_segments:False.";
  for (const bool by_total : {false, true}) {
    gpu::HostOptions o;
    if (by_total) o.total_memory = 0;  // capacity left as it is: the reported total decides
    else o.capacity = 0;
    Config c = parse_config("expandable_segments:True").config;
    c.validate = true;
    try {
      CachingAllocator a(gpu::make_host_memory(o), c);
      (void)a.allocate(1, 0);
      ADD_FAILURE() << "expected UsageError (by_total " << by_total << ")";
    } catch (const UsageError& e) {
      EXPECT_EQ(std::string(e.what()), want);
    }
  }
  auto h = host_alloc("", 0);
  const Config before = h.a->config();
  try {
    h.a->configure("expandable_segments:True");
    ADD_FAILURE() << "expected UsageError";
  } catch (const UsageError& e) {
    EXPECT_EQ(std::string(e.what()), want);
  }
  EXPECT_TRUE(h.a->config() == before);
  EXPECT_THROW((void)h.a->allocate(1, 0), OutOfMemory);  // no memory, as without expandable segments
}

// A host device whose reported total (1 GiB) is below what it can map (capacity 80 GiB): a 2 GiB
// request maps the whole reservation (1.125 GiB rounded up to 20 MiB pages: 58 pages) and still
// has no room. It runs out of memory, as a real device would have at cuMemCreate (the reservation
// can never end before the device's memory does there), instead of stepping past the last block.
TEST(Expandable, ARequestLargerThanTheReservationRunsOutOfMemory) {
  gpu::HostOptions o;
  o.total_memory = GiB;
  Config c = parse_config("expandable_segments:True").config;
  c.validate = true;
  CachingAllocator a(gpu::make_host_memory(o), c);
  EXPECT_THROW((void)a.allocate(2 * GiB, 0), OutOfMemory);
  void* p = a.allocate(GiB, 0);  // fits the reservation: served from the pages already mapped
  EXPECT_EQ(cur(a.stats().reserved_bytes), static_cast<std::int64_t>(58 * 20 * MiB_));
  a.free(p);
}

// §3.6 / fraction.json: fraction 0 makes even 1 byte fail, printing the segment size
// (policy:pytorch); policy:cachet names the block it could not place (the request rounded to 512).
CACHET_BOTH_POLICIES(OutOfMemoryMessage);
TEST_P(OutOfMemoryMessage, FractionZero) {
  auto h = alloc();
  h.a->set_memory_fraction(0.0);
  try {
    h.a->allocate(1, 0);
    FAIL() << "expected OutOfMemory";
  } catch (const OutOfMemory& e) {
    const std::string m = e.what();
    const std::string tried = cachet() ? "512 bytes" : "2.00 MiB";
    const std::string head = "CUDA out of memory. Tried to allocate " + tried +
                             ". GPU 0 has a total capacity of 139.80 GiB";
    EXPECT_EQ(m.rfind(head, 0), 0u) << m;
    EXPECT_NE(m.find("0 bytes allowed; "), std::string::npos) << m;
  }
  EXPECT_EQ(h.a->stats().num_ooms, 1);
}

TEST_P(OutOfMemoryMessage, OneExbibyte) {
  auto h = alloc();
  h.a->set_trace(true);
  try {
    h.a->allocate(kMaxRequest, 0);
    FAIL();
  } catch (const OutOfMemory& e) {
    EXPECT_STREQ(e.what(), "CUDA out of memory. Tried to allocate more than 1EB memory.");
  }
  EXPECT_EQ(h.a->stats(), DeviceStats{});
  EXPECT_TRUE(h.a->trace().empty());
}

// test_out_of_memory (§9.3): a huge request below 1 EiB names its size.
TEST_P(OutOfMemoryMessage, HugeRequest) {
  auto h = alloc();
  try {
    h.a->allocate(Bytes{1024} * 1024 * 1024 * 800000000ULL, 0);
    FAIL();
  } catch (const OutOfMemory& e) {
    EXPECT_EQ(std::string(e.what()).rfind("CUDA out of memory. Tried to allocate 800000000.00 GiB. GPU 0 has a total capacity of", 0), 0u)
        << e.what();
  }
  const auto s = h.a->stats();
  EXPECT_EQ(s.num_ooms, 1);
  EXPECT_EQ(s.num_alloc_retries, 1);
  EXPECT_NE(h.a->allocate(1000, 0), nullptr);  // later allocations still work
}

CACHET_BOTH_POLICIES(Api);
TEST_P(Api, SizeZeroReturnsNull) {
  auto h = alloc();
  EXPECT_EQ(h.a->allocate(0, 0), nullptr);
  h.a->free(nullptr);
  EXPECT_EQ(cur(h.a->stats().reserved_bytes), 0);
}

TEST_P(Api, FractionIsReadBack) {
  auto h = alloc();
  EXPECT_EQ(h.a->memory_fraction(), 1.0);
  h.a->set_memory_fraction(0.0);
  EXPECT_EQ(h.a->memory_fraction(), 0.0);
  EXPECT_THROW(h.a->set_memory_fraction(-0.1), UsageError);
  EXPECT_THROW(h.a->set_memory_fraction(2.0), UsageError);
}

// ------------------------------------------------------------------ bad input changes nothing

struct Misuse : BothPolicies {
  HostAlloc h;
  void* live = nullptr;
  void* freed = nullptr;
  void SetUp() override {
    h = alloc();
    live = h.a->allocate(4096, 0);
    freed = h.a->allocate(4096, 0);
    h.a->allocate(4096, 0);
    h.a->free(freed);
  }
  template <class F>
  std::string expect_usage_error(F&& f) {
    const DeviceStats before = h.a->stats();
    const Snapshot snap_before = h.a->snapshot();
    std::string msg;
    try {
      f();
      ADD_FAILURE() << "expected UsageError";
    } catch (const UsageError& e) {
      msg = e.what();
    }
    EXPECT_EQ(h.a->stats(), before);
    EXPECT_EQ(h.a->snapshot(), snap_before);
    EXPECT_TRUE(h.a->invariants().empty());
    return msg;
  }
};

INSTANTIATE_TEST_SUITE_P(Policies, Misuse, ::testing::Values(Policy::PyTorch, Policy::Cachet),
                         policy_name);

TEST_P(Misuse, UnknownPointer) {
  auto m = expect_usage_error([&] { h.a->free(reinterpret_cast<void*>(0x1234000)); });
  EXPECT_NE(m.find("unknown pointer"), std::string::npos) << m;
}
TEST_P(Misuse, InteriorPointer) {
  auto m = expect_usage_error([&] { h.a->free(static_cast<char*>(live) + 512); });
  EXPECT_NE(m.find("interior pointer"), std::string::npos) << m;
  EXPECT_NE(m.find("512 bytes into"), std::string::npos) << m;
}
TEST_P(Misuse, DoubleFree) {
  auto m = expect_usage_error([&] { h.a->free(freed); });
  EXPECT_NE(m.find("double free"), std::string::npos) << m;
}
TEST_P(Misuse, DoubleFreeWhilePendingEvents) {
  h.a->record_stream(live, 9);
  h.a->free(live);
  auto m = expect_usage_error([&] { h.a->free(live); });
  EXPECT_NE(m.find("double free"), std::string::npos) << m;
}
TEST_P(Misuse, RecordStreamOnUnknownOrInteriorPointer) {
  auto m = expect_usage_error([&] { h.a->record_stream(reinterpret_cast<void*>(0x1234000), 3); });
  EXPECT_NE(m.find("unknown pointer"), std::string::npos) << m;
  m = expect_usage_error([&] { h.a->record_stream(static_cast<char*>(live) + 1024, 3); });
  EXPECT_NE(m.find("interior pointer"), std::string::npos) << m;
}
TEST_P(Misuse, RecordStreamOnFreedBlock) {
  auto m = expect_usage_error([&] { h.a->record_stream(freed, 3); });
  EXPECT_NE(m.find("free"), std::string::npos) << m;
}
TEST_P(Misuse, StreamOfAnotherDevice) {
  h.sim->set_stream_device(77, 1);
  auto m = expect_usage_error([&] { h.a->allocate(100, 77); });
  EXPECT_NE(m.find("another device"), std::string::npos) << m;
  expect_usage_error([&] { h.a->record_stream(live, 77); });
}
TEST_P(Misuse, BadFraction) {
  auto m = expect_usage_error([&] { h.a->set_memory_fraction(1.5); });
  EXPECT_NE(m.find("Please set within [0, 1]"), std::string::npos) << m;
}

// A bad configuration string is refused and changes nothing, under either policy.
CACHET_BOTH_POLICIES(ConfigErrors);
TEST_P(ConfigErrors, BadStringsChangeNothing) {
  auto h = alloc();
  const Config before = h.a->config();
  EXPECT_THROW(h.a->configure("max_split_size_mb:2"), ConfigError);
  EXPECT_THROW(h.a->configure("roundup_power2_divisions:3"), ConfigError);
  EXPECT_THROW(h.a->configure("no_such_key:1"), ConfigError);
  EXPECT_TRUE(h.a->config() == before);
  EXPECT_EQ(h.a->config().policy, GetParam());
  EXPECT_EQ(h.a->stats().max_split_size, -1);
}

TEST(Config, RuntimeConfigureAndBadStrings) {
  auto h = host_alloc();
  EXPECT_THROW(h.a->configure("max_split_size_mb:2"), ConfigError);
  EXPECT_EQ(h.a->config().max_split_size, kNoMaxSplit);
  h.a->configure("roundup_power2_divisions:4");
  h.a->allocate(84 * MiB_, 0);
  EXPECT_EQ(cur(h.a->stats().allocated_bytes), static_cast<std::int64_t>(96 * MiB_));
  EXPECT_EQ(h.a->stats().max_split_size, -1);  // only the construction value is reported
}

TEST(Config, NoCaching) {
  gpu::HostOptions o;
  std::shared_ptr<gpu::HostSim> sim;
  Config c;
  c.no_caching = true;
  CachingAllocator a(gpu::make_host_memory(o, &sim), c);
  void* p = a.allocate(1000, 0);
  EXPECT_EQ(sim->used(), 1000u);
  a.free(p);
  EXPECT_EQ(sim->used(), 0u);
  EXPECT_EQ(a.stats(), DeviceStats{} );
}

TEST(Trace, EventsInPyTorchsOrder) {
  auto h = host_alloc();
  h.a->set_trace(true);
  void* p = h.a->allocate(1000, 0);
  h.a->free(p);
  h.a->empty_cache();
  const auto t = h.a->trace();
  ASSERT_EQ(t.size(), 5u);
  EXPECT_EQ(t[0].action, TraceAction::SegmentAlloc);
  EXPECT_EQ(t[0].size, 2097152u);
  EXPECT_EQ(t[1].action, TraceAction::Alloc);
  EXPECT_EQ(t[1].size, 1000u);
  EXPECT_EQ(t[2].action, TraceAction::FreeRequested);
  EXPECT_EQ(t[3].action, TraceAction::FreeCompleted);
  EXPECT_EQ(t[4].action, TraceAction::SegmentFree);
}

// Each event carries the TraceCallScope open on the recording thread (the c10 backend's call
// ids, python/c10/history.h), 0 outside one; == leaves the id out.
CACHET_BOTH_POLICIES(TraceCalls);
TEST_P(TraceCalls, EventsCarryTheScopeOfTheirCall) {
  auto h = alloc();
  h.a->set_trace(true);
  size_t after_alloc = 0, after_free = 0;
  {
    TraceCallScope outer(7);
    void* p = h.a->allocate(1000, 0);
    after_alloc = h.a->trace().size();
    {
      TraceCallScope inner(9);
      h.a->free(p);
    }
    after_free = h.a->trace().size();
    EXPECT_EQ(current_trace_call(), 7u);
  }
  EXPECT_EQ(current_trace_call(), 0u);
  void* q = h.a->allocate(3 * MiB, 0);
  const auto t = h.a->trace();
  ASSERT_GT(after_alloc, 0u);
  ASSERT_GT(after_free, after_alloc);
  ASSERT_GT(t.size(), after_free);
  for (size_t i = 0; i < t.size(); ++i)
    EXPECT_EQ(t[i].call, i < after_alloc ? 7u : i < after_free ? 9u : 0u) << i << ": " << to_string(t[i].action);
  TraceEvent a = t.front();
  TraceEvent b = a;
  b.call = a.call + 1;
  EXPECT_EQ(a, b);
  h.a->free(q);
}

CACHET_BOTH_POLICIES(Summary);
TEST_P(Summary, MatchesMemorySummaryOfStats) {
  auto h = alloc();
  h.a->allocate(1000, 0);
  EXPECT_EQ(h.a->summary(), memory_summary(h.a->stats()));
}

// §13.1: a split remainder is the original block object and keeps its stale requested_size; a
// merge keeps the freed block's value; fresh blocks start at 0.
TEST(Exactness, StaleRequestedSizeFollowsTheBlock) {
  auto h = host_alloc();
  void* a = h.a->allocate(1000, 0);
  Snapshot s = h.a->snapshot();
  ASSERT_EQ(s[0].blocks.size(), 2u);
  EXPECT_EQ(s[0].blocks[1].requested_size, 0u);  // the fresh segment's block
  h.a->free(a);                                    // merges with the remainder
  s = h.a->snapshot();
  ASSERT_EQ(s[0].blocks.size(), 1u);
  EXPECT_EQ(s[0].blocks[0].requested_size, 1000u);
  h.a->allocate(600, 0);
  s = h.a->snapshot();
  ASSERT_EQ(s[0].blocks.size(), 2u);
  EXPECT_EQ(s[0].blocks[0].requested_size, 600u);
  EXPECT_EQ(s[0].blocks[1].size, 2096128u);
  EXPECT_EQ(s[0].blocks[1].requested_size, 1000u);
}

// §13.2: inactive_split moves once per free by the net amount: freeing b next to a free a
// merges (-1 block) and leaves a split block (+1): no change at all to the counters' allocated
// and freed, only +1024 B net. Separate steps would count allocated +1 and freed +1.
TEST(Exactness, InactiveSplitMovesOncePerFreeByTheNet) {
  auto h = host_alloc();
  void* a = h.a->allocate(1000, 0);
  void* b = h.a->allocate(1000, 0);
  h.a->allocate(1000, 0);
  h.a->free(a);
  h.a->free(b);
  const auto s = h.a->stats();
  EXPECT_EQ(s.inactive_split[0].current, 2);
  EXPECT_EQ(s.inactive_split[0].allocated, 2);
  EXPECT_EQ(s.inactive_split[0].freed, 0);
  EXPECT_EQ(s.inactive_split_bytes[0].current, 2096128);
  EXPECT_EQ(s.inactive_split_bytes[0].allocated, 2098176);
  EXPECT_EQ(s.inactive_split_bytes[0].freed, 2048);
}

// §3.5, source-only rule: GC runs only when reserved > threshold x cap (equal does not).
TEST(GarbageCollection, ThresholdIsExclusive) {
  auto h = host_alloc("garbage_collection_threshold:0.5");
  h.a->set_memory_fraction(static_cast<double>(400 * MiB_) / static_cast<double>(kH200));
  void* a = h.a->allocate(100 * MiB_, 0);
  h.a->allocate(100 * MiB_, 0);
  h.a->free(a);
  h.a->allocate(150 * MiB_, 0);  // reserved 200 MiB == 0.5 x 400 MiB: no GC
  const auto s = h.a->stats();
  EXPECT_EQ(s.num_device_free, 0);
  EXPECT_EQ(cur(s.reserved_bytes), static_cast<std::int64_t>(350 * MiB_));
}

}  // namespace
}  // namespace cachet::test

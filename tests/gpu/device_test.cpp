// The real CUDA backends (cudaMalloc runtime, VMM for expandable segments) pass the same rules
// as the host backend: one TEST_P suite over backend factories. Skips (GTEST_SKIP) when
// cudaGetDeviceCount reports no device or no driver (errors 100 and 35); any other CUDA error
// fails. Plus a canary check (live blocks keep their contents while others are freed,
// reused and scribbled on) and empty_cache returning memory to the driver.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <random>
#include <string>

#include "cachet/errors.h"
#include "cachet/gpu/allocator.h"
#include "cachet/gpu/cuda_backend.h"
#include "cachet/gpu/host_backend.h"

extern "C" int cachet_test_fill(void* p, std::size_t bytes, std::uint32_t pattern, cudaStream_t s);
extern "C" long long cachet_test_check(const void* p, std::size_t bytes, std::uint32_t pattern, cudaStream_t s);

namespace cachet::test {
namespace {

bool have_device() { return gpu::cuda_device_count() > 0; }  // throws on unexpected errors

struct Factory {
  std::string name;
  bool needs_device;
  bool expandable;
};

std::unique_ptr<CachingAllocator> make(const Factory& f, Config c = {}) {
  c.expandable_segments = f.expandable;
  c.validate = true;
  if (!f.needs_device) {
    gpu::HostOptions o;
    o.capacity = 64 * GiB;
    return std::make_unique<CachingAllocator>(gpu::make_host_memory(o), c);
  }
  return CachingAllocator::for_cuda_device(0, c);
}

class Backends : public ::testing::TestWithParam<Factory> {
 protected:
  void SetUp() override {
    if (GetParam().needs_device && !have_device()) GTEST_SKIP() << "no CUDA device or driver";
  }
};

std::int64_t cur(const StatArray& s) { return s[0].current; }

TEST_P(Backends, RoundingTable) {
  // docs/pytorch-allocator.md §1.4; with expandable segments every pool splits at >= 512 B
  // (§2.3), so 19 MiB keeps its own size instead of the whole 20 MiB block.
  struct Row {
    Bytes request, block, block_expandable, segment;
  };
  const Row rows[] = {{1, 512, 512, 2097152},
                      {1048577, 1049088, 1049088, 20971520},
                      {10 * MiB - 1, 10485760, 10485760, 10485760},
                      {19 * MiB, 20971520, 19922944, 20971520},
                      {100 * MiB + 1, 104858112, 104858112, 106954752}};
  for (const auto& r : rows) {
    auto a = make(GetParam());
    void* p = a->allocate(r.request, 0);
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % 512, 0u);
    const Bytes block = GetParam().expandable ? r.block_expandable : r.block;
    EXPECT_EQ(cur(a->stats().allocated_bytes), static_cast<std::int64_t>(block));
    if (!GetParam().expandable) {
      EXPECT_EQ(cur(a->stats().reserved_bytes), static_cast<std::int64_t>(r.segment));
    }
    a->free(p);
    a->empty_cache();
    EXPECT_EQ(cur(a->stats().reserved_bytes), 0);
  }
}

TEST_P(Backends, SmallPackAndMerge) {
  auto a = make(GetParam());
  std::vector<void*> p;
  for (int i = 0; i < 5; ++i) p.push_back(a->allocate(512 * KiB, 0));
  if (!GetParam().expandable) {
    EXPECT_EQ(cur(a->stats().segment), 2);
  }
  a->free(p[0]);
  a->free(p[1]);
  EXPECT_EQ(a->allocate(716800, 0), p[0]);
}

TEST_P(Backends, RecordStreamWaitsForTheStream) {
  if (!GetParam().needs_device) GTEST_SKIP() << "real streams only";
  cudaStream_t side = nullptr;
  ASSERT_EQ(cudaStreamCreate(&side), cudaSuccess);
  auto a = make(GetParam());
  void* x = a->allocate(4 * MiB, 0);
  ASSERT_EQ(cachet_test_fill(x, 4 * MiB, 1, side), 0);
  a->record_stream(x, reinterpret_cast<StreamId>(side));
  a->free(x);
  ASSERT_EQ(cudaStreamSynchronize(side), cudaSuccess);
  EXPECT_EQ(a->allocate(4 * MiB, 0), x);  // the event completed: the block is reused
  cudaStreamDestroy(side);
}

TEST_P(Backends, CanaryLiveBlocksKeepTheirContents) {
  auto a = make(GetParam());
  std::mt19937_64 rng(7);
  struct Live {
    void* p;
    Bytes size;
    std::uint32_t pattern;
  };
  std::vector<Live> live;
  std::uint32_t id = 0;
  const bool device = GetParam().needs_device;
  for (int step = 0; step < 300; ++step) {
    if (live.empty() || rng() % 3 != 0) {
      const Bytes size = (rng() % 4 == 0) ? 1 + rng() % (24 * MiB) : 1 + rng() % (512 * KiB);
      void* p = a->allocate(size, 0);
      live.push_back({p, size, 0x9e3779b9u * ++id});
      if (device) {
        ASSERT_EQ(cachet_test_fill(p, size, live.back().pattern, nullptr), 0);
      }
    } else {
      const std::size_t j = rng() % live.size();
      a->free(live[j].p);
      // Scribble over the freed block: it must not reach any live one.
      if (device) {
        ASSERT_EQ(cachet_test_fill(live[j].p, live[j].size, 0xdeadbeefu, nullptr), 0);
      }
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(j));
      if (rng() % 20 == 0) a->empty_cache();
    }
    if (device) {
      for (const auto& l : live) {
        ASSERT_EQ(cachet_test_check(l.p, l.size, l.pattern, nullptr), 0) << "step " << step;
      }
    }
  }
  EXPECT_TRUE(a->invariants().empty());
}

TEST_P(Backends, EmptyCacheGivesMemoryBackToTheDriver) {
  if (!GetParam().needs_device) GTEST_SKIP() << "driver figures only";
  auto a = make(GetParam());
  std::vector<void*> p;
  for (int i = 0; i < 4; ++i) p.push_back(a->allocate(256 * MiB, 0));
  for (void* q : p) a->free(q);
  const auto reserved = static_cast<Bytes>(cur(a->stats().reserved_bytes));
  std::size_t free_before = 0, free_after = 0, total = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_before, &total), cudaSuccess);
  a->empty_cache();
  ASSERT_EQ(cudaMemGetInfo(&free_after, &total), cudaSuccess);
  EXPECT_EQ(cur(a->stats().reserved_bytes), 0);
  const auto rise = static_cast<std::int64_t>(free_after) - static_cast<std::int64_t>(free_before);
  EXPECT_NEAR(static_cast<double>(rise), static_cast<double>(reserved), 4.0 * MiB);
}

TEST_P(Backends, OutOfMemoryIsCleanAndRecoverable) {
  auto a = make(GetParam());
  a->set_memory_fraction(static_cast<double>(64 * MiB) / static_cast<double>(a->total_memory()));
  void* p = a->allocate(40 * MiB, 0);
  EXPECT_THROW(a->allocate(40 * MiB, 0), OutOfMemory);
  a->free(p);
  EXPECT_NE(a->allocate(40 * MiB, 0), nullptr);
  EXPECT_TRUE(a->invariants().empty());
}


// large_split.json (cudaMalloc backends): allocated / reserved / inactive_split_bytes.
TEST_P(Backends, LargeSplitSequence) {
  if (GetParam().expandable) GTEST_SKIP() << "cudaMalloc segments only";
  auto a = make(GetParam());
  auto check = [&](const char* step, std::int64_t alloc, std::int64_t res, std::int64_t isb) {
    const auto s = a->stats();
    EXPECT_EQ(cur(s.allocated_bytes), alloc) << step;
    EXPECT_EQ(cur(s.reserved_bytes), res) << step;
    EXPECT_EQ(cur(s.inactive_split_bytes), isb) << step;
  };
  void* pa = a->allocate(9 * MiB, 0);
  void* pb = a->allocate(10 * MiB + 512 * KiB, 0);
  void* pc = a->allocate(static_cast<Bytes>(10.6 * MiB), 0);
  check("a,b,c", 32086528, 33554432, 1467904);
  a->free(pa);
  a->free(pc);
  check("del a, c", 11534336, 33554432, 9437184);
  void* pd = a->allocate(3 * MiB, 0);
  void* pe = a->allocate(2 * MiB, 0);
  check("d, e", 16777216, 33554432, 4194304);
  for (void* p : {pb, pd, pe}) a->free(p);
  a->empty_cache();
  check("empty_cache", 0, 0, 0);
}

// expandable.json (VMM backends): growth by 20 MiB pages, no unmap of a partial page,
// lowest-address reuse, one segment per stream, all unmapped by empty_cache.
TEST_P(Backends, ExpandableGrowth) {
  if (!GetParam().expandable) GTEST_SKIP() << "expandable segments only";
  auto a = make(GetParam());
  void* pa = a->allocate(1, 0);
  void* pb = a->allocate(1 * MiB + 1, 0);
  void* pc = a->allocate(30 * MiB, 0);
  void* pd = a->allocate(30 * MiB, 0);
  EXPECT_EQ(cur(a->stats().reserved_bytes), 85983232);
  a->free(pc);
  a->empty_cache();
  EXPECT_EQ(cur(a->stats().reserved_bytes), 85983232);
  void* pe = a->allocate(25 * MiB, 0);
  EXPECT_EQ(pe, pc);
  for (void* p : {pa, pb, pd, pe}) a->free(p);
  a->empty_cache();
  EXPECT_EQ(cur(a->stats().reserved_bytes), 0);
  EXPECT_TRUE(a->snapshot().empty());
}

INSTANTIATE_TEST_SUITE_P(All, Backends,
                         ::testing::Values(Factory{"host", false, false}, Factory{"host_expandable", false, true},
                                           Factory{"cuda_runtime", true, false}, Factory{"cuda_vmm", true, true}),
                         [](const auto& info) { return info.param.name; });

// policy:cachet on the CUDA VMM backend (gpu/include/cachet/gpu/policy_cachet.h): pages are
// unmapped from one place and mapped at another while the program runs (R4, R6, R7), so the
// canary is the check that matters: every live block keeps its contents while pages move under
// a memory cap, blocks are freed, scribbled on, reused by two streams and given back by
// empty_cache. The host variant runs the same sequence without the kernels (CI).
void cachet_policy_canary(bool device) {
  Config c;
  c.policy = Policy::Cachet;
  c.validate = true;
  std::unique_ptr<CachingAllocator> a;
  if (device) {
    a = CachingAllocator::for_cuda_device(0, c);
  } else {
    gpu::HostOptions o;
    o.capacity = 64 * GiB;
    a = std::make_unique<CachingAllocator>(gpu::make_host_memory(o), c);
  }
  // A cap of 160 MiB above what is in use when the test starts: page moves are forced.
  std::size_t free_b = 0, total_b = 64 * GiB;
  if (device) ASSERT_EQ(cudaMemGetInfo(&free_b, &total_b), cudaSuccess);
  const double total = static_cast<double>(total_b);
  a->set_memory_fraction((160.0 * MiB) / total);
  cudaStream_t side = nullptr;
  if (device) ASSERT_EQ(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking), cudaSuccess);
  const StreamId streams[2] = {0, reinterpret_cast<StreamId>(side)};
  std::mt19937_64 rng(11);
  struct Live {
    void* p;
    Bytes size;
    std::uint32_t pattern;
    int stream;
  };
  std::vector<Live> live;
  std::uint32_t id = 0;
  int ooms = 0;
  for (int step = 0; step < 400; ++step) {
    if (live.empty() || rng() % 5 < 3) {
      const Bytes size = (rng() % 3 == 0) ? 1 + rng() % (20 * MiB) : 1 + rng() % (1536 * KiB);
      const int si = device ? static_cast<int>(rng() % 2) : 0;
      void* p = nullptr;
      try {
        p = a->allocate(size, streams[si]);
      } catch (const OutOfMemory&) {
        ++ooms;
        continue;
      }
      live.push_back({p, size, 0x9e3779b9u * ++id, si});
      if (device) ASSERT_EQ(cachet_test_fill(p, size, live.back().pattern, reinterpret_cast<cudaStream_t>(streams[si])), 0);
    } else {
      const std::size_t j = rng() % live.size();
      if (device) ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      a->free(live[j].p);
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(j));
      if (rng() % 25 == 0) a->empty_cache();
    }
    if (device) {
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      for (const auto& l : live) ASSERT_EQ(cachet_test_check(l.p, l.size, l.pattern, nullptr), 0) << "step " << step;
    }
  }
  const DeviceStats st = a->stats();
  EXPECT_GT(st.num_device_free, 10) << "pages were expected to move under the cap";
  EXPECT_LE(st.reserved_bytes[0].peak, static_cast<std::int64_t>(160 * MiB));
  EXPECT_TRUE(a->invariants().empty());
  for (const auto& l : live) a->free(l.p);
  a->empty_cache();
  EXPECT_EQ(cur(a->stats().reserved_bytes), 0);
  std::printf("cachet policy canary (%s): %lld maps, %lld unmaps, %d OOMs under the cap, peak reserved %lld\n",
              device ? "cuda_vmm" : "host", static_cast<long long>(st.num_device_alloc),
              static_cast<long long>(st.num_device_free), ooms, static_cast<long long>(st.reserved_bytes[0].peak));
  if (side) cudaStreamDestroy(side);
}

TEST(CachetPolicy, CanaryOnTheHostBackend) { cachet_policy_canary(false); }

TEST(CachetPolicy, CanaryOnCudaVmm) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device or driver";
  cachet_policy_canary(true);
}

TEST(DeviceCount, NoDeviceIsNotAnError) {
  EXPECT_GE(gpu::cuda_device_count(), 0);
}

}  // namespace
}  // namespace cachet::test

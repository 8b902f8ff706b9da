// Release/retry, garbage collection, the memory fraction and OOM (docs/pytorch-allocator.md §3).
// Values: probes P8 (retry_paths.json), P9 (gc.json), P11 (oom_msg.json, fraction.json),
// PyTorch's tests §9.3-9.6. § numbers refer to docs/pytorch-allocator.md.
#include "cachet/errors.h"
#include "harness.h"

namespace cachet::model::test {
namespace {

// A device whose driver answers with the probe run's figures (cudaMemGetInfo free bytes, NVML's
// per-process figure), so that OOM messages can be compared whole.
class ProbeDriver final : public SegmentSource {
 public:
  Bytes free_bytes = 0;
  Bytes process_bytes = 0;
  std::optional<std::uint64_t> allocate(Bytes size) override { return inner_.allocate(size); }
  void free(std::uint64_t a, Bytes s) override { inner_.free(a, s); }
  std::uint64_t reserve(Bytes s) override { return inner_.reserve(s); }
  void release_reservation(std::uint64_t a, Bytes s) override { inner_.release_reservation(a, s); }
  bool map(std::uint64_t a, Bytes s) override { return inner_.map(a, s); }
  void unmap(std::uint64_t a, Bytes s) override { inner_.unmap(a, s); }
  Bytes total_memory() const override { return kH200Total; }
  Bytes free_memory() const override { return free_bytes; }
  std::optional<Bytes> process_in_use() const override { return process_bytes; }

 private:
  SyntheticSegmentSource inner_{kH200Total - 600 * MiB, kH200Total};
};

const std::string kTail =
    " If reserved but unallocated memory is large try setting "
    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation "
    "for Memory Management  "
    "(https://docs.pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-"
    "cuda-alloc-conf)";

std::string oom_text(Allocator& a, Bytes n, StreamId s = 0) {
  try {
    a.malloc(n, s);
  } catch (const OutOfMemory& e) {
    return e.what();
  }
  return "(no OOM)";
}

TEST(Release, RetryPathsP8) {
  // Phase 1, no max_split: a cached 50 MiB block and a 100 MiB request under a 120 MiB cap.
  Device d;
  d.warm_up();
  d.alloc.set_memory_fraction(120.0 * MiB / kH200Total);
  d.free(d.malloc(50 * MiB));
  EXPECT_PROBE(d.alloc, 0, 52428800, 0, 0, 0, 1, 0, 0, 0, 1, 2, 1, 0, 0);
  d.malloc(100 * MiB);  // release_cached_blocks + retry
  EXPECT_PROBE(d.alloc, 104857600, 104857600, 104857600, 0, 0, 1, 104857600, 1, 0, 2, 3, 2, 0, 0);
}

TEST(Release, RetryPathsWithMaxSplitP8) {
  // Phase 2 (max_split_size_mb:40). The probe's counters include phase 1: retries +1, syncs +2,
  // device allocs +2, device frees +2 against a fresh allocator.
  Device d(conf("max_split_size_mb:40"));
  d.warm_up();
  d.alloc.set_memory_fraction(120.0 * MiB / kH200Total);
  d.free(d.malloc(50 * MiB));
  EXPECT_PROBE(d.alloc, 0, 52428800, 0, 0, 0, 1, 0, 1 - 1, 0, 3 - 2, 4 - 2, 3 - 2, 0, 1);
  auto b = d.malloc(100 * MiB);  // 50 released by release_available but 50 < 100: then the retry
  EXPECT_PROBE(d.alloc, 104857600, 104857600, 104857600, 0, 0, 1, 104857600, 2 - 1, 0, 4 - 2,
               5 - 2, 4 - 2, 1, 1);
  d.free(b);
  d.alloc.empty_cache();
  const auto a = d.malloc(30 * MiB);
  const auto x = d.malloc(5 * MiB);
  const auto y = d.malloc(5 * MiB);
  d.free(a);
  d.free(x);
  EXPECT_PROBE(d.alloc, 5242880, 52428800, 5242880, 15728640, 2, 2, 5242880, 2 - 1, 0, 5 - 2,
               7 - 2, 5 - 2, 0, 0);
  ASSERT_EQ(d.alloc.snapshot().size(), 2u);
  const std::string msg = oom_text(d.alloc, 110 * MiB);
  EXPECT_NE(msg.find("Tried to allocate 110.00 MiB."), std::string::npos) << msg;
  EXPECT_NE(msg.find("120.00 MiB allowed; Of the allocated memory 5.00 MiB is allocated by "
                     "PyTorch, and 15.00 MiB is reserved by PyTorch but unallocated."),
            std::string::npos)
      << msg;
  EXPECT_PROBE(d.alloc, 5242880, 20971520, 5242880, 15728640, 2, 1, 5242880, 3 - 1, 1, 6 - 2,
               7 - 2, 6 - 2, 0, 0);
  d.free(y);
  d.alloc.empty_cache();
  d.free(d.malloc(110 * MiB));
  EXPECT_PROBE(d.alloc, 0, 115343360, 0, 0, 0, 1, 0, 3 - 1, 1, 7 - 2, 8 - 2, 7 - 2, 0, 1);
  d.malloc(60 * MiB);  // 110 >= 60 + 20; release_available frees it: no retry counted
  EXPECT_PROBE(d.alloc, 62914560, 62914560, 62914560, 0, 0, 1, 62914560, 3 - 1, 1, 7 - 2, 9 - 2,
               8 - 2, 1, 1);
}

TEST(Release, GarbageCollectionByAgeP9) {
  constexpr StreamId s1 = 1140206496;
  Device d(conf("garbage_collection_threshold:0.6"));
  d.warm_up();
  d.alloc.set_memory_fraction(400.0 * MiB / kH200Total);
  const auto a = d.malloc(90 * MiB);
  const auto b = d.malloc(80 * MiB);
  const auto c = d.malloc(60 * MiB);
  EXPECT_PROBE(d.alloc, 241172480, 241172480, 241172480, 0, 0, 3, 241172480, 0, 0, 1, 4, 1, 0, 0);
  d.free(a);
  for (int i = 0; i < 5; ++i) d.free(d.malloc(12 * MiB, s1));  // ages a by 5 searches
  EXPECT_PROBE(d.alloc, 146800640, 253755392, 146800640, 0, 0, 4, 146800640, 0, 0, 1, 5, 1, 0, 0);
  d.free(b);
  d.free(c);
  d.malloc(100 * MiB);  // 242 MiB > 240 MiB: only a (the oldest) is released, no sync
  EXPECT_PROBE(d.alloc, 104857600, 264241152, 104857600, 0, 0, 4, 104857600, 0, 0, 1, 6, 2, 0, 0);
  std::vector<Bytes> sizes;
  for (const auto& s : d.alloc.snapshot()) sizes.push_back(s.total_size);
  EXPECT_EQ(sizes, (std::vector<Bytes>{80 * MiB, 60 * MiB, 12 * MiB, 100 * MiB}));
}

TEST(Release, GarbageCollectionNeedsACap) {
  // §3.5 / issue #106660: without a fraction the threshold does nothing, and the age clock
  // does not tick.
  Device d(conf("garbage_collection_threshold:0.6"));
  d.free(d.malloc(90 * MiB));
  for (int i = 0; i < 5; ++i) d.free(d.malloc(12 * MiB, 7));
  d.malloc(100 * MiB);
  EXPECT_EQ(d.alloc.stats().num_device_free, 0);
}

// §13.7's source-only rule: GC returns when total <= threshold. At equality `<` would run it with
// a target of 0 bytes, which frees nothing either: the boundary is not observable, and this test
// pins the observable behaviour (nothing released, the request served under the cap).
TEST(Release, GarbageCollectionAtTheThresholdFreesNothing) {
  Device d(conf("garbage_collection_threshold:0.5"));
  d.alloc.set_memory_fraction(400.0 * MiB / kH200Total);
  ASSERT_EQ(*d.alloc.allowed_memory_maximum(), 400 * MiB);
  const auto a = d.malloc(100 * MiB);
  d.malloc(100 * MiB);
  d.free(a);  // total 200 MiB == threshold: no collection
  d.malloc(150 * MiB);
  EXPECT_EQ(d.alloc.stats().num_device_free, 0);
  EXPECT_EQ(d.alloc.stats().reserved_bytes[0].current, static_cast<std::int64_t>(350 * MiB));
}

// §13.7's source-only rule: a block that re-enters the pool (here after a split and a merge)
// starts a new age, so GC takes the block that has waited longer.
TEST(Release, GarbageCollectionAgeRestartsOnReentry) {
  Device d(conf("garbage_collection_threshold:0.5"));
  d.alloc.set_memory_fraction(400.0 * MiB / kH200Total);
  d.free(d.malloc(12 * MiB, 7));      // search 1
  const auto a = d.malloc(110 * MiB);  // search 2; total 12 MiB: no collection
  const auto b = d.malloc(110 * MiB);  // search 3; total 122 MiB <= 200: no collection
  d.free(b);                           // b enters the pool at 3
  d.free(a);                           // a enters the pool at 3
  for (int i = 0; i < 2; ++i) d.free(d.malloc(12 * MiB, 7));  // searches 4, 5
  const auto y = d.malloc(60 * MiB);  // search 6: splits a (lowest address of the equal sizes)
  EXPECT_EQ(y, a);
  d.free(y);  // a is whole again and re-enters the pool at 6
  // Search 7 misses; 232 MiB > 200: ages a 1, b 4, the 12 MiB block 2; average 2.33: only b.
  d.malloc(130 * MiB);
  EXPECT_EQ(d.alloc.stats().num_device_free, 1);
  bool a_kept = false;
  for (const auto& s : d.alloc.snapshot()) a_kept |= s.address == a;
  EXPECT_TRUE(a_kept);
}

TEST(Release, ReleaseAvailableSearchesFromMaxSplit) {
  // A normal request (30 MiB < max_split 40) under the cap releases the single oversize block
  // found at max(request, max_split): the 45 MiB one, and no retry is counted.
  Device d(conf("max_split_size_mb:40"));
  d.alloc.set_memory_fraction(70.0 * MiB / kH200Total);
  d.free(d.malloc(45 * MiB));
  d.malloc(30 * MiB);
  EXPECT_EQ(d.alloc.stats().num_alloc_retries, 0);
  EXPECT_EQ(d.alloc.stats().num_device_free, 1);
  EXPECT_EQ(d.alloc.stats().reserved_bytes[0].current, static_cast<std::int64_t>(30 * MiB));
}

TEST(Release, CapIsInclusiveAndTruncated) {
  // §13.4: fraction = cap / total in double, allowed = trunc(fraction * total) == cap.
  Device d;
  d.alloc.set_memory_fraction(6442450944.0 / static_cast<double>(kH200Total));
  ASSERT_EQ(*d.alloc.allowed_memory_maximum(), 6442450944u);
  const auto p = d.malloc(6442450944);
  EXPECT_NE(p, 0u);
  d.free(p);
  d.alloc.empty_cache();
  EXPECT_NE(oom_text(d.alloc, 6442450944 + 1), "(no OOM)");
}

TEST(Release, FractionZeroMessageP11) {
  ProbeDriver drv;
  drv.free_bytes = 149557477376;  // "139.29 GiB is free"
  drv.process_bytes = 518 * MiB;
  Allocator a(Config{}, drv);
  a.set_memory_fraction(0.0);
  EXPECT_EQ(oom_text(a, 1),
            "CUDA out of memory. Tried to allocate 2.00 MiB. GPU 0 has a total capacity of 139.80 "
            "GiB of which 139.29 GiB is free. Including non-PyTorch memory, this process has "
            "518.00 MiB memory in use. 0 bytes allowed; Of the allocated memory 0 bytes is "
            "allocated by PyTorch, and 0 bytes is reserved by PyTorch but unallocated." + kTail);
  // The trace row: device free bytes as the address, the rounded request as the size.
  ASSERT_FALSE(a.trace().empty());
  EXPECT_EQ(a.trace().back(), (TraceEvent{TraceAction::Oom, 149557477376, 512, 0, 0}));
  EXPECT_EQ(a.stats().num_ooms, 1);
  EXPECT_EQ(a.stats().num_alloc_retries, 1);
}

TEST(Release, OomMessagesP11) {
  ProbeDriver drv;
  drv.free_bytes = 149557477376;
  drv.process_bytes = 518 * MiB;
  Allocator a(Config{}, drv);
  a.free(a.malloc(4));
  a.empty_cache();
  // Larger than the device, smaller than 1 EiB: the normal path, "Tried to allocate" the
  // segment size.
  EXPECT_EQ(oom_text(a, 1024ull * 1024 * 1024 * 800000000),
            "CUDA out of memory. Tried to allocate 800000000.00 GiB. GPU 0 has a total capacity of "
            "139.80 GiB of which 139.29 GiB is free. Including non-PyTorch memory, this process "
            "has 518.00 MiB memory in use. Of the allocated memory 0 bytes is allocated by "
            "PyTorch, and 0 bytes is reserved by PyTorch but unallocated." + kTail);
  EXPECT_EQ(oom_text(a, 1024ull * 1024 * 1024 * 8000000000),
            "CUDA out of memory. Tried to allocate more than 1EB memory.");
  a.malloc(30 * MiB);
  std::vector<std::uint64_t> frag;
  for (int i = 0; i < 6; ++i) frag.push_back(a.malloc(3 * MiB));
  for (int i = 0; i < 6; i += 2) a.free(frag[static_cast<std::size_t>(i)]);
  a.set_memory_fraction(static_cast<double>(a.stats().reserved_bytes[0].current + 50 * MiB) /
                        static_cast<double>(kH200Total));
  drv.free_bytes = 149505048576;  // "139.24 GiB is free"
  drv.process_bytes = 568 * MiB;
  EXPECT_EQ(oom_text(a, 100 * MiB),
            "CUDA out of memory. Tried to allocate 100.00 MiB. GPU 0 has a total capacity of "
            "139.80 GiB of which 139.24 GiB is free. Including non-PyTorch memory, this process "
            "has 568.00 MiB memory in use. 100.00 MiB allowed; Of the allocated memory 39.00 MiB "
            "is allocated by PyTorch, and 11.00 MiB is reserved by PyTorch but unallocated." +
                kTail);
  // stats_after
  EXPECT_PROBE(a, 40894464, 52428800, 40894464, 11534336, 4, 2, 40894464, 2, 2, 3, 3, 1, 0, 0);
  EXPECT_EQ(a.trace().back(), (TraceEvent{TraceAction::Oom, 149505048576, 104857600, 0, 0}));
}

// §9.4 test_out_of_memory_retry.
TEST(Release, OutOfMemoryThenRetryAfterFree) {
  Device d(Config{}, kH200Total);
  const auto a = d.malloc(kH200Total / 2);
  EXPECT_NE(oom_text(d.alloc, kH200Total / 2), "(no OOM)");
  d.free(a);
  EXPECT_NE(d.malloc(kH200Total / 2), 0u);
}

// §9.5 test_set_per_process_memory_fraction and §9.6 get.
TEST(Release, SetPerProcessMemoryFraction) {
  Device d;
  EXPECT_THROW(d.alloc.set_memory_fraction(-0.1), UsageError);
  EXPECT_THROW(d.alloc.set_memory_fraction(2.0), UsageError);
  for (double f : {1.0, 0.0, 0.5}) {
    d.alloc.set_memory_fraction(f);
    EXPECT_EQ(d.alloc.memory_fraction(), f);
  }
  const auto ok = static_cast<Bytes>(static_cast<double>(kH200Total) * 0.499) -
                  static_cast<Bytes>(d.alloc.stats().reserved_bytes[0].peak);
  d.free(d.malloc(ok));
  d.alloc.empty_cache();
  EXPECT_NE(oom_text(d.alloc, static_cast<Bytes>(static_cast<double>(kH200Total) * 0.5)), "(no OOM)");
}

TEST(Release, FractionFromTheConfigAppliesAtConstruction) {
  Device d(conf("per_process_memory_fraction:0.5"));
  ASSERT_TRUE(d.alloc.allowed_memory_maximum().has_value());
  EXPECT_EQ(*d.alloc.allowed_memory_maximum(), kH200Total / 2);
}

TEST(Release, EmptyCacheReleasesLargeBeforeSmall) {
  Device d;
  const auto s = d.malloc(1000);
  const auto l = d.malloc(4 * MiB);
  d.free(s);
  d.free(l);
  d.alloc.empty_cache();
  const auto& t = d.alloc.trace();
  ASSERT_GE(t.size(), 2u);
  EXPECT_EQ(t[t.size() - 2], (TraceEvent{TraceAction::SegmentFree, l, 20 * MiB, 0, 0}));
  EXPECT_EQ(t[t.size() - 1], (TraceEvent{TraceAction::SegmentFree, s, 2 * MiB, 0, 0}));
  EXPECT_EQ(d.alloc.stats().num_sync_all_streams, 1);
}

// §9.2 test_memory_stats.
TEST(Release, MemoryStatsAfterFreeAndEmptyCache) {
  Device d;
  d.alloc.reset_accumulated_stats();
  const auto p = d.malloc(1024);  // torch.randn(256)
  EXPECT_EQ(d.alloc.stats().active_bytes[0].current, 1024);
  EXPECT_EQ(d.alloc.stats().active_bytes[0].freed, 0);
  d.free(p);
  d.alloc.empty_cache();
  EXPECT_EQ(d.alloc.stats().active_bytes[0].current, 0);
  EXPECT_EQ(d.alloc.stats().active_bytes[0].freed, 1024);
  d.alloc.reset_peak_stats();
  EXPECT_EQ(d.alloc.stats().allocated_bytes[0].peak, 0);
  EXPECT_EQ(d.alloc.stats().reserved_bytes[0].peak, 0);
}

}  // namespace
}  // namespace cachet::model::test

// Expandable segments (docs/pytorch-allocator.md §7). Values: probe P10 (expandable.json,
// snapshot_exp.json). § numbers refer to docs/pytorch-allocator.md.
#include "cachet/errors.h"
#include "cachet/model/sizes.h"
#include "harness.h"

namespace cachet::model::test {
namespace {

TEST(Expandable, GrowthHoleAndPerStreamSegmentsP10) {
  Device d(conf("expandable_segments:True"));
  d.warm_up();
  EXPECT_PROBE(d.alloc, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 0, 0);
  d.malloc(1);
  EXPECT_PROBE(d.alloc, 512, 2097152, 512, 0, 0, 0, 1, 0, 0, 1, 2, 1, 0, 0);
  d.malloc(1048577);
  EXPECT_PROBE(d.alloc, 1049600, 23068672, 1049600, 0, 0, 0, 1048578, 0, 0, 1, 3, 1, 0, 0);
  const auto c = d.malloc(30 * MiB);
  EXPECT_PROBE(d.alloc, 32506880, 44040192, 32506880, 0, 0, 0, 32505858, 0, 0, 1, 4, 1, 0, 0);
  // The large segment is the second in address order (synthetic reservations: small first).
  EXPECT_EQ(d.blocks(1), (Blocks{{1049088, 1048577, A}, {31457280, 31457280, A}, {9436672, 0, I}}));
  d.malloc(30 * MiB);  // one map_block of 40 MiB
  EXPECT_PROBE(d.alloc, 63964160, 85983232, 63964160, 0, 0, 0, 63963138, 0, 0, 1, 5, 1, 0, 0);
  EXPECT_EQ(d.blocks(1), (Blocks{{1049088, 1048577, A}, {31457280, 31457280, A},
                                 {31457280, 31457280, A}, {19922432, 0, I}}));
  d.free(c);
  d.alloc.empty_cache();  // the 30 MiB hole holds no whole 20 MiB page: nothing unmapped
  EXPECT_PROBE(d.alloc, 32506880, 85983232, 32506880, 0, 0, 0, 32505858, 0, 0, 2, 5, 1, 0, 0);
  const auto e = d.malloc(25 * MiB);  // fills the hole, lowest address
  EXPECT_EQ(e, c);
  EXPECT_EQ(d.blocks(1), (Blocks{{1049088, 1048577, A}, {26214400, 26214400, A},
                                 {5242880, 31457280, I}, {31457280, 31457280, A},
                                 {19922432, 0, I}}));
  EXPECT_EQ(d.alloc.stats().allocated_bytes[0].current, 58721280);
  d.malloc(5 * MiB, 724781040);  // another stream: its own segment
  EXPECT_PROBE(d.alloc, 63964160, 106954752, 63964160, 0, 0, 0, 63963138, 0, 0, 2, 6, 1, 0, 0);
  const Snapshot s = d.alloc.snapshot();
  ASSERT_EQ(s.size(), 3u);
  EXPECT_TRUE(s[0].is_expandable && s[1].is_expandable && s[2].is_expandable);
  EXPECT_EQ(s[2].stream, 724781040u);
  EXPECT_EQ(d.blocks(2), (Blocks{{5242880, 5242880, A}, {15728640, 0, I}}));
}

TEST(Expandable, EmptyCacheUnmapsEveryFreeRunP10) {
  Device d(conf("expandable_segments:True"));
  std::vector<std::uint64_t> ps = {d.malloc(3 * MiB), d.malloc(30 * MiB), d.malloc(1000)};
  for (auto p : ps) d.free(p);
  d.alloc.empty_cache();
  // snapshot_exp.json: map 20 MiB, map 20 MiB, map 2 MiB ... unmap 40 MiB, unmap 2 MiB.
  std::vector<std::pair<TraceAction, Bytes>> dev;
  for (const auto& t : d.alloc.trace())
    if (t.action == TraceAction::SegmentMap || t.action == TraceAction::SegmentUnmap)
      dev.emplace_back(t.action, t.size);
  EXPECT_EQ(dev, (std::vector<std::pair<TraceAction, Bytes>>{{TraceAction::SegmentMap, 20 * MiB},
                                                             {TraceAction::SegmentMap, 20 * MiB},
                                                             {TraceAction::SegmentMap, 2 * MiB},
                                                             {TraceAction::SegmentUnmap, 40 * MiB},
                                                             {TraceAction::SegmentUnmap, 2 * MiB}}));
  EXPECT_EQ(d.alloc.stats().reserved_bytes[0].current, 0);
  EXPECT_TRUE(d.alloc.snapshot().empty());
  EXPECT_EQ(d.alloc.stats().segment[0].allocated, 0);  // segments never count expandable ones
}

TEST(Expandable, ReservationIsOneEighthMoreThanTheDevice) {
  // ceil((total + total / 8) / page) pages.
  EXPECT_EQ(expandable_page_count(kH200Total, 2 * MiB), 80526u);
  EXPECT_EQ(expandable_page_count(kH200Total, 20 * MiB), 8053u);
}

TEST(Expandable, MapFailureIsAnOom) {
  Device d(conf("expandable_segments:True"), 100 * MiB);
  d.malloc(60 * MiB);  // maps 60 MiB
  EXPECT_THROW(d.malloc(60 * MiB), OutOfMemory);
  EXPECT_EQ(d.alloc.stats().num_ooms, 1);
  EXPECT_EQ(d.alloc.stats().reserved_bytes[0].current, static_cast<std::int64_t>(60 * MiB));
}

}  // namespace
}  // namespace cachet::model::test

namespace cachet::model::test {
namespace {

// §9.17 test_max_split_expandable: 120 MiB budget, max_split_size_mb:40; 40 MiB allocations with
// expandable segments off, on, off; a fourth OOMs; after freeing, 120 MiB fits.
TEST(Expandable, MaxSplitWithExpandableToggledAtRuntime) {
  Device d(conf("max_split_size_mb:40"));
  d.alloc.set_memory_fraction(120.0 * MiB / kH200Total);
  const auto a = d.malloc(40 * MiB);
  d.alloc.set_allocator_settings(conf("max_split_size_mb:40,expandable_segments:True"));
  const auto b = d.malloc(40 * MiB);
  d.alloc.set_allocator_settings(conf("max_split_size_mb:40,expandable_segments:False"));
  const auto c = d.malloc(40 * MiB);
  EXPECT_THROW(d.malloc(40 * MiB), OutOfMemory);
  d.free(a);
  d.free(b);
  d.free(c);
  EXPECT_NO_THROW(d.malloc(120 * MiB));
  EXPECT_EQ(d.alloc.stats().reserved_bytes[0].current, static_cast<std::int64_t>(120 * MiB));
}

// §9.18 test_garbage_collect_expandable: same budget, garbage_collection_threshold:0.5.
TEST(Expandable, GarbageCollectionWithExpandableToggledAtRuntime) {
  Device d(conf("garbage_collection_threshold:0.5"));
  d.alloc.set_memory_fraction(120.0 * MiB / kH200Total);
  const auto a = d.malloc(40 * MiB);
  d.alloc.set_allocator_settings(conf("garbage_collection_threshold:0.5,expandable_segments:True"));
  const auto b = d.malloc(40 * MiB);
  d.free(a);
  d.free(b);
  EXPECT_NO_THROW(d.malloc(80 * MiB));
  // GC released the non-expandable 40 MiB segment (never the expandable one, PR #134338).
  EXPECT_EQ(d.alloc.stats().num_device_free, 1);
  EXPECT_EQ(d.alloc.stats().num_alloc_retries, 0);
}

}  // namespace
}  // namespace cachet::model::test

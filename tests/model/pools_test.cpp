// Per-stream pools, best fit, splitting, merging, the oversize rules (docs/pytorch-allocator.md
// §2). Values: probes P3 (small_pack.json), P4 (large_split.json), P5 (streams.json), P7
// (max_split.json). § numbers refer to docs/pytorch-allocator.md.
#include "harness.h"

namespace cachet::model::test {
namespace {

constexpr Bytes k512K = 512 * KiB;

TEST(Pools, SmallPoolPackingAndMergeP3) {
  Device d;
  d.warm_up();
  std::uint64_t p[5];
  p[0] = d.malloc(k512K);
  EXPECT_PROBE(d.alloc, 524288, 2097152, 524288, 1572864, 1, 1, 524288, 0, 0, 1, 2, 1, 0, 0);
  EXPECT_EQ(d.blocks(0), (Blocks{{524288, 524288, A}, {1572864, 0, I}}));
  p[1] = d.malloc(k512K);
  EXPECT_PROBE(d.alloc, 1048576, 2097152, 1048576, 1048576, 1, 1, 1048576, 0, 0, 1, 2, 1, 0, 0);
  p[2] = d.malloc(k512K);
  EXPECT_PROBE(d.alloc, 1572864, 2097152, 1572864, 524288, 1, 1, 1572864, 0, 0, 1, 2, 1, 0, 0);
  p[3] = d.malloc(k512K);
  EXPECT_PROBE(d.alloc, 2097152, 2097152, 2097152, 0, 0, 1, 2097152, 0, 0, 1, 2, 1, 0, 0);
  p[4] = d.malloc(k512K);  // the segment is full: a second one
  EXPECT_PROBE(d.alloc, 2621440, 4194304, 2621440, 1572864, 1, 2, 2621440, 0, 0, 1, 3, 1, 0, 0);
  d.free(p[1]);
  EXPECT_PROBE(d.alloc, 2097152, 4194304, 2097152, 2097152, 2, 2, 2097152, 0, 0, 1, 3, 1, 0, 0);
  EXPECT_EQ(d.blocks(0), (Blocks{{524288, 524288, A}, {524288, 524288, I}, {524288, 524288, A},
                                 {524288, 524288, A}}));
  d.free(p[2]);  // merges with #1 into a 1 MiB hole
  EXPECT_PROBE(d.alloc, 1572864, 4194304, 1572864, 2621440, 2, 2, 1572864, 0, 0, 1, 3, 1, 0, 0);
  EXPECT_EQ(d.blocks(0), (Blocks{{524288, 524288, A}, {1048576, 524288, I}, {524288, 524288, A}}));
  const auto q = d.malloc(716800);  // best fit: the 1 MiB hole, not the 1.5 MiB remainder
  EXPECT_EQ(q, p[1]);
  EXPECT_PROBE(d.alloc, 2289664, 4194304, 2289664, 1904640, 2, 2, 2289664, 0, 0, 1, 3, 1, 0, 0);
  EXPECT_EQ(d.blocks(0), (Blocks{{524288, 524288, A}, {716800, 716800, A}, {331776, 524288, I},
                                 {524288, 524288, A}}));
  d.free(q);
  d.free(p[0]);
  d.free(p[3]);
  d.free(p[4]);
  EXPECT_PROBE(d.alloc, 0, 4194304, 0, 0, 0, 2, 0, 0, 0, 1, 3, 1, 0, 0);
  EXPECT_EQ(d.blocks(0), (Blocks{{2097152, 524288, I}}));
  EXPECT_EQ(d.blocks(1), (Blocks{{2097152, 524288, I}}));
  d.alloc.empty_cache();
  EXPECT_PROBE(d.alloc, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2, 3, 3, 0, 0);
}

TEST(Pools, LargeSplitSequenceP4) {
  Device d;
  d.warm_up();
  const auto a = d.malloc(9 * MiB);
  EXPECT_PROBE(d.alloc, 9437184, 20971520, 9437184, 11534336, 1, 1, 9437184, 0, 0, 1, 2, 1, 0, 0);
  // 10.5 MiB leaves exactly 524,288 B: not > 1 MiB, so the whole 11 MiB block is taken.
  const auto b = d.malloc(11010048);
  EXPECT_PROBE(d.alloc, 20971520, 20971520, 20971520, 0, 0, 1, 20447232, 0, 0, 1, 2, 1, 0, 0);
  const auto c = d.malloc(11114905);
  EXPECT_PROBE(d.alloc, 32086528, 33554432, 32086528, 1467904, 1, 2, 31562137, 0, 0, 1, 3, 1, 0, 0);
  d.free(a);
  EXPECT_PROBE(d.alloc, 22649344, 33554432, 22649344, 10905088, 2, 2, 22124953, 0, 0, 1, 3, 1, 0, 0);
  d.free(c);  // merges with its free remainder: the 12 MiB segment is whole again
  EXPECT_PROBE(d.alloc, 11534336, 33554432, 11534336, 9437184, 1, 2, 11010048, 0, 0, 1, 3, 1, 0, 0);
  const auto dd = d.malloc(3 * MiB);
  EXPECT_PROBE(d.alloc, 14680064, 33554432, 14680064, 6291456, 1, 2, 14155776, 0, 0, 1, 3, 1, 0, 0);
  const auto e = d.malloc(2 * MiB);
  EXPECT_PROBE(d.alloc, 16777216, 33554432, 16777216, 4194304, 1, 2, 16252928, 0, 0, 1, 3, 1, 0, 0);
  // The 20 MiB segment (first allocated) and its blocks; the 9 MiB hole keeps a's stale size.
  EXPECT_EQ(d.blocks(0), (Blocks{{3145728, 3145728, A}, {2097152, 2097152, A}, {4194304, 9437184, I},
                                 {11534336, 11010048, A}}));
  EXPECT_EQ(d.blocks(1), (Blocks{{12582912, 11114905, I}}));
  d.free(b);
  d.free(dd);
  d.free(e);
  EXPECT_PROBE(d.alloc, 0, 33554432, 0, 0, 0, 2, 0, 0, 0, 1, 3, 1, 0, 0);
  d.alloc.empty_cache();
  EXPECT_PROBE(d.alloc, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2, 3, 3, 0, 0);
  const auto f = d.malloc(19922944);  // 19 MiB owns the whole 20 MiB segment (§11.3)
  EXPECT_PROBE(d.alloc, 20971520, 20971520, 20971520, 0, 0, 1, 19922944, 0, 0, 2, 4, 3, 0, 0);
  d.free(f);
  d.malloc(19398656);  // 18.5 MiB: remainder 1.5 MiB > 1 MiB, split; remainder keeps f's size
  EXPECT_PROBE(d.alloc, 19398656, 20971520, 19398656, 1572864, 1, 1, 19398656, 0, 0, 2, 4, 3, 0, 0);
  EXPECT_EQ(d.blocks(0), (Blocks{{19398656, 19398656, A}, {1572864, 19922944, I}}));
}

TEST(Pools, PerStreamIsolationP5) {
  constexpr StreamId s1 = 697213616;  // streams.json's side stream
  Device d;
  d.warm_up();
  const auto x = d.malloc(4 * MiB);
  d.free(x);
  EXPECT_PROBE(d.alloc, 0, 20971520, 0, 0, 0, 1, 0, 0, 0, 1, 2, 1, 0, 0);
  const auto y = d.malloc(4 * MiB, s1);  // the cached block belongs to stream 0
  EXPECT_NE(y, x);
  EXPECT_PROBE(d.alloc, 4194304, 41943040, 4194304, 16777216, 1, 2, 4194304, 0, 0, 1, 3, 1, 0, 0);
  d.free(y);
  const auto z = d.malloc(4 * MiB);
  EXPECT_EQ(z, x);
  EXPECT_PROBE(d.alloc, 4194304, 41943040, 4194304, 16777216, 1, 2, 4194304, 0, 0, 1, 3, 1, 0, 0);
  const Snapshot s = d.alloc.snapshot();
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(s[0].stream, 0u);
  EXPECT_EQ(d.blocks(0), (Blocks{{4194304, 4194304, A}, {16777216, 4194304, I}}));
  EXPECT_EQ(s[1].stream, s1);
  EXPECT_EQ(d.blocks(1), (Blocks{{20971520, 4194304, I}}));
}

TEST(Pools, MaxSplitRulesP7) {
  Device d(conf("max_split_size_mb:40"));
  d.warm_up();
  EXPECT_EQ(d.alloc.stats().max_split_size, 41943040);
  const auto a = d.malloc(50 * MiB);
  EXPECT_PROBE(d.alloc, 52428800, 52428800, 52428800, 0, 0, 1, 52428800, 0, 0, 1, 2, 1, 1, 1);
  d.free(a);
  EXPECT_PROBE(d.alloc, 0, 52428800, 0, 0, 0, 1, 0, 0, 0, 1, 2, 1, 0, 1);
  const auto b = d.malloc(45 * MiB);  // oversize request, 50 < 45 + 20: the 50 MiB block, unsplit
  EXPECT_EQ(b, a);
  EXPECT_PROBE(d.alloc, 52428800, 52428800, 52428800, 0, 0, 1, 47185920, 0, 0, 1, 2, 1, 1, 1);
  d.free(b);
  const auto c = d.malloc(30 * MiB);  // a normal request never takes an oversize block
  EXPECT_NE(c, a);
  EXPECT_PROBE(d.alloc, 31457280, 83886080, 31457280, 0, 0, 2, 31457280, 0, 0, 1, 3, 1, 0, 1);
  d.free(c);
  const auto dd = d.malloc(31352422);  // 29.9 MiB: the 30 MiB block, remainder <= 1 MiB
  EXPECT_EQ(dd, c);
  EXPECT_EQ(d.alloc.stats().allocated_bytes[0].current, 31457280);
  d.free(dd);
  const auto e = d.malloc(41 * MiB);  // 50 < 41 + 20
  EXPECT_EQ(e, a);
  EXPECT_EQ(d.alloc.stats().allocated_bytes[0].current, 52428800);
  EXPECT_EQ(d.alloc.stats().oversize_allocations.current, 1);
  d.free(e);
  d.malloc(25 * MiB);  // the 30 MiB block, split 25 + 5
  EXPECT_EQ(d.alloc.stats().allocated_bytes[0].current, 26214400);
  EXPECT_EQ(d.alloc.stats().reserved_bytes[0].current, 83886080);
}

TEST(Pools, NonSplitRoundingAllowanceP7) {
  {
    Device d(conf("max_split_size_mb:40"));
    d.free(d.malloc(100 * MiB));
    d.malloc(70 * MiB);  // 100 >= 70 + 20: a new segment
    EXPECT_EQ(d.alloc.stats().allocated_bytes[0].current, 73400320);
    EXPECT_EQ(d.alloc.stats().reserved_bytes[0].current, 178257920);
    EXPECT_EQ(d.alloc.stats().oversize_segments.current, 2);
  }
  {
    Device d(conf("max_split_size_mb:40,max_non_split_rounding_mb:40"));
    d.free(d.malloc(100 * MiB));
    d.malloc(70 * MiB);  // 100 < 70 + 40: the cached block
    EXPECT_EQ(d.alloc.stats().allocated_bytes[0].current, 104857600);
    EXPECT_EQ(d.alloc.stats().reserved_bytes[0].current, 104857600);
  }
}

// §13.7's source-only rule: the allowance check is `block >= request + allowance` (refuse).
TEST(Pools, NonSplitRoundingBoundaryIsInclusive) {
  Device d(conf("max_split_size_mb:40"));
  const auto big = d.malloc(60 * MiB);
  d.free(big);
  const auto r = d.malloc(40 * MiB);  // 60 >= 40 + 20: refused, new segment
  EXPECT_NE(r, big);
  d.free(r);
  // 40 MiB + 512: the 40 MiB block is too small; 60 MiB < 40 MiB + 512 + 20 MiB: taken.
  EXPECT_EQ(d.malloc(40 * MiB + 512), big);
}

TEST(Pools, EqualSizesGoToTheLowestAddress) {
  Device d;
  const auto a = d.malloc(12 * MiB);
  const auto b = d.malloc(12 * MiB);
  ASSERT_LT(a, b);
  d.free(b);
  d.free(a);
  EXPECT_EQ(d.malloc(12 * MiB), a);
}

TEST(Pools, MergesOnlyWithFreeNeighbours) {
  Device d;
  const auto a = d.malloc(1000);
  const auto b = d.malloc(1000);
  const auto c = d.malloc(1000);
  d.free(b);  // both neighbours allocated: stays a separate inactive block
  EXPECT_EQ(d.blocks(0), (Blocks{{1024, 1000, A}, {1024, 1000, I}, {1024, 1000, A}, {2094080, 0, I}}));
  d.free(c);  // merges with b and with the remainder
  EXPECT_EQ(d.blocks(0), (Blocks{{1024, 1000, A}, {2096128, 1000, I}}));
  d.free(a);
  EXPECT_EQ(d.blocks(0), (Blocks{{2097152, 1000, I}}));
  // Blocks are never merged across segments: two whole 2 MiB segments stay two.
  Device e;
  std::vector<std::uint64_t> ps;
  for (int i = 0; i < 4; ++i) ps.push_back(e.malloc(1 * MiB));
  for (auto p : ps) e.free(p);
  EXPECT_EQ(e.alloc.snapshot().size(), 2u);
  EXPECT_EQ(e.alloc.stats().inactive_split[0].current, 0);
}

}  // namespace
}  // namespace cachet::model::test

// Rounding, pools and segment sizes (docs/pytorch-allocator.md §1), against the probe tables §1.4
// (rounding.json) and §1.5 (roundup.json). § numbers refer to docs/pytorch-allocator.md.
#include <tuple>
#include <vector>

#include "cachet/model/sizes.h"
#include "harness.h"

namespace cachet::model::test {
namespace {

struct RoundingRow {
  Bytes request, allocated, reserved;
  std::vector<Bytes> blocks;  // block sizes of the one segment, address order
};

// probe rounding.json (§1.4): torch.empty(n, uint8) from an empty cache.
const RoundingRow kRounding[] = {
    {1, 512, 2097152, {512, 2096640}},
    {511, 512, 2097152, {512, 2096640}},
    {512, 512, 2097152, {512, 2096640}},
    {513, 1024, 2097152, {1024, 2096128}},
    {1000, 1024, 2097152, {1024, 2096128}},
    {1024, 1024, 2097152, {1024, 2096128}},
    {4096, 4096, 2097152, {4096, 2093056}},
    {1048575, 1048576, 2097152, {1048576, 1048576}},
    {1048576, 1048576, 2097152, {1048576, 1048576}},
    {1048577, 1049088, 20971520, {1049088, 19922432}},
    {2097152, 2097152, 20971520, {2097152, 18874368}},
    {5242880, 5242880, 20971520, {5242880, 15728640}},
    {10485759, 10485760, 10485760, {10485760}},
    {10485760, 10485760, 10485760, {10485760}},
    {10485761, 10486272, 12582912, {10486272, 2096640}},
    {12582913, 12583424, 14680064, {12583424, 2096640}},
    {19922944, 20971520, 20971520, {20971520}},  // 19 MiB: remainder 1 MiB is not > 1 MiB
    {20971520, 20971520, 20971520, {20971520}},
    {22020096, 23068672, 23068672, {23068672}},  // 21 MiB: remainder exactly 1 MiB
    {104857601, 104858112, 106954752, {104858112, 2096640}},
};

TEST(Sizes, ProbeRoundingTable) {
  for (const RoundingRow& row : kRounding) {
    SCOPED_TRACE(row.request);
    Device d;
    d.malloc(row.request);
    EXPECT_EQ(d.alloc.stats().allocated_bytes[0].current, static_cast<std::int64_t>(row.allocated));
    EXPECT_EQ(d.alloc.stats().reserved_bytes[0].current, static_cast<std::int64_t>(row.reserved));
    EXPECT_EQ(d.alloc.stats().requested_bytes[0].current, static_cast<std::int64_t>(row.request));
    const Snapshot s = d.alloc.snapshot();
    ASSERT_EQ(s.size(), 1u);
    EXPECT_EQ(s[0].is_large, row.reserved != kSmallBuffer);
    std::vector<Bytes> sizes;
    for (const auto& b : s[0].blocks) sizes.push_back(b.size);
    EXPECT_EQ(sizes, row.blocks);
  }
}

struct RoundupRow {
  Bytes request, block, segment;
};
struct RoundupCase {
  const char* conf;
  std::vector<RoundupRow> rows;
};

// probe roundup.json (§1.5): block size and segment size per configuration.
const std::vector<Bytes> kRequests = {1200,    2100,     3000,     5000,      100000,
                                      700000,  1048577,  3145729,  5242881,   9437185,
                                      22020101, 88080384, 104857603, 314572807, 629145607};
const std::vector<std::pair<const char*, std::vector<std::pair<Bytes, Bytes>>>> kRoundup = {
    {"", {{1536, 2097152}, {2560, 2097152}, {3072, 2097152}, {5120, 2097152}, {100352, 2097152},
          {700416, 2097152}, {1049088, 20971520}, {3146240, 20971520}, {5243392, 20971520},
          {9437696, 20971520}, {23068672, 23068672}, {88080384, 88080384}, {104858112, 106954752},
          {314573312, 316669952}, {629146112, 631242752}}},
    {"roundup_power2_divisions:4",
     {{1536, 2097152}, {2560, 2097152}, {3072, 2097152}, {5120, 2097152}, {114688, 2097152},
      {786432, 2097152}, {1310720, 20971520}, {3670016, 20971520}, {6291456, 20971520},
      {10485760, 10485760}, {25165824, 25165824}, {100663296, 100663296}, {117440512, 117440512},
      {335544320, 335544320}, {671088640, 671088640}}},
    {"roundup_power2_divisions:1",
     {{1536, 2097152}, {2560, 2097152}, {3072, 2097152}, {5120, 2097152}, {100352, 2097152},
      {700416, 2097152}, {1049088, 20971520}, {3146240, 20971520}, {5243392, 20971520},
      {9437696, 20971520}, {23068672, 23068672}, {88080384, 88080384}, {104858112, 106954752},
      {314573312, 316669952}, {629146112, 631242752}}},
    {"roundup_power2_divisions:8",
     {{1536, 2097152}, {2560, 2097152}, {3072, 2097152}, {5120, 2097152}, {106496, 2097152},
      {720896, 2097152}, {1179648, 20971520}, {3407872, 20971520}, {5767168, 20971520},
      {10485760, 10485760}, {23068672, 23068672}, {92274688, 92274688}, {109051904, 109051904},
      {335544320, 335544320}, {671088640, 671088640}}},
    {"roundup_power2_divisions:[1:4,>:8]",
     {{1536, 2097152}, {2560, 2097152}, {3072, 2097152}, {5120, 2097152}, {114688, 2097152},
      {786432, 2097152}, {1310720, 20971520}, {3407872, 20971520}, {5767168, 20971520},
      {10485760, 10485760}, {23068672, 23068672}, {92274688, 92274688}, {109051904, 109051904},
      {335544320, 335544320}, {671088640, 671088640}}},
    {"roundup_power2_divisions:[256:1,512:2,>:8]",
     {{1536, 2097152}, {2560, 2097152}, {3072, 2097152}, {5120, 2097152}, {100352, 2097152},
      {700416, 2097152}, {1049088, 20971520}, {3146240, 20971520}, {5243392, 20971520},
      {9437696, 20971520}, {23068672, 23068672}, {88080384, 88080384}, {104858112, 106954752},
      {314573312, 316669952}, {805306368, 805306368}}},
    {"roundup_power2_divisions:[64:8,128:2,256:2,512:2,1024:1,>:1]",
     {{1536, 2097152}, {2560, 2097152}, {3072, 2097152}, {5120, 2097152}, {106496, 2097152},
      {720896, 2097152}, {1179648, 20971520}, {3407872, 20971520}, {5767168, 20971520},
      {10485760, 10485760}, {23068672, 23068672}, {92274688, 92274688}, {109051904, 109051904},
      {402653184, 402653184}, {805306368, 805306368}}},
    {"roundup_power2_divisions:[2:16]",
     {{1536, 2097152}, {2560, 2097152}, {3072, 2097152}, {5120, 2097152}, {102400, 2097152},
      {720896, 2097152}, {1114112, 20971520}, {3276800, 20971520}, {5243392, 20971520},
      {9437696, 20971520}, {23068672, 23068672}, {88080384, 88080384}, {104858112, 106954752},
      {314573312, 316669952}, {629146112, 631242752}}},
    // 2.11's gaps: [1:4,16:8] leaves indices 1..3 at 0, so 3 MiB+1 is not rounded (§1.5).
    {"roundup_power2_divisions:[1:4,16:8]",
     {{1536, 2097152}, {2560, 2097152}, {3072, 2097152}, {5120, 2097152}, {114688, 2097152},
      {786432, 2097152}, {1310720, 20971520}, {3146240, 20971520}, {5243392, 20971520},
      {9437696, 20971520}, {23068672, 23068672}, {88080384, 88080384}, {104858112, 106954752},
      {314573312, 316669952}, {629146112, 631242752}}},
};

TEST(Sizes, ProbeRoundupTable) {
  for (const auto& [text, rows] : kRoundup) {
    const Config c = conf(text);
    ASSERT_EQ(rows.size(), kRequests.size());
    for (std::size_t i = 0; i < rows.size(); ++i) {
      SCOPED_TRACE(std::string(text) + " request " + std::to_string(kRequests[i]));
      // As the probe measured it: a fresh allocator, one allocation.
      Device d(c);
      d.malloc(kRequests[i]);
      EXPECT_EQ(d.alloc.stats().allocated_bytes[0].current, static_cast<std::int64_t>(rows[i].first));
      EXPECT_EQ(d.alloc.stats().reserved_bytes[0].current, static_cast<std::int64_t>(rows[i].second));
    }
  }
}

// §9.19 test_allocator_settings: 21 * 2^20 floats (88,080,384 B) -> 96 MiB with divisions 4,
// 88 MiB with the list; 100 * 2^20 floats (400 MiB) -> 512 MiB with the list.
TEST(Sizes, PyTorchAllocatorSettingsExpectations) {
  EXPECT_EQ(round_size(conf("roundup_power2_divisions:4"), 88080384), 96 * MiB);
  EXPECT_EQ(round_size(conf(""), 88080384), 88080384u);
  const Config list = conf("roundup_power2_divisions:[64:8,128:2,256:2,512:2,1024:1,>:1]");
  EXPECT_EQ(round_size(list, 88080384), 88 * MiB);
  EXPECT_EQ(round_size(list, 400 * MiB), 512 * MiB);
  // A later string without the key resets divisions (§4.1): plain rounding again.
  EXPECT_EQ(round_size(conf("garbage_collection_threshold:0.5,max_split_size_mb:40"), 88080384),
            88080384u);
}

TEST(Sizes, LargeSegmentSizeKey) {
  // §1.1 probe: large_segment_size_mb:40 -> a 1 MiB+1 request reserves 41,943,040 B.
  Device d(conf("large_segment_size_mb:40"));
  d.malloc(1048577);
  EXPECT_EQ(d.alloc.stats().reserved_bytes[0].current, 41943040);
}

TEST(Sizes, AllocationSizeBoundaries) {
  const Config c;
  EXPECT_EQ(allocation_size(c, kSmallSize), kSmallBuffer);
  EXPECT_EQ(allocation_size(c, kSmallSize + 512), c.large_segment_size);
  EXPECT_EQ(allocation_size(c, kMinLargeAlloc - 512), c.large_segment_size);
  EXPECT_EQ(allocation_size(c, kMinLargeAlloc), kMinLargeAlloc);
  EXPECT_EQ(allocation_size(c, kMinLargeAlloc + 512), 12 * MiB);
  EXPECT_TRUE(is_small_size(kSmallSize));
  EXPECT_FALSE(is_small_size(kSmallSize + 512));
}

// The source-only rule of §13.7: rounding applies at size > 512 * divisions. 1200 with
// divisions 4 (threshold 2048) is 512-rounded to 1536 in every probe row; rounding at >= or
// without the threshold would give 1280.
TEST(Sizes, DivisionsApplyAboveTheThresholdOnly) {
  const Config c = conf("roundup_power2_divisions:4");
  EXPECT_EQ(round_size(c, 1200), 1536u);
  EXPECT_EQ(round_size(c, 2048), 2048u);
  EXPECT_EQ(round_size(c, 2049), 2560u);
  EXPECT_EQ(roundup_power2_next_division(1200, 4), 1280u);
  EXPECT_EQ(roundup_power2_next_division(1 << 20, 4), 1u << 20);  // powers of two stay
}

}  // namespace
}  // namespace cachet::model::test

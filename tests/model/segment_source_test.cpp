// The segment sources: synthetic (deterministic, capacity) and recorded (PyTorch's addresses in
// order; a different size is a Divergence, never corrected).
#include "cachet/errors.h"
#include "harness.h"

namespace cachet::model::test {
namespace {

TEST(SegmentSource, SyntheticIsDeterministicAndFailsBeyondCapacity) {
  SyntheticSegmentSource a(10 * MiB), b(10 * MiB);
  EXPECT_EQ(a.allocate(2 * MiB), b.allocate(2 * MiB));
  EXPECT_EQ(a.allocate(8 * MiB).has_value(), true);
  EXPECT_FALSE(a.allocate(512).has_value());  // cudaErrorMemoryAllocation
  EXPECT_EQ(a.free_memory(), 0u);
  EXPECT_FALSE(a.map(0x300000000, 2 * MiB));
}

TEST(SegmentSource, RecordedHandsOutTheRecordedAddresses) {
  const std::vector<TraceEvent> trace = {
      {TraceAction::SegmentAlloc, 0x7f0000200000, 2 * MiB, 0, 0},
      {TraceAction::Alloc, 0x7f0000200000, 1000, 0, 0},
      {TraceAction::SegmentAlloc, 0x7f0010000000, 20 * MiB, 0, 0},
  };
  RecordedSegmentSource src(trace, kH200Total);
  Allocator a(Config{}, src);
  EXPECT_EQ(a.malloc(1000), 0x7f0000200000u);
  EXPECT_EQ(a.malloc(4 * MiB), 0x7f0010000000u);
  // A third segment is not in the recording.
  EXPECT_THROW(a.malloc(4 * MiB, 5), Divergence);
}

TEST(SegmentSource, RecordedSizeMismatchIsADivergence) {
  const std::vector<TraceEvent> trace = {{TraceAction::SegmentAlloc, 0x7f0000200000, 20 * MiB, 0, 0}};
  RecordedSegmentSource src(trace, kH200Total);
  Allocator a(Config{}, src);
  try {
    a.malloc(1000);  // the model asks for 2 MiB
    FAIL() << "no Divergence";
  } catch (const Divergence& d) {
    EXPECT_EQ(d.expected(), "size 20971520");
    EXPECT_EQ(d.actual(), "size 2097152");
  }
}

TEST(SegmentSource, RecordedReservationBaseIsTheFirstMappedAddress) {
  // An expandable segment maps from its base first (docs/pytorch-allocator.md §7): the base is
  // the next segment_map row.
  const std::vector<TraceEvent> trace = {
      {TraceAction::SegmentMap, 12918456320, 2 * MiB, 0, 0},
      {TraceAction::SegmentMap, 12920553472, 2 * MiB, 0, 0},
  };
  RecordedSegmentSource src(trace, kH200Total);
  Allocator a(parse_config("expandable_segments:True").config, src);
  EXPECT_EQ(a.malloc(1 * MiB), 12918456320u);
  EXPECT_EQ(a.malloc(1 * MiB), 12918456320u + 1 * MiB);
  EXPECT_EQ(a.malloc(1 * MiB), 12920553472u);  // grows by one page at the next address
  EXPECT_EQ(a.stats().reserved_bytes[0].current, static_cast<std::int64_t>(4 * MiB));
}

}  // namespace
}  // namespace cachet::model::test

// Size rounding and segment sizes (docs/pytorch-allocator.md §1).
#include "cachet/model/sizes.h"

#include <bit>

#include "cachet/rule_flip.h"

namespace cachet::model {

Bytes roundup_power2_next_division(Bytes size, std::uint32_t divisions) {
  if (std::has_single_bit(size)) return size;
  const Bytes power2_floor = std::bit_floor(size);
  // floor / floor_pow2(divisions): the width of one division of [floor, 2 * floor).
  const Bytes division = power2_floor >> (std::bit_width(divisions) - 1);
  if (division == 0) return power2_floor << 1;
  const Bytes round_floor = size & ~(division - 1);
  return round_floor == size ? size : round_floor + division;
}

std::uint32_t roundup_divisions_for(const Config& c, Bytes size) {
  const int log_size = std::bit_width(size) - 1;
  constexpr int kIntervalStart = 20;  // 1 MiB
  // Rule flip divisions_entry_shifted: one entry lower.
  const int start = flipped(RuleFlip::DivisionsEntryShifted) ? kIntervalStart + 1 : kIntervalStart;
  int index = log_size > start ? log_size - start : 0;
  if (index > kRoundUpPowerOfTwoIntervals - 1) index = kRoundUpPowerOfTwoIntervals - 1;
  return c.roundup_power2_divisions[static_cast<std::size_t>(index)];
}

Bytes round_size(const Config& c, Bytes size) {
  const Bytes quantum = flipped(RuleFlip::Round1024) ? 2 * kMinBlockSize : kMinBlockSize;  // rule flip
  if (size < quantum) return quantum;
  const std::uint32_t divisions = roundup_divisions_for(c, size);
  // `divisions > 1`: a value of 1 means plain rounding (§1.2, issue #161139); the boundary is
  // strict: size == 512 * divisions is 512-rounded (§13.7). (Rule flips: divisions_one_rounds,
  // divisions_inclusive.)
  const std::uint32_t min_divisions = flipped(RuleFlip::DivisionsOneRounds) ? 1 : 2;
  const bool above = flipped(RuleFlip::DivisionsInclusive) ? size >= kMinBlockSize * divisions
                                                             : size > kMinBlockSize * divisions;
  if (divisions >= min_divisions && above) return roundup_power2_next_division(size, divisions);
  return quantum * ((size + quantum - 1) / quantum);
}

bool is_small_size(Bytes rounded) {
  return flipped(RuleFlip::SmallBelow1MiB) ? rounded < kSmallSize : rounded <= kSmallSize;  // rule flip
}

Bytes allocation_size(const Config& c, Bytes rounded) {
  if (is_small_size(rounded)) return flipped(RuleFlip::SmallSegment4MiB) ? 2 * kSmallBuffer : kSmallBuffer;
  if (rounded < kMinLargeAlloc || (flipped(RuleFlip::MidSegmentTo10MiB) && rounded == kMinLargeAlloc))
    return c.large_segment_size;
  const Bytes round = flipped(RuleFlip::SegmentRound1MiB) ? kRoundLarge / 2 : kRoundLarge;  // rule flip
  return round * ((rounded + round - 1) / round);
}

}  // namespace cachet::model

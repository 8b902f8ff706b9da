// Size rounding and segment sizes (docs/pytorch-allocator.md §1).
#include "cachet/model/sizes.h"

#include <bit>

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
  int index = log_size > kIntervalStart ? log_size - kIntervalStart : 0;
  if (index > kRoundUpPowerOfTwoIntervals - 1) index = kRoundUpPowerOfTwoIntervals - 1;
  return c.roundup_power2_divisions[static_cast<std::size_t>(index)];
}

Bytes round_size(const Config& c, Bytes size) {
  if (size < kMinBlockSize) return kMinBlockSize;
  const std::uint32_t divisions = roundup_divisions_for(c, size);
  // `divisions > 1`: a value of 1 means plain rounding (§1.2, issue #161139); the boundary is
  // strict: size == 512 * divisions is 512-rounded (§13.7).
  if (divisions > 1 && size > kMinBlockSize * divisions)
    return roundup_power2_next_division(size, divisions);
  return kMinBlockSize * ((size + kMinBlockSize - 1) / kMinBlockSize);
}

Bytes allocation_size(const Config& c, Bytes rounded) {
  if (rounded <= kSmallSize) return kSmallBuffer;
  if (rounded < kMinLargeAlloc) return c.large_segment_size;
  return kRoundLarge * ((rounded + kRoundLarge - 1) / kRoundLarge);
}

}  // namespace cachet::model

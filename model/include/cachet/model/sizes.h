// cachet/model/sizes.h: how a request becomes a block size, a pool and a segment size
// (docs/pytorch-allocator.md §1; the § numbers below refer to it too).
#pragma once

#include "cachet/config.h"
#include "cachet/types.h"

namespace cachet::model {

// roundup_power2_next_division(size, divisions) (§1.2): the next multiple of
// floor_pow2(size) / floor_pow2(divisions) at or above size; powers of two stay as they are.
// Precondition: divisions >= 2.
Bytes roundup_power2_next_division(Bytes size, std::uint32_t divisions);

// The divisions entry that applies to `size` (§1.2): index = log2(size) - 20, clamped to
// [0, 15]; every size below 2 MiB uses index 0.
std::uint32_t roundup_divisions_for(const Config& c, Bytes size);

// round_size (§1.2): < 512 -> 512; power-of-two divisions when divisions > 1 and
// size > 512 * divisions; else a multiple of 512.
Bytes round_size(const Config& c, Bytes size);

// get_pool (§1.3): a rounded size <= 1 MiB goes to the small pool.
bool is_small_size(Bytes rounded);

// get_allocation_size (§1.3): the size of a new segment for a rounded request.
Bytes allocation_size(const Config& c, Bytes rounded);

// The page size of an expandable segment (§7): 2 MiB in the small pool, large_segment_size in
// the large pool.
inline Bytes expandable_page_size(const Config& c, bool small_pool) {
  return small_pool ? kSmallBuffer : c.large_segment_size;
}

// Pages one expandable reservation holds (§7): ceil((total + total / 8) / page).
inline Bytes expandable_page_count(Bytes device_total, Bytes page) {
  const Bytes want = device_total + device_total / 8;
  return (want + page - 1) / page;
}

}  // namespace cachet::model

// cachet/model/memory_cap.h: set_memory_fraction's cap, as PyTorch computes it
// (docs/pytorch-allocator.md §3.6, §13.4), for both model policies (Allocator and CachetPolicy).
#pragma once

#include <optional>
#include <string>

#include "cachet/errors.h"
#include "cachet/types.h"

namespace cachet::model {

// fraction x total memory in double, truncated; 1.0 means no cap. A fraction outside [0, 1]
// throws UsageError with PyTorch's words.
inline std::optional<Bytes> memory_cap(double fraction, Bytes total_memory) {
  if (!(fraction >= 0.0 && fraction <= 1.0))
    throw UsageError("invalid fraction: " + std::to_string(fraction) +
                     ". Please set within [0, 1].");
  if (fraction >= 1.0) return std::nullopt;
  return static_cast<Bytes>(fraction * static_cast<double>(total_memory));
}

}  // namespace cachet::model

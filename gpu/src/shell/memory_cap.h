// gpu/src/shell/memory_cap.h: the memory cap (torch.cuda.set_per_process_memory_fraction,
// docs/pytorch-allocator.md §13.4): a fraction in [0, 1] of the device's total memory, turned into
// allowed bytes the same way by both policies; 1 means no cap. What a policy does when the cap
// changes (policy:cachet unmaps down to it) stays in the policy.
#pragma once

#include <optional>
#include <string>

#include "cachet/errors.h"
#include "cachet/types.h"

namespace cachet::gpu::detail {

class MemoryCap {
 public:
  static bool valid(double fraction) { return fraction >= 0.0 && fraction <= 1.0; }  // false for NaN
  // Throws UsageError (changing nothing) outside [0, 1].
  void set(double fraction, Bytes total_memory) {
    if (!valid(fraction))
      throw UsageError("invalid fraction: " + std::to_string(fraction) + ". Please set within [0, 1].");
    if (fraction < 1.0) allowed_ = static_cast<Bytes>(fraction * static_cast<double>(total_memory));
    else allowed_.reset();
  }
  double fraction(Bytes total_memory) const {
    return allowed_ ? static_cast<double>(*allowed_) / static_cast<double>(total_memory) : 1.0;
  }
  // The cap in bytes (inclusive), or none.
  const std::optional<Bytes>& allowed() const { return allowed_; }

 private:
  std::optional<Bytes> allowed_;
};

}  // namespace cachet::gpu::detail

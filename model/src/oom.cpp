// The out-of-memory error (docs/pytorch-allocator.md §3.7): state changes first (oom trace row,
// num_ooms), then PyTorch's message. The driver figures come from the segment source.
#include "cachet/errors.h"
#include "cachet/model/allocator.h"
#include "cachet/rule_flip.h"
#include "cachet/summary.h"

namespace cachet::model {

void Allocator::raise_oom(const AllocParams& p) {
  const Bytes device_free = source_.free_memory();
  // The trace row carries the device's free bytes as its address and the rounded request.
  record(TraceAction::Oom, device_free, flipped(RuleFlip::OomTraceSegmentSize) ? p.alloc_size : p.size,
         p.stream);  // rule flip oom_trace_segment_size
  ++stats_.num_ooms;
  OomFacts f;
  f.alloc_size = p.alloc_size;  // the segment size, not the request (§11.7)
  f.device = device_;
  f.device_total = source_.total_memory();
  f.device_free = device_free;
  f.process_in_use = source_.process_in_use();
  f.allowed = allowed_max_;
  f.allocated = static_cast<Bytes>(stats_.allocated_bytes[0].current);
  f.reserved = static_cast<Bytes>(stats_.reserved_bytes[0].current);
  // Free blocks of every private pool (§3.7, §14.6).
  f.private_pool_free = private_pool_free_bytes();
  throw OutOfMemory(f);
}

}  // namespace cachet::model

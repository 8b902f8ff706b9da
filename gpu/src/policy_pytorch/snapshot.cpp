// policy:pytorch (PytorchPolicy, policy_pytorch/policy.h): snapshot and pointer diagnostics. Section numbers (§) refer to
// docs/pytorch-allocator.md.
#include <algorithm>
#include <string>

#include "cachet/errors.h"
#include "cachet/snapshot_digest.h"
#include "cachet/summary.h"
#include "check.h"
#include "messages.h"
#include "policy_pytorch/policy.h"

namespace cachet::gpu::detail {

// ===================================================================== Snapshot and trace (8)

// One snapshot segment per contiguous mapped run (a whole cudaMalloc segment is one run). With
// `hidden`, also an orphaned pool's runs that begin with a free block: PyTorch's snapshot finds
// blocks through the known pools and the active blocks (get_all_blocks), so it shows such a run
// only from a run head that is active, and none once its head is free (§14.8). A sleeping range
// is always shown, an orphaned pool's too (docs/sleep-wake.md section 5).
Snapshot PytorchPolicy::mapped_runs(bool hidden) const {
  Snapshot out;
  for (const auto& [base, seg] : segments_) {
    for (const Block* b = seg->head; b != nullptr;) {
      const bool unseen = !hidden && seg->pool->owner != nullptr && seg->pool->owner->orphaned && !b->is_active() &&
                          (seg->sleeping_runs == 0 || sleeping_range_at(b->ptr) == nullptr);
      if (!b->is_mapped() || unseen) {
        for (b = b->next; b != nullptr && b->is_mapped() && b->prev->is_mapped();) b = b->next;
        continue;
      }
      SegmentSnapshot s;
      s.address = b->ptr;
      s.stream = b->stream;
      s.is_large = !b->is_small;
      s.is_expandable = seg->expandable;
      if (seg->pool->owner != nullptr) s.pool_id = seg->pool->owner->id;  // segment_pool_id (§14.1)
      // A sleeping range is a segment of its own (docs/sleep-wake.md section 5).
      const SleepingRange* range = seg->sleeping_runs != 0 ? sleeping_range_at(b->ptr) : nullptr;
      if (range != nullptr) {
        s.is_sleeping = true;
        for (const BackupCopy& c : range->copies) s.backup_size += c.size;
      }
      for (; b != nullptr && b->is_mapped() && (seg->sleeping_runs == 0 || sleeping_range_at(b->ptr) == range);
           b = b->next) {
        BlockSnapshot bs;
        bs.address = b->ptr;
        bs.size = b->size;
        bs.requested_size = b->requested_size;
        bs.state = snapshot_state(b->state());
        s.total_size += b->size;
        s.blocks.push_back(bs);
      }
      out.push_back(std::move(s));
    }
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.address < b.address; });
  return out;
}

// mapped_runs(false)'s segments and blocks, fed to the digest as they are walked.
std::uint64_t PytorchPolicy::snapshot_digest() const {
  SnapshotDigest d;
  for (const auto& [base, seg] : segments_) {
    const bool orphaned = seg->pool->owner != nullptr && seg->pool->owner->orphaned;
    const PoolId pool = seg->pool->owner != nullptr ? seg->pool->owner->id : PoolId{};
    for (const Block* b = seg->head; b != nullptr;) {
      if (!b->is_mapped() ||
          (orphaned && !b->is_active() && (seg->sleeping_runs == 0 || sleeping_range_at(b->ptr) == nullptr))) {
        for (b = b->next; b != nullptr && b->is_mapped() && b->prev->is_mapped();) b = b->next;
        continue;
      }
      const DevicePtr at = b->ptr;
      const StreamId stream = b->stream;
      const bool large = !b->is_small;
      const SleepingRange* range = seg->sleeping_runs != 0 ? sleeping_range_at(b->ptr) : nullptr;
      Bytes total = 0, backup = 0;
      if (range != nullptr)
        for (const BackupCopy& c : range->copies) backup += c.size;
      for (; b != nullptr && b->is_mapped() && (seg->sleeping_runs == 0 || sleeping_range_at(b->ptr) == range);
           b = b->next) {
        d.block(b->ptr, b->size, b->requested_size, snapshot_state(b->state()));
        total += b->size;
      }
      d.segment(at, total, stream, large, seg->expandable, pool, range != nullptr, backup);
    }
  }
  return d.value();
}

Snapshot PytorchPolicy::snapshot() {
  Snapshot out = mapped_runs(false);
  Bytes total_active = 0;
  for (const auto& s : out)
    for (const auto& b : s.blocks)
      if (b.state != cachet::BlockState::Inactive) total_active += b.size;
  record(TraceAction::Snapshot, 0, total_active, 0);
  return out;
}

Snapshot PytorchPolicy::block_table() const { return mapped_runs(true); }

// ===================================================================== Errors

Block* PytorchPolicy::find_active(DevicePtr ptr, const char* op) const {
  return find_active_in(active_, ptr, op, [this](DevicePtr p) { return holder_of(p); });
}

std::optional<BlockAt> PytorchPolicy::holder_of(DevicePtr ptr) const {
  auto it = segments_.upper_bound(ptr);
  if (it == segments_.begin()) return std::nullopt;
  --it;
  const Segment& seg = *it->second;
  if (ptr >= seg.base + seg.size) return std::nullopt;
  for (const Block* b = seg.head; b != nullptr; b = b->next)
    if (ptr >= b->ptr && ptr < b->ptr + b->size) return BlockAt{b->ptr, b->size, !b->is_active()};
  return std::nullopt;
}

}  // namespace cachet::gpu::detail

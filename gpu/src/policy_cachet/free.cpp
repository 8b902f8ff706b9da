// policy:cachet (CachetPolicy, policy_cachet/policy.h; design and promises: cachet/gpu/policy_cachet.h):
// free, stream-use events, the cap, settings, snapshot and checks.
#include <algorithm>
#include <iterator>
#include <stdexcept>
#include <string>

#include "cachet/errors.h"
#include "cachet/summary.h"
#include "messages.h"
#include "mutant.h"
#include "policy_cachet/policy.h"

namespace cachet::gpu::detail {

using namespace cachet_pages;  // policy_cachet/policy.h

// ===================================================================== free and events

void CachetPolicy::free(DevicePtr ptr) {
  if (ptr == 0) return;
  CBlock* b = find_active(ptr, "free");
  if (!b->is_allocated())
    throw UsageError("free(" + hex(ptr) +
                     "): double free: the block is already freed and waits for its stream uses");
  if (b->asleep) {  // docs/sleep-wake.md section 4: allowed, takes effect for placement at wake
    free_while_asleep(b);
    return;
  }
  // Stream uses: create and record one event per using stream before changing anything, so a
  // failing event call reaches the caller with the block still allocated (its stream uses kept)
  // and the stats and trace untouched, as policy:pytorch does (policy_pytorch/free.cpp, free()).
  // The events of this call are appended to events_ from `first` on; a failure gives them back
  // to the pool (shell/event_pool.h).
  if (!b->stream_uses.empty() && !active_pools_.empty()) {
    // R12: no event while a pool is active: pending with its stream uses, in deferred_.
    accounting_.free_requested(pool_of(b->size), b->size, false);
    record(TraceAction::FreeRequested, b->ptr, b->requested, b->stream);
    b->set_state(BlockState::Deferred);
    deferred_.push_back(b);
    return;
  }
  const std::size_t first = events_.size();
  event_pool_.record_on(*mem_, device_, b->stream_uses, events_,
                        [b](EventHandle e, StreamId) { return std::pair{e, b}; });

  accounting_.free_requested(pool_of(b->size), b->size, false);
  record(TraceAction::FreeRequested, b->ptr, b->requested, b->stream);
  if (b->stream_uses.empty()) {
    free_block(b);
    if (cap_.allowed()) trim_to_cap();
    return;
  }
  b->event_count = static_cast<std::int32_t>(events_.size() - first);
  b->stream_uses.clear();
  b->set_state(BlockState::AwaitingEvents);
}

void CachetPolicy::free_block(CBlock* b) {
  accounting_.free_completed(pool_of(b->size), b->size, b->requested);
  record(TraceAction::FreeCompleted, b->ptr, b->requested, b->stream);
  active_.erase(b->ptr);
  touch(b, false);
  b->stream_uses.clear();
  b->set_state(BlockState::Free);
  if (!mutant(kMutantCachetFreeStaysInReleasedPool)) leave_released_pool(b);  // R11
  merge_free(b);
}

void CachetPolicy::record_stream(DevicePtr ptr, StreamId stream) {
  check_stream(stream, "record_stream");
  CBlock* b = find_active(ptr, "record_stream");
  if (!b->is_allocated())
    throw UsageError("record_stream(" + hex(ptr) + ", stream " + std::to_string(stream) +
                     "): the block was already freed; record stream uses before freeing");
  if (stream == b->stream) return;
  if (std::find(b->stream_uses.begin(), b->stream_uses.end(), stream) == b->stream_uses.end())
    b->stream_uses.push_back(stream);
}

void CachetPolicy::process_events() {
  if (!active_pools_.empty()) return;  // R12 (callers check it too)
  record_deferred_events();
  std::size_t keep = 0;
  for (std::size_t i = 0; i < events_.size(); ++i) {
    auto [e, b] = events_[i];
    auto r = mem_->event_query(e);
    if (!r.is_ok()) {
      // Keep the queue consistent before reporting.
      for (std::size_t j = i; j < events_.size(); ++j) events_[keep++] = events_[j];
      events_.resize(keep);
      throw DeviceError(device_error("cudaEventQuery", 0, device_, r.status));
    }
    if (!r.value && !mutant(kMutantCachetPendingIgnoresEvents)) {
      events_[keep++] = events_[i];
      continue;
    }
    event_pool_.release(e);
    if (--b->event_count == 0) free_block(b);
  }
  events_.resize(keep);
  if (cap_.allowed()) trim_to_cap();
}

void CachetPolicy::synchronize_events() {
  if (!active_pools_.empty()) return;  // R12 (callers check it too)
  accounting_.synchronized_all_streams();
  record_deferred_events();
  while (!events_.empty()) {
    auto [e, b] = events_.back();
    Status st = mem_->event_synchronize(e);
    if (!st.is_ok()) throw DeviceError(device_error("cudaEventSynchronize", 0, device_, st));
    events_.pop_back();
    event_pool_.release(e);
    if (--b->event_count == 0) free_block(b);
  }
  if (cap_.allowed()) trim_to_cap();
}

void CachetPolicy::trim_to_cap() {
  if (!cap_.allowed() || base_ == 0 || mutant(kMutantCachetIgnoreCap) || pool_active()) return;
  const Bytes cap_pages = *cap_.allowed() / kPage;
  const Bytes pages = mapped_ / kPage;
  if (pages > cap_pages) unmap_free_pages(pages - cap_pages, 0, 0);
}

// R9; R12: no wait while a pool is active, no unmapping either (unmap_free_pages).
void CachetPolicy::empty_cache() {
  if (active_pools_.empty() && (!events_.empty() || !deferred_.empty())) synchronize_events();
  if (base_ != 0) unmap_free_pages(static_cast<Bytes>(-1) / kPage, 0, 0);
  release_sleeping_free_pages();  // docs/sleep-wake.md section 4
  // Not the pinned buffers a backend keeps between sleeps: empty_cache is about device memory
  // (docs/sleep-wake.md section 6; release_backup_buffers gives them back).
}

// ===================================================================== settings, snapshot

void CachetPolicy::set_memory_fraction(double fraction) {
  cap_.set(fraction, total_memory_);
  trim_to_cap();  // R7: a lowered cap unmaps whole free pages down to it
}

void CachetPolicy::apply_config(const Config& c) {
  const cachet::Policy keep = config_.policy;  // the policy is chosen at construction
  config_ = c;
  config_.policy = keep;
}

Snapshot CachetPolicy::snapshot() {
  Snapshot out = block_table();
  Bytes active = 0;
  for (const auto& s : out)
    for (const auto& b : s.blocks)
      if (b.state != cachet::BlockState::Inactive) active += b.size;
  record(TraceAction::Snapshot, 0, active, 0);
  return out;
}

Snapshot CachetPolicy::block_table() const {
  Snapshot out;
  for (CBlock* b = head_; b != nullptr; b = b->next) {
    if (!b->is_mapped()) continue;
    // A segment: a run of mapped blocks of one pool (R10), with the pool's id.
    // Cut where awake pages meet sleeping ones (docs/sleep-wake.md section 5).
    if (b->prev == nullptr || !b->prev->is_mapped() || b->prev->pool != b->pool || b->prev->asleep != b->asleep) {
      SegmentSnapshot s;
      s.address = b->ptr;
      s.stream = b->stream;
      s.pool_id = b->pool;
      s.is_large = true;
      s.is_expandable = true;
      s.is_sleeping = b->asleep;
      out.push_back(std::move(s));
    }
    SegmentSnapshot& s = out.back();
    s.total_size += b->size;
    if (b->asleep)
      for (const BackupCopy& c : backups_) {
        const DevicePtr lo = std::max(c.ptr, b->ptr), hi = std::min(c.ptr + c.size, b->end());
        if (lo < hi) s.backup_size += hi - lo;
      }
    BlockSnapshot bs;
    bs.address = b->ptr;
    bs.size = b->size;
    bs.requested_size = b->requested;
    bs.state = snapshot_state(b->state());
    s.blocks.push_back(bs);
  }
  return out;
}

// block_table()'s segments and blocks, fed to the digest as they are walked.
std::uint64_t CachetPolicy::snapshot_digest() const {
  SnapshotDigest d;
  const CBlock* first = nullptr;  // the first block of the segment under way
  Bytes total = 0, backup = 0;
  auto end_segment = [&] {
    if (first != nullptr) d.segment(first->ptr, total, first->stream, true, true, first->pool, first->asleep, backup);
    first = nullptr;
    total = backup = 0;
  };
  for (const CBlock* b = head_; b != nullptr; b = b->next) {
    if (!b->is_mapped()) {
      end_segment();
      continue;
    }
    if (b->prev == nullptr || !b->prev->is_mapped() || b->prev->pool != b->pool || b->prev->asleep != b->asleep) {
      end_segment();
      first = b;
    }
    total += b->size;
    if (b->asleep)
      for (const BackupCopy& c : backups_) {
        const DevicePtr lo = std::max(c.ptr, b->ptr), hi = std::min(c.ptr + c.size, b->end());
        if (lo < hi) backup += hi - lo;
      }
    d.block(b->ptr, b->size, b->requested, snapshot_state(b->state()));
  }
  end_segment();
  return d.value();
}

// ===================================================================== checks

CBlock* CachetPolicy::find_active(DevicePtr ptr, const char* op) const {
  return find_active_in(active_, ptr, op, [this](DevicePtr p) { return holder_of(p); });
}

std::optional<BlockAt> CachetPolicy::holder_of(DevicePtr ptr) const {
  if (base_ == 0 || ptr < base_ || ptr >= base_ + va_size_) return std::nullopt;
  for (const CBlock* c = head_; c != nullptr; c = c->next)
    if (ptr >= c->ptr && ptr < c->end()) return BlockAt{c->ptr, c->size, true};  // not active: free
  return std::nullopt;
}

// Only a block's first and last pages can be shared with other live blocks: an interior page
// lies inside the block, so no other live block touches it and its count is not kept (it is
// never asked for: untouched_pages() is only asked about pages that hold a free byte).

// Pages of [lo, hi) that no live block touches. [lo, hi) is free, so only its first and last
// pages can be touched (by the live blocks beside it).
Bytes CachetPolicy::untouched_pages(DevicePtr lo, DevicePtr hi) const {
  const std::size_t first = (lo - base_) / kPage;
  const std::size_t last = (hi - 1 - base_) / kPage;
  Bytes n = last - first + 1;
  if (page_live_[first] != 0) --n;
  if (last != first && page_live_[last] != 0) --n;
  return n;
}

}  // namespace cachet::gpu::detail

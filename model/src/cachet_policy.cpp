// The cachet policy model: construction, the allocate entry point (R2 hot path or the slow
// path), stats, the memory cap (R7) and the snapshot. Rules: cachet/model/cachet_policy.h.
#include "cachet/model/cachet_policy.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "cachet/errors.h"
#include "cachet/model/memory_cap.h"
#include "cachet/summary.h"

namespace cachet::model {

namespace {

StatType pool_of(Bytes size) {
  return size <= kSmallSize ? StatType::SmallPool : StatType::LargePool;
}

void both(StatArray& a, StatType pool, std::int64_t delta) {
  DeviceStats::for_all_and(a, pool, [delta](Stat& s) {
    if (delta >= 0)
      s.increase(delta);
    else
      s.decrease(-delta);
  });
}

}  // namespace

CachetPolicy::CachetPolicy(const Config& config, SegmentSource& source, DeviceIndex device)
    : config_(config), source_(source), device_(device) {
  stats_.max_split_size = config_.max_split_size_stat();
  if (config_.per_process_memory_fraction)
    set_memory_fraction(*config_.per_process_memory_fraction);
}

void CachetPolicy::set_memory_fraction(double fraction) {
  allowed_max_ = memory_cap(fraction, source_.total_memory());
  trim_to_cap();  // R7: a lowered cap unmaps whole free pages down to it
}

void CachetPolicy::trim_to_cap() {
  if (!allowed_max_ || reservation_size_ == 0 || pool_active()) return;  // R12
  const Bytes cap_pages = *allowed_max_ / kCachetPage;
  // Sleeping pages do not count against the cap (docs/sleep-wake.md, section 4).
  if (awake_pages() > cap_pages) unmap_whole_free_pages(awake_pages() - cap_pages, 0, 0);
}

double CachetPolicy::memory_fraction() const {
  if (!allowed_max_) return 1.0;
  return static_cast<double>(*allowed_max_) / static_cast<double>(source_.total_memory());
}

std::uint64_t CachetPolicy::malloc(Bytes orig_size, StreamId stream, ThreadIndex thread) {
  if (orig_size >= kMaxRequest) {
    OomFacts f;
    f.alloc_size = orig_size;
    f.device = device_;
    throw OutOfMemory(f);
  }
  if (orig_size == 0) return 0;
  // R8: pending blocks whose events completed; R12: not while a pool is active.
  if (!pool_active() && (!events_.empty() || !deferred_.empty())) process_events();
  const Bytes size = (orig_size + kCachetBlockAlign - 1) / kCachetBlockAlign * kCachetBlockAlign;
  const PoolId to = route(stream, thread);  // R10
  // From the first allocation under a tag other than "default" on, placement keeps pages
  // tag-homogeneous (docs/sleep-wake.md, SLEEP-R1).
  if (current_tag() != kDefaultTag) tags_seen_ = true;

  std::uint64_t ptr = 0;
  if (auto fit = take_best_fit(stream, to, size))
    ptr = *fit;  // R2
  else
    ptr = allocate_slow(stream, to, size);
  Block& b = blocks_.at(ptr);
  if (asleep(b))  // docs/sleep-wake.md, SLEEP-R2
    throw std::logic_error("[INV-SLEEP-1] cachet model: malloc placed a block on sleeping page " +
                           std::to_string(page_of(ptr)));
  b.set_state(BlockState::Allocated);  // Free -> Allocated
  b.pool = to;  // already its pool (R2, R3 take only the pool's blocks; [INV-PRIV-4] checks)
  b.requested = orig_size;
  b.stream = stream;
  b.uses.clear();
  b.tag = current_tag();  // docs/sleep-wake.md: the block keeps it for its life
  peak_touched_ = std::max<Bytes>(peak_touched_, touched_pages());

  const StatType pool = pool_of(size);
  both(stats_.allocation, pool, 1);
  both(stats_.active, pool, 1);
  both(stats_.allocated_bytes, pool, static_cast<std::int64_t>(size));
  both(stats_.active_bytes, pool, static_cast<std::int64_t>(size));
  both(stats_.requested_bytes, pool, static_cast<std::int64_t>(orig_size));
  record(TraceAction::Alloc, ptr, orig_size, stream);
  return ptr;
}

// The slow path: R3 windows with R4's budget and R5's mapping; R7's one retry, then OOM.
std::uint64_t CachetPolicy::allocate_slow(StreamId stream, PoolId pool, Bytes size) {
  ensure_reserved();
  for (int attempt = 0;; ++attempt) {
    if (auto ptr = try_place(stream, pool, size)) return *ptr;
    if (attempt == 1) {
      ++stats_.num_ooms;
      OomFacts f;
      f.alloc_size = size;
      f.device = device_;
      f.device_free = source_.free_memory();
      f.device_total = source_.total_memory();
      f.process_in_use = source_.process_in_use();
      f.allowed = allowed_max_;
      f.allocated = static_cast<Bytes>(stats_.allocated_bytes[0].current);
      f.reserved = static_cast<Bytes>(stats_.reserved_bytes[0].current);
      record(TraceAction::Oom, f.device_free, size, 0);
      throw OutOfMemory(f);
    }
    // R7: once per allocation: wait for pending events; R2 again (the wait may have freed a
    // block that holds the request); else unmap every whole free page and retry R3. R12: no
    // wait and no unmapping while a pool is active.
    ++stats_.num_alloc_retries;
    if (!pool_active() && (!events_.empty() || !deferred_.empty())) synchronize_events();
    if (auto fit = take_best_fit(stream, pool, size)) return *fit;
    unmap_whole_free_pages(~Bytes{0}, 0, 0);
    // Sleeping pages no live block touches go back too, as in empty_cache (docs/sleep-wake.md
    // section 4: the last retry of an allocation does the same).
    if (!pool_active()) release_sleeping_free_pages();
  }
}

Snapshot CachetPolicy::snapshot() const {
  Snapshot out;
  bool in_run = false;
  for (const auto& [ptr, b] : blocks_) {
    if (!b.mapped()) {
      in_run = false;
      continue;
    }
    // A segment: a run of mapped blocks of one pool (R10), with the pool's id, awake or asleep
    // (docs/sleep-wake.md, section 5).
    const bool sleeping = asleep(b);
    if (in_run && (out.back().pool_id != b.pool || out.back().is_sleeping != sleeping)) in_run = false;
    if (!in_run) {
      SegmentSnapshot s;
      s.address = ptr;
      s.stream = b.stream;
      s.pool_id = b.pool;
      s.is_large = true;
      s.is_expandable = true;
      s.is_sleeping = sleeping;
      out.push_back(std::move(s));
      in_run = true;
    }
    SegmentSnapshot& s = out.back();
    s.total_size += b.size;
    if (sleeping && b.live() && sleeping_pages_.at(page_of(b.ptr)).backed_up) s.backup_size += b.size;
    BlockSnapshot bs;
    bs.address = ptr;
    bs.size = b.size;
    bs.requested_size = b.live() ? b.requested : 0;
    // The snapshot's states (cachet::BlockState); Unmapped blocks are not shown.
    bs.state = b.state() == BlockState::Allocated ? cachet::BlockState::ActiveAllocated
               : b.live()                         ? cachet::BlockState::ActivePendingFree
                                                  : cachet::BlockState::Inactive;
    s.blocks.push_back(bs);
  }
  return out;
}

}  // namespace cachet::model

// The cachet policy (cachet/gpu/policy_cachet.h: design and promises; policy_cachet.h here:
// structures and invariants).
#include "policy_cachet.h"

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <iterator>
#include <stdexcept>
#include <string>

#include "cachet/errors.h"
#include "cachet/summary.h"
#include "messages.h"
#include "mutant.h"

namespace cachet::gpu::detail {

namespace {

constexpr Bytes kPage = kCachetPageSize;

constexpr Bytes align_up(Bytes n, Bytes a) {
  return (n + a - 1) / a * a;
}
constexpr DevicePtr page_floor(DevicePtr p) {
  return p / kPage * kPage;
}
constexpr DevicePtr page_ceil(DevicePtr p) {
  return align_up(p, kPage);
}

StatType pool_of(Bytes size) {
  return size <= kSmallSize ? StatType::SmallPool : StatType::LargePool;
}

template <class F>
void all_and(StatArray& a, StatType pool, F&& f) {
  DeviceStats::for_all_and(a, pool, std::forward<F>(f));
}

bool mapped_block(const CBlock* b) {
  return b != nullptr && b->mapped;
}

// [P1] The pages the policy may keep mapped, given the high-water mark of pages touched by live
// blocks: that mark plus 1/kCachetSlackDivisor of it (rounded down), so that a training step
// that moves a few pages finds them still mapped in the next step.
Bytes budget_pages(Bytes peak_touched) {
  return peak_touched + peak_touched / kCachetSlackDivisor;
}

}  // namespace

CachetPolicy::CachetPolicy(std::unique_ptr<DeviceMemory> memory, const Config& config)
    : Shell(std::move(memory), config) {
  if (!caps_.reserve_va)
    throw UsageError(
        "policy:cachet needs a backend that can reserve and map address space (CUDA VMM or "
        "the host simulation); this backend cannot. Use policy:pytorch or another backend.");
  if (caps_.granularity == 0 || kPage % caps_.granularity != 0)
    throw UsageError(
        "policy:cachet maps 2 MiB pages; this backend's granularity does not divide 2 MiB");
  read_total_memory();
  stats_.max_split_size = config_.max_split_size_stat();
  if (config_.per_process_memory_fraction)
    set_memory_fraction(*config_.per_process_memory_fraction);
}

CachetPolicy::~CachetPolicy() {
  for (auto& [e, b] : events_) mem_->event_destroy(e);
  event_pool_.destroy_all(*mem_);
  // Unmap every run of mapped pages, then give the reservation back; errors cannot be reported.
  DevicePtr run = 0;
  bool in_run = false;
  for (CBlock* b = head_; b != nullptr; b = b->next) {
    if (b->mapped && !in_run) {
      run = b->ptr;
      in_run = true;
    } else if (!b->mapped && in_run) {
      (void)mem_->unmap(run, b->ptr - run);
      in_run = false;
    }
  }
  if (in_run) (void)mem_->unmap(run, base_ + va_size_ - run);
  if (base_ != 0) (void)mem_->unreserve(base_, va_size_);
  free_.clear();
  unmapped_.clear();
}

CBlock* CachetPolicy::make_block() {
  if (spare_.empty()) {
    storage_.push_back(std::make_unique<CBlock[]>(kChunk));
    CBlock* chunk = storage_.back().get();
    for (std::size_t i = kChunk; i-- > 1;) spare_.push_back(&chunk[i]);
    return &chunk[0];
  }
  CBlock* b = spare_.back();
  spare_.pop_back();
  // As a new CBlock, without rebuilding its hook and stream_uses (released blocks are unlinked).
  b->ptr = 0;
  b->size = 0;
  b->requested = 0;
  b->stream = 0;
  b->prev = nullptr;
  b->next = nullptr;
  b->event_count = 0;
  b->state = CBlock::State::Free;
  b->mapped = true;
  b->stream_uses.clear();
  return b;
}

void CachetPolicy::release_block(CBlock* b) {
  spare_.push_back(b);
}

void CachetPolicy::ensure_reserved() {
  if (base_ != 0) return;
  const Bytes n = align_up(std::max<Bytes>(total_memory_, kPage) * kCachetReserveFactor, kPage);
  auto r = mem_->reserve(n);
  if (!r.is_ok()) throw DeviceError(device_error("cuMemAddressReserve", n, device_, r.status));
  base_ = r.value;
  va_size_ = n;
  page_live_.assign(n / kPage, 0);
  CBlock* u = make_block();
  u->ptr = base_;
  u->size = n;
  u->mapped = false;
  head_ = u;
  unmapped_.insert(*u);
}

// ===================================================================== allocate

DevicePtr CachetPolicy::malloc(Bytes orig_size, StreamId stream) {
  if (orig_size >= kMaxRequest) throw_request_too_large(orig_size);
  if (orig_size == 0) return 0;
  check_stream(stream, "allocate");
  if (!events_.empty()) process_events();
  const Bytes size = align_up(orig_size, kCachetAlign);

  CBlock* b = take_best_fit(stream, size);  // hot path (R2)
  if (b == nullptr) b = alloc_slow(stream, size);
  b->state = CBlock::State::Allocated;
  b->requested = orig_size;
  b->stream = stream;
  active_.insert(b->ptr, b);
  touch(b, true);
  peak_touched_pages_ = std::max(peak_touched_pages_, touched_pages_);
  const StatType pool = pool_of(size);
  const auto n = static_cast<std::int64_t>(size);
  const auto req = static_cast<std::int64_t>(orig_size);
  all_and(stats_.allocation, pool, [](Stat& s) { s.increase(1); });
  all_and(stats_.active, pool, [](Stat& s) { s.increase(1); });
  all_and(stats_.allocated_bytes, pool, [n](Stat& s) { s.increase(n); });
  all_and(stats_.active_bytes, pool, [n](Stat& s) { s.increase(n); });
  all_and(stats_.requested_bytes, pool, [req](Stat& s) { s.increase(req); });
  record(TraceAction::Alloc, b->ptr, orig_size, stream);
  return b->ptr;
}

CBlock* CachetPolicy::take_best_fit(StreamId stream, Bytes size) {
  auto it = free_.lower_bound(SizeKey{stream, size, 0}, SizeOrder{});
  if (it == free_.end() || it->stream != stream) return nullptr;
  CBlock* f = &*it;
  // Size-class-aware split: small requests take the high end of the block, large ones the low
  // end, so that small and large blocks collect at opposite ends of free stretches.
  const bool high = size <= kSmallSize && !mutant(kMutantCachetLowEndSmall);
  if (f->size > size) {
    // The new block m is carved at its end of f; f keeps the rest and, when its predecessor in
    // the size order is still smaller, its place in free_ (a shrunk key that keeps the order
    // needs no re-insertion).
    CBlock* m = nullptr;
    if (high) {
      m = split_at(f, f->end() - size);
    } else {
      m = make_block();
      m->size = size;
      m->stream = f->stream;
      m->ptr = f->ptr;
      m->prev = f->prev;
      m->next = f;
      if (f->prev)
        f->prev->next = m;
      else
        head_ = m;
      f->prev = m;
      f->ptr += size;
      f->size -= size;
    }
    if (it != free_.begin() && !SizeOrder{}(*std::prev(it), *f)) {
      free_.erase(it);
      free_.insert(*f);
    }
    return m;
  }
  free_.erase(it);
  return carve(f, high ? f->end() - size : f->ptr, size);
}

CBlock* CachetPolicy::split_at(CBlock* f, DevicePtr at) {
  CBlock* m = make_block();
  m->ptr = at;
  m->size = f->end() - at;
  m->stream = f->stream;
  m->mapped = f->mapped;
  m->prev = f;
  m->next = f->next;
  if (f->next) f->next->prev = m;
  f->next = m;
  f->size = at - f->ptr;
  return m;
}

CBlock* CachetPolicy::carve(CBlock* f, DevicePtr at, Bytes size) {
  if (at > f->ptr) {  // f keeps the low part
    CBlock* m = split_at(f, at);
    free_.insert(*f);
    f = m;
  }
  if (f->size > size) free_.insert(*split_at(f, f->ptr + size));  // the high remainder stays free
  return f;
}

CachetPolicy::Placement CachetPolicy::find_placement(StreamId stream, Bytes size) const {
  Placement best;
  for (const CBlock& u : unmapped_) {
    const CBlock* l = u.prev != nullptr && u.prev->is_mapped_free() && u.prev->stream == stream
                          ? u.prev
                          : nullptr;
    const CBlock* r = u.next != nullptr && u.next->is_mapped_free() && u.next->stream == stream
                          ? u.next
                          : nullptr;
    const DevicePtr ws = l ? l->ptr : u.ptr;
    const DevicePtr we = r ? r->end() : u.end();
    if (we - ws < size) continue;
    // Left aligned at the window's start.
    {
      const DevicePtr hi = std::min<DevicePtr>(u.end(), page_ceil(ws + size));
      const DevicePtr lo = u.ptr;
      const Bytes k = hi > lo ? (hi - lo) / kPage : 0;
      if (k > 0 && (!best.found || k < best.new_pages)) best = Placement{ws, k, true};
    }
    if (r != nullptr) {  // right aligned at the window's end
      const DevicePtr at = we - size;
      const DevicePtr lo = std::max<DevicePtr>(u.ptr, page_floor(at));
      const DevicePtr hi = u.end();
      const Bytes k = hi > lo ? (hi - lo) / kPage : 0;
      if (k > 0 && (!best.found || k < best.new_pages)) best = Placement{at, k, true};
    }
    if (best.found && best.new_pages == 1) break;
  }
  return best;
}

Bytes CachetPolicy::whole_free_pages(DevicePtr ex_lo, DevicePtr ex_hi) const {
  Bytes pages = 0;
  for (const CBlock& b : free_) {
    const DevicePtr lo = page_ceil(b.ptr);
    const DevicePtr hi = page_floor(b.end());
    if (hi <= lo) continue;
    const DevicePtr a_hi = std::min(hi, ex_lo);
    if (a_hi > lo) pages += (a_hi - lo) / kPage;
    const DevicePtr b_lo = std::max(lo, ex_hi);
    if (hi > b_lo) pages += (hi - b_lo) / kPage;
  }
  return pages;
}

Bytes CachetPolicy::collect_free_pages(DevicePtr ex_lo, DevicePtr ex_hi) {
  cands_.clear();
  Bytes pages = 0;
  // Only blocks of at least a page can hold a whole page: per stream, from its first such block.
  for (auto it = free_.lower_bound(SizeKey{0, kPage, 0}, SizeOrder{}); it != free_.end();) {
    CBlock& b = *it;
    if (b.size < kPage) {  // a smaller block of the next stream: skip to its first page-sized one
      it = free_.lower_bound(SizeKey{b.stream, kPage, 0}, SizeOrder{});
      continue;
    }
    ++it;
    DevicePtr lo = page_ceil(b.ptr);
    DevicePtr hi = page_floor(b.end());
    if (hi <= lo) continue;
    // A free block never straddles the excluded range (that range is one placement's window).
    if (lo < ex_hi && hi > ex_lo) {
      if (hi > ex_hi)
        lo = ex_hi;
      else
        hi = std::min(hi, ex_lo);
      if (hi <= lo) continue;
    }
    cands_.push_back({&b, lo, hi});
    pages += (hi - lo) / kPage;
  }
  return pages;
}

Bytes CachetPolicy::unmap_collected(Bytes pages) {
  // R6 order: most whole free pages first (fewest unmap calls), ties by the lowest address; a
  // heap, since usually one or two blocks are taken.
  auto lower = [](const FreeRun& a, const FreeRun& b) {
    return a.hi - a.lo != b.hi - b.lo ? a.hi - a.lo < b.hi - b.lo : a.lo > b.lo;
  };
  std::make_heap(cands_.begin(), cands_.end(), lower);
  Bytes done = 0;
  while (done < pages && !cands_.empty()) {
    std::pop_heap(cands_.begin(), cands_.end(), lower);
    const FreeRun c = cands_.back();
    cands_.pop_back();
    const Bytes take = std::min((c.hi - c.lo) / kPage, pages - done);
    free_.erase(free_.iterator_to(*c.b));
    unmap_range(c.b, c.hi - take * kPage, c.hi);
    done += take;
  }
  cands_.clear();
  return done;
}

Bytes CachetPolicy::unmap_free_pages(Bytes pages, DevicePtr ex_lo, DevicePtr ex_hi) {
  if (pages == 0) return 0;
  collect_free_pages(ex_lo, ex_hi);
  return unmap_collected(pages);
}

void CachetPolicy::run_delta(bool left_mapped, bool right_mapped, bool mapping) {
  int d = 0;
  if (left_mapped && right_mapped)
    d = mapping ? -1 : 1;
  else if (!left_mapped && !right_mapped)
    d = mapping ? 1 : -1;
  if (d > 0) all_and(stats_.segment, StatType::LargePool, [](Stat& s) { s.increase(1); });
  if (d < 0) all_and(stats_.segment, StatType::LargePool, [](Stat& s) { s.decrease(1); });
}

void CachetPolicy::unmap_range(CBlock* b, DevicePtr lo, DevicePtr hi) {
  Status st = mem_->unmap(lo, hi - lo);
  if (!st.is_ok()) {
    free_.insert(*b);
    throw DeviceError(device_error("cuMemUnmap", hi - lo, device_, st));
  }
  ++stats_.num_device_free;
  const auto n = static_cast<std::int64_t>(hi - lo);
  if constexpr (!mutant(kMutantCachetUnmapKeepsReserved))
    all_and(stats_.reserved_bytes, StatType::LargePool, [n](Stat& s) { s.decrease(n); });
  mapped_ -= hi - lo;
  run_delta(lo > b->ptr || mapped_block(b->prev), hi < b->end() || mapped_block(b->next), false);
  record(TraceAction::SegmentUnmap, lo, hi - lo, b->stream);
  // Split b into [b->ptr, lo) mapped, [lo, hi) unmapped, [hi, end) mapped.
  CBlock* mid = carve(b, lo, hi - lo);  // reinserts the mapped pieces into free_
  mid->mapped = false;
  mid->stream = 0;
  merge_free(mid);
}

Status CachetPolicy::map_range(CBlock* u, DevicePtr lo, DevicePtr hi, StreamId stream,
                               CBlock** merged) {
  Status st = mem_->map(lo, hi - lo);
  if (!st.is_ok()) return st;
  ++stats_.num_device_alloc;
  const auto n = static_cast<std::int64_t>(hi - lo);
  all_and(stats_.reserved_bytes, StatType::LargePool, [n](Stat& s) { s.increase(n); });
  mapped_ += hi - lo;
  run_delta(lo == u->ptr && mapped_block(u->prev), hi == u->end() && mapped_block(u->next), true);
  record(TraceAction::SegmentMap, lo, hi - lo, stream);
  unmapped_.erase(unmapped_.iterator_to(*u));
  // Split u into [u->ptr, lo) unmapped, [lo, hi) mapped, [hi, end) unmapped.
  CBlock* mid = u;
  if (lo > u->ptr) {
    mid = split_at(u, lo);
    unmapped_.insert(*u);
  }
  if (mid->end() > hi) unmapped_.insert(*split_at(mid, hi));
  mid->mapped = true;
  mid->stream = stream;
  mid->state = CBlock::State::Free;
  *merged = merge_free(mid);
  return Status::ok();
}

CBlock* CachetPolicy::merge_free(CBlock* b) {
  auto joinable = [b](const CBlock* o) {
    return o != nullptr && o->is_free() && o->mapped == b->mapped &&
           (!b->mapped || mutant(kMutantCachetMergeAcrossStreams) || o->stream == b->stream);
  };
  auto erase = [this](CBlock* o) {
    if (o->mapped)
      free_.erase(free_.iterator_to(*o));
    else
      unmapped_.erase(unmapped_.iterator_to(*o));
  };
  if (CBlock* n = b->next; joinable(n)) {
    erase(n);
    b->size += n->size;
    b->next = n->next;
    if (n->next) n->next->prev = b;
    release_block(n);
  }
  if (CBlock* p = b->prev; joinable(p)) {
    // p grows in place: its place in unmapped_ (address order) holds; in free_ (size order) it
    // holds while its successor is still larger, else p is re-inserted.
    p->size += b->size;
    p->next = b->next;
    if (b->next) b->next->prev = p;
    release_block(b);
    if (p->mapped) {
      auto it = free_.iterator_to(*p);
      if (auto nx = std::next(it); nx != free_.end() && !SizeOrder{}(*p, *nx)) {
        free_.erase(it);
        free_.insert(*p);
      }
    }
    return p;
  }
  if (b->mapped)
    free_.insert(*b);
  else
    unmapped_.insert(*b);
  return b;
}

CBlock* CachetPolicy::alloc_slow(StreamId stream, Bytes size) {
  ensure_reserved();
  bool retried = false;
  for (;;) {
    Placement p = find_placement(stream, size);
    bool fits = p.found;
    Bytes give_back = 0;
    const DevicePtr ex_lo = page_floor(p.at);
    const DevicePtr ex_hi = page_ceil(p.at + size);
    if (fits) {
      // [P1]: keep mapped pages within the budget of the touched high-water mark (counting this
      // block's pages): beyond it, move whole free pages here instead of growing.
      const Bytes after = mapped_ / kPage + p.new_pages;
      const Bytes touched_after = touched_pages_ + untouched_pages(p.at, p.at + size);
      const Bytes t = std::max(peak_touched_pages_, touched_after);
      const Bytes budget = mutant(kMutantCachetSlackEighth) ? t + t / 8 : budget_pages(t);
      Bytes need = after > budget ? after - budget : 0;
      const bool capped = cap_.allowed() && !mutant(kMutantCachetIgnoreCap);
      const Bytes cap_pages = capped ? *cap_.allowed() / kPage : 0;
      if (capped && after > cap_pages) need = std::max(need, after - cap_pages);
      const Bytes avail = need > 0 ? collect_free_pages(ex_lo, ex_hi) : 0;
      if (capped && after > cap_pages && after - cap_pages > avail) fits = false;
      give_back = std::min(need, avail);
    }
    if (fits) {
      if (give_back > 0) unmap_collected(give_back);
      // The new block's range now lies in one unmapped block plus, at its ends, mapped free
      // blocks of `stream`: map the unmapped part.
      auto it = unmapped_.upper_bound(p.at, CAddrOrder{});
      CBlock* u = nullptr;
      if (it != unmapped_.begin()) {
        auto prev = std::prev(it);
        if (prev->end() > p.at) u = &*prev;
      }
      if (u == nullptr) u = &*it;
      const DevicePtr lo = std::max<DevicePtr>(u->ptr, page_floor(p.at));
      const DevicePtr hi = std::min<DevicePtr>(u->end(), page_ceil(p.at + size));
      CBlock* f = nullptr;
      Status st = map_range(u, lo, hi, stream, &f);
      if (st.is_ok()) {
        // The new mapping was merged with the mapped free blocks of `stream` beside it: f holds
        // the whole placement.
        if (f->ptr > p.at || f->end() < p.at + size || !f->is_mapped_free())
          throw std::logic_error("cachet policy: placement not covered after mapping");
        free_.erase(free_.iterator_to(*f));
        CBlock* b = carve(f, p.at, size);
        return b;
      }
      if (!st.is_oom()) throw DeviceError(device_error("cuMemMap", hi - lo, device_, st));
    }
    if (retried) throw_oom(size);
    // R7: once: wait for pending events; a block that freed may hold the request (R2); else
    // give every whole free page back and try the windows once more.
    retried = true;
    ++stats_.num_alloc_retries;
    if (!events_.empty()) synchronize_events();
    if (!mutant(kMutantCachetRetrySkipsBestFit))
      if (CBlock* b = take_best_fit(stream, size)) return b;
    unmap_free_pages(static_cast<Bytes>(-1) / kPage, 0, 0);
  }
}

void CachetPolicy::throw_oom(Bytes size) {
  ++stats_.num_ooms;
  OomFacts f;
  f.alloc_size = size;
  f.device = device_;
  if (auto info = mem_->mem_get_info(); info.is_ok()) {
    f.device_free = info.value.free;
    f.device_total = info.value.total;
    f.process_in_use = info.value.process_used;
  }
  f.allowed = cap_.allowed();
  f.allocated = static_cast<Bytes>(stats_.allocated_bytes[0].current);
  f.reserved = static_cast<Bytes>(stats_.reserved_bytes[0].current);
  record(TraceAction::Oom, f.device_free, size, 0);
  throw OutOfMemory(oom_message(f));
}

// ===================================================================== free and events

void CachetPolicy::free(DevicePtr ptr) {
  if (ptr == 0) return;
  CBlock* b = find_active(ptr, "free");
  if (b->state != CBlock::State::Allocated)
    throw UsageError("free(" + hex(ptr) +
                     "): double free: the block is already freed and waits for its stream uses");
  // Stream uses: create and record one event per using stream before changing anything, so a
  // failing event call reaches the caller with the block still allocated (its stream uses kept)
  // and the stats and trace untouched, as policy:pytorch does (device_allocator.cpp, free()).
  // The events of this call are appended to events_ from `first` on; a failure gives them back
  // to the pool (shell/event_pool.h).
  const std::size_t first = events_.size();
  event_pool_.record_on(*mem_, device_, b->stream_uses, events_,
                        [b](EventHandle e, StreamId) { return std::pair{e, b}; });

  const StatType pool = pool_of(b->size);
  const auto n = static_cast<std::int64_t>(b->size);
  all_and(stats_.allocation, pool, [](Stat& s) { s.decrease(1); });
  all_and(stats_.allocated_bytes, pool, [n](Stat& s) { s.decrease(n); });
  record(TraceAction::FreeRequested, b->ptr, b->requested, b->stream);
  if (b->stream_uses.empty()) {
    free_block(b);
    if (cap_.allowed()) trim_to_cap();
    return;
  }
  b->state = CBlock::State::Pending;
  b->event_count = static_cast<std::int32_t>(events_.size() - first);
  b->stream_uses.clear();
}

void CachetPolicy::free_block(CBlock* b) {
  const StatType pool = pool_of(b->size);
  const auto n = static_cast<std::int64_t>(b->size);
  const auto req = static_cast<std::int64_t>(b->requested);
  all_and(stats_.active, pool, [](Stat& s) { s.decrease(1); });
  all_and(stats_.active_bytes, pool, [n](Stat& s) { s.decrease(n); });
  all_and(stats_.requested_bytes, pool, [req](Stat& s) { s.decrease(req); });
  record(TraceAction::FreeCompleted, b->ptr, b->requested, b->stream);
  active_.erase(b->ptr);
  touch(b, false);
  b->state = CBlock::State::Free;
  b->stream_uses.clear();
  merge_free(b);
}

void CachetPolicy::record_stream(DevicePtr ptr, StreamId stream) {
  check_stream(stream, "record_stream");
  CBlock* b = find_active(ptr, "record_stream");
  if (b->state != CBlock::State::Allocated)
    throw UsageError("record_stream(" + hex(ptr) + ", stream " + std::to_string(stream) +
                     "): the block was already freed; record stream uses before freeing");
  if (stream == b->stream) return;
  if (std::find(b->stream_uses.begin(), b->stream_uses.end(), stream) == b->stream_uses.end())
    b->stream_uses.push_back(stream);
}

void CachetPolicy::process_events() {
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
  ++stats_.num_sync_all_streams;
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
  if (!cap_.allowed() || base_ == 0 || mutant(kMutantCachetIgnoreCap)) return;
  const Bytes cap_pages = *cap_.allowed() / kPage;
  const Bytes pages = mapped_ / kPage;
  if (pages > cap_pages) unmap_free_pages(pages - cap_pages, 0, 0);
}

void CachetPolicy::empty_cache() {
  if (!events_.empty()) synchronize_events();
  if (base_ != 0) unmap_free_pages(static_cast<Bytes>(-1) / kPage, 0, 0);
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
  Snapshot out;
  Bytes active = 0;
  for (CBlock* b = head_; b != nullptr; b = b->next) {
    if (!b->mapped) continue;
    if (b->prev == nullptr || !b->prev->mapped) {
      SegmentSnapshot s;
      s.address = b->ptr;
      s.stream = b->stream;
      s.is_large = true;
      s.is_expandable = true;
      out.push_back(std::move(s));
    }
    SegmentSnapshot& s = out.back();
    s.total_size += b->size;
    BlockSnapshot bs;
    bs.address = b->ptr;
    bs.size = b->size;
    bs.requested_size = b->requested;
    bs.state = b->state == CBlock::State::Allocated ? BlockState::ActiveAllocated
               : b->state == CBlock::State::Pending ? BlockState::ActivePendingFree
                                                    : BlockState::Inactive;
    if (b->state != CBlock::State::Free) active += b->size;
    s.blocks.push_back(bs);
  }
  record(TraceAction::Snapshot, 0, active, 0);
  return out;
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

Bytes CachetPolicy::touched_bytes() const {
  Bytes pages = 0;
  DevicePtr last = 0;  // one past the last page counted
  for (const CBlock* b = head_; b != nullptr; b = b->next) {
    if (b->state == CBlock::State::Free) continue;
    DevicePtr lo = std::max(page_floor(b->ptr), last);
    const DevicePtr hi = page_ceil(b->end());
    if (hi > lo) pages += (hi - lo) / kPage;
    last = std::max(last, hi);
  }
  return pages * kPage;
}

std::vector<std::string> CachetPolicy::invariants() const {
  std::vector<std::string> v;
  auto fail = [&v](std::string s) {
    if (v.size() < 20) v.push_back(std::move(s));
  };
  DeviceStats re;
  Bytes mapped = 0;
  std::size_t n_free = 0, n_unmapped = 0, n_active = 0, n_events = 0;
  std::int64_t runs = 0;
  // [C-4] the trees are in their order (blocks grow and shrink in place when the order holds).
  for (auto it = free_.begin(); it != free_.end() && std::next(it) != free_.end(); ++it)
    if (!SizeOrder{}(*it, *std::next(it)))
      fail("[C-4] free_ out of size order at block " + hex(it->ptr));
  for (auto it = unmapped_.begin(); it != unmapped_.end() && std::next(it) != unmapped_.end(); ++it)
    if (!(it->ptr < std::next(it)->ptr))
      fail("[C-4] unmapped_ out of address order at block " + hex(it->ptr));
  DevicePtr expect = base_;
  const CBlock* prev = nullptr;
  for (const CBlock* b = head_; b != nullptr; prev = b, b = b->next) {
    const std::string at = " (block " + hex(b->ptr) + ")";
    if (b->ptr != expect) fail("[C-1] gap or overlap at " + hex(expect) + at);
    if (b->prev != prev) fail("[C-1] prev link broken" + at);
    expect = b->end();
    if (b->size == 0 || b->size % kCachetAlign != 0 || b->ptr % kCachetAlign != 0)
      fail("[C-2] size/alignment" + at);
    if (b->mapped) {
      mapped += b->size;
      if (prev == nullptr || !prev->mapped) ++runs;
    }
    if (b->state == CBlock::State::Free) {
      if (b->event_count != 0) fail("[C-4] free block with events" + at);
      if (!b->mapped) {
        ++n_unmapped;
        if (b->ptr % kPage != 0 || b->size % kPage != 0)
          fail("[C-3] unmapped block not page aligned" + at);
        if (b->next != nullptr && b->next->is_unmapped())
          fail("[C-3] adjacent unmapped blocks" + at);
        if (auto u = unmapped_.find(b->ptr, CAddrOrder{}); u == unmapped_.end() || &*u != b)
          fail("[C-4] unmapped block not in unmapped_" + at);
      } else {
        ++n_free;
        if (b->next != nullptr && b->next->is_mapped_free() && b->next->stream == b->stream)
          fail("[C-3] adjacent free blocks of one stream" + at);
        auto it = free_.find(SizeKey{b->stream, b->size, b->ptr}, SizeOrder{});
        if (it == free_.end() || &*it != b) fail("[C-4] free block not in free_" + at);
        // A mapped free block touches only mapped pages: its neighbours on shared pages are mapped.
        if (b->ptr % kPage != 0 && b->prev != nullptr && !b->prev->mapped)
          fail("[C-3] free block on an unmapped page" + at);
      }
    } else {
      ++n_active;
      if (!b->mapped) fail("[C-3] active block not mapped" + at);
      if (active_.find(b->ptr) != b) fail("[C-4] active block not in active_" + at);
      if (b->size != align_up(b->requested, kCachetAlign))
        fail("[C-2] size is not the rounded request" + at);
      if ((b->state == CBlock::State::Pending) != (b->event_count > 0))
        fail("[C-4] pending/event_count mismatch" + at);
      n_events += static_cast<std::size_t>(b->event_count);
      const StatType pool = pool_of(b->size);
      const auto n = static_cast<std::int64_t>(b->size);
      const auto req = static_cast<std::int64_t>(b->requested);
      all_and(re.active, pool, [](Stat& s) { s.current += 1; });
      all_and(re.active_bytes, pool, [n](Stat& s) { s.current += n; });
      all_and(re.requested_bytes, pool, [req](Stat& s) { s.current += req; });
      if (b->state == CBlock::State::Allocated) {
        all_and(re.allocation, pool, [](Stat& s) { s.current += 1; });
        all_and(re.allocated_bytes, pool, [n](Stat& s) { s.current += n; });
      }
    }
  }
  if (base_ != 0 && expect != base_ + va_size_)
    fail("[C-1] blocks end at " + hex(expect) + ", not at the reservation's end");
  if (n_free != free_.size())
    fail("[C-4] free_ holds " + std::to_string(free_.size()) + " blocks, " +
         std::to_string(n_free) + " expected");
  if (n_unmapped != unmapped_.size()) fail("[C-4] unmapped_ size mismatch");
  if (n_active != active_.size()) fail("[C-4] active_ size mismatch");
  if (n_events != events_.size()) fail("[C-4] event count mismatch");
  if (mapped != mapped_)
    fail("[C-5] mapped bytes " + std::to_string(mapped) + " != " + std::to_string(mapped_));
  auto cmp = [&](const char* name, const StatArray& got, const StatArray& want) {
    for (int i = 0; i < kNumStatTypes; ++i)
      if (got[i].current != want[i].current)
        fail(std::string("[C-5] ") + name + "[" + std::to_string(i) + "] = " +
             std::to_string(got[i].current) + ", recount " + std::to_string(want[i].current));
  };
  cmp("allocation", stats_.allocation, re.allocation);
  cmp("active", stats_.active, re.active);
  cmp("allocated_bytes", stats_.allocated_bytes, re.allocated_bytes);
  cmp("active_bytes", stats_.active_bytes, re.active_bytes);
  cmp("requested_bytes", stats_.requested_bytes, re.requested_bytes);
  if (stats_.reserved_bytes[0].current != static_cast<std::int64_t>(mapped) ||
      stats_.reserved_bytes[2].current != static_cast<std::int64_t>(mapped) ||
      stats_.reserved_bytes[1].current != 0)
    fail("[C-5] reserved_bytes != mapped bytes " + std::to_string(mapped));
  if (stats_.segment[0].current != runs || stats_.segment[2].current != runs)
    fail("[C-5] segment = " + std::to_string(stats_.segment[0].current) +
         ", runs of mapped pages " + std::to_string(runs));
  if (touched_bytes() != touched_pages_ * kPage)
    fail("[C-7] touched pages " + std::to_string(touched_pages_) + ", recount " +
         std::to_string(touched_bytes() / kPage));
  {
    // Counts are kept for the first and last page of each live block (touch()).
    std::vector<std::uint32_t> live(page_live_.size(), 0);
    for (const CBlock* b = head_; b != nullptr; b = b->next)
      if (b->state != CBlock::State::Free) {
        const std::size_t first = (b->ptr - base_) / kPage, last = (b->end() - 1 - base_) / kPage;
        ++live[first];
        if (last != first) ++live[last];
      }
    if (live != page_live_) fail("[C-7] live-page counts differ from a recount");
  }
  {
    // Free pages split between free blocks of different streams cannot be unmapped (R6).
    const Bytes idle = mapped / kPage - touched_pages_;
    const Bytes whole = whole_free_pages(0, 0);
    const Bytes split = idle > whole ? idle - whole : 0;
    if (mapped / kPage > budget_pages(peak_touched_pages_) + split)
      fail("[P1] " + std::to_string(mapped / kPage) + " pages mapped, budget " +
           std::to_string(budget_pages(peak_touched_pages_)) + " (touched high-water mark " +
           std::to_string(peak_touched_pages_) + ") + " + std::to_string(split) +
           " split free pages");
  }
  // [C-6] = [P3]: reserved <= the cap, or (the cap was lowered below the live blocks' pages) no
  // whole free page left to unmap.
  if (cap_.allowed() && mapped > *cap_.allowed() && whole_free_pages(0, 0) > 0)
    fail("[C-6] reserved " + std::to_string(mapped) + " > cap " + std::to_string(*cap_.allowed()) +
         " with " + std::to_string(whole_free_pages(0, 0)) + " whole free pages still mapped");
  return v;
}

}  // namespace cachet::gpu::detail

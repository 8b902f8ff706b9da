// policy:cachet (CachetPolicy, policy_cachet/policy.h): sleep and wake (issue 24). The rules are
// cachet's own, docs/sleep-wake.md (section numbers below are that file's); written apart from the
// model's (model/src/cachet_policy_sleep.cpp).
//
// The unit is the 2 MiB page. A sleeping block keeps its state, address, size, tag, stream and pool
// and is marked `asleep`; its pages have no memory behind them (one unmap per run of adjacent
// pages put to sleep), stay in the reservation (reserved_bytes, the `segment` runs) and leave
// mapped_ (so R4's budget and R7's cap count awake pages only). A sleeping free block is in no free
// set (no search finds it, SLEEP-R2), is never a placement's neighbour (find_placement) nor a
// candidate of R6 (collect_free_pages walks the free sets), and merges only with sleeping free
// blocks (merge_free). A block is wholly awake or wholly asleep: free blocks are cut where a page
// that sleeps (wakes) meets one that does not, and a live block's pages all carry its tag.
//
// Pages are tag-homogeneous (SLEEP-R1, docs/sleep-wake.md section 2): R2 and R3 place a block only
// where no live block of another tag touches its pages (CachetPolicy::tag_fits, page_tag_), so
// sleep(tags) puts to sleep exactly the awake pages touched by live blocks of the named tags and
// those no live block touches; each sleeping page remembers its tag (sleeping_pages_), and wake(tags)
// wakes the pages of the named tags and those that slept with no live block.
#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "cachet/errors.h"
#include "cachet/summary.h"
#include "messages.h"
#include "mutant.h"
#include "policy_cachet/policy.h"

namespace cachet::gpu::detail {

using namespace cachet_pages;  // policy_cachet/policy.h

int CachetPolicy::sleeping_runs() const {
  int runs = 0;
  for (const CBlock* b = head_; b != nullptr; b = b->next)
    if (b->asleep && (b->prev == nullptr || !b->prev->asleep)) ++runs;
  return runs;
}

namespace {
void set_current(Stat& s, std::int64_t to) {
  if (to > s.current)
    s.increase(to - s.current);
  else if (to < s.current)
    s.decrease(s.current - to);
}

// Runs of adjacent pages, (start, bytes), built from pages given in ascending order.
using PageRuns = std::vector<std::pair<DevicePtr, Bytes>>;
void add_page(PageRuns& runs, DevicePtr page) {
  if (!runs.empty() && runs.back().first + runs.back().second == page)
    runs.back().second += kPage;
  else
    runs.emplace_back(page, kPage);
}
}  // namespace

// [lo, hi) sleeps no more (it woke, or empty_cache gave its pages back).
void CachetPolicy::forget_sleeping_pages(DevicePtr lo, DevicePtr hi) {
  for (DevicePtr a = lo; a < hi; a += kPage) sleeping_pages_.erase(page_index(a));
}

// ===================================================================== sleep (section 3)

Bytes CachetPolicy::sleep(const TagList& tags, const TagList& backup_tags) {
  check_sleep_call("sleep()", tags, &backup_tags);
  if (pool_active())
    throw UsageError("sleep(): a CUDA graph capture or use_mem_pool is under way; end it first (a sleeping range "
                     "must not be captured into a graph)");
  auto slept_tag = [&](std::uint32_t t) { return names_tag(tags, tag_name(t)); };

  // 1. The backups (section 3 step 4): one copy per run of adjacent allocated blocks of one
  //    backed-up tag that sleeps now, decided before anything changes. Live = allocated: the
  //    synchronize of step 3 frees every block that waits for events first, and an allocated
  //    block's pages sleep exactly when its tag is named (SLEEP-R1: they hold no other tag).
  struct Planned {
    std::uint32_t tag;
    BackupCopy copy;  // host: offset into the tag's buffer until the buffer is had
  };
  std::vector<Planned> planned;
  std::map<std::uint32_t, Bytes> need;
  for (const CBlock* b = head_; b != nullptr; b = b->next) {
    if (!b->is_allocated() || b->asleep || !slept_tag(b->tag) || !lists_tag(backup_tags, tag_name(b->tag))) continue;
    if (!planned.empty() && planned.back().tag == b->tag &&
        planned.back().copy.ptr + planned.back().copy.size == b->ptr)
      planned.back().copy.size += b->size;
    else
      planned.push_back({b->tag, {b->ptr, b->size, nullptr}});
    need[b->tag] += b->size;
  }

  // 2. The host memory, all of it before anything changes: one pinned buffer per backed-up tag.
  std::map<std::uint32_t, unsigned char*> buffers = obtain_backup_buffers(need);
  auto free_buffers = [&] {
    for (auto& [t, h] : buffers) mem_->host_free(h);
    buffers.clear();
  };

  // 3. Nothing on the device may still use memory about to go: pending events are waited for as
  //    empty_cache waits for them (R9; none pending, no wait).
  try {
    if (!events_.empty() || !deferred_.empty()) synchronize_events();
  } catch (...) {
    free_buffers();
    throw;
  }

  // 4. The copies, one per run, then one synchronize.
  std::map<std::uint32_t, Bytes> offset;
  for (Planned& p : planned) {
    p.copy.host = buffers.at(p.tag) + offset[p.tag];
    offset[p.tag] += p.copy.size;
    if (Status st = mem_->copy_to_host(p.copy.host, p.copy.ptr, p.copy.size); !st.is_ok()) {
      free_buffers();
      throw DeviceError(device_error("cudaMemcpyAsync (device to host)", p.copy.size, device_, st));
    }
  }
  if (!buffers.empty())
    if (Status st = mem_->copy_synchronize(); !st.is_ok()) {
      free_buffers();
      throw DeviceError(device_error("cudaStreamSynchronize (backup copies)", 0, device_, st));
    }

  // 5. The pages to sleep (section 3 step 3): every awake mapped page touched by a live block of a
  //    named tag, and every awake mapped page no live block touches. page_state: 0 not an awake
  //    mapped page, 1 sleeps, 2 stays awake; live_tag: the live blocks' tag (kNone: none).
  constexpr std::uint32_t kNone = ~std::uint32_t{0};
  const std::size_t npages = base_ == 0 ? 0 : va_size_ / kPage;
  std::vector<unsigned char> page_state(npages, 0);
  std::vector<std::uint32_t> live_tag(npages, kNone);
  for (const CBlock* b = head_; b != nullptr; b = b->next) {
    if (!b->is_mapped() || b->asleep) continue;
    for (std::size_t p = page_index(b->ptr), last = page_index(b->end() - 1); p <= last; ++p) {
      if (page_state[p] == 0) page_state[p] = 1;
      if (!b->is_live()) continue;
      live_tag[p] = b->tag;
      if (!slept_tag(b->tag)) page_state[p] = 2;
    }
  }
  // Free blocks are cut where a page that sleeps meets one that stays awake, so that every block
  // is wholly awake or wholly asleep (a live block's pages all carry its tag: never cut).
  // first_change: the first page of `b` whose state differs from the page before it (0: none).
  auto first_change = [&](const CBlock* b) -> std::size_t {
    for (std::size_t p = page_index(b->ptr) + 1, last = page_index(b->end() - 1); p <= last; ++p)
      if (page_state[p] != page_state[p - 1]) return p;
    return 0;
  };
  std::vector<CBlock*> cut;
  for (CBlock* b = head_; b != nullptr; b = b->next)
    if (b->is_awake_free() && first_change(b) != 0) cut.push_back(b);
  for (CBlock* x : cut) {
    free_set_of(x).erase(free_set_of(x).iterator_to(*x));
    while (x != nullptr) {  // x: not in its free set; each piece goes back in, still awake
      const std::size_t p = first_change(x);
      CBlock* rest = p != 0 ? split_at(x, base_ + p * kPage) : nullptr;
      free_set_of(x).insert(*x);
      x = rest;
    }
  }

  // 6. The memory goes back by the run of adjacent pages that sleep; the addresses stay.
  Bytes given = 0;
  std::vector<CBlock*> ends;  // free blocks at a run's ends: they may join sleeping free neighbours
  auto finish = [&] {
    for (CBlock* x : ends) merge_free(x);
    for (const auto& [t, h] : buffers) backup_buffers_[h] = need.at(t);
    set_current(sleep_stats_.sleeping_segments, sleeping_runs());
  };
  auto sleeps = [&](const CBlock* b) { return b->is_mapped() && !b->asleep && page_state[page_index(b->ptr)] == 1; };
  for (CBlock* b = head_; b != nullptr;) {
    if (!sleeps(b)) {
      b = b->next;
      continue;
    }
    CBlock* first = b;
    Bytes size = 0;
    for (; b != nullptr && sleeps(b); b = b->next) size += b->size;
    if (Status st = mem_->unmap(first->ptr, size); !st.is_ok()) {
      finish();  // the runs before this one sleep with their backups; the rest stays awake
      throw DeviceError(device_error("cuMemUnmap/cuMemRelease", size, device_, st));
    }
    Bytes allocated = 0;
    for (CBlock* x = first; x != b; x = x->next) {
      if (x->is_mapped_free()) {
        free_set_of(x).erase(free_set_of(x).iterator_to(*x));
        if (x == first || x->next == b) ends.push_back(x);
      } else if (x->is_allocated()) {
        allocated += x->size;
      }
      x->asleep = true;
    }
    for (std::size_t p = page_index(first->ptr), last = page_index(first->ptr + size - 1); p <= last; ++p) {
      SleepingPage sp;
      if (live_tag[p] != kNone) {
        sp.tag = live_tag[p];
        sp.has_tag = true;
        sp.backed_up = lists_tag(backup_tags, tag_name(sp.tag));
      }
      sleeping_pages_[p] = sp;
    }
    Bytes backed = 0;
    for (const Planned& p : planned)
      if (p.copy.ptr >= first->ptr && p.copy.ptr < first->ptr + size) {
        backups_.push_back(p.copy);
        backed += p.copy.size;
      }
    mapped_ -= size;
    sleeping_bytes_ += size;
    sleep_stats_.sleeping_bytes.increase(static_cast<std::int64_t>(size));
    sleep_stats_.sleeping_allocated_bytes.increase(static_cast<std::int64_t>(allocated));
    sleep_stats_.backup_bytes.increase(static_cast<std::int64_t>(backed));
    given += size;
  }
  finish();
  ++sleep_stats_.num_sleeps;
  return given;
}

// ===================================================================== while asleep (section 4)

void CachetPolicy::free_while_asleep(CBlock* b) {
  // Its backup goes: cut [b->ptr, b->end()) out of the copies.
  Bytes dropped = 0;
  std::vector<BackupCopy> kept;
  for (const BackupCopy& c : backups_) {
    const DevicePtr lo = std::max(c.ptr, b->ptr), hi = std::min(c.ptr + c.size, b->end());
    if (lo >= hi) {
      kept.push_back(c);
      continue;
    }
    dropped += hi - lo;
    if (c.ptr < lo) kept.push_back({c.ptr, lo - c.ptr, c.host});
    if (hi < c.ptr + c.size) kept.push_back({hi, c.ptr + c.size - hi, c.host + (hi - c.ptr)});
  }
  backups_ = std::move(kept);
  sleep_stats_.backup_bytes.decrease(static_cast<std::int64_t>(dropped));
  sleep_stats_.sleeping_allocated_bytes.decrease(static_cast<std::int64_t>(b->size));
  ++sleep_stats_.num_frees_while_asleep;
  // A free as any other (stats, trace, merging with its sleeping free neighbours), with no
  // stream-use event: nothing runs on memory that is not there.
  accounting_.free_requested(pool_of(b->size), b->size, false);
  record(TraceAction::FreeRequested, b->ptr, b->requested, b->stream);
  b->stream_uses.clear();
  free_block(b);
  set_current(sleep_stats_.sleeping_segments, sleeping_runs());
}

// R9 for sleeping pages (section 4): every sleeping page that no live block touches and that holds
// only blocks of the default pool (a private pool's pages are its users', R10) becomes unmapped:
// its memory went at the sleep, so only the bookkeeping changes (no device call); one
// segment_unmap and one num_device_free per run of adjacent such pages, as R6's unmapping counts
// them. Pinned buffers no copy lies in any more go.
void CachetPolicy::release_sleeping_free_pages() {
  if (sleeping_bytes_ == 0 || pool_active()) return;
  // The pages that may go: sleeping, and every block touching them free and of the default pool.
  std::map<std::size_t, bool> gone;  // sleeping page -> may go
  for (const auto& [p, sp] : sleeping_pages_) gone.emplace(p, true);
  for (const CBlock* b = head_; b != nullptr; b = b->next) {
    if (!b->asleep || (b->is_mapped_free() && b->pool.is_default())) continue;
    for (std::size_t p = page_index(b->ptr), last = page_index(b->end() - 1); p <= last; ++p) gone[p] = false;
  }
  PageRuns runs;  // ascending
  for (const auto& [p, ok] : gone)
    if (ok) add_page(runs, base_ + p * kPage);
  if (runs.empty()) return;
  CBlock* b = head_;
  for (const auto& [lo, n] : runs) {
    const DevicePtr hi = lo + n;
    while (b->end() <= lo) b = b->next;
    // The run's blocks (sleeping free blocks of the default pool; the ones reaching past it are
    // cut, their outer parts stay asleep) become one unmapped block.
    if (b->ptr < lo) b = split_at(b, lo);
    CBlock* last = b;
    while (last->end() < hi) last = last->next;
    if (last->end() > hi) split_at(last, hi);
    accounting_.pages_unmapped(StatType::LargePool, hi - lo,
                               run_delta(mapped_block(b->prev), mapped_block(last->next), false));
    record(TraceAction::SegmentUnmap, lo, hi - lo, b->stream);
    while (b->end() < hi) {  // b takes the run's next blocks
      CBlock* n = b->next;
      b->size += n->size;
      b->next = n->next;
      if (n->next) n->next->prev = b;
      release_block(n);
    }
    b->set_state(BlockState::Unmapped);
    b->asleep = false;
    b->stream = 0;
    b->pool = PoolId{};
    b = merge_free(b);
    forget_sleeping_pages(lo, hi);
    sleeping_bytes_ -= hi - lo;
    sleep_stats_.sleeping_bytes.decrease(static_cast<std::int64_t>(hi - lo));
    set_current(sleep_stats_.sleeping_segments, sleeping_runs());  // run by run (a run may split one)
  }
  free_unused_backup_buffers();
}

void CachetPolicy::free_unused_backup_buffers() {
  for (auto it = backup_buffers_.begin(); it != backup_buffers_.end();) {
    auto* h = static_cast<unsigned char*>(it->first);
    const bool held = std::any_of(backups_.begin(), backups_.end(),
                                  [&](const BackupCopy& c) { return c.host >= h && c.host < h + it->second; });
    if (held) {
      ++it;
      continue;
    }
    mem_->host_free(h);
    it = backup_buffers_.erase(it);
  }
}

// ===================================================================== wake (section 4)

void CachetPolicy::wake(const TagList& tags) {
  check_sleep_call("wake()", tags, nullptr);
  // The pages that wake: those of a named tag, and those that slept with no live block.
  PageRuns runs;  // ascending
  for (const auto& [p, sp] : sleeping_pages_)
    if (!sp.has_tag || names_tag(tags, tag_name(sp.tag))) add_page(runs, base_ + p * kPage);
  if (runs.empty()) {  // nothing of these tags asleep: nothing to do (section 4)
    ++sleep_stats_.num_wakes;
    return;
  }
  Bytes bytes = 0;
  for (const auto& r : runs) bytes += r.second;
  auto refuse = [&](const std::string& why) {
    ++sleep_stats_.num_wake_ooms;
    throw OutOfMemory("wake(): out of memory: waking needs " + std::to_string(bytes) + " bytes (" + format_size(bytes) +
                      ") of device memory, and " + why +
                      "; everything stays asleep with its backups: free memory and wake again");
  };
  // The cap first (it counts awake pages only), then the memory of every run before any backup
  // is restored; a refusal unmaps what this call mapped.
  if (const auto cap = cap_.allowed(); cap && !mutant(kMutantCachetIgnoreCap) && (mapped_ + bytes) / kPage > *cap / kPage)
    refuse("the memory cap of " + std::to_string(*cap) + " bytes allows " +
           std::to_string(*cap - std::min(*cap, mapped_)) + " more");
  for (std::size_t i = 0; i < runs.size(); ++i) {
    Status st = mem_->map_pieces(runs[i].first, runs[i].second);
    if (st.is_ok()) continue;
    for (std::size_t j = 0; j < i; ++j) (void)mem_->unmap(runs[j].first, runs[j].second);
    if (st.is_oom())
      refuse("the device refused " + std::to_string(runs[i].second) + " bytes at " + hex(runs[i].first) + " (" +
             st.message + ")");
    throw DeviceError(device_error("cuMemCreate/cuMemMap (wake)", runs[i].second, device_, st));
  }
  auto woken = [&](DevicePtr p) {  // p lies in a run that wakes
    auto it = std::upper_bound(runs.begin(), runs.end(), p,
                               [](DevicePtr a, const std::pair<DevicePtr, Bytes>& r) { return a < r.first; });
    return it != runs.begin() && p < std::prev(it)->first + std::prev(it)->second;
  };
  // The backups of the woken pages back (a copy lies on the pages of one tag: wholly woken or
  // not), one copy per run, one synchronize.
  bool copied = false;
  Bytes restored = 0;
  std::vector<BackupCopy> kept;
  for (const BackupCopy& c : backups_) {
    if (!woken(c.ptr)) {
      kept.push_back(c);
      continue;
    }
    restored += c.size;
    if (mutant(kMutantBackupNotRestored)) continue;  // planted: mapped but not restored
    copied = true;
    if (Status st = mem_->copy_to_device(c.ptr, c.host, c.size); !st.is_ok())
      throw DeviceError(device_error("cudaMemcpyAsync (host to device)", c.size, device_, st));
  }
  if (copied)
    if (Status st = mem_->copy_synchronize(); !st.is_ok())
      throw DeviceError(device_error("cudaStreamSynchronize (restore copies)", 0, device_, st));
  backups_ = std::move(kept);
  free_unused_backup_buffers();
  // Awake: a sleeping free block is cut where a page that wakes meets one still asleep; the woken
  // free blocks return to their pool's free set, merging with awake free neighbours as a free
  // would.
  Bytes allocated = 0;
  std::vector<CBlock*> frees;
  CBlock* b = head_;
  for (const auto& [lo, n] : runs) {
    const DevicePtr hi = lo + n;
    while (b->end() <= lo) b = b->next;
    if (b->ptr < lo) b = split_at(b, lo);  // a sleeping free block: its part before lo sleeps on
    for (;; b = b->next) {
      if (b->end() > hi) split_at(b, hi);
      b->asleep = false;
      if (b->is_mapped_free())
        frees.push_back(b);
      else if (b->is_allocated())
        allocated += b->size;
      if (b->end() == hi) break;
    }
    forget_sleeping_pages(lo, hi);
  }
  for (CBlock* b : frees) merge_free(b);
  mapped_ += bytes;
  sleeping_bytes_ -= bytes;
  set_current(sleep_stats_.sleeping_segments, sleeping_runs());
  sleep_stats_.sleeping_bytes.decrease(static_cast<std::int64_t>(bytes));
  sleep_stats_.sleeping_allocated_bytes.decrease(static_cast<std::int64_t>(allocated));
  sleep_stats_.backup_bytes.decrease(static_cast<std::int64_t>(restored));
  ++sleep_stats_.num_wakes;
  // R4 as at the end of a capture (R12): free pages beyond budget(T) are unmapped again.
  if (!pool_active()) trim_to_budget();
}

TagList CachetPolicy::sleeping() const {
  std::set<std::uint32_t> tags;
  for (const auto& [p, sp] : sleeping_pages_)
    if (sp.has_tag) tags.insert(sp.tag);
  TagList out;
  for (std::uint32_t t : tags) out.push_back(tag_name(t));
  std::sort(out.begin(), out.end());
  return out;
}

// Step 1's sum without its copies: every allocated, awake block of a backed-up tag.
std::map<std::uint32_t, Bytes> CachetPolicy::backup_need(const TagList& backup_tags) const {
  std::map<std::uint32_t, Bytes> need;
  for (const CBlock* b = head_; b != nullptr; b = b->next)
    if (b->is_allocated() && !b->asleep && lists_tag(backup_tags, tag_name(b->tag))) need[b->tag] += b->size;
  return need;
}

}  // namespace cachet::gpu::detail

// policy:cachet (CachetPolicy, policy_cachet/policy.h; design and promises:
// cachet/gpu/policy_cachet.h): invariants(): the rules of docs/invariants.md whose policy is cachet
// or both, each violation starting with its ID; and what it calls (never mutated: built once,
// without mutant.h, so the checker stays the real one).
#include <algorithm>
#include <cstring>
#include <iterator>
#include <map>
#include <stdexcept>
#include <string>

#include "cachet/errors.h"
#include "cachet/summary.h"
#include "messages.h"
#include "policy_cachet/policy.h"

namespace cachet::gpu::detail {

using namespace cachet_pages;  // policy_cachet/policy.h

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


Bytes CachetPolicy::touched_bytes() const {
  Bytes pages = 0;
  DevicePtr last = 0;  // one past the last page counted
  for (const CBlock* b = head_; b != nullptr; b = b->next) {
    if (b->is_reusable()) continue;
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
  Bytes mapped = 0;  // mapped pages, sleeping ones included (reserved_bytes, `segment` runs)
  Bytes awake = 0;   // mapped pages with memory behind them (mapped_; R4's budget, R7's cap)
  Bytes asleep = 0, asleep_allocated = 0;
  std::int64_t asleep_runs = 0;
  std::size_t n_free = 0, n_unmapped = 0, n_active = 0, n_events = 0;
  std::int64_t runs = 0;
  // [INV-POOL-2] the trees are in their order (blocks grow and shrink in place when the order
  // holds).
  auto in_order = [&](const CFreeSet& fs, const char* which) {
    for (auto it = fs.begin(); it != fs.end() && std::next(it) != fs.end(); ++it)
      if (!SizeOrder{}(*it, *std::next(it)))
        fail(std::string("[INV-POOL-2] ") + which + " out of size order at block " + hex(it->ptr));
  };
  in_order(free_, "free_");
  std::size_t free_in_sets = free_.size();
  for (const auto& [id, pool] : pools_) {
    in_order(pool.free, "a private pool's free set");
    free_in_sets += pool.free.size();
  }
  std::map<PoolId, Bytes> pool_bytes;  // [INV-PRIV-4] recount
  std::map<PoolId, int> pool_live;     // live blocks per private pool
  auto is_deferred = [this](const CBlock* b) {
    return std::find(deferred_.begin(), deferred_.end(), b) != deferred_.end();
  };
  for (auto it = unmapped_.begin(); it != unmapped_.end() && std::next(it) != unmapped_.end(); ++it)
    if (!(it->ptr < std::next(it)->ptr))
      fail("[INV-POOL-2] unmapped_ out of address order at block " + hex(it->ptr));
  DevicePtr expect = base_;
  const CBlock* prev = nullptr;
  for (const CBlock* b = head_; b != nullptr; prev = b, b = b->next) {
    const auto at = [b] { return " (block " + hex(b->ptr) + ")"; };  // formatted only on failure
    if (b->ptr != expect) fail("[INV-SEG-1] gap or overlap at " + hex(expect) + at());
    if (b->prev != prev) fail("[INV-SEG-2] prev link broken" + at());
    expect = b->end();
    if (b->size == 0 || b->size % kCachetAlign != 0 || b->ptr % kCachetAlign != 0)
      fail("[INV-SIZE-1] size/alignment" + at());
    if (b->is_mapped()) {
      mapped += b->size;
      if (!b->asleep) awake += b->size;
      if (prev == nullptr || !prev->is_mapped()) ++runs;
    }
    // [INV-SLEEP-1] a sleeping block is mapped (its pages reserved), shares no page with an awake
    // block, and (free) is in no free set: no search can find it.
    if (b->asleep) {
      asleep += b->size;
      if (b->is_allocated()) asleep_allocated += b->size;
      if (prev == nullptr || !prev->asleep) ++asleep_runs;
      if (b->is_unmapped()) fail("[INV-SLEEP-1] unmapped block marked asleep" + at());
      if ((b->ptr % kPage != 0 && (prev == nullptr || !prev->asleep)) ||
          (b->end() % kPage != 0 && (b->next == nullptr || !b->next->asleep)))
        fail("[INV-SLEEP-1] sleeping block shares a page with an awake block" + at());
      if (b->is_mapped_free()) {
        const CFreeSet& fs = b->pool.is_default() ? free_ : pools_.count(b->pool) ? pools_.at(b->pool).free : free_;
        auto it = fs.find(SizeKey{b->stream, b->size, b->ptr}, SizeOrder{});
        if (it != fs.end() && &*it == b) fail("[INV-SLEEP-1] sleeping free block in a free set" + at());
      }
      if (b->is_live() && !b->is_allocated()) fail("[INV-SLEEP-1] sleeping block waits for events" + at());
    }
    // The state against the other fields (shell/block_state.h).
    if (!b->is_allocated() && b->state() != BlockState::Deferred && !b->stream_uses.empty())
      fail("[INV-EVENT-3] stream uses on a block that is neither allocated nor deferred" + at());
    // [INV-PRIV-3]: which pool a block may belong to (R10, R11).
    if (!b->pool.is_default()) {
      pool_bytes[b->pool] += b->size;
      if (b->is_live()) ++pool_live[b->pool];
      auto p = pools_.find(b->pool);
      if (b->is_unmapped())
        fail("[INV-PRIV-3] unmapped block with a pool" + at());
      else if (p == pools_.end())
        fail("[INV-PRIV-3] block of an unknown pool" + at());
      else if (b->is_mapped_free() && p->second.use_count <= 0)
        fail("[INV-PRIV-3] free block of a pool with no user" + at());
    }
    if (b->is_reusable()) {
      if (b->event_count != 0) fail("[INV-EVENT-1] free block with events" + at());
      if (b->is_unmapped()) {
        ++n_unmapped;
        if (b->ptr % kPage != 0 || b->size % kPage != 0)
          fail("[INV-MAP-3] unmapped block not page aligned" + at());
        if (b->next != nullptr && b->next->is_unmapped())
          fail("[INV-MERGE-1] adjacent unmapped blocks" + at());
        if (auto u = unmapped_.find(b->ptr, CAddrOrder{}); u == unmapped_.end() || &*u != b)
          fail("[INV-POOL-1] unmapped block not in unmapped_" + at());
        if (active_.find(b->ptr) == b) fail("[INV-MAP-1] unmapped block in active_" + at());
      } else if (b->asleep) {
        if (b->next != nullptr && b->next->is_mapped_free() && b->next->asleep && b->next->stream == b->stream &&
            b->next->pool == b->pool)
          fail("[INV-MERGE-1] adjacent sleeping free blocks of one stream and pool" + at());
      } else {
        ++n_free;
        if (b->next != nullptr && b->next->is_awake_free() && b->next->stream == b->stream &&
            b->next->pool == b->pool)
          fail("[INV-MERGE-1] adjacent free blocks of one stream and pool" + at());
        auto p = b->pool.is_default() ? pools_.end() : pools_.find(b->pool);
        const CFreeSet* fs = b->pool.is_default() ? &free_ : p != pools_.end() ? &p->second.free : nullptr;
        auto it = fs ? fs->find(SizeKey{b->stream, b->size, b->ptr}, SizeOrder{}) : free_.end();
        if (fs == nullptr || it == fs->end() || &*it != b)
          fail("[INV-POOL-1] free block not in its pool's free set" + at());
        // A mapped free block touches only mapped pages: its neighbours on shared pages are mapped.
        if (b->ptr % kPage != 0 && b->prev != nullptr && !b->prev->is_mapped())
          fail("[INV-MAP-4] free block on an unmapped page" + at());
      }
    } else {
      ++n_active;
      if (active_.find(b->ptr) != b) fail("[INV-POOL-1] active block not in active_" + at());
      if (b->size != align_up(b->requested, kCachetAlign))
        fail("[INV-SIZE-4] size is not the rounded request" + at());
      if ((b->state() == BlockState::AwaitingEvents) != (b->event_count > 0))
        fail("[INV-EVENT-1] pending/event_count mismatch" + at());
      // A deferred block waits in deferred_ with its stream uses and no event yet (R12).
      if ((b->state() == BlockState::Deferred) != is_deferred(b) ||
          (b->state() == BlockState::Deferred && b->stream_uses.empty()))
        fail("[INV-EVENT-1] deferred block not in deferred_, or without stream uses" + at());
      n_events += static_cast<std::size_t>(b->event_count);
      const StatType pool = pool_of(b->size);
      const auto n = static_cast<std::int64_t>(b->size);
      const auto req = static_cast<std::int64_t>(b->requested);
      all_and(re.active, pool, [](Stat& s) { s.current += 1; });
      all_and(re.active_bytes, pool, [n](Stat& s) { s.current += n; });
      all_and(re.requested_bytes, pool, [req](Stat& s) { s.current += req; });
      if (b->is_allocated()) {
        all_and(re.allocation, pool, [](Stat& s) { s.current += 1; });
        all_and(re.allocated_bytes, pool, [n](Stat& s) { s.current += n; });
      }
    }
  }
  if (base_ != 0 && expect != base_ + va_size_)
    fail("[INV-SEG-1] blocks end at " + hex(expect) + ", not at the reservation's end");
  if (n_free != free_in_sets)
    fail("[INV-POOL-1] the free sets hold " + std::to_string(free_in_sets) + " blocks, " +
         std::to_string(n_free) + " expected");
  for (const auto& [id, pool] : pools_) {
    const std::string which = " of pool {" + std::to_string(id.first) + ", " + std::to_string(id.second) + "}";
    if (pool.use_count < 0) fail("[INV-PRIV-3] negative use count" + which);
    if (pool.use_count == 0 && pool_live[id] == 0) fail("[INV-PRIV-3] no user and no live block" + which);
    if (pool.bytes != pool_bytes[id])
      fail("[INV-PRIV-4] " + std::to_string(pool.bytes) + " bytes counted, blocks hold " +
           std::to_string(pool_bytes[id]) + which);
  }
  if (n_unmapped != unmapped_.size()) fail("[INV-POOL-1] unmapped_ size mismatch");
  if (n_active != active_.size()) fail("[INV-POOL-1] active_ size mismatch");
  if (n_events != events_.size()) fail("[INV-EVENT-2] event count mismatch");
  if (awake != mapped_)
    fail("[INV-STATS-1] awake mapped bytes " + std::to_string(awake) + " != " + std::to_string(mapped_));
  {
    // [INV-SLEEP-2] the sleep stats against a recount.
    const SleepStats& ss = sleep_stats_;
    Bytes backed = 0;
    for (const BackupCopy& c : backups_) backed += c.size;
    if (asleep != sleeping_bytes_ || ss.sleeping_bytes.current != static_cast<std::int64_t>(asleep) ||
        ss.sleeping_segments.current != asleep_runs ||
        ss.sleeping_allocated_bytes.current != static_cast<std::int64_t>(asleep_allocated) ||
        ss.backup_bytes.current != static_cast<std::int64_t>(backed))
      fail("[INV-SLEEP-2] sleep stats (" + std::to_string(ss.sleeping_segments.current) + " runs, " +
           std::to_string(ss.sleeping_bytes.current) + " bytes, " + std::to_string(ss.sleeping_allocated_bytes.current) +
           " allocated, " + std::to_string(ss.backup_bytes.current) + " backed up) != recount (" +
           std::to_string(asleep_runs) + ", " + std::to_string(asleep) + ", " + std::to_string(asleep_allocated) + ", " +
           std::to_string(backed) + ")");
  }
  {
    // [INV-SLEEP-3] pages are tag-homogeneous (SLEEP-R1): the live blocks touching one page carry
    // one tag, the one page_tag_ keeps for a live block's end pages (from the first tag on); a
    // sleeping page is in sleeping_pages_ (and no other), with the tag of its live blocks.
    // The live blocks touching one page follow each other in address order, and only a block's
    // first page can be shared with the live blocks before it: the tag of the last page of the
    // last live block is all there is to compare with.
    std::size_t tag_page = ~std::size_t{0};  // the last page of the last live block
    std::uint32_t page_tag = 0;              // the tag of the live blocks on tag_page
    std::size_t asleep_pages = 0;
    std::size_t last_asleep = ~std::size_t{0};
    for (const CBlock* b = head_; b != nullptr; b = b->next) {
      const std::size_t first = page_index(b->ptr), last = page_index(b->end() - 1);
      if (b->asleep)
        for (std::size_t p = first; p <= last; ++p) {
          if (p != last_asleep) ++asleep_pages;
          last_asleep = p;
          const auto sp = sleeping_pages_.find(p);
          if (sp == sleeping_pages_.end())
            fail("[INV-SLEEP-3] sleeping block on page " + std::to_string(p) + " not in the sleeping pages (block " +
                 hex(b->ptr) + ")");
          else if (b->is_live() && (!sp->second.has_tag || sp->second.tag != b->tag))
            fail("[INV-SLEEP-3] sleeping page " + std::to_string(p) + " does not carry the tag '" + tag_name(b->tag) +
                 "' of its live block " + hex(b->ptr));
        }
      if (!b->is_live()) continue;
      if (first == tag_page && page_tag != b->tag)
        fail("[INV-SLEEP-3] page " + std::to_string(first) + " is touched by live blocks of the tags '" +
             tag_name(page_tag) + "' and '" + tag_name(b->tag) + "' (block " + hex(b->ptr) + ")");
      if (first != tag_page || last != first) page_tag = b->tag;  // (a shared page keeps the first tag)
      tag_page = last;
      for (std::size_t p : {first, last}) {
        if (tags_seen() && page_tag_[p] != b->tag)
          fail("[INV-SLEEP-3] page " + std::to_string(p) + " keeps the tag '" + tag_name(page_tag_[p]) +
               "', its live block " + hex(b->ptr) + " has '" + tag_name(b->tag) + "'");
      }
    }
    if (asleep_pages != sleeping_pages_.size())
      fail("[INV-SLEEP-3] " + std::to_string(sleeping_pages_.size()) + " sleeping pages kept, blocks sleep on " +
           std::to_string(asleep_pages));
  }
  auto cmp = [&](const char* name, const StatArray& got, const StatArray& want) {
    for (int i = 0; i < kNumStatTypes; ++i)
      if (got[i].current != want[i].current)
        fail(std::string("[INV-STATS-1] ") + name + "[" + std::to_string(i) + "] = " +
             std::to_string(got[i].current) + ", recount " + std::to_string(want[i].current));
  };
  cmp("allocation", stats().allocation, re.allocation);
  cmp("active", stats().active, re.active);
  cmp("allocated_bytes", stats().allocated_bytes, re.allocated_bytes);
  cmp("active_bytes", stats().active_bytes, re.active_bytes);
  cmp("requested_bytes", stats().requested_bytes, re.requested_bytes);
  if (stats().reserved_bytes[0].current != static_cast<std::int64_t>(mapped) ||
      stats().reserved_bytes[2].current != static_cast<std::int64_t>(mapped) ||
      stats().reserved_bytes[1].current != 0)
    fail("[INV-STATS-1] reserved_bytes != mapped bytes " + std::to_string(mapped));
  if (stats().segment[0].current != runs || stats().segment[2].current != runs)
    fail("[INV-STATS-1] segment = " + std::to_string(stats().segment[0].current) +
         ", runs of mapped pages " + std::to_string(runs));
  if (touched_pages_ > peak_touched_pages_)
    fail("[INV-PAGE-2] touched pages " + std::to_string(touched_pages_) +
         " above their high-water mark " + std::to_string(peak_touched_pages_));
  if (touched_bytes() != touched_pages_ * kPage)
    fail("[INV-PAGE-1] touched pages " + std::to_string(touched_pages_) + ", recount " +
         std::to_string(touched_bytes() / kPage));
  {
    // Counts are kept for the first and last page of each live block (touch()): the recount at
    // those pages (in address order, a page's counts come together), 0 at every other page
    // (compared as memory: the reservation has thousands of pages).
    static const std::uint32_t kZeros[1024] = {};
    auto zero = [this](std::size_t lo, std::size_t hi) {  // page_live_[lo, hi) all 0
      for (std::size_t n; lo < hi; lo += n) {
        n = std::min<std::size_t>(hi - lo, std::size(kZeros));
        if (std::memcmp(&page_live_[lo], kZeros, n * sizeof kZeros[0]) != 0) return false;
      }
      return true;
    };
    bool same = true;
    std::size_t page = 0, n = 0, next = 0;  // the page recounted (n blocks so far), the first not compared
    auto flush = [&] {
      if (n == 0) return;
      same = same && page < page_live_.size() && zero(next, page) && page_live_[page] == n;
      next = page + 1;
    };
    auto at = [&](std::size_t p) {
      if (p != page || n == 0) {
        flush();
        page = p;
        n = 0;
      }
      ++n;
    };
    for (const CBlock* b = head_; b != nullptr; b = b->next)
      if (b->is_live()) {
        const std::size_t first = (b->ptr - base_) / kPage, last = (b->end() - 1 - base_) / kPage;
        at(first);
        if (last != first) at(last);
      }
    flush();
    if (!same || !zero(std::min(next, page_live_.size()), page_live_.size()))
      fail("[INV-PAGE-1] live-page counts differ from a recount");
  }
  if (!pool_active()) {
    // [INV-BUDGET-1]; free pages split between free blocks of different streams, or held by a
    // private pool with a user, cannot be unmapped (R6, R10). Not while a pool is active (R12).
    // Pages touched by live blocks on awake pages (sleeping pages are whole: no page is shared).
    Bytes awake_touched = 0;
    DevicePtr last = 0;
    for (const CBlock* b = head_; b != nullptr; b = b->next) {
      if (b->is_reusable() || b->asleep) continue;
      const DevicePtr lo = std::max(page_floor(b->ptr), last), hi = page_ceil(b->end());
      if (hi > lo) awake_touched += (hi - lo) / kPage;
      last = std::max(last, hi);
    }
    const Bytes idle = awake / kPage > awake_touched ? awake / kPage - awake_touched : 0;
    const Bytes whole = whole_free_pages(0, 0);
    const Bytes split = idle > whole ? idle - whole : 0;
    if (awake / kPage > budget_pages(peak_touched_pages_) + split)
      fail("[INV-BUDGET-1] " + std::to_string(awake / kPage) + " pages mapped, budget " +
           std::to_string(budget_pages(peak_touched_pages_)) + " (touched high-water mark " +
           std::to_string(peak_touched_pages_) + ") + " + std::to_string(split) +
           " split free pages");
  }
  // [INV-CAP-1]: reserved <= the cap, or (the cap was lowered below the live blocks' pages) no
  // whole free page left to unmap.
  // Sleeping pages are left out (docs/sleep-wake.md, SLEEP-R5).
  if (cap_.allowed() && !pool_active() && awake > *cap_.allowed() && whole_free_pages(0, 0) > 0)
    fail("[INV-CAP-1] reserved minus sleeping " + std::to_string(awake) + " > cap " +
         std::to_string(*cap_.allowed()) + " with " + std::to_string(whole_free_pages(0, 0)) +
         " whole free pages still mapped");
  return v;
}

}  // namespace cachet::gpu::detail

// Sleep and wake in the model of policy:cachet (issue 24). The rules are cachet's own,
// docs/sleep-wake.md; the unit is the 2 MiB page (the reservation is the policy's one segment,
// R1). A sleeping page keeps its blocks, addresses and stats and stays in mapped_pages_ (reserved:
// reserved_bytes and segment do not move); its memory goes back through the source's unmap and
// comes again through its map, one call per run of adjacent pages. While it sleeps no search
// takes its free blocks (best_fit, find_window), no awake block merges with its blocks, R6 does
// not unmap it, and R4 and R7 count only the awake pages (the memory a sleep gave back can be
// used by other tags under the same cap).
//
// Pages are tag-homogeneous (SLEEP-R1): a block is placed only where every page it touches is
// awake and touched by no live block of another tag (placeable). Free blocks never span an awake
// and a sleeping page (split_at_sleep_edges), so every block is wholly awake or wholly asleep.
#include <algorithm>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "cachet/errors.h"
#include "cachet/model/cachet_policy.h"

namespace cachet::model {

bool CachetPolicy::placeable(std::uint64_t lo, std::uint64_t hi) const {
  if (sleeping_pages_.empty() && !tags_seen_) return true;
  const std::uint64_t first = page_of(lo), last = page_of(hi - 1);
  for (std::uint64_t p = first; p <= last; ++p)
    if (sleeping_pages_.count(p) != 0) return false;
  if (!tags_seen_) return true;  // every live block is "default", and so is this one
  const Tag& tag = current_tag();
  // The blocks overlapping [page_addr(first), page_addr(last + 1)).
  auto it = blocks_.upper_bound(page_addr(first));
  if (it != blocks_.begin()) --it;
  for (; it != blocks_.end() && it->first < page_addr(last + 1); ++it)
    if (it->second.live() && it->second.end() > page_addr(first) && it->second.tag != tag)
      return false;
  return true;
}

void CachetPolicy::split_at_sleep_edges() {
  std::vector<std::uint64_t> cut;
  for (const auto& [ptr, b] : blocks_) {
    if (!b.mapped_free()) continue;
    const bool first_asleep = sleeping_pages_.count(page_of(b.ptr)) != 0;
    for (std::uint64_t p = page_of(b.ptr) + 1; p <= page_of(b.end() - 1); ++p)
      if ((sleeping_pages_.count(p) != 0) != first_asleep) {
        cut.push_back(ptr);
        break;
      }
  }
  for (std::uint64_t ptr : cut) {
    // Cut at every page edge where the sleep state changes, from the low end up.
    std::uint64_t at = ptr;
    while (true) {
      const Block& b = blocks_.at(at);
      const bool a = sleeping_pages_.count(page_of(b.ptr)) != 0;
      std::uint64_t edge = 0;
      for (std::uint64_t p = page_of(b.ptr) + 1; p <= page_of(b.end() - 1); ++p)
        if ((sleeping_pages_.count(p) != 0) != a) {
          edge = page_addr(p);
          break;
        }
      if (edge == 0) break;
      const Bytes size = b.end() - edge;
      carve(at, edge, size);  // [at, edge) and [edge, end): both keep the state and the stream
      at = edge;
    }
  }
}

std::int64_t CachetPolicy::sleeping_runs() const {
  std::int64_t runs = 0;
  std::optional<std::uint64_t> prev;  // the sleeping page before p (the map is ordered)
  for (const auto& [p, page] : sleeping_pages_) {
    if (!prev || *prev + 1 != p) ++runs;
    prev = p;
  }
  return runs;
}

void CachetPolicy::apply_sleeping_run_change(std::int64_t before) {
  const std::int64_t d = sleeping_runs() - before;
  if (d > 0) sleep_stats_.sleeping_segments.increase(d);
  if (d < 0) sleep_stats_.sleeping_segments.decrease(-d);
}

Bytes CachetPolicy::sleep(const TagList& tags, const TagList& backup_tags) {
  for (const Tag& t : tags) check_tag(t);
  for (const Tag& t : backup_tags) check_tag(t);
  if (pool_active())
    throw UsageError(
        "sleep(): a CUDA graph capture or use_mem_pool is under way; end it first (a sleeping "
        "range must not be captured into a graph)");
  // Pending frees complete first (the device is idle before memory goes back, R9's wait).
  if (!events_.empty() || !deferred_.empty()) synchronize_events();
  // The tag of the live blocks touching each awake mapped page (one at most: SLEEP-R1).
  std::map<std::uint64_t, Tag> live_tag;
  for (const auto& [ptr, b] : blocks_) {
    if (!b.live()) continue;
    for (std::uint64_t p = page_of(b.ptr); p <= page_of(b.end() - 1); ++p) {
      const auto [it, fresh] = live_tag.emplace(p, b.tag);
      if (!fresh && it->second != b.tag)  // placement keeps pages homogeneous: a model bug
        throw std::logic_error("[INV-SLEEP-3] cachet model: sleep(): page " + std::to_string(p) +
                               " is touched by live blocks of '" + it->second + "' and '" + b.tag +
                               "'");
    }
  }
  std::vector<std::uint64_t> pages;  // the awake pages that sleep now, ascending
  for (std::uint64_t p : mapped_pages_) {
    if (sleeping_pages_.count(p) != 0) continue;  // already asleep: left as it is
    const auto it = live_tag.find(p);
    if (it == live_tag.end() || names_tag(tags, it->second)) pages.push_back(p);
  }
  const std::int64_t runs = sleeping_runs();
  // One unmap per run of adjacent pages put to sleep by this call.
  for (std::size_t i = 0; i < pages.size();) {
    std::size_t j = i + 1;
    while (j < pages.size() && pages[j] == pages[j - 1] + 1) ++j;
    source_.unmap(page_addr(pages[i]), (j - i) * kCachetPage);
    i = j;
  }
  for (std::uint64_t p : pages) {
    const auto it = live_tag.find(p);
    SleepingPage sp;
    if (it != live_tag.end()) {
      sp.tag = it->second;
      sp.backed_up = lists_tag(backup_tags, sp.tag);
    }
    sleeping_pages_.emplace(p, sp);
  }
  split_at_sleep_edges();
  // The free blocks now asleep merge with their sleeping free neighbours (R1: no two free blocks
  // of one stream and pool lie side by side in one sleep state).
  const std::set<std::uint64_t> fresh(pages.begin(), pages.end());
  std::vector<std::uint64_t> slept;
  for (const auto& [ptr, b] : blocks_)
    if (b.mapped_free() && fresh.count(page_of(b.ptr)) != 0) slept.push_back(ptr);
  for (std::uint64_t ptr : slept)
    if (blocks_.count(ptr) != 0 && blocks_.at(ptr).mapped_free()) merge(ptr);
  // The live blocks now asleep (each lies wholly on pages of one sleep state).
  Bytes allocated = 0, backup = 0;
  for (const auto& [ptr, b] : blocks_) {
    if (!b.live() || fresh.count(page_of(b.ptr)) == 0) continue;
    if (b.state() == BlockState::Allocated) allocated += b.size;
    if (sleeping_pages_.at(page_of(b.ptr)).backed_up) backup += b.size;
  }
  const Bytes given = pages.size() * kCachetPage;
  apply_sleeping_run_change(runs);
  sleep_stats_.sleeping_bytes.increase(static_cast<std::int64_t>(given));
  sleep_stats_.sleeping_allocated_bytes.increase(static_cast<std::int64_t>(allocated));
  sleep_stats_.backup_bytes.increase(static_cast<std::int64_t>(backup));
  ++sleep_stats_.num_sleeps;
  return given;
}

void CachetPolicy::free_while_asleep(Block& b) {
  sleep_stats_.sleeping_allocated_bytes.decrease(static_cast<std::int64_t>(b.size));
  if (sleeping_pages_.at(page_of(b.ptr)).backed_up)
    sleep_stats_.backup_bytes.decrease(static_cast<std::int64_t>(b.size));  // its backup is dropped
  ++sleep_stats_.num_frees_while_asleep;
  b.uses.clear();     // nothing can run on memory that is not there: no event
  free_completed(b);  // Free, merged with its sleeping free neighbours only
}

void CachetPolicy::wake(const TagList& tags) {
  for (const Tag& t : tags) check_tag(t);
  std::vector<std::uint64_t> pages;
  for (const auto& [p, sp] : sleeping_pages_)
    if (sp.tag.empty() || names_tag(tags, sp.tag)) pages.push_back(p);
  if (pages.empty()) {  // nothing of these tags asleep: nothing to do (docs/sleep-wake.md section 4)
    ++sleep_stats_.num_wakes;
    return;
  }
  std::vector<std::pair<std::uint64_t, std::uint64_t>> runs;  // [lo, hi) addresses, ascending
  for (std::size_t i = 0; i < pages.size();) {
    std::size_t j = i + 1;
    while (j < pages.size() && pages[j] == pages[j - 1] + 1) ++j;
    runs.emplace_back(page_addr(pages[i]), page_addr(pages[j - 1]) + kCachetPage);
    i = j;
  }
  // The cap (R7, awake pages only) first, then the memory of every run before any page wakes; a
  // refusal undoes the maps this call made.
  bool ok = !allowed_max_ || (awake_pages() + pages.size()) * kCachetPage <= *allowed_max_;
  for (std::size_t i = 0; ok && i < runs.size(); ++i)
    if (!source_.map(runs[i].first, runs[i].second - runs[i].first)) {
      for (std::size_t j = 0; j < i; ++j)
        source_.unmap(runs[j].first, runs[j].second - runs[j].first);
      ok = false;
    }
  if (!ok) {
    ++sleep_stats_.num_wake_ooms;
    throw OutOfMemory(
        "wake(): out of memory: waking needs " + std::to_string(pages.size() * kCachetPage) +
        " bytes of device memory; everything stays asleep with its backups; free memory and "
        "wake again");
  }
  Bytes allocated = 0, backup = 0;
  for (const auto& [ptr, b] : blocks_) {
    if (!b.live()) continue;
    const auto it = sleeping_pages_.find(page_of(b.ptr));
    if (it == sleeping_pages_.end() || !std::binary_search(pages.begin(), pages.end(), it->first))
      continue;
    if (b.state() == BlockState::Allocated) allocated += b.size;
    if (it->second.backed_up) backup += b.size;
  }
  const std::int64_t before = sleeping_runs();
  for (std::uint64_t p : pages) sleeping_pages_.erase(p);
  split_at_sleep_edges();  // a free block may span a page that woke and one that did not
  // The free blocks that woke merge with their awake neighbours as a free would (R1).
  std::vector<std::uint64_t> woke;
  for (const auto& [lo, hi] : runs)
    for (auto it = blocks_.lower_bound(lo); it != blocks_.end() && it->first < hi; ++it)
      if (it->second.mapped_free()) woke.push_back(it->first);
  for (std::uint64_t ptr : woke)
    if (blocks_.count(ptr) != 0 && blocks_.at(ptr).mapped_free()) merge(ptr);
  apply_sleeping_run_change(before);
  sleep_stats_.sleeping_bytes.decrease(static_cast<std::int64_t>(pages.size() * kCachetPage));
  sleep_stats_.sleeping_allocated_bytes.decrease(static_cast<std::int64_t>(allocated));
  sleep_stats_.backup_bytes.decrease(static_cast<std::int64_t>(backup));
  ++sleep_stats_.num_wakes;
  // Woken free pages may pass R4's budget (they slept free): whole free pages beyond budget(T)
  // are unmapped in R6's order, as at the end of a capture (R12).
  if (!pages.empty() && !pool_active())
    trim_to_budget();  // (a wake that woke nothing changes nothing)
}

TagList CachetPolicy::sleeping() const {
  std::set<Tag> tags;
  for (const auto& [p, sp] : sleeping_pages_)
    if (!sp.tag.empty()) tags.insert(sp.tag);
  return {tags.begin(), tags.end()};
}

void CachetPolicy::release_sleeping_free_pages() {
  if (sleeping_pages_.empty()) return;
  // Sleeping pages touched by no live block and holding only default-pool blocks (R10: a private
  // pool's pages are its users').
  std::vector<std::uint64_t> pages;
  for (const auto& [p, sp] : sleeping_pages_) {
    bool free = true;
    auto it = blocks_.upper_bound(page_addr(p));
    if (it != blocks_.begin()) --it;
    for (; free && it != blocks_.end() && it->first < page_addr(p + 1); ++it)
      if (it->second.end() > page_addr(p) && (it->second.live() || !it->second.pool.is_default()))
        free = false;
    if (free) pages.push_back(p);
  }
  for (std::size_t i = 0; i < pages.size();) {
    std::size_t j = i + 1;
    while (j < pages.size() && pages[j] == pages[j - 1] + 1) ++j;
    const std::uint64_t lo = page_addr(pages[i]), hi = page_addr(pages[j - 1]) + kCachetPage;
    const std::int64_t runs = mapped_runs();
    const std::int64_t sleeping = sleeping_runs();
    // Its memory went back at the sleep: no device call, only the bookkeeping of R6's unmapping.
    ++stats_.num_device_free;
    DeviceStats::for_all_and(stats_.reserved_bytes, StatType::LargePool,
                             [n = static_cast<std::int64_t>(hi - lo)](Stat& s) { s.decrease(n); });
    for (std::size_t k = i; k < j; ++k) {
      mapped_pages_.erase(pages[k]);
      sleeping_pages_.erase(pages[k]);
    }
    apply_run_change(runs);
    apply_sleeping_run_change(sleeping);
    sleep_stats_.sleeping_bytes.decrease(static_cast<std::int64_t>(hi - lo));
    std::vector<std::uint64_t> inside;
    auto it = blocks_.upper_bound(lo);
    if (it != blocks_.begin()) --it;
    for (; it != blocks_.end() && it->first < hi; ++it)
      if (it->second.end() > lo) inside.push_back(it->first);
    record(TraceAction::SegmentUnmap, lo, hi - lo, blocks_.at(inside.front()).stream);
    for (std::uint64_t ptr : inside) {
      const Block& b = blocks_.at(ptr);
      const std::uint64_t from = std::max(b.ptr, lo), to = std::min(b.end(), hi);
      Block& gone = carve(ptr, from, to - from);
      gone.set_state(BlockState::Unmapped);  // Free -> Unmapped
      gone.stream = 0;
      gone.pool = PoolId{};
      merge(from);
    }
    i = j;
  }
}

}  // namespace cachet::model

// Sleep and wake in the model of policy:pytorch (issue 24). The rules are cachet's own,
// docs/sleep-wake.md, not PyTorch's: a sleeping run (a cudaMalloc segment, or a mapped run of an
// expandable segment) keeps its blocks, addresses and stats; its memory goes back through the
// source's unmap and comes again through its map; its free blocks are in no pool while it sleeps,
// so no allocation lands there, and an expandable segment never grows into a sleeping run nor next
// to it (touches_sleeping), so a sleeping run never joins an awake one.
//
// Placement keeps runs tag-homogeneous (get_free_block_for_tag; an expandable segment with live
// blocks of one tag takes no other, reservation_takes_current_tag; a use_on_oom pool lends only
// what the tag allows).
#include <algorithm>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "cachet/errors.h"
#include "cachet/model/allocator.h"

namespace cachet::model {

namespace {
std::string hex(std::uint64_t v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}
}  // namespace

const Block* Allocator::run_head(const Block* b) {
  while (b->prev != nullptr && b->prev->is_mapped()) b = b->prev;
  return b;
}

const Allocator::SleepingRange* Allocator::sleeping_range_of(const Block* b) const {
  const auto it = sleeping_.find(run_head(b)->ptr);
  return it == sleeping_.end() ? nullptr : &it->second;
}

Block* Allocator::mapped_block_at(std::uint64_t ptr) const {
  for (const auto& [key, owned] : owned_)
    if (owned->ptr == ptr && owned->is_mapped()) return owned.get();
  return nullptr;
}

bool Allocator::touches_sleeping(const Block* b) const {
  if (sleeping_.empty() || b == nullptr) return false;
  auto asleep = [&](const Block* x) { return x != nullptr && x->is_mapped() && sleeping_range_of(x) != nullptr; };
  if (b->is_mapped()) return asleep(b);
  return asleep(b->prev) || asleep(b->next);
}

bool Allocator::reservation_takes_current_tag(const ExpandableSegment* es) const {
  if (!tags_seen_) return true;  // every live block is "default", and so is this one
  const Tag& tag = current_tag();
  for (const auto& [ptr, b] : active_blocks_)
    if (b->expandable == es && b->tag != tag) return false;
  return true;
}

void Allocator::hide_free_blocks(const Block* head) {
  for (const Block* b = head; b != nullptr && b->is_mapped(); b = b->next)
    if (b->is_free()) b->pool->blocks.erase(const_cast<Block*>(b));
}

bool Allocator::get_free_block_for_tag(AllocParams& p) {
  if (!tags_seen_ && current_tag() == kDefaultTag) return get_free_block(p);
  const Tag& tag = current_tag();
  // Tag-homogeneous segments: hide, for this one search, the free blocks of segments whose live
  // blocks carry another tag; the search then takes the next candidate in PyTorch's order.
  BlockPool& pool = *p.pool;
  std::vector<Block*> hidden;
  std::set<const ExpandableSegment*> foreign;  // expandable segments with live blocks of another tag
  for (const auto& [ptr, b] : active_blocks_)
    if (b->expandable != nullptr && b->tag != tag) foreign.insert(b->expandable);
  for (Block* b : pool.blocks) {
    if (b->stream != p.stream) continue;
    if (b->expandable != nullptr) {
      if (foreign.contains(b->expandable)) hidden.push_back(b);
      continue;
    }
    for (const Block* x = run_head(b); x != nullptr && x->is_mapped(); x = x->next)
      if (x->is_active() && x->tag != tag) {
        hidden.push_back(b);
        break;
      }
  }
  for (Block* b : hidden) pool.blocks.erase(b);
  const bool found = get_free_block(p);
  for (Block* b : hidden) pool.blocks.insert(b);  // back, keeping their GC age
  return found;
}

Bytes Allocator::sleep(const TagList& tags, const TagList& backup_tags) {
  for (const Tag& t : tags) check_tag(t);
  for (const Tag& t : backup_tags) check_tag(t);
  if (!captures_underway_.empty())
    throw UsageError("sleep(): a CUDA graph capture or use_mem_pool is under way; end it first (a sleeping "
                     "range must not be captured into a graph)");
  // 1. Pending frees complete (the device is idle before memory goes back, section 3 step 2), so a
  //    run whose last live blocks were awaiting events sleeps as a free run.
  synchronize_and_free_events();
  // 2. Which runs sleep.
  struct Plan {
    std::uint64_t head_ptr;
    Bytes size;
  };
  std::vector<Plan> plan;
  std::vector<const Block*> heads;
  for_each_block_pool([&](const BlockPool& pool) {
    for (const Block* b : pool.blocks) heads.push_back(run_head(b));
  });
  for (const auto& [ptr, b] : active_blocks_) heads.push_back(run_head(b));
  std::sort(heads.begin(), heads.end(), [](const Block* a, const Block* b) { return a->ptr < b->ptr; });
  heads.erase(std::unique(heads.begin(), heads.end()), heads.end());
  for (const Block* head : heads) {
    if (sleeping_.contains(head->ptr)) continue;
    std::set<Tag> live;
    Plan p{head->ptr, 0};
    for (const Block* b = head; b != nullptr && b->is_mapped(); b = b->next) {
      p.size += b->size;
      if (b->is_active()) live.insert(b->tag);
    }
    const bool named = std::any_of(live.begin(), live.end(), [&](const Tag& t) { return names_tag(tags, t); });
    const bool other = std::any_of(live.begin(), live.end(), [&](const Tag& t) { return !names_tag(tags, t); });
    if (!live.empty() && !named) continue;
    if (other) {  // placement keeps runs tag-homogeneous: a model bug, not the caller's
      std::string names;
      for (const Tag& t : live) names += (names.empty() ? "'" : ", '") + t + "'";
      throw std::logic_error("[INV-SLEEP-3] model: sleep(): the segment at " + hex(head->ptr) +
                             " holds live blocks of the tags " + names + " (nothing was put to sleep)");
    }
    plan.push_back(p);
  }
  // 3. Give the memory back.
  Bytes given = 0;
  for (const Plan& p : plan) {
    const std::uint64_t base = p.head_ptr;
    const Block* head = mapped_block_at(base);
    Tag tag;
    Bytes live = 0, allocated = 0;
    for (const Block* b = head; b != nullptr && b->is_mapped(); b = b->next) {
      if (b->is_active()) {
        tag = b->tag;
        live += b->size;
      }
      if (b->is_allocated()) allocated += b->size;
    }
    const bool backed_up = !tag.empty() && lists_tag(backup_tags, tag);
    hide_free_blocks(head);
    source_.unmap(base, p.size);
    if (ExpandableSegment* es = head->expandable; es != nullptr)  // its pages are not mapped now
      for (Bytes i = (base - es->base) / es->page_size; i < (base + p.size - es->base) / es->page_size; ++i)
        es->mapped_pages.erase(i);
    sleeping_.emplace(base, SleepingRange{p.size, tag, backed_up});
    sleep_stats_.sleeping_segments.increase(1);
    sleep_stats_.sleeping_bytes.increase(static_cast<std::int64_t>(p.size));
    sleep_stats_.sleeping_allocated_bytes.increase(static_cast<std::int64_t>(allocated));
    if (backed_up) sleep_stats_.backup_bytes.increase(static_cast<std::int64_t>(live));
    given += p.size;
  }
  ++sleep_stats_.num_sleeps;
  return given;
}

void Allocator::free_while_asleep(Block* b) {
  const SleepingRange& r = *sleeping_range_of(b);
  const std::uint64_t head_ptr = run_head(b)->ptr;
  sleep_stats_.sleeping_allocated_bytes.decrease(static_cast<std::int64_t>(b->size));
  if (r.backed_up) sleep_stats_.backup_bytes.decrease(static_cast<std::int64_t>(b->size));
  ++sleep_stats_.num_frees_while_asleep;
  b->stream_uses.clear();  // nothing can run on memory that is not there: no event
  b->capture_stream_uses.clear();
  free_block(b);  // Allocated -> Free, merged, into the pool ...
  // ... and out of it again until the wake.
  hide_free_blocks(mapped_block_at(head_ptr));
}

void Allocator::wake(const TagList& tags) {
  for (const Tag& t : tags) check_tag(t);
  std::vector<std::uint64_t> waking;
  Bytes bytes = 0;
  for (const auto& [ptr, r] : sleeping_)
    if (r.tag.empty() || names_tag(tags, r.tag)) {
      waking.push_back(ptr);
      bytes += r.size;
    }
  // The cap first, then the memory of every run before any run wakes; a refusal undoes the maps
  // this call made.
  const Bytes in_use = total_allocated_ - static_cast<Bytes>(sleep_stats_.sleeping_bytes.current);
  bool ok = !allowed_max_ || in_use + bytes <= *allowed_max_;
  for (std::size_t i = 0; ok && i < waking.size(); ++i)
    if (!source_.map(waking[i], sleeping_.at(waking[i]).size)) {
      for (std::size_t j = 0; j < i; ++j) source_.unmap(waking[j], sleeping_.at(waking[j]).size);
      ok = false;
    }
  if (!ok) {
    ++sleep_stats_.num_wake_ooms;
    throw OutOfMemory("wake(): out of memory: waking needs " + std::to_string(bytes) +
                      " bytes of device memory; everything stays asleep with its backups; free memory and "
                      "wake again");
  }
  for (const std::uint64_t ptr : waking) {
    const SleepingRange r = sleeping_.at(ptr);
    sleeping_.erase(ptr);
    if (ExpandableSegment* es = mapped_block_at(ptr)->expandable; es != nullptr)
      for (Bytes i = (ptr - es->base) / es->page_size; i < (ptr + r.size - es->base) / es->page_size; ++i)
        es->mapped_pages.insert(i);
    Bytes allocated = 0, live = 0;
    for (const auto& [key, owned] : owned_) {
      Block* b = owned.get();
      if (b->ptr < ptr || b->ptr >= ptr + r.size) continue;
      if (b->is_free()) b->pool->insert(b);
      if (b->is_allocated()) allocated += b->size;
      if (b->is_active()) live += b->size;
    }
    sleep_stats_.sleeping_segments.decrease(1);
    sleep_stats_.sleeping_bytes.decrease(static_cast<std::int64_t>(r.size));
    sleep_stats_.sleeping_allocated_bytes.decrease(static_cast<std::int64_t>(allocated));
    if (r.backed_up) sleep_stats_.backup_bytes.decrease(static_cast<std::int64_t>(live));
  }
  ++sleep_stats_.num_wakes;
}

void Allocator::release_sleeping_blocks(BlockPool& pool) {
  std::vector<std::uint64_t> bases;
  for (const auto& [base, r] : sleeping_) {
    const Block* head = mapped_block_at(base);
    if (head->pool != &pool) continue;
    bool live = false;
    for (const Block* b = head; b != nullptr && b->is_mapped(); b = b->next) live = live || b->is_active();
    if (!live) bases.push_back(base);
  }
  for (const std::uint64_t base : bases) {
    // No live block: the run is one free block (its frees merged).
    Block* b = mapped_block_at(base);
    const Bytes size = sleeping_.at(base).size;
    if (b->size != size) throw std::logic_error("model: a sleeping run with no live block is not one free block");
    sleeping_.erase(base);
    sleep_stats_.sleeping_segments.decrease(1);
    sleep_stats_.sleeping_bytes.decrease(static_cast<std::int64_t>(size));
    if (b->expandable == nullptr) {
      release_block(b, true);
    } else {
      unmap_block(b, true);
      if (b->is_unmapped() && !b->is_split()) release_expandable_segment(b);
    }
  }
}

TagList Allocator::sleeping() const {
  std::set<Tag> tags;
  for (const auto& [ptr, r] : sleeping_)
    if (!r.tag.empty()) tags.insert(r.tag);
  return {tags.begin(), tags.end()};
}

}  // namespace cachet::model

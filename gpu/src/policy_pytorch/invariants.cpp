// PytorchPolicy::invariants(): policy:pytorch's invariants (docs/invariants.md, the IDs and
// where each is checked), over the allocator's own state. O(blocks + events); cheap enough to run
// after every operation (cachet_validate:True). Returns one line per violation, each starting with
// its ID. § numbers refer to docs/pytorch-allocator.md.
#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "policy_pytorch/policy.h"
#include "messages.h"

namespace cachet::gpu::detail {

std::vector<std::string> PytorchPolicy::invariants() const {
  std::vector<std::string> out;
  auto fail = [&](const char* id, const std::string& msg) { out.push_back(std::string(id) + " " + msg); };

  // Recount of the stats ([INV-STATS-1]), per StatType index.
  struct Count {
    std::int64_t allocation = 0, segment = 0, active = 0, inactive_split = 0;
    std::int64_t allocated_bytes = 0, reserved_bytes = 0, active_bytes = 0, inactive_split_bytes = 0,
                 requested_bytes = 0;
  };
  Count c[3];
  std::int64_t oversize_allocations = 0, oversize_segments = 0;
  std::map<const Block*, int> queued;  // [INV-EVENT-2]
  for (const auto& [s, q] : cuda_events_)
    for (const auto& [e, b] : q) ++queued[b];

  std::size_t free_count = 0, unmapped_count = 0, active_count = 0;
  DevicePtr prev_end = 0;
  Bytes reserved = 0;
  Bytes max_page = 0;
  for (const auto& [base, seg] : segments_) {
    const auto where = [base = base] { return "segment " + hex(base); };  // formatted only on failure
    if (base < prev_end) fail("[INV-SEG-3]", where() + " overlaps the previous segment");
    prev_end = base + seg->size;
    if (seg->head == nullptr || seg->head->prev != nullptr) {
      fail("[INV-SEG-2]", where() + " has no head block, or its head has a prev link");
      continue;
    }
    if (seg->expandable) max_page = std::max(max_page, seg->page_size);
    const int p = seg->is_small ? 1 : 2;
    if (!seg->expandable) {
      c[p].segment += 1;
      c[p].reserved_bytes += static_cast<std::int64_t>(seg->size);
      reserved += seg->size;
      if (seg->size >= config_.max_split_size) ++oversize_segments;
    }
    DevicePtr at = base;
    std::size_t nblocks = 0;
    for (const Block* b = seg->head; b != nullptr; b = b->next) {
      ++nblocks;
      const auto bw = [&] {  // formatted only on failure
        return "block " + hex(b->ptr) + " (" + std::to_string(b->size) + " B) of " + where();
      };
      if (b->segment != seg.get()) fail("[INV-SEG-3]", bw() + " points to another segment");
      if (b->ptr != at) fail("[INV-SEG-1]", bw() + " starts at " + hex(b->ptr) + ", expected " + hex(at));
      at = b->ptr + b->size;
      if (at > base + seg->size) fail("[INV-SEG-3]", bw() + " ends past its segment");
      if (b->next && b->next->prev != b) fail("[INV-SEG-2]", bw() + ": next->prev is not this block");
      if (b->stream != seg->stream) fail("[INV-SEG-3]", bw() + " has stream " + std::to_string(b->stream));
      if (b->is_small != seg->is_small) fail("[INV-SEG-3]", bw() + " is in the other pool");
      if (b->size == 0 || b->size % kMinBlockSize != 0) fail("[INV-SIZE-1]", bw() + ": size is not a multiple of 512");
      if (b->is_allocated() && b->size < round_size(b->requested_size))
        fail("[INV-SIZE-2]", bw() + ": smaller than round_size(" + std::to_string(b->requested_size) + ")");
      // Split-size limit (§2.3): a large-pool split leaves more than 1 MiB and large requests are
      // larger than 1 MiB, so no block of a cudaMalloc large-pool segment is 1 MiB or smaller;
      // a small-pool allocation is at most 1 MiB, unless its pool never splits (no_split, §15.2).
      if (!seg->expandable && !seg->is_small && b->size <= kSmallSize)
        fail("[INV-SIZE-3]", bw() + ": a large-pool block of 1 MiB or less (split below the limit)");
      if (seg->is_small && b->is_allocated() && b->size > kSmallSize && !no_split(*seg->pool))
        fail("[INV-SIZE-3]", bw() + ": a small-pool allocation larger than 1 MiB");
      // The state against the other fields (shell/block_state.h).
      const bool deferred = b->state() == BlockState::Deferred;
      if (!b->is_allocated() && !deferred && !b->stream_uses.empty())
        fail("[INV-EVENT-3]", bw() + ": stream uses on a block that is not allocated");
      if (deferred && b->stream_uses.empty()) fail("[INV-EVENT-3]", bw() + ": a deferred free without stream uses");
      if (deferred != (std::find(deferred_blocks_.begin(), deferred_blocks_.end(), b) != deferred_blocks_.end()))
        fail("[INV-POOL-1]", bw() + " is " + state_name(b->state()) + " but the deferred list disagrees (§14.7)");
      if ((b->state() == BlockState::AwaitingEvents) != (b->event_count > 0))
        fail("[INV-EVENT-1]", bw() + " is " + state_name(b->state()) + " with event_count " +
                                  std::to_string(b->event_count));
      if (!b->is_mapped() && !seg->expandable) fail("[INV-MAP-2]", bw() + " is unmapped in a cudaMalloc segment");
      const int q = queued.count(b) ? queued.at(b) : 0;
      if (q != b->event_count)
        fail("[INV-EVENT-2]", bw() + ": event_count " + std::to_string(b->event_count) + " but " + std::to_string(q) +
                            " queued events");

      const BlockPool& pool = *seg->pool;
      const bool in_free = b->is_mapped() && pool.blocks.find(*b, SizeOrder{}) != pool.blocks.end() &&
                           &*pool.blocks.find(*b, SizeOrder{}) == b;
      const bool in_unmapped = !b->is_mapped() &&
                               pool.unmapped.find(*b, AddrOrder{}) != pool.unmapped.end() &&
                               &*pool.unmapped.find(*b, AddrOrder{}) == b;
      const bool in_active = active_.find(b->ptr) == b;
      if (!b->is_mapped()) {
        ++unmapped_count;
        if (!in_unmapped) fail("[INV-POOL-1]", bw() + " is unmapped but not in its pool's unmapped set");
        if (in_active) fail("[INV-MAP-1]", bw() + " is unmapped and in the active table");
        if (b->next && !b->next->is_mapped()) fail("[INV-MERGE-1]", bw() + " and the next block are both unmapped");
        continue;
      }
      if (seg->expandable) c[p].reserved_bytes += static_cast<std::int64_t>(b->size), reserved += b->size;
      if (b->is_active()) {
        ++active_count;
        if (!in_active) fail("[INV-POOL-1]", bw() + " is active but not in the active table");
        if (in_free) fail("[INV-POOL-1]", bw() + " is active (or waiting for events) and in a free pool");
        c[p].active += 1;
        c[p].active_bytes += static_cast<std::int64_t>(b->size);
        c[p].requested_bytes += static_cast<std::int64_t>(b->requested_size);
        if (b->is_allocated()) {
          c[p].allocation += 1;
          c[p].allocated_bytes += static_cast<std::int64_t>(b->size);
          if (b->size >= config_.max_split_size) ++oversize_allocations;
        }
      } else if (seg->sleeping_runs != 0 && sleeping_range_of(b) != nullptr) {
        // A free block of a sleeping range is in no free set (docs/sleep-wake.md SLEEP-R2).
        if (in_free) fail("[INV-SLEEP-1]", bw() + " is free in a sleeping range but in its pool's free set");
        if (b->next && b->next->is_free())
          fail("[INV-MERGE-1]", bw() + " and the next block are both free: they should have merged");
      } else {
        ++free_count;
        if (!in_free) fail("[INV-POOL-1]", bw() + " is free but not in its pool");
        if (b->next && b->next->is_free())
          fail("[INV-MERGE-1]", bw() + " and the next block are both free: they should have merged");
      }
    }
    if (at != base + seg->size)
      fail("[INV-SEG-1]", where() + ": blocks cover " + std::to_string(at - base) + " of " + std::to_string(seg->size) + " B");
    if (!seg->expandable && nblocks > 1) {
      for (const Block* b = seg->head; b != nullptr; b = b->next)
        if (!b->is_active()) {
          c[p].inactive_split += 1;
          c[p].inactive_split_bytes += static_cast<std::int64_t>(b->size);
        }
    }
  }
  std::size_t pooled_free = 0, pooled_unmapped = 0;
  for_each_block_pool([&](const BlockPool& pool) {
    pooled_free += pool.blocks.size();
    pooled_unmapped += pool.unmapped.size();
  });
  if (pooled_free != free_count)
    fail("[INV-POOL-1]", "the pools hold " + std::to_string(pooled_free) + " free blocks, the segments " +
                        std::to_string(free_count));
  if (pooled_unmapped != unmapped_count)
    fail("[INV-POOL-1]", "the unmapped sets and the segments disagree on the number of unmapped blocks");
  check_private_pools(out);
  if (active_.size() != active_count)
    fail("[INV-POOL-1]", "the active table holds " + std::to_string(active_.size()) + " blocks, the segments " +
                        std::to_string(active_count));
  if (reserved != total_allocated_memory_)
    fail("[INV-STATS-1]", "total reserved " + std::to_string(total_allocated_memory_) + " but segments hold " +
                        std::to_string(reserved));

  // [INV-STATS-1]: every pool's current values equal the recount.
  c[0] = Count{};
  for (int p = 1; p <= 2; ++p) {
    c[0].allocation += c[p].allocation;
    c[0].segment += c[p].segment;
    c[0].active += c[p].active;
    c[0].inactive_split += c[p].inactive_split;
    c[0].allocated_bytes += c[p].allocated_bytes;
    c[0].reserved_bytes += c[p].reserved_bytes;
    c[0].active_bytes += c[p].active_bytes;
    c[0].inactive_split_bytes += c[p].inactive_split_bytes;
    c[0].requested_bytes += c[p].requested_bytes;
  }
  static const char* const kPool[3] = {"all", "small_pool", "large_pool"};
  auto cmp = [&](const char* name, const StatArray& a, std::int64_t Count::*m) {
    for (int p = 0; p < 3; ++p)
      if (a[static_cast<std::size_t>(p)].current != c[p].*m)
        fail("[INV-STATS-1]", std::string(name) + "." + kPool[p] + ".current is " +
                            std::to_string(a[static_cast<std::size_t>(p)].current) + ", recount " +
                            std::to_string(c[p].*m));
  };
  cmp("allocation", stats().allocation, &Count::allocation);
  cmp("segment", stats().segment, &Count::segment);
  cmp("active", stats().active, &Count::active);
  cmp("inactive_split", stats().inactive_split, &Count::inactive_split);
  cmp("allocated_bytes", stats().allocated_bytes, &Count::allocated_bytes);
  cmp("reserved_bytes", stats().reserved_bytes, &Count::reserved_bytes);
  cmp("active_bytes", stats().active_bytes, &Count::active_bytes);
  cmp("inactive_split_bytes", stats().inactive_split_bytes, &Count::inactive_split_bytes);
  cmp("requested_bytes", stats().requested_bytes, &Count::requested_bytes);
  if (stats().oversize_allocations.current != oversize_allocations)
    fail("[INV-STATS-1]", "oversize_allocations.current is " + std::to_string(stats().oversize_allocations.current) +
                        ", recount " + std::to_string(oversize_allocations));
  if (stats().oversize_segments.current != oversize_segments)
    fail("[INV-STATS-1]", "oversize_segments.current is " + std::to_string(stats().oversize_segments.current) +
                        ", recount " + std::to_string(oversize_segments));

  // [INV-CAP-1]: the cap (expandable: may be exceeded by less than one page, §13.5); sleeping
  // bytes are reserved but not against it ([INV-SLEEP-5], docs/sleep-wake.md SLEEP-R5).
  if (cap_.allowed() &&
      total_allocated_memory_ - sleeping_bytes_ > *cap_.allowed() + (max_page ? max_page - 1 : 0)) {
    const std::string why = "reserved " + std::to_string(total_allocated_memory_) + " B less " +
                            std::to_string(sleeping_bytes_) + " B asleep exceeds the cap of " +
                            std::to_string(*cap_.allowed()) + " B";
    if (sleeping_bytes_ != 0) fail("[INV-SLEEP-5]", why);
    else fail("[INV-CAP-1]", why);
  }
  check_sleep(out);
  return out;
}

// Private pools (§14): [INV-PRIV-1] use counts and the freeable list; [INV-PRIV-2] the device
// allocation count without expandable segments; [INV-SEG-3] every block in a pool's free or
// unmapped set belongs to a segment of that pool, so a private pool's blocks never reach another
// pool; the deferred frees and the active pools name live blocks and known pools (§14.7, §14.2).
void PytorchPolicy::check_private_pools(std::vector<std::string>& out) const {
  auto fail = [&](const char* id, const std::string& msg) { out.push_back(std::string(id) + " " + msg); };
  for_each_block_pool([&](const BlockPool& pool) {
    const std::string name = pool.owner ? "private pool " + std::to_string(pool.owner->id.first) + "," +
                                              std::to_string(pool.owner->id.second)
                                        : std::string("the default pools");
    for (const Block& b : pool.blocks)
      if (b.segment->pool != &pool) fail("[INV-SEG-3]", "free block " + hex(b.ptr) + " in " + name + " belongs to another pool's segment");
    for (const Block& b : pool.unmapped)
      if (b.segment->pool != &pool) fail("[INV-SEG-3]", "unmapped block " + hex(b.ptr) + " in " + name + " belongs to another pool's segment");
  });
  std::map<const PrivatePool*, int> cuda_segments, all_segments;
  for (const auto& [base, seg] : segments_) {
    const PrivatePool* owner = seg->pool->owner;
    if (owner == nullptr) continue;
    const bool known = graph_pools_.contains(owner->id) && graph_pools_.at(owner->id).get() == owner;
    const bool orphaned = std::any_of(orphaned_pools_.begin(), orphaned_pools_.end(),
                                      [&](const auto& o) { return o.get() == owner; });
    if (known == orphaned || owner->orphaned != orphaned)
      fail("[INV-SEG-3]", "segment " + hex(base) + " belongs to a private pool that is neither known nor orphaned");
    ++all_segments[owner];
    if (!seg->expandable) ++cuda_segments[owner];
  }
  for (const auto& [id, pp] : graph_pools_) {
    const std::string name = "private pool {" + std::to_string(id.first) + ", " + std::to_string(id.second) + "}";
    if (pp->use_count < 0) fail("[INV-PRIV-1]", name + " has use count " + std::to_string(pp->use_count));
    if ((pp->use_count == 0) != graph_pools_freeable_.contains(id))
      fail("[INV-PRIV-1]", name + ": use count " + std::to_string(pp->use_count) + " but " +
                               (graph_pools_freeable_.contains(id) ? "" : "not ") + "in the freeable list");
    if (!pp->had_expandable && pp->device_allocs != cuda_segments[pp.get()])
      fail("[INV-PRIV-2]", name + ": device allocation count " + std::to_string(pp->device_allocs) + ", segments " +
                               std::to_string(cuda_segments[pp.get()]));
    if (pp->segments != all_segments[pp.get()])
      fail("[INV-PRIV-2]", name + " counts " + std::to_string(pp->segments) + " segments, it has " +
                               std::to_string(all_segments[pp.get()]));
  }
  const auto at_zero = std::count_if(graph_pools_.begin(), graph_pools_.end(),
                                     [](const auto& kv) { return kv.second->use_count == 0; });
  if (graph_pools_freeable_.size() != static_cast<std::size_t>(at_zero))
    fail("[INV-PRIV-1]", "the freeable list holds " + std::to_string(graph_pools_freeable_.size()) + " pools, " +
                             std::to_string(at_zero) + " known pools have use count 0");
  for (const Underway& u : captures_underway_)
    if (!graph_pools_.contains(u.id) || graph_pools_.at(u.id)->use_count <= 0)
      fail("[INV-PRIV-1]", "an active pool {" + std::to_string(u.id.first) + ", " + std::to_string(u.id.second) +
                               "} is not known or has no user");
  for (const Block* b : deferred_blocks_)
    if (b->state() != BlockState::Deferred || active_.find(b->ptr) != b)
      fail("[INV-POOL-1]", "deferred block " + hex(b->ptr) + " is " + state_name(b->state()) + " or not active (§14.7)");
}

}  // namespace cachet::gpu::detail

namespace cachet::gpu::detail {

// Sleep (docs/sleep-wake.md section 7): [INV-SLEEP-1] no free set holds a block of a sleeping range (the
// per-block part is in invariants() above); [INV-SLEEP-2] the sleep stats equal a recount;
// [INV-SLEEP-3] tag-homogeneous segments (SLEEP-R1); [INV-SLEEP-4] a sleeping range's backup covers
// exactly its live blocks when its tag was backed up (SLEEP-R4). [INV-SLEEP-5] (SLEEP-R5) is
// INV-CAP-1's check with sleeping bytes taken off.
void PytorchPolicy::check_sleep(std::vector<std::string>& out) const {
  auto fail = [&](const char* id, const std::string& msg) { out.push_back(std::string(id) + " " + msg); };
  for (const auto& [base, seg] : segments_) {
    int runs = 0;
    for (const auto& [rb, r] : sleeping_)
      if (r.segment == seg.get()) ++runs;
    if (runs != seg->sleeping_runs)
      fail("[INV-SLEEP-2]", "segment " + hex(base) + " counts " + std::to_string(seg->sleeping_runs) +
                                " sleeping runs, sleeping_ holds " + std::to_string(runs));
    for (const Block* b = seg->head; b != nullptr; b = b->next)
      if (b->is_active() && b->tag != seg->tag)
        fail("[INV-SLEEP-3]", "block " + hex(b->ptr) + " of segment " + hex(base) + " is live under the tag '" +
                                  tag_name(b->tag) + "' in a segment of the tag '" + tag_name(seg->tag) + "'");
  }
  std::int64_t ranges = 0, bytes = 0, allocated = 0, backup = 0;
  std::map<const void*, int> buffer_users;
  for (const auto& [base, r] : sleeping_) {
    ++ranges;
    bytes += static_cast<std::int64_t>(r.size);
    if (r.buffer != nullptr) ++buffer_users[r.buffer];
    if (segments_.find(r.segment->base) == segments_.end() || base < r.segment->base ||
        base + r.size > r.segment->base + r.segment->size) {
      fail("[INV-SLEEP-2]", "sleeping range " + hex(base) + " is not inside its segment");
      continue;
    }
    std::vector<std::pair<DevicePtr, Bytes>> live_runs;
    Bytes covered = 0;
    for (const Block* b = r.segment->head; b != nullptr; b = b->next) {
      if (b->ptr < base || b->ptr >= base + r.size) continue;
      covered += b->size;
      if (!b->is_mapped()) fail("[INV-SLEEP-2]", "sleeping range " + hex(base) + " holds an unmapped block");
      if (!b->is_allocated()) continue;
      allocated += static_cast<std::int64_t>(b->size);
      if (!live_runs.empty() && live_runs.back().first + live_runs.back().second == b->ptr) live_runs.back().second += b->size;
      else live_runs.emplace_back(b->ptr, b->size);
    }
    if (covered != r.size)
      fail("[INV-SLEEP-2]", "sleeping range " + hex(base) + " of " + std::to_string(r.size) + " B holds blocks of " +
                                std::to_string(covered) + " B");
    std::vector<std::pair<DevicePtr, Bytes>> copies;
    for (const BackupCopy& c : r.copies) {
      backup += static_cast<std::int64_t>(c.size);
      if (!copies.empty() && copies.back().first + copies.back().second == c.ptr) copies.back().second += c.size;
      else copies.emplace_back(c.ptr, c.size);
    }
    if (r.backed_up ? copies != live_runs : !copies.empty())
      fail("[INV-SLEEP-4]", "sleeping range " + hex(base) + (r.backed_up ? " (backed up)" : " (not backed up)") +
                                " has " + std::to_string(copies.size()) + " backup runs for " +
                                std::to_string(live_runs.size()) + " runs of live blocks");
  }
  for (const auto& [h, users] : backup_buffers_)
    if (buffer_users[h] != users)
      fail("[INV-SLEEP-4]", "a backup buffer counts " + std::to_string(users) + " ranges, " +
                                std::to_string(buffer_users[h]) + " hold it");
  const SleepStats& s = sleep_stats();
  auto cmp = [&](const char* name, std::int64_t have, std::int64_t want) {
    if (have != want)
      fail("[INV-SLEEP-2]", std::string("sleep.") + name + ".current is " + std::to_string(have) + ", recount " +
                                std::to_string(want));
  };
  cmp("sleeping_segments", s.sleeping_segments.current, ranges);
  cmp("sleeping_bytes", s.sleeping_bytes.current, bytes);
  cmp("sleeping_allocated_bytes", s.sleeping_allocated_bytes.current, allocated);
  cmp("backup_bytes", s.backup_bytes.current, backup);
  if (static_cast<std::int64_t>(sleeping_bytes_) != bytes)
    fail("[INV-SLEEP-2]", "the sleeping bytes kept for the cap are " + std::to_string(sleeping_bytes_) + ", recount " +
                              std::to_string(bytes));
}

}  // namespace cachet::gpu::detail

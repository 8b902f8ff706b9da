// policy:pytorch (PytorchPolicy, policy_pytorch/policy.h): sleep and wake (issue 24). The rules
// are cachet's own, docs/sleep-wake.md (section numbers below are that file's), not PyTorch's.
//
// A sleeping range is a cudaMalloc-style segment (under cachet_sleep:True reserved and mapped
// through the VMM calls, vmm_segment_alloc) or a run of mapped pages of an expandable segment.
// Its memory goes back with one unmap; its blocks keep their addresses, boundaries, states, tags
// and pools, its free blocks leave their pool's free set (so no search finds them, SLEEP-R2), and
// the range waits in sleeping_ until a wake maps new memory at the same addresses (map_pieces: in
// pieces of up to 512 MiB, never page by page) and copies its backups back.
#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "cachet/errors.h"
#include "cachet/summary.h"
#include "check.h"
#include "messages.h"
#include "mutant.h"
#include "policy_pytorch/policy.h"

namespace cachet::gpu::detail {

namespace {
bool in_free_set(const BlockPool& pool, const Block* b) {
  auto it = pool.blocks.find(*b, SizeOrder{});
  return it != pool.blocks.end() && &*it == b;
}
}  // namespace

Result<DevicePtr> PytorchPolicy::vmm_segment_alloc(Bytes size) {
  auto r = mem_->reserve(size);
  if (!r.is_ok()) return r;
  if (Status st = mem_->map_pieces(r.value, size); !st.is_ok()) {
    (void)mem_->unreserve(r.value, size);  // nothing stays: the segment was never made
    return {st, 0};
  }
  return r;
}

Status PytorchPolicy::vmm_segment_free(DevicePtr base, Bytes size, bool mapped) {
  if (mapped)
    if (Status st = mem_->unmap(base, size); !st.is_ok()) return st;
  return mem_->unreserve(base, size);
}

const PytorchPolicy::SleepingRange* PytorchPolicy::sleeping_range_at(DevicePtr addr) const {
  auto it = sleeping_.upper_bound(addr);
  if (it == sleeping_.begin()) return nullptr;
  --it;
  return addr < it->first + it->second.size ? &it->second : nullptr;
}

Block* PytorchPolicy::run_head(Block* b) const {
  while (b->prev != nullptr && b->prev->is_mapped()) b = b->prev;
  return b;
}

// ===================================================================== sleep (section 3)

Bytes PytorchPolicy::sleep(const TagList& tags, const TagList& backup_tags) {
  check_sleep_call("sleep()", tags, &backup_tags);
  if (capture_underway())
    throw UsageError("sleep(): a CUDA graph capture or use_mem_pool is under way; end it first (a sleeping range "
                     "must not be captured into a graph)");

  // 1. The ranges to sleep, decided before anything changes. Live = allocated: the synchronize of
  //    step 3 frees every block that waits for events (and every deferred free) first.
  struct Plan {
    Segment* seg;
    DevicePtr base;
    Bytes size;
    std::uint32_t tag;
    bool had_live;
    bool backed_up;
    Bytes allocated;
    std::vector<BackupCopy> copies;  // host: offset into the tag's buffer until it is obtained
  };
  std::vector<Plan> plan;
  for (auto& [base, seg_ptr] : segments_) {
    Segment* seg = seg_ptr.get();
    if (!seg->vmm && !seg->expandable) continue;  // a MemPool's own allocator's segment: not ours to unmap
    for (Block* b = seg->head; b != nullptr;) {
      if (!b->is_mapped()) {
        b = b->next;
        continue;
      }
      Plan p{seg, b->ptr, 0, seg->tag, false, false, 0, {}};
      std::set<std::uint32_t> live_tags;
      const SleepingRange* range = sleeping_range_at(b->ptr);  // a run ends where a sleeping range does
      for (; b != nullptr && b->is_mapped() && sleeping_range_at(b->ptr) == range; b = b->next) {
        p.size += b->size;
        if (!b->is_allocated()) continue;
        live_tags.insert(b->tag);
        p.allocated += b->size;
        if (!p.copies.empty() && p.copies.back().ptr + p.copies.back().size == b->ptr) p.copies.back().size += b->size;
        else p.copies.push_back({b->ptr, b->size, nullptr});
      }
      if (range != nullptr) continue;  // already asleep: left as it is (section 3 step 6)
      if (!live_tags.empty()) {
        p.had_live = true;
        p.tag = *live_tags.begin();
        const bool named = std::any_of(live_tags.begin(), live_tags.end(),
                                       [&](std::uint32_t t) { return names_tag(tags, tag_name(t)); });
        if (!named) continue;
        if (live_tags.size() > 1)  // SLEEP-R1 keeps segments homogeneous; checked, never assumed
          throw UsageError("sleep(): the range at " + hex(p.base) + " holds live blocks of several tags; nothing "
                           "was put to sleep (an allocator bug: report it)");
        p.backed_up = lists_tag(backup_tags, tag_name(p.tag));
      }
      if (!p.backed_up) p.copies.clear();
      plan.push_back(std::move(p));
    }
  }

  // 2. The host memory, all of it before anything changes: one pinned buffer per backed-up tag.
  std::map<std::uint32_t, Bytes> need;
  for (const Plan& p : plan)
    for (const BackupCopy& c : p.copies) need[p.tag] += c.size;
  std::map<std::uint32_t, unsigned char*> buffers = obtain_backup_buffers(need);
  auto free_buffers = [&] {
    for (auto& [t, h] : buffers) mem_->host_free(h);
    buffers.clear();
  };

  // 3. Nothing on the device may still use memory about to go (as empty_cache does, docs/pytorch-allocator.md §6).
  synchronize_and_free_events();

  // 4. The copies: one per run of adjacent live blocks, then one synchronize.
  std::map<std::uint32_t, Bytes> offset;
  for (Plan& p : plan)
    for (BackupCopy& c : p.copies) {
      c.host = buffers.at(p.tag) + offset[p.tag];
      offset[p.tag] += c.size;
      if (Status st = mem_->copy_to_host(c.host, c.ptr, c.size); !st.is_ok()) {
        free_buffers();
        throw DeviceError(device_error("cudaMemcpyAsync (device to host)", c.size, device_, st));
      }
    }
  if (!buffers.empty())
    if (Status st = mem_->copy_synchronize(); !st.is_ok()) {
      free_buffers();
      throw DeviceError(device_error("cudaStreamSynchronize (backup copies)", 0, device_, st));
    }
  for (const auto& [tag, h] : buffers) backup_buffers_[h] = 0;

  // 5. The memory goes back; the addresses stay. PyTorch's trackers (NCCL's register hook) hear
  // of it as of memory given back (docs/sleep-wake.md section 3): a whole segment's free before
  // its memory goes, a run of an expandable segment's unmap after, as native names them; the
  // trace keeps neither (the segment is still there, asleep).
  Bytes given = 0;
  for (Plan& p : plan) {
    const PoolId owner = trace_pool(*p.seg->pool);
    if (!p.seg->expandable) tell_listener(TraceAction::SegmentFree, p.base, p.size, p.seg->stream, owner);
    if (Status st = mem_->unmap(p.base, p.size); !st.is_ok()) {
      if (!p.seg->expandable) tell_still_there(p.base, p.size, p.seg->stream, owner);
      for (auto it = backup_buffers_.begin(); it != backup_buffers_.end();)  // buffers no range holds
        if (it->second == 0) {
          mem_->host_free(it->first);
          it = backup_buffers_.erase(it);
        } else {
          ++it;
        }
      throw DeviceError(device_error("cuMemUnmap/cuMemRelease", p.size, device_, st));
    }
    Block* head = nullptr;
    for (Block* b = p.seg->head; b != nullptr; b = b->next)
      if (b->ptr == p.base) head = b;
    BlockPool& pool = *p.seg->pool;
    for (Block* b = head; b != nullptr && b->is_mapped(); b = b->next)
      if (b->is_free() && !mutant(kMutantSleepingBlockFound))  // planted: the search still finds them
        pool.blocks.erase(pool.blocks.iterator_to(*b));
    SleepingRange r;
    r.segment = p.seg;
    r.size = p.size;
    r.tag = p.tag;
    r.had_live = p.had_live;
    r.backed_up = p.backed_up;
    r.copies = std::move(p.copies);
    Bytes backup = 0;
    for (const BackupCopy& c : r.copies) backup += c.size;
    if (r.backed_up && !r.copies.empty()) {
      r.buffer = buffers.at(p.tag);
      ++backup_buffers_[r.buffer];
    }
    sleeping_.emplace(p.base, std::move(r));
    if (p.seg->expandable) tell_listener(TraceAction::SegmentUnmap, p.base, p.size, p.seg->stream, owner);
    ++p.seg->sleeping_runs;
    sleeping_bytes_ += p.size;
    sleep_stats_.sleeping_segments.increase(1);
    sleep_stats_.sleeping_bytes.increase(static_cast<std::int64_t>(p.size));
    sleep_stats_.sleeping_allocated_bytes.increase(static_cast<std::int64_t>(p.allocated));
    sleep_stats_.backup_bytes.increase(static_cast<std::int64_t>(backup));
    given += p.size;
  }
  ++sleep_stats_.num_sleeps;
  return given;
}

// ===================================================================== while asleep (section 4)

void PytorchPolicy::free_while_asleep(Block* b) {
  auto it = std::prev(sleeping_.upper_bound(b->ptr));
  SleepingRange& r = it->second;
  // Its backup goes: cut [b->ptr, b->ptr + b->size) out of the copies.
  Bytes dropped = 0;
  std::vector<BackupCopy> kept;
  for (const BackupCopy& c : r.copies) {
    const DevicePtr lo = std::max(c.ptr, b->ptr), hi = std::min(c.ptr + c.size, b->ptr + b->size);
    if (lo >= hi) {
      kept.push_back(c);
      continue;
    }
    dropped += hi - lo;
    if (c.ptr < lo) kept.push_back({c.ptr, lo - c.ptr, c.host});
    if (hi < c.ptr + c.size) kept.push_back({hi, c.ptr + c.size - hi, c.host + (hi - c.ptr)});
  }
  r.copies = std::move(kept);
  sleep_stats_.backup_bytes.decrease(static_cast<std::int64_t>(dropped));
  sleep_stats_.sleeping_allocated_bytes.decrease(static_cast<std::int64_t>(b->size));
  ++sleep_stats_.num_frees_while_asleep;

  // A free as any other (stats, trace, merging), with no stream-use event: nothing runs on memory
  // that is not there. free_block merges through the free set, so the free neighbours join it for
  // this free, and the result leaves it again until the wake.
  BlockPool& pool = pool_for(b);
  accounting_.free_requested(stat_type(pool), b->size, is_oversize(b->size));
  record(TraceAction::FreeRequested, b->ptr, b->requested_size, b->stream, trace_pool(b));
  b->stream_uses.clear();
  b->capture_stream_uses.clear();
  for (Block* n : {b->prev, b->next})
    if (n != nullptr && n->is_free() && !in_free_set(pool, n)) pool.blocks.insert(*n);  // keeps its GC age
  const DevicePtr at = b->ptr;
  free_block(b);
  Block* x = r.segment->head;
  while (x->next != nullptr && x->next->ptr <= at) x = x->next;  // the block now holding `at`
  if (!mutant(kMutantSleepingBlockFound) && in_free_set(pool, x)) pool.blocks.erase(pool.blocks.iterator_to(*x));
}

void PytorchPolicy::release_sleeping_ranges(BlockPool& from) {
  // Every sleeping range of `from` with no live block goes back entirely, addresses and all, after
  // the pool's awake free segments (release_blocks: wherever empty_cache or the last retry of a
  // malloc gives back the pool's free segments), in address order.
  std::vector<DevicePtr> gone;
  for (const auto& [base, r] : sleeping_) {
    if (r.segment->pool != &from) continue;
    bool live = false;
    for (const Block* b = r.segment->head; b != nullptr; b = b->next)
      if (b->ptr >= base && b->ptr < base + r.size && b->is_active()) live = true;
    if (!live) gone.push_back(base);
  }
  for (const DevicePtr base : gone) {
    auto it = sleeping_.find(base);
    SleepingRange r = std::move(it->second);
    sleeping_.erase(it);
    Segment* seg = r.segment;
    --seg->sleeping_runs;
    sleeping_bytes_ -= r.size;
    sleep_stats_.sleeping_segments.decrease(1);
    sleep_stats_.sleeping_bytes.decrease(static_cast<std::int64_t>(r.size));
    if (r.buffer != nullptr && --backup_buffers_[r.buffer] == 0) {
      mem_->host_free(r.buffer);
      backup_buffers_.erase(r.buffer);
    }
    Block* b = seg->head;
    while (b->ptr != base) b = b->next;
    CACHET_CHECK(b->is_free() && b->size == r.size);  // no live block: one merged free block
    BlockPool& pool = *seg->pool;
    if (in_free_set(pool, b)) pool.blocks.erase(pool.blocks.iterator_to(*b));
    if (!seg->expandable) {
      // The memory is already gone: only the addresses go back (release_block's accounting).
      if (Status st = mem_->unreserve(base, seg->size); !st.is_ok())
        throw DeviceError(device_error("cuMemAddressFree", seg->size, device_, st));
      count_device_free(pool);
      if (pool.owner != nullptr) --pool.owner->segments;
      accounting_.segment_freed(stat_type(pool), b->size, is_oversize(b->size));
      // Trackers heard of this segment's free when its memory went (sleep step 5).
      keep_in_trace(TraceAction::SegmentFree, b->ptr, b->size, b->stream, trace_pool(pool));
      total_allocated_memory_ -= b->size;
      segments_.erase(base);
      arena_.release(b);
      continue;
    }
    // A run of an expandable segment: its pages become unmapped (unmap_block's accounting).
    const Bytes page = seg->page_size;
    for (Bytes i = (base - seg->base) / page; i < (base + r.size - seg->base) / page; ++i) seg->page_mapped[i] = false;
    b->set_state(BlockState::Unmapped);
    try_merge_blocks(b, b->prev, pool);
    try_merge_blocks(b, b->next, pool);
    pool.unmapped.insert(*b);
    total_allocated_memory_ -= r.size;
    count_device_free(pool);
    accounting_.pages_unmapped(stat_type(pool), r.size, 0);
    keep_in_trace(TraceAction::SegmentUnmap, base, r.size, b->stream, trace_pool(pool));  // told at the sleep
    if (!b->is_split()) release_expandable_segment(b);
  }
}

// ===================================================================== wake (section 4)

void PytorchPolicy::wake(const TagList& tags) {
  check_sleep_call("wake()", tags, nullptr);
  std::vector<DevicePtr> waking;
  Bytes bytes = 0;
  for (const auto& [base, r] : sleeping_)
    if (!r.had_live || names_tag(tags, tag_name(r.tag))) {
      waking.push_back(base);
      bytes += r.size;
    }
  auto refuse = [&](const std::string& why) {
    ++sleep_stats_.num_wake_ooms;
    throw OutOfMemory("wake(): out of memory: waking needs " + std::to_string(bytes) + " bytes (" + format_size(bytes) +
                      ") of device memory, and " + why +
                      "; everything stays asleep with its backups: free memory and wake again");
  };
  // The cap first (sleeping bytes are not against it), then the memory of every range before any
  // backup is restored; a refusal unmaps what this call mapped.
  if (const auto cap = cap_.allowed(); cap && total_allocated_memory_ - sleeping_bytes_ + bytes > *cap)
    refuse("the memory cap of " + std::to_string(*cap) + " bytes allows " +
           std::to_string(*cap - std::min(*cap, total_allocated_memory_ - sleeping_bytes_)));
  for (std::size_t i = 0; i < waking.size(); ++i) {
    const Bytes size = sleeping_.at(waking[i]).size;
    Status st = mem_->map_pieces(waking[i], size);
    if (st.is_ok()) continue;
    for (std::size_t j = 0; j < i; ++j) (void)mem_->unmap(waking[j], sleeping_.at(waking[j]).size);
    if (st.is_oom()) refuse("the device refused " + std::to_string(size) + " bytes at " + hex(waking[i]) + " (" +
                            st.message + ")");
    throw DeviceError(device_error("cuMemCreate/cuMemMap (wake)", size, device_, st));
  }
  // The backups back, one copy per run, one synchronize.
  bool copied = false;
  for (const DevicePtr base : waking)
    for (const BackupCopy& c : sleeping_.at(base).copies) {
      if (mutant(kMutantBackupNotRestored)) continue;  // planted: mapped but not restored
      copied = true;
      if (Status st = mem_->copy_to_device(c.ptr, c.host, c.size); !st.is_ok())
        throw DeviceError(device_error("cudaMemcpyAsync (host to device)", c.size, device_, st));
    }
  if (copied)
    if (Status st = mem_->copy_synchronize(); !st.is_ok())
      throw DeviceError(device_error("cudaStreamSynchronize (restore copies)", 0, device_, st));
  // Awake: the free blocks return to their pool, merging with awake free neighbours as a free would.
  struct Woken {
    Segment* seg;
    DevicePtr base;
    Bytes size;
  };
  std::vector<Woken> woken;
  for (const DevicePtr base : waking) {
    auto it = sleeping_.find(base);
    SleepingRange& r = it->second;
    Bytes allocated = 0, backup = 0;
    for (const BackupCopy& c : r.copies) backup += c.size;
    for (Block* b = r.segment->head; b != nullptr; b = b->next)
      if (b->ptr >= base && b->ptr < base + r.size && b->is_allocated()) allocated += b->size;
    if (r.buffer != nullptr && --backup_buffers_[r.buffer] == 0) {
      mem_->host_free(r.buffer);
      backup_buffers_.erase(r.buffer);
    }
    --r.segment->sleeping_runs;
    sleeping_bytes_ -= r.size;
    sleep_stats_.sleeping_segments.decrease(1);
    sleep_stats_.sleeping_bytes.decrease(static_cast<std::int64_t>(r.size));
    sleep_stats_.sleeping_allocated_bytes.decrease(static_cast<std::int64_t>(allocated));
    sleep_stats_.backup_bytes.decrease(static_cast<std::int64_t>(backup));
    woken.push_back({r.segment, base, r.size});
    sleeping_.erase(it);
  }
  for (const auto& [seg, base, size] : woken) {
    BlockPool& pool = *seg->pool;
    // The trackers hear of the memory back (section 3): a whole segment as allocated, a run of an
    // expandable segment as mapped, after the device gave it (the trace keeps neither).
    if (seg->expandable) tell_listener(TraceAction::SegmentMap, base, size, seg->stream, trace_pool(pool));
    else tell_still_there(base, size, seg->stream, trace_pool(pool));
    Block* b = seg->head;
    while (b->ptr != base) b = b->next;
    for (; b != nullptr && b->is_mapped(); b = b->next) {
      if (!b->is_free() || in_free_set(pool, b)) continue;
      // An expandable segment's growth may have mapped a free block right beside the run.
      if (Block* prev = b->prev; prev != nullptr && in_free_set(pool, prev)) try_merge_blocks(b, prev, pool);
      if (Block* next = b->next; next != nullptr && in_free_set(pool, next)) try_merge_blocks(b, next, pool);
      pool.insert_into_blocks(b);  // entering the pool resets its GC age, as PyTorch's insert does
    }
  }
  ++sleep_stats_.num_wakes;
}

TagList PytorchPolicy::sleeping() const {
  std::set<Tag> out;
  for (const auto& [base, r] : sleeping_)
    if (r.had_live) out.insert(tag_name(r.tag));
  return {out.begin(), out.end()};
}

// What sleep()'s step 2 would pin if every tag slept now: the sizes of the live blocks of each
// backed-up tag in the segments a sleep can unmap, leaving the ranges already asleep.
std::map<std::uint32_t, Bytes> PytorchPolicy::backup_need(const TagList& backup_tags) const {
  std::map<std::uint32_t, Bytes> need;
  for (const auto& [base, seg_ptr] : segments_) {
    const Segment* seg = seg_ptr.get();
    if (!seg->vmm && !seg->expandable) continue;
    for (const Block* b = seg->head; b != nullptr; b = b->next)
      if (b->is_allocated() && sleeping_range_at(b->ptr) == nullptr && lists_tag(backup_tags, tag_name(b->tag)))
        need[b->tag] += b->size;
  }
  return need;
}

}  // namespace cachet::gpu::detail

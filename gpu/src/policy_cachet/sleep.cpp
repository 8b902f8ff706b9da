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
// blocks (merge_free). A block is wholly awake or wholly asleep: every mapped block covers whole
// mapped pages at its ends (unmapped blocks are page aligned), and sleep takes every mapped page.
//
// What this policy does not do yet (docs/sleep-wake.md section 9): sleep and wake take every tag
// at once (a list of tags is accepted only where it names every tag that has live blocks, resp.
// every sleeping tag: placement does not keep pages tag-homogeneous yet), and empty_cache leaves
// sleeping free pages reserved until the wake.
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
}  // namespace

// ===================================================================== sleep (section 3)

Bytes CachetPolicy::sleep(const TagList& tags, const TagList& backup_tags) {
  check_sleep_call("sleep()", tags, &backup_tags);
  if (pool_active())
    throw UsageError("sleep(): a CUDA graph capture or use_mem_pool is under way; end it first (a sleeping range "
                     "must not be captured into a graph)");
  // Every tag at once (this policy does not keep pages tag-homogeneous yet): a list must name
  // every tag that has live blocks on awake pages.
  if (!tags.empty())
    for (const CBlock* b = head_; b != nullptr; b = b->next)
      if (b->is_live() && !b->asleep && !names_tag(tags, tag_name(b->tag)))
        throw UsageError("sleep(): policy:cachet in gpu/ puts every tag to sleep at once for now, and the tag '" +
                         tag_name(b->tag) + "' has live blocks but is not named; call sleep() with no tags "
                         "(every tag), or use policy:pytorch (docs/sleep-wake.md section 9)");

  // 1. The backups (section 3 step 4): one copy per run of adjacent allocated blocks of one
  //    backed-up tag, decided before anything changes. Live = allocated: the synchronize of
  //    step 3 frees every block that waits for events first.
  struct Planned {
    std::uint32_t tag;
    BackupCopy copy;  // host: offset into the tag's buffer until the buffer is had
  };
  std::vector<Planned> planned;
  std::map<std::uint32_t, Bytes> need;
  for (const CBlock* b = head_; b != nullptr; b = b->next) {
    if (!b->is_allocated() || b->asleep || !lists_tag(backup_tags, tag_name(b->tag))) continue;
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

  // 3. Nothing on the device may still use memory about to go (as empty_cache does).
  try {
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

  // 5. The memory goes back by the run of awake mapped pages; the addresses stay.
  Bytes given = 0;
  std::set<std::uint32_t> slept_tags(asleep_tags_.begin(), asleep_tags_.end());
  std::vector<CBlock*> ends;  // free blocks at a run's ends: they may join sleeping free neighbours
  auto finish = [&] {
    for (CBlock* x : ends) merge_free(x);
    for (const auto& [t, h] : buffers) backup_buffers_[h] = need.at(t);
    asleep_tags_.assign(slept_tags.begin(), slept_tags.end());
    set_current(sleep_stats_.sleeping_segments, sleeping_runs());
  };
  for (CBlock* b = head_; b != nullptr;) {
    if (!b->is_mapped() || b->asleep) {
      b = b->next;
      continue;
    }
    CBlock* first = b;
    Bytes size = 0;
    for (; b != nullptr && b->is_mapped() && !b->asleep; b = b->next) size += b->size;
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
        slept_tags.insert(x->tag);
      }
      x->asleep = true;
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

// R9 for sleeping pages (section 4): every whole page of a sleeping free block of the default pool
// (a private pool's pages are its users', R10) becomes unmapped: its memory went at the sleep, so
// only the bookkeeping changes (no device call); one segment_unmap and one num_device_free per
// block's run of pages, as R6's unmapping counts them. Pinned buffers no copy lies in any more go.
void CachetPolicy::release_sleeping_free_pages() {
  if (sleeping_bytes_ == 0 || pool_active()) return;
  std::vector<CBlock*> frees;
  for (CBlock* b = head_; b != nullptr; b = b->next)
    if (b->asleep && b->is_mapped_free() && b->pool.is_default() && page_floor(b->end()) > page_ceil(b->ptr))
      frees.push_back(b);
  if (frees.empty()) return;
  for (CBlock* b : frees) {
    const DevicePtr lo = page_ceil(b->ptr), hi = page_floor(b->end());
    accounting_.pages_unmapped(StatType::LargePool, hi - lo,
                               run_delta(lo > b->ptr || mapped_block(b->prev), hi < b->end() || mapped_block(b->next), false));
    record(TraceAction::SegmentUnmap, lo, hi - lo, b->stream);
    CBlock* mid = b;
    if (lo > b->ptr) mid = split_at(b, lo);  // b keeps [ptr, lo), asleep
    if (mid->end() > hi) split_at(mid, hi);  // [hi, end) stays asleep
    mid->set_state(BlockState::Unmapped);
    mid->asleep = false;
    mid->stream = 0;
    mid->pool = PoolId{};
    merge_free(mid);
    sleeping_bytes_ -= hi - lo;
    sleep_stats_.sleeping_bytes.decrease(static_cast<std::int64_t>(hi - lo));
  }
  set_current(sleep_stats_.sleeping_segments, sleeping_runs());
  std::set<std::uint32_t> tags;
  for (const CBlock* b = head_; b != nullptr; b = b->next)
    if (b->asleep && b->is_allocated()) tags.insert(b->tag);
  asleep_tags_.assign(tags.begin(), tags.end());
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
  if (sleeping_bytes_ == 0) {
    ++sleep_stats_.num_wakes;
    return;
  }
  if (!tags.empty())
    for (std::uint32_t t : asleep_tags_)
      if (!names_tag(tags, tag_name(t)))
        throw UsageError("wake(): policy:cachet in gpu/ wakes every tag at once for now, and the sleeping tag '" +
                         tag_name(t) + "' is not named; call wake() with no tags (every tag), or use policy:pytorch "
                         "(docs/sleep-wake.md section 9)");
  const Bytes bytes = sleeping_bytes_;
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
  std::vector<std::pair<DevicePtr, Bytes>> runs;
  for (CBlock* b = head_; b != nullptr; b = b->next) {
    if (!b->asleep) continue;
    if (!runs.empty() && runs.back().first + runs.back().second == b->ptr)
      runs.back().second += b->size;
    else
      runs.emplace_back(b->ptr, b->size);
  }
  for (std::size_t i = 0; i < runs.size(); ++i) {
    Status st = mem_->map_pieces(runs[i].first, runs[i].second);
    if (st.is_ok()) continue;
    for (std::size_t j = 0; j < i; ++j) (void)mem_->unmap(runs[j].first, runs[j].second);
    if (st.is_oom())
      refuse("the device refused " + std::to_string(runs[i].second) + " bytes at " + hex(runs[i].first) + " (" +
             st.message + ")");
    throw DeviceError(device_error("cuMemCreate/cuMemMap (wake)", runs[i].second, device_, st));
  }
  // The backups back, one copy per run, one synchronize.
  bool copied = false;
  for (const BackupCopy& c : backups_) {
    if constexpr (mutant(kMutantBackupNotRestored)) continue;  // planted: mapped but not restored
    copied = true;
    if (Status st = mem_->copy_to_device(c.ptr, c.host, c.size); !st.is_ok())
      throw DeviceError(device_error("cudaMemcpyAsync (host to device)", c.size, device_, st));
  }
  if (copied)
    if (Status st = mem_->copy_synchronize(); !st.is_ok())
      throw DeviceError(device_error("cudaStreamSynchronize (restore copies)", 0, device_, st));
  for (auto& [h, n] : backup_buffers_) mem_->host_free(h);
  backup_buffers_.clear();
  backups_.clear();
  asleep_tags_.clear();
  // Awake: the free blocks return to their pool's free set, merging with awake free neighbours
  // as a free would.
  std::vector<CBlock*> frees;
  for (CBlock* b = head_; b != nullptr; b = b->next) {
    if (!b->asleep) continue;
    b->asleep = false;
    if (b->is_mapped_free()) frees.push_back(b);
  }
  for (CBlock* b : frees) merge_free(b);
  mapped_ += bytes;
  sleeping_bytes_ = 0;
  set_current(sleep_stats_.sleeping_segments, 0);
  set_current(sleep_stats_.sleeping_bytes, 0);
  set_current(sleep_stats_.sleeping_allocated_bytes, 0);
  set_current(sleep_stats_.backup_bytes, 0);
  // R4 as at the end of a capture (R12): free pages beyond budget(T) are unmapped again.
  trim_to_budget();
  ++sleep_stats_.num_wakes;
}

TagList CachetPolicy::sleeping() const {
  TagList out;
  for (std::uint32_t t : asleep_tags_) out.push_back(tag_name(t));
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace cachet::gpu::detail

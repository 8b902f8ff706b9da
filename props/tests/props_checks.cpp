// The named checks of the properties and the one step every command takes (props.h).
#include "props.h"

namespace cachet::props {

// ------------------------------------------------------------------------------- the checks

// Every named check; CACHET_PROPS_CHECKS selects a subset.
const std::vector<std::string> kChecks{
    "lockstep",        // same pointer or error, same 122 stats, same snapshot, both invariants
    "sut-invariants",  // the allocator's invariants() (docs/invariants.md)
    "no-overlap",      // segments and live blocks never overlap; every block inside its segment
    "tiling",          // blocks tile each segment exactly, in address order
    "coalescing",      // no two adjacent free blocks (no pending events) in one segment
    "split-limit",     // max_split_size / max_non_split_rounding rules, no small large-pool block
    "rounding",        // 512-byte alignment and PyTorch's round_size for every returned block
    "stats-recount",   // stats equal a recount from the block table (block_table(): the snapshot's
                       // runs and an orphaned pool's hidden ones)
    "memory-cap",      // reserved <= cap (expandable: by less than one page)
    "pending-event",   // a block waiting for an event on another stream is never handed out
    "stream",          // a block is handed out only on its own segment's stream
    "replay",          // replaying the same commands after free-all + empty_cache: reserved does not grow
    "sleeping-range",  // docs/sleep-wake.md: no allocation is placed in a sleeping segment; the
                       // sleep.* stats equal a recount of the sleeping segments of the block table
};

std::set<std::string> split_list(const char* env) {
  std::set<std::string> r;
  if (!env) return r;
  std::stringstream ss(env);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty()) r.insert(item);
  return r;
}

const std::set<std::string>& enabled_checks() {
  static const std::set<std::string> s = [] {
    auto e = split_list(std::getenv("CACHET_PROPS_CHECKS"));
    return e.empty() ? std::set<std::string>(kChecks.begin(), kChecks.end()) : e;
  }();
  return s;
}
bool on(const char* check) { return enabled_checks().count(check) != 0; }

std::string hex(std::uint64_t v) {
  char b[32];
  std::snprintf(b, sizeof b, "0x%llx", static_cast<unsigned long long>(v));
  return b;
}

void PSut::step(const Op& op, std::optional<std::size_t> new_slot) {
  // A PyTorch failure (docs/pytorch-allocator.md §14.8) ended the case: the lockstep applies nothing more.
  if (ls_->ended()) return;
  applied_.push_back(op);
  const DeviceStats before = ls_->sut().stats();
  const SleepStats sleep_before = ls_->sut().sleep_stats();
  const lockstep::DeviceCounters dev_before = ls_->device_counters();
  const std::uint32_t handles_before = ls_->handle_count();
  // A capture or use_mem_pool under way (the op does not change it unless it is a pool op).
  const bool underway = ls_->pools().underway();

  if (auto d = ls_->apply(op)) {
    const bool inv = d->rfind("sut invariants()", 0) == 0;
    if (inv ? on("sut-invariants") : on("lockstep")) fail(inv ? "sut-invariants" : "lockstep", *d);
  }
  const lockstep::Outcome& out = ls_->last_sut();
  const DeviceStats st = ls_->sut().stats();
  const lockstep::DeviceCounters& dev = ls_->device_counters();

  // Slot bookkeeping: a new handle belongs to this Allocate command's slot.
  if (new_slot) {
    if (slot_handle_.size() <= *new_slot) slot_handle_.resize(*new_slot + 1);
    if (ls_->handle_count() > handles_before) slot_handle_[*new_slot] = handles_before;
  }

  // Pending-event bookkeeping (host events complete only when told).
  const bool synced = st.num_sync_all_streams != before.num_sync_all_streams;
  if (synced) pending_.clear();
  if (const auto* f = std::get_if<lockstep::Free>(&op); f && out.kind == lockstep::Outcome::Kind::Ok) {
    auto it = recorded_.find(f->handle);
    if (it != recorded_.end()) {
      std::set<StreamId> others;
      const std::set<StreamId>& in_capture = recorded_in_capture_[f->handle];
      for (StreamId s : it->second)
        if (s != ls_->stream(f->handle) && !(underway && in_capture.contains(s))) others.insert(s);
      // A free while asleep records no event (docs/sleep-wake.md §4: nothing runs on memory that
      // is not there): nothing is pending.
      const bool asleep = ls_->sut().sleep_stats().num_frees_while_asleep != sleep_before.num_frees_while_asleep;
      if (!others.empty() && !asleep)
        pending_.push_back({ls_->address(f->handle), rounded(ls_->requested(f->handle)), others});
      recorded_.erase(it);
    }
    recorded_in_capture_.erase(f->handle);
    if (st.active[0].current > st.allocation[0].current) cov_.deferred_free = true;
  }
  if (const auto* r = std::get_if<lockstep::RecordStream>(&op); r && out.kind == lockstep::Outcome::Kind::Ok) {
    recorded_[r->handle].insert(r->stream);
    if (underway) recorded_in_capture_[r->handle].insert(r->stream);
  }
  if (const auto* c = std::get_if<lockstep::CompleteEvents>(&op)) {
    for (auto& p : pending_) p.streams.erase(c->stream);
    std::erase_if(pending_, [](const PendingBlock& p) { return p.streams.empty(); });
  }
  if (events_when_recorded_) pending_.clear();  // events complete when recorded (a real device)
  if (std::holds_alternative<lockstep::EmptyCache>(op)) pending_.clear();

  // Coverage.
  if (st.oversize_allocations.allocated > 0) cov_.oversize = true;
  if (st.num_alloc_retries > 0) cov_.retry = true;
  if (st.num_ooms > 0) cov_.oom = true;
  if ((config_.expandable_segments || cachet()) && dev.maps > 0) cov_.exp_map = true;
  if ((config_.expandable_segments || cachet()) && dev.unmaps > 0) cov_.exp_unmap = true;
  if (std::holds_alternative<lockstep::Allocate>(op) && config_.garbage_collection_threshold > 0 &&
      ls_->cap() && st.num_device_free > before.num_device_free &&
      st.num_alloc_retries == before.num_alloc_retries && st.num_ooms == before.num_ooms)
    cov_.gc = true;

  // Memory-cap bookkeeping: lowering the fraction below what is reserved frees nothing.
  if (std::holds_alternative<lockstep::SetMemoryFraction>(op))
    ceiling_ = std::max(ceiling_, static_cast<Bytes>(before.reserved_bytes[0].current));

  if (std::holds_alternative<ops::CaptureBegin>(op) && out.kind == lockstep::Outcome::Kind::Ok)
    cov_.capture = true;
  if (ls_->ended()) cov_.pytorch_failure = true;
  // No event is queried during a capture: a free completed by an allocation then is the reuse
  // of §14.10.1 (the sut's trace holds this op's events only).
  if (underway && config_.graph_capture_record_stream_reuse && std::holds_alternative<lockstep::Allocate>(op))
    for (const TraceEvent& e : ls_->sut().trace())
      if (e.action == TraceAction::FreeCompleted) cov_.capture_reuse = true;
  const SleepStats sleep_st = ls_->sut().sleep_stats();
  cov_.sleeps += static_cast<std::size_t>(sleep_st.num_sleeps - sleep_before.num_sleeps);
  cov_.wakes += static_cast<std::size_t>(sleep_st.num_wakes - sleep_before.num_wakes);
  cov_.frees_while_asleep += static_cast<std::size_t>(sleep_st.num_frees_while_asleep - sleep_before.num_frees_while_asleep);
  cov_.wake_ooms += static_cast<std::size_t>(sleep_st.num_wake_ooms - sleep_before.num_wake_ooms);

  const Snapshot snap = ls_->sut().snapshot();
  if (out.kind == lockstep::Outcome::Kind::Pointer && out.ptr != 0)
    for (const auto& seg : snap)
      if (!seg.pool_id.is_default() && out.ptr >= seg.address && out.ptr < seg.address + seg.total_size)
        cov_.pool_alloc = true;
  structural_checks(snap, st);
  sleep_checks(out, sleep_st, st);
  if (const auto* a = std::get_if<lockstep::Allocate>(&op);
      a && out.kind == lockstep::Outcome::Kind::Pointer && out.ptr != 0)
    alloc_checks(*a, out.ptr, snap, dev.mallocs + dev.maps > dev_before.mallocs + dev_before.maps, synced);
}

void PSut::structural_checks(const Snapshot& snap, const DeviceStats& st) {
  // no-overlap: segments disjoint and ordered; blocks inside their segment, disjoint.
  if (applies("no-overlap")) {
    for (std::size_t i = 0; i < snap.size(); ++i) {
      const auto& s = snap[i];
      if (i + 1 < snap.size() && s.address + s.total_size > snap[i + 1].address)
        fail("no-overlap", "segment " + hex(s.address) + " (+" + std::to_string(s.total_size) +
                               ") overlaps segment " + hex(snap[i + 1].address));
      for (std::size_t j = 0; j < s.blocks.size(); ++j) {
        const auto& b = s.blocks[j];
        if (b.address < s.address || b.address + b.size > s.address + s.total_size)
          fail("no-overlap", "block " + hex(b.address) + " size " + std::to_string(b.size) +
                                 " lies outside its segment " + hex(s.address) + " size " +
                                 std::to_string(s.total_size));
        if (j + 1 < s.blocks.size() && b.address + b.size > s.blocks[j + 1].address)
          fail("no-overlap", "block " + hex(b.address) + " size " + std::to_string(b.size) + " overlaps block " +
                                 hex(s.blocks[j + 1].address));
      }
    }
  }
  // tiling: from the segment's base, each block starts where the previous ended, to the end.
  if (applies("tiling")) {
    for (const auto& s : snap) {
      std::uint64_t at = s.address;
      for (const auto& b : s.blocks) {
        if (b.address != at || b.size == 0)
          fail("tiling", "segment " + hex(s.address) + ": block at " + hex(b.address) + " (size " +
                             std::to_string(b.size) + "), expected one at " + hex(at));
        at = b.address + b.size;
      }
      if (at != s.address + s.total_size)
        fail("tiling", "segment " + hex(s.address) + " size " + std::to_string(s.total_size) + ": blocks end at " +
                           hex(at));
    }
  }
  // coalescing: no two adjacent inactive blocks in one segment.
  if (applies("coalescing")) {
    for (const auto& s : snap)
      for (std::size_t j = 0; j + 1 < s.blocks.size(); ++j) {
        const auto &a = s.blocks[j], &b = s.blocks[j + 1];
        if (a.state == BlockState::Inactive && b.state == BlockState::Inactive && a.address + a.size == b.address)
          fail("coalescing", "adjacent free blocks " + hex(a.address) + " (" + std::to_string(a.size) + ") and " +
                                 hex(b.address) + " (" + std::to_string(b.size) + ") in segment " + hex(s.address));
      }
  }
  // split-limit (segment side): a cudaMalloc'd large-pool block is never 1 MiB or less
  // (a remainder of 1 MiB or less is not split off).
  if (applies("split-limit")) {
    for (const auto& s : snap)
      if (s.is_large && !s.is_expandable)
        for (const auto& b : s.blocks)
          if (b.size <= kSmallSize)
            fail("split-limit", "block " + hex(b.address) + " of " + std::to_string(b.size) +
                                    " B (<= 1 MiB) in large segment " + hex(s.address));
  }
  // stats-recount: stats equal a recount from the block table, per pool and in total. Not from
  // `snap`: memory_snapshot() does not show an orphaned pool's mapped run that begins with a free
  // block (docs/pytorch-allocator.md §14.8, as PyTorch's snapshot), yet its blocks and pages stay
  // counted in the stats; block_table() lists them too.
  if (applies("stats-recount")) {
    struct Count {
      std::int64_t alloc_n = 0, alloc_b = 0, active_n = 0, active_b = 0, req_b = 0, reserved = 0;
    } c[3];
    for (const auto& s : ls_->sut().block_table()) {
      for (int k : {0, s.is_large ? 2 : 1}) {
        if (k != 0 && cachet()) continue;
        c[k].reserved += static_cast<std::int64_t>(s.total_size);
        for (const auto& b : s.blocks) {
          if (b.state == BlockState::Inactive) continue;
          ++c[k].active_n;
          c[k].active_b += static_cast<std::int64_t>(b.size);
          c[k].req_b += static_cast<std::int64_t>(b.requested_size);
          if (b.state == BlockState::ActiveAllocated) {
            ++c[k].alloc_n;
            c[k].alloc_b += static_cast<std::int64_t>(b.size);
          }
        }
      }
    }
    static const char* pool[] = {"all", "small_pool", "large_pool"};
    // policy:cachet counts small and large requests in its stats but reports one reservation
    // (every segment "large"): recounted over all pools only.
    for (int k = 0; k < (cachet() ? 1 : 3); ++k) {
      const std::pair<const char*, std::pair<std::int64_t, std::int64_t>> rows[] = {
          {"allocation", {st.allocation[k].current, c[k].alloc_n}},
          {"allocated_bytes", {st.allocated_bytes[k].current, c[k].alloc_b}},
          {"active", {st.active[k].current, c[k].active_n}},
          {"active_bytes", {st.active_bytes[k].current, c[k].active_b}},
          {"requested_bytes", {st.requested_bytes[k].current, c[k].req_b}},
          {"reserved_bytes", {st.reserved_bytes[k].current, c[k].reserved}},
      };
      for (const auto& [name, v] : rows)
        if (v.first != v.second)
          fail("stats-recount", std::string(name) + "." + pool[k] + ".current is " + std::to_string(v.first) +
                                    ", the block table says " + std::to_string(v.second));
    }
  }
  // memory-cap: reserved <= cap (expandable: by less than one page), unless the cap was
  // lowered below what was reserved; then reserved must not grow.
  if (applies("memory-cap")) {
    const auto cap = ls_->cap();
    // Sleeping bytes stay reserved but do not count against the cap (docs/sleep-wake.md §4).
    const Bytes reserved = static_cast<Bytes>(st.reserved_bytes[0].current) -
                           static_cast<Bytes>(ls_->sut().sleep_stats().sleeping_bytes.current);
    if (!cap || reserved <= *cap) ceiling_ = 0;
    const Bytes slack = config_.expandable_segments ? config_.large_segment_size - 1 : 0;
    if (cap && reserved > *cap + slack && reserved > ceiling_)
      fail("memory-cap", "reserved " + std::to_string(reserved) + " B exceeds the cap of " + std::to_string(*cap) +
                             " B" + (slack ? " by a page or more" : ""));
  }
}

// sleeping-range (docs/sleep-wake.md §4, §5, §7 SLEEP-R2/R3): a pointer returned lies in no
// sleeping segment; the sleep stats' current values equal a recount from the block table
// (policy:cachet: sleep.sleeping_segments counts runs of adjacent sleeping segments).
void PSut::sleep_checks(const lockstep::Outcome& out, const SleepStats& ss, const DeviceStats& st) {
  if (!applies("sleeping-range") || !config_.sleep) return;
  std::int64_t segments = 0, bytes = 0, allocated = 0, backup = 0;
  // policy:cachet counts runs of sleeping pages (§5): its snapshot also cuts a run where the pool
  // changes, so a sleeping segment right after another one continues its run.
  std::uint64_t run_end = 0;
  const bool runs = config_.policy == Policy::Cachet;
  for (const auto& s : ls_->sut().block_table()) {
    if (out.kind == lockstep::Outcome::Kind::Pointer && out.ptr != 0 && s.is_sleeping && out.ptr >= s.address &&
        out.ptr < s.address + s.total_size)
      fail("sleeping-range", "allocate -> " + hex(out.ptr) + ", inside the sleeping segment " + hex(s.address) +
                                 " (" + std::to_string(s.total_size) + " B)");
    if (!s.is_sleeping) continue;
    if (!runs || s.address != run_end) ++segments;
    run_end = s.address + s.total_size;
    bytes += static_cast<std::int64_t>(s.total_size);
    backup += static_cast<std::int64_t>(s.backup_size);
    for (const auto& b : s.blocks)
      if (b.state == BlockState::ActiveAllocated) allocated += static_cast<std::int64_t>(b.size);
  }
  const std::pair<const char*, std::pair<std::int64_t, std::int64_t>> rows[] = {
      {"sleep.sleeping_segments", {ss.sleeping_segments.current, segments}},
      {"sleep.sleeping_bytes", {ss.sleeping_bytes.current, bytes}},
      {"sleep.sleeping_allocated_bytes", {ss.sleeping_allocated_bytes.current, allocated}},
      {"sleep.backup_bytes", {ss.backup_bytes.current, backup}},
  };
  for (const auto& [name, v] : rows)
    if (v.first != v.second)
      fail("sleeping-range", std::string(name) + ".current is " + std::to_string(v.first) +
                                 ", the block table's sleeping segments say " + std::to_string(v.second));
  if (bytes > st.reserved_bytes[0].current)
    fail("sleeping-range", "sleeping bytes " + std::to_string(bytes) + " exceed reserved_bytes " +
                               std::to_string(st.reserved_bytes[0].current));
}

void PSut::alloc_checks(const lockstep::Allocate& a, std::uint64_t ptr, const Snapshot& snap,
                        bool new_device_memory, bool synced) {
  const SegmentSnapshot* seg = nullptr;
  std::size_t idx = 0;
  for (const auto& s : snap)
    for (std::size_t j = 0; j < s.blocks.size(); ++j)
      if (s.blocks[j].address == ptr) {
        seg = &s;
        idx = j;
      }
  if (!seg) {
    if (applies("no-overlap")) fail("no-overlap", "allocate returned " + hex(ptr) + ", which starts no block");
    return;
  }
  const BlockSnapshot& b = seg->blocks[idx];
  const BlockSnapshot* next = idx + 1 < seg->blocks.size() ? &seg->blocks[idx + 1] : nullptr;
  const Bytes rounded = this->rounded(a.size);
  const Bytes max_split = config_.max_split_size;

  if (applies("rounding")) {
    std::string why;
    if (ptr % kMinBlockSize != 0) why = "pointer not 512-byte aligned";
    else if (b.size % kMinBlockSize != 0) why = "block size not a multiple of 512";
    else if (b.size < rounded) why = "block smaller than round_size(request) = " + std::to_string(rounded);
    else if (b.requested_size != a.size) why = "requested_size " + std::to_string(b.requested_size);
    else if ((!seg->is_large || seg->is_expandable) && b.size != rounded)
      why = "block of " + std::to_string(b.size) + " B, round_size(request) = " + std::to_string(rounded) +
            " (small pool / expandable blocks are split to the rounded size)";
    else if (seg->is_large && !seg->is_expandable && rounded < max_split && b.size - rounded > kSmallSize)
      why = "block of " + std::to_string(b.size) + " B for round_size " + std::to_string(rounded) +
            ": a remainder over 1 MiB was not split off";
    if (!why.empty())
      fail("rounding", "allocate(" + std::to_string(a.size) + ") -> " + hex(ptr) + ": " + why);
  }
  if (applies("split-limit") && max_split != kNoMaxSplit && !seg->is_expandable) {
    if (rounded >= max_split && next && next->state == BlockState::Inactive)
      fail("split-limit", "oversize request " + std::to_string(a.size) + " (rounded " + std::to_string(rounded) +
                              ") split its block: free remainder " + hex(next->address) + " of " +
                              std::to_string(next->size) + " B follows it");
    if (!new_device_memory) {
      // The cached block it came from: this block plus a remainder split off it.
      const Bytes original =
          b.size + (next && next->state == BlockState::Inactive && rounded < max_split ? next->size : 0);
      if (rounded < max_split && original >= max_split)
        fail("split-limit", "request " + std::to_string(a.size) + " below max_split_size " +
                                std::to_string(max_split) + " took a cached block of " + std::to_string(original) +
                                " B");
      if (rounded >= max_split && b.size >= rounded + config_.max_non_split_rounding)
        fail("split-limit", "oversize request " + std::to_string(rounded) + " took a cached block of " +
                                std::to_string(b.size) + " B (>= request + max_non_split_rounding " +
                                std::to_string(config_.max_non_split_rounding) + ")");
    }
  }
  if (applies("stream") && seg->stream != a.stream)
    fail("stream", "allocate on stream " + std::to_string(a.stream) + " -> " + hex(ptr) +
                       ", a block of a segment of stream " + std::to_string(seg->stream));
  if (applies("pending-event") && !synced)
    for (const auto& p : pending_)
      if (ptr < p.addr + p.size && p.addr < ptr + b.size)
        fail("pending-event", "allocate -> " + hex(ptr) + " (" + std::to_string(b.size) + " B) hands out " +
                                  hex(p.addr) + ", freed while an event on stream " +
                                  std::to_string(*p.streams.begin()) + " was pending");
}

}  // namespace cachet::props

// The cachet policy model: free, stream uses and events (R8), empty_cache (R9).
//
// An event is (stream, n): the n-th event recorded on that stream. complete_events(s) completes
// every event recorded on s so far; a pending block becomes free when all of its events have
// completed, at the next malloc (process_events) or at a synchronizing call (R7, R9).
#include <cinttypes>
#include <cstdio>
#include <string>

#include "cachet/errors.h"
#include "cachet/model/cachet_policy.h"

namespace cachet::model {

namespace {

std::string hex(std::uint64_t v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%" PRIx64, v);
  return buf;
}

StatType pool_of(Bytes size) {
  return size <= kSmallSize ? StatType::SmallPool : StatType::LargePool;
}

void drop(StatArray& a, StatType pool, std::int64_t n) {
  DeviceStats::for_all_and(a, pool, [n](Stat& s) { s.decrease(n); });
}

}  // namespace

CachetPolicy::Block& CachetPolicy::live_block(std::uint64_t ptr, const char* op) {
  auto it = blocks_.find(ptr);
  if (it == blocks_.end() || !it->second.live())
    throw UsageError(std::string(op) + "(" + hex(ptr) + "): not a block this allocator handed out");
  return it->second;
}

void CachetPolicy::free(std::uint64_t ptr) {
  if (ptr == 0) return;
  Block& b = live_block(ptr, "free");
  if (b.state() != BlockState::Allocated) throw UsageError("free(" + hex(ptr) + "): double free");
  const StatType pool = pool_of(b.size);
  drop(stats_.allocation, pool, 1);
  drop(stats_.allocated_bytes, pool, static_cast<std::int64_t>(b.size));
  record(TraceAction::FreeRequested, ptr, b.requested, b.stream);
  if (asleep(b)) {  // docs/sleep-wake.md, section 4: no event, free at once, found at its wake
    free_while_asleep(b);
    return;
  }
  if (b.uses.empty()) {
    free_completed(b);
    trim_to_cap();  // R7: only acts while mapped bytes are above a lowered cap
    return;
  }
  if (pool_active()) {  // R12: no event while a pool is active; the uses are kept
    b.set_state(BlockState::Deferred);
    deferred_.push_back(ptr);
    return;
  }
  b.set_state(BlockState::AwaitingEvents);
  for (StreamId s : b.uses) record_event(ptr, s);
  b.uses.clear();
}

// R12: no pool is active any more: each deferred free gets one event per stream it was used on,
// in the order they were freed.
void CachetPolicy::record_deferred_events() {
  for (std::uint64_t ptr : deferred_) {
    Block& b = blocks_.at(ptr);
    b.set_state(BlockState::AwaitingEvents);  // Deferred -> AwaitingEvents
    for (StreamId s : b.uses) record_event(ptr, s);
    b.uses.clear();
  }
  deferred_.clear();
}

// The block leaves the live set (Allocated or AwaitingEvents -> Free): free of its allocation
// stream, merged with that stream's free neighbours (R8). Only the stream's own allocations see
// it until its pages are unmapped.
void CachetPolicy::free_completed(Block& b) {
  const StatType pool = pool_of(b.size);
  drop(stats_.active, pool, 1);
  drop(stats_.active_bytes, pool, static_cast<std::int64_t>(b.size));
  drop(stats_.requested_bytes, pool, static_cast<std::int64_t>(b.requested));
  record(TraceAction::FreeCompleted, b.ptr, b.requested, b.stream);
  b.set_state(BlockState::Free);
  b.uses.clear();
  leave_released_pool(b);  // R11
  merge(b.ptr);
}

void CachetPolicy::record_stream(std::uint64_t ptr, StreamId stream) {
  Block& b = live_block(ptr, "record_stream");
  if (b.state() != BlockState::Allocated)
    throw UsageError("record_stream(" + hex(ptr) + "): the block was already freed");
  if (stream != b.stream) b.uses.insert(stream);
}

// One event on `s` for the block at ptr (R8); complete at once on a device running no kernels.
void CachetPolicy::record_event(std::uint64_t ptr, StreamId s) {
  events_[ptr].emplace_back(s, recorded_[s]++);
  if (events_when_recorded_) completed_[s] = recorded_[s];
}

void CachetPolicy::complete_events(StreamId stream) {
  completed_[stream] = recorded_[stream];
}

void CachetPolicy::complete_all_events() {
  for (const auto& [stream, n] : recorded_) completed_[stream] = n;
}

void CachetPolicy::process_events() {
  if (pool_active()) return;  // R12 (callers check it too)
  record_deferred_events();
  std::vector<std::uint64_t> done;
  for (const auto& [ptr, events] : events_) {
    bool all = true;
    for (const auto& [stream, n] : events) all = all && n < completed_[stream];
    if (all) done.push_back(ptr);
  }
  for (std::uint64_t ptr : done) {
    events_.erase(ptr);
    free_completed(blocks_.at(ptr));
  }
  trim_to_cap();
}

// Wait for every pending event (num_sync_all_streams counts the waits).
void CachetPolicy::synchronize_events() {
  if (pool_active()) return;  // R12 (callers check it too)
  ++stats_.num_sync_all_streams;
  record_deferred_events();
  complete_all_events();
  process_events();
}

// R9: wait for pending events, then unmap every whole free page; the reservation stays. R12:
// no wait and no unmapping while a pool is active.
void CachetPolicy::empty_cache() {
  if (!pool_active() && (!events_.empty() || !deferred_.empty())) synchronize_events();
  unmap_whole_free_pages(~Bytes{0}, 0, 0);
  // Sleeping pages no live block touches go back too, addresses and all (docs/sleep-wake.md).
  if (!pool_active()) release_sleeping_free_pages();
}

}  // namespace cachet::model

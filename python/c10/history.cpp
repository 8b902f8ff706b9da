// python/c10/history.cpp: _record_memory_history through the c10 backend, the seam of PyTorch's
// recordHistory, record_trace and trace() (docs/pytorch-allocator.md section 8; python/README.md,
// "The c10 backend"): turning the history on and off, the contexts PyTorch's recorder gives
// (gathered outside every lock, kept by call in History, history.h), cachet's trace as PyTorch's
// TraceEntry list with the context native's record_trace gives each entry, annotations, and the
// trace trackers (called as gpu/ makes each event: before a segment's device free, after its
// allocation, with the entry's pool id; docs/pytorch-allocator.md §8, "Trace trackers").
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>

#include "c10/backend.h"

namespace cachet::c10_backend {
namespace {

cda::TraceEntry::Action to_action(cachet::TraceAction a) {
  using A = cda::TraceEntry::Action;
  switch (a) {
    case cachet::TraceAction::Alloc: return A::ALLOC;
    case cachet::TraceAction::FreeRequested: return A::FREE_REQUESTED;
    case cachet::TraceAction::FreeCompleted: return A::FREE_COMPLETED;
    case cachet::TraceAction::SegmentAlloc: return A::SEGMENT_ALLOC;
    case cachet::TraceAction::SegmentFree: return A::SEGMENT_FREE;
    case cachet::TraceAction::SegmentMap: return A::SEGMENT_MAP;
    case cachet::TraceAction::SegmentUnmap: return A::SEGMENT_UNMAP;
    case cachet::TraceAction::Snapshot: return A::SNAPSHOT;
    case cachet::TraceAction::Oom: return A::OOM;
  }
  return A::SNAPSHOT;
}

}  // namespace

void CachetCUDAAllocator::recordHistory(bool enabled, cc::CreateContextFn context_recorder,
                                        size_t alloc_trace_max_entries, cc::RecordContext when, bool clearHistory,
                                        const std::vector<std::string>& skip_actions) {
  TORCH_CHECK(when == cc::RecordContext::NEVER || context_recorder);
  std::vector<cda::TraceEntry::Action> skips;
  for (const auto& s : skip_actions) skips.push_back(cda::parseTraceEntryAction(s));
  // Turning it on starts from an empty trace, as native's (turning it off cleared its buffer):
  // what cachet's trace holds then was recorded for the cachet_torch_* API, without the contexts
  // History aligns with it. Trace trackers need no trace (gpu/'s listener tells them).
  const bool was_on = history_on_.load();
  {
    std::lock_guard<std::mutex> lock(mu_);
    max_entries_ = std::max<size_t>(alloc_trace_max_entries, 1);
    skip_actions_ = std::move(skips);
    recorder_.store(enabled ? context_recorder : nullptr);
    record_context_.store(enabled ? static_cast<int>(when) : 0);
    history_on_.store(enabled);
    if (!enabled || clearHistory) annotations_.clear();
  }
  const bool clear = !enabled || clearHistory || !was_on;
  set_trace_all(enabled, clear);
}

void CachetCUDAAllocator::recordAnnotation(const std::vector<std::pair<std::string, std::string>>& md) {
  if (!history_on_.load()) return;
  c10::DeviceIndex device = 0;
  C10_CUDA_CHECK(c10::cuda::GetDevice(&device));
  cda::AnnotationEntry ae(device, 0);
  ae.time_.t_ = static_cast<time_t>(now_us());
  for (const auto& [k, v] : md) ae.recordUserMetadata(k, v);
  std::lock_guard<std::mutex> lock(mu_);
  annotations_.push_back(std::move(ae));
  if (annotations_.size() > max_entries_) annotations_.erase(annotations_.begin());
}

// ---- trace trackers ----------------------------------------------------------------------
//
// Trackers (ProcessGroupNCCL's register hook with TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK=1:
// ncclCommRegister at SEGMENT_ALLOC, ncclCommDeregister at SEGMENT_FREE, for the pools registered
// with a communicator or for every pool) see each trace entry as native's record_trace hands it
// to them: as gpu/ makes the event (its listener, cachet/trace.h), so a segment's free before the
// device gives its memory back (also when empty_cache, a pool's release, an allocation's retry or
// garbage collection frees it), its allocation after, each entry with its pool's id (the MemPool
// or CUDA graph pool owning the segment, {0, 0} for the default pools; TraceEntry::mempool_, which
// the hook compares with the pools registered with a communicator), with no context (native's
// carries the caller's at context="alloc" or "all"; the contexts are kept under History's lock,
// which is never taken under cachet's). Expandable segments give segment_map and segment_unmap
// entries (after the map, after the unmap), as native's do; PyTorch turns the hook off under them.
// cachet_torch.sleep and wake tell the trackers of the memory they give back and get again:
// SEGMENT_FREE before a sleeping segment's memory goes and SEGMENT_ALLOC once a wake mapped it
// again (docs/sleep-wake.md section 3), so NCCL holds no registration of unmapped memory.
//
// The lock: native calls trackers under its (recursive) device mutex, cachet under its per-device
// lock (gpu/'s SpinMutex, not recursive), both in the allocation or free that made the entry.
// NCCL's hooks take their own mutex and call ncclCommRegister / ncclCommDeregister, which work on
// NCCL's own handles and never call PyTorch's allocator; a tracker that does call into the c10
// backend is refused with an error (refuse_call_from_tracker) instead of spinning on the lock it
// already holds, but for a free (a tensor the tracker dropped: a deleter must not throw), which is
// made once the call that ran the tracker returns. Trackers are read without a lock (a copied list, trackers_), so attaching one
// from a tracker is harmless. A tracker's exception must not unwind through gpu/'s state: it is
// kept for the calling thread and raised once cachet's call returned (raise_tracker_error), or
// only warned about by a free (a deleter runs in destructors).
namespace {
thread_local std::exception_ptr t_tracker_error;  // the first exception of a tracker on this thread
thread_local int t_in_tracker = 0;                // > 0 while this thread runs a tracker
thread_local std::vector<void*> t_deferred_frees;  // frees a tracker made, for after the call

// The frees trackers made on this thread, now that no lock is held: each as any free (its own
// trackers' failures join t_tracker_error).
void free_deferred() {
  while (!t_deferred_frees.empty()) {
    std::vector<void*> frees = std::exchange(t_deferred_frees, {});
    for (void* p : frees) {
      try {
        g_the_allocator.load(std::memory_order_acquire)->free(p);
      } catch (...) {
        if (!t_tracker_error) t_tracker_error = std::current_exception();
      }
    }
  }
}
}  // namespace

bool CachetCUDAAllocator::defer_free_from_tracker(void* ptr) {
  if (t_in_tracker == 0) [[likely]]
    return false;
  t_deferred_frees.push_back(ptr);
  return true;
}

void CachetCUDAAllocator::attachAllocatorTraceTracker(cc::AllocatorTraceTracker tracker) {
  {
    std::lock_guard<std::mutex> lock(tracker_mu_);
    auto next = std::make_shared<std::vector<cc::AllocatorTraceTracker>>(*trackers_.load());
    next->push_back(std::move(tracker));
    trackers_.store(std::move(next));
    has_trackers_.store(true);
  }
  // gpu/'s listener on every allocator, those created later included (torch_common's
  // register_allocator installs it). create_mu is never taken under an allocator's lock.
  tc::State& s = tc::state();
  std::lock_guard<std::mutex> lock(s.create_mu);
  if (s.trace_listener.exchange(&CachetCUDAAllocator::tell_trackers) == &CachetCUDAAllocator::tell_trackers) return;
  for (int d = 0; d < tc::kMaxDevices; ++d)
    if (cachet::CachingAllocator* a = s.allocators[d].load(std::memory_order_acquire))
      a->set_trace_listener([d](const cachet::TraceEvent& e) { tell_trackers(d, e); });
}

void CachetCUDAAllocator::tell_trackers(int device, const cachet::TraceEvent& e) {
  CachetCUDAAllocator* self = g_the_allocator.load(std::memory_order_acquire);
  if (self == nullptr) return;
  const auto trackers = self->trackers_.load();
  if (trackers->empty()) return;
  cda::TraceEntry te(to_action(e.action), static_cast<c10::DeviceIndex>(device), e.addr, e.size,
                     reinterpret_cast<void*>(e.stream), MempoolId_t{static_cast<c10::CaptureId_t>(e.pool.first),
                                                                    static_cast<c10::CaptureId_t>(e.pool.second)},
                     0, nullptr, "N/A", "");
  te.time_.t_ = static_cast<time_t>(e.time_us);
  ++t_in_tracker;
  for (const auto& t : *trackers) {
    try {
      t(te);
    } catch (...) {
      if (!t_tracker_error) t_tracker_error = std::current_exception();
    }
  }
  --t_in_tracker;
}

void CachetCUDAAllocator::raise_tracker_error() {
  if (!t_deferred_frees.empty()) [[unlikely]]
    free_deferred();
  if (!t_tracker_error) [[likely]]
    return;
  std::exception_ptr e = std::exchange(t_tracker_error, nullptr);
  try {
    std::rethrow_exception(e);
  } catch (const c10::Error&) {
    throw;
  } catch (const std::exception& x) {
    TORCH_CHECK(false, "cachet: a trace tracker (attachAllocatorTraceTracker) failed: ", x.what());
  } catch (...) {
    TORCH_CHECK(false, "cachet: a trace tracker (attachAllocatorTraceTracker) failed with an unknown exception");
  }
}

void CachetCUDAAllocator::warn_tracker_error() {
  if (!t_deferred_frees.empty()) [[unlikely]]
    free_deferred();
  if (!t_tracker_error) [[likely]]
    return;
  try {
    raise_tracker_error();
  } catch (const c10::Error& e) {
    TORCH_WARN("cachet: a trace tracker failed during a free (the free is done): ", e.what_without_backtrace());
  }
}

void CachetCUDAAllocator::refuse_call_from_tracker(const char* what) {
  TORCH_CHECK(t_in_tracker == 0, "cachet: ", what,
              " called from a trace tracker (attachAllocatorTraceTracker): trackers run under the "
              "allocator's lock, as native's do, and must not call the allocator");
}

void CachetCUDAAllocator::forget_history() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [d, h] : histories_) {
    std::lock_guard<std::mutex> hl(h->mu);
    h->clear();
  }
}

Ctx CachetCUDAAllocator::gather(cc::RecordContext level) {
  if (record_context_.load(std::memory_order_relaxed) < static_cast<int>(level)) return nullptr;
  cc::CreateContextFn f = recorder_.load();
  return f ? f() : nullptr;
}

size_t CachetCUDAAllocator::max_entries() {
  std::lock_guard<std::mutex> lock(mu_);
  return max_entries_;
}

History& CachetCUDAAllocator::history(int device) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& h = histories_[device];
  if (!h) h = std::make_unique<History>();
  return *h;
}

std::uint32_t next_call_id() {
  static std::atomic<std::uint32_t> next{0};
  std::uint32_t id = next.fetch_add(1, std::memory_order_relaxed) + 1;
  while (id == 0) id = next.fetch_add(1, std::memory_order_relaxed) + 1;  // after 2^32 calls
  return id;
}

// Kept before the call is made, so that a snapshot taken while it runs finds its events' contexts.
CachetCUDAAllocator::TracedCall CachetCUDAAllocator::begin_call(int device, cc::RecordContext made_at,
                                                                cc::RecordContext freed_at) {
  const int level = record_context_.load();
  TracedCall t;
  t.id = next_call_id();
  t.made = gather(made_at);  // outside every lock: the recorder may need Python's
  CallContexts c;
  c.made = t.made;
  c.freed = level >= static_cast<int>(freed_at) ? t.made : nullptr;
  c.keep = level >= static_cast<int>(cc::RecordContext::ALLOC);
  const size_t max_n = max_entries();  // lock order: mu_ is never taken under a History's mu
  History& h = history(device);
  std::lock_guard<std::mutex> lock(h.mu);
  h.add(t.id, std::move(c), max_n);
  return t;
}

void CachetCUDAAllocator::set_live(int device, const void* ptr, Ctx ctx) {
  if (ptr == nullptr) return;
  History& h = history(device);
  std::lock_guard<std::mutex> lock(h.mu);
  const auto addr = reinterpret_cast<std::uint64_t>(ptr);
  if (ctx) {
    h.live[addr] = std::move(ctx);
  } else {
    h.live.erase(addr);
  }
}

std::int64_t CachetCUDAAllocator::now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

void CachetCUDAAllocator::set_trace_all(bool on, bool clear) {
  tc::State& s = tc::state();
  {
    std::lock_guard<std::mutex> lock(s.create_mu);
    s.trace_on.store(on);
    for (auto& slot : s.allocators)
      if (auto* a = slot.load(std::memory_order_acquire)) {
        a->set_trace(on);
        if (clear) a->clear_trace();
      }
  }
  if (clear) {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [d, h] : histories_) {
      std::lock_guard<std::mutex> hl(h->mu);
      h->clear();
    }
  }
}

std::vector<cda::TraceEntry> CachetCUDAAllocator::trace_entries(int d, const std::vector<cachet::TraceEvent>& events,
                                                                const History& h,
                                                                const std::vector<cda::TraceEntry::Action>& skips,
                                                                size_t max_n) {
  // What native keeps on its blocks, followed through the trace: the context of each live
  // allocation (block->context_when_allocated) and of each segment's allocation
  // (context_when_segment_allocated), by address.
  std::unordered_map<std::uint64_t, Ctx> block_ctx, segment_ctx;
  auto at = [](const std::unordered_map<std::uint64_t, Ctx>& m, std::uint64_t addr) -> Ctx {
    auto it = m.find(addr);
    return it == m.end() ? nullptr : it->second;
  };
  std::vector<cda::TraceEntry> out;
  out.reserve(events.size());
  for (const auto& e : events) {
    const CallContexts* c = h.find(e.call);
    const Ctx made = c ? c->made : nullptr;
    const Ctx freed = c ? c->freed : nullptr;
    Ctx ctx;
    switch (e.action) {
      case cachet::TraceAction::Alloc:
        block_ctx[e.addr] = made;
        ctx = made;
        break;
      case cachet::TraceAction::Oom: ctx = made; break;
      case cachet::TraceAction::SegmentAlloc:
        segment_ctx[e.addr] = made;
        ctx = made;
        break;
      case cachet::TraceAction::SegmentMap:
        segment_ctx.try_emplace(e.addr, made);  // native keeps the first mapping's
        ctx = made;
        break;
      case cachet::TraceAction::FreeRequested: ctx = freed ? freed : at(block_ctx, e.addr); break;
      case cachet::TraceAction::FreeCompleted:
        ctx = freed ? freed : at(block_ctx, e.addr);
        block_ctx.erase(e.addr);
        break;
      case cachet::TraceAction::SegmentFree:
        ctx = freed ? freed : at(segment_ctx, e.addr);
        segment_ctx.erase(e.addr);
        break;
      case cachet::TraceAction::SegmentUnmap: ctx = freed ? freed : at(segment_ctx, e.addr); break;
      case cachet::TraceAction::Snapshot: break;
    }
    if (c == nullptr || !c->keep) ctx = nullptr;  // record_trace keeps contexts from ALLOC on
    const auto act = to_action(e.action);
    if (std::find(skips.begin(), skips.end(), act) != skips.end()) continue;
    cda::TraceEntry te(act, static_cast<c10::DeviceIndex>(d), e.addr, e.size, reinterpret_cast<void*>(e.stream),
                       MempoolId_t{static_cast<c10::CaptureId_t>(e.pool.first),
                                   static_cast<c10::CaptureId_t>(e.pool.second)},
                       0, std::move(ctx), "N/A", "");
    te.time_.t_ = static_cast<time_t>(e.time_us);
    out.push_back(std::move(te));
  }
  if (out.size() > max_n) out.erase(out.begin(), out.end() - static_cast<std::ptrdiff_t>(max_n));
  return out;
}

}  // namespace cachet::c10_backend

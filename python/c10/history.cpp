// python/c10/history.cpp: _record_memory_history through the c10 backend, the seam of PyTorch's
// recordHistory, record_trace and trace() (docs/pytorch-allocator.md section 8; python/README.md,
// "The c10 backend"): turning the history on and off, the contexts PyTorch's recorder gives
// (gathered outside every lock, kept in History, history.h), cachet's trace as PyTorch's
// TraceEntry list with those contexts, annotations, and the trace trackers.
#include <algorithm>
#include <chrono>
#include <cstdint>
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
  // what cachet's trace holds then was recorded for trace trackers or the cachet_torch_* API,
  // without the contexts History aligns with it.
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
  set_trace_all(enabled || has_trackers_.load(), clear);
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

// Trackers see each trace entry (segment allocations and frees for NCCL's registration hooks,
// ...). cachet records them in its trace; they are handed to the trackers after each call that
// can make them, with no lock of cachet's held (PyTorch calls them under its lock).
void CachetCUDAAllocator::attachAllocatorTraceTracker(cc::AllocatorTraceTracker tracker) {
  {
    std::lock_guard<std::mutex> lock(tracker_mu_);
    trackers_.push_back(std::move(tracker));
    has_trackers_.store(true);
  }
  set_trace_all(true, false);
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
    std::lock_guard<std::mutex> tl(tracker_mu_);
    tracked_.clear();
  }
}

std::vector<cda::TraceEntry> CachetCUDAAllocator::trace_entries(int d, cachet::CachingAllocator& a, History& h,
                                                                const std::vector<cda::TraceEntry::Action>& skips,
                                                                size_t max_n) {
  const std::vector<cachet::TraceEvent> events = a.trace();
  std::unordered_map<std::uint64_t, std::uint64_t> n_alloc, n_free, n_done;
  std::uint64_t n_oom = 0;
  std::vector<Ctx> ctxs(events.size());
  for (size_t i = 0; i < events.size(); ++i) {
    const auto& e = events[i];
    auto find = [](auto& m, std::uint64_t k) -> const CtxLog* {
      auto it = m.find(k);
      return it == m.end() ? nullptr : &it->second;
    };
    switch (e.action) {
      case cachet::TraceAction::Alloc: ctxs[i] = History::nth(find(h.allocs, e.addr), n_alloc[e.addr]++); break;
      case cachet::TraceAction::FreeRequested: ctxs[i] = History::nth(find(h.frees, e.addr), n_free[e.addr]++); break;
      case cachet::TraceAction::FreeCompleted: ctxs[i] = History::nth(find(h.frees, e.addr), n_done[e.addr]++); break;
      case cachet::TraceAction::Oom: ctxs[i] = History::nth(&h.ooms, n_oom++); break;
      default: break;
    }
  }
  // Segment allocations and mappings: the context of the allocation they served.
  Ctx next;
  for (size_t i = events.size(); i-- > 0;) {
    const auto act = events[i].action;
    if (act == cachet::TraceAction::Alloc || act == cachet::TraceAction::Oom) next = ctxs[i];
    else if (act == cachet::TraceAction::SegmentAlloc || act == cachet::TraceAction::SegmentMap) ctxs[i] = next;
    else if (act != cachet::TraceAction::SegmentFree && act != cachet::TraceAction::SegmentUnmap) next = nullptr;
  }
  std::vector<cda::TraceEntry> out;
  for (size_t i = 0; i < events.size(); ++i) {
    const auto& e = events[i];
    const auto act = to_action(e.action);
    if (std::find(skips.begin(), skips.end(), act) != skips.end()) continue;
    cda::TraceEntry te(act, static_cast<c10::DeviceIndex>(d), e.addr, e.size, reinterpret_cast<void*>(e.stream),
                       MempoolId_t{0, 0}, 0, ctxs[i], "N/A", "");
    te.time_.t_ = static_cast<time_t>(e.time_us);
    out.push_back(std::move(te));
  }
  if (out.size() > max_n) out.erase(out.begin(), out.end() - static_cast<std::ptrdiff_t>(max_n));
  return out;
}

void CachetCUDAAllocator::dispatch_trackers(int device) {
  if (!has_trackers_.load()) return;
  cachet::CachingAllocator* a = tc::existing_allocator(device);
  if (!a) return;
  std::lock_guard<std::mutex> lock(tracker_mu_);
  const std::vector<cachet::TraceEvent> events = a->trace();
  size_t& from = tracked_[device];
  if (from > events.size()) from = 0;
  for (size_t i = from; i < events.size(); ++i) {
    const auto& e = events[i];
    cda::TraceEntry te(to_action(e.action), static_cast<c10::DeviceIndex>(device), e.addr, e.size,
                       reinterpret_cast<void*>(e.stream), MempoolId_t{0, 0}, 0, nullptr, "N/A", "");
    te.time_.t_ = static_cast<time_t>(e.time_us);
    for (const auto& t : trackers_) t(te);
  }
  from = events.size();
  if (!history_on_.load()) {
    a->clear_trace();
    from = 0;
  }
}

}  // namespace cachet::c10_backend

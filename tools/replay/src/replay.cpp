// The replay core: prepare_trace (trace events -> user actions) and replay (actions -> the
// production allocator on the host backend). See cachet/replay/replay.h.
#include "cachet/replay/replay.h"

#include <fmt/format.h>

#include <chrono>
#include <map>
#include <string_view>
#include <unordered_map>
#include <utility>

#include "cachet/errors.h"
#include "cachet/gpu/host_backend.h"
#include "cachet/io/file.h"

namespace cachet::replay {
namespace {

bool is_segment_release(TraceAction a) {
  return a == TraceAction::SegmentFree || a == TraceAction::SegmentUnmap;
}
bool is_segment_grow(TraceAction a) {
  return a == TraceAction::SegmentAlloc || a == TraceAction::SegmentMap;
}

// Could the recorded allocator have released segments by itself inside the malloc that follows
// (out-of-memory retry, release of oversize blocks, garbage collection)? `reserved` is the
// trace's reserved bytes before the release, `next` the first event after the release run.
bool release_inside_malloc(const RecordedRun& run, Bytes reserved, const TraceEvent* next) {
  if (next == nullptr) return false;
  if (next->action == TraceAction::Oom) return true;
  if (!is_segment_grow(next->action)) return false;
  const Bytes want = reserved + next->size;
  const Bytes limit = run.release_limit.value_or(run.cap);
  if (limit > 0) {
    if (want > limit) return true;
    const double gc = run.config.garbage_collection_threshold;
    return gc > 0 && static_cast<double>(reserved) > gc * static_cast<double>(limit);
  }
  // No cap: cudaMalloc fails only near the device's size (the CUDA context and other processes
  // take some of it).
  return want + run.total_memory / 16 > run.total_memory;
}

}  // namespace

Trace prepare_trace(std::span<const TraceEvent> ev, const RecordedRun& run, std::string name) {
  Trace t;
  t.name = std::move(name);
  t.events = ev.size();
  t.stats = io::analyze_trace(ev);
  t.ops.reserve(ev.size());
  bool any_time = false;
  for (const auto& e : ev)
    if (e.time_us != 0) any_time = true;
  if (any_time) t.event_time_us.reserve(ev.size());

  std::unordered_map<std::uint64_t, std::uint32_t> live;  // trace address -> slot
  struct Pending {
    std::uint32_t slot;
    std::uint32_t pseudo;
  };
  std::unordered_map<std::uint64_t, Pending> pending;  // freed, waiting for free_completed
  live.reserve(1024);
  std::vector<std::uint32_t> free_pseudo;
  std::vector<std::uint32_t> deferred;  // completions left to a synchronize
  Bytes reserved = 0;                   // the trace's reserved bytes
  std::unordered_map<std::uint64_t, Bytes> trace_segments;  // cudaMalloc segments allocated in the trace
  std::uint32_t trace_segment_frees = 0;
  std::size_t release_end = 0;          // end of the release run already classified

  auto push = [&](Op op, std::size_t i) {
    op.event = static_cast<std::uint32_t>(i);
    t.ops.push_back(op);
    if (any_time) t.event_time_us.push_back(ev[i].time_us);
  };
  auto flush_deferred = [&](std::size_t i) {
    for (std::uint32_t p : deferred) {
      push(Op{.kind = OpKind::Complete, .aux = p}, i);
      free_pseudo.push_back(p);
    }
    deferred.clear();
  };

  for (std::size_t i = 0; i < ev.size(); ++i) {
    const TraceEvent& e = ev[i];
    switch (e.action) {
      case TraceAction::Alloc: {
        if (auto it = live.find(e.addr); it != live.end()) {  // its free was not recorded
          push(Op{.kind = OpKind::Free, .slot = it->second}, i);
          live.erase(it);
        }
        const std::uint32_t slot = t.slots++;
        live.emplace(e.addr, slot);
        push(Op{.kind = OpKind::Alloc, .slot = slot, .size = e.size, .stream = e.stream}, i);
        flush_deferred(i);
        break;
      }
      case TraceAction::FreeRequested: {
        auto it = live.find(e.addr);
        if (it == live.end()) {  // allocated before the trace starts
          ++t.ignored_events;
          if (i + 1 < ev.size() && ev[i + 1].action == TraceAction::FreeCompleted && ev[i + 1].addr == e.addr) ++i;
          break;
        }
        const std::uint32_t slot = it->second;
        live.erase(it);
        if (i + 1 < ev.size() && ev[i + 1].action == TraceAction::FreeCompleted && ev[i + 1].addr == e.addr) {
          push(Op{.kind = OpKind::Free, .slot = slot}, i);
          ++i;  // its free_completed
          break;
        }
        std::uint32_t p;
        if (!free_pseudo.empty()) {
          p = free_pseudo.back();
          free_pseudo.pop_back();
        } else {
          p = t.pseudo_streams++;
        }
        pending[e.addr] = Pending{slot, p};
        push(Op{.kind = OpKind::FreePending, .slot = slot, .aux = p}, i);
        break;
      }
      case TraceAction::FreeCompleted: {
        auto it = pending.find(e.addr);
        if (it == pending.end()) {
          ++t.ignored_events;
          break;
        }
        const std::uint32_t p = it->second.pseudo;
        pending.erase(it);
        // Part of a synchronize (empty_cache or the OOM retry) when a release or an oom follows.
        std::size_t j = i + 1;
        while (j < ev.size() && ev[j].action == TraceAction::FreeCompleted) ++j;
        const bool sync = j < ev.size() && (is_segment_release(ev[j].action) || ev[j].action == TraceAction::Oom);
        if (sync) {
          deferred.push_back(p);
        } else {
          push(Op{.kind = OpKind::Complete, .aux = p}, i);
          free_pseudo.push_back(p);
        }
        break;
      }
      case TraceAction::SegmentAlloc:
      case TraceAction::SegmentMap:
        reserved += e.size;
        t.recorded_addresses.push_back(e.addr);
        t.recorded_calls.push_back({e.size, e.action == TraceAction::SegmentAlloc, trace_segment_frees});
        if (e.action == TraceAction::SegmentAlloc) trace_segments[e.addr] = e.size;
        break;
      case TraceAction::SegmentFree:
      case TraceAction::SegmentUnmap: {
        if (e.action == TraceAction::SegmentFree && trace_segments.erase(e.addr) > 0) ++trace_segment_frees;
        if (i >= release_end) {
          std::size_t j = i;
          while (j < ev.size() && (is_segment_release(ev[j].action) || ev[j].action == TraceAction::FreeCompleted)) ++j;
          release_end = j;
          const TraceEvent* next = j < ev.size() ? &ev[j] : nullptr;
          if (release_inside_malloc(run, reserved, next)) {
            ++(next->action == TraceAction::Oom ? t.retry_releases_before_oom : t.retry_releases);
          } else {
            push(Op{.kind = OpKind::EmptyCache}, i);
            ++t.empty_cache_calls;
            // empty_cache synchronizes: completions before it are done by then.
            for (std::uint32_t p : deferred) free_pseudo.push_back(p);
            deferred.clear();
          }
        }
        reserved = e.size > reserved ? 0 : reserved - e.size;
        break;
      }
      case TraceAction::Oom:
        push(Op{.kind = OpKind::OomRequest, .size = e.size, .stream = e.stream}, i);
        flush_deferred(i);
        break;
      case TraceAction::Snapshot:
        break;
    }
  }
  if (!deferred.empty()) flush_deferred(ev.empty() ? 0 : ev.size() - 1);
  t.ops.shrink_to_fit();
  return t;
}

namespace {

enum class RunStatus { Done, Diverged };

// Recorded-address mode: the host backend hands out the trace's addresses in order. They are
// the driver's answers to the recorded device calls, so they hold only while the replay makes
// those calls: each cudaMalloc of the recorded size, after as many frees of the trace's segments
// as the recording had made (a replay under a cap that releases earlier, or another
// configuration, asks the driver other questions, and the driver would answer otherwise). Nor
// may an address be handed out while a segment there is still live (a trace recorded mid-run).
// This wrapper refuses either (a device error, so the replay runs again with driver-like
// synthetic addresses, docs/pytorch-allocator.md §3.2).
class CheckedMemory final : public gpu::DeviceMemory {
 public:
  CheckedMemory(std::unique_ptr<gpu::DeviceMemory> inner, const std::vector<Trace::RecordedCall>& calls)
      : in_(std::move(inner)), calls_(calls) {}
  gpu::BackendCaps caps() const override { return in_->caps(); }
  DeviceIndex device() const override { return in_->device(); }
  gpu::Result<gpu::DevicePtr> malloc(Bytes n) override {
    if (pos_ < calls_.size()) {
      const Trace::RecordedCall& c = calls_[pos_];
      if (!c.malloc || c.size != n || c.frees_before != frees_)
        return {gpu::Status::error(fmt::format(
                    "the replay's device call #{} is a cudaMalloc of {} bytes after {} segment frees, the recording's "
                    "was {} of {} bytes after {}",
                    pos_ + 1, n, frees_, c.malloc ? "a cudaMalloc" : "a map", c.size, c.frees_before)),
                0};
    }
    auto r = in_->malloc(n);
    if (r.is_ok()) {
      ++pos_;
      if (overlaps(live_, r.value, n)) {
        (void)in_->free(r.value);
        return {gpu::Status::error(overlap_message("segment", r.value)), 0};
      }
      live_[r.value] = n;
    }
    return r;
  }
  gpu::Status free(gpu::DevicePtr p) override {
    auto st = in_->free(p);
    if (st.is_ok()) {
      live_.erase(p);
      ++frees_;
    }
    return st;
  }
  gpu::Result<gpu::MemInfo> mem_get_info() override { return in_->mem_get_info(); }
  bool stream_valid(StreamId s) override { return in_->stream_valid(s); }
  gpu::Result<gpu::EventHandle> event_create() override { return in_->event_create(); }
  gpu::Status event_record(gpu::EventHandle e, StreamId s) override { return in_->event_record(e, s); }
  gpu::Result<bool> event_query(gpu::EventHandle e) override { return in_->event_query(e); }
  gpu::Status event_synchronize(gpu::EventHandle e) override { return in_->event_synchronize(e); }
  void event_destroy(gpu::EventHandle e) override { in_->event_destroy(e); }
  gpu::Result<gpu::DevicePtr> reserve(Bytes n) override {
    auto r = in_->reserve(n);
    if (r.is_ok()) {
      if (overlaps(reserved_, r.value, n) || overlaps(live_, r.value, n)) {
        (void)in_->unreserve(r.value, n);
        return {gpu::Status::error(overlap_message("reservation", r.value)), 0};
      }
      reserved_[r.value] = n;
    }
    return r;
  }
  gpu::Status unreserve(gpu::DevicePtr p, Bytes n) override {
    auto st = in_->unreserve(p, n);
    if (st.is_ok()) reserved_.erase(p);
    return st;
  }
  gpu::Status map(gpu::DevicePtr p, Bytes n) override {
    auto st = in_->map(p, n);
    if (st.is_ok()) ++pos_;
    return st;
  }
  gpu::Status unmap(gpu::DevicePtr p, Bytes n) override { return in_->unmap(p, n); }
  gpu::Result<void*> host_alloc(Bytes n) override { return in_->host_alloc(n); }
  void host_free(void* h) override { in_->host_free(h); }
  gpu::Status copy_to_host(void* h, gpu::DevicePtr p, Bytes n) override { return in_->copy_to_host(h, p, n); }
  gpu::Status copy_to_device(gpu::DevicePtr p, const void* h, Bytes n) override { return in_->copy_to_device(p, h, n); }
  gpu::Status copy_synchronize() override { return in_->copy_synchronize(); }
  gpu::Status map_pieces(gpu::DevicePtr p, Bytes n) override { return in_->map_pieces(p, n); }
  gpu::Result<gpu::CaptureInfo> capture_info(StreamId s) override { return in_->capture_info(s); }
  gpu::Result<std::vector<gpu::GraphNode>> node_dependencies(gpu::GraphNode n) override {
    return in_->node_dependencies(n);
  }

 private:
  static bool overlaps(const std::map<gpu::DevicePtr, Bytes>& m, gpu::DevicePtr p, Bytes n) {
    auto it = m.upper_bound(p);
    if (it != m.end() && it->first < p + n) return true;
    if (it != m.begin()) {
      --it;
      if (it->first + it->second > p) return true;
    }
    return false;
  }
  static std::string overlap_message(const char* what, gpu::DevicePtr p) {
    return std::string("recorded address ") + std::to_string(p) + " (the trace's next address for a new " + what +
           ") lies in a segment the replay still holds";
  }
  std::unique_ptr<gpu::DeviceMemory> in_;
  const std::vector<Trace::RecordedCall>& calls_;
  std::size_t pos_ = 0;         // device calls that took a recorded address so far
  std::uint32_t frees_ = 0;     // segments freed so far
  std::map<gpu::DevicePtr, Bytes> live_;
  std::map<gpu::DevicePtr, Bytes> reserved_;
};

struct Runner {
  const Trace& t;
  const ReplayOptions& o;
  ReplayResult& r;
  std::string divergence;
  bool still_held = false;  // the divergence: a recorded address the replay could not use

  RunStatus run(const Config& config, bool recorded) {
    gpu::HostOptions ho;
    ho.capacity = o.device_memory;
    ho.total_memory = o.device_memory;
    if (recorded) ho.recorded = t.recorded_addresses;
    ho.driver_like_addresses = !recorded;
    std::shared_ptr<gpu::HostSim> sim;
    std::unique_ptr<gpu::DeviceMemory> mem = gpu::make_host_memory(std::move(ho), &sim);
    if (recorded) mem = std::make_unique<CheckedMemory>(std::move(mem), t.recorded_calls);
    auto alloc = std::make_unique<CachingAllocator>(std::move(mem), config);
    if (o.cap > 0 && o.cap < o.device_memory)
      alloc->set_memory_fraction(static_cast<double>(o.cap) / static_cast<double>(o.device_memory));
    std::vector<void*> slots(t.slots, nullptr);
    r.failed_allocs = r.oom_requests = r.oom_requests_ok = r.pytorch_failures = 0;
    r.pytorch_failure.clear();
    const std::size_t n = std::min(o.stop_after, t.ops.size());
    const bool observe = static_cast<bool>(o.observer);
    std::size_t k = 0;
    auto pytorch_fails = [&](const PyTorchFailsHere& e) {
      if (r.pytorch_failures++ == 0) r.pytorch_failure = fmt::format("trace event {}: {}", t.ops[k].event, e.what());
    };
    std::uint64_t half_calls = 0;  // device calls up to the middle op
    try {
      for (; k < n; ++k) {
        const Op& op = t.ops[k];
        switch (op.kind) {
          case OpKind::Alloc:
            try {
              slots[op.slot] = alloc->allocate(op.size, op.stream);
            } catch (const OutOfMemory&) {
              slots[op.slot] = nullptr;
              ++r.failed_allocs;
            } catch (const PyTorchFailsHere& e) {  // refused, unchanged: docs/pytorch-allocator.md §14.8
              slots[op.slot] = nullptr;
              pytorch_fails(e);
            }
            break;
          case OpKind::Free:
            if (void* p = slots[op.slot]) {
              alloc->free(p);
              slots[op.slot] = nullptr;
            }
            break;
          case OpKind::FreePending:
            if (void* p = slots[op.slot]) {
              alloc->record_stream(p, kPseudoStreamBase + op.aux);
              alloc->free(p);
              slots[op.slot] = nullptr;
            }
            break;
          case OpKind::Complete:
            sim->complete_events(kPseudoStreamBase + op.aux);
            break;
          case OpKind::EmptyCache:
            try {
              alloc->empty_cache();
            } catch (const PyTorchFailsHere& e) {
              pytorch_fails(e);
            }
            break;
          case OpKind::BeginPool: {
            const PoolWindow& w = t.pools.windows[op.aux];
            const PoolId id = t.pools.pools[w.pool].id;
            if (w.create) alloc->create_or_incref_pool(id);  // its owner (MemPool, or one user to the end)
            alloc->begin_allocate_to_pool(id, w.route);
            break;
          }
          case OpKind::EndPool: {
            const PoolWindow& w = t.pools.windows[op.aux];
            const PoolId id = t.pools.pools[w.pool].id;
            alloc->end_allocate_to_pool(id);
            if (w.release_at_end) alloc->release_pool(id);  // the window's user, as use_mem_pool's exit
            break;
          }
          case OpKind::ReleasePool: {
            const PoolId id = t.pools.pools[op.aux].id;
            try {
              alloc->release_pool(id);
              if (op.slot != 0) alloc->empty_cache(id);  // ~MemPool: emptyCache(id)
            } catch (const PyTorchFailsHere& e) {
              pytorch_fails(e);
            }
            break;
          }
          case OpKind::OomRequest:
            ++r.oom_requests;
            try {
              if (void* p = alloc->allocate(op.size, op.stream)) {
                ++r.oom_requests_ok;
                alloc->free(p);
              }
            } catch (const OutOfMemory&) {
            } catch (const PyTorchFailsHere& e) {
              pytorch_fails(e);
            }
            break;
        }
        if (k + 1 == n / 2) {
          const DeviceStats& h = alloc->stats();
          half_calls = h.num_device_alloc + h.num_device_free;
        }
        if (observe) o.observer(k, *alloc);
        if ((k & 0xFFFF) == 0xFFFF && o.progress) o.progress(k + 1, n);
      }
    } catch (const DeviceError& e) {
      if (!recorded) throw;
      divergence = e.what();
      // A recorded address the replay cannot use (its segments live longer than the recorded ones, or
      // it made other device calls): not an error of the trace or the allocator. Said as what happened,
      // without the device call's "cudaMalloc of N bytes on device D failed: ".
      if (auto at = divergence.find(" failed: "); at != std::string::npos) {
        still_held = true;
        divergence = divergence.substr(at + 9);
        constexpr std::string_view host = "host backend (recorded addresses): ";
        if (divergence.starts_with(host)) divergence = divergence.substr(host.size());
      }
      // Every recorded address handed out and one more wanted: say it in the trace's terms.
      if (sim && sim->recorded_left() == 0 && divergence.find("needs address") != std::string::npos) {
        still_held = false;
        divergence = fmt::format(
            "the replay needed more segments than the trace's {} segment events: the trace starts mid-run (its "
            "first segments were reserved before recording), or this configuration reserves more often than the "
            "recorded one",
            t.recorded_addresses.size());
      }
      return RunStatus::Diverged;
    } catch (const UsageError& e) {  // recorded addresses confused the block table
      if (!recorded) throw;
      divergence = e.what();
      return RunStatus::Diverged;
    }
    r.ops = k;
    r.stats = alloc->stats();
    r.pool_ends.assign(t.pools.pools.size(), ReplayResult::PoolEnd{});
    if (t.pools.any())
      for (const SegmentSnapshot& s : alloc->snapshot())
        for (std::size_t q = 0; q < t.pools.pools.size(); ++q)
          if (t.pools.pools[q].id == s.pool_id) {
            ++r.pool_ends[q].segments;
            r.pool_ends[q].reserved += s.total_size;
            r.pool_ends[q].allocated += s.allocated_size();
          }
    r.second_half_device_calls = r.stats.num_device_alloc + r.stats.num_device_free - half_calls;
    if (o.keep_allocator) r.allocator = std::move(alloc);
    return RunStatus::Done;
  }
};

}  // namespace

ReplayResult replay(const Trace& t, const Config& config, const ReplayOptions& opts) {
  const auto start = std::chrono::steady_clock::now();
  ReplayResult r;
  r.config = config;
  r.conf = to_string(config);
  r.events = t.events;
  Runner runner{t, opts, r, {}, false};
  bool recorded = opts.addresses == AddressMode::Recorded;
  if (recorded && t.recorded_addresses.empty() && t.stats.lacks_segment_events()) {
    r.note = std::string(io::kNoSegmentEvents);  // the first segment would find no address
    recorded = false;
  } else if (recorded && runner.run(config, true) == RunStatus::Diverged) {
    if (runner.still_held)
      r.note = "the recorded addresses could not be kept to the end (" + runner.divergence +
               "), so the replay ran again with synthetic addresses; this is harmless: every op is replayed, only "
               "the addresses are not the recorded ones";
    else
      r.note = "the replay left the recorded addresses (" + runner.divergence + "); replayed with synthetic addresses";
    recorded = false;
  } else if (recorded) {
    r.recorded_addresses = true;
  }
  if (!recorded) runner.run(config, false);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return r;
}

}  // namespace cachet::replay

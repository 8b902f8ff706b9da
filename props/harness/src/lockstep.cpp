// The lockstep runner (cachet/lockstep.h): building each (model, implementation) pair and applying
// every op to both sides; the pair's state is lockstep_state.h, the checks after each op
// lockstep_checks.cpp, the sleep ops lockstep_sleep.cpp; the device log and the model's mirror
// source are in device_log.h, the pool ops' calls on both sides in pool_calls.h.
#include "cachet/lockstep.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <deque>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>
#include <type_traits>

#include "cachet/errors.h"
#include "cachet/model/memory_cap.h"
#include "cachet/model/segment_source.h"
#include "cachet/snapshot.h"
#include "cachet/stats.h"
#include "cachet/summary.h"
#include "cachet/tags.h"
#include "cachet/trace.h"
#include "lockstep_state.h"

namespace cachet::lockstep {

std::string show(const Outcome& o) {
  switch (o.kind) {
    case Outcome::Kind::Ok: return "ok";
    case Outcome::Kind::Pointer: return "pointer " + hex(o.ptr);
    case Outcome::Kind::OutOfMemory: return "OutOfMemory: " + text(o);
    case Outcome::Kind::UsageError: return "UsageError: " + o.message;
    case Outcome::Kind::DeviceError: return "DeviceError: " + o.message;
    case Outcome::Kind::Other: return "exception: " + o.message;
    case Outcome::Kind::Skipped: return "skipped (no such handle)";
    case Outcome::Kind::Unsupported: return "not supported by this pair (no private pools): " + o.message;
    case Outcome::Kind::PyTorchFailure: return "PyTorchFailure: " + o.message;
    case Outcome::Kind::Ended: return "not applied (the case ended at a PyTorch failure, §14.8)";
  }
  return "?";
}

std::string text(const Outcome& o) {
  if (o.oom && o.message.empty()) return oom_message(*o.oom);
  return o.message;
}

bool same_text(const Outcome& a, const Outcome& b) {
  if (a.oom && b.oom && *a.oom == *b.oom) return true;
  if (!a.oom && !b.oom) return a.message == b.message;
  return text(a) == text(b);
}

double fraction_for_cap(Bytes cap, Bytes total) {
  if (cap >= total) return 1.0;
  // cap / total in double, then moved one representable step at a time until fraction x total,
  // truncated as PyTorch does, is exactly `cap` (each step moves the product by under one byte
  // while cap < 2^52).
  auto bytes = [total](double f) { return model::memory_cap(f, total).value_or(total); };
  double f = static_cast<double>(cap) / static_cast<double>(total);
  for (int i = 0; i < 64 && bytes(f) < cap; ++i) f = std::nextafter(f, 1.0);
  for (int i = 0; i < 64 && bytes(f) > cap && f > 0.0; ++i) f = std::nextafter(f, 0.0);
  if (bytes(f) != cap)
    throw std::invalid_argument("lockstep: no fraction of " + std::to_string(total) + " bytes gives a cap of exactly " +
                                std::to_string(cap) + " bytes (the nearest, " + std::to_string(f) + ", gives " +
                                std::to_string(bytes(f)) + ")");
  return f;
}

// ----------------------------------------------------------------------------- the runner

template <class Model, class Impl>
void Lockstep<Model, Impl>::State::build(std::unique_ptr<gpu::DeviceMemory> memory, bool host) {
  if (opts.config.policy != kPolicy)
    throw std::invalid_argument(std::string("lockstep: this pair runs policy:") +
                                (kPolicy == Policy::Cachet ? "cachet (CachetLockstep)" : "pytorch (PytorchLockstep)") +
                                " but the configuration says policy:" +
                                (opts.config.policy == Policy::Cachet ? "cachet" : "pytorch") +
                                "; pick the pair with visit_policy(config.policy, ...)");
  // A real device (not the host simulation, whose events complete when recorded by option):
  // synchronize each event as it is recorded, so the model's "complete when recorded" holds.
  auto logging = std::make_unique<LoggingMemory>(std::move(memory), log, opts.events_complete_immediately && !host);
  auto info = logging->mem_get_info();
  total = info.is_ok() ? info.value.total : opts.capacity;
  if (!host && opts.device_total && *opts.device_total != total)
    throw std::invalid_argument("lockstep: Options::device_total says " + std::to_string(*opts.device_total) +
                                " bytes but the device's total memory is " + std::to_string(total) +
                                (info.is_ok() ? "" : " (mem_get_info failed: the capacity)") +
                                "; read it from the device (mem_get_info) or leave it unset");
  sut = std::make_unique<Impl>(std::move(logging), opts.config);
  if (opts.compare_trace) sut->set_trace(true);
  // The host backend holds device_total bytes when set (the capacity is then a cap), else the capacity.
  source = std::make_unique<MirrorSource>(
      log, host ? std::optional<Bytes>(opts.device_total.value_or(opts.capacity)) : std::nullopt, total,
      &sut->device_memory());
  model = std::make_unique<Model>(opts.config, *source);
  model->set_events_complete_when_recorded(opts.events_complete_immediately);
  if (opts.config.per_process_memory_fraction) {
    fraction = *opts.config.per_process_memory_fraction;
  } else if (opts.device_total) {  // the capacity as a cap on both sides (Options::device_total)
    const double f = fraction_for_cap(opts.capacity, total);
    sut->set_memory_fraction(f);
    model->set_memory_fraction(f);
    fraction = f;
  }
  log.clear_pending();
  sut_before = sut_state(*sut);
}

template <class Model, class Impl>
std::optional<std::string> Lockstep<Model, Impl>::State::apply(const Op& op) {
  ++ops_applied;
  log.clear_pending();
  // The trace events of this op only: the sut's recorder is emptied (it also holds the
  // snapshot events of the previous op's checks), the model's trace is read from here on.
  if (opts.compare_trace) sut->clear_trace();
  model_trace_mark = model->trace().size();
  if (ended) {
    last_sut = last_model = {Outcome::Kind::Ended, 0, {}};
    return std::nullopt;
  }
  if (ops::is_pool_op(op)) {
    if constexpr (!kPools) {
      last_sut = last_model = {Outcome::Kind::Unsupported, 0, show(op)};
      return "not supported by this pair: " + show(op) + "\n  its model or implementation has no private pools "
             "(docs/pytorch-allocator.md §14); nothing was applied\n";
    } else {
      return apply_pool_op(op);
    }
  }
  if (ops::is_stream_op(op) && stream_ops_run()) return apply_stream_op(op);
  if (ops::is_stream_op(op) || std::holds_alternative<ops::SetAllocatorSettings>(op)) {
    last_sut = last_model = {Outcome::Kind::Unsupported, 0, show(op)};
    return "not supported by this pair: " + show(op) + "\n  the lockstep runs wait_stream and kernel on the host "
           "backend under policy:pytorch with private pools; cfg, and the rest, are replayed by `cachet conform` "
           "(docs/pytorch-allocator.md §14.10.1); nothing was applied\n";
  }
  if (ops::is_sleep_op(op)) {  // issue 24: where both sides have them (docs/sleep-wake.md section 8)
    if (sleep_runs()) return apply_sleep_op(op);
    last_sut = last_model = {Outcome::Kind::Unsupported, 0, show(op)};
    return "not supported by this pair: " + show(op) + "\n  the lockstep runs tag, sleep and wake only with "
           "cachet_sleep:True (docs/sleep-wake.md section 6); nothing was applied\n";
  }
  Outcome s, m;
  std::visit(
      [&](const auto& o) {
        using T = std::decay_t<decltype(o)>;
        if constexpr (std::is_same_v<T, Allocate>) {
          if (o.thread != 0 && threads_used.insert(o.thread).second) {
            const Tag tag = current_tag();  // a new op thread starts at the runner's tag
            threads.run(o.thread, [&] { set_current_tag(tag); });
          }
          threads.run(o.thread, [&] {  // gpu/'s use_mem_pool filter looks at the calling thread
            s = capture([&](Outcome& r) {
              r.kind = Outcome::Kind::Pointer;
              r.ptr = reinterpret_cast<std::uint64_t>(sut->allocate(o.size, o.stream));
            });
          });
          m = capture([&](Outcome& r) {
            r.kind = Outcome::Kind::Pointer;
            r.ptr = model->malloc(o.size, o.stream, o.thread);
          });
          if (s.kind == Outcome::Kind::Pointer && s.ptr != 0 && s == m) {
            const Handle h = o.id ? *o.id : bindings;
            if (auto old = bound.find(h); old != bound.end() && old->second.live) live_by_addr.erase(old->second.addr);
            ++bindings;
            live_by_addr[s.ptr] = h;
            bound[h] = {s.ptr, o.size, o.stream, true, current_tag()};
          }
        } else if constexpr (std::is_same_v<T, Free> || std::is_same_v<T, RecordStream>) {
          const auto it = bound.find(o.handle);
          if (it == bound.end()) {
            s = m = {Outcome::Kind::Skipped, 0, {}};
            return;
          }
          const std::uint64_t addr = it->second.addr;
          if constexpr (std::is_same_v<T, Free>) {
            s = capture([&](Outcome&) { sut->free(reinterpret_cast<void*>(addr)); });
            m = capture([&](Outcome&) { model->free(addr); });
            if (s.kind == Outcome::Kind::Ok && m.kind == Outcome::Kind::Ok) freed(addr);
          } else {
            s = capture([&](Outcome&) { sut->record_stream(reinterpret_cast<void*>(addr), o.stream); });
            m = capture([&](Outcome&) { model->record_stream(addr, o.stream); });
          }
        } else if constexpr (std::is_same_v<T, CompleteEvents>) {
          s = capture([&](Outcome&) {
            if (sim) sim->complete_events(o.stream);
          });
          m = capture([&](Outcome&) { model->complete_events(o.stream); });
        } else if constexpr (std::is_same_v<T, CompleteAllEvents>) {
          s = capture([&](Outcome&) {
            if (sim) sim->complete_all_events();
          });
          m = capture([&](Outcome&) { model->complete_all_events(); });
        } else if constexpr (std::is_same_v<T, EmptyCache>) {
          s = capture([&](Outcome&) { sut->empty_cache(); });
          m = capture([&](Outcome&) { model->empty_cache(); });
        } else if constexpr (std::is_same_v<T, SetMemoryFraction>) {
          const Bytes reserved = static_cast<Bytes>(sut->stats().reserved_bytes[0].current);
          over_cap_ceiling = std::max(over_cap_ceiling, reserved);
          s = capture([&](Outcome&) { sut->set_memory_fraction(o.fraction); });
          m = capture([&](Outcome&) { model->set_memory_fraction(o.fraction); });
          if (s.kind == Outcome::Kind::Ok && m.kind == Outcome::Kind::Ok) fraction = o.fraction;
        }
      },
      op);
  last_sut = s;
  last_model = m;
  if (m.kind == Outcome::Kind::PyTorchFailure) return end_case(sut_before);
  return compare();
}

template <class Model, class Impl>
std::optional<std::string> Lockstep<Model, Impl>::State::apply_stream_op(const Op& op) {
  if constexpr (kPools && HasCaptureGraph<Model>) {
    Outcome s, m;
    if (const auto* w = std::get_if<ops::WaitStream>(&op)) {
      s = capture([&](Outcome&) {
        if (gpu::Status st = sim->wait_stream(w->waiter, w->waited); !st.is_ok()) throw UsageError(st.message);
      });
      m = capture([&](Outcome&) { model->wait_stream(w->waiter, w->waited); });
    } else if (const auto* k = std::get_if<ops::Kernel>(&op)) {
      s = capture([&](Outcome&) { sim->kernel(k->stream); });
      m = capture([&](Outcome&) { model->kernel(k->stream); });
    }
    last_sut = s;
    last_model = m;
    return compare();
  }
  return std::nullopt;
}

template <class Model, class Impl>
std::optional<std::string> Lockstep<Model, Impl>::State::apply_pool_op(const Op& op) {
  calls.begin_op();
  Outcome s{Outcome::Kind::Ok, 0, {}}, m = s;
  try {
    pools.apply(op);
  } catch (const CallStopped&) {
    s = calls.failure()->sut;
    m = calls.failure()->model;
  } catch (const UsageError& e) {  // the front end refused the op: no call was made
    s = m = {Outcome::Kind::UsageError, 0, e.what()};
  }
  last_sut = s;
  last_model = m;
  if (m.kind == Outcome::Kind::PyTorchFailure) return end_case(calls.failure()->sut_before);
  if (auto d = compare()) {
    if (calls.failure() && d->rfind("result differs", 0) == 0) return "at " + calls.failure()->call + ": " + *d;
    return d;
  }
  return std::nullopt;
}


template <class Model, class Impl>
Lockstep<Model, Impl>::Lockstep(Options options) : s_(std::make_unique<State>()) {
  s_->opts = std::move(options);
  gpu::HostOptions ho;
  ho.capacity = s_->opts.device_total.value_or(s_->opts.capacity);
  ho.events_complete_when_recorded = s_->opts.events_complete_immediately;
  s_->build(gpu::make_host_memory(ho, &s_->sim), true);
}

template <class Model, class Impl>
Lockstep<Model, Impl>::Lockstep(Options options, std::unique_ptr<gpu::DeviceMemory> memory)
    : s_(std::make_unique<State>()) {
  s_->opts = std::move(options);
  s_->build(std::move(memory), false);
}

template <class Model, class Impl>
Lockstep<Model, Impl>::~Lockstep() = default;

template <class Model, class Impl>
std::optional<std::string> Lockstep<Model, Impl>::apply(const Op& op) {
  return s_->apply(op);
}

template <class Model, class Impl>
std::optional<std::string> Lockstep<Model, Impl>::run(const std::vector<Op>& ops) {
  for (std::size_t i = 0; i < ops.size(); ++i)
    if (auto d = apply(ops[i])) return "op #" + std::to_string(i) + " " + show(ops[i]) + ": " + *d;
  return std::nullopt;
}

template <class Model, class Impl>
const Outcome& Lockstep<Model, Impl>::last_model() const {
  return s_->last_model;
}
template <class Model, class Impl>
const Outcome& Lockstep<Model, Impl>::last_sut() const {
  return s_->last_sut;
}
template <class Model, class Impl>
bool Lockstep<Model, Impl>::ended() const {
  return s_->ended;
}
template <class Model, class Impl>
bool Lockstep<Model, Impl>::runs_sleep_ops() const {
  return s_->sleep_runs();
}

template <class Model, class Impl>
bool Lockstep<Model, Impl>::runs_stream_ops() const {
  return s_->stream_ops_run();
}
template <class Model, class Impl>
std::optional<Snapshot> Lockstep<Model, Impl>::take_checked_snapshot() {
  if (!s_->checked_snapshot || s_->checked_snapshot_op != s_->ops_applied) return std::nullopt;
  std::optional<Snapshot> r = std::move(s_->checked_snapshot);
  s_->checked_snapshot.reset();
  return r;
}
template <class Model, class Impl>
const front_end::PoolFrontEnd& Lockstep<Model, Impl>::pools() const {
  return s_->pools;
}
template <class Model, class Impl>
std::uint32_t Lockstep<Model, Impl>::handle_count() const {
  return s_->bindings;
}
template <class Model, class Impl>
bool Lockstep<Model, Impl>::live(Handle h) const {
  const auto it = s_->bound.find(h);
  return it != s_->bound.end() && it->second.live;
}
template <class Model, class Impl>
std::uint64_t Lockstep<Model, Impl>::address(Handle h) const {
  return s_->bound.at(h).addr;
}
template <class Model, class Impl>
Bytes Lockstep<Model, Impl>::requested(Handle h) const {
  return s_->bound.at(h).size;
}
template <class Model, class Impl>
StreamId Lockstep<Model, Impl>::stream(Handle h) const {
  return s_->bound.at(h).stream;
}
template <class Model, class Impl>
std::vector<Handle> Lockstep<Model, Impl>::live_handles() const {
  std::vector<Handle> r;
  for (const auto& [addr, h] : s_->live_by_addr) r.push_back(h);
  std::sort(r.begin(), r.end());
  return r;
}
template <class Model, class Impl>
std::optional<Bytes> Lockstep<Model, Impl>::cap() const {
  return s_->cap();
}
template <class Model, class Impl>
Bytes Lockstep<Model, Impl>::total_memory() const {
  return s_->total;
}
template <class Model, class Impl>
Model& Lockstep<Model, Impl>::model() {
  return *s_->model;
}
template <class Model, class Impl>
Impl& Lockstep<Model, Impl>::sut() {
  return *s_->sut;
}
template <class Model, class Impl>
gpu::HostSim* Lockstep<Model, Impl>::sim() {
  return s_->sim.get();
}
template <class Model, class Impl>
std::shared_ptr<gpu::HostSim> Lockstep<Model, Impl>::shared_sim() const {
  return s_->sim;
}
template <class Model, class Impl>
const Options& Lockstep<Model, Impl>::options() const {
  return s_->opts;
}
template <class Model, class Impl>
const DeviceCounters& Lockstep<Model, Impl>::device_counters() const {
  return s_->log.counters;
}

template class Lockstep<model::Allocator, CachingAllocator>;
template class Lockstep<model::CachetPolicy, CachingAllocator>;

}  // namespace cachet::lockstep

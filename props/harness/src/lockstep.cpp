// The lockstep runner (cachet/lockstep.h): the per-op comparison for both (model, implementation)
// pairs; the device log and the model's mirror source are in device_log.h, the pool ops' calls
// on both sides in pool_calls.h.
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
#include "cachet/tags.h"
#include "cachet/trace.h"
#include "device_log.h"
#include "pool_calls.h"

namespace cachet::lockstep {

using namespace detail;

std::string show(const Outcome& o) {
  switch (o.kind) {
    case Outcome::Kind::Ok: return "ok";
    case Outcome::Kind::Pointer: return "pointer " + hex(o.ptr);
    case Outcome::Kind::OutOfMemory: return "OutOfMemory: " + o.message;
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

// Both sides have sleep and wake (docs/sleep-wake.md section 8): model::Allocator (policy:pytorch,
// cudaMalloc segments), model::CachetPolicy (policy:cachet) and gpu/'s CachingAllocator.
template <class A>
concept HasSleep = requires(A& a, const A& c, const TagList& t) {
  a.sleep(t, t);
  a.wake(t);
  c.sleeping();
};

template <class Model, class Impl>
struct Lockstep<Model, Impl>::State {
  struct Bound {  // one allocation a handle names
    std::uint64_t addr;
    Bytes size;
    StreamId stream;
    bool live;
    Tag tag{kDefaultTag};  // the runner's current tag when it was allocated
  };

  Options opts;
  DeviceLog log;
  std::shared_ptr<gpu::HostSim> sim;
  std::unique_ptr<MirrorSource> source;
  std::unique_ptr<Impl> sut;
  std::unique_ptr<Model> model;
  Outcome last_model, last_sut;
  std::map<Handle, Bound> bound;              // handle (or id) -> its allocation
  std::map<std::uint64_t, Handle> live_by_addr;
  std::uint32_t bindings = 0;                 // allocations bound so far
  double fraction = 1.0;                      // the fraction both sides accepted last
  Bytes total = 0;                            // the model's total memory
  Bytes over_cap_ceiling = 0;  // reserved when the cap was last lowered below it (0: none)
  std::size_t model_trace_mark = 0;  // the model's trace events before the current op
  // The pool and capture ops: one front end, its calls made on both sides.
  OpThreads threads;  // the op list's threads (t<k>): declared before the calls that use it
  BothSides<Model, Impl> calls{model, sut, threads, sim};
  front_end::PoolFrontEnd pools{calls};
  bool ended = false;  // a PyTorch failure (§14.8) ended the case
  std::set<ThreadIndex> threads_used;  // the op threads other than the runner's
  // The runner's thread starts each case, and ends it, at the tag "default" (cachet/tags.h).
  struct DefaultTag {
    DefaultTag() { set_current_tag(kDefaultTag); }
    ~DefaultTag() { set_current_tag(kDefaultTag); }
  } default_tag;
  SutState sut_before;  // the sut's state after the previous op (the §14.8 check of one-call ops)

  void build(std::unique_ptr<gpu::DeviceMemory> memory, bool host) {
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

  std::optional<Bytes> cap() const { return model::memory_cap(fraction, total); }

  // Marks whatever handle lives at `addr` as freed.
  void freed(std::uint64_t addr) {
    auto it = live_by_addr.find(addr);
    if (it == live_by_addr.end()) return;
    bound[it->second].live = false;
    live_by_addr.erase(it);
  }

  std::optional<std::string> apply(const Op& op) {
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

  // Where wait_stream and kernel run: the host backend's simulated capture graph beside the
  // model's (policy:pytorch with private pools).
  bool stream_ops_run() const {
    if constexpr (kPools && HasCaptureGraph<Model>) return sim != nullptr;
    return false;
  }

  // wait_stream and kernel (docs/pytorch-allocator.md §14.10.1): the simulated device's graph and
  // the model's. A wait the device refuses (a capturing stream waiting on one outside its capture,
  // two captures joined) is the user's error on both sides.
  std::optional<std::string> apply_stream_op(const Op& op) {
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

  // Where tag, sleep and wake ops run: both sides sleep, under cachet_sleep:True (docs/sleep-wake.md
  // section 8).
  bool sleep_runs() const {
    if constexpr (HasSleep<Model> && HasSleep<Impl>)
      return opts.config.sleep;
    else
      return false;
  }

  // tag, sleep, wake (docs/sleep-wake.md): the tag is every op thread's current tag (the model
  // allocates on the runner's thread); sleep's outcome carries the bytes given back; both sides'
  // out-of-memory texts are cachet's own (not PyTorch's), so only their kind is compared.
  std::optional<std::string> apply_sleep_op(const Op& op) {
    if constexpr (!HasSleep<Model> || !HasSleep<Impl>) {
      return std::nullopt;  // apply() answers Unsupported for this pair first
    } else {
    Outcome s{Outcome::Kind::Ok, 0, {}}, m = s;
    if (const auto* t = std::get_if<ops::SetTag>(&op)) {
      set_current_tag(t->tag);
      for (ThreadIndex k : threads_used) threads.run(k, [&] { set_current_tag(t->tag); });
    } else if (const auto* sl = std::get_if<ops::Sleep>(&op)) {
      mark_contents(sl->backup_tags);
      s = capture([&](Outcome& r) { r.ptr = sut->sleep(sl->tags, sl->backup_tags); });
      m = capture([&](Outcome& r) { r.ptr = model->sleep(sl->tags, sl->backup_tags); });
    } else if (const auto* w = std::get_if<ops::Wake>(&op)) {
      s = capture([&](Outcome&) { sut->wake(w->tags); });
      m = capture([&](Outcome&) { model->wake(w->tags); });
    }
    if (s.kind == Outcome::Kind::OutOfMemory && m.kind == Outcome::Kind::OutOfMemory) s.message = m.message;
    last_sut = s;
    last_model = m;
    if (auto d = compare()) return d;
    if (std::holds_alternative<ops::Wake>(op) && s.kind == Outcome::Kind::Ok)
      if (auto d = check_contents()) return d;
    if (s.kind == Outcome::Kind::Ok) {
      const auto st = sut->sleeping();
      const auto mt = model->sleeping();
      if (st != mt) {
        auto list = [](const TagList& l) {
          std::string r;
          for (const auto& t : l) r += (r.empty() ? "" : ",") + t;
          return r.empty() ? std::string("(none)") : r;
        };
        return "sleeping tags differ\n  model: " + list(mt) + "\n  sut:   " + list(st) + "\n";
      }
    }
    return std::nullopt;
    }
  }

  // The backed-up contents survive (docs/sleep-wake.md section 8; the host backend keeps
  // contents): before each sleep every awake live allocation gets a pattern of its own in its
  // first and last 4 KiB; those of a backed-up tag must read the same after every wake that woke
  // them. (One that slept without backup has undefined contents: its pattern is forgotten.)
  std::map<Handle, unsigned char> patterns;
  static constexpr Bytes kPatternBytes = 4096;
  void mark_contents(const TagList& backup_tags) {
    if (!sim) return;
    for (auto& [h, b] : bound) {
      if (!b.live || b.size == 0) continue;
      const auto byte = static_cast<unsigned char>(0x10 + (h * 37) % 0xe0);
      const Bytes head = std::min(b.size, kPatternBytes);
      if (!sim->fill(b.addr, byte, head).is_ok() || !sim->fill(b.addr + b.size - head, byte, head).is_ok())
        continue;  // asleep already: its memory (and pattern) is where the last sleep left it
      if (lists_tag(backup_tags, b.tag)) patterns[h] = byte;
      else patterns.erase(h);
    }
  }
  std::optional<std::string> check_contents() {
    for (auto it = patterns.begin(); it != patterns.end();) {
      const Bound& b = bound.at(it->first);
      if (!b.live) {
        it = patterns.erase(it);
        continue;
      }
      const Bytes head = std::min(b.size, kPatternBytes);
      std::vector<unsigned char> got(2 * head);
      if (sim->read(b.addr, got.data(), head).is_ok() && sim->read(b.addr + b.size - head, got.data() + head, head).is_ok())
        for (std::size_t i = 0; i < got.size(); ++i)
          if (got[i] != it->second) {
            std::ostringstream r;
            r << "backup contents differ\n  h" << it->first << " (" << hex(b.addr) << ", " << b.size << " B, tag '"
              << b.tag << "') holds 0x" << std::hex << int(got[i]) << " at byte " << std::dec
              << (i < head ? i : b.size - head + (i - head)) << " after the wake; 0x" << std::hex << int(it->second)
              << " was written before its sleep\n";
            return r.str();
          }
      ++it;
    }
    return std::nullopt;
  }

  // A pool or capture op through the front end; the first call that did not succeed alike on
  // both sides is the op's outcome on each side.
  std::optional<std::string> apply_pool_op(const Op& op) {
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

  // The model says PyTorch 2.11 fails here (§14.8): the sut must have refused naming the rule,
  // changing nothing, and the case ends.
  std::optional<std::string> end_case(const SutState& before) {
    ended = true;
    std::ostringstream r;
    const bool refused = last_sut.kind == Outcome::Kind::UsageError ||
                         (last_sut.kind == Outcome::Kind::DeviceError && sim == nullptr);
    if (!refused || last_sut.message.find("§14.8") == std::string::npos) {
      r << "result differs (PyTorch 2.11 fails here: the sut must refuse with a UsageError naming §14.8)\n  model: "
        << show(last_model) << "\n  sut:   " << show(last_sut) << "\n";
      return r.str();
    }
    const SutState after = sut_state(*sut);
    // Before it refuses, a malloc during a capture may complete the frees the capture had already
    // made safe (graph_capture_record_stream_reuse, docs/pytorch-allocator.md §14.10.1), as
    // PyTorch does before it fails. When the sut's trace of the op holds free_completed events
    // and nothing else (but the snapshot event of sut_state's own snapshot), its stats and
    // snapshot are not compared with those before the op (what the frees changed is not
    // recomputed here); its invariants still are.
    const bool only_safe_frees = opts.compare_trace && [&] {
      const std::vector<TraceEvent> t = sut->trace();
      const auto frees = std::count_if(t.begin(), t.end(), [](const TraceEvent& e) { return e.action == TraceAction::FreeCompleted; });
      const auto snaps = std::count_if(t.begin(), t.end(), [](const TraceEvent& e) { return e.action == TraceAction::Snapshot; });
      return frees > 0 && frees + snaps == static_cast<std::ptrdiff_t>(t.size());
    }();
    if (after.stats != before.stats && !only_safe_frees) r << "the sut refused (§14.8) but its stats changed\n";
    else if (after.snapshot != before.snapshot && !only_safe_frees)
      r << "the sut refused (§14.8) but its snapshot changed\n";
    else if (opts.check_invariants)
      for (const auto& v : sut_violations())
        r << (r.str().empty() ? "sut invariants() violated after a §14.8 refusal\n" : "") << "  " << v << "\n";
    if (r.str().empty()) return std::nullopt;
    r << "  model: " << show(last_model) << "\n  sut:   " << show(last_sut) << "\n";
    return r.str();
  }

  // The sut's invariants() violations. Lowering the fraction below what is reserved leaves
  // reserved over the cap (PyTorch frees nothing then); [INV-CAP-1] (and [INV-SLEEP-5]) is then
  // tolerated while reserved does not grow.
  std::vector<std::string> sut_violations() {
    auto bad = sut->invariants();
    const Bytes reserved = static_cast<Bytes>(sut->stats().reserved_bytes[0].current);
    const auto c = cap();
    if (!c || reserved <= *c) over_cap_ceiling = 0;
    // [INV-SLEEP-5] is INV-CAP-1 with sleeping bytes left out (docs/sleep-wake.md section 7): the same.
    std::erase_if(bad, [&](const std::string& v) {
      return (v.find("[INV-CAP-1]") != std::string::npos || v.find("[INV-SLEEP-5]") != std::string::npos) &&
             reserved <= over_cap_ceiling;
    });
    return bad;
  }

  // Every pool the front end named: the same use count on both sides, or unknown to both.
  std::optional<std::string> compare_use_counts() {
    if constexpr (kPools) {
      auto count = [](const auto& a, PoolId id) -> std::optional<int> {
        try {
          return a.pool_use_count(id);
        } catch (const UsageError&) {
          return std::nullopt;
        }
      };
      for (const PoolId id : pools.ids_used()) {
        const auto mc = count(*model, id), sc = count(*sut, id);
        if (mc != sc)
          return "pool use counts differ\n  pool " + show_pool(id) + ": model " +
                 (mc ? std::to_string(*mc) : "unknown") + ", sut " + (sc ? std::to_string(*sc) : "unknown") + "\n";
      }
    }
    return std::nullopt;
  }

  // The op's trace events, in order (trace.h: alloc, free_requested, free_completed,
  // segment_alloc/free/map/unmap, oom): the first that differs, with both sides' lists.
  std::optional<std::string> compare_trace() {
    const auto& all = model->trace();
    std::vector<TraceEvent> mt(all.begin() + static_cast<std::ptrdiff_t>(model_trace_mark), all.end());
    std::vector<TraceEvent> st = sut->trace();
    // The snapshots the checks take (memory_snapshot() records one) are not the op's events.
    for (auto* side : {&mt, &st})
      std::erase_if(*side, [](const TraceEvent& t) { return t.action == TraceAction::Snapshot; });
    // policy:cachet's rules (R7, R9: wait for every pending event) do not order the blocks that
    // one wait frees: each run of consecutive free_completed events is compared in address order.
    // policy:pytorch's order is PyTorch's (per stream, in event order): compared as it is.
    if constexpr (kPolicy == Policy::Cachet)
      for (auto* side : {&mt, &st})
        for (auto b = side->begin(); b != side->end();) {
          auto e = std::find_if(b, side->end(), [](const TraceEvent& t) { return t.action != TraceAction::FreeCompleted; });
          std::sort(b, e, [](const TraceEvent& x, const TraceEvent& y) { return x.addr < y.addr; });
          b = e == side->end() ? e : e + 1;
        }
    std::size_t i = 0;
    while (i < mt.size() && i < st.size() && same_event(mt[i], st[i])) ++i;
    if (i == mt.size() && i == st.size()) return std::nullopt;
    std::ostringstream r;
    r << "trace events differ at event #" << i << " of this op (model " << mt.size() << " events, sut " << st.size()
      << ")\n  model: " << (i < mt.size() ? show_event(mt[i]) : "(no more events)")
      << "\n  sut:   " << (i < st.size() ? show_event(st[i]) : "(no more events)") << "\n";
    for (const auto* side : {&mt, &st}) {
      r << (side == &mt ? "  the model's events:\n" : "  the sut's events:\n");
      for (std::size_t k = 0; k < side->size(); ++k) r << "    #" << k << " " << show_event((*side)[k]) << "\n";
    }
    return r.str();
  }

  std::optional<std::string> compare() {
    std::ostringstream r;
    // Usage and device errors: the same kind (the wording is each implementation's own);
    // out-of-memory: PyTorch's exact text.
    const bool same = last_sut.kind == last_model.kind && last_sut.ptr == last_model.ptr &&
                      (last_sut.kind == Outcome::Kind::UsageError || last_sut.kind == Outcome::Kind::DeviceError ||
                       last_sut.message == last_model.message);
    if (!same) {
      r << "result differs\n  model: " << show(last_model) << "\n  sut:   " << show(last_sut) << "\n";
      return r.str();
    }
    if (!log.notes.empty()) {
      r << "device calls differ\n";
      for (const auto& n : log.notes) r << "  " << n << "\n";
      return r.str();
    }
    for (auto* q : {&log.malloc, &log.reserve, &log.map})
      for (const DeviceCall& c : *q)
        r << "  the sut called " << (c.kind == DeviceCall::Kind::Malloc ? "cudaMalloc" : c.kind == DeviceCall::Kind::Reserve ? "reserve" : "map")
          << "(" << c.size << ") at " << hex(c.addr) << ", the model did not\n";
    if (!r.str().empty()) return "device calls differ\n" + r.str();
    if (opts.compare_trace) {
      if (auto d = compare_trace()) return d;
    }
    // The sut's state now: compared here, and the state a §14.8 refusal of the next op must keep.
    sut_before = sut_state(*sut);
    if (opts.compare_stats) {
      const auto ms = flatten(model->stats());
      const auto& ss = sut_before.stats;
      if (ms != ss) {
        r << "stats differ (key: model vs sut)\n";
        for (std::size_t i = 0; i < ms.size() && i < ss.size(); ++i)
          if (ms[i] != ss[i])
            r << "  " << ms[i].first << ": " << ms[i].second << " vs " << ss[i].first << ": " << ss[i].second << "\n";
        return r.str();
      }
      // The 21 sleep.* keys beside them (docs/sleep-wake.md section 5), where both sides sleep.
      if constexpr (HasSleep<Model> && HasSleep<Impl>) {
        if (opts.config.sleep) {
          const auto msl = flatten(model->sleep_stats());
          const auto ssl = flatten(sut->sleep_stats());
          if (msl != ssl) {
            r << "sleep stats differ (key: model vs sut)\n";
            for (std::size_t i = 0; i < msl.size() && i < ssl.size(); ++i)
              if (msl[i] != ssl[i])
                r << "  " << msl[i].first << ": " << msl[i].second << " vs " << ssl[i].first << ": " << ssl[i].second
                  << "\n";
            return r.str();
          }
        }
      }
    }
    if (opts.check_invariants) {
      const auto bad = sut_violations();
      if (!bad.empty()) {
        r << "sut invariants() violated\n";
        for (const auto& b : bad) r << "  " << b << "\n";
        return r.str();
      }
      try {
        model->check_invariants();
      } catch (const std::exception& e) {
        r << "model invariants violated\n  " << e.what() << "\n";
        return r.str();
      }
    }
    if (opts.compare_snapshots) {
      Snapshot ms = model->snapshot();
      Snapshot ss = sut_before.snapshot;
      // policy:cachet's rules do not decide what a free block's requested size reads (gpu/
      // leaves the last caller's, the model 0): compared for live blocks only. policy:pytorch
      // keeps PyTorch's stale value, which the model reproduces: compared for every block.
      if constexpr (kPolicy == Policy::Cachet)
        for (Snapshot* snap : {&ms, &ss})
          for (auto& seg : *snap)
            for (auto& b : seg.blocks)
              if (b.state == BlockState::Inactive) b.requested_size = 0;
      if (ms != ss) {
        r << "snapshots differ\n";
        std::size_t i = 0;
        for (; i < ms.size() && i < ss.size(); ++i)
          if (ms[i] != ss[i]) {
            r << "  model: " << show_segment(ms[i]) << "\n  sut:   " << show_segment(ss[i]) << "\n";
            break;
          }
        if (ms.size() != ss.size())
          r << "  model has " << ms.size() << " segments, sut " << ss.size() << "\n";
        return r.str();
      }
    }
    return compare_use_counts();
  }
};

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

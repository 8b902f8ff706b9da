// The lockstep runner (cachet/lockstep.h): the backend log, the model's mirror source, the
// op text form and the per-op comparison.
#include "cachet/lockstep.h"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <deque>
#include <map>
#include <sstream>
#include <stdexcept>
#include <type_traits>

#include "cachet/errors.h"
#include "cachet/model/segment_source.h"
#include "cachet/snapshot.h"
#include "cachet/stats.h"
#include "cachet/trace.h"

namespace cachet::lockstep {

namespace {

std::string hex(std::uint64_t v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}

// ----------------------------------------------------------------------------- device log

struct DeviceLog {
  std::deque<DeviceCall> malloc, reserve, map;
  DeviceCounters counters;
  std::vector<std::string> notes;  // divergences found by the mirror source
  void clear_pending() {
    malloc.clear();
    reserve.clear();
    map.clear();
    notes.clear();
  }
};

// Forwards to the real backend, logging what the model's source must reproduce.
class LoggingMemory final : public gpu::DeviceMemory {
 public:
  LoggingMemory(std::unique_ptr<gpu::DeviceMemory> inner, DeviceLog& log)
      : inner_(std::move(inner)), log_(log) {}
  gpu::BackendCaps caps() const override { return inner_->caps(); }
  DeviceIndex device() const override { return inner_->device(); }
  gpu::Result<gpu::DevicePtr> malloc(Bytes n) override {
    auto r = inner_->malloc(n);
    log_.malloc.push_back({DeviceCall::Kind::Malloc, r.value, n, r.is_ok()});
    if (r.is_ok()) ++log_.counters.mallocs;
    else ++log_.counters.oom_calls;
    return r;
  }
  gpu::Status free(gpu::DevicePtr p) override {
    auto s = inner_->free(p);
    if (s.is_ok()) ++log_.counters.frees;
    return s;
  }
  gpu::Result<gpu::MemInfo> mem_get_info() override { return inner_->mem_get_info(); }
  bool stream_valid(StreamId s) override { return inner_->stream_valid(s); }
  gpu::Result<gpu::EventHandle> event_create() override { return inner_->event_create(); }
  gpu::Status event_record(gpu::EventHandle e, StreamId s) override { return inner_->event_record(e, s); }
  gpu::Result<bool> event_query(gpu::EventHandle e) override { return inner_->event_query(e); }
  gpu::Status event_synchronize(gpu::EventHandle e) override { return inner_->event_synchronize(e); }
  void event_destroy(gpu::EventHandle e) override { inner_->event_destroy(e); }
  gpu::Result<gpu::DevicePtr> reserve(Bytes n) override {
    auto r = inner_->reserve(n);
    log_.reserve.push_back({DeviceCall::Kind::Reserve, r.value, n, r.is_ok()});
    if (r.is_ok()) ++log_.counters.reserves;
    return r;
  }
  gpu::Status unreserve(gpu::DevicePtr p, Bytes n) override { return inner_->unreserve(p, n); }
  gpu::Status map(gpu::DevicePtr p, Bytes n) override {
    auto s = inner_->map(p, n);
    log_.map.push_back({DeviceCall::Kind::Map, p, n, s.is_ok()});
    if (s.is_ok()) ++log_.counters.maps;
    else ++log_.counters.oom_calls;
    return s;
  }
  gpu::Status unmap(gpu::DevicePtr p, Bytes n) override {
    auto s = inner_->unmap(p, n);
    if (s.is_ok()) ++log_.counters.unmaps;
    return s;
  }

 private:
  std::unique_ptr<gpu::DeviceMemory> inner_;
  DeviceLog& log_;
};

// The model's device: the sut's addresses, in order; out of memory decided from the same
// capacity (host) or taken from the device (real device).
class MirrorSource final : public model::SegmentSource {
 public:
  MirrorSource(DeviceLog& log, std::optional<Bytes> capacity, Bytes total, gpu::DeviceMemory* live)
      : log_(log), capacity_(capacity), total_(total), live_(live) {}

  std::optional<std::uint64_t> allocate(Bytes size) override {
    auto call = take(log_.malloc, "cudaMalloc", size);
    bool ok = capacity_ ? size <= *capacity_ - in_use_ : (call && call->ok);
    if (call && call->ok != ok)
      note("cudaMalloc(" + std::to_string(size) + "): the model's device says " + (ok ? "ok" : "out of memory") +
           ", the sut's said " + (call->ok ? "ok" : "out of memory"));
    if (!ok) return std::nullopt;
    in_use_ += size;
    if (call && call->ok) return call->addr;
    fake_ += 2 * MiB + size;
    return 0xdead00000000ull + fake_;
  }
  void free(std::uint64_t, Bytes size) override { in_use_ -= size; }
  std::uint64_t reserve(Bytes size) override {
    auto call = take(log_.reserve, "reserve", size);
    if (call && call->ok) return call->addr;
    fake_ += 2 * MiB + size;
    return 0xbeef00000000ull + fake_;
  }
  void release_reservation(std::uint64_t, Bytes) override {}
  bool map(std::uint64_t addr, Bytes size) override {
    auto call = take(log_.map, "map", size);
    if (call && call->addr != addr)
      note("map: the model mapped " + hex(addr) + ", the sut " + hex(call->addr));
    bool ok = capacity_ ? size <= *capacity_ - in_use_ : (call && call->ok);
    if (call && call->ok != ok)
      note("map(" + std::to_string(size) + "): the model's device says " + (ok ? "ok" : "out of memory") +
           ", the sut's said " + (call->ok ? "ok" : "out of memory"));
    if (ok) in_use_ += size;
    return ok;
  }
  void unmap(std::uint64_t, Bytes size) override { in_use_ -= size; }
  Bytes total_memory() const override { return total_; }
  Bytes free_memory() const override {
    if (capacity_) return *capacity_ - in_use_;
    auto info = live_->mem_get_info();
    return info.is_ok() ? info.value.free : 0;
  }
  // NVML's figure: what the device (backend) reports for this process.
  std::optional<Bytes> process_in_use() const override {
    auto info = live_->mem_get_info();
    return info.is_ok() ? info.value.process_used : std::nullopt;
  }

 private:
  std::optional<DeviceCall> take(std::deque<DeviceCall>& q, const char* what, Bytes size) {
    if (q.empty()) {
      note(std::string("the model called ") + what + "(" + std::to_string(size) + "), the sut did not");
      return std::nullopt;
    }
    DeviceCall c = q.front();
    q.pop_front();
    if (c.size != size)
      note(std::string(what) + ": the model asked for " + std::to_string(size) + " bytes, the sut for " +
           std::to_string(c.size));
    return c;
  }
  void note(std::string s) { log_.notes.push_back(std::move(s)); }

  DeviceLog& log_;
  std::optional<Bytes> capacity_;
  Bytes total_;
  gpu::DeviceMemory* live_;
  Bytes in_use_ = 0;
  std::uint64_t fake_ = 0;
};

template <class F>
Outcome capture(F&& f) {
  Outcome o;
  try {
    f(o);
  } catch (const OutOfMemory& e) {
    o = {Outcome::Kind::OutOfMemory, 0, e.what()};
  } catch (const UsageError& e) {
    o = {Outcome::Kind::UsageError, 0, e.what()};
  } catch (const DeviceError& e) {
    o = {Outcome::Kind::DeviceError, 0, e.what()};
  } catch (const std::exception& e) {
    o = {Outcome::Kind::Other, 0, e.what()};
  }
  return o;
}

bool parse_u64(std::string_view s, std::uint64_t& v) {
  if (s.empty()) return false;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  return ec == std::errc{} && p == s.data() + s.size();
}

std::vector<std::string_view> words(std::string_view line) {
  std::vector<std::string_view> w;
  std::size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && (line[i] == ' ' || line[i] == '\t' || line[i] == '\r')) ++i;
    std::size_t j = i;
    while (j < line.size() && line[j] != ' ' && line[j] != '\t' && line[j] != '\r') ++j;
    if (j > i) w.push_back(line.substr(i, j - i));
    i = j;
  }
  return w;
}

bool prefixed(std::string_view w, char c, std::uint64_t& v) {
  return w.size() >= 2 && w[0] == c && parse_u64(w.substr(1), v);
}

std::string show_block(const BlockSnapshot& b) {
  return hex(b.address) + " size " + std::to_string(b.size) + " req " + std::to_string(b.requested_size) + " " +
         std::string(to_string(b.state));
}

// A trace event in the form both sides are compared in: action, address, size, stream (the
// time stamp is each side's own: gpu/ stamps the wall clock, the model records 0).
std::string show_event(const TraceEvent& e) {
  return std::string(to_string(e.action)) + " addr " + hex(e.addr) + " size " + std::to_string(e.size) + " stream " +
         std::to_string(e.stream);
}
bool same_event(const TraceEvent& a, const TraceEvent& b) {
  return a.action == b.action && a.addr == b.addr && a.size == b.size && a.stream == b.stream;
}

std::string show_segment(const SegmentSnapshot& s) {
  std::string r = "segment " + hex(s.address) + " size " + std::to_string(s.total_size) + " stream " +
                  std::to_string(s.stream) + (s.is_large ? " large" : " small") +
                  (s.is_expandable ? " expandable" : "") + " blocks [";
  for (std::size_t i = 0; i < s.blocks.size(); ++i) r += (i ? "; " : "") + show_block(s.blocks[i]);
  return r + "]";
}

}  // namespace

// ----------------------------------------------------------------------------- text form

std::string show(const Op& op) {
  return std::visit(
      [](const auto& o) -> std::string {
        using T = std::decay_t<decltype(o)>;
        if constexpr (std::is_same_v<T, Allocate>)
          return "alloc " + std::to_string(o.size) + " s" + std::to_string(o.stream);
        else if constexpr (std::is_same_v<T, Free>)
          return "free h" + std::to_string(o.handle);
        else if constexpr (std::is_same_v<T, RecordStream>)
          return "record h" + std::to_string(o.handle) + " s" + std::to_string(o.stream);
        else if constexpr (std::is_same_v<T, CompleteEvents>)
          return "complete s" + std::to_string(o.stream);
        else if constexpr (std::is_same_v<T, EmptyCache>)
          return "empty_cache";
        else {
          char buf[64];
          std::snprintf(buf, sizeof buf, "fraction %.17g", o.fraction);
          return buf;
        }
      },
      op);
}

std::optional<Op> parse_op(std::string_view line) {
  const auto w = words(line);
  if (w.empty()) return std::nullopt;
  std::uint64_t a = 0, b = 0;
  if (w[0] == "alloc" && w.size() == 3 && parse_u64(w[1], a) && prefixed(w[2], 's', b)) return Allocate{a, b};
  if (w[0] == "free" && w.size() == 2 && prefixed(w[1], 'h', a) && a <= UINT32_MAX)
    return Free{static_cast<std::uint32_t>(a)};
  if (w[0] == "record" && w.size() == 3 && prefixed(w[1], 'h', a) && a <= UINT32_MAX && prefixed(w[2], 's', b))
    return RecordStream{static_cast<std::uint32_t>(a), b};
  if (w[0] == "complete" && w.size() == 2 && prefixed(w[1], 's', a)) return CompleteEvents{a};
  if (w[0] == "empty_cache" && w.size() == 1) return EmptyCache{};
  if (w[0] == "fraction" && w.size() == 2) {
    std::string s(w[1]);
    char* end = nullptr;
    const double f = std::strtod(s.c_str(), &end);
    if (end == s.c_str() || *end != '\0') return std::nullopt;
    return SetMemoryFraction{f};
  }
  return std::nullopt;
}

std::string show(const std::vector<Op>& ops) {
  std::string r;
  for (const Op& op : ops) r += show(op) + "\n";
  return r;
}

std::vector<Op> parse_ops(std::string_view text) {
  std::vector<Op> ops;
  std::size_t line_no = 0;
  while (!text.empty()) {
    ++line_no;
    const std::size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text = nl == std::string_view::npos ? std::string_view{} : text.substr(nl + 1);
    const auto w = words(line);
    if (w.empty() || w[0].front() == '#') continue;
    auto op = parse_op(line);
    if (!op) throw std::invalid_argument("line " + std::to_string(line_no) + ": not an op: " + std::string(line));
    ops.push_back(*op);
  }
  return ops;
}

std::string show_case(const Case& c) {
  return "# config: " + c.config + "\n# capacity: " + std::to_string(c.capacity) + "\n" + show(c.ops);
}

Case parse_case(std::string_view text) {
  Case c;
  constexpr std::string_view kConfig = "# config:", kCapacity = "# capacity:";
  for (std::string_view rest = text; !rest.empty();) {
    const std::size_t nl = rest.find('\n');
    std::string_view line = rest.substr(0, nl);
    rest = nl == std::string_view::npos ? std::string_view{} : rest.substr(nl + 1);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.starts_with(kConfig)) {
      line.remove_prefix(kConfig.size());
      if (!line.empty() && line.front() == ' ') line.remove_prefix(1);
      c.config = std::string(line);
    } else if (line.starts_with(kCapacity)) {
      const auto w = words(line.substr(kCapacity.size()));
      std::uint64_t v = 0;
      if (w.size() != 1 || !parse_u64(w[0], v)) throw std::invalid_argument("bad capacity line: " + std::string(line));
      c.capacity = v;
    }
  }
  c.ops = parse_ops(text);
  return c;
}

std::string show(const Outcome& o) {
  switch (o.kind) {
    case Outcome::Kind::Ok: return "ok";
    case Outcome::Kind::Pointer: return "pointer " + hex(o.ptr);
    case Outcome::Kind::OutOfMemory: return "OutOfMemory: " + o.message;
    case Outcome::Kind::UsageError: return "UsageError: " + o.message;
    case Outcome::Kind::DeviceError: return "DeviceError: " + o.message;
    case Outcome::Kind::Other: return "exception: " + o.message;
    case Outcome::Kind::Skipped: return "skipped (no such handle)";
  }
  return "?";
}

// ----------------------------------------------------------------------------- the runner

struct Lockstep::Impl {
  struct Handle {
    std::uint64_t addr;
    Bytes size;
    StreamId stream;
    bool live;
  };

  Options opts;
  DeviceLog log;
  std::shared_ptr<gpu::HostSim> sim;
  std::unique_ptr<MirrorSource> source;
  std::unique_ptr<CachingAllocator> sut;
  std::unique_ptr<model::Allocator> model;
  Outcome last_model, last_sut;
  std::vector<Handle> handles;
  std::map<std::uint64_t, std::uint32_t> live_by_addr;
  Bytes over_cap_ceiling = 0;  // reserved when the cap was last lowered below it (0: none)
  std::size_t model_trace_mark = 0;  // the model's trace events before the current op

  void build(std::unique_ptr<gpu::DeviceMemory> memory, bool host) {
    auto logging = std::make_unique<LoggingMemory>(std::move(memory), log);
    LoggingMemory* raw = logging.get();
    auto info = raw->mem_get_info();
    const Bytes total = info.is_ok() ? info.value.total : opts.capacity;
    sut = std::make_unique<CachingAllocator>(std::move(logging), opts.config);
    if (opts.compare_trace) sut->set_trace(true);
    source = std::make_unique<MirrorSource>(log, host ? std::optional<Bytes>(opts.capacity) : std::nullopt, total,
                                            &sut->device_memory());
    model = std::make_unique<model::Allocator>(opts.config, *source);
    (void)raw;
  }

  // Marks whatever handle lives at `addr` as freed.
  void freed(std::uint64_t addr) {
    auto it = live_by_addr.find(addr);
    if (it == live_by_addr.end()) return;
    handles[it->second].live = false;
    live_by_addr.erase(it);
  }

  std::optional<std::string> apply(const Op& op) {
    log.clear_pending();
    // The trace events of this op only: the sut's recorder is emptied (it also holds the
    // snapshot events of the previous op's checks), the model's trace is read from here on.
    if (opts.compare_trace) sut->clear_trace();
    model_trace_mark = model->trace().size();
    Outcome s, m;
    std::visit(
        [&](const auto& o) {
          using T = std::decay_t<decltype(o)>;
          if constexpr (std::is_same_v<T, Allocate>) {
            s = capture([&](Outcome& r) {
              r.kind = Outcome::Kind::Pointer;
              r.ptr = reinterpret_cast<std::uint64_t>(sut->allocate(o.size, o.stream));
            });
            m = capture([&](Outcome& r) {
              r.kind = Outcome::Kind::Pointer;
              r.ptr = model->malloc(o.size, o.stream);
            });
            if (s.kind == Outcome::Kind::Pointer && s.ptr != 0 && s == m) {
              live_by_addr[s.ptr] = static_cast<std::uint32_t>(handles.size());
              handles.push_back({s.ptr, o.size, o.stream, true});
            }
          } else if constexpr (std::is_same_v<T, Free> || std::is_same_v<T, RecordStream>) {
            if (o.handle >= handles.size()) {
              s = m = {Outcome::Kind::Skipped, 0, {}};
              return;
            }
            const std::uint64_t addr = handles[o.handle].addr;
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
          } else if constexpr (std::is_same_v<T, EmptyCache>) {
            s = capture([&](Outcome&) { sut->empty_cache(); });
            m = capture([&](Outcome&) { model->empty_cache(); });
          } else {
            const Bytes reserved = static_cast<Bytes>(sut->stats().reserved_bytes[0].current);
            over_cap_ceiling = std::max(over_cap_ceiling, reserved);
            s = capture([&](Outcome&) { sut->set_memory_fraction(o.fraction); });
            m = capture([&](Outcome&) { model->set_memory_fraction(o.fraction); });
          }
        },
        op);
    if (opts.events_complete_immediately) model->complete_all_events();
    last_sut = s;
    last_model = m;
    return compare();
  }

  // The op's trace events, in order (trace.h: alloc, free_requested, free_completed,
  // segment_alloc/free/map/unmap, oom): the first that differs, with both sides' lists.
  std::optional<std::string> compare_trace() {
    const auto& all = model->trace();
    const std::vector<TraceEvent> mt(all.begin() + static_cast<std::ptrdiff_t>(model_trace_mark), all.end());
    const std::vector<TraceEvent> st = sut->trace();
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
    if (opts.compare_stats) {
      const auto ms = flatten(model->stats());
      const auto ss = flatten(sut->stats());
      if (ms != ss) {
        r << "stats differ (key: model vs sut)\n";
        for (std::size_t i = 0; i < ms.size() && i < ss.size(); ++i)
          if (ms[i] != ss[i])
            r << "  " << ms[i].first << ": " << ms[i].second << " vs " << ss[i].first << ": " << ss[i].second << "\n";
        return r.str();
      }
    }
    if (opts.check_invariants) {
      auto bad = sut->invariants();
      // Lowering the fraction below what is reserved leaves reserved over the cap (PyTorch
      // frees nothing then); [INV-CAP-1] is then tolerated while reserved does not grow.
      const Bytes reserved = static_cast<Bytes>(sut->stats().reserved_bytes[0].current);
      const auto cap = model->allowed_memory_maximum();
      if (!cap || reserved <= *cap) over_cap_ceiling = 0;
      std::erase_if(bad, [&](const std::string& v) {
        return v.find("[INV-CAP-1]") != std::string::npos && reserved <= over_cap_ceiling;
      });
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
      const Snapshot ms = model->snapshot();
      const Snapshot ss = sut->snapshot();
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
    return std::nullopt;
  }
};

Lockstep::Lockstep(Options options) : impl_(std::make_unique<Impl>()) {
  impl_->opts = std::move(options);
  gpu::HostOptions ho;
  ho.capacity = impl_->opts.capacity;
  impl_->build(gpu::make_host_memory(ho, &impl_->sim), true);
}

Lockstep::Lockstep(Options options, std::unique_ptr<gpu::DeviceMemory> memory) : impl_(std::make_unique<Impl>()) {
  impl_->opts = std::move(options);
  impl_->build(std::move(memory), false);
}

Lockstep::~Lockstep() = default;

std::optional<std::string> Lockstep::apply(const Op& op) { return impl_->apply(op); }

std::optional<std::string> Lockstep::run(const std::vector<Op>& ops) {
  for (std::size_t i = 0; i < ops.size(); ++i)
    if (auto d = apply(ops[i])) return "op #" + std::to_string(i) + " " + show(ops[i]) + ": " + *d;
  return std::nullopt;
}

const Outcome& Lockstep::last_model() const { return impl_->last_model; }
const Outcome& Lockstep::last_sut() const { return impl_->last_sut; }
std::uint32_t Lockstep::handle_count() const { return static_cast<std::uint32_t>(impl_->handles.size()); }
bool Lockstep::live(std::uint32_t h) const { return h < impl_->handles.size() && impl_->handles[h].live; }
std::uint64_t Lockstep::address(std::uint32_t h) const { return impl_->handles.at(h).addr; }
Bytes Lockstep::requested(std::uint32_t h) const { return impl_->handles.at(h).size; }
StreamId Lockstep::stream(std::uint32_t h) const { return impl_->handles.at(h).stream; }
std::vector<std::uint32_t> Lockstep::live_handles() const {
  std::vector<std::uint32_t> r;
  for (const auto& [addr, h] : impl_->live_by_addr) r.push_back(h);
  std::sort(r.begin(), r.end());
  return r;
}
model::Allocator& Lockstep::model() { return *impl_->model; }
CachingAllocator& Lockstep::sut() { return *impl_->sut; }
gpu::HostSim* Lockstep::sim() { return impl_->sim.get(); }
const Options& Lockstep::options() const { return impl_->opts; }
const DeviceCounters& Lockstep::device_counters() const { return impl_->log.counters; }

}  // namespace cachet::lockstep

// Running one input and writing its dump.
//
// Lines (one per op, fields after the result only when not empty):
//   <i> <op> -> <result> | s <key><+-delta> ... | d <device call> ... | t <trace event> ...
//   result   0x<ptr> | null (size 0) | ok | skip (handle never bound) | oom: <what()> |
//            usage: <what()> | device: <what()> | invariant: <what()> | error: <what()>
//   s        how the memory_stats() values changed during the op (stats_codec.cpp: one token
//            per counter or scalar that changed, e.g. allocB.s+512 = allocated_bytes.small_pool
//            current, allocated and peak as one increase by 512 implies)
//   d        every call the allocator made to its DeviceMemory, in order:
//            malloc(n)=0x.. free(0x..) meminfo=free/total stream_valid(s)=0|1 ev_create=e
//            ev_record(e,s) ev_query(e)=0|1 ev_sync(e) ev_destroy(e) reserve(n)=0x..
//            unreserve(0x..,n) map(0x..,n) unmap(0x..,n); a call that failed ends in
//            "=oom(<message>)" or "=error(<message>)"
//   t        the trace events the op emitted, in order: <action>:0x<addr>:<size>:s<stream>,
//            where a field equal to the op's block's (allocate: the new block's pointer, the
//            requested size and stream; free/record: the handle's) is '*', and an event whose
//            three fields all are is its action alone
// The first line after the header is "init" (construction and the initial fraction); after the
// ops: one "snap" line per segment of memory_snapshot() and an "inv" line (invariants()).
#include <cinttypes>
#include <cstdio>
#include <exception>
#include <memory>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "cachet/errors.h"
#include "cachet/gpu/allocator.h"
#include "cachet/snapshot.h"
#include "cachet/stats.h"
#include "cachet/trace.h"
#include "dump.h"
#include "engine.h"
#include "pool_front_end.h"
#include "stats_codec.h"

namespace cachet::behaviour {
namespace {

std::string hex(std::uint64_t v) {
  char b[24];
  std::snprintf(b, sizeof b, "0x%" PRIx64, v);
  return b;
}

std::string num(double f) {
  char b[40];
  std::snprintf(b, sizeof b, "%.17g", f);
  return b;
}

std::string status_suffix(const gpu::Status& s) {
  if (s.is_ok()) return "";
  return std::string(s.is_oom() ? "=oom(" : "=error(") + s.message + ")";
}

// A DeviceMemory that logs every call it forwards (caps() and device() are not device calls).
class LoggingMemory final : public gpu::DeviceMemory {
 public:
  LoggingMemory(std::unique_ptr<gpu::DeviceMemory> inner, std::string* log) : in_(std::move(inner)), log_(log) {}

  gpu::BackendCaps caps() const override {  // the sleep and capture graph calls are not logged: not offered
    gpu::BackendCaps c = in_->caps();
    c.sleep = false;
    c.capture_graph = false;
    return c;
  }
  DeviceIndex device() const override { return in_->device(); }
  gpu::Result<gpu::DevicePtr> malloc(Bytes n) override {
    auto r = in_->malloc(n);
    add("malloc(" + std::to_string(n) + ")" + (r.is_ok() ? "=" + hex(r.value) : status_suffix(r.status)));
    return r;
  }
  gpu::Status free(gpu::DevicePtr p) override {
    auto s = in_->free(p);
    add("free(" + hex(p) + ")" + status_suffix(s));
    return s;
  }
  gpu::Result<gpu::MemInfo> mem_get_info() override {
    auto r = in_->mem_get_info();
    add(r.is_ok() ? "meminfo=" + std::to_string(r.value.free) + "/" + std::to_string(r.value.total)
                  : "meminfo" + status_suffix(r.status));
    return r;
  }
  bool stream_valid(StreamId s) override {
    const bool v = in_->stream_valid(s);
    add("stream_valid(" + std::to_string(s) + ")=" + (v ? "1" : "0"));
    return v;
  }
  gpu::Result<gpu::EventHandle> event_create() override {
    auto r = in_->event_create();
    add(r.is_ok() ? "ev_create=" + std::to_string(r.value) : "ev_create" + status_suffix(r.status));
    return r;
  }
  gpu::Status event_record(gpu::EventHandle e, StreamId s) override {
    auto st = in_->event_record(e, s);
    add("ev_record(" + std::to_string(e) + ",s" + std::to_string(s) + ")" + status_suffix(st));
    return st;
  }
  gpu::Result<bool> event_query(gpu::EventHandle e) override {
    auto r = in_->event_query(e);
    add("ev_query(" + std::to_string(e) + ")" + (r.is_ok() ? (r.value ? "=1" : "=0") : status_suffix(r.status)));
    return r;
  }
  gpu::Status event_synchronize(gpu::EventHandle e) override {
    auto s = in_->event_synchronize(e);
    add("ev_sync(" + std::to_string(e) + ")" + status_suffix(s));
    return s;
  }
  void event_destroy(gpu::EventHandle e) override {
    in_->event_destroy(e);
    add("ev_destroy(" + std::to_string(e) + ")");
  }
  gpu::Result<gpu::DevicePtr> reserve(Bytes n) override {
    auto r = in_->reserve(n);
    add("reserve(" + std::to_string(n) + ")" + (r.is_ok() ? "=" + hex(r.value) : status_suffix(r.status)));
    return r;
  }
  gpu::Status unreserve(gpu::DevicePtr p, Bytes n) override {
    auto s = in_->unreserve(p, n);
    add("unreserve(" + hex(p) + "," + std::to_string(n) + ")" + status_suffix(s));
    return s;
  }
  gpu::Status map(gpu::DevicePtr p, Bytes n) override {
    auto s = in_->map(p, n);
    add("map(" + hex(p) + "," + std::to_string(n) + ")" + status_suffix(s));
    return s;
  }
  gpu::Status unmap(gpu::DevicePtr p, Bytes n) override {
    auto s = in_->unmap(p, n);
    add("unmap(" + hex(p) + "," + std::to_string(n) + ")" + status_suffix(s));
    return s;
  }

 private:
  void add(const std::string& call) {
    if (!log_->empty()) *log_ += ' ';
    *log_ += call;
  }
  std::unique_ptr<gpu::DeviceMemory> in_;
  std::string* log_;
};

// The pointer, requested size and stream of an op's block (allocate: the new one; free/record:
// the handle's), which trace events abbreviate to '*'.
struct Context {
  std::uint64_t ptr = 0;
  Bytes size = 0;
  StreamId stream = 0;
  bool valid = false;
};

// Appends the rest of an op's line: stats changes, device calls, trace events. Checks that the
// "s" field decodes to the stats it encodes.
class LineWriter {
 public:
  explicit LineWriter(CachingAllocator& a) : a_(a), prev_(stat_values(DeviceStats{})), decoded_(prev_.size(), 0) {
    for (auto& v : prev_) v = 0;
  }
  void finish(std::string& out, std::string& calls, const Context& ctx = Context{}) {
    auto now = stat_values(a_.stats());
    const std::string s = encode_stats(prev_, now);
    decode_stats(s, decoded_);
    if (decoded_ != now) throw std::logic_error("behaviour dump: the stats field does not decode to the stats: " + s);
    prev_ = std::move(now);
    if (!s.empty()) out += " | s" + s;
    if (!calls.empty()) out += " | d " + calls;
    calls.clear();
    const auto events = a_.trace();
    if (!events.empty()) {
      out += " | t";
      for (const auto& e : events) {
        out += ' ';
        out += to_string(e.action);
        const bool a = ctx.valid && e.addr == ctx.ptr, n = ctx.valid && e.size == ctx.size,
                   st = ctx.valid && e.stream == ctx.stream;
        if (a && n && st) continue;
        out += ':' + (a ? std::string("*") : hex(e.addr)) + ':' + (n ? std::string("*") : std::to_string(e.size)) +
               ':' + (st ? std::string("*") : "s" + std::to_string(e.stream));
      }
      a_.clear_trace();
    }
    out += '\n';
  }

 private:
  CachingAllocator& a_;
  std::vector<std::int64_t> prev_, decoded_;
};

void* to_ptr(std::uint64_t v) { return reinterpret_cast<void*>(static_cast<std::uintptr_t>(v)); }
std::uint64_t from_ptr(void* p) { return static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(p)); }

// Runs `f`; returns the result field ("ok" or the error).
template <class F>
std::string guarded(F&& f) {
  try {
    return f();
  } catch (const OutOfMemory& e) {
    return std::string("oom: ") + e.what();
  } catch (const UsageError& e) {
    return std::string("usage: ") + e.what();
  } catch (const DeviceError& e) {
    return std::string("device: ") + e.what();
  } catch (const InvariantViolation& e) {
    return std::string("invariant: ") + e.what();
  } catch (const std::exception& e) {
    return std::string("error: ") + e.what();
  }
}

// Messages may hold newlines (InvariantViolation); a dump line must not.
std::string one_line(std::string s) {
  for (char& c : s)
    if (c == '\n') c = '\\';
  return s;
}

// The allocator as the private-pool front end drives it (tools/engine.h, pool_front_end.h).
class PoolCalls final : public cli::ReplayEngine {
 public:
  explicit PoolCalls(CachingAllocator& a) : a_(a) {}
  // The front end's only allocations are the generator's tensors, on the main thread.
  std::uint64_t malloc(Bytes size, StreamId stream, ThreadIndex /*thread*/) override {
    return from_ptr(a_.allocate(size, stream));
  }
  void free(std::uint64_t ptr) override { a_.free(to_ptr(ptr)); }
  void record_stream(std::uint64_t ptr, StreamId stream) override { a_.record_stream(to_ptr(ptr), stream); }
  void empty_cache() override { a_.empty_cache(); }
  DeviceStats stats() const override { return a_.stats(); }
  Snapshot snapshot() const override { return a_.snapshot(); }
  std::vector<TraceEvent> trace() const override { return a_.trace(); }
  void create_or_incref_pool(PoolId id) override { a_.create_or_incref_pool(id); }
  void begin_allocate_to_pool(PoolId id, PoolRoute route) override { a_.begin_allocate_to_pool(id, route); }
  void end_allocate_to_pool(PoolId id) override { a_.end_allocate_to_pool(id); }
  void release_pool(PoolId id) override { a_.release_pool(id); }
  void empty_cache_of(PoolId id) override { a_.empty_cache(id); }
  int pool_use_count(PoolId id) const override { return a_.pool_use_count(id); }

 private:
  CachingAllocator& a_;
};

void write_snapshot(CachingAllocator& a, std::string& out) {
  for (const SegmentSnapshot& seg : a.snapshot()) {
    out += "snap " + hex(seg.address) + " " + std::to_string(seg.total_size) + " s" + std::to_string(seg.stream) +
           (seg.is_large ? " large" : " small") + (seg.is_expandable ? " expandable" : "");
    // A private pool's segment names its pool (§14.1); the default pools' lines are unchanged.
    if (!seg.pool_id.is_default())
      out += " pool=" + std::to_string(seg.pool_id.first) + "," + std::to_string(seg.pool_id.second);
    out += ":";
    std::uint64_t at = seg.address;
    for (const BlockSnapshot& b : seg.blocks) {
      out += ' ';
      if (b.address != at) out += '@' + hex(b.address) + '/';
      out += std::to_string(b.size) + '/' + std::to_string(b.requested_size) + '/' + std::string(to_string(b.state));
      at = b.address + b.size;
    }
    out += '\n';
  }
  const auto inv = a.invariants();
  out += "inv";
  if (inv.empty()) out += " ok";
  for (const auto& v : inv) out += " [" + one_line(v) + "]";
  out += '\n';
}

}  // namespace

std::string dump(const Input& in) {
  std::string out = "== " + in.name + " conf='" + in.conf + "' capacity=" + std::to_string(in.host.capacity);
  if (in.host.total_memory) out += " total=" + std::to_string(*in.host.total_memory);
  if (in.host.recorded) out += " recorded=" + std::to_string(in.host.recorded->size());
  if (in.initial_fraction) out += " fraction=" + num(*in.initial_fraction);
  out += " ops=" + std::to_string(in.ops.size()) + "\n";

  std::string calls;
  std::shared_ptr<gpu::HostSim> sim;
  auto memory = std::make_unique<LoggingMemory>(gpu::make_host_memory(in.host, &sim), &calls);
  for (StreamId s : in.other_device_streams) sim->set_stream_device(s, in.host.device + 1);
  std::unique_ptr<CachingAllocator> a;
  out += "init -> " + guarded([&] {
    a = std::make_unique<CachingAllocator>(std::move(memory), parse_config(in.conf, ConfigSource::Cachet).config);
    a->set_trace(true);
    if (in.initial_fraction) a->set_memory_fraction(*in.initial_fraction);
    return std::string("ok");
  });
  if (!a) {
    out += '\n';
    return out;
  }
  LineWriter w(*a);
  w.finish(out, calls);
  PoolCalls pool_calls(*a);
  cli::PoolFrontEnd pools(pool_calls, in.streams);

  std::unordered_map<std::uint64_t, Context> bound;  // handle -> its allocation
  for (std::size_t i = 0; i < in.ops.size(); ++i) {
    const Op& op = in.ops[i];
    out += std::to_string(i) + ' ' + ops::show(op) + " -> ";
    Context ctx;
    const auto* free_op = std::get_if<ops::Free>(&op);
    const auto* record_op = std::get_if<ops::RecordStream>(&op);
    if (free_op || record_op)
      if (const auto it = bound.find(free_op ? free_op->handle : record_op->handle); it != bound.end()) ctx = it->second;
    std::string r = guarded([&]() -> std::string {
      if (const auto* o = std::get_if<ops::Allocate>(&op)) {
        void* p = a->allocate(o->size, o->stream);
        ctx = {from_ptr(p), o->size, o->stream, true};
        bound[o->id.value()] = ctx;
        return p ? hex(from_ptr(p)) : "null";
      }
      if (free_op) {
        if (!ctx.valid) return "skip";
        a->free(to_ptr(ctx.ptr));
        return "ok";
      }
      if (record_op) {
        if (!ctx.valid) return "skip";
        a->record_stream(to_ptr(ctx.ptr), record_op->stream);
        return "ok";
      }
      if (const auto* o = std::get_if<ops::CompleteEvents>(&op)) {
        sim->complete_events(o->stream);
        return "ok";
      }
      if (std::holds_alternative<ops::CompleteAllEvents>(op)) {
        sim->complete_all_events();
        return "ok";
      }
      if (std::holds_alternative<ops::EmptyCache>(op)) {
        a->empty_cache();
        return "ok";
      }
      if (const auto* o = std::get_if<ops::SetMemoryFraction>(&op)) {
        a->set_memory_fraction(o->fraction);
        return "ok";
      }
      pools.apply(op);  // the pool and capture ops (docs/pytorch-allocator.md §14.9)
      return "ok";
    });
    out += one_line(std::move(r));
    w.finish(out, calls, ctx);
  }
  write_snapshot(*a, out);
  return out;
}

}  // namespace cachet::behaviour

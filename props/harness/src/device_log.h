// props/harness/src/device_log.h (internal to the lockstep runner): what the sut asked of its
// device (the backend wrapper's log), the model's mirror of that device, how one side's result
// is caught as an Outcome, and the one-line forms of blocks, segments and trace events the
// reports print.
#pragma once

#include <cstdio>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cachet/errors.h"
#include "cachet/lockstep.h"
#include "cachet/model/segment_source.h"
#include "cachet/snapshot.h"
#include "cachet/summary.h"
#include "cachet/trace.h"

namespace cachet::lockstep::detail {

inline std::string hex(std::uint64_t v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}

// ----------------------------------------------------------------------------- device log

struct DeviceLog {
  std::deque<DeviceCall> malloc, reserve, map;
  DeviceCounters counters;
  std::vector<std::string> notes;  // divergences found by the mirror source
  // What the sut's last mem_get_info of this op answered (a real device's free memory moves
  // under other work; the model states the figures the sut saw).
  std::optional<gpu::MemInfo> info;
  void clear_pending() {
    malloc.clear();
    reserve.clear();
    map.clear();
    notes.clear();
    info.reset();
  }
};

// Forwards to the real backend, logging what the model's source must reproduce.
class LoggingMemory final : public gpu::DeviceMemory {
 public:
  // complete_when_recorded: each event is synchronized right after it is recorded, so that a
  // real device's events are complete when recorded, as the model is told (Options::
  // events_complete_immediately): a cudaEventQuery made at once after a cudaEventRecord in the
  // same allocator call (process_events after a capture's deferred frees, docs/pytorch-allocator.md
  // §14.7) could otherwise race the device. The sut's calls are the same; only their timing is fixed.
  LoggingMemory(std::unique_ptr<gpu::DeviceMemory> inner, DeviceLog& log, bool complete_when_recorded = false)
      : inner_(std::move(inner)), log_(log), complete_when_recorded_(complete_when_recorded) {}
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
  gpu::Result<gpu::MemInfo> mem_get_info() override {
    auto r = inner_->mem_get_info();
    if (r.is_ok()) log_.info = r.value;
    return r;
  }
  bool stream_valid(StreamId s) override { return inner_->stream_valid(s); }
  gpu::Result<gpu::EventHandle> event_create() override { return inner_->event_create(); }
  gpu::Status event_record(gpu::EventHandle e, StreamId s) override {
    auto st = inner_->event_record(e, s);
    if (st.is_ok() && complete_when_recorded_) return inner_->event_synchronize(e);
    return st;
  }
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
  // The sleep calls (docs/sleep-wake.md section 6), forwarded as they are.
  gpu::Result<void*> host_alloc(Bytes n) override { return inner_->host_alloc(n); }
  void host_free(void* h) override { inner_->host_free(h); }
  gpu::Status copy_to_host(void* h, gpu::DevicePtr p, Bytes n) override { return inner_->copy_to_host(h, p, n); }
  gpu::Status copy_to_device(gpu::DevicePtr p, const void* h, Bytes n) override {
    return inner_->copy_to_device(p, h, n);
  }
  gpu::Status copy_synchronize() override { return inner_->copy_synchronize(); }
  // The capture graph queries (docs/pytorch-allocator.md §14.10.1): forwarded, not device calls to log.
  gpu::Result<gpu::CaptureInfo> capture_info(StreamId s) override { return inner_->capture_info(s); }
  gpu::Result<std::vector<gpu::GraphNode>> node_dependencies(gpu::GraphNode n) override {
    return inner_->node_dependencies(n);
  }
  // A reserve + map_pieces of the same range is a cachet_sleep segment (gpu/'s vmm_segment_alloc):
  // the model's cudaMalloc. Any other map_pieces is a wake's map: the model's map.
  gpu::Status map_pieces(gpu::DevicePtr p, Bytes n) override {
    auto s = inner_->map_pieces(p, n);
    if (!log_.reserve.empty() && log_.reserve.back().addr == p && log_.reserve.back().size == n &&
        log_.reserve.back().ok) {
      log_.reserve.pop_back();
      --log_.counters.reserves;
      log_.malloc.push_back({DeviceCall::Kind::Malloc, s.is_ok() ? p : 0, n, s.is_ok()});
      if (s.is_ok()) ++log_.counters.mallocs;
      else ++log_.counters.oom_calls;
      return s;
    }
    log_.map.push_back({DeviceCall::Kind::Map, p, n, s.is_ok()});
    if (s.is_ok()) ++log_.counters.maps;
    else ++log_.counters.oom_calls;
    return s;
  }

 private:
  std::unique_ptr<gpu::DeviceMemory> inner_;
  DeviceLog& log_;
  bool complete_when_recorded_ = false;
};

// The model's device: the sut's addresses, in order; out of memory decided from the same
// capacity (host: the host backend's device size) or taken from the device (real device), whose
// free memory and process figure are those the sut read last in this op (else the device's now).
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
    if (log_.info) return log_.info->free;
    auto info = live_->mem_get_info();
    return info.is_ok() ? info.value.free : 0;
  }
  // NVML's figure: what the device (backend) reports for this process.
  std::optional<Bytes> process_in_use() const override {
    if (log_.info) return log_.info->process_used;
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
    // Made from facts: the facts, its text formatted only where a report or a mismatch needs it.
    if (const OomFacts* f = e.facts()) o = {Outcome::Kind::OutOfMemory, 0, {}, *f};
    else o = {Outcome::Kind::OutOfMemory, 0, e.what()};
  } catch (const UsageError& e) {
    o = {Outcome::Kind::UsageError, 0, e.what()};
  } catch (const DeviceError& e) {
    o = {Outcome::Kind::DeviceError, 0, e.what()};
  } catch (const PyTorchFailure& e) {
    o = {Outcome::Kind::PyTorchFailure, 0, e.what()};
  } catch (const std::exception& e) {
    o = {Outcome::Kind::Other, 0, e.what()};
  }
  return o;
}

inline std::string show_pool(PoolId id) {
  return "{" + std::to_string(id.first) + ", " + std::to_string(id.second) + "}";
}

inline std::string show_block(const BlockSnapshot& b) {
  return hex(b.address) + " size " + std::to_string(b.size) + " req " + std::to_string(b.requested_size) + " " +
         std::string(to_string(b.state));
}

// A trace event in the form both sides are compared in: action, address, size, stream (the
// time stamp is each side's own: gpu/ stamps the wall clock, the model records 0).
inline std::string show_event(const TraceEvent& e) {
  return std::string(to_string(e.action)) + " addr " + hex(e.addr) + " size " + std::to_string(e.size) + " stream " +
         std::to_string(e.stream);
}
inline bool same_event(const TraceEvent& a, const TraceEvent& b) {
  return a.action == b.action && a.addr == b.addr && a.size == b.size && a.stream == b.stream;
}

inline std::string show_segment(const SegmentSnapshot& s) {
  std::string r = "segment " + hex(s.address) + " size " + std::to_string(s.total_size) + " stream " +
                  std::to_string(s.stream) + (s.is_large ? " large" : " small") +
                  (s.is_expandable ? " expandable" : "") + (s.pool_id.is_default() ? "" : " pool " + show_pool(s.pool_id)) +
                  (s.is_sleeping ? " sleeping backup " + std::to_string(s.backup_size) : "") + " blocks [";
  for (std::size_t i = 0; i < s.blocks.size(); ++i) r += (i ? "; " : "") + show_block(s.blocks[i]);
  return r + "]";
}

}  // namespace cachet::lockstep::detail

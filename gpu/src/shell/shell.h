// gpu/src/shell/shell.h: Shell, what every policy has around its rules, written once. A policy
// (shell/policy.h) derives from it and uses these members instead of keeping its own: the device
// (backend, capabilities, index, total memory), the configuration, the accounting record (the one
// writer of the stats, shell/accounting.h), the memory cap, the stream check, the event pool, the trace recorder, and the pointer diagnostics. No
// locking: every member runs with the API layer's mutex held (style note 11).
//
// Not here, because the policies differ in them (and behaviour stays each policy's own): the
// queue of pending events and its order (policy:pytorch: one FIFO per stream; policy:cachet: one
// list in recording order), the OOM path (what is recorded and counted before the message), and
// what follows a change of the cap.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "cachet/config.h"
#include "cachet/errors.h"
#include "cachet/gpu/backend.h"
#include "cachet/stats.h"
#include "cachet/summary.h"
#include "cachet/trace.h"
#include "messages.h"
#include "ptr_map.h"
#include "shell/accounting.h"
#include "shell/event_pool.h"
#include "shell/known_streams.h"
#include "shell/memory_cap.h"
#include "shell/pointer_errors.h"
#include "shell/trace_recorder.h"

namespace cachet::gpu::detail {

// PyTorch's beginAllocateToPool filter (cachet::PoolFilter, allocator.h; the same type): which
// allocations, by stream, an active private pool takes (docs/pytorch-allocator.md §14.2).
using PoolFilter = std::function<bool(StreamId)>;

class Shell {
 public:
  Shell(const Shell&) = delete;
  Shell& operator=(const Shell&) = delete;

  const DeviceStats& stats() const { return accounting_.stats(); }
  void reset_accumulated_stats() { accounting_.reset_accumulated(); }
  void reset_peak_stats() { accounting_.reset_peak(); }
  void set_trace(bool on) { trace_.set_on(on); }
  bool trace_on() const { return trace_.on(); }
  const std::vector<TraceEvent>& trace() const { return trace_.events(); }
  void clear_trace() { trace_.clear(); }
  const Config& config() const { return config_; }
  DeviceMemory& memory() { return *mem_; }
  // cudaMemGetInfo's free bytes (cacheInfo's first guess, §15.4); DeviceError if it fails.
  Bytes device_free_memory() const {
    auto info = mem_->mem_get_info();
    if (!info.is_ok()) throw DeviceError(device_error("cudaMemGetInfo", 0, device_, info.status));
    return info.value.free;
  }
  DeviceIndex device() const { return device_; }
  Bytes total_memory() const { return total_memory_; }
  double memory_fraction() const { return cap_.fraction(total_memory_); }
  std::optional<Bytes> allowed_memory_maximum() const { return cap_.allowed(); }

 protected:
  Shell(std::unique_ptr<DeviceMemory> memory, const Config& config)
      : mem_(std::move(memory)),
        caps_(mem_->caps()),
        device_(mem_->device()),
        config_(config),
        accounting_(config.max_split_size_stat()) {}  // fixed at construction (§4.1)
  ~Shell() = default;

  // cudaMemGetInfo's total into total_memory_; DeviceError when the device cannot say.
  void read_total_memory() {
    auto info = mem_->mem_get_info();
    if (!info.is_ok()) throw DeviceError(device_error("cudaMemGetInfo", 0, device_, info.status));
    total_memory_ = info.value.total;
  }
  void record(TraceAction a, std::uint64_t addr, Bytes size, StreamId stream) { trace_.record(a, addr, size, stream); }
  // UsageError (changing nothing) for a stream of another device.
  void check_stream(StreamId stream, const char* op) const { known_streams_.check(*mem_, device_, stream, op); }
  // docs/pytorch-allocator.md §1.2: a request of 1 EiB or more is refused before anything else (no stats, no trace).
  [[noreturn]] void throw_request_too_large(Bytes size) const {
    OomFacts f;
    f.alloc_size = size;
    f.device = device_;
    throw OutOfMemory(oom_message(f));
  }
  // The facts of an out-of-memory message (docs/pytorch-allocator.md §3.7): the device's free
  // and total bytes from `info` (when the device could say), the cap and the current allocated
  // and reserved bytes. Both policies' OOM paths build their message from it.
  OomFacts oom_facts(Bytes alloc_size, const Result<MemInfo>& info) const {
    OomFacts f;
    f.alloc_size = alloc_size;
    f.device = device_;
    if (info.is_ok()) {
      f.device_free = info.value.free;
      f.device_total = info.value.total;
      f.process_in_use = info.value.process_used;
    }
    f.allowed = cap_.allowed();
    f.allocated = static_cast<Bytes>(stats().allocated_bytes[0].current);
    f.reserved = static_cast<Bytes>(stats().reserved_bytes[0].current);
    return f;
  }
  // The active block at `ptr`; else throw_bad_pointer, with the block `holder(ptr)` names.
  template <class B, class Holder>
  B* find_active_in(const PtrMap<B>& active, DevicePtr ptr, const char* op, Holder&& holder) const {
    if (B* b = active.find(ptr)) [[likely]]
      return b;
    throw_bad_pointer(op, ptr, device_, holder(ptr));
  }

  std::unique_ptr<DeviceMemory> mem_;
  BackendCaps caps_;
  DeviceIndex device_;
  Config config_;
  Bytes total_memory_ = 0;
  Accounting accounting_;
  MemoryCap cap_;
  EventPool event_pool_;
  mutable KnownStreams known_streams_;

 private:
  TraceRecorder trace_;
};

}  // namespace cachet::gpu::detail

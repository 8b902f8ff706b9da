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
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cachet/config.h"
#include "cachet/errors.h"
#include "cachet/gpu/backend.h"
#include "cachet/stats.h"
#include "cachet/summary.h"
#include "cachet/tags.h"
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
  void reset_accumulated_stats() {
    accounting_.reset_accumulated();
    sleep_stats_.reset_accumulated();
  }
  void reset_peak_stats() {
    accounting_.reset_peak();
    sleep_stats_.reset_peak();
  }
  const SleepStats& sleep_stats() const { return sleep_stats_; }
  void set_trace(bool on) { trace_.set_on(on); }
  void set_trace_listener(TraceListener l) { trace_.set_listener(std::move(l)); }
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

  // Used by CachingAllocator::prepare_backup_buffers (allocator.h) as well as by sleep().
  // sleep()/wake() refusals before anything changes (docs/sleep-wake.md section 3 step 1, §6).
  void check_sleep_call(const char* op, const TagList& tags, const TagList* backup_tags) const {
    if (!config_.sleep)
      throw UsageError(std::string(op) +
                       ": sleep needs CACHET_ALLOC_CONF cachet_sleep:True set before the first allocation");
    auto check_list = [&](const TagList& list, const char* what) {
      for (std::size_t i = 0; i < list.size(); ++i) {
        check_tag(list[i]);
        for (std::size_t j = 0; j < i; ++j)
          if (list[j] == list[i])
            throw UsageError(std::string(op) + ": the tag '" + list[i] + "' is named twice in " + what +
                             "; name each tag once");
      }
    };
    check_list(tags, "tags");
    if (backup_tags != nullptr) check_list(*backup_tags, "backup_tags");
  }

  // The buffers a later sleep() will take, pinned now and kept by the backend (docs/sleep-wake.md
  // section 6), all held at once as that sleep holds them, so that the first sleep pays a pinned
  // copy only. Returns their bytes. A kept buffer large enough is taken, not pinned again. If one
  // cannot be had, the ones got are kept and OutOfMemory names the bytes (the sleep stats do not
  // change: no sleep failed).
  Bytes pin_backup_buffers(const std::map<std::uint32_t, Bytes>& need) {
    std::vector<void*> got;
    Bytes total = 0;
    for (const auto& [tag, bytes] : need) {
      auto r = mem_->host_alloc(bytes);
      if (!r.is_ok()) {
        for (void* h : got) mem_->host_free(h);
        throw OutOfMemory("prepare_backup_buffers(): " + std::to_string(bytes) + " bytes (" + format_size(bytes) +
                          ") of pinned host memory for the tag '" + tag_name(tag) + "' could not be had (" +
                          r.status.message + "); the first sleep will try again");
      }
      got.push_back(r.value);
      total += bytes;
    }
    for (void* h : got) mem_->host_free(h);
    return total;
  }

 protected:
  Shell(std::unique_ptr<DeviceMemory> memory, const Config& config)
      : mem_(std::move(memory)),
        caps_(mem_->caps()),
        device_(mem_->device()),
        config_(config),
        accounting_(config.max_split_size_stat()) {  // fixed at construction (§4.1)
    if (config_.sleep && !(caps_.reserve_va && caps_.sleep))  // docs/sleep-wake.md section 6
      throw UsageError(
          "cachet_sleep:True needs a backend with the CUDA VMM calls (cuMemCreate/cuMemMap) and pinned host "
          "memory; this one has none: use the CUDA VMM backend or drop cachet_sleep");
  }
  ~Shell() = default;

  // --- tags (docs/sleep-wake.md section 1-2) ---
  // The calling thread's current tag as a small id (0 = "default"), interned on first use. While
  // no thread ever used another tag, tags_seen() is false and the block search looks at no tag.
  [[gnu::always_inline]] std::uint32_t current_tag_id() {
    if (!tags_seen_ && !tag_ever_set()) [[likely]]
      return 0;
    return intern_current_tag();
  }
  [[gnu::noinline]] std::uint32_t intern_current_tag() {
    const Tag& t = current_tag();
    if (!tags_seen_) {
      if (t == kDefaultTag) [[likely]]
        return 0;
      tags_seen_ = true;
    }
    for (std::uint32_t i = 0; i < tag_names_.size(); ++i)
      if (tag_names_[i] == t) return i;
    tag_names_.push_back(t);
    return static_cast<std::uint32_t>(tag_names_.size() - 1);
  }
  bool tags_seen() const { return tags_seen_; }
  const Tag& tag_name(std::uint32_t id) const { return tag_names_[id]; }
  // sleep()'s host memory, all of it before anything changes (docs/sleep-wake.md section 3 step 4):
  // one pinned buffer of need[tag] bytes per backed-up tag. If any cannot be had, the buffers got
  // so far are given back, sleep.num_backup_failures counts one, and OutOfMemory names the bytes.
  std::map<std::uint32_t, unsigned char*> obtain_backup_buffers(const std::map<std::uint32_t, Bytes>& need) {
    std::map<std::uint32_t, unsigned char*> buffers;
    for (const auto& [tag, bytes] : need) {
      auto r = mem_->host_alloc(bytes);
      if (!r.is_ok()) {
        for (auto& [t, h] : buffers) mem_->host_free(h);
        ++sleep_stats_.num_backup_failures;
        Bytes total = 0;
        for (const auto& [t, n] : need) total += n;
        throw OutOfMemory("sleep(): out of pinned host memory: the backups of this sleep need " + std::to_string(total) +
                          " bytes (" + format_size(total) + "), and " + std::to_string(bytes) + " bytes for the tag '" +
                          tag_name(tag) + "' could not be had (" + r.status.message +
                          "); nothing was put to sleep. Free host memory, or back up fewer tags");
      }
      buffers[tag] = static_cast<unsigned char*>(r.value);
    }
    return buffers;
  }

  // cudaMemGetInfo's total into total_memory_; DeviceError when the device cannot say.
  void read_total_memory() {
    auto info = mem_->mem_get_info();
    if (!info.is_ok()) throw DeviceError(device_error("cudaMemGetInfo", 0, device_, info.status));
    total_memory_ = info.value.total;
  }
  // record() would keep or tell the event: the trace is on or a listener is set.
  bool recording() const { return trace_.active(); }
  void record(TraceAction a, std::uint64_t addr, Bytes size, StreamId stream, PoolId pool = {}) {
    trace_.record(a, addr, size, stream, pool);
  }
  // An event the listener (PyTorch's trackers) and the trace take on different sides of a device
  // call (trace_recorder.h): tell_listener tells the listener only (a segment's free, before the
  // device call), keep_in_trace keeps it in the trace only (once the call succeeded);
  // tell_still_there, when the call failed, tells the listener the segment is still there (an
  // NCCL registration dropped at the first tell is made again).
  void tell_listener(TraceAction a, std::uint64_t addr, Bytes size, StreamId stream, PoolId pool) {
    trace_.tell(a, addr, size, stream, pool);
  }
  void keep_in_trace(TraceAction a, std::uint64_t addr, Bytes size, StreamId stream, PoolId pool) {
    trace_.keep(a, addr, size, stream, pool);
  }
  void tell_still_there(std::uint64_t addr, Bytes size, StreamId stream, PoolId pool) {
    trace_.tell(TraceAction::SegmentAlloc, addr, size, stream, pool);
  }
  // UsageError (changing nothing) for a stream of another device.
  void check_stream(StreamId stream, const char* op) const { known_streams_.check(*mem_, device_, stream, op); }
  // docs/pytorch-allocator.md §1.2: a request of 1 EiB or more is refused before anything else (no stats, no trace).
  [[noreturn]] void throw_request_too_large(Bytes size) const {
    OomFacts f;
    f.alloc_size = size;
    f.device = device_;
    throw OutOfMemory(f);
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
  SleepStats sleep_stats_;  // docs/sleep-wake.md section 5; written by the policy's sleep, wake and frees

 private:
  TraceRecorder trace_;
  std::vector<Tag> tag_names_{Tag(kDefaultTag)};  // by id
  bool tags_seen_ = false;
};

}  // namespace cachet::gpu::detail

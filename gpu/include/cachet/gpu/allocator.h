// cachet/gpu/allocator.h: cachet::CachingAllocator, the production allocator. One instance per
// device; PyTorch 2.11's observable behaviour under the `pytorch` policy (pointers, the 122
// stats, snapshot, trace events, OOM messages), on its own fast structures.
//
// Threads: any thread may call any member. One lock (gpu::SpinMutex) per allocator is taken here,
// in the API layer only (style note 11); the core never locks.
//
// Errors: bad input throws cachet::UsageError and changes nothing (free of an unknown,
// interior or already freed pointer, record_stream on a freed block, a stream of another
// device, a fraction outside [0, 1]); running out of memory throws cachet::OutOfMemory with
// PyTorch's message; a failing device call throws cachet::DeviceError and loses no block and
// leaves the stats consistent. With cachet_validate:True every operation ends with
// invariants(), and a violation throws InvariantViolation. Where PyTorch 2.11 itself fails with
// private pools (docs/pytorch-allocator.md §14.8) the operation throws PyTorchFailsHere (a
// UsageError) naming the rule, and nothing changes.
#pragma once

#include <functional>
#include <memory>
#include <mutex>

#include "cachet/gpu/spin_mutex.h"
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "cachet/config.h"
#include "cachet/errors.h"
#include "cachet/gpu/backend.h"
#include "cachet/snapshot.h"
#include "cachet/stats.h"
#include "cachet/trace.h"
#include "cachet/types.h"

namespace cachet {

// PyTorch's std::function<bool(cudaStream_t)> filter of beginAllocateToPool, on cachet's
// StreamId (a cudaStream_t's bits): which allocations an active private pool takes (§14.2).
using PoolFilter = std::function<bool(StreamId)>;

namespace gpu::detail {
class PolicyCore;  // the policy this allocator runs (policy:pytorch or policy:cachet)
}

// invariants() found a violation in validate mode: an allocator bug, not bad input.
class InvariantViolation : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

// An operation at which PyTorch 2.11 itself fails (docs/pytorch-allocator.md §14.8: the
// expandable segments' device allocation count of a private pool; giving memory back during a
// CUDA graph capture; destroying a MemPool while another pool is active). gpu/ refuses it
// instead of aborting: what() names the rule, and the allocator's state and stats are unchanged.
class PyTorchFailsHere : public UsageError {
 public:
  using UsageError::UsageError;
};

class CachingAllocator {
 public:
  // An allocator over `memory` (one device). Throws DeviceError if the device cannot report
  // its memory, UsageError if the config asks for something the backend cannot do.
  explicit CachingAllocator(std::unique_ptr<gpu::DeviceMemory> memory, Config config = {});
  // The CUDA backend for `device` (VMM when config.expandable_segments). Throws DeviceError
  // when CUDA is unavailable (built without CUDA, no driver, no such device).
  static std::unique_ptr<CachingAllocator> for_cuda_device(DeviceIndex device, Config config = {});
  // Config from CACHET_ALLOC_CONF / PYTORCH_CUDA_ALLOC_CONF / PYTORCH_ALLOC_CONF.
  static Config config_from_environment();
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // PyTorch's malloc: size 0 returns nullptr; sizes >= 1 EiB throw OutOfMemory ("more than 1EB").
  void* allocate(Bytes size, StreamId stream);
  // PyTorch's free; nullptr is ignored.
  void free(void* ptr);
  // Tensor.record_stream: `ptr` (as allocate returned it) is used on `stream`.
  void record_stream(void* ptr, StreamId stream);
  // torch.cuda.empty_cache(): the default pools and every freeable private pool (§3.4, §14.6).
  void empty_cache();
  // Private pools (docs/pytorch-allocator.md §14), PyTorch's names. UsageError, changing nothing,
  // for bad use: the default id {0, 0}, an unknown pool, a pool already active or not active, a
  // use count already 0.
  // createOrIncrefPool: a new pool with use count 1, or one more user of a live one (§14.4).
  void create_or_incref_pool(PoolId id);
  // beginAllocateToPool: one more user, then allocations whose stream `filter` takes go to pool
  // `id` (newest active pool first) until end_allocate_to_pool (§14.2). `capture`: a CUDA graph
  // capture (true) or use_mem_pool (false); it only changes what is refused while it is under
  // way (§14.8.2); the plug-in cannot tell and passes false.
  void begin_allocate_to_pool(PoolId id, PoolFilter filter, bool capture = false);
  // Replays and tests: a capture route takes its stream; a use_mem_pool route (CurrentThread)
  // takes the allocations of the OS thread that calls this, as PyTorch's filter does (§14.10.2).
  void begin_allocate_to_pool(PoolId id, PoolRoute route);
  void end_allocate_to_pool(PoolId id);  // endAllocateToPool; keeps the user
  // releasePool: one user fewer; at 0 the pool's free segments may go back (§14.4-14.6).
  void release_pool(PoolId id);
  // emptyCache(mempool_id), a MemPool's destructor: that pool's free segments if all its users
  // released it (§14.6); the default id is empty_cache().
  void empty_cache(PoolId id);
  int pool_use_count(PoolId id) const;  // getPoolUseCount
  // torch.cuda.set_per_process_memory_fraction: [0, 1]; 1 = no cap.
  void set_memory_fraction(double fraction);
  double memory_fraction() const;

  DeviceStats stats() const;
  void reset_accumulated_stats();
  void reset_peak_stats();
  std::string summary(bool abbreviated = false) const;  // torch.cuda.memory_summary()
  Snapshot snapshot();                                  // memory_snapshot(); records a snapshot event

  void set_trace(bool on);  // _record_memory_history(enabled="all") / (None)
  std::vector<TraceEvent> trace() const;
  void clear_trace();

  // Runtime settings (_set_allocator_settings): parsed over the current config; on error
  // nothing changes. Returns the parser's warnings.
  std::vector<ConfigWarning> configure(std::string_view text);
  void configure_from_environment();
  Config config() const;

  // The numbered invariants (gpu/README.md) that do not hold now; empty when all hold.
  std::vector<std::string> invariants() const;

  DeviceIndex device() const;
  Bytes total_memory() const;
  gpu::DeviceMemory& device_memory();  // the backend (tests reach their HostSim through it)

 private:
  void validate(const char* op) const;  // mutex held

  mutable gpu::SpinMutex mu_;  // spin_mutex.h: why not std::mutex
  std::unique_ptr<gpu::detail::PolicyCore> core_;  // gpu/src/api/policy_core.h
  bool validate_ = false;
};

}  // namespace cachet

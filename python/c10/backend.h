// python/c10/backend.h: the c10 backend's one class, CachetCUDAAllocator, and what its files share
// (python/README.md, "The c10 backend"). Internal to libcachet_c10.so (and c10_backend_test).
//
// CachetCUDAAllocator is a c10::cuda::CUDACachingAllocator::CUDAAllocator, the interface
// PyTorch's native allocator implements, installed through the same door: the atomic
// c10::cuda::CUDACachingAllocator::allocator and c10::SetAllocator(kCUDA) (install.cpp, before
// CUDA is initialised). Every method adapts one call of cachet's gpu/ allocator, one
// cachet::CachingAllocator per device shared with the cachet_torch_* functions (torch_common.h);
// none holds allocator logic of its own. Its methods are defined along PyTorch's own seams, one
// concept per file:
//
//   allocation.cpp     allocate / raw_alloc / raw_delete, the deleter, out of memory, emptyCache,
//                      recordStream, the memory fraction, cacheInfo, getBaseAllocation, peers
//   snapshot.cpp       getDeviceStats and its resets, snapshot() (segments and blocks)
//   history.cpp        _record_memory_history: the stacks PyTorch's context recorder gives, kept
//                      for cachet's trace (History, history.h); annotations; trace trackers
//   private_pools.cpp  MemPool and CUDA graph pools: begin/endAllocateToPool, releasePool, a
//                      pool's own allocator, use_on_oom, no_split, graph trees' checkpoints
//   ipc.cpp            torch.multiprocessing's handles (shareIpcHandle, getIpcDevPtr)
//   settings.cpp       _set_allocator_settings at run time, the snapshot's allocator_settings
//   install.cpp        the C entry points python/cachet_torch/ calls (install, version, bench)
//
// What the adapter keeps besides cachet's answers: contexts (PyTorch's CreateContextFn results
// for _record_memory_history, gathered outside every lock), out-of-memory observers (called with
// no lock of cachet's held), trace trackers (called as gpu/ makes each event, under its lock, as
// native calls them: history.cpp), the IPC handles other processes sent, and settings followed
// through PyTorch's settings hook.
//
// Device calls cachet makes inside allocate, emptyCache and releasePool follow the capture
// status of PyTorch's current stream (cachet::gpu::CurrentStream, whose provider asks PyTorch
// only when a device call is made), as native's do.
//
// Errors: out of memory is c10::OutOfMemoryError (torch.OutOfMemoryError) with PyTorch's own
// text (cachet::OutOfMemory carries it); any other refusal of cachet's (a freed pointer, a bad
// pool call, a failing device) is c10::Error (RuntimeError) with cachet's message.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include <c10/core/Allocator.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>

#include "c10/history.h"
#include "cachet/errors.h"
#include "cachet/gpu/allocator.h"
#include "cachet/trace.h"
#include "torch_common.h"

namespace cachet::c10_backend {

namespace cc = c10::cuda::CUDACachingAllocator;
namespace cda = c10::CachingDeviceAllocator;
namespace tc = cachet::torch_common;
using c10::MempoolId_t;

inline cachet::PoolId pool_id(MempoolId_t id) { return cachet::PoolId{id.first, id.second}; }

// Every cachet refusal as PyTorch's error type: out of memory -> OutOfMemoryError with PyTorch's
// text; anything else -> c10::Error (RuntimeError) with cachet's message.
template <class F>
[[gnu::always_inline]] inline auto call(const char* what, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const c10::Error&) {
    throw;
  } catch (const cachet::OutOfMemory& e) {
    TORCH_CHECK_WITH(OutOfMemoryError, false, e.what());
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "cachet: ", what, ": ", e.what());
  }
}

void raw_delete_fn(void* ptr);       // the deleter of every DataPtr cachet hands out
void uncached_delete_fn(void* ptr);  // enable(false): cudaFree, as native's uncached_delete

// PyTorch's current stream on the calling thread's device, for the device calls cachet makes
// with no CurrentStream scope set (cachet/gpu/cuda_backend.h): the stream whose capture status
// native's cudaMallocMaybeCapturing follows. Registered at install.
cachet::StreamId current_stream_for_device_calls();

// Chains cachet onto PyTorch's settings hook, once (settings.cpp). False when this libc10 has no
// such hook (then runtime settings do not reach cachet).
bool follow_allocator_settings();

class CachetCUDAAllocator final : public cc::CUDAAllocator {
 public:
  // ---- c10::Allocator (allocation.cpp) -------------------------------------------------------
  [[gnu::hot]] c10::DataPtr allocate(size_t size) override;
  c10::DeleterFnPtr raw_deleter() const override;
  void copy_data(void* dest, const void* src, std::size_t count) const final;

  // ---- c10::DeviceAllocator ------------------------------------------------------------------
  bool initialized() override { return device_count_.load() > 0; }
  void emptyCache(MempoolId_t mempool_id) override;                                 // allocation.cpp
  void recordStream(const c10::DataPtr& ptr, c10::cuda::CUDAStream stream) override;  // allocation.cpp
  cda::DeviceStats getDeviceStats(c10::DeviceIndex device) override;                 // snapshot.cpp
  void resetAccumulatedStats(c10::DeviceIndex device) override;                      // snapshot.cpp
  void resetPeakStats(c10::DeviceIndex device) override;                             // snapshot.cpp

  // ---- CUDAAllocator: the allocation path (allocation.cpp) ----------------------------------
  void* raw_alloc(size_t nbytes) override;
  void* raw_alloc_with_stream(size_t nbytes, cudaStream_t stream) override;
  void raw_delete(void* ptr) override;
  void init(int device_count) override;
  double getMemoryFraction(c10::DeviceIndex device) override;
  void setMemoryFraction(double fraction, c10::DeviceIndex device) override;
  void enable(bool value) override { enabled_.store(value); }
  bool isEnabled() const override { return enabled_.load(std::memory_order_relaxed); }
  void cacheInfo(c10::DeviceIndex device, size_t* largestBlock) override;
  void* getBaseAllocation(void* ptr, size_t* size) override;
  void recordStream(const c10::DataPtr& ptr, c10::Stream stream) override;
  void attachOutOfMemoryObserver(cc::OutOfMemoryObserver observer) override;
  void enablePeerAccess(c10::DeviceIndex dev, c10::DeviceIndex dev_to_access) override;
  cudaError_t memcpyAsync(void* dst, int dstDevice, const void* src, int srcDevice, size_t count,
                          cudaStream_t stream, bool p2p_enabled) override;
  std::string name() override { return "cachet"; }

  // ---- statistics and snapshots (snapshot.cpp) ----------------------------------------------
  std::vector<cc::StreamSegmentSize> getExpandableSegmentSizes(c10::DeviceIndex device) override;
  cc::SnapshotInfo snapshot(MempoolId_t mempool_id, bool include_traces) override;

  // ---- private pools (private_pools.cpp) ----------------------------------------------------
  void beginAllocateToPool(c10::DeviceIndex device, MempoolId_t mempool_id,
                           std::function<bool(cudaStream_t)> filter) override;
  void endAllocateToPool(c10::DeviceIndex device, MempoolId_t mempool_id) override;
  void releasePool(c10::DeviceIndex device, MempoolId_t mempool_id) override;
  int getPoolUseCount(c10::DeviceIndex device, MempoolId_t mempool_id) override;
  void createOrIncrefPool(c10::DeviceIndex device, MempoolId_t mempool_id,
                          std::shared_ptr<cc::CUDAAllocator> pool_allocator) override;
  void setUseOnOOM(c10::DeviceIndex device, MempoolId_t mempool_id, bool use_on_oom) override;
  void setNoSplit(c10::DeviceIndex device, MempoolId_t mempool_id) override;
  bool checkPoolLiveAllocations(c10::DeviceIndex device, MempoolId_t mempool_id,
                                const std::unordered_set<void*>& expected) override;
  std::shared_ptr<cc::AllocatorState> getCheckpointState(c10::DeviceIndex device, MempoolId_t id) override;
  cc::CheckpointDelta setCheckpointPoolState(c10::DeviceIndex device,
                                             std::shared_ptr<cc::AllocatorState> as) override;

  // ---- IPC (ipc.cpp) --------------------------------------------------------------------------
  cc::ShareableHandle shareIpcHandle(void* ptr) override;
  std::shared_ptr<void> getIpcDevPtr(std::string handle) override;

  // ---- history (history.cpp) ----------------------------------------------------------------
  bool isHistoryEnabled() override { return history_on_.load(); }
  void recordHistory(bool enabled, cc::CreateContextFn context_recorder, size_t alloc_trace_max_entries,
                     cc::RecordContext when, bool clearHistory,
                     const std::vector<std::string>& skip_actions) override;
  void recordAnnotation(const std::vector<std::pair<std::string, std::string>>& md) override;
  void attachAllocatorTraceTracker(cc::AllocatorTraceTracker tracker) override;
  // cachet's trace was cleared (cachet_torch_clear_trace): the contexts kept for it go too.
  void forget_history();

#ifdef CACHET_C10_TESTING
  void* malloc_for_testing(c10::DeviceIndex device, size_t size, cudaStream_t stream) {
    return malloc(device, size, stream);
  }
  // emptyCache without asking CUDA for the current stream (a host-simulated device needs none).
  void empty_cache_for_testing(MempoolId_t mempool_id) {
    for (int d = 0; d < tc::kMaxDevices; ++d)
      if (cachet::CachingAllocator* a = tc::existing_allocator(d)) empty_cache_of(d, a, pool_id(mempool_id));
  }
#endif

  // ---- used by the deleter (allocation.cpp) ---------------------------------------------------
  // The common case inline and hot (gpu/src/policy_pytorch/malloc.cpp, "The hot path's layout");
  // with history on, free_traced.
  [[gnu::hot]] void free(void* ptr);

 private:
  // ---- per-device allocators (allocation.cpp) -------------------------------------------------
  [[gnu::hot]] cachet::CachingAllocator* allocator(int device);
  // The allocator that handed out `ptr`, and its device. One allocator (the usual case, one
  // device per process): that one. Several: the device the pointer belongs to.
  [[gnu::hot]] std::pair<cachet::CachingAllocator*, int> owner(void* ptr);
  // PyTorch's current stream of `device`, as cachet names streams.
  static cachet::StreamId current_stream(int device);

  // ---- the allocation path (allocation.cpp) ---------------------------------------------------
  [[gnu::hot]] void* malloc(c10::DeviceIndex device, size_t size, cudaStream_t stream);
  [[gnu::noinline]] void* malloc_traced(cachet::CachingAllocator* a, c10::DeviceIndex device, size_t size,
                                        cudaStream_t stream);
  [[gnu::noinline]] void free_traced(cachet::CachingAllocator* a, int device, void* ptr);
  // With trace trackers attached and the history off (history.cpp, "trace trackers").
  [[gnu::noinline]] void* malloc_tracked(cachet::CachingAllocator* a, c10::DeviceIndex device, size_t size,
                                         cudaStream_t stream);
  [[gnu::noinline]] void free_tracked(cachet::CachingAllocator* a, void* ptr);
  static void give_back_on_tracker_error(cachet::CachingAllocator* a, void* p);
  [[gnu::always_inline]] inline void* allocate_on(cachet::CachingAllocator* a, c10::DeviceIndex device,
                                                  size_t size, cudaStream_t stream);
  [[noreturn, gnu::cold, gnu::noinline]] static void allocate_failed(c10::DeviceIndex device, size_t size,
                                                                    const std::exception& e);
  [[noreturn, gnu::cold, gnu::noinline]] void out_of_memory(c10::DeviceIndex device, size_t size,
                                                            const std::string& message);
  static void* uncached_alloc(size_t size);
  // emptyCache of one device's allocator, as a call of the history when it is on.
  void empty_cache_of(int device, cachet::CachingAllocator* a, cachet::PoolId id);

  // ---- history (history.cpp) --------------------------------------------------------------------
  Ctx gather(cc::RecordContext level);
  size_t max_entries();
  History& history(int device);
  // A call of cachet's made with the history on (history.h): begin_call gathers its contexts
  // outside every lock (`made_at`: the level native's caller gathers at; `freed_at`: the level
  // from which the call's frees take that context, as native's setCheckpointPoolState frees
  // through free(), which gathers at ALL) and keeps them under a fresh id, for the caller to open
  // a TraceCallScope with around the call.
  struct TracedCall {
    std::uint32_t id = 0;
    Ctx made;  // the allocation context (snapshot blocks: set_live)
  };
  TracedCall begin_call(int device, cc::RecordContext made_at, cc::RecordContext freed_at);
  // `f` (a call of cachet's on `device`) as one call of the history when it is on, its context
  // gathered at ALL as native's emptyCache and getCheckpointState gather theirs. Also for the
  // calls that record nothing under policy:pytorch but may give pages back under policy:cachet
  // (releasePool, endAllocateToPool, setMemoryFraction): those segment_unmap entries then carry
  // the caller's stack, as native's do.
  template <class F>
  decltype(auto) as_traced_call(int device, F&& f) {
    if (!history_on_.load()) return f();
    const TracedCall c = begin_call(device, cc::RecordContext::ALL, cc::RecordContext::ALL);
    cachet::TraceCallScope scope(c.id);
    return f();
  }
  // The context a live block shows in the snapshot (nullptr: none, the block is gone).
  void set_live(int device, const void* ptr, Ctx ctx);
  static std::int64_t now_us();
  // Trace on or off for every allocator (and those created later); `clear` drops what was
  // recorded and the contexts kept for it.
  void set_trace_all(bool on, bool clear);
  // cachet's trace `events` of device `d` as PyTorch's TraceEntry list, each with the context
  // native's record_trace gives it (history.h), without the skipped actions, the last max_n.
  // h.mu is held.
  static std::vector<cda::TraceEntry> trace_entries(int d, const std::vector<cachet::TraceEvent>& events,
                                                    const History& h,
                                                    const std::vector<cda::TraceEntry::Action>& skips,
                                                    size_t max_n);
  // The trace trackers (history.cpp): gpu/'s listener (torch_common State::trace_listener) hands
  // each event to them as it is made, under the allocator's lock. A tracker's exception is kept
  // for the calling thread and raised by raise_tracker_error once cachet's call is over (the
  // allocator's state is whole then); a free (a deleter, which must not throw) warns instead. A
  // call into the allocator from a tracker is refused (refuse_call_from_tracker): the lock is held;
  // a free from a tracker (a tensor it dropped) is made once the call that ran it returns
  // (defer_free_from_tracker; made by raise_tracker_error and warn_tracker_error).
  static void tell_trackers(int device, const cachet::TraceEvent& e);
  static bool defer_free_from_tracker(void* ptr);
  static void raise_tracker_error();
  static void warn_tracker_error();
  static void refuse_call_from_tracker(const char* what);

  // ---- settings (settings.cpp) ------------------------------------------------------------------
  void load_settings(cc::AllocatorConfigInfo& md);

  std::atomic<int> device_count_{0};
  // What every allocate and free reads, on one cache line (gpu/README.md "The hot path").
  std::atomic<bool> enabled_{true};
  std::atomic<bool> history_on_{false};   // under mu_ when set
  std::atomic<bool> has_trackers_{false};  // under tracker_mu_ when set

  // Lock order: mu_ before a History's mu (set_trace_all), never the reverse; cachet's own lock
  // is taken inside either, and no user callback runs under mu_ or a History's mu.
  std::mutex mu_;  // observers, history settings, annotations, histories_
  std::vector<cc::OutOfMemoryObserver> oom_observers_;
  std::atomic<int> record_context_{0};  // cc::RecordContext
  std::atomic<cc::CreateContextFn> recorder_{nullptr};
  size_t max_entries_ = 1;
  std::vector<cda::TraceEntry::Action> skip_actions_;
  std::vector<cda::AnnotationEntry> annotations_;
  std::unordered_map<int, std::unique_ptr<History>> histories_;

  std::mutex tracker_mu_;  // attaching a tracker (never held while one is called)
  // Copied on attach, read without a lock by tell_trackers (under gpu/'s lock).
  std::atomic<std::shared_ptr<const std::vector<cc::AllocatorTraceTracker>>> trackers_{
      std::make_shared<const std::vector<cc::AllocatorTraceTracker>>()};

  std::mutex ipc_mu_;
  struct IpcEntry {
    std::weak_ptr<void> wp;
  };
  std::unordered_map<std::string, IpcEntry> ipc_;
};

// The one allocator, created on first use and never destroyed (as native's); the deleter finds
// it through g_the_allocator, set before any DataPtr exists.
CachetCUDAAllocator& the_allocator();
extern std::atomic<CachetCUDAAllocator*> g_the_allocator;

}  // namespace cachet::c10_backend

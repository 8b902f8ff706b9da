// libcachet_c10.so: cachet as PyTorch's own CUDA allocator (issue 22).
//
// CachetCUDAAllocator is a c10::cuda::CUDACachingAllocator::CUDAAllocator, the interface
// PyTorch's native allocator implements, installed through the same door: the atomic
// c10::cuda::CUDACachingAllocator::allocator and c10::SetAllocator(kCUDA) (cachet_c10_install,
// before CUDA is initialised). Every method adapts one call of cachet's gpu/ allocator, one
// cachet::CachingAllocator per device shared with the cachet_torch_* functions (torch_common.h);
// none holds allocator logic of its own. What each adapter keeps besides:
//
//   contexts   PyTorch's CreateContextFn results (Python and C++ stacks) for
//              _record_memory_history: gathered outside every lock, kept by address, given back
//              unchanged in the snapshot's blocks and trace entries (History below).
//   observers  out-of-memory observers and trace trackers, called with no lock of cachet's held.
//   IPC        the handles other processes sent (getIpcDevPtr), as native caches them.
//   settings   torch.cuda.memory._set_allocator_settings, followed through PyTorch's settings
//              hook (follow_allocator_settings below).
//
// Device calls cachet makes inside allocate, emptyCache and releasePool follow the capture
// status of PyTorch's current stream (cachet::gpu::CurrentStream, whose provider asks PyTorch
// only when a device call is made), as native's do.
//
// Errors: out of memory is c10::OutOfMemoryError (torch.OutOfMemoryError) with PyTorch's own
// text (cachet::OutOfMemory carries it); any other refusal of cachet's (a freed pointer, a bad
// pool call, a failing device) is c10::Error (RuntimeError) with cachet's message.
//
// The torch version is a build-time fact (TORCH_VERSION_MAJOR/MINOR of the torch headers this
// was compiled against): cachet_c10_install refuses another minor version.
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include <c10/core/Allocator.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>
#include <torch/headeronly/version.h>

#include "c10/process_memory.h"
#include "cachet/config.h"
#include "cachet/errors.h"
#include "cachet/gpu/allocator.h"
#include "cachet/gpu/cuda_backend.h"
#include "cachet/snapshot.h"
#include "cachet/stats.h"
#include "cachet/trace.h"
#include "torch_common.h"

#if !defined(TORCH_VERSION_MAJOR) || !defined(TORCH_VERSION_MINOR)
#error "torch/headeronly/version.h did not define TORCH_VERSION_MAJOR/MINOR"
#endif
#define CACHET_C10_STR2(x) #x
#define CACHET_C10_STR(x) CACHET_C10_STR2(x)
#define CACHET_C10_TORCH_VERSION CACHET_C10_STR(TORCH_VERSION_MAJOR) "." CACHET_C10_STR(TORCH_VERSION_MINOR)

using cachet::c10_backend::with_process_memory_info;

namespace {

namespace cc = c10::cuda::CUDACachingAllocator;
namespace cda = c10::CachingDeviceAllocator;
namespace tc = cachet::torch_common;
using Ctx = std::shared_ptr<c10::GatheredContext>;
using c10::MempoolId_t;

constexpr size_t kOneExaByte = 1152921504606846976ULL;  // PyTorch's "more than 1EB" limit
constexpr char kShareableHandleVersion = 2;             // native's SHAREABLE_HANDLE_VERSION (torch <= 2.12)
constexpr char kShareableCudaMalloc = 'c';              // native's SHAREABLE_CUDA_MALLOC
constexpr char kShareableExpandable = 'e';              // native's SHAREABLE_CUDA_EXPANDABLE_SEGMENT

cachet::PoolId pool_id(MempoolId_t id) { return cachet::PoolId{id.first, id.second}; }

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

// ---- History: contexts for _record_memory_history ------------------------------------------
//
// cachet's trace (gpu/) records the events; PyTorch's context recorder gives each one its stack.
// Contexts are gathered before cachet is called (outside its lock) and kept here by address, in
// the order the calls were made: the k-th "alloc" event of address A in cachet's trace gets the
// k-th context recorded for an allocation at A (the same for "free_requested"/"free_completed"
// and frees, and for "oom" events). An entry is kept for every call made while the history is
// on, with or without a context, so the counts stay aligned (the trace and these entries are
// cleared together); the oldest are dropped beyond the history's max_entries (their count is
// kept). A segment event takes the context of the
// allocation it served (the next "alloc" or "oom" in the trace), as PyTorch records it.
struct CtxLog {
  std::uint64_t dropped = 0;
  std::deque<Ctx> q;
};

struct History {
  std::mutex mu;
  std::unordered_map<std::uint64_t, Ctx> live;  // context of each live allocation
  std::unordered_map<std::uint64_t, CtxLog> allocs, frees;
  CtxLog ooms;
  std::deque<std::pair<std::uint64_t, int>> order;  // (address, 0 alloc / 1 free / 2 oom)

  void clear() {
    live.clear();
    allocs.clear();
    frees.clear();
    ooms = {};
    order.clear();
  }
  void push(int kind, std::uint64_t addr, Ctx ctx, size_t max_entries) {
    CtxLog& log = kind == 0 ? allocs[addr] : kind == 1 ? frees[addr] : ooms;
    log.q.push_back(std::move(ctx));
    order.emplace_back(addr, kind);
    while (order.size() > std::max<size_t>(max_entries, 1)) {
      auto [a, k] = order.front();
      order.pop_front();
      CtxLog& old = k == 0 ? allocs[a] : k == 1 ? frees[a] : ooms;
      if (!old.q.empty()) {
        old.q.pop_front();
        ++old.dropped;
      }
    }
  }
  static Ctx nth(const CtxLog* log, std::uint64_t k) {
    if (!log || k < log->dropped) return nullptr;
    k -= log->dropped;
    return k < log->q.size() ? log->q[k] : nullptr;
  }
};

cda::TraceEntry::Action to_action(cachet::TraceAction a) {
  using A = cda::TraceEntry::Action;
  switch (a) {
    case cachet::TraceAction::Alloc: return A::ALLOC;
    case cachet::TraceAction::FreeRequested: return A::FREE_REQUESTED;
    case cachet::TraceAction::FreeCompleted: return A::FREE_COMPLETED;
    case cachet::TraceAction::SegmentAlloc: return A::SEGMENT_ALLOC;
    case cachet::TraceAction::SegmentFree: return A::SEGMENT_FREE;
    case cachet::TraceAction::SegmentMap: return A::SEGMENT_MAP;
    case cachet::TraceAction::SegmentUnmap: return A::SEGMENT_UNMAP;
    case cachet::TraceAction::Snapshot: return A::SNAPSHOT;
    case cachet::TraceAction::Oom: return A::OOM;
  }
  return A::SNAPSHOT;
}

void copy_stat(c10::CachingAllocator::Stat& to, const cachet::Stat& from) {
  to.current = from.current;
  to.peak = from.peak;
  to.allocated = from.allocated;
  to.freed = from.freed;
}

void copy_array(c10::CachingAllocator::StatArray& to, const cachet::StatArray& from) {
  for (size_t i = 0; i < to.size() && i < from.size(); ++i) copy_stat(to[i], from[i]);
}

// cachet's 122 stats as c10's DeviceStats (the same record, field for field).
cda::DeviceStats to_c10(const cachet::DeviceStats& s) {
  cda::DeviceStats d;
  copy_array(d.allocation, s.allocation);
  copy_array(d.segment, s.segment);
  copy_array(d.active, s.active);
  copy_array(d.inactive_split, s.inactive_split);
  copy_array(d.allocated_bytes, s.allocated_bytes);
  copy_array(d.reserved_bytes, s.reserved_bytes);
  copy_array(d.active_bytes, s.active_bytes);
  copy_array(d.inactive_split_bytes, s.inactive_split_bytes);
  copy_array(d.requested_bytes, s.requested_bytes);
  d.num_alloc_retries = s.num_alloc_retries;
  d.num_ooms = s.num_ooms;
  copy_stat(d.oversize_allocations, s.oversize_allocations);
  copy_stat(d.oversize_segments, s.oversize_segments);
  d.num_sync_all_streams = s.num_sync_all_streams;
  d.num_device_alloc = s.num_device_alloc;
  d.num_device_free = s.num_device_free;
  d.max_split_size = s.max_split_size;
  return d;
}

// A private pool's checkpoint, as PyTorch's graph trees hold it (AllocatorState).
struct PoolState final : cc::AllocatorState {
  c10::DeviceIndex device = 0;
  std::shared_ptr<const cachet::PoolCheckpoint> checkpoint;
};

// torch.cuda.MemPool(allocator=...): the pool's segments come from that allocator
// (raw_alloc_with_stream on the allocation's device and stream, raw_delete; native calls
// raw_alloc, the same on the current stream). Its nullptr is out of memory for cachet; its
// exceptions pass through.
class AllocatorSource final : public cachet::gpu::SegmentSource {
 public:
  explicit AllocatorSource(std::shared_ptr<cc::CUDAAllocator> a) : a_(std::move(a)) {}
  void* allocate(cachet::Bytes size, cachet::DeviceIndex device, cachet::StreamId stream) override {
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
    return a_->raw_alloc_with_stream(size, reinterpret_cast<cudaStream_t>(stream));
  }
  void release(void* ptr, cachet::Bytes, cachet::DeviceIndex device, cachet::StreamId) override {
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
    a_->raw_delete(ptr);
  }

 private:
  std::shared_ptr<cc::CUDAAllocator> a_;
};

// The segment size an out-of-memory message says was asked of the device ("Tried to allocate
// X."), read back where its text is exact: segment sizes are whole MiB, so "N.00 MiB" (up to
// 1 GiB) gives the size exactly; "x.xx GiB" does not (nullopt: the caller then reports the
// requested size).
std::optional<size_t> segment_size_from_message(const std::string& m) {
  static const std::string kStart = "CUDA out of memory. Tried to allocate ";
  if (m.rfind(kStart, 0) != 0) return std::nullopt;
  const size_t end = m.find(". ", kStart.size());
  const std::string text = m.substr(kStart.size(), end == std::string::npos ? std::string::npos : end - kStart.size());
  unsigned long long whole = 0;
  unsigned cents = 0;
  char unit[8] = {};
  if (std::sscanf(text.c_str(), "%llu.%2u %7s", &whole, &cents, unit) != 3) return std::nullopt;
  const std::string u = unit;
  if (u == "MiB" && cents == 0) return static_cast<size_t>(whole) << 20;
  return std::nullopt;
}

// The calling thread's CUDA device, as c10::cuda::GetDevice gives it. cudaGetDevice costs about
// 50 ns on an H100 with CUDA 13 (bench/RESULTS.md, "The c10 backend"), a third of an allocation
// pair, and every entry point asks it. The driver's current context names the same device and is
// read in a few ns (cuCtxGetCurrent), so each thread keeps the device of the last context it saw:
// a context belongs to one device for its whole life, and when the thread's context changes
// (cudaSetDevice, torch.cuda.device, cuCtxSetCurrent) the pointer differs and cudaGetDevice is
// asked again. Without a current context (a thread that never used CUDA) or without the driver
// entry point, cudaGetDevice is asked every time, as native does.
using CtxGetCurrentFn = int (*)(void**);  // CUresult cuCtxGetCurrent(CUcontext*)

CtxGetCurrentFn ctx_get_current() {
  static const CtxGetCurrentFn f = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuCtxGetCurrent", &fn, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess) {
      (void)cudaGetLastError();
      return static_cast<CtxGetCurrentFn>(nullptr);
    }
    return reinterpret_cast<CtxGetCurrentFn>(fn);
  }();
  return f;
}

[[gnu::hot]] c10::DeviceIndex current_device() {
  // A process that sees one device (CUDA_VISIBLE_DEVICES=N, a one-GPU machine) is always on
  // device 0: nothing to ask. c10 counts the devices once per process.
  static const bool single = [] {
    try {
      return c10::cuda::device_count() == 1;
    } catch (...) {
      return false;
    }
  }();
  if (single) return 0;
  struct Seen {
    void* ctx = nullptr;
    c10::DeviceIndex device = 0;
  };
  static thread_local Seen seen;
  void* ctx = nullptr;
  const CtxGetCurrentFn get = ctx_get_current();
  if (get != nullptr && get(&ctx) == 0 && ctx != nullptr) {
    Seen& s = seen;
    if (ctx == s.ctx) return s.device;
    c10::DeviceIndex device = 0;
    C10_CUDA_CHECK(c10::cuda::GetDevice(&device));
    s = Seen{ctx, device};
    return device;
  }
  c10::DeviceIndex device = 0;
  C10_CUDA_CHECK(c10::cuda::GetDevice(&device));
  return device;
}

// PyTorch's current stream on the calling thread's device, for the device calls cachet makes
// with no CurrentStream scope set (cachet/gpu/cuda_backend.h): the stream whose capture status
// native's cudaMallocMaybeCapturing follows.
cachet::StreamId current_stream_for_device_calls() {
  return reinterpret_cast<cachet::StreamId>(c10::cuda::getCurrentCUDAStream(current_device()).stream());
}

void raw_delete_fn(void* ptr);      // the deleter of every DataPtr cachet hands out
void uncached_delete_fn(void* ptr);  // enable(false): cudaFree, as native's uncached_delete

class CachetCUDAAllocator final : public cc::CUDAAllocator {
 public:
  // ---- c10::Allocator ----------------------------------------------------------------------

  [[gnu::hot]] c10::DataPtr allocate(size_t size) override {
    TORCH_CHECK_WITH(OutOfMemoryError, size < kOneExaByte,
                     "CUDA out of memory. Tried to allocate more than 1EB memory.");
    const c10::DeviceIndex device = current_device();
    if (!isEnabled()) {
      void* p = uncached_alloc(size);
      return {p, p, &uncached_delete_fn, c10::Device(c10::DeviceType::CUDA, device)};
    }
    void* p = nullptr;
    if (size != 0) p = malloc(device, size, c10::cuda::getCurrentCUDAStream(device).stream());
    return {p, p, &raw_delete_fn, c10::Device(c10::DeviceType::CUDA, device)};
  }

  c10::DeleterFnPtr raw_deleter() const override {
    return isEnabled() ? &raw_delete_fn : &uncached_delete_fn;
  }

  void copy_data(void* dest, const void* src, std::size_t count) const final {
    C10_CUDA_CHECK(cudaMemcpy(dest, src, count, cudaMemcpyDeviceToDevice));
  }

  // ---- c10::DeviceAllocator ----------------------------------------------------------------

  bool initialized() override { return device_count_.load() > 0; }

  void emptyCache(MempoolId_t mempool_id) override {
    const cachet::PoolId id = pool_id(mempool_id);
    for (int d = 0; d < tc::kMaxDevices; ++d) {
      cachet::CachingAllocator* a = tc::existing_allocator(d);
      if (!a) continue;
      cachet::gpu::CurrentStream cs(current_stream(d));
      call("emptyCache", [&] { id.is_default() ? a->empty_cache() : a->empty_cache(id); });
      dispatch_trackers(d);
    }
  }

  void recordStream(const c10::DataPtr& ptr, c10::cuda::CUDAStream stream) override {
    // Native skips an empty tensor's null pointer and memory it did not allocate (received from
    // another process, behind another deleter).
    if (!ptr.get() || ptr.get_deleter() != &raw_delete_fn) return;
    auto [a, device] = owner(ptr.get());
    (void)device;
    call("recordStream", [&] { a->record_stream(ptr.get(), reinterpret_cast<cachet::StreamId>(stream.stream())); });
  }

  cda::DeviceStats getDeviceStats(c10::DeviceIndex device) override {
    return to_c10(call("getDeviceStats", [&] { return allocator(device)->stats(); }));
  }
  void resetAccumulatedStats(c10::DeviceIndex device) override {
    call("resetAccumulatedStats", [&] { allocator(device)->reset_accumulated_stats(); });
  }
  void resetPeakStats(c10::DeviceIndex device) override {
    call("resetPeakStats", [&] { allocator(device)->reset_peak_stats(); });
  }

  // ---- CUDAAllocator -----------------------------------------------------------------------

  void* raw_alloc(size_t nbytes) override {
    if (nbytes == 0) return nullptr;
    const c10::DeviceIndex device = current_device();
    if (!isEnabled()) return uncached_alloc(nbytes);
    return malloc(device, nbytes, c10::cuda::getCurrentCUDAStream(device).stream());
  }

  void* raw_alloc_with_stream(size_t nbytes, cudaStream_t stream) override {
    if (nbytes == 0) return nullptr;
    const c10::DeviceIndex device = current_device();
    if (!isEnabled()) return uncached_alloc(nbytes);
    return malloc(device, nbytes, stream);
  }

  void raw_delete(void* ptr) override {
    if (!isEnabled()) {
      uncached_delete_fn(ptr);
      return;
    }
    free(ptr);
  }

  // Native creates its per-device allocators here; cachet creates each on first use (a device
  // this process never touches costs nothing), so init only records the count.
  void init(int device_count) override {
    int cur = device_count_.load();
    while (cur < device_count && !device_count_.compare_exchange_weak(cur, device_count)) {
    }
  }

  double getMemoryFraction(c10::DeviceIndex device) override {
    return call("getMemoryFraction", [&] { return allocator(device)->memory_fraction(); });
  }
  void setMemoryFraction(double fraction, c10::DeviceIndex device) override {
    call("setMemoryFraction", [&] { allocator(device)->set_memory_fraction(fraction); });
  }

  // The expandable segments of `device`, as native lists them (stream, small pool, mapped size).
  // From cachet's snapshot (gpu/ has no call of its own for it; rarely asked).
  std::vector<cc::StreamSegmentSize> getExpandableSegmentSizes(c10::DeviceIndex device) override {
    std::vector<cc::StreamSegmentSize> out;
    const cachet::Snapshot snap = call("getExpandableSegmentSizes", [&] { return allocator(device)->snapshot(); });
    for (const auto& seg : snap)
      if (seg.is_expandable)
        out.emplace_back(reinterpret_cast<cudaStream_t>(seg.stream), !seg.is_large, seg.total_size);
    return out;
  }

  void enable(bool value) override { enabled_.store(value); }
  bool isEnabled() const override { return enabled_.load(std::memory_order_relaxed); }

  // cuDNN's benchmark asks how much it may try: with *largestBlock 0 (as cuDNN calls it) the
  // device's free memory or the largest cached free block, whichever is larger; otherwise the
  // larger of *largestBlock and the largest cached free block.
  void cacheInfo(c10::DeviceIndex device, size_t* largestBlock) override {
    cachet::CachingAllocator* a = allocator(device);
    if (*largestBlock == 0) {
      *largestBlock = call("cacheInfo", [&] { return a->largest_free_block(); });
    } else {
      *largestBlock = std::max<size_t>(*largestBlock, call("cacheInfo", [&] { return a->largest_cached_block(); }));
    }
  }

  // The segment that holds `ptr`: its base address and size (refused for expandable segments,
  // as native refuses them).
  void* getBaseAllocation(void* ptr, size_t* size) override {
    auto [a, device] = owner(ptr);
    (void)device;
    cachet::Bytes sz = 0;
    void* base = call("getBaseAllocation", [&] { return a->base_allocation(ptr, &sz); });
    if (size) *size = sz;
    return base;
  }

  void recordStream(const c10::DataPtr& ptr, c10::Stream stream) override {
    recordStream(ptr, c10::cuda::CUDAStream(stream));
  }

  cc::SnapshotInfo snapshot(MempoolId_t mempool_id, bool include_traces) override {
    cc::SnapshotInfo result;
    const int n = std::max(device_count_.load(), tc::device_count_hint());
    const cachet::PoolId only = pool_id(mempool_id);
    std::vector<cda::TraceEntry::Action> skips;
    size_t max_n = 1;
    {
      std::lock_guard<std::mutex> lock(mu_);  // never under a History's mu (lock order)
      skips = skip_actions_;
      max_n = max_entries_;
    }
    for (int d = 0; d < n; ++d) {
      cachet::CachingAllocator* a = tc::existing_allocator(d);
      if (!a) {
        if (include_traces) result.device_traces.emplace_back();
        continue;
      }
      const cachet::Snapshot snap = call("snapshot", [&] { return a->snapshot(); });
      History& h = history(d);
      std::lock_guard<std::mutex> lock(h.mu);
      for (const auto& seg : snap) {
        if (!only.is_default() && seg.pool_id != only) continue;
        cda::SegmentInfo si;
        si.device = static_cast<c10::DeviceIndex>(d);
        si.address = seg.address;
        si.total_size = seg.total_size;
        si.requested_size = seg.requested_size();
        si.allocated_size = seg.allocated_size();
        si.active_size = seg.active_size();
        si.stream = reinterpret_cast<void*>(seg.stream);
        si.is_large = seg.is_large;
        si.is_expandable = seg.is_expandable;
        si.owner_private_pool_id = {seg.pool_id.first, seg.pool_id.second};
        for (const auto& b : seg.blocks) {
          cda::BlockInfo bi;
          bi.size = b.size;
          bi.requested_size = b.requested_size;
          bi.allocated = b.state == cachet::BlockState::ActiveAllocated;
          bi.active = b.state != cachet::BlockState::Inactive;
          if (bi.active) {
            auto it = h.live.find(b.address);
            if (it != h.live.end()) bi.context_when_allocated = it->second;
          }
          si.blocks.push_back(std::move(bi));
        }
        result.segments.push_back(std::move(si));
      }
      if (include_traces) result.device_traces.push_back(trace_entries(d, *a, h, skips, max_n));
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      result.external_annotations = annotations_;
    }
    load_settings(result.config_metadata);
    return result;
  }

  void beginAllocateToPool(c10::DeviceIndex device, MempoolId_t mempool_id,
                           std::function<bool(cudaStream_t)> filter) override {
    cachet::CachingAllocator* a = allocator(device);
    // PyTorch calls this before a capture begins (CUDAGraph::capture_begin) as for use_mem_pool:
    // nothing tells the two apart here, so capture = false, as for the plug-in (allocator.h).
    call("beginAllocateToPool", [&] {
      a->begin_allocate_to_pool(
          pool_id(mempool_id),
          [f = std::move(filter)](cachet::StreamId s) {
            return f(reinterpret_cast<cudaStream_t>(static_cast<std::uintptr_t>(s)));
          },
          false);
    });
  }
  void endAllocateToPool(c10::DeviceIndex device, MempoolId_t mempool_id) override {
    call("endAllocateToPool", [&] { allocator(device)->end_allocate_to_pool(pool_id(mempool_id)); });
  }
  void releasePool(c10::DeviceIndex device, MempoolId_t mempool_id) override {
    cachet::CachingAllocator* a = allocator(device);
    cachet::gpu::CurrentStream cs(current_stream(device));
    call("releasePool", [&] { a->release_pool(pool_id(mempool_id)); });
    dispatch_trackers(device);
  }
  int getPoolUseCount(c10::DeviceIndex device, MempoolId_t mempool_id) override {
    return call("getPoolUseCount", [&] { return allocator(device)->pool_use_count(pool_id(mempool_id)); });
  }
  void createOrIncrefPool(c10::DeviceIndex device, MempoolId_t mempool_id,
                          std::shared_ptr<cc::CUDAAllocator> pool_allocator) override {
    cachet::CachingAllocator* a = allocator(device);
    // A MemPool with its own allocator: the pool's segments come from it (raw_alloc / raw_delete,
    // as native calls it) instead of cudaMalloc.
    std::shared_ptr<cachet::gpu::SegmentSource> source;
    if (pool_allocator) source = std::make_shared<AllocatorSource>(std::move(pool_allocator));
    call("createOrIncrefPool", [&] { a->create_or_incref_pool(pool_id(mempool_id), std::move(source)); });
  }
  void setUseOnOOM(c10::DeviceIndex device, MempoolId_t mempool_id, bool use_on_oom) override {
    cachet::CachingAllocator* a = allocator(device);
    // Turning it off is what every MemPool's destructor does (ATen's ~MemPool): native never
    // refuses that (it erases the id from a set), and a destructor must not throw.
    if (!use_on_oom) {
      try {
        a->set_use_on_oom(pool_id(mempool_id), false);
      } catch (const cachet::UsageError&) {  // an unknown pool: nothing was on
      }
      return;
    }
    call("setUseOnOOM", [&] { a->set_use_on_oom(pool_id(mempool_id), true); });
  }
  void setNoSplit(c10::DeviceIndex device, MempoolId_t mempool_id) override {
    cachet::CachingAllocator* a = allocator(device);
    call("setNoSplit", [&] { a->set_no_split(pool_id(mempool_id)); });
  }

  // Graph trees: the pool's allocated blocks are exactly `expected` (native's
  // checkPoolLiveAllocations: the count matches and each is expected).
  bool checkPoolLiveAllocations(c10::DeviceIndex device, MempoolId_t mempool_id,
                                const std::unordered_set<void*>& expected) override {
    const cachet::PoolId id = pool_id(mempool_id);
    cachet::CachingAllocator* a = allocator(device);
    const std::vector<void*> want(expected.begin(), expected.end());
    return call("checkPoolLiveAllocations", [&] { return a->pool_live_allocations_are(id, want); });
  }

  // torch.multiprocessing: native's handle format (version byte, 'c', the cudaIpcMemHandle_t of
  // the segment's base), offset = ptr - base.
  cc::ShareableHandle shareIpcHandle(void* ptr) override {
    auto [a, device] = owner(ptr);
    (void)a;
    size_t base_size = 0;
    void* base = getBaseAllocation(ptr, &base_size);
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
    cudaIpcMemHandle_t handle;
    C10_CUDA_CHECK(cudaIpcGetMemHandle(&handle, base));
    std::string s;
    s.push_back(kShareableHandleVersion);
    s.push_back(kShareableCudaMalloc);
    s.append(reinterpret_cast<const char*>(&handle), CUDA_IPC_HANDLE_SIZE);
    return cc::ShareableHandle{static_cast<char*>(ptr) - static_cast<char*>(base), std::move(s)};
  }

  // The receiving side: opens a handle once per process and keeps it open while any storage
  // uses it (native's ipcMemHandle_to_devptr).
  std::shared_ptr<void> getIpcDevPtr(std::string handle) override {
    std::lock_guard<std::mutex> lock(ipc_mu_);
    auto it = ipc_.find(handle);
    if (it != ipc_.end()) {
      if (auto sp = it->second.wp.lock()) return sp;
    }
    int type = kShareableCudaMalloc;
    size_t at = 0;
    if (handle.size() != CUDA_IPC_HANDLE_SIZE) {  // else: a raw handle from an old torch
      TORCH_CHECK(handle.size() >= 2, "cachet: ill-formed shareable handle (", handle.size(), " bytes)");
      TORCH_CHECK(handle[0] <= kShareableHandleVersion,
                  "received sharable handle from a future version of torch that this version does not know how to handle");
      type = handle[1];
      at = 2;
    }
    TORCH_CHECK(type != kShareableExpandable,
                "cachet: this tensor was allocated in an expandable segment by the sending process; cachet cannot "
                "import expandable segments: send it from a process with expandable_segments:False");
    TORCH_CHECK(type == kShareableCudaMalloc && handle.size() >= at + CUDA_IPC_HANDLE_SIZE,
                "unexpected or illformed shareable handle type");
    cudaIpcMemHandle_t h;
    std::memcpy(&h, handle.data() + at, CUDA_IPC_HANDLE_SIZE);
    c10::DeviceIndex device = 0;
    C10_CUDA_CHECK(c10::cuda::GetDevice(&device));
    void* p = nullptr;
    C10_CUDA_CHECK(cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess));
    std::shared_ptr<void> sp(p, [this, handle, device](void* q) {
      {
        std::lock_guard<std::mutex> l(ipc_mu_);
        auto e = ipc_.find(handle);
        if (e != ipc_.end() && e->second.wp.expired()) ipc_.erase(e);  // not a newer opening's
      }
      c10::cuda::CUDAGuard g(device);
      C10_CUDA_CHECK(cudaIpcCloseMemHandle(q));
    });
    ipc_[handle].wp = sp;
    return sp;
  }

  bool isHistoryEnabled() override { return history_on_.load(); }

  void recordHistory(bool enabled, cc::CreateContextFn context_recorder, size_t alloc_trace_max_entries,
                     cc::RecordContext when, bool clearHistory,
                     const std::vector<std::string>& skip_actions) override {
    TORCH_CHECK(when == cc::RecordContext::NEVER || context_recorder);
    std::vector<cda::TraceEntry::Action> skips;
    for (const auto& s : skip_actions) skips.push_back(cda::parseTraceEntryAction(s));
    // Turning it on starts from an empty trace, as native's (turning it off cleared its buffer):
    // what cachet's trace holds then was recorded for trace trackers or the cachet_torch_* API,
    // without the contexts History aligns with it.
    const bool was_on = history_on_.load();
    {
      std::lock_guard<std::mutex> lock(mu_);
      max_entries_ = std::max<size_t>(alloc_trace_max_entries, 1);
      skip_actions_ = std::move(skips);
      recorder_.store(enabled ? context_recorder : nullptr);
      record_context_.store(enabled ? static_cast<int>(when) : 0);
      history_on_.store(enabled);
      if (!enabled || clearHistory) annotations_.clear();
    }
    const bool clear = !enabled || clearHistory || !was_on;
    set_trace_all(enabled || has_trackers_.load(), clear);
  }

  void recordAnnotation(const std::vector<std::pair<std::string, std::string>>& md) override {
    if (!history_on_.load()) return;
    c10::DeviceIndex device = 0;
    C10_CUDA_CHECK(c10::cuda::GetDevice(&device));
    cda::AnnotationEntry ae(device, 0);
    ae.time_.t_ = static_cast<time_t>(now_us());
    for (const auto& [k, v] : md) ae.recordUserMetadata(k, v);
    std::lock_guard<std::mutex> lock(mu_);
    annotations_.push_back(std::move(ae));
    if (annotations_.size() > max_entries_) annotations_.erase(annotations_.begin());
  }

  void attachOutOfMemoryObserver(cc::OutOfMemoryObserver observer) override {
    std::lock_guard<std::mutex> lock(mu_);
    oom_observers_.push_back(std::move(observer));
  }

  // Trackers see each trace entry (segment allocations and frees for NCCL's registration hooks,
  // ...). cachet records them in its trace; they are handed to the trackers after each call that
  // can make them, with no lock of cachet's held (PyTorch calls them under its lock).
  void attachAllocatorTraceTracker(cc::AllocatorTraceTracker tracker) override {
    {
      std::lock_guard<std::mutex> lock(tracker_mu_);
      trackers_.push_back(std::move(tracker));
      has_trackers_.store(true);
    }
    set_trace_all(true, false);
  }

  void enablePeerAccess(c10::DeviceIndex dev, c10::DeviceIndex dev_to_access) override {
    c10::cuda::CUDAGuard device_guard(dev);
    cudaError_t err = cudaDeviceEnablePeerAccess(dev_to_access, 0);
    if (err == cudaErrorPeerAccessAlreadyEnabled) {
      (void)cudaGetLastError();  // already enabled: clear the error, as native does
    } else {
      C10_CUDA_CHECK(err);
    }
    // Native also maps its expandable segments of dev_to_access for dev; cachet's VMM backend
    // maps for its own device only (see memcpyAsync).
  }

  // Native uses cudaMemcpyAsync unless P2P is off between two devices one of which has memory
  // from cuMemMap (expandable segments), which needs cudaMemcpyPeerAsync. cachet decides by the
  // devices' configuration (expandable_segments), which covers every such segment.
  cudaError_t memcpyAsync(void* dst, int dstDevice, const void* src, int srcDevice, size_t count,
                          cudaStream_t stream, bool p2p_enabled) override {
    auto expandable = [](int d) {
      cachet::CachingAllocator* a = tc::existing_allocator(d);
      return a && a->config().expandable_segments;
    };
    if (p2p_enabled || srcDevice == dstDevice || (!expandable(dstDevice) && !expandable(srcDevice)))
      return cudaMemcpyAsync(dst, src, count, cudaMemcpyDeviceToDevice, stream);
    return cudaMemcpyPeerAsync(dst, dstDevice, src, srcDevice, count, stream);
  }

  // Graph trees (torch.compile mode="reduce-overhead"): a private pool's state, and its
  // restoration; the restored allocations come back as DataPtrs with cachet's deleter.
  std::shared_ptr<cc::AllocatorState> getCheckpointState(c10::DeviceIndex device, MempoolId_t id) override {
    cachet::CachingAllocator* a = allocator(device);
    auto st = std::make_shared<PoolState>();
    st->device = device;
    st->checkpoint = call("getCheckpointState", [&] { return a->checkpoint_pool(pool_id(id)); });
    return st;
  }
  cc::CheckpointDelta setCheckpointPoolState(c10::DeviceIndex device,
                                             std::shared_ptr<cc::AllocatorState> as) override {
    cachet::CachingAllocator* a = allocator(device);
    auto st = std::dynamic_pointer_cast<PoolState>(as);
    TORCH_CHECK(st && st->checkpoint, "Expected PrivatePoolState");
    const cachet::CheckpointDelta d =
        call("setCheckpointPoolState", [&] { return a->restore_pool(*st->checkpoint, {}); });
    cc::CheckpointDelta out;
    out.ptrs_freed = d.freed;
    for (const auto& [ptr, size] : d.allocated) {
      (void)size;
      out.dataptrs_allocd.emplace_back(ptr, ptr, &raw_delete_fn, c10::Device(c10::DeviceType::CUDA, device));
    }
    if (history_on_.load()) {  // the freed allocations' stacks go; the restored ones have none
      History& h = history(device);
      std::lock_guard<std::mutex> lock(h.mu);
      for (void* p : d.freed) h.live.erase(reinterpret_cast<std::uint64_t>(p));
    }
    return out;
  }

  std::string name() override { return "cachet"; }

  // cachet's trace was cleared (cachet_torch_clear_trace): the contexts kept for it go too.
  void forget_history() {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [d, h] : histories_) {
      std::lock_guard<std::mutex> hl(h->mu);
      h->clear();
    }
  }

#ifdef CACHET_C10_TESTING
  void* malloc_for_testing(c10::DeviceIndex device, size_t size, cudaStream_t stream) {
    return malloc(device, size, stream);
  }
#endif

  // ---- used by the deleter -------------------------------------------------------------------

  // The common case inline and hot (gpu/src/policy_pytorch/malloc.cpp, "The hot path's layout");
  // with history on, free_traced.
  [[gnu::hot]] void free(void* ptr) {
    if (!ptr) return;
    auto [a, device] = owner(ptr);
    if (history_on_.load(std::memory_order_relaxed)) [[unlikely]] {
      free_traced(a, device, ptr);
      return;
    }
    call("free", [&] { a->free(ptr); });
    if (has_trackers_.load(std::memory_order_relaxed)) [[unlikely]] dispatch_trackers(device);
  }

  [[gnu::noinline]] void free_traced(cachet::CachingAllocator* a, int device, void* ptr) {
    Ctx ctx = gather(cc::RecordContext::ALL);  // outside every lock
    call("free", [&] { a->free(ptr); });
    {
      const size_t max_n = max_entries();  // lock order: mu_ is never taken under a History's mu
      History& h = history(device);
      std::lock_guard<std::mutex> lock(h.mu);
      const auto addr = reinterpret_cast<std::uint64_t>(ptr);
      h.live.erase(addr);
      h.push(1, addr, std::move(ctx), max_n);
    }
    if (has_trackers_.load(std::memory_order_relaxed)) dispatch_trackers(device);
  }

 private:
  // ---- per-device allocators -----------------------------------------------------------------

  [[gnu::hot]] cachet::CachingAllocator* allocator(int device) {
    if (const tc::SoleAllocator s = tc::sole_allocator(); s.allocator != nullptr && s.device == device) [[likely]]
      return s.allocator;
    if (cachet::CachingAllocator* a = tc::existing_allocator(device)) return a;
    cachet::CachingAllocator* a = tc::allocator_for(device, false);
    TORCH_CHECK(a, "cachet: ", tc::last_error_copy());
    return a;
  }

  // The allocator that handed out `ptr`, and its device. One allocator (the usual case, one
  // device per process): that one. Several: the device the pointer belongs to.
  [[gnu::hot]] std::pair<cachet::CachingAllocator*, int> owner(void* ptr) {
    if (const tc::SoleAllocator s = tc::sole_allocator(); s.allocator != nullptr) [[likely]]
      return {s.allocator, s.device};
    cudaPointerAttributes attr{};
    if (cudaPointerGetAttributes(&attr, ptr) == cudaSuccess && attr.type == cudaMemoryTypeDevice) {
      if (auto* a = tc::existing_allocator(attr.device)) return {a, attr.device};
    }
    (void)cudaGetLastError();
    TORCH_CHECK(false, "invalid device pointer: ", ptr);
  }

  // PyTorch's current stream of `device`, as cachet names streams.
  static cachet::StreamId current_stream(int device) {
    return reinterpret_cast<cachet::StreamId>(
        c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device)).stream());
  }

  [[gnu::hot]] void* malloc(c10::DeviceIndex device, size_t size, cudaStream_t stream) {
    cachet::CachingAllocator* a = allocator(device);
    if (history_on_.load(std::memory_order_relaxed)) [[unlikely]]
      return malloc_traced(a, device, size, stream);
    void* p = allocate_on(a, device, size, stream, Ctx{}, false);
    if (has_trackers_.load(std::memory_order_relaxed)) [[unlikely]] dispatch_trackers(device);
    return p;
  }

  // malloc with history on: the context is gathered outside every lock, and the allocation (or
  // the out-of-memory) goes into the device's history.
  [[gnu::noinline]] void* malloc_traced(cachet::CachingAllocator* a, c10::DeviceIndex device, size_t size,
                                        cudaStream_t stream) {
    Ctx ctx = gather(cc::RecordContext::STATE);
    void* p = allocate_on(a, device, size, stream, ctx, true);
    {
      const size_t max_n = max_entries();
      History& h = history(device);
      std::lock_guard<std::mutex> lock(h.mu);
      const auto addr = reinterpret_cast<std::uint64_t>(p);
      h.live[addr] = ctx;
      h.push(0, addr, record_context_.load() >= static_cast<int>(cc::RecordContext::ALLOC) ? std::move(ctx) : nullptr,
             max_n);
    }
    if (has_trackers_.load(std::memory_order_relaxed)) dispatch_trackers(device);
    return p;
  }

  // `a`'s allocate, its refusals as PyTorch's errors (out of memory: out_of_memory, with `ctx` in
  // the history when tracing). Device calls follow the capture status of PyTorch's current stream,
  // asked only when one is made (current_stream_for_device_calls, registered at install), as
  // native's cudaMallocMaybeCapturing asks it.
  [[gnu::always_inline]] void* allocate_on(cachet::CachingAllocator* a, c10::DeviceIndex device, size_t size,
                                           cudaStream_t stream, const Ctx& ctx, bool tracing) {
    try {
      return a->allocate(size, reinterpret_cast<cachet::StreamId>(stream));
    } catch (const cachet::OutOfMemory& e) {
      out_of_memory(device, size, ctx, tracing, e.what());
    } catch (const std::exception& e) {
      allocate_failed(device, size, e);
    }
  }

  [[noreturn, gnu::cold, gnu::noinline]] static void allocate_failed(c10::DeviceIndex device, size_t size,
                                                                    const std::exception& e) {
    TORCH_CHECK(false, "cachet: allocate ", size, " bytes on device ", static_cast<int>(device), ": ", e.what());
  }

  // cachet refused: its message is PyTorch's, word for word. Observers are called with no lock
  // held, as native calls them after unlocking: (device, the segment size asked of the device,
  // the memory allowed (the cap set by a fraction, else the device's total), the device's free
  // memory).
  [[noreturn, gnu::cold, gnu::noinline]] void out_of_memory(c10::DeviceIndex device, size_t size, Ctx ctx, bool tracing,
                                  const std::string& message) {
    if (tracing) {
      const size_t max_n = max_entries();
      History& h = history(device);
      std::lock_guard<std::mutex> lock(h.mu);
      h.push(2, 0, record_context_.load() >= static_cast<int>(cc::RecordContext::ALLOC) ? std::move(ctx) : nullptr,
             max_n);
    }
    if (has_trackers_.load()) dispatch_trackers(device);
    std::vector<cc::OutOfMemoryObserver> observers;
    {
      std::lock_guard<std::mutex> lock(mu_);
      observers = oom_observers_;
    }
    if (!observers.empty()) {
      // The observers' figures never replace the out-of-memory error: what cannot be read is 0.
      // The CUDA runtime's own device switch, not c10's CUDAGuard: the guard's destructor asks
      // c10's primary-context hook, which only libtorch_cuda registers (a process of c10 alone
      // aborted there), and the device has a context (cachet allocated on it).
      size_t free = 0, total = 0;
      int previous = -1;
      const bool on_device =
          cudaGetDevice(&previous) == cudaSuccess && (previous == device || cudaSetDevice(device) == cudaSuccess);
      if (!on_device || cudaMemGetInfo(&free, &total) != cudaSuccess) free = total = 0;
      if (on_device && previous != device) (void)cudaSetDevice(previous);
      (void)cudaGetLastError();
      double fraction = 1.0;
      try {
        fraction = allocator(device)->memory_fraction();
      } catch (...) {
      }
      const size_t allowed = fraction < 1.0 ? static_cast<size_t>(fraction * static_cast<double>(total)) : total;
      const size_t asked = segment_size_from_message(message).value_or(size);
      for (const auto& obs : observers) obs(device, asked, allowed, free);
    }
    // Native's text also names each process's memory on the device (NVML), which gpu/ cannot know.
    TORCH_CHECK_WITH(OutOfMemoryError, false, with_process_memory_info(message, device));
  }

  static void* uncached_alloc(size_t size) {
    void* p = nullptr;
    C10_CUDA_CHECK(cudaMalloc(&p, size));
    return p;
  }

  // ---- history ---------------------------------------------------------------------------------

  Ctx gather(cc::RecordContext level) {
    if (record_context_.load(std::memory_order_relaxed) < static_cast<int>(level)) return nullptr;
    cc::CreateContextFn f = recorder_.load();
    return f ? f() : nullptr;
  }

  size_t max_entries() {
    std::lock_guard<std::mutex> lock(mu_);
    return max_entries_;
  }

  History& history(int device) {
    std::lock_guard<std::mutex> lock(mu_);
    auto& h = histories_[device];
    if (!h) h = std::make_unique<History>();
    return *h;
  }

  static std::int64_t now_us() {
    return std::chrono::duration_cast<std::chrono::microseconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
  }

  // Trace on or off for every allocator (and those created later); `clear` drops what was
  // recorded and the contexts kept for it.
  void set_trace_all(bool on, bool clear) {
    tc::State& s = tc::state();
    {
      std::lock_guard<std::mutex> lock(s.create_mu);
      s.trace_on.store(on);
      for (auto& slot : s.allocators)
        if (auto* a = slot.load(std::memory_order_acquire)) {
          a->set_trace(on);
          if (clear) a->clear_trace();
        }
    }
    if (clear) {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto& [d, h] : histories_) {
        std::lock_guard<std::mutex> hl(h->mu);
        h->clear();
      }
      std::lock_guard<std::mutex> tl(tracker_mu_);
      tracked_.clear();
    }
  }

  // cachet's trace of device `d` as PyTorch's TraceEntry list, with the contexts kept for it
  // (History), without the skipped actions, the last max_n. h.mu is held.
  std::vector<cda::TraceEntry> trace_entries(int d, cachet::CachingAllocator& a, History& h,
                                             const std::vector<cda::TraceEntry::Action>& skips, size_t max_n) {
    const std::vector<cachet::TraceEvent> events = a.trace();
    std::unordered_map<std::uint64_t, std::uint64_t> n_alloc, n_free, n_done;
    std::uint64_t n_oom = 0;
    std::vector<Ctx> ctxs(events.size());
    for (size_t i = 0; i < events.size(); ++i) {
      const auto& e = events[i];
      auto find = [](auto& m, std::uint64_t k) -> const CtxLog* {
        auto it = m.find(k);
        return it == m.end() ? nullptr : &it->second;
      };
      switch (e.action) {
        case cachet::TraceAction::Alloc: ctxs[i] = History::nth(find(h.allocs, e.addr), n_alloc[e.addr]++); break;
        case cachet::TraceAction::FreeRequested: ctxs[i] = History::nth(find(h.frees, e.addr), n_free[e.addr]++); break;
        case cachet::TraceAction::FreeCompleted: ctxs[i] = History::nth(find(h.frees, e.addr), n_done[e.addr]++); break;
        case cachet::TraceAction::Oom: ctxs[i] = History::nth(&h.ooms, n_oom++); break;
        default: break;
      }
    }
    // Segment allocations and mappings: the context of the allocation they served.
    Ctx next;
    for (size_t i = events.size(); i-- > 0;) {
      const auto act = events[i].action;
      if (act == cachet::TraceAction::Alloc || act == cachet::TraceAction::Oom) next = ctxs[i];
      else if (act == cachet::TraceAction::SegmentAlloc || act == cachet::TraceAction::SegmentMap) ctxs[i] = next;
      else if (act != cachet::TraceAction::SegmentFree && act != cachet::TraceAction::SegmentUnmap) next = nullptr;
    }
    std::vector<cda::TraceEntry> out;
    for (size_t i = 0; i < events.size(); ++i) {
      const auto& e = events[i];
      const auto act = to_action(e.action);
      if (std::find(skips.begin(), skips.end(), act) != skips.end()) continue;
      cda::TraceEntry te(act, static_cast<c10::DeviceIndex>(d), e.addr, e.size,
                         reinterpret_cast<void*>(e.stream), MempoolId_t{0, 0}, 0, ctxs[i], "N/A", "");
      te.time_.t_ = static_cast<time_t>(e.time_us);
      out.push_back(std::move(te));
    }
    if (out.size() > max_n) out.erase(out.begin(), out.end() - static_cast<std::ptrdiff_t>(max_n));
    return out;
  }

  // Hands the trace entries recorded since the last call to the trackers. Without
  // _record_memory_history, the trace exists for them only and is cleared once handed over.
  void dispatch_trackers(int device) {
    if (!has_trackers_.load()) return;
    cachet::CachingAllocator* a = tc::existing_allocator(device);
    if (!a) return;
    std::lock_guard<std::mutex> lock(tracker_mu_);
    const std::vector<cachet::TraceEvent> events = a->trace();
    size_t& from = tracked_[device];
    if (from > events.size()) from = 0;
    for (size_t i = from; i < events.size(); ++i) {
      const auto& e = events[i];
      cda::TraceEntry te(to_action(e.action), static_cast<c10::DeviceIndex>(device), e.addr, e.size,
                         reinterpret_cast<void*>(e.stream), MempoolId_t{0, 0}, 0, nullptr, "N/A", "");
      te.time_.t_ = static_cast<time_t>(e.time_us);
      for (const auto& t : trackers_) t(te);
    }
    from = events.size();
    if (!history_on_.load()) {
      a->clear_trace();
      from = 0;
    }
  }

  void load_settings(cc::AllocatorConfigInfo& md) {
    tc::load_config();
    const tc::State& s = tc::state();
    const cachet::Config& c = s.config;
    md.garbage_collection_threshold = c.garbage_collection_threshold;
    md.max_split_size = static_cast<size_t>(c.max_split_size);
    md.pinned_num_register_threads = static_cast<size_t>(c.pinned_num_register_threads);
    md.expandable_segments = c.expandable_segments;
    md.release_lock_on_malloc = c.release_lock_on_cudamalloc;
    md.pinned_use_host_register = c.pinned_use_cuda_host_register;
    md.graph_capture_record_stream_reuse = c.graph_capture_record_stream_reuse;
    md.last_allocator_settings = s.text;
    md.roundup_power2_divisions.assign(c.roundup_power2_divisions.begin(), c.roundup_power2_divisions.end());
  }

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

  std::mutex tracker_mu_;
  std::vector<cc::AllocatorTraceTracker> trackers_;
  std::unordered_map<int, size_t> tracked_;

  std::mutex ipc_mu_;
  struct IpcEntry {
    std::weak_ptr<void> wp;
  };
  std::unordered_map<std::string, IpcEntry> ipc_;
};

// The allocator as the deleter finds it: set once, by the_allocator(), before any DataPtr exists
// (one load on the free path instead of a function-local static's guard).
std::atomic<CachetCUDAAllocator*> g_the_allocator{nullptr};

[[gnu::hot]] CachetCUDAAllocator& the_allocator() {
  static CachetCUDAAllocator* a = [] {
    auto* p = new CachetCUDAAllocator;  // never destroyed, as native's
    g_the_allocator.store(p, std::memory_order_release);
    // cachet_torch_clear_trace (python/cachet_torch/) drops the contexts kept for the trace too.
    tc::state().on_trace_cleared.store(+[] { the_allocator().forget_history(); });
    return p;
  }();
  return *a;
}

// Every DataPtr with this deleter came from allocate(), after the_allocator() had set the pointer.
[[gnu::hot]] void raw_delete_fn(void* ptr) { g_the_allocator.load(std::memory_order_relaxed)->free(ptr); }

void uncached_delete_fn(void* ptr) { C10_CUDA_CHECK(cudaFree(ptr)); }

// "2.11.0+cu130" -> "2.11"
std::string major_minor(const char* v) {
  std::string s = v ? v : "";
  const size_t dot = s.find('.');
  if (dot == std::string::npos) return s;
  size_t end = dot + 1;
  while (end < s.size() && s[end] >= '0' && s[end] <= '9') ++end;
  return s.substr(0, end);
}

}  // namespace

// ---- torch.cuda.memory._set_allocator_settings ----------------------------------------------
//
// PyTorch applies a settings string at run time (c10::CachingAllocator::setAllocatorSettings):
// its generic parse, then the one device hook AcceleratorAllocatorConfig keeps (CUDA's). cachet
// follows by chaining onto that hook: the previous hook first (PyTorch's own parse, which refuses
// what PyTorch refuses), then the string parsed over cachet's configuration for the allocators
// created later and applied to each existing one (CachingAllocator::configure); cachet's refusal
// (it is stricter) raises in Python as RuntimeError. The hook is a function-local static of an
// inline function: libc10 exports it (a unique symbol), found by name in the loaded libc10.
namespace {

void apply_allocator_settings(const std::string& env) {
  tc::State& s = tc::state();
  std::lock_guard<std::mutex> lock(s.create_mu);
  try {
    cachet::ParseResult r = cachet::parse_config(env, cachet::ConfigSource::PyTorch, s.config);
    for (auto& slot : s.allocators)
      if (auto* a = slot.load(std::memory_order_acquire)) (void)a->configure(env);
    s.config = r.config;
    s.text = env;
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "cachet: _set_allocator_settings(\"", env, "\"): ", e.what());
  }
}

// Chains apply_allocator_settings onto PyTorch's settings hook, once. False when this libc10
// has no such hook (then runtime settings do not reach cachet).
bool follow_allocator_settings() {
  static const bool done = [] {
    using Hook = std::function<void(const std::string&)>;
    void* h = dlopen("libc10.so", RTLD_NOW | RTLD_NOLOAD);
    if (!h) return false;
    auto* hook = static_cast<Hook*>(
        dlsym(h, "_ZZN3c1016CachingAllocator26AcceleratorAllocatorConfig19getConfigParserHookB5cxx11EvE4hook"));
    auto* guard = static_cast<const char*>(
        dlsym(h, "_ZGVZN3c1016CachingAllocator26AcceleratorAllocatorConfig19getConfigParserHookB5cxx11EvE4hook"));
    dlclose(h);
    if (!hook || !guard || *guard == 0) return false;  // absent, or not constructed yet
    Hook previous = *hook;
    *hook = [previous](const std::string& env) {
      if (previous) previous(env);
      apply_allocator_settings(env);
    };
    return true;
  }();
  return done;
}

}  // namespace

// ---- C entry points for python/cachet_torch/ -------------------------------------------------

// The torch major.minor this library was built against, e.g. "2.11".
CACHET_TORCH_API const char* cachet_c10_torch_version(void) { return CACHET_C10_TORCH_VERSION; }

// 1 when cachet is PyTorch's CUDA allocator.
CACHET_TORCH_API int cachet_c10_installed(void) {
  return c10::cuda::CUDACachingAllocator::allocator.load() == &the_allocator() ? 1 : 0;
}

namespace {
// The allocator install() took PyTorch's atomic from (native's, uninitialised), for
// cachet_c10_bench_select; native_ready: it has been initialised.
std::atomic<cc::CUDAAllocator*> replaced_allocator{nullptr};
std::atomic<bool> native_ready{false};
}  // namespace

// Makes cachet PyTorch's CUDA allocator. `running_torch_version`: torch.__version__. 0 on success
// (and when already installed); otherwise 1 with the reason in cachet_torch_last_error: another
// torch minor version than the one built against, a refused configuration (the parser's
// message), or a CUDA allocator already initialised (CUDA was used before install).
CACHET_TORCH_API int cachet_c10_install(const char* running_torch_version) {
  try {
    const std::string running = major_minor(running_torch_version);
    if (running != CACHET_C10_TORCH_VERSION) {
      tc::set_error(std::string("libcachet_c10.so was built for PyTorch ") + CACHET_C10_TORCH_VERSION +
                        " but PyTorch " + (running_torch_version ? running_torch_version : "(unknown)") +
                        " is running: rebuild cachet against this torch (CACHET_TORCH_DIR), or use the "
                        "plug-in path (libcachet_torch.so)",
                    false);
      return 1;
    }
    tc::load_config();
    if (!tc::state().config_ok) {
      tc::state().config_reported.store(true);
      tc::set_error(tc::state().config_error, false);
      return 1;
    }
    CachetCUDAAllocator* ours = &the_allocator();
    cc::CUDAAllocator* current = c10::cuda::CUDACachingAllocator::allocator.load();
    if (current == ours) return 0;
    // As torch::cuda::CUDAPluggableAllocator::changeCurrentAllocator: only before CUDA was used.
    if (current && current->initialized()) {
      tc::set_error("PyTorch's CUDA allocator (" + current->name() +
                        ") is already initialised: install cachet before the first CUDA call "
                        "(call cachet_torch.install() right after importing torch)",
                    false);
      return 1;
    }
    cachet::gpu::CurrentStream::set_provider(&current_stream_for_device_calls);
    replaced_allocator.store(current);
    c10::cuda::CUDACachingAllocator::allocator.store(ours);
    c10::SetAllocator(c10::DeviceType::CUDA, ours);
    (void)follow_allocator_settings();
    return 0;
  } catch (const std::exception& e) {
    tc::set_error(std::string("install: ") + e.what(), false);
    return 1;
  }
}

// For benchmarks only (bench/c10_empty.py --in-process): points PyTorch's allocator atomic at the
// allocator install() replaced (use_native = 1; initialised for every device on first use) or back
// at cachet (0), so that one process can time torch.empty under both (at::empty_cuda asks the
// atomic). Memory keeps the deleter of the allocator that made it, so each block goes back to its
// own allocator whichever is current; c10::GetAllocator(kCUDA), the memory stats and everything
// else still speak of the one current at the call. 0 on success; 1 with the reason in
// cachet_torch_last_error when cachet is not installed or replaced nothing.
CACHET_TORCH_API int cachet_c10_bench_select(int use_native) {
  try {
    cc::CUDAAllocator* native = replaced_allocator.load();
    if (c10::cuda::CUDACachingAllocator::allocator.load() != &the_allocator() &&
        c10::cuda::CUDACachingAllocator::allocator.load() != native) {
      tc::set_error("cachet_c10_bench_select: cachet is not PyTorch's CUDA allocator (install it first)", false);
      return 1;
    }
    if (native == nullptr) {
      tc::set_error("cachet_c10_bench_select: install() replaced no allocator, so there is none to select", false);
      return 1;
    }
    if (use_native == 0) {
      c10::cuda::CUDACachingAllocator::allocator.store(&the_allocator());
      return 0;
    }
    if (!native_ready.exchange(true)) native->init(c10::cuda::device_count());
    c10::cuda::CUDACachingAllocator::allocator.store(native);
    return 0;
  } catch (const std::exception& e) {
    tc::set_error(std::string("cachet_c10_bench_select: ") + e.what(), false);
    return 1;
  }
}

#ifdef CACHET_C10_TESTING
// python/tests/c10_backend_test.cpp reaches the allocator through these (backend_testing.h).
namespace cachet::c10_testing {
c10::cuda::CUDACachingAllocator::CUDAAllocator& allocator() { return the_allocator(); }
void* malloc(c10::DeviceIndex device, size_t size, cudaStream_t stream) {
  return the_allocator().malloc_for_testing(device, size, stream);
}
c10::DeleterFnPtr deleter() { return &raw_delete_fn; }
}  // namespace cachet::c10_testing
#endif

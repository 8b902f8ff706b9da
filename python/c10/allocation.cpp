// python/c10/allocation.cpp: the c10 backend's allocation path, the seam of PyTorch's
// NativeCachingAllocator::malloc/free and DeviceCachingAllocator::malloc/free/emptyCache
// (docs/pytorch-allocator.md sections 3 and 6; python/README.md, "The c10 backend"):
// allocate, raw_alloc, raw_delete and the deleter, the calling thread's device, out of memory
// (PyTorch's error and its observers), emptyCache, recordStream, the memory fraction, cacheInfo,
// getBaseAllocation, peer access. The hot path (gpu/README.md "The hot path") is allocate ->
// malloc and the deleter -> free, each one call of cachet's allocator; with the history on they
// take malloc_traced and free_traced, which gather PyTorch's context first and name the call's
// trace events (history.h).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>

#include "c10/backend.h"
#include "c10/process_memory.h"
#include "cachet/gpu/cuda_backend.h"

namespace cachet::c10_backend {
namespace {

constexpr size_t kOneExaByte = 1152921504606846976ULL;  // PyTorch's "more than 1EB" limit

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

}  // namespace

cachet::StreamId current_stream_for_device_calls() {
  return reinterpret_cast<cachet::StreamId>(c10::cuda::getCurrentCUDAStream(current_device()).stream());
}

// ---- c10::Allocator ------------------------------------------------------------------------

[[gnu::hot]] c10::DataPtr CachetCUDAAllocator::allocate(size_t size) {
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

c10::DeleterFnPtr CachetCUDAAllocator::raw_deleter() const {
  return isEnabled() ? &raw_delete_fn : &uncached_delete_fn;
}

void CachetCUDAAllocator::copy_data(void* dest, const void* src, std::size_t count) const {
  C10_CUDA_CHECK(cudaMemcpy(dest, src, count, cudaMemcpyDeviceToDevice));
}

// ---- c10::DeviceAllocator ------------------------------------------------------------------

void CachetCUDAAllocator::emptyCache(MempoolId_t mempool_id) {
  const cachet::PoolId id = pool_id(mempool_id);
  for (int d = 0; d < tc::kMaxDevices; ++d) {
    cachet::CachingAllocator* a = tc::existing_allocator(d);
    if (!a) continue;
    cachet::gpu::CurrentStream cs(current_stream(d));
    empty_cache_of(d, a, id);
  }
}

// With the history on, a call of its own: native's emptyCache gathers its context at ALL, and
// the segments it gives back and the frees it completes take it (history.h).
void CachetCUDAAllocator::empty_cache_of(int device, cachet::CachingAllocator* a, cachet::PoolId id) {
  if (has_trackers_.load()) refuse_call_from_tracker("emptyCache");
  as_traced_call(device, [&] { call("emptyCache", [&] { id.is_default() ? a->empty_cache() : a->empty_cache(id); }); });
  if (has_trackers_.load()) raise_tracker_error();
}

void CachetCUDAAllocator::recordStream(const c10::DataPtr& ptr, c10::cuda::CUDAStream stream) {
  // Native skips an empty tensor's null pointer and memory it did not allocate (received from
  // another process, behind another deleter).
  if (!ptr.get() || ptr.get_deleter() != &raw_delete_fn) return;
  auto [a, device] = owner(ptr.get());
  (void)device;
  call("recordStream", [&] { a->record_stream(ptr.get(), reinterpret_cast<cachet::StreamId>(stream.stream())); });
}

void CachetCUDAAllocator::recordStream(const c10::DataPtr& ptr, c10::Stream stream) {
  recordStream(ptr, c10::cuda::CUDAStream(stream));
}

// ---- CUDAAllocator ---------------------------------------------------------------------------

void* CachetCUDAAllocator::raw_alloc(size_t nbytes) {
  if (nbytes == 0) return nullptr;
  const c10::DeviceIndex device = current_device();
  if (!isEnabled()) return uncached_alloc(nbytes);
  return malloc(device, nbytes, c10::cuda::getCurrentCUDAStream(device).stream());
}

void* CachetCUDAAllocator::raw_alloc_with_stream(size_t nbytes, cudaStream_t stream) {
  if (nbytes == 0) return nullptr;
  const c10::DeviceIndex device = current_device();
  if (!isEnabled()) return uncached_alloc(nbytes);
  return malloc(device, nbytes, stream);
}

void CachetCUDAAllocator::raw_delete(void* ptr) {
  if (!isEnabled()) {
    uncached_delete_fn(ptr);
    return;
  }
  free(ptr);
}

// Native creates its per-device allocators here; cachet creates each on first use (a device
// this process never touches costs nothing), so init only records the count.
void CachetCUDAAllocator::init(int device_count) {
  int cur = device_count_.load();
  while (cur < device_count && !device_count_.compare_exchange_weak(cur, device_count)) {
  }
}

double CachetCUDAAllocator::getMemoryFraction(c10::DeviceIndex device) {
  return call("getMemoryFraction", [&] { return allocator(device)->memory_fraction(); });
}

void CachetCUDAAllocator::setMemoryFraction(double fraction, c10::DeviceIndex device) {
  cachet::CachingAllocator* a = allocator(device);
  if (has_trackers_.load()) refuse_call_from_tracker("setMemoryFraction");
  as_traced_call(device, [&] { call("setMemoryFraction", [&] { a->set_memory_fraction(fraction); }); });
  if (has_trackers_.load()) raise_tracker_error();
}

// cuDNN's benchmark asks how much it may try: with *largestBlock 0 (as cuDNN calls it) the
// device's free memory or the largest cached free block, whichever is larger; otherwise the
// larger of *largestBlock and the largest cached free block.
void CachetCUDAAllocator::cacheInfo(c10::DeviceIndex device, size_t* largestBlock) {
  cachet::CachingAllocator* a = allocator(device);
  if (*largestBlock == 0) {
    *largestBlock = call("cacheInfo", [&] { return a->largest_free_block(); });
  } else {
    *largestBlock = std::max<size_t>(*largestBlock, call("cacheInfo", [&] { return a->largest_cached_block(); }));
  }
}

// The segment that holds `ptr`: its base address and size (refused for expandable segments,
// as native refuses them).
void* CachetCUDAAllocator::getBaseAllocation(void* ptr, size_t* size) {
  auto [a, device] = owner(ptr);
  (void)device;
  cachet::Bytes sz = 0;
  void* base = call("getBaseAllocation", [&] { return a->base_allocation(ptr, &sz); });
  if (size) *size = sz;
  return base;
}

void CachetCUDAAllocator::attachOutOfMemoryObserver(cc::OutOfMemoryObserver observer) {
  std::lock_guard<std::mutex> lock(mu_);
  oom_observers_.push_back(std::move(observer));
}

void CachetCUDAAllocator::enablePeerAccess(c10::DeviceIndex dev, c10::DeviceIndex dev_to_access) {
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
cudaError_t CachetCUDAAllocator::memcpyAsync(void* dst, int dstDevice, const void* src, int srcDevice,
                                             size_t count, cudaStream_t stream, bool p2p_enabled) {
  auto expandable = [](int d) {
    cachet::CachingAllocator* a = tc::existing_allocator(d);
    return a && a->config().expandable_segments;
  };
  if (p2p_enabled || srcDevice == dstDevice || (!expandable(dstDevice) && !expandable(srcDevice)))
    return cudaMemcpyAsync(dst, src, count, cudaMemcpyDeviceToDevice, stream);
  return cudaMemcpyPeerAsync(dst, dstDevice, src, srcDevice, count, stream);
}

// ---- used by the deleter ---------------------------------------------------------------------

[[gnu::hot]] void CachetCUDAAllocator::free(void* ptr) {
  if (!ptr) return;
  auto [a, device] = owner(ptr);
  if (history_on_.load(std::memory_order_relaxed)) [[unlikely]] {
    free_traced(a, device, ptr);
    return;
  }
  if (has_trackers_.load(std::memory_order_relaxed)) [[unlikely]] {
    free_tracked(a, ptr);
    return;
  }
  call("free", [&] { a->free(ptr); });
}

// free with trace trackers attached (history.cpp): from a tracker, made once the call that ran it
// returns; a tracker's exception is only warned about (the deleter runs in destructors).
void CachetCUDAAllocator::free_tracked(cachet::CachingAllocator* a, void* ptr) {
  if (defer_free_from_tracker(ptr)) return;
  call("free", [&] { a->free(ptr); });
  warn_tracker_error();
}

// free with history on: native's free gathers its context at ALL (outside every lock), and the
// events of the free take it (history.h).
void CachetCUDAAllocator::free_traced(cachet::CachingAllocator* a, int device, void* ptr) {
  if (has_trackers_.load(std::memory_order_relaxed) && defer_free_from_tracker(ptr)) return;
  const TracedCall c = begin_call(device, cc::RecordContext::ALL, cc::RecordContext::ALL);
  {
    cachet::TraceCallScope scope(c.id);
    call("free", [&] { a->free(ptr); });
  }
  set_live(device, ptr, nullptr);
  if (has_trackers_.load(std::memory_order_relaxed)) warn_tracker_error();
}

// ---- per-device allocators -------------------------------------------------------------------

[[gnu::hot]] cachet::CachingAllocator* CachetCUDAAllocator::allocator(int device) {
  if (const tc::SoleAllocator s = tc::sole_allocator(); s.allocator != nullptr && s.device == device) [[likely]]
    return s.allocator;
  if (cachet::CachingAllocator* a = tc::existing_allocator(device)) return a;
  cachet::CachingAllocator* a = tc::allocator_for(device, false);
  TORCH_CHECK(a, "cachet: ", tc::last_error_copy());
  return a;
}

[[gnu::hot]] std::pair<cachet::CachingAllocator*, int> CachetCUDAAllocator::owner(void* ptr) {
  if (const tc::SoleAllocator s = tc::sole_allocator(); s.allocator != nullptr) [[likely]]
    return {s.allocator, s.device};
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, ptr) == cudaSuccess && attr.type == cudaMemoryTypeDevice) {
    if (auto* a = tc::existing_allocator(attr.device)) return {a, attr.device};
  }
  (void)cudaGetLastError();
  TORCH_CHECK(false, "invalid device pointer: ", ptr);
}

cachet::StreamId CachetCUDAAllocator::current_stream(int device) {
  return reinterpret_cast<cachet::StreamId>(
      c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device)).stream());
}

// ---- the allocation path ---------------------------------------------------------------------

[[gnu::hot]] void* CachetCUDAAllocator::malloc(c10::DeviceIndex device, size_t size, cudaStream_t stream) {
  cachet::CachingAllocator* a = allocator(device);
  if (history_on_.load(std::memory_order_relaxed)) [[unlikely]]
    return malloc_traced(a, device, size, stream);
  if (has_trackers_.load(std::memory_order_relaxed)) [[unlikely]]
    return malloc_tracked(a, device, size, stream);
  return allocate_on(a, device, size, stream);
}

// malloc with trace trackers attached (history.cpp): refused from a tracker; a tracker's
// exception is raised once the allocation is made (the DataPtr is not made: the memory goes back).
void* CachetCUDAAllocator::malloc_tracked(cachet::CachingAllocator* a, c10::DeviceIndex device, size_t size,
                                          cudaStream_t stream) {
  refuse_call_from_tracker("malloc");
  void* p = allocate_on(a, device, size, stream);
  give_back_on_tracker_error(a, p);
  return p;
}

// A tracker failed during the allocation of `p`: `p` goes back (no DataPtr holds it) and the
// tracker's error is raised.
void CachetCUDAAllocator::give_back_on_tracker_error(cachet::CachingAllocator* a, void* p) {
  try {
    raise_tracker_error();
  } catch (...) {
    if (p != nullptr) {
      try {
        a->free(p);
      } catch (...) {
      }
      warn_tracker_error();  // what the free's trackers raised in turn
    }
    throw;
  }
}

// malloc with history on: native's malloc gathers its context at STATE (outside every lock); the
// events of the call take it, those of the segments it gives back on the way included
// (history.h), and the allocation keeps it for the snapshot. Out of memory is raised after the
// call's scope is closed: the observers may allocate, as calls of their own.
void* CachetCUDAAllocator::malloc_traced(cachet::CachingAllocator* a, c10::DeviceIndex device, size_t size,
                                         cudaStream_t stream) {
  if (has_trackers_.load(std::memory_order_relaxed)) refuse_call_from_tracker("malloc");
  const TracedCall c = begin_call(device, cc::RecordContext::STATE, cc::RecordContext::STATE);
  void* p = nullptr;
  std::optional<std::string> oom;
  try {
    cachet::TraceCallScope scope(c.id);
    p = a->allocate(size, reinterpret_cast<cachet::StreamId>(stream));
  } catch (const cachet::OutOfMemory& e) {
    oom = e.what();
  } catch (const std::exception& e) {
    allocate_failed(device, size, e);
  }
  if (oom) out_of_memory(device, size, *oom);
  if (has_trackers_.load(std::memory_order_relaxed)) give_back_on_tracker_error(a, p);
  set_live(device, p, c.made);
  return p;
}

// `a`'s allocate, its refusals as PyTorch's errors (out of memory: out_of_memory). Device calls
// follow the capture status of PyTorch's current stream, asked only when one is made
// (current_stream_for_device_calls, registered at install), as native's cudaMallocMaybeCapturing
// asks it.
inline void* CachetCUDAAllocator::allocate_on(cachet::CachingAllocator* a, c10::DeviceIndex device, size_t size,
                                              cudaStream_t stream) {
  try {
    return a->allocate(size, reinterpret_cast<cachet::StreamId>(stream));
  } catch (const cachet::OutOfMemory& e) {
    out_of_memory(device, size, e.what());
  } catch (const std::exception& e) {
    allocate_failed(device, size, e);
  }
}

void CachetCUDAAllocator::allocate_failed(c10::DeviceIndex device, size_t size, const std::exception& e) {
  TORCH_CHECK(false, "cachet: allocate ", size, " bytes on device ", static_cast<int>(device), ": ", e.what());
}

// cachet refused: its message is PyTorch's, word for word. Observers are called with no lock
// held, as native calls them after unlocking: (device, the segment size asked of the device,
// the memory allowed (the cap set by a fraction, else the device's total), the device's free
// memory).
void CachetCUDAAllocator::out_of_memory(c10::DeviceIndex device, size_t size, const std::string& message) {
  if (has_trackers_.load()) warn_tracker_error();  // the out-of-memory error is the one raised
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

void* CachetCUDAAllocator::uncached_alloc(size_t size) {
  void* p = nullptr;
  C10_CUDA_CHECK(cudaMalloc(&p, size));
  return p;
}

// ---- the one allocator and its deleters ------------------------------------------------------

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

}  // namespace cachet::c10_backend

// cachet/gpu/cuda_backend.h: the CUDA backends (only when built with CACHET_HAVE_CUDA).
//   CudaRuntimeBackend  cudaMalloc/cudaFree, cudaMemGetInfo, real events
//                       (cudaEventRecord/Query/Synchronize) for stream uses.
//   CudaVmmBackend      the same plus address reservation and mapping for expandable
//                       segments (cuMemAddressReserve/cuMemCreate/cuMemMap/cuMemSetAccess and
//                       their inverses), and the sleep calls (docs/sleep-wake.md section 6):
//                       cudaHostAlloc'd pinned buffers, cudaMemcpyAsync on a copy stream of its
//                       own (after one cudaDeviceSynchronize, so work queued on any stream has
//                       finished writing what is backed up), and map_pieces: one cuMemCreate +
//                       cuMemMap per piece of up to 512 MiB, one cuMemSetAccess per call.
//                       unmap of part of a piece copies its other parts to the host, unmaps and
//                       releases the piece, maps the other parts anew and copies them back
//                       (contents kept; the driver may refuse to map an allocation from an
//                       offset). Driver entry points are fetched at run time with
//                       cudaGetDriverEntryPointByVersion: nothing links libcuda, so binaries
//                       start on machines without a driver.
// Every call selects the backend's device for its duration and restores the caller's.
//
// While a CUDA graph is being captured (docs/pytorch-allocator.md §14.7, §14.8.2), both follow
// PyTorch 2.11, deciding by the capture status of the thread's current stream (CurrentStream
// below; PyTorch's currentStreamCaptureStatusMayInitCtx):
//   cudaMalloc, and cuMemAddressReserve/cuMemCreate/cuMemMap/cuMemSetAccess of a growth, run in
//     relaxed capture mode (cudaThreadExchangeStreamCaptureMode; PyTorch's
//     cudaMallocMaybeCapturing), so a capture may grow its pool without being invalidated;
//   event_record refuses a stream that is capturing (it checks the stream it is given), and
//     event_query / event_synchronize refuse while the current stream is capturing: PyTorch
//     records, queries and waits for no event then (its allocator defers those frees);
//   stream_valid takes a live capturing stream as this device's without asking its device (the
//     driver refuses that question during a capture and invalidates the capture);
//   capture_info / node_dependencies are queries (cudaStreamGetCaptureInfo,
//     cudaGraphNodeGetDependencies), allowed on any stream during any capture;
//   free, unmap and unreserve refuse while the current stream is capturing, before calling the
//     driver: the driver forbids them (cudaErrorStreamCaptureUnsupported) and would invalidate the
//     capture; PyTorch 2.11 fails there too. Without a current stream, or when the capture runs on
//     another thread, the driver's own refusal comes back instead.
// A refusal is a Status::error naming the rule; the allocator turns it into cachet::DeviceError
// before changing any state (gpu/README.md, "The backend interface").
#pragma once

#include <atomic>
#include <map>
#include <memory>

#include "cachet/gpu/backend.h"
#include "cachet/gpu/pinned_keep.h"

namespace cachet::gpu {

// How many CUDA devices this process sees: 0 when there is no driver (cudaErrorInsufficientDriver,
// 35) or no device (cudaErrorNoDevice, 100). Any other error throws DeviceError. Always 0 when
// built without CUDA.
int cuda_device_count();

// The current stream of this thread for the device calls made inside the scope: PyTorch's current
// stream, which CUDAPluggableAllocator passes with every allocation (python/plugin.cpp sets it in
// cachet_malloc). Without one, device calls are made as PyTorch makes them on a stream that is not
// capturing. Scopes nest; each thread has its own.
class CurrentStream {
 public:
  // One thread-local record, reached once per scope: in a shared library (the plug-in, the c10
  // backend) each thread-local access is a __tls_get_addr call, and this guard sits on every
  // allocation's path (bench/RESULTS.md, "The c10 backend").
  explicit CurrentStream(StreamId s) noexcept : t_(opaque(&tls())), prev_(*t_) { *t_ = State{s, true}; }
  ~CurrentStream() { *t_ = prev_; }
  CurrentStream(const CurrentStream&) = delete;
  CurrentStream& operator=(const CurrentStream&) = delete;

  static bool is_set() noexcept { return tls().set; }
  static StreamId get() noexcept { return tls().stream; }  // meaningful when is_set()

  // Where no scope is set, the current stream asked of a provider instead: a host that knows its
  // own current stream (the c10 backend: PyTorch's getCurrentCUDAStream) registers one, so its
  // hot path sets no scope and the stream is asked only when a device call needs it. Null (the
  // default): not capturing. Set once, before allocations; read with relaxed order.
  using Provider = StreamId (*)();
  static void set_provider(Provider p) noexcept { provider_slot().store(p, std::memory_order_relaxed); }
  static Provider provider() noexcept { return provider_slot().load(std::memory_order_relaxed); }

 private:
  struct State {
    StreamId stream = 0;
    bool set = false;
  };
  static State& tls() noexcept {
    static thread_local State t;
    return t;
  }
  static std::atomic<Provider>& provider_slot() noexcept {
    static std::atomic<Provider> p{nullptr};
    return p;
  }
  // Hides where the pointer came from, so that the destructor uses it rather than computing the
  // thread-local address again (a second __tls_get_addr call).
  static State* opaque(State* p) noexcept {
#if defined(__GNUC__)
    asm("" : "+r"(p));
#endif
    return p;
  }
  State* t_;
  State prev_;
};

#ifdef CACHET_HAVE_CUDA

class CudaRuntimeBackend {
 public:
  static constexpr BackendCaps caps{.reserve_va = false, .real_events = true, .granularity = 0, .capture_graph = true};
  explicit CudaRuntimeBackend(DeviceIndex device);

  DeviceIndex device() const { return device_; }
  Result<DevicePtr> malloc(Bytes n);
  Status free(DevicePtr p);
  Result<MemInfo> mem_get_info();
  bool stream_valid(StreamId s);
  Result<EventHandle> event_create();
  Status event_record(EventHandle e, StreamId s);
  Result<bool> event_query(EventHandle e);
  Status event_synchronize(EventHandle e);
  void event_destroy(EventHandle e);
  // The capture graph (docs/pytorch-allocator.md §14.10.1): cudaStreamGetCaptureInfo (status, id,
  // dependency nodes) and cudaGraphNodeGetDependencies, as PyTorch's
  // graph_capture_record_stream_reuse reads them.
  Result<CaptureInfo> capture_info(StreamId s);
  Result<std::vector<GraphNode>> node_dependencies(GraphNode n);

 protected:
  DeviceIndex device_;
};
static_assert(Backend<CudaRuntimeBackend>);

class CudaVmmBackend : public CudaRuntimeBackend {
 public:
  static constexpr BackendCaps caps{
      .reserve_va = true, .real_events = true, .granularity = 2 * MiB, .sleep = true, .capture_graph = true};
  explicit CudaVmmBackend(DeviceIndex device);  // throws DeviceError without the driver API
  ~CudaVmmBackend();
  CudaVmmBackend(const CudaVmmBackend&) = delete;
  CudaVmmBackend& operator=(const CudaVmmBackend&) = delete;

  Result<DevicePtr> reserve(Bytes n);
  Status unreserve(DevicePtr p, Bytes n);
  Status map(DevicePtr p, Bytes n);    // n a multiple of the granularity; one handle per granule
  Status unmap(DevicePtr p, Bytes n);  // synchronizes the device first (work may still use it)
  // The sleep calls (backend.h SleepCalls).
  // Pinned host buffers for backups. A buffer given back is kept for the next sleep (the smallest
  // kept one that is large enough is taken): cudaHostAlloc pins page by page, about 0.35 s per GiB
  // on an H100 host, and cudaFreeHost takes about 0.1 s per GiB, 18x and 5x the copies themselves
  // (bench/RESULTS.md, "Sleep and wake"). What is held, in use and kept, never exceeds the most
  // that was in use at once (PinnedKeep, pinned_keep.h). host_trim (the allocator's
  // release_backup_buffers, and a failing cudaHostAlloc before its retry) and the destructor
  // free the kept ones; empty_cache does not (it is about device memory).
  Result<void*> host_alloc(Bytes n);
  void host_free(void* h);
  Bytes host_trim();  // the kept buffers' bytes, given back
  Status copy_to_host(void* h, DevicePtr p, Bytes n);
  Status copy_to_device(DevicePtr p, const void* h, Bytes n);
  Status copy_synchronize();
  Status map_pieces(DevicePtr p, Bytes n);

 private:
  struct Driver;
  // One cuMemMap: the whole physical allocation `handle` (`size` bytes), from offset 0.
  struct Mapping {
    unsigned long long handle;  // CUmemGenericAllocationHandle
    Bytes size;
  };
  Status map_handle(DevicePtr at, Bytes size, unsigned long long handle);
  void drop_handle(unsigned long long handle);  // one mapping fewer; cuMemRelease at the last
  Status copy_prepare();                        // the copy stream, and the device idle once
  std::shared_ptr<Driver> drv_;
  Bytes granularity_ = 2 * MiB;
  std::map<DevicePtr, Mapping> mappings_;          // by address
  std::map<unsigned long long, int> handle_uses_;  // handle -> its mappings
  PinnedKeep pinned_;                              // every pinned buffer held, in use or kept
  void* copy_stream_ = nullptr;                    // cudaStream_t
  bool copies_pending_ = false;
};
static_assert(Backend<CudaVmmBackend>);

#endif  // CACHET_HAVE_CUDA

// A DeviceMemory for CUDA device `device` (VMM when `expandable`). Throws DeviceError when
// CUDA is unavailable.
std::unique_ptr<DeviceMemory> make_cuda_memory(DeviceIndex device, bool expandable);

}  // namespace cachet::gpu

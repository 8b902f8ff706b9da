// cachet/gpu/backend.h: device memory behind one small interface (docs/pytorch-allocator.md
// §3.2, §6, §7).
//
// A backend gives the allocator exactly what PyTorch's allocator asks of the CUDA driver:
//   segments   malloc / free                         (cudaMalloc / cudaFree)
//   memory     mem_get_info                          (cudaMemGetInfo: free and total bytes)
//   events     event_create / record / query / synchronize / destroy (stream uses, §6)
//   VMM        reserve / unreserve / map / unmap      (expandable segments, §7),
//              only when caps.reserve_va is set
//   sleep      host_alloc / host_free                 (cudaHostAlloc / cudaFreeHost: pinned
//              copy_to_host / copy_to_device          host backups; cudaMemcpyAsync each way
//              copy_synchronize                       and one synchronize; docs/sleep-wake.md)
//              map_pieces                             (a sleeping range's new memory in pieces
//              only when caps.sleep is set             of up to 512 MiB: cuMemCreate + cuMemMap)
//   captures   capture_info / node_dependencies       (cudaStreamGetCaptureInfo: a stream's capture
//              only when caps.capture_graph is set     id and current dependency nodes;
//                                                      cudaGraphNodeGetDependencies; for
//                                                      graph_capture_record_stream_reuse,
//                                                      docs/pytorch-allocator.md §14.10.1)
//
// Backends never throw: every call returns a Status (Ok, OutOfMemory, Error + message). The
// allocator turns a Status into PyTorch's behaviour (OutOfMemory -> the OOM path, Error ->
// cachet::DeviceError) in one place, after restoring its own state.
//
// `Backend` is the compile-time contract (each backend header ends with a static_assert);
// `DeviceMemory` is its type-erased form, which the allocator holds: device calls only happen
// on slow paths (new segments, events), so one virtual call there costs nothing measurable.
#pragma once

#include <concepts>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "cachet/types.h"

namespace cachet::gpu {

using DevicePtr = std::uint64_t;    // device address; 0 = none
using EventHandle = std::uint64_t;  // backend-defined event id (cudaEvent_t value on CUDA)
using GraphNode = std::uint64_t;    // a captured graph node (cudaGraphNode_t value on CUDA)

enum class StatusCode : std::uint8_t { Ok, OutOfMemory, Error };

struct Status {
  StatusCode code = StatusCode::Ok;
  std::string message;  // empty when Ok

  static Status ok() { return {}; }
  static Status oom(std::string m = "out of memory") { return {StatusCode::OutOfMemory, std::move(m)}; }
  static Status error(std::string m) { return {StatusCode::Error, std::move(m)}; }
  bool is_ok() const { return code == StatusCode::Ok; }
  bool is_oom() const { return code == StatusCode::OutOfMemory; }
};

// What a backend can do. The allocator branches on these, never on #ifdef or the environment.
struct BackendCaps {
  bool reserve_va = false;   // reserve/unreserve/map/unmap exist (expandable segments)
  bool real_events = false;  // events are real device events (else simulated)
  Bytes granularity = 0;     // VMM mapping granularity in bytes (0 = no VMM)
  // Pinned host buffers, device<->host copies and map_pieces (sleep and wake, docs/sleep-wake.md
  // §6): cachet_sleep:True needs it and reserve_va.
  bool sleep = false;
  // capture_info and node_dependencies (a capture's graph, docs/pytorch-allocator.md §14.10.1):
  // graph_capture_record_stream_reuse frees blocks during a capture only with it, and a capture
  // route (PoolRoute::CaptureStream) takes every stream of its capture only with it (else its
  // stream only).
  bool capture_graph = false;
};

// cudaStreamGetCaptureInfo: whether the stream captures, into which capture, and the nodes the
// next captured work on it will depend on (its "terminals").
struct CaptureInfo {
  bool capturing = false;
  std::uint64_t capture_id = 0;
  std::vector<GraphNode> terminals;
};

// The largest piece map_pieces backs with one physical allocation (docs/sleep-wake.md section 6: 512 MiB
// pieces map 170x faster than 2 MiB ones on an H100).
inline constexpr Bytes kMaxMapPiece = 512 * MiB;

struct MemInfo {
  Bytes free = 0;
  Bytes total = 0;
  // What this process holds on the device, when the backend knows it (PyTorch asks NVML; the
  // OOM message then says "Including non-PyTorch memory, this process has ... in use").
  std::optional<Bytes> process_used;
};

template <class T>
struct Result {
  Status status;
  T value{};
  bool is_ok() const { return status.is_ok(); }
};

// The compile-time contract. Claiming caps.reserve_va makes the VMM calls required.
template <class B>
concept BackendBase = requires(B& b, const B& cb, Bytes n, DevicePtr p, StreamId s, EventHandle e) {
  { B::caps } -> std::convertible_to<BackendCaps>;
  { cb.device() } -> std::same_as<DeviceIndex>;
  { b.malloc(n) } -> std::same_as<Result<DevicePtr>>;      // one segment of n bytes
  { b.free(p) } -> std::same_as<Status>;                   // a segment from malloc
  { b.mem_get_info() } -> std::same_as<Result<MemInfo>>;
  { b.stream_valid(s) } -> std::same_as<bool>;             // stream belongs to this device
  { b.event_create() } -> std::same_as<Result<EventHandle>>;
  { b.event_record(e, s) } -> std::same_as<Status>;
  { b.event_query(e) } -> std::same_as<Result<bool>>;      // true = complete
  { b.event_synchronize(e) } -> std::same_as<Status>;
  { b.event_destroy(e) } -> std::same_as<void>;
};

template <class B>
concept VmmCalls = requires(B& b, Bytes n, DevicePtr p) {
  { b.reserve(n) } -> std::same_as<Result<DevicePtr>>;  // n bytes of address space
  { b.unreserve(p, n) } -> std::same_as<Status>;
  // Backs [p, p+n) (whole pages of caps.granularity... or of the allocator's page size) with
  // physical memory and maps it. On failure nothing stays mapped.
  { b.map(p, n) } -> std::same_as<Status>;
  { b.unmap(p, n) } -> std::same_as<Status>;  // unmaps and releases [p, p+n)
};

// Claiming caps.sleep makes these required (with the VMM calls).
template <class B>
concept SleepCalls = requires(B& b, Bytes n, DevicePtr p, void* h, const void* ch) {
  { b.host_alloc(n) } -> std::same_as<Result<void*>>;  // n bytes of pinned host memory
  { b.host_free(h) } -> std::same_as<void>;
  { b.copy_to_host(h, p, n) } -> std::same_as<Status>;     // device [p, p+n) -> host h, asynchronous
  { b.copy_to_device(p, ch, n) } -> std::same_as<Status>;  // host -> device [p, p+n), asynchronous
  { b.copy_synchronize() } -> std::same_as<Status>;        // every copy above has completed
  // New physical memory for [p, p+n) (reserved, unmapped, whole pages) in pieces of at most
  // kMaxMapPiece bytes; on failure nothing of it stays mapped. unmap(p, n) may later give back any
  // whole pages of it.
  { b.map_pieces(p, n) } -> std::same_as<Status>;
};

// Claiming caps.capture_graph makes these required.
template <class B>
concept CaptureGraphCalls = requires(B& b, StreamId s, GraphNode n) {
  { b.capture_info(s) } -> std::same_as<Result<CaptureInfo>>;
  { b.node_dependencies(n) } -> std::same_as<Result<std::vector<GraphNode>>>;  // the node's parents
};

template <class B>
concept Backend = BackendBase<B> && (!B::caps.reserve_va || VmmCalls<B>) && (!B::caps.sleep || SleepCalls<B>) &&
                  (!B::caps.capture_graph || CaptureGraphCalls<B>);

// The type-erased backend the allocator holds.
class DeviceMemory {
 public:
  virtual ~DeviceMemory() = default;
  virtual BackendCaps caps() const = 0;
  virtual DeviceIndex device() const = 0;
  virtual Result<DevicePtr> malloc(Bytes n) = 0;
  virtual Status free(DevicePtr p) = 0;
  virtual Result<MemInfo> mem_get_info() = 0;
  virtual bool stream_valid(StreamId s) = 0;
  virtual Result<EventHandle> event_create() = 0;
  virtual Status event_record(EventHandle e, StreamId s) = 0;
  virtual Result<bool> event_query(EventHandle e) = 0;
  virtual Status event_synchronize(EventHandle e) = 0;
  virtual void event_destroy(EventHandle e) = 0;
  virtual Result<DevicePtr> reserve(Bytes n) = 0;
  virtual Status unreserve(DevicePtr p, Bytes n) = 0;
  virtual Status map(DevicePtr p, Bytes n) = 0;
  virtual Status unmap(DevicePtr p, Bytes n) = 0;
  // The sleep calls (caps().sleep): a wrapper that does not forward them has none.
  virtual Result<void*> host_alloc(Bytes) { return {Status::error("backend has no pinned host memory"), nullptr}; }
  virtual void host_free(void*) {}
  // Gives back the pinned buffers a backend keeps between sleeps (none that holds a backup): their
  // bytes. CachingAllocator::release_backup_buffers calls it; empty_cache does not.
  virtual Bytes host_trim() { return 0; }
  virtual Status copy_to_host(void*, DevicePtr, Bytes) { return Status::error("backend cannot copy to the host"); }
  virtual Status copy_to_device(DevicePtr, const void*, Bytes) { return Status::error("backend cannot copy to the device"); }
  virtual Status copy_synchronize() { return Status::error("backend cannot copy"); }
  virtual Status map_pieces(DevicePtr, Bytes) { return Status::error("backend cannot map memory"); }
  // The capture graph calls (caps().capture_graph).
  virtual Result<CaptureInfo> capture_info(StreamId) { return {Status::error("backend cannot read captures"), {}}; }
  virtual Result<std::vector<GraphNode>> node_dependencies(GraphNode) {
    return {Status::error("backend cannot read captures"), {}};
  }
};

// DeviceMemory over any Backend, owning it.
template <Backend B>
class BackendAdapter final : public DeviceMemory {
 public:
  template <class... Args>
  explicit BackendAdapter(Args&&... args) : b_(std::forward<Args>(args)...) {}
  B& backend() { return b_; }

  BackendCaps caps() const override { return B::caps; }
  DeviceIndex device() const override { return b_.device(); }
  Result<DevicePtr> malloc(Bytes n) override { return b_.malloc(n); }
  Status free(DevicePtr p) override { return b_.free(p); }
  Result<MemInfo> mem_get_info() override { return b_.mem_get_info(); }
  bool stream_valid(StreamId s) override { return b_.stream_valid(s); }
  Result<EventHandle> event_create() override { return b_.event_create(); }
  Status event_record(EventHandle e, StreamId s) override { return b_.event_record(e, s); }
  Result<bool> event_query(EventHandle e) override { return b_.event_query(e); }
  Status event_synchronize(EventHandle e) override { return b_.event_synchronize(e); }
  void event_destroy(EventHandle e) override { b_.event_destroy(e); }
  Result<DevicePtr> reserve(Bytes n) override {
    if constexpr (B::caps.reserve_va) return b_.reserve(n);
    else return {Status::error("backend cannot reserve address space"), 0};
  }
  Status unreserve(DevicePtr p, Bytes n) override {
    if constexpr (B::caps.reserve_va) return b_.unreserve(p, n);
    else return Status::error("backend cannot reserve address space");
  }
  Status map(DevicePtr p, Bytes n) override {
    if constexpr (B::caps.reserve_va) return b_.map(p, n);
    else return Status::error("backend cannot map memory");
  }
  Status unmap(DevicePtr p, Bytes n) override {
    if constexpr (B::caps.reserve_va) return b_.unmap(p, n);
    else return Status::error("backend cannot unmap memory");
  }
  Result<void*> host_alloc(Bytes n) override {
    if constexpr (B::caps.sleep) return b_.host_alloc(n);
    else return {Status::error("backend has no pinned host memory"), nullptr};
  }
  void host_free(void* h) override {
    if constexpr (B::caps.sleep) b_.host_free(h);
  }
  Bytes host_trim() override {
    if constexpr (requires { b_.host_trim(); }) return b_.host_trim();
    else return 0;
  }
  Status copy_to_host(void* h, DevicePtr p, Bytes n) override {
    if constexpr (B::caps.sleep) return b_.copy_to_host(h, p, n);
    else return Status::error("backend cannot copy to the host");
  }
  Status copy_to_device(DevicePtr p, const void* h, Bytes n) override {
    if constexpr (B::caps.sleep) return b_.copy_to_device(p, h, n);
    else return Status::error("backend cannot copy to the device");
  }
  Status copy_synchronize() override {
    if constexpr (B::caps.sleep) return b_.copy_synchronize();
    else return Status::error("backend cannot copy");
  }
  Status map_pieces(DevicePtr p, Bytes n) override {
    if constexpr (B::caps.sleep) return b_.map_pieces(p, n);
    else return Status::error("backend cannot map memory");
  }
  Result<CaptureInfo> capture_info(StreamId s) override {
    if constexpr (B::caps.capture_graph) return b_.capture_info(s);
    else return {Status::error("backend cannot read captures"), {}};
  }
  Result<std::vector<GraphNode>> node_dependencies(GraphNode n) override {
    if constexpr (B::caps.capture_graph) return b_.node_dependencies(n);
    else return {Status::error("backend cannot read captures"), {}};
  }

 private:
  B b_;
};

template <Backend B, class... Args>
std::unique_ptr<DeviceMemory> make_device_memory(Args&&... args) {
  return std::make_unique<BackendAdapter<B>>(std::forward<Args>(args)...);
}

}  // namespace cachet::gpu

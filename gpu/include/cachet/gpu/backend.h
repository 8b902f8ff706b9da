// cachet/gpu/backend.h: device memory behind one small interface (docs/pytorch-allocator.md
// §3.2, §6, §7).
//
// A backend gives the allocator exactly what PyTorch's allocator asks of the CUDA driver:
//   segments   malloc / free                         (cudaMalloc / cudaFree)
//   memory     mem_get_info                          (cudaMemGetInfo: free and total bytes)
//   events     event_create / record / query / synchronize / destroy (stream uses, §6)
//   VMM        reserve / unreserve / map / unmap      (expandable segments, §7),
//              only when caps.reserve_va is set
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

#include "cachet/types.h"

namespace cachet::gpu {

using DevicePtr = std::uint64_t;    // device address; 0 = none
using EventHandle = std::uint64_t;  // backend-defined event id (cudaEvent_t value on CUDA)

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
};

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

template <class B>
concept Backend = BackendBase<B> && (!B::caps.reserve_va || VmmCalls<B>);

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

 private:
  B b_;
};

template <Backend B, class... Args>
std::unique_ptr<DeviceMemory> make_device_memory(Args&&... args) {
  return std::make_unique<BackendAdapter<B>>(std::forward<Args>(args)...);
}

}  // namespace cachet::gpu

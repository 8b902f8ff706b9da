// cachet/gpu/host_backend.h: the host simulation backend. No device: synthetic addresses,
// a configurable capacity, simulated streams and events.
//
// Addresses: by default segments get deterministic synthetic addresses (bump allocation,
// 2 MiB aligned, never reused). In recorded-address mode (`HostOptions::recorded`) the
// backend replays the addresses PyTorch's driver returned, in order, as an oracle recording's
// trace lists them (segment_alloc and segment_map addresses, in trace order):
//   malloc    takes the next address;
//   reserve   returns the next address without taking it: a new expandable segment's first
//             mapping is always at its base (docs/pytorch-allocator.md §7), and that map takes it;
//   map       takes the next address and checks that it is the one asked for.
// Running out of recorded addresses, or a map at another address, is a Status::error naming
// the position, so a replay that diverges says where.
//
// Events complete only when the test says so: complete_events(stream) or complete_all_events();
// event_synchronize completes the one event (a device would wait for it). With
// `HostOptions::events_complete_when_recorded` every event completes as soon as it is recorded,
// as on a real device that runs no kernels (what props_gpu_test drives): a cudaEventQuery right
// after the cudaEventRecord, within one allocator call, already reports it complete.
//
// All state lives in a shared HostSim so a test keeps a handle after giving the backend to
// the allocator; HostSim has its own mutex (test threads complete events concurrently).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "cachet/gpu/backend.h"

namespace cachet::gpu {

struct HostOptions {
  DeviceIndex device = 0;
  Bytes capacity = 80 * GiB;           // bytes the simulated device can hand out
  std::optional<Bytes> total_memory;   // cudaMemGetInfo's total (default: capacity)
  std::optional<std::vector<DevicePtr>> recorded;  // recorded-address mode
  DevicePtr first_address = 0x7f0000000000;        // synthetic mode: first segment
  bool events_complete_when_recorded = false;      // a device with no kernels queued
};

class HostSim {
 public:
  explicit HostSim(HostOptions opts = {});

  // --- the test's controls ---
  void complete_events(StreamId stream);  // every event recorded on `stream` so far completes
  void complete_all_events();
  // Streams belong to this device unless assigned to another one here.
  void set_stream_device(StreamId stream, DeviceIndex device);
  Bytes used() const;                      // bytes currently allocated or mapped
  std::size_t live_events() const;         // created and not destroyed
  std::size_t recorded_left() const;       // recorded-address mode: addresses not yet used
  const HostOptions& options() const { return opts_; }

  // --- the backend calls (see backend.h) ---
  DeviceIndex device() const { return opts_.device; }
  Result<DevicePtr> malloc(Bytes n);
  Status free(DevicePtr p);
  Result<MemInfo> mem_get_info();
  bool stream_valid(StreamId s);
  Result<EventHandle> event_create();
  Status event_record(EventHandle e, StreamId s);
  Result<bool> event_query(EventHandle e);
  Status event_synchronize(EventHandle e);
  void event_destroy(EventHandle e);
  Result<DevicePtr> reserve(Bytes n);
  Status unreserve(DevicePtr p, Bytes n);
  Status map(DevicePtr p, Bytes n);
  Status unmap(DevicePtr p, Bytes n);

 private:
  Result<DevicePtr> next_recorded(const char* what, bool take);

  mutable std::mutex mu_;
  HostOptions opts_;
  Bytes used_ = 0;
  DevicePtr bump_;
  DevicePtr va_bump_;
  std::size_t recorded_pos_ = 0;
  std::map<DevicePtr, Bytes> segments_;     // malloc'd
  std::map<DevicePtr, Bytes> reservations_;
  std::map<DevicePtr, Bytes> mappings_;     // mapped ranges
  struct Event {
    StreamId stream = 0;
    bool recorded = false;
    bool complete = false;
  };
  std::map<EventHandle, Event> events_;
  EventHandle next_event_ = 1;
  std::map<StreamId, DeviceIndex> stream_device_;
};

// The Backend over a shared HostSim.
class HostBackend {
 public:
  static constexpr BackendCaps caps{.reserve_va = true, .real_events = false, .granularity = 2 * MiB};
  explicit HostBackend(std::shared_ptr<HostSim> sim) : sim_(std::move(sim)) {}

  DeviceIndex device() const { return sim_->device(); }
  Result<DevicePtr> malloc(Bytes n) { return sim_->malloc(n); }
  Status free(DevicePtr p) { return sim_->free(p); }
  Result<MemInfo> mem_get_info() { return sim_->mem_get_info(); }
  bool stream_valid(StreamId s) { return sim_->stream_valid(s); }
  Result<EventHandle> event_create() { return sim_->event_create(); }
  Status event_record(EventHandle e, StreamId s) { return sim_->event_record(e, s); }
  Result<bool> event_query(EventHandle e) { return sim_->event_query(e); }
  Status event_synchronize(EventHandle e) { return sim_->event_synchronize(e); }
  void event_destroy(EventHandle e) { sim_->event_destroy(e); }
  Result<DevicePtr> reserve(Bytes n) { return sim_->reserve(n); }
  Status unreserve(DevicePtr p, Bytes n) { return sim_->unreserve(p, n); }
  Status map(DevicePtr p, Bytes n) { return sim_->map(p, n); }
  Status unmap(DevicePtr p, Bytes n) { return sim_->unmap(p, n); }

 private:
  std::shared_ptr<HostSim> sim_;
};
static_assert(Backend<HostBackend>);

// Convenience: a DeviceMemory over a new HostSim; `sim` (if given) receives the handle.
std::unique_ptr<DeviceMemory> make_host_memory(HostOptions opts = {},
                                               std::shared_ptr<HostSim>* sim = nullptr);

}  // namespace cachet::gpu

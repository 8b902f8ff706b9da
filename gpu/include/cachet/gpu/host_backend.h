// cachet/gpu/host_backend.h: the host simulation backend. No device: synthetic addresses,
// a configurable capacity, simulated streams and events.
//
// Addresses: by default segments get deterministic synthetic addresses (bump allocation,
// 2 MiB aligned, never reused). With `HostOptions::driver_like_addresses` they come as the CUDA
// driver hands out cudaMalloc addresses (docs/pytorch-allocator.md §3.2): a freed range of the same
// 2 MiB-rounded size is given again (the lowest such), else the range just below the lowest
// address handed out so far, so a newer segment lies below the older ones and best-fit ties
// between equal sizes (lowest address first) break as on the GPU. In recorded-address mode (`HostOptions::recorded`) the
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
// Contents (sleep and wake, docs/sleep-wake.md section 6): the memory of every malloc'd segment and
// mapped range can be written and read (write/read below, and the sleep calls' copies), so a
// backup, a restore and the undefined contents of a range woken without backup are observable.
// Freshly allocated or mapped memory reads as kFreshByte (0xA5); pages are kept in host memory
// only once written (4 KiB each), so an untouched 80 GiB simulation costs nothing. Pinned host
// buffers (host_alloc) are plain host memory, counted by pinned_bytes().
//
// Captures (docs/pytorch-allocator.md §14.10.1; host_capture.cpp): the test drives a simulated
// CUDA graph capture (capture_begin, wait_stream, kernel, capture_end), and the backend answers
// capture_info and node_dependencies from it, as cudaStreamGetCaptureInfo and
// cudaGraphNodeGetDependencies do: a capture begins on its origin stream with no dependencies; a
// stream that waits on a capturing stream joins its capture and depends on what that stream
// depends on (it grows by them when in the capture already); a kernel on a capturing stream is a
// new node that depends on the stream's dependencies and becomes its only one; the capture ends
// on its origin only when every other stream of it is joined back (each node it depends on is an
// ancestor-or-self of one the origin depends on), and then no stream of it captures. Refusals are
// Status::error naming the driver's error (cudaErrorStreamCaptureUnjoined, ...Isolation,
// ...Merge) and change nothing.
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
  bool driver_like_addresses = false;              // synthetic mode: as the driver (above)
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
  // Device contents: [p, p+n) must lie in malloc'd or mapped memory, else Status::error.
  static constexpr unsigned char kFreshByte = 0xA5;
  Status write(DevicePtr p, const void* src, Bytes n);
  Status fill(DevicePtr p, unsigned char byte, Bytes n);
  Status read(DevicePtr p, void* dst, Bytes n) const;
  Bytes pinned_bytes() const;             // host_alloc'd and not freed
  std::size_t map_piece_calls() const;    // map calls made by map_pieces (one per piece)
  std::size_t copies() const;             // copy_to_host and copy_to_device calls so far
  // CUDA graph captures (host_capture.cpp; see above).
  Status capture_begin(StreamId origin);               // cudaStreamBeginCapture
  Status capture_end(StreamId origin);                 // cudaStreamEndCapture
  Status wait_stream(StreamId waiter, StreamId waited);  // streams[waiter].wait_stream(streams[waited])
  void kernel(StreamId stream);                        // one kernel launched on the stream

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
  Result<void*> host_alloc(Bytes n);
  void host_free(void* h);
  Status copy_to_host(void* h, DevicePtr p, Bytes n);
  Status copy_to_device(DevicePtr p, const void* h, Bytes n);
  Status copy_synchronize() { return Status::ok(); }  // copies complete when made
  Status map_pieces(DevicePtr p, Bytes n);
  Result<CaptureInfo> capture_info(StreamId s);
  Result<std::vector<GraphNode>> node_dependencies(GraphNode n);

 private:
  Result<DevicePtr> next_recorded(const char* what, bool take);
  Status map_locked(DevicePtr p, Bytes n);
  bool backed_locked(DevicePtr p, Bytes n) const;  // [p, p+n) malloc'd or mapped
  void forget_contents_locked(DevicePtr p, Bytes n);  // whole 4 KiB pages of [p, p+n) read fresh again
  Status write_locked(DevicePtr p, const unsigned char* src, Bytes n, const unsigned char* fill);
  Status read_locked(DevicePtr p, unsigned char* dst, Bytes n) const;

  mutable std::mutex mu_;
  HostOptions opts_;
  Bytes used_ = 0;
  DevicePtr bump_;
  DevicePtr low_;                                  // driver-like: lowest address handed out
  std::set<std::pair<Bytes, DevicePtr>> freed_;    // driver-like: freed ranges (rounded size, base)
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
  static constexpr Bytes kContentPage = 4096;
  std::map<DevicePtr, std::unique_ptr<unsigned char[]>> contents_;  // written 4 KiB pages
  std::map<void*, Bytes> pinned_;
  Bytes pinned_bytes_ = 0;
  std::size_t map_piece_calls_ = 0;
  std::size_t copies_ = 0;
  // Captures: the streams capturing now (capture id, dependencies sorted), each capture's origin,
  // every captured node's dependencies (kept after its capture: the graph outlives it).
  struct StreamCapture {
    std::uint64_t capture = 0;
    std::vector<GraphNode> deps;
  };
  std::map<StreamId, StreamCapture> capturing_;
  std::map<std::uint64_t, StreamId> capture_origin_;
  std::map<GraphNode, std::vector<GraphNode>> node_parents_;
  std::uint64_t next_capture_ = 1;
  GraphNode next_node_ = 0x1000;
};

// The Backend over a shared HostSim.
class HostBackend {
 public:
  static constexpr BackendCaps caps{
      .reserve_va = true, .real_events = false, .granularity = 2 * MiB, .sleep = true, .capture_graph = true};
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
  Result<void*> host_alloc(Bytes n) { return sim_->host_alloc(n); }
  void host_free(void* h) { sim_->host_free(h); }
  Status copy_to_host(void* h, DevicePtr p, Bytes n) { return sim_->copy_to_host(h, p, n); }
  Status copy_to_device(DevicePtr p, const void* h, Bytes n) { return sim_->copy_to_device(p, h, n); }
  Status copy_synchronize() { return sim_->copy_synchronize(); }
  Status map_pieces(DevicePtr p, Bytes n) { return sim_->map_pieces(p, n); }
  Result<CaptureInfo> capture_info(StreamId s) { return sim_->capture_info(s); }
  Result<std::vector<GraphNode>> node_dependencies(GraphNode n) { return sim_->node_dependencies(n); }

 private:
  std::shared_ptr<HostSim> sim_;
};
static_assert(Backend<HostBackend>);

// Convenience: a DeviceMemory over a new HostSim; `sim` (if given) receives the handle.
std::unique_ptr<DeviceMemory> make_host_memory(HostOptions opts = {},
                                               std::shared_ptr<HostSim>* sim = nullptr);

}  // namespace cachet::gpu

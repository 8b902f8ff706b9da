// cachet/gpu/fault_backend.h: a fault-injecting wrapper around any DeviceMemory (a pipe
// stage, style note 3/10). It fails chosen device calls so tests can check that a failing
// device call never loses a block and never leaves the stats inconsistent.
//
// Call classes: Alloc (malloc, reserve, map, map_pieces: a wake's map), Event
// (event_create/record/query/synchronize), Free (free, unmap, unreserve), HostAlloc (host_alloc:
// a sleep's pinned backup buffer). The copies are never failed. A plan fails either the k-th call of a class (1-based,
// counted from when the plan is set) or each call with probability p from a seeded PRNG
// (deterministic for a seed). A failure is Status::oom (as cudaErrorMemoryAllocation) or
// Status::error (any other CUDA error).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <random>

#include "cachet/gpu/backend.h"

namespace cachet::gpu {

enum class CallClass : std::uint8_t { Alloc, Event, Free, HostAlloc };

struct FaultPlan {
  CallClass cls = CallClass::Alloc;
  std::uint64_t fail_kth = 0;   // fail the k-th call of cls (0 = off)
  double probability = 0.0;     // else fail each call of cls with this probability
  std::uint64_t seed = 1;
  bool as_oom = false;          // Status::oom instead of Status::error
  bool repeat = false;          // fail_kth: also every later call of cls
};

class FaultInjector final : public DeviceMemory {
 public:
  explicit FaultInjector(std::unique_ptr<DeviceMemory> inner) : inner_(std::move(inner)) {}

  void set_plan(const FaultPlan& plan);
  void clear();
  std::uint64_t failures() const;  // calls failed so far
  std::uint64_t calls(CallClass c) const;
  DeviceMemory& inner() { return *inner_; }

  BackendCaps caps() const override { return inner_->caps(); }
  DeviceIndex device() const override { return inner_->device(); }
  Result<DevicePtr> malloc(Bytes n) override;
  Status free(DevicePtr p) override;
  Result<MemInfo> mem_get_info() override { return inner_->mem_get_info(); }
  bool stream_valid(StreamId s) override { return inner_->stream_valid(s); }
  Result<EventHandle> event_create() override;
  Status event_record(EventHandle e, StreamId s) override;
  Result<bool> event_query(EventHandle e) override;
  Status event_synchronize(EventHandle e) override;
  void event_destroy(EventHandle e) override { inner_->event_destroy(e); }
  Result<DevicePtr> reserve(Bytes n) override;
  Status unreserve(DevicePtr p, Bytes n) override;
  Status map(DevicePtr p, Bytes n) override;
  Status unmap(DevicePtr p, Bytes n) override;
  Result<void*> host_alloc(Bytes n) override;
  void host_free(void* h) override { inner_->host_free(h); }
  Bytes host_trim() override { return inner_->host_trim(); }
  Status copy_to_host(void* h, DevicePtr p, Bytes n) override { return inner_->copy_to_host(h, p, n); }
  Status copy_to_device(DevicePtr p, const void* h, Bytes n) override { return inner_->copy_to_device(p, h, n); }
  Status copy_synchronize() override { return inner_->copy_synchronize(); }
  Status map_pieces(DevicePtr p, Bytes n) override;
  // The capture graph queries pass through, never failed.
  Result<CaptureInfo> capture_info(StreamId s) override { return inner_->capture_info(s); }
  Result<std::vector<GraphNode>> node_dependencies(GraphNode n) override { return inner_->node_dependencies(n); }

 private:
  // Counts the call; returns the failure to inject, or Ok.
  Status inject(CallClass c, const char* call);

  std::unique_ptr<DeviceMemory> inner_;
  mutable std::mutex mu_;
  bool active_ = false;
  FaultPlan plan_;
  std::mt19937_64 rng_;
  std::uint64_t counts_[4] = {0, 0, 0, 0};
  std::uint64_t since_plan_ = 0;
  std::uint64_t failures_ = 0;
};

}  // namespace cachet::gpu

// The "impl" replay engine (tools/engine.h): cachet::CachingAllocator (gpu/) on the host
// backend in recorded-address mode, so `cachet conform --engine impl|both` replays a recording
// through the production allocator. The driver addresses come from the recording's trace
// (segment_alloc and segment_map rows, in order); a device call the recording does not show
// surfaces as ReplayDivergence. The calls of op thread k (an allocation, entering use_mem_pool)
// run on an OS thread of their own (cachet/op_threads.h): gpu/'s use_mem_pool route takes the
// allocations of the OS thread that entered, as PyTorch's filter does (docs/pytorch-allocator.md
// §14.10.2). The capture graph (wait_stream, kernels, a capture's begin and end; §14.10.1) is the
// host backend's simulation (cachet/gpu/host_backend.h, "Captures"), which gpu/ reads through the
// backend as it reads cudaStreamGetCaptureInfo on a device.
#include <exception>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cachet/errors.h"
#include "cachet/gpu/allocator.h"
#include "cachet/gpu/host_backend.h"
#include "cachet/op_threads.h"
#include "engine.h"

namespace cachet::cli {
namespace {

class GpuEngine final : public ReplayEngine {
 public:
  explicit GpuEngine(const EngineSetup& s) {
    gpu::HostOptions o;
    o.capacity = s.total_memory;
    o.total_memory = s.total_memory;
    o.events_complete_when_recorded = true;  // engine.h
    std::vector<gpu::DevicePtr> addrs;
    for (const auto& e : s.device_events)
      if (e.action == TraceAction::SegmentAlloc || e.action == TraceAction::SegmentMap) addrs.push_back(e.addr);
    // policy:cachet (conform --policy cachet) makes its own device calls: synthetic addresses.
    if (s.config.policy != Policy::Cachet) o.recorded = std::move(addrs);
    alloc_ = std::make_unique<CachingAllocator>(gpu::make_host_memory(o, &sim_), s.config);
    // 13.4: fraction = cap / total before the first op; truncation gives back cap.
    if (s.cap > 0) alloc_->set_memory_fraction(static_cast<double>(s.cap) / static_cast<double>(s.total_memory));
    alloc_->set_trace(true);
  }
  std::uint64_t malloc(Bytes size, StreamId stream, ThreadIndex thread) override {
    return on_thread(thread, [&] {
      return guard([&] { return static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(alloc_->allocate(size, stream))); });
    });
  }
  void record_stream(std::uint64_t ptr, StreamId stream) override {
    alloc_->record_stream(reinterpret_cast<void*>(static_cast<std::uintptr_t>(ptr)), stream);
  }
  void free(std::uint64_t ptr) override {
    guard([&] {
      alloc_->free(reinterpret_cast<void*>(static_cast<std::uintptr_t>(ptr)));
      return 0;
    });
  }
  void empty_cache() override {
    guard([&] {
      alloc_->empty_cache();
      return 0;
    });
  }
  // Private pools (docs/pytorch-allocator.md §14). Where PyTorch 2.11 itself fails (§14.8) gpu/
  // refuses with PyTorchFailsHere; the replay reports it as PyTorch's failure.
  void create_or_incref_pool(PoolId id) override { alloc_->create_or_incref_pool(id); }
  // use_mem_pool: entered on the OS thread of the op thread that enters. A capture: the simulated
  // device begins capturing on its stream (a stream that captures already is refused first,
  // nothing changed); its end is refused while a stream that joined it is not joined back.
  void begin_allocate_to_pool(PoolId id, PoolRoute route) override {
    if (route.is_capture()) {
      if (sim_->capture_info(route.stream).value.capturing)
        throw UsageError("capture_begin on stream " + std::to_string(route.stream) +
                         ": the stream captures already (it joined another capture; docs/pytorch-allocator.md "
                         "§14.10.1)");
      alloc_->begin_allocate_to_pool(id, route);
      device(sim_->capture_begin(route.stream));
      capture_origin_[id] = route.stream;
      return;
    }
    on_thread(route.thread, [&] { return alloc_->begin_allocate_to_pool(id, route), 0; });
  }
  void end_allocate_to_pool(PoolId id) override {
    if (auto it = capture_origin_.find(id); it != capture_origin_.end()) {
      device(sim_->capture_end(it->second));  // cudaStreamEndCapture, then endAllocateToPool
      capture_origin_.erase(it);
    }
    alloc_->end_allocate_to_pool(id);
  }
  bool has_capture_graph() const override { return true; }
  void wait_stream(StreamId waiter, StreamId waited) override { device(sim_->wait_stream(waiter, waited)); }
  void kernel(StreamId stream) override { sim_->kernel(stream); }
  void configure(const std::string& text) override { (void)alloc_->configure(text); }
  void release_pool(PoolId id) override { alloc_->release_pool(id); }
  void empty_cache_of(PoolId id) override {
    guard([&] {
      alloc_->empty_cache(id);
      return 0;
    });
  }
  int pool_use_count(PoolId id) const override { return alloc_->pool_use_count(id); }
  // §14.10.3: the order of a batch of deferred frees, from the recording.
  std::vector<std::uint64_t> deferred_frees() const override {
    std::vector<std::uint64_t> out;
    for (void* p : alloc_->deferred_frees()) out.push_back(static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(p)));
    return out;
  }
  void set_deferred_free_order(const std::vector<std::uint64_t>& order) override {
    std::vector<void*> ptrs;
    for (std::uint64_t p : order) ptrs.push_back(reinterpret_cast<void*>(static_cast<std::uintptr_t>(p)));
    alloc_->set_deferred_free_order(ptrs);
  }
  std::vector<std::pair<StreamId, std::vector<std::uint64_t>>> event_queues() const override {
    std::vector<std::pair<StreamId, std::vector<std::uint64_t>>> out;
    for (const auto& [s, ptrs] : alloc_->event_queues()) {
      std::vector<std::uint64_t> addrs;
      for (void* p : ptrs) addrs.push_back(static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(p)));
      out.emplace_back(s, std::move(addrs));
    }
    return out;
  }
  void set_event_stream_order(const std::vector<StreamId>& order) override { alloc_->set_event_stream_order(order); }
  DeviceStats stats() const override { return alloc_->stats(); }
  Snapshot snapshot() const override { return alloc_->snapshot(); }
  // The snapshot events our own snapshot() calls add are not part of the replayed run.
  std::vector<TraceEvent> trace() const override {
    std::vector<TraceEvent> out;
    for (const auto& e : alloc_->trace())
      if (e.action != TraceAction::Snapshot) out.push_back(e);
    return out;
  }

 private:
  template <class F>
  static auto guard(F&& f) -> decltype(f()) {
    try {
      return f();
    } catch (const DeviceError& e) {  // recorded-address mode: a device call PyTorch did not make
      throw ReplayDivergence(e.what());
    } catch (const PyTorchFailsHere& e) {  // §14.8: where PyTorch 2.11 fails, gpu/ refuses
      throw PyTorchFailure(e.what());
    }
  }
  // A refusal of the simulated device's capture calls: the op is refused (UsageError).
  static void device(const gpu::Status& st) {
    if (!st.is_ok()) throw UsageError(st.message + " (docs/pytorch-allocator.md §14.10.1)");
  }
  // f() on op thread t's OS thread; its exception, if any, is thrown here.
  template <class F>
  auto on_thread(ThreadIndex t, F&& f) -> decltype(f()) {
    if (t == 0) return f();
    std::optional<decltype(f())> result;
    std::exception_ptr error;
    threads_.run(t, [&] {
      try {
        result.emplace(f());
      } catch (...) {
        error = std::current_exception();
      }
    });
    if (error) std::rethrow_exception(error);
    return std::move(*result);
  }
  std::shared_ptr<gpu::HostSim> sim_;
  std::unique_ptr<CachingAllocator> alloc_;
  std::map<PoolId, StreamId> capture_origin_;  // the captures under way: their streams
  OpThreads threads_;  // after alloc_: its threads end before the allocator goes
};

const bool gpu_registered =
    register_engine("impl", [](const EngineSetup& s) { return std::make_unique<GpuEngine>(s); });

}  // namespace
}  // namespace cachet::cli

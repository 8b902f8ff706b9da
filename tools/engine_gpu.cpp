// The "impl" replay engine (tools/engine.h): cachet::CachingAllocator (gpu/) on the host
// backend in recorded-address mode, so `cachet conform --engine impl|both` replays a recording
// through the production allocator. The driver addresses come from the recording's trace
// (segment_alloc and segment_map rows, in order); a device call the recording does not show
// surfaces as ReplayDivergence.
#include <memory>
#include <vector>

#include "cachet/errors.h"
#include "cachet/gpu/allocator.h"
#include "cachet/gpu/host_backend.h"
#include "engine.h"

namespace cachet::cli {
namespace {

class GpuEngine final : public ReplayEngine {
 public:
  explicit GpuEngine(const EngineSetup& s) {
    gpu::HostOptions o;
    o.capacity = s.total_memory;
    o.total_memory = s.total_memory;
    std::vector<gpu::DevicePtr> addrs;
    for (const auto& e : s.device_events)
      if (e.action == TraceAction::SegmentAlloc || e.action == TraceAction::SegmentMap) addrs.push_back(e.addr);
    // policy:cachet (conform --policy cachet) makes its own device calls: synthetic addresses.
    if (s.config.policy != Policy::Cachet) o.recorded = std::move(addrs);
    alloc_ = std::make_unique<CachingAllocator>(gpu::make_host_memory(o), s.config);
    // 13.4: fraction = cap / total before the first op; truncation gives back cap.
    if (s.cap > 0) alloc_->set_memory_fraction(static_cast<double>(s.cap) / static_cast<double>(s.total_memory));
    alloc_->set_trace(true);
  }
  std::uint64_t malloc(Bytes size, StreamId stream) override {
    return guard([&] { return reinterpret_cast<std::uintptr_t>(alloc_->allocate(size, stream)); });
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
  void begin_allocate_to_pool(PoolId id, PoolRoute route) override { alloc_->begin_allocate_to_pool(id, route); }
  void end_allocate_to_pool(PoolId id) override { alloc_->end_allocate_to_pool(id); }
  void release_pool(PoolId id) override { alloc_->release_pool(id); }
  void empty_cache_of(PoolId id) override {
    guard([&] {
      alloc_->empty_cache(id);
      return 0;
    });
  }
  int pool_use_count(PoolId id) const override { return alloc_->pool_use_count(id); }
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
  std::unique_ptr<CachingAllocator> alloc_;
};

const bool gpu_registered =
    register_engine("impl", [](const EngineSetup& s) { return std::make_unique<GpuEngine>(s); });

}  // namespace
}  // namespace cachet::cli

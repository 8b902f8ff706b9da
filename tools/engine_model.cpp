// The "model" replay engine (engine.h): model/'s Allocator over the recording's device addresses
// (model::RecordedSegmentSource, which throws model::Divergence, reported as ReplayDivergence,
// where the model asks for what the recording does not show). The "impl" engine, gpu/'s, is
// engine_gpu.cpp.
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cachet/config.h"
#include "cachet/model/allocator.h"
#include "cachet/model/segment_source.h"
#include "engine.h"

namespace cachet::cli {
namespace {

class ModelEngine final : public ReplayEngine {
 public:
  explicit ModelEngine(const EngineSetup& s)
      : source_(s.device_events, s.total_memory), alloc_(s.config, source_) {
    alloc_.set_events_complete_when_recorded(true);  // engine.h
    // fraction = cap / total, applied before the first op; truncation gives back cap
    // (docs/pytorch-allocator.md §13.4).
    if (s.cap > 0)
      alloc_.set_memory_fraction(static_cast<double>(s.cap) / static_cast<double>(s.total_memory));
  }
  std::uint64_t malloc(Bytes size, StreamId stream, ThreadIndex thread) override {
    return guard([&] { return alloc_.malloc(size, stream, thread); });
  }
  void record_stream(std::uint64_t ptr, StreamId stream) override { alloc_.record_stream(ptr, stream); }
  void free(std::uint64_t ptr) override {
    guard([&] {
      alloc_.free(ptr);
      return 0;
    });
  }
  void empty_cache() override {
    guard([&] {
      alloc_.empty_cache();
      return 0;
    });
  }
  DeviceStats stats() const override { return alloc_.stats(); }
  Snapshot snapshot() const override { return alloc_.snapshot(); }
  std::vector<TraceEvent> trace() const override { return alloc_.trace(); }
  void create_or_incref_pool(PoolId id) override { alloc_.create_or_incref_pool(id); }
  void begin_allocate_to_pool(PoolId id, PoolRoute route) override { alloc_.begin_allocate_to_pool(id, route); }
  void end_allocate_to_pool(PoolId id) override { alloc_.end_allocate_to_pool(id); }
  void release_pool(PoolId id) override { alloc_.release_pool(id); }
  void empty_cache_of(PoolId id) override {
    guard([&] {
      alloc_.empty_cache(id);
      return 0;
    });
  }
  int pool_use_count(PoolId id) const override { return alloc_.pool_use_count(id); }
  std::vector<std::uint64_t> deferred_frees() const override { return alloc_.deferred_frees(); }
  void set_deferred_free_order(const std::vector<std::uint64_t>& order) override {
    alloc_.set_deferred_free_order(order);
  }
  std::vector<std::pair<StreamId, std::vector<std::uint64_t>>> event_queues() const override {
    return alloc_.event_queues();
  }
  void set_event_stream_order(const std::vector<StreamId>& order) override { alloc_.set_event_stream_order(order); }
  // The capture graph (docs/pytorch-allocator.md §14.10.1): the model's own.
  bool has_capture_graph() const override { return true; }
  void wait_stream(StreamId waiter, StreamId waited) override { alloc_.wait_stream(waiter, waited); }
  void kernel(StreamId stream) override { alloc_.kernel(stream); }
  void configure(const std::string& text) override {
    alloc_.set_allocator_settings(parse_config(text, ConfigSource::PyTorch, alloc_.config()).config);
  }

 private:
  template <class F>
  static auto guard(F&& f) -> decltype(f()) {
    try {
      return f();
    } catch (const model::Divergence& d) {
      throw ReplayDivergence(d.what());
    }
  }
  model::RecordedSegmentSource source_;
  model::Allocator alloc_;
};

const bool model_registered = register_engine(
    "model", [](const EngineSetup& s) { return std::make_unique<ModelEngine>(s); });

}  // namespace
}  // namespace cachet::cli

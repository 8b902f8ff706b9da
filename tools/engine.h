// tools/engine.h: a replay engine, the allocator a recording is replayed through. `cachet
// conform` (and later replays) drive engines by name: "model" (model/, registered in
// tools/engine_model.cpp) and "impl" (gpu/, registered by an adapter in
// tools/engine_gpu.cpp once gpu/ exists). An engine registers itself at static-initialisation time:
//
//   static const bool registered = cachet::cli::register_engine("impl", make_gpu_engine);
//
// The engine is given the device addresses PyTorch's driver returned (the recording's trace);
// a request the recording does not show (another size, one segment too many) throws
// ReplayDivergence. Out of memory throws cachet::OutOfMemory with PyTorch's message.
//
// Events complete as soon as they are recorded, as on the device the recordings were made on (no
// kernels queued: cudaEventQuery reports them complete, even within the call that recorded them;
// docs/pytorch-allocator.md §14.7). An op list's threads (`["a", id, size, s, t]`, `["pb", k, t]`,
// §14.10.2) reach the engine as the thread of malloc and of a use_mem_pool's PoolRoute. The order
// of a batch of deferred frees, and of the streams whose events one process_events walks, is taken
// from the recording too (§14.10.3; deferred_frees and event_queues below).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "cachet/config.h"
#include "cachet/errors.h"
#include "cachet/snapshot.h"
#include "cachet/stats.h"
#include "cachet/trace.h"
#include "cachet/types.h"

namespace cachet::cli {

// The engine asked the device for something other than what the recording shows.
class ReplayDivergence : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct EngineSetup {
  Config config;                   // the recording's conf, parsed
  Bytes total_memory = 0;          // the device's total_memory
  Bytes cap = 0;                   // set_per_process_memory_fraction(cap / total) before op 0; 0 = none
  std::vector<TraceEvent> device_events;  // the recording's trace (segment_* rows give addresses)
};

class ReplayEngine {
 public:
  virtual ~ReplayEngine() = default;
  // An allocation made by op thread `thread` (0: the main thread).
  virtual std::uint64_t malloc(Bytes size, StreamId stream, ThreadIndex thread) = 0;
  virtual void free(std::uint64_t ptr) = 0;
  virtual void record_stream(std::uint64_t ptr, StreamId stream) = 0;  // Tensor.record_stream (§6)
  virtual void empty_cache() = 0;
  virtual DeviceStats stats() const = 0;
  virtual Snapshot snapshot() const = 0;
  virtual std::vector<TraceEvent> trace() const = 0;

  // Private pools (docs/pytorch-allocator.md §14), PyTorch's allocator calls: createOrIncrefPool,
  // beginAllocateToPool, endAllocateToPool, releasePool, emptyCache(id), getPoolUseCount.
  // An engine without private pools refuses them (UsageError), changing nothing.
  virtual void create_or_incref_pool(PoolId) { no_pools(); }
  virtual void begin_allocate_to_pool(PoolId, PoolRoute) { no_pools(); }
  virtual void end_allocate_to_pool(PoolId) { no_pools(); }
  virtual void release_pool(PoolId) { no_pools(); }
  virtual void empty_cache_of(PoolId) { no_pools(); }
  virtual int pool_use_count(PoolId) const {
    no_pools();
    return 0;
  }

  // The frees a capture deferred (docs/pytorch-allocator.md §14.7), not yet processed: their
  // addresses in the order the engine's next batch takes them. PyTorch takes a batch in its hash
  // map's order, no function of the ops (§14.10.3): `cachet conform` reads it from the recording
  // (the order of the batch's free_completed rows) and gives it with set_deferred_free_order,
  // which reorders the pending batch (those named first, in that order, the rest as they were).
  // An engine that cannot be told lists none.
  virtual std::vector<std::uint64_t> deferred_frees() const { return {}; }
  virtual void set_deferred_free_order(const std::vector<std::uint64_t>&) {
    throw UsageError("this engine cannot take the order of deferred frees from a recording");
  }
  // The streams with pending events (§6), in the order the engine's next process_events walks
  // them, each with the addresses of its events' blocks in FIFO order. PyTorch walks its
  // cuda_events hash map keyed by cudaStream_t, an order of stream handles and no function of the
  // ops (§14.10.3): `cachet conform` reads it from the recording (the order of the free_completed
  // rows of the blocks the queues hold) and gives it with set_event_stream_order (those named
  // first, in that order, the rest as they were). An engine that cannot be told lists none.
  virtual std::vector<std::pair<StreamId, std::vector<std::uint64_t>>> event_queues() const { return {}; }
  virtual void set_event_stream_order(const std::vector<StreamId>&) {
    throw UsageError("this engine cannot take the order of streams' events from a recording");
  }

  // The device's side of a capture graph (docs/pytorch-allocator.md §14.10.1): streams[waiter].
  // wait_stream(streams[waited]) (a stream joins the capture of the stream it waits on) and one
  // kernel on a stream (a captured node while it captures). An engine without a capture graph
  // refuses them (UsageError), changing nothing.
  virtual bool has_capture_graph() const { return false; }
  virtual void wait_stream(StreamId, StreamId) { no_capture_graph(); }
  virtual void kernel(StreamId) { no_capture_graph(); }
  // torch.cuda.memory._set_allocator_settings(text): parsed over the current settings (§4.1).
  virtual void configure(const std::string&) {
    throw UsageError("this engine cannot change its allocator settings at run time; replay with --engine model");
  }

 private:
  [[noreturn]] static void no_capture_graph() {
    throw UsageError("this engine does not model a capture's graph (wait_stream, captured kernels: "
                     "docs/pytorch-allocator.md §14.10.1); replay with --engine model");
  }
  [[noreturn]] static void no_pools() {
    throw UsageError("this engine does not support private pools (MemPool, CUDA graph capture) yet; "
                     "replay with --engine model");
  }
};

using EngineFactory = std::function<std::unique_ptr<ReplayEngine>(const EngineSetup&)>;

bool register_engine(const std::string& name, EngineFactory factory);
// nullptr when no engine of that name was built in.
const EngineFactory* find_engine(const std::string& name);

}  // namespace cachet::cli

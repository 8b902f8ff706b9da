// gpu/src/shell/policy.h: what a policy is. A policy (policy:pytorch = PytorchPolicy,
// policy_pytorch/policy.h; policy:cachet = CachetPolicy, policy_cachet/policy.h) derives from Shell
// (shell.h), holds the rules that place blocks for one device and answers every call of the API
// layer; the API layer (api/allocator.cpp) reaches it only through PolicyCore::with_policy
// (api/policy_core.h), the one place that dispatches. No locking in a policy:
// every member runs with the API layer's mutex held (style note 11).
#pragma once

#include <concepts>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cachet/config.h"
#include "cachet/gpu/allocator.h"
#include "cachet/gpu/backend.h"
#include "cachet/snapshot.h"
#include "cachet/stats.h"
#include "cachet/trace.h"
#include "cachet/types.h"
#include "shell/shell.h"

namespace cachet::gpu::detail {

template <class P>
concept Policy = requires(P& p, const P& cp, Bytes n, StreamId s, DevicePtr ptr, double f, bool on,
                          const Config& c, PoolId id, const PoolFilter& filter) {
  // The operations (PyTorch's malloc, free, recordStream, emptyCache, setMemoryFraction).
  { p.malloc(n, s) } -> std::same_as<DevicePtr>;
  p.free(ptr);
  p.record_stream(ptr, s);
  p.empty_cache();
  p.set_memory_fraction(f);
  { cp.memory_fraction() } -> std::same_as<double>;
  // Private pools (docs/pytorch-allocator.md §14): createOrIncrefPool, beginAllocateToPool
  // (filter, capture), endAllocateToPool, releasePool, emptyCache(mempool_id), getPoolUseCount.
  p.create_or_incref_pool(id);
  p.begin_allocate_to_pool(id, filter, on);
  p.end_allocate_to_pool(id);
  p.release_pool(id);
  p.empty_cache(id);
  { cp.pool_use_count(id) } -> std::same_as<int>;
  // PyTorch's CUDAAllocator beyond the pools (docs/pytorch-allocator.md §15): a MemPool's own
  // segment source, setUseOnOOM, setNoSplit, cacheInfo's scan, getBaseAllocation, the graph
  // trees' checkpoints and checkPoolLiveAllocations.
  p.create_or_incref_pool(id, std::shared_ptr<SegmentSource>{});
  p.set_use_on_oom(id, on);
  p.set_no_split(id);
  { cp.largest_cached_block() } -> std::same_as<Bytes>;
  { cp.base_allocation(ptr, static_cast<Bytes*>(nullptr)) } -> std::same_as<DevicePtr>;
  { p.checkpoint_pool(id) } -> std::same_as<std::shared_ptr<const PoolCheckpoint>>;
  { p.restore_pool(*p.checkpoint_pool(id), std::vector<DevicePtr>{}) } -> std::same_as<CheckpointDelta>;
  { cp.pool_live_allocations_are(id, std::vector<DevicePtr>{}) } -> std::same_as<bool>;
  // Sleep and wake (docs/sleep-wake.md).
  { p.sleep(TagList{}, TagList{}) } -> std::same_as<Bytes>;
  p.wake(TagList{});
  { cp.sleeping() } -> std::same_as<TagList>;
  { cp.sleep_stats() } -> std::same_as<const SleepStats&>;
  // What can be read.
  { cp.stats() } -> std::same_as<const DeviceStats&>;
  p.reset_accumulated_stats();
  p.reset_peak_stats();
  { p.snapshot() } -> std::same_as<Snapshot>;
  p.set_trace(on);
  { cp.trace() } -> std::same_as<const std::vector<TraceEvent>&>;
  p.clear_trace();
  // Settings and checks.
  p.apply_config(c);
  { cp.config() } -> std::same_as<const Config&>;
  { cp.invariants() } -> std::same_as<std::vector<std::string>>;
  { p.memory() } -> std::same_as<DeviceMemory&>;
  { cp.device() } -> std::same_as<DeviceIndex>;
  { cp.total_memory() } -> std::same_as<Bytes>;
};

}  // namespace cachet::gpu::detail

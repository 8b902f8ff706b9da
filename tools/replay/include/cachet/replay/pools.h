// cachet/replay/pools.h: replaying a trace whose snapshot has private pools (CUDA graph captures,
// torch.cuda.MemPool with use_mem_pool; docs/pytorch-allocator.md §14) into those pools.
//
// § numbers refer to docs/pytorch-allocator.md. PyTorch 2.11's trace entries carry no pool id;
// the snapshot's segments do (segment_pool_id).
// route_to_pools infers from them which allocations went to which private pool and when each
// pool was entered and left, and adds BeginPool/EndPool actions to a prepared Trace:
//   - an allocation's pool is the pool of the segment its address lies in, following the trace's
//     segment_alloc/segment_free (segment_map/segment_unmap) events; a segment alive at the
//     snapshot has its recorded pool; one released before the snapshot has none: its
//     allocations are taken to be in the default pools (PoolInference::released_*);
//   - a pool is entered just before the first allocation of each run of its allocations and left
//     just after the last; every pool is left before an empty_cache() (PyTorch releases default-
//     pool segments only while no capture or use_mem_pool is under way, §14.6) and wherever an
//     allocation its route would take went elsewhere;
//   - how each window was entered (its PoolRoute): use_mem_pool (route: every stream) when its
//     allocations are on several streams; else a CUDA graph capture (route: that stream) when
//     the evidence says so (an id {n, 0}, which only a capture makes; the CUDA generator's two
//     8-byte seed and offset allocations in the default pool on the pool's stream just before
//     its first allocation, which only the first capture of a process makes, §14.9; an
//     allocation on another stream that went elsewhere while the pool was in use; another
//     window of the same pool that is a capture); else use_mem_pool (the trace cannot tell);
//   - use counts: each pool has one user from its first allocation to the end (never released);
//     each window adds one for its duration, as use_mem_pool does.
// With the routes so chosen, every allocation of the trace goes to the pool its segment says.
//
// An oracle recording needs none of this: its op list says when each pool was entered and left
// (route_recording_pools). Its pool and capture ops go through PyTorch's front end
// (cachet/front_end/pool_front_end.h) as `cachet conform` replays them, and become BeginPool
// (createOrIncrefPool first for a new MemPool), EndPool (use_mem_pool's exit also drops the
// window's user; capture_end keeps it) and ReleasePool (a MemPool dropped: releasePool, then
// emptyCache(id); a graph reset: releasePool) where the op list has them; the user's
// empty_cache() calls are the op list's. This also holds where no segment is left at the end to
// name a pool (docs/pytorch-allocator.md §14.6: an out-of-memory inside use_mem_pool, which frees
// nothing of the default pools).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cachet/types.h"

namespace cachet::replay {

// How a window of a private pool was entered, as far as the trace tells.
enum class PoolEntry : std::uint8_t {
  Capture,     // a CUDA graph capture: route = its stream (ReplayPool::capture_evidence says why)
  UseMemPool,  // use_mem_pool: its allocations are on several streams; route = every stream
  Unknown,     // one stream, nothing tells: replayed as use_mem_pool (route = every stream)
};

// One time a pool is entered (BeginPool .. EndPool).
struct PoolWindow {
  std::uint32_t pool = 0;  // PoolInference::pools index
  PoolRoute route;
  PoolEntry entry = PoolEntry::Unknown;
  // BeginPool first makes the pool (createOrIncrefPool: torch.cuda.MemPool(); inferred windows:
  // the first window of each pool, whose one user stays to the end).
  bool create = false;
  // EndPool also drops the window's user (releasePool: use_mem_pool's exit; inferred windows
  // too); a capture's capture_end keeps it until the graph's reset (ReleasePool).
  bool release_at_end = true;
};

// One private pool the snapshot names, as the replay enters it.
struct ReplayPool {
  PoolId id;
  std::uint64_t allocations = 0;  // trace allocations that went to it
  std::vector<StreamId> streams;  // theirs, in order
  std::uint64_t windows[3] = {0, 0, 0};  // its windows by PoolEntry
  std::string capture_evidence;  // why its one-stream windows are captures ("" when nothing tells)
  std::uint64_t end_segments = 0;  // its segments in the snapshot
  Bytes end_reserved = 0;          // their bytes
  Bytes end_allocated = 0;         // their allocated bytes
  std::uint32_t first_event = 0;   // its first and last allocation (trace event index)
  std::uint32_t last_event = 0;
};

// What route_to_pools inferred, and what it had to assume.
struct PoolInference {
  std::vector<ReplayPool> pools;  // by id
  std::vector<PoolWindow> windows;  // in the order they are entered
  // Segments released before the snapshot (so without a pool id): taken to be the default pools'.
  std::uint64_t released_segments = 0;
  Bytes released_bytes = 0;
  std::uint64_t released_allocations = 0;  // allocations in them
  // Allocations in no segment the trace or the snapshot shows (a trace recorded mid-run whose
  // segment was gone by the snapshot): taken to be in the default pools.
  std::uint64_t unplaced_allocations = 0;
  // Pools left before an empty_cache() (§14.6) and entered again after it: a run of a pool's
  // allocations split in two windows by an empty_cache().
  std::uint64_t split_by_empty_cache = 0;
  // An oracle recording's op list named its pools (route_recording_pools): its file name, and
  // the pool releases replayed (a MemPool dropped, a graph reset). Nothing above is inferred then.
  std::string op_list;
  std::uint64_t releases = 0;
  bool any() const { return !pools.empty(); }
};

}  // namespace cachet::replay

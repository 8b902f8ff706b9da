// cachet/gpu/allocator.h: cachet::CachingAllocator, the production allocator. One instance per
// device; PyTorch 2.11's observable behaviour under the `pytorch` policy (pointers, the 122
// stats, snapshot, trace events, OOM messages), on its own fast structures.
//
// Threads: any thread may call any member. One lock (gpu::SpinMutex) per allocator is taken here,
// in the API layer only (style note 11); the core never locks.
//
// Errors: bad input throws cachet::UsageError and changes nothing (free of an unknown,
// interior or already freed pointer, record_stream on a freed block, a stream of another
// device, a fraction outside [0, 1]); running out of memory throws cachet::OutOfMemory with
// PyTorch's message; a failing device call throws cachet::DeviceError and loses no block and
// leaves the stats consistent. With cachet_validate:True every operation ends with
// invariants(), and a violation throws InvariantViolation. Where PyTorch 2.11 itself fails with
// private pools (docs/pytorch-allocator.md §14.8) the operation throws PyTorchFailsHere (a
// UsageError) naming the rule, and nothing changes.
#pragma once

#include <functional>
#include <memory>
#include <mutex>

#include "cachet/gpu/spin_mutex.h"
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cachet/config.h"
#include "cachet/errors.h"
#include "cachet/gpu/backend.h"
#include "cachet/snapshot.h"
#include "cachet/stats.h"
#include "cachet/tags.h"
#include "cachet/trace.h"
#include "cachet/types.h"

namespace cachet {

// PyTorch's std::function<bool(cudaStream_t)> filter of beginAllocateToPool, on cachet's
// StreamId (a cudaStream_t's bits): which allocations an active private pool takes (§14.2).
using PoolFilter = std::function<bool(StreamId)>;

namespace gpu::detail {
class PolicyCore;  // the policy this allocator runs (policy:pytorch or policy:cachet)
}

namespace gpu {
// Where a private pool built with its own allocator gets its segments (torch.cuda.MemPool(
// allocator=...), PyTorch's createOrIncrefPool(device, id, allocator)): each new segment of that
// pool comes from allocate() instead of cudaMalloc, and goes back through release() instead of
// cudaFree (docs/pytorch-allocator.md §15.1). allocate() returns nullptr when it has no memory:
// the allocator then takes its out-of-memory path, as for a failing cudaMalloc. An exception
// from either passes through the allocator, which has changed nothing at that point. Both are
// called with the allocator's lock held (as PyTorch calls raw_alloc and raw_delete under its
// own): they must not call back into this allocator.
struct SegmentSource {
  virtual ~SegmentSource();
  virtual void* allocate(Bytes size, DeviceIndex device, StreamId stream) = 0;
  virtual void release(void* ptr, Bytes size, DeviceIndex device, StreamId stream) = 0;
};
}  // namespace gpu

// A private pool's segments and blocks as checkpoint_pool found them (PyTorch's PrivatePoolState,
// docs/pytorch-allocator.md §15.3): for each segment of the pool, its blocks in address order with
// their size and whether they were allocated. Like PyTorch's, it holds neither the use count nor
// the device allocation count (a restore changes neither). Read-only; restore_pool takes it back.
struct PoolCheckpoint {
  struct BlockState {
    void* ptr = nullptr;
    Bytes size = 0;
    bool allocated = false;
    bool mapped = true;  // false: the unmapped rest of an expandable segment
  };
  struct SegmentState {
    bool is_small = false;
    bool expandable = false;
    std::vector<BlockState> blocks;
  };
  PoolId id;
  std::vector<SegmentState> segments;  // by segment base address
};

// What restore_pool changed (PyTorch's CheckpointDelta): the allocations it freed (every block of
// the pool that was allocated before the restore) and the blocks the checkpoint has allocated,
// allocated again, with their sizes (the caller wraps them in DataPtrs).
struct CheckpointDelta {
  std::vector<void*> freed;
  std::vector<std::pair<void*, Bytes>> allocated;
};

// invariants() found a violation in validate mode: an allocator bug, not bad input.
class InvariantViolation : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

// An operation at which PyTorch 2.11 itself fails (docs/pytorch-allocator.md §14.8: the
// expandable segments' device allocation count of a private pool; giving memory back during a
// CUDA graph capture; destroying a MemPool while another pool is active). gpu/ refuses it
// instead of aborting: what() names the rule, and the allocator's state and stats are unchanged.
class PyTorchFailsHere : public UsageError {
 public:
  using UsageError::UsageError;
};

class CachingAllocator {
 public:
  // An allocator over `memory` (one device). Throws DeviceError if the device cannot report
  // its memory, UsageError if the config asks for something the backend cannot do.
  explicit CachingAllocator(std::unique_ptr<gpu::DeviceMemory> memory, Config config = {});
  // The CUDA backend for `device` (VMM when config.expandable_segments). Throws DeviceError
  // when CUDA is unavailable (built without CUDA, no driver, no such device).
  static std::unique_ptr<CachingAllocator> for_cuda_device(DeviceIndex device, Config config = {});
  // Config from CACHET_ALLOC_CONF / PYTORCH_CUDA_ALLOC_CONF / PYTORCH_ALLOC_CONF.
  static Config config_from_environment();
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // PyTorch's malloc: size 0 returns nullptr; sizes >= 1 EiB throw OutOfMemory ("more than 1EB").
  void* allocate(Bytes size, StreamId stream);
  // PyTorch's free; nullptr is ignored.
  void free(void* ptr);
  // Tensor.record_stream: `ptr` (as allocate returned it) is used on `stream`.
  void record_stream(void* ptr, StreamId stream);
  // torch.cuda.empty_cache(): the default pools and every freeable private pool (§3.4, §14.6).
  void empty_cache();
  // Private pools (docs/pytorch-allocator.md §14), PyTorch's names. UsageError, changing nothing,
  // for bad use: the default id {0, 0}, an unknown pool, a pool already active or not active, a
  // use count already 0.
  // createOrIncrefPool: a new pool with use count 1, or one more user of a live one (§14.4).
  void create_or_incref_pool(PoolId id);
  // createOrIncrefPool(device, id, allocator): a new pool whose segments come from `source`
  // (§15.1); expandable segments never apply to it. A null source is create_or_incref_pool(id).
  // UsageError for a source given to a pool that exists (PyTorch asserts), and under
  // policy:cachet (its blocks all live in its one address reservation).
  void create_or_incref_pool(PoolId id, std::shared_ptr<gpu::SegmentSource> source);
  // setUseOnOOM (§15.2): when an allocation outside every private pool finds no cached block and
  // the device refuses a new segment, it takes a free block of a pool marked here before any
  // cached memory is given back. Pools are tried in PyTorch's order (its hash set's).
  void set_use_on_oom(PoolId id, bool on);
  // setNoSplit (§15.2): blocks of pool `id` are never split; an allocation takes a whole block.
  void set_no_split(PoolId id);
  // beginAllocateToPool: one more user, then allocations whose stream `filter` takes go to pool
  // `id` (newest active pool first) until end_allocate_to_pool (§14.2). `capture`: a CUDA graph
  // capture (true) or use_mem_pool (false); it only changes what is refused while it is under
  // way (§14.8.2); the plug-in cannot tell and passes false.
  void begin_allocate_to_pool(PoolId id, PoolFilter filter, bool capture = false);
  // Replays and tests: a capture route takes its stream (and, where the backend reads captures,
  // every stream of that stream's capture, §14.10.1); a use_mem_pool route (CurrentThread) takes
  // the allocations of the OS thread that calls this, as PyTorch's filter does (§14.10.2).
  void begin_allocate_to_pool(PoolId id, PoolRoute route);
  void end_allocate_to_pool(PoolId id);  // endAllocateToPool; keeps the user
  // releasePool: one user fewer; at 0 the pool's free segments may go back (§14.4-14.6).
  void release_pool(PoolId id);
  // emptyCache(mempool_id), a MemPool's destructor: that pool's free segments if all its users
  // released it (§14.6); the default id is empty_cache().
  void empty_cache(PoolId id);
  int pool_use_count(PoolId id) const;  // getPoolUseCount
  bool has_pool(PoolId id) const;       // pool_use_count(id) would answer (not refuse)
  // The frees a capture deferred (§14.7) and not yet processed: their pointers, in the order the
  // next batch takes them (the order the frees were made, unless set_deferred_free_order said
  // otherwise). policy:cachet: its own deferred frees (R12), in the order they were made.
  std::vector<void*> deferred_frees() const;
  // Replays (cachet conform): PyTorch walks one batch of deferred frees in its hash map's order, a
  // function of heap addresses and not of the calls (§14.10.3), so a replay takes it from its
  // recording. The pending batch is reordered: the blocks at `order` first, in that order, then
  // the others in the order they were freed (frees deferred later come after them). An empty order
  // changes nothing. UsageError, nothing changed, for a pointer that is no pending deferred free or
  // is named twice, and under policy:cachet (which takes them in the order they were made).
  void set_deferred_free_order(const std::vector<void*>& order);
  // The streams with events still pending (§6), in the order the next process_events walks them
  // (by stream value unless set_event_stream_order said otherwise), each with its events' blocks
  // in FIFO order. policy:cachet: none listed.
  std::vector<std::pair<StreamId, std::vector<void*>>> event_queues() const;
  // Replays (cachet conform): PyTorch walks its cuda_events hash map keyed by cudaStream_t, so the
  // order of streams in one process_events is the hash order of stream handles, no function of
  // the calls (§14.10.3); a replay takes it from its recording. The streams at `order` are walked
  // first, in that order, then the others as event_queues() listed them; a stream keeps its place
  // until its queue empties. An empty order changes nothing. UsageError, nothing changed, for a
  // stream with no pending events or one named twice, and under policy:cachet.
  void set_event_stream_order(const std::vector<StreamId>& order);
  // CUDA graph trees (§15.3). getCheckpointState: the pool's segments and blocks now (first
  // giving the frees deferred by a capture their events, as PyTorch does). UsageError for an
  // unknown or freeable pool, or a pool with a block still waiting for events.
  std::shared_ptr<const PoolCheckpoint> checkpoint_pool(PoolId id);
  // setCheckpointPoolState: frees every allocation of the pool (`stale_live` first: allocations
  // of the pool the caller knows are dead; each must be one), then allocates and frees blocks so
  // that the pool's checkpointed segments hold exactly the checkpoint's blocks, allocated where
  // it says so (requested size = block size, as PyTorch). Checked before anything changes:
  // UsageError (PyTorchFailsHere where PyTorch itself fails) and nothing changed.
  CheckpointDelta restore_pool(const PoolCheckpoint& cp, const std::vector<void*>& stale_live);
  // checkPoolLiveAllocations: the pool's allocated blocks are exactly `expected` (as a set).
  bool pool_live_allocations_are(PoolId id, const std::vector<void*>& expected) const;
  // cacheInfo(device, &largest) with largest = 0, as cuDNN calls it: the device's free memory
  // (cudaMemGetInfo) or the largest cached free block of any pool (default and private, small
  // and large), whichever is larger (§15.4). DeviceError if the device cannot report.
  Bytes largest_free_block() const;
  // The largest cached free block of any pool, 0 if none: cacheInfo with a nonzero *largest
  // reports max(*largest, largest_cached_block()).
  Bytes largest_cached_block() const;
  // getBaseAllocation (§15.4): the base of the segment holding the allocation `ptr` (as allocate
  // returned it) and, if `size` is not null, the segment's size (the sum of its blocks).
  // UsageError for an unknown pointer ("invalid device pointer"), for a block of an expandable
  // segment and under policy:cachet (their memory cannot be shared between processes).
  void* base_allocation(void* ptr, Bytes* size) const;
  // Sleep and wake (issue 24; the rules: docs/sleep-wake.md). Each needs cachet_sleep:True at
  // construction (else UsageError). Allocations carry the calling thread's current tag
  // (cachet::current_tag(), cachet/tags.h).
  // sleep: every segment (expandable segments: run of mapped pages) holding live blocks of a tag
  // in `tags` (every tag when empty), and every free cached one, gives its memory back to the
  // driver and keeps its addresses; the live blocks of tags in `backup_tags` (none when empty) are
  // first copied to pinned host memory. Returns the bytes given back. UsageError (nothing
  // changes) for a bad tag or while a capture or use_mem_pool is under way; OutOfMemory (nothing
  // changes, sleep.num_backup_failures + 1) when the pinned host memory cannot be had.
  Bytes sleep(const TagList& tags, const TagList& backup_tags);
  // wake: every sleeping range of a tag in `tags` (every tag when empty), and every one that held
  // no live block, gets new memory at its own addresses; backups are copied back. OutOfMemory
  // (naming the bytes needed) when the device or the cap refuses: everything stays asleep with its
  // backups (sleep.num_wake_ooms + 1), and a later wake can succeed.
  void wake(const TagList& tags);
  TagList sleeping() const;        // the tags with sleeping live blocks, sorted
  SleepStats sleep_stats() const;  // the 21 sleep.* keys (flatten, cachet/stats.h)
  // The pinned host buffers the backend keeps between sleeps, none that holds a backup, go back
  // (cudaFreeHost): their bytes (0 for a backend that keeps none). empty_cache() keeps them, so
  // the next sleep pays no cudaHostAlloc (docs/sleep-wake.md section 6). No cachet_sleep needed.
  Bytes release_backup_buffers();
  // Pins now the host buffers a sleep backing up `backup_tags` would pin for the live blocks of
  // those tags (kept by the backend as a wake's buffers are, given back by release_backup_buffers),
  // so the first sleep's backup costs a pinned copy only (docs/sleep-wake.md section 6). Returns
  // their bytes (0 when no live block has those tags; a backend that keeps no buffers, as the
  // host simulation without a keeping wrapper, gives them back at once).
  // UsageError without cachet_sleep or for a bad tag; OutOfMemory when host memory is short.
  Bytes prepare_backup_buffers(const TagList& backup_tags);
  // torch.cuda.set_per_process_memory_fraction: [0, 1]; 1 = no cap.
  void set_memory_fraction(double fraction);
  double memory_fraction() const;

  DeviceStats stats() const;
  void reset_accumulated_stats();
  void reset_peak_stats();
  std::string summary(bool abbreviated = false) const;  // torch.cuda.memory_summary()
  Snapshot snapshot();                                  // memory_snapshot(); records a snapshot event
  // Every mapped run with its blocks, as snapshot() lists them, plus what memory_snapshot() cannot
  // show: the runs of a private pool PyTorch erased with pages still mapped that begin with a free
  // block (docs/pytorch-allocator.md §14.8). Records nothing; for recounting the stats from the
  // blocks (props' stats-recount).
  Snapshot block_table() const;
  // digest(snapshot()) (cachet/snapshot_digest.h) without building the snapshot, and recording no
  // snapshot event: for checks that compare snapshots after every operation (the lockstep).
  std::uint64_t snapshot_digest() const;

  void set_trace(bool on);  // _record_memory_history(enabled="all") / (None)
  // PyTorch's trace trackers (cachet/trace.h TraceListener): `l` is told of every trace event as
  // it is made, trace on or off, with this allocator's lock held; a segment's free before the
  // device gives its memory back (and, if that fails, that the segment is still there), its
  // allocation after. Sleep and wake tell it of the memory they give back and get again (trace
  // unchanged; docs/sleep-wake.md section 3). An empty `l` stops it. `l` must not call into this
  // allocator and must not throw.
  void set_trace_listener(TraceListener l);
  std::vector<TraceEvent> trace() const;
  void clear_trace();

  // Runtime settings (_set_allocator_settings): parsed over the current config; on error
  // nothing changes. Returns the parser's warnings.
  std::vector<ConfigWarning> configure(std::string_view text);
  void configure_from_environment();
  Config config() const;

  // The numbered invariants (gpu/README.md) that do not hold now; empty when all hold.
  std::vector<std::string> invariants() const;

  DeviceIndex device() const;
  Bytes total_memory() const;
  gpu::DeviceMemory& device_memory();  // the backend (tests reach their HostSim through it)

 private:
  void validate(const char* op) const;  // mutex held

  mutable gpu::SpinMutex mu_;  // spin_mutex.h: why not std::mutex
  std::unique_ptr<gpu::detail::PolicyCore> core_;  // gpu/src/api/policy_core.h
  bool validate_ = false;
};

}  // namespace cachet

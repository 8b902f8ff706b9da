// cachet/model/allocator.h: PyTorch 2.11's DeviceCachingAllocator for one device, as a model.
//
// The public surface mirrors what PyTorch exposes: malloc (caching_allocator_alloc), free
// (caching_allocator_delete), record_stream, empty_cache, set_per_process_memory_fraction,
// memory_stats, memory_snapshot and the trace. Event completion is explicit: a block freed after
// record_stream() stays "active_pending_free" until complete_events() on each stream it was used
// on, followed by the next malloc (process_events) or a synchronizing call (§6).
// § numbers refer to docs/pytorch-allocator.md.
//
// Bad input (unknown or interior pointer, double free, record_stream on a freed block, an
// invalid fraction) throws cachet::UsageError and changes nothing. Out of memory throws
// cachet::OutOfMemory with PyTorch's message after PyTorch's state changes (num_ooms, the oom
// trace row, the blocks released on the way).
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <vector>

#include "cachet/config.h"
#include "cachet/snapshot.h"
#include "cachet/stats.h"
#include "cachet/trace.h"
#include "cachet/types.h"
#include "cachet/model/block.h"
#include "cachet/model/capture_graph.h"
#include "cachet/model/private_pool.h"
#include "cachet/model/segment_source.h"

namespace cachet::model {

class Allocator {
 public:
  // Applies config.per_process_memory_fraction (§3.6: only at construction) and records
  // max_split_size in the stats (§4.1). `source` must outlive the allocator.
  Allocator(const Config& config, SegmentSource& source, DeviceIndex device = 0);
  ~Allocator();
  Allocator(const Allocator&) = delete;
  Allocator& operator=(const Allocator&) = delete;

  // caching_allocator_alloc(size, stream). Size 0 returns 0 and changes nothing; sizes >= 1 EiB
  // throw OutOfMemory("... more than 1EB memory.") and change nothing.
  // `thread`: the op list's thread that allocates (a use_mem_pool takes only the allocations of
  // the thread that entered it, §14.10.2).
  std::uint64_t malloc(Bytes size, StreamId stream = 0, ThreadIndex thread = 0);
  // caching_allocator_delete(ptr). ptr must be the address malloc returned.
  void free(std::uint64_t ptr);
  // Tensor.record_stream(stream) on the allocated block at ptr.
  void record_stream(std::uint64_t ptr, StreamId stream);

  // Simulated event completion: every event recorded so far on `stream` has completed. Blocks
  // become free at the next malloc (process_events) or synchronizing call.
  void complete_events(StreamId stream);
  void complete_all_events();
  // The device completes every event as soon as it is recorded (a real device running no
  // kernels, as props_gpu_test drives it): an event recorded inside a call is already complete
  // when that same call queries it, as process_events does right after
  // insert_events_deferred_until_no_capture (§6, §14.7). Default false: events complete only at
  // complete_events / complete_all_events.
  void set_events_complete_when_recorded(bool on) { events_when_recorded_ = on; }

  // torch._C._accelerator_setAllocatorSettings(text), already parsed (§4.1): the new settings
  // apply from the next call on. memory_stats()["max_split_size"] keeps its construction value,
  // per_process_memory_fraction applies only at construction, and no_caching cannot change.
  void set_allocator_settings(const Config& config);

  // torch.cuda.empty_cache(): release_cached_blocks (§3.4) of the default pools and of every
  // freeable private pool (§14.6).
  void empty_cache();
  // emptyCache(id) with a private pool's id (a MemPool's destructor): that pool only, if freeable
  // (§14.6). The default id is empty_cache().
  void empty_cache(PoolId id);

  // Private pools (§14). createOrIncrefPool: a new pool (use_count 1) or one more user of a live
  // one; UsageError for the default id or a pool whose users all released it.
  void create_or_incref_pool(PoolId id);
  // beginAllocateToPool: create_or_incref_pool, then allocations that `route` takes go to the
  // pool until end_allocate_to_pool (§14.2). UsageError when the pool is already active.
  // A capture route (PoolRoute::CaptureStream) is a CUDA graph capture on its stream: beginning
  // it begins the capture (UsageError, nothing changed, when the stream captures already), ending
  // it ends the capture (UsageError, nothing changed, while a stream that joined it is not joined
  // back). The capture's pool takes the allocations of every stream of the capture (§14.10.1).
  void begin_allocate_to_pool(PoolId id, PoolRoute route);
  // endAllocateToPool. UsageError when the pool is not active.
  void end_allocate_to_pool(PoolId id);
  // releasePool: one user fewer; at 0 the pool becomes freeable (§14.4). UsageError for an
  // unknown pool or one already at 0.
  void release_pool(PoolId id);
  // The device's side of a capture graph (§14.10.1, cachet/model/capture_graph.h):
  // streams[waiter].wait_stream(streams[waited]) and one kernel on a stream. UsageError, nothing
  // changed, where the driver refuses the wait.
  void wait_stream(StreamId waiter, StreamId waited) { graphs_.wait_stream(waiter, waited); }
  void kernel(StreamId stream) { graphs_.kernel(stream); }
  // getPoolUseCount; UsageError for an unknown pool.
  int pool_use_count(PoolId id) const;
  // MemPool(use_on_oom=True), PyTorch's setUseOnOOM (§15.2): an allocation outside every private
  // pool that finds no cached block and gets no new segment borrows a free block of a marked pool
  // before any cached memory is released. UsageError for the default id.
  void set_use_on_oom(PoolId id, bool on);
  // MemPool(no_split=True), PyTorch's setNoSplit (§15.2): the pool's blocks are never split.
  void set_no_split(PoolId id);
  // Whether the pool is still known (live, or freeable with segments left).
  bool has_pool(PoolId id) const { return graph_pools_.contains(id); }
  // Any use_mem_pool or capture active (PyTorch's captures_underway is not empty, §14.7).
  bool capture_underway() const { return !captures_underway_.empty(); }
  // The frees a capture deferred (§14.7) and not yet processed: their addresses, in the order the
  // next batch takes them (the order the frees were made unless set_deferred_free_order said
  // otherwise).
  std::vector<std::uint64_t> deferred_frees() const;
  // PyTorch walks one batch of deferred frees in its hash map's order, a function of heap
  // addresses and not of the ops (§14.10.3); a replay takes that order from its recording. The
  // pending batch is reordered: the blocks at `order` first, in that order, then the others in the
  // order they were freed (frees deferred later come after them). An empty order changes nothing.
  // UsageError, nothing changed, for an address that is no pending deferred free or is named twice.
  void set_deferred_free_order(const std::vector<std::uint64_t>& order);
  // The streams with events still pending (§6), in the order the next process_events walks them,
  // each with the addresses of its events' blocks in its FIFO order: by stream id, unless
  // set_event_stream_order said otherwise.
  std::vector<std::pair<StreamId, std::vector<std::uint64_t>>> event_queues() const;
  // PyTorch walks its cuda_events hash map keyed by cudaStream_t: the order of the streams in one
  // process_events (or synchronize_and_free_events) is the hash order of stream handles, no
  // function of the ops (§14.10.3); a replay takes it from its recording. The streams at `order`
  // are walked first, in that order, then the others as event_queues() listed them; a stream
  // keeps its place until its queue empties. An empty order changes nothing. UsageError, nothing
  // changed, for a stream with no pending events or one named twice.
  void set_event_stream_order(const std::vector<StreamId>& order);
  // torch.cuda.set_per_process_memory_fraction (§3.6): in [0, 1], else UsageError.
  void set_memory_fraction(double fraction);
  double memory_fraction() const;
  std::optional<Bytes> allowed_memory_maximum() const { return allowed_max_; }

  const DeviceStats& stats() const { return stats_; }
  void reset_accumulated_stats() { stats_.reset_accumulated(); }
  void reset_peak_stats() { stats_.reset_peak(); }
  // torch.cuda.memory_snapshot(): segments by address (§8).
  Snapshot snapshot() const;
  // digest(snapshot()) (cachet/snapshot_digest.h), from the blocks without building the snapshot.
  std::uint64_t snapshot_digest() const;
  const std::vector<TraceEvent>& trace() const { return trace_; }
  const Config& config() const { return config_; }
  // Bytes obtained from the device (PyTorch's total_allocated_memory).
  Bytes total_allocated_memory() const { return total_allocated_; }

  // Throws std::logic_error naming the first broken invariant (block.h, §5.3 consistency).
  void check_invariants() const;

  // Sleep and wake (issue 24; the rules are docs/sleep-wake.md, not PyTorch's): sleep.cpp.
  // sleep: every mapped run (a cudaMalloc segment) whose live blocks all carry a tag of `tags`
  // (every tag when empty), and every run with no live block, gives its memory back (the source's
  // unmap) and keeps its addresses; the live blocks of tags in `backup_tags` are backed up.
  // Returns the bytes given back. UsageError, nothing changed: a capture or use_mem_pool under
  // way. A mapped run
  // of an expandable segment sleeps as one range (its pages go back in one unmap).
  Bytes sleep(const TagList& tags, const TagList& backup_tags);
  // wake: every sleeping run with a live block of a tag in `tags` (every tag when empty), and every
  // sleeping run with no live block, maps memory at its addresses again (the source's map).
  // OutOfMemory when the source or the cap refuses any of it: everything stays asleep.
  void wake(const TagList& tags);
  // The tags with sleeping live blocks, sorted.
  TagList sleeping() const;
  const SleepStats& sleep_stats() const { return sleep_stats_; }

 private:
  struct AllocParams {
    StreamId stream = 0;
    Bytes size = 0;        // rounded request
    Bytes alloc_size = 0;  // segment size for a new device allocation
    BlockPool* pool = nullptr;
    Block* block = nullptr;
    // PyTorch's is_expandable_segments_active: the setting, except in the use_on_oom fallback's
    // search, which runs with it off (§15.2).
    bool expandable = false;
    ThreadIndex thread = 0;  // the op list's thread that allocates (§14.10.2)
  };
  struct Event {
    std::uint64_t seq;
    Block* block;
  };

  // malloc.cpp
  bool get_free_block(AllocParams& p);
  bool alloc_block(AllocParams& p, bool is_retry);
  bool should_split(const Block* b, Bytes size, bool expandable) const;
  // mempool_options.cpp (§15.2)
  bool try_mempool_fallback(AllocParams& p);
  bool never_splits(const BlockPool& pool) const;
  // oversize_allocations / oversize_segments count sizes of max_split_size or more (§5.3).
  bool is_oversize(Bytes size) const;
  Block* alloc_found_block(AllocParams& p, Bytes orig_size, bool split_remainder);
  [[noreturn]] void raise_oom(const AllocParams& p);
  // free.cpp
  void free_block(Block* b);
  Bytes try_merge_blocks(Block* dst, Block* src, BlockPool& pool);
  // events.cpp
  void insert_events(Block* b);
  void process_events();
  // With a pool: only the events of that private pool's blocks (§14.6).
  void synchronize_and_free_events(const PrivatePool* pool = nullptr);
  // private_pool.cpp
  BlockPool& get_pool(Bytes size, StreamId stream, ThreadIndex thread);
  void insert_events_deferred_until_no_capture();
  void release_private_pools(PoolId id);
  void forget_pool(PrivatePool* pp);  // release.cpp
  void count_device_alloc(BlockPool& pool);
  void count_device_free(BlockPool& pool, const char* where);
  void refuse_device_free_in_capture(const char* what) const;
  // graph_capture_record_stream_reuse: a free during a capture whose block's streams capture
  // into different graphs trips record_free_markers' assertion (§14.8 case 4, §14.10.1).
  void refuse_free_markers_across_graphs(const Block& block) const;
  // capture_reuse.cpp (graph_capture_record_stream_reuse, §14.10.1).
  // Whether `route` takes an allocation on stream `s` by thread `t`: a capture's route takes
  // every stream capturing into its capture (CUDAGraph's filter: the stream's capture id).
  bool route_takes(const PoolRoute& route, StreamId s, ThreadIndex t) const;
  // The free markers of a block freed during a capture: the union of the terminals of its
  // allocation stream and of its use streams; none when one of them does not capture.
  std::vector<NodeId> record_free_markers(const Block& block) const;
  // malloc's step during a capture: the deferred blocks allocated on `stream` whose markers are
  // all ancestors-or-self of what the stream depends on go through free_block.
  void free_safe_blocks_in_capture(StreamId stream);
  Bytes private_pool_free_bytes() const;
  // The default and the known private pools (what PyTorch can reach), and with `orphaned` the
  // orphaned pools too (every block the model holds).
  template <class F>
  void for_each_block_pool(F&& f, bool orphaned = false) const {
    f(large_blocks_);
    f(small_blocks_);
    for (const auto& [id, pp] : graph_pools_) {
      f(pp->large);
      f(pp->small);
    }
    if (!orphaned) return;
    for (const auto& pp : orphaned_pools_) {
      f(pp->large);
      f(pp->small);
    }
  }
  // snapshot.cpp: snapshot() is PyTorch's view; with `orphaned`, every mapped run.
  Snapshot snapshot_of(bool orphaned) const;
  // The first block of each mapped run snapshot_of(orphaned) shows, in address order.
  std::vector<const Block*> run_heads(bool orphaned) const;
  // release.cpp
  void release_cached_blocks(PoolId id = PoolId{});
  void release_blocks(BlockPool& pool);
  // `asleep`: the segment sleeps (docs/sleep-wake.md): its memory went back at the sleep, only its
  // addresses go back now.
  void release_block(Block* b, bool asleep = false);
  // sleep.cpp: empty_cache's part of sleep: the pool's sleeping runs with no live block go back
  // entirely, as release_blocks gives back an awake free segment (or run) of the pool.
  void release_sleeping_blocks(BlockPool& pool);
  bool release_available_cached_blocks(const AllocParams& p);
  void garbage_collect_cached_blocks();
  // expandable.cpp
  Block* try_allocate_expandable_block(AllocParams& p);
  Block* find_expandable_block(StreamId stream, BlockPool& pool, Bytes size);
  bool map_block(Block* to_map, Bytes size);
  void unmap_block(Block* b, bool asleep = false);  // asleep: no device call (a sleeping run)
  void release_expandable_segment(Block* b);

  // Shared helpers.
  Block* new_block(BlockState born = BlockState::Free);  // Free or Unmapped ([INV-STATE-1])
  void delete_block(Block* b);                           // Free or Unmapped blocks only
  StatType stat_type(const BlockPool& pool) const {
    return pool.is_small ? StatType::SmallPool : StatType::LargePool;
  }
  void record(TraceAction a, std::uint64_t addr, Bytes size, StreamId stream) {
    trace_.push_back(TraceEvent{a, addr, size, stream, 0});
  }
  bool gc_enabled() const {
    return allowed_max_.has_value() && config_.garbage_collection_threshold > 0.0;
  }
  Block* find_active(std::uint64_t ptr) const;

  Config config_;
  SegmentSource& source_;
  DeviceIndex device_;
  DeviceStats stats_;
  BlockPool large_blocks_{false};
  BlockPool small_blocks_{true};
  // Allocated and AwaitingEvents blocks, by address (addresses are unique device-wide).
  std::map<std::uint64_t, Block*> active_blocks_;
  std::map<const Block*, std::unique_ptr<Block>> owned_;
  std::vector<std::unique_ptr<ExpandableSegment>> expandable_segments_;
  // Per stream, FIFO: the events recorded on that stream (§6). Streams in id order.
  std::map<StreamId, std::deque<Event>> cuda_events_;
  // Streams walked first, in this order (set_event_stream_order; §14.10.3); the others after, by id.
  std::vector<StreamId> event_stream_order_;
  std::vector<StreamId> event_walk_order() const;
  std::map<StreamId, std::uint64_t> completed_upto_;  // events with seq < this have completed
  std::uint64_t next_event_seq_ = 0;
  bool events_when_recorded_ = false;
  Bytes total_allocated_ = 0;
  std::optional<Bytes> allowed_max_;
  std::vector<TraceEvent> trace_;
  // Private pools (§14): every known pool by id; the freeable ones (use_count 0) in PyTorch's
  // release order; the active ones, newest last (get_pool searches newest first); the frees
  // that wait for the end of the captures (Deferred blocks, in the order they were freed, or
  // as set_deferred_free_order arranged them).
  std::map<PoolId, std::unique_ptr<PrivatePool>> graph_pools_;
  // Pools erased with mapped pages still in them (release.cpp forget_pool, §14.8.1): kept alive
  // for their blocks, known to nothing else.
  std::vector<std::unique_ptr<PrivatePool>> orphaned_pools_;
  FreeableOrder graph_pools_freeable_;
  std::vector<std::pair<PoolId, PoolRoute>> captures_underway_;
  std::vector<Block*> deferred_blocks_;
  // graph_capture_record_stream_reuse (§14.10.1): the captures' graphs; each deferred block's free
  // markers (absent or empty: it waits for the end of the captures); per capture and stream the
  // nodes visited by free_safe_blocks_in_capture (PyTorch's graph_reuse_context, dropped at the
  // capture's end).
  CaptureGraphs graphs_;
  std::map<const Block*, std::vector<NodeId>> free_markers_;
  std::map<CaptureId, std::map<StreamId, std::set<NodeId>>> visited_;
  // setUseOnOOM's ids, walked in PyTorch's hash-set order; setNoSplit's ids (§15.2). Kept by id,
  // as in PyTorch: a mark outlives its pool.
  PoolIdOrder use_on_oom_pools_;
  std::set<PoolId> no_split_pools_;
  // sleep.cpp: the sleeping runs by base address; a run's tag is that of its live blocks at the
  // sleep, "" when it had none.
  struct SleepingRange {
    Bytes size = 0;
    Tag tag;
    bool backed_up = false;
  };
  std::map<std::uint64_t, SleepingRange> sleeping_;
  SleepStats sleep_stats_;
  // The sleeping run `b` belongs to, or null.
  const SleepingRange* sleeping_range_of(const Block* b) const;
  static const Block* run_head(const Block* b);
  // The mapped block at `ptr` (the head of a run), or null.
  Block* mapped_block_at(std::uint64_t ptr) const;
  // Whether an expandable segment may not grow through `b` while a run sleeps: a block of a
  // sleeping run, or an unmapped block touching one (growth never maps into a sleeping run nor
  // next to it, so a sleeping run never joins an awake one).
  bool touches_sleeping(const Block* b) const;
  // The live blocks of `es` all carry the current tag or it has none (SLEEP-R1: an expandable
  // segment is per (stream, tag)).
  bool reservation_takes_current_tag(const ExpandableSegment* es) const;
  // Takes the free blocks of the run starting at `head` out of their pool (no search finds them).
  void hide_free_blocks(const Block* head);
  void free_while_asleep(Block* b);
  // get_free_block over the free blocks whose segment holds no live block of another tag than the
  // current one (docs/sleep-wake.md, section 2); get_free_block itself until a tag other than
  // "default" was ever used.
  bool get_free_block_for_tag(AllocParams& p);
  bool tags_seen_ = false;
  // No-caching mode (Config::no_caching): live raw device allocations, address -> size.
  std::map<std::uint64_t, Bytes> raw_allocations_;
};

}  // namespace cachet::model

// Private pools in gpu/'s policy:pytorch on the host backend (docs/pytorch-allocator.md §14): bad
// use refused with nothing changed; the operations at which PyTorch 2.11 itself fails (§14.8)
// refused with cachet::PyTorchFailsHere, the exact message, and the state, stats, snapshot and
// trace unchanged; stream uses inside a pool and during a capture (§14.7) with values computed by
// hand from PyTorch's rules. Every allocator here runs in validate mode (invariants after every
// operation). Synthetic addresses: cudaMalloc hands out 0x7f0000000000 upwards in 2 MiB steps.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cachet/errors.h"
#include "gpu_test_support.h"

namespace cachet::test {
namespace {

constexpr PoolId kMemPool1{0, 1};
constexpr PoolId kMemPool2{0, 2};
constexpr PoolId kGraph1{1, 0};
constexpr StreamId kCapture = 7;  // the stream a graph captures on
constexpr std::uint64_t kBase = 0x7f0000000000;

PoolRoute capture_on(StreamId s) { return PoolRoute{PoolRoute::Kind::CaptureStream, s}; }
PoolRoute this_thread() { return PoolRoute{}; }

std::uint64_t addr(void* p) { return reinterpret_cast<std::uintptr_t>(p); }

// Everything a refusal must leave as it was.
struct Observed {
  std::vector<std::pair<std::string, std::int64_t>> stats;
  std::vector<TraceEvent> trace;
  Snapshot snapshot;
};
Observed observe(CachingAllocator& a) {
  Observed o;
  o.stats = flatten(a.stats());
  o.trace = a.trace();
  o.snapshot = a.snapshot();  // records a snapshot event after the trace was read
  return o;
}
void expect_unchanged(CachingAllocator& a, const Observed& before) {
  EXPECT_EQ(flatten(a.stats()), before.stats);
  // observe() itself added one snapshot event to the trace; nothing else may have been added.
  auto trace = a.trace();
  ASSERT_EQ(trace.size(), before.trace.size() + 1);
  trace.pop_back();
  EXPECT_EQ(trace, before.trace);
  EXPECT_EQ(a.snapshot(), before.snapshot);
  EXPECT_EQ(a.invariants(), std::vector<std::string>{});
}

template <class F>
std::string refusal(F&& f) {
  try {
    f();
  } catch (const PyTorchFailsHere& e) {
    return e.what();
  }
  return "(no PyTorchFailsHere)";
}

// ----------------------------------------------------------------- bad use (§14.2, §14.4)

TEST(PrivatePools, BadUseIsRefusedAndChangesNothing) {
  auto h = host_alloc();
  CachingAllocator& a = *h.a;
  EXPECT_THROW(a.create_or_incref_pool(PoolId{}), UsageError);
  EXPECT_THROW(a.release_pool(kMemPool1), UsageError);
  EXPECT_THROW(a.pool_use_count(kMemPool1), UsageError);
  EXPECT_THROW(a.end_allocate_to_pool(kMemPool1), UsageError);
  a.create_or_incref_pool(kMemPool1);
  EXPECT_EQ(a.pool_use_count(kMemPool1), 1);
  a.begin_allocate_to_pool(kMemPool1, this_thread());
  EXPECT_EQ(a.pool_use_count(kMemPool1), 2);
  EXPECT_THROW(a.begin_allocate_to_pool(kMemPool1, this_thread()), UsageError);
  EXPECT_EQ(a.pool_use_count(kMemPool1), 2);
  a.end_allocate_to_pool(kMemPool1);
  a.release_pool(kMemPool1);
  a.release_pool(kMemPool1);
  EXPECT_EQ(a.pool_use_count(kMemPool1), 0);  // freeable, still known: nothing was allocated...
  a.empty_cache(kMemPool1);                   // ...so its release forgets it (§14.5)
  EXPECT_THROW(a.pool_use_count(kMemPool1), UsageError);
  EXPECT_EQ(a.invariants(), std::vector<std::string>{});
}

TEST(PrivatePools, AllocationsGoToTheActivePoolAndBackToItWhenFreed) {
  auto h = host_alloc();
  CachingAllocator& a = *h.a;
  a.create_or_incref_pool(kMemPool1);
  a.begin_allocate_to_pool(kMemPool1, this_thread());
  void* x = a.allocate(1000, 0);  // the pool's small half: a 2 MiB segment of its own
  a.end_allocate_to_pool(kMemPool1);
  void* y = a.allocate(1000, 0);  // the default small pool: another segment
  EXPECT_EQ(addr(x), kBase);
  EXPECT_EQ(addr(y), kBase + 2 * MiB);
  a.free(x);
  void* z = a.allocate(1000, 0);  // the pool's free block is not the default pool's
  EXPECT_EQ(addr(z), kBase + 2 * MiB + 1024);
  const Snapshot s = a.snapshot();
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(s[0].pool_id, kMemPool1);
  EXPECT_EQ(s[1].pool_id, PoolId{});
}

// ----------------------------------------------------------------- §14.8: where PyTorch fails

// A MemPool {0, 1} with one free 2 MiB segment, all its users gone (freeable).
void freeable_pool_with_a_free_segment(CachingAllocator& a) {
  a.create_or_incref_pool(kMemPool1);
  a.begin_allocate_to_pool(kMemPool1, this_thread());
  void* x = a.allocate(1000, 0);
  a.end_allocate_to_pool(kMemPool1);
  a.release_pool(kMemPool1);  // leaving use_mem_pool
  a.free(x);
  a.release_pool(kMemPool1);  // the MemPool object: use count 0
}

TEST(PrivatePoolsWherePyTorchFails, EmptyCacheDuringACaptureIsRefused) {
  auto h = host_alloc();
  CachingAllocator& a = *h.a;
  a.set_trace(true);
  freeable_pool_with_a_free_segment(a);
  a.begin_allocate_to_pool(kGraph1, capture_on(kCapture));
  const Observed before = observe(a);
  EXPECT_EQ(refusal([&] { a.empty_cache(); }),
            "empty_cache: PyTorch 2.11 fails here: releasing the free segments of private pool {0, 1} while a CUDA "
            "graph capture is under way needs cudaFree or an unmap, which the driver refuses "
            "(cudaErrorStreamCaptureUnsupported) and which invalidates the capture; cachet refuses and changes "
            "nothing. Call empty_cache after the capture ends (docs/pytorch-allocator.md §14.8)");
  expect_unchanged(a, before);
  EXPECT_EQ(a.pool_use_count(kMemPool1), 0);
  // After the capture the same call gives the segment back and forgets the pool (§14.5).
  a.end_allocate_to_pool(kGraph1);
  a.empty_cache();
  EXPECT_EQ(cur(a.stats().reserved_bytes), 0);
  EXPECT_EQ(a.stats().num_device_free, 1);
  EXPECT_THROW(a.pool_use_count(kMemPool1), UsageError);
}

TEST(PrivatePoolsWherePyTorchFails, EmptyCacheDuringUseMemPoolIsNoCapture) {
  auto h = host_alloc();
  CachingAllocator& a = *h.a;
  freeable_pool_with_a_free_segment(a);
  a.create_or_incref_pool(kMemPool2);
  a.begin_allocate_to_pool(kMemPool2, this_thread());
  a.empty_cache();  // the default pools wait (a pool is active), the freeable pool goes (§14.6)
  EXPECT_EQ(cur(a.stats().reserved_bytes), 0);
  EXPECT_EQ(a.stats().num_device_free, 1);
  EXPECT_EQ(a.stats().num_sync_all_streams, 0);
}

TEST(PrivatePoolsWherePyTorchFails, DestroyingAMemPoolWhileAnotherPoolIsActiveIsRefused) {
  auto h = host_alloc();
  CachingAllocator& a = *h.a;
  a.set_trace(true);
  freeable_pool_with_a_free_segment(a);
  a.create_or_incref_pool(kMemPool2);
  a.begin_allocate_to_pool(kMemPool2, this_thread());
  const Observed before = observe(a);
  EXPECT_EQ(refusal([&] { a.empty_cache(kMemPool1); }),
            "empty_cache({0, 1}): PyTorch 2.11 fails here (\"captures_underway.empty() INTERNAL ASSERT FAILED\"): "
            "a MemPool is being destroyed while pool {0, 2} is active (use_mem_pool or a capture); cachet refuses "
            "and changes nothing. Leave the other pool's use_mem_pool or end its capture first "
            "(docs/pytorch-allocator.md §14.8)");
  expect_unchanged(a, before);  // num_sync_all_streams included: still 0
  a.end_allocate_to_pool(kMemPool2);
  a.empty_cache(kMemPool1);
  EXPECT_EQ(a.stats().num_device_free, 1);
  EXPECT_EQ(a.stats().num_sync_all_streams, 1);  // emptyCache(id) counts its synchronization (§14.6)
}

// Garbage collection would give a cached default segment back while a capture allocates.
TEST(PrivatePoolsWherePyTorchFails, GarbageCollectionDuringACaptureIsRefused) {
  auto h = host_alloc("garbage_collection_threshold:0.5", 100 * MiB);
  CachingAllocator& a = *h.a;
  a.set_trace(true);
  a.set_memory_fraction(0.5);  // cap 50 MiB, GC above 25 MiB reserved
  a.free(a.allocate(30 * MiB, 0));  // 30 MiB cached in the default large pool
  a.begin_allocate_to_pool(kGraph1, capture_on(kCapture));
  const Observed before = observe(a);
  EXPECT_EQ(refusal([&] { a.allocate(10 * MiB, kCapture); }),
            "allocate(10485760 B, stream 7): PyTorch 2.11 fails here: garbage collection "
            "(garbage_collection_threshold) would give a cached segment back with cudaFree while a CUDA graph "
            "capture is under way, which the driver refuses (cudaErrorStreamCaptureUnsupported) and which "
            "invalidates the capture; cachet refuses and changes nothing. Free cached memory (empty_cache) before "
            "the capture, or raise the cap (docs/pytorch-allocator.md §14.8)");
  expect_unchanged(a, before);
  // The same allocation inside use_mem_pool collects the cached segment and succeeds.
  a.end_allocate_to_pool(kGraph1);
  a.create_or_incref_pool(kMemPool1);
  a.begin_allocate_to_pool(kMemPool1, this_thread());
  a.allocate(10 * MiB, kCapture);
  EXPECT_EQ(a.stats().num_device_free, 1);
  EXPECT_EQ(cur(a.stats().reserved_bytes), static_cast<std::int64_t>(10 * MiB));
}

// release_available_cached_blocks would give an oversize segment of the graph's pool back.
TEST(PrivatePoolsWherePyTorchFails, ReleasingOversizeBlocksDuringACaptureIsRefused) {
  auto h = host_alloc("max_split_size_mb:20", 100 * MiB);
  CachingAllocator& a = *h.a;
  a.set_trace(true);
  a.set_memory_fraction(0.5);  // cap 50 MiB
  a.begin_allocate_to_pool(kGraph1, capture_on(kCapture));
  a.free(a.allocate(30 * MiB, kCapture));  // an oversize 30 MiB segment cached in the graph's pool
  const Observed before = observe(a);
  // 35 MiB: no cached block fits; a new 36 MiB segment would pass the cap (30 + 36 > 50).
  EXPECT_EQ(refusal([&] { a.allocate(35 * MiB, kCapture); }),
            "allocate(36700160 B, stream 7): PyTorch 2.11 fails here: release_available_cached_blocks "
            "(max_split_size_mb) would give a cached segment back with cudaFree while a CUDA graph capture is under "
            "way, which the driver refuses (cudaErrorStreamCaptureUnsupported) and which invalidates the capture; "
            "cachet refuses and changes nothing. Free cached memory (empty_cache) before the capture, or raise the "
            "cap (docs/pytorch-allocator.md §14.8)");
  expect_unchanged(a, before);
}

// One growth of an expandable segment maps three pages (+1); two free runs unmap separately (-2).
TEST(PrivatePoolsWherePyTorchFails, ExpandableSegmentsUnmappingMoreThanTheyGrewIsRefused) {
  auto h = host_alloc("expandable_segments:True", 8 * GiB);
  CachingAllocator& a = *h.a;
  a.set_trace(true);
  a.create_or_incref_pool(kMemPool1);
  a.begin_allocate_to_pool(kMemPool1, this_thread());
  a.free(a.allocate(60 * MiB, 0));   // pages 0-2 of 20 MiB mapped in one growth
  void* b = a.allocate(20 * MiB, 0);  // [0, 20 MiB)
  void* c = a.allocate(20 * MiB, 0);  // [20, 40 MiB); [40, 60 MiB) free
  EXPECT_EQ(addr(c), addr(b) + 20 * MiB);
  a.end_allocate_to_pool(kMemPool1);
  a.release_pool(kMemPool1);
  a.free(b);                   // [0, 20 MiB) free: two free runs around c
  a.release_pool(kMemPool1);  // freeable
  const Observed before = observe(a);
  EXPECT_EQ(refusal([&] { a.empty_cache(); }),
            "releasing private pool {0, 1}: PyTorch 2.11 fails here (\"block->pool->owner_PrivatePool->"
            "cudaMalloc_count > 0 INTERNAL ASSERT FAILED\"): its expandable segments would unmap 2 ranges but its "
            "device allocation count (cudaMalloc_count) is 1; cachet refuses and changes nothing. This memory of a "
            "private pool cannot be given back with expandable_segments:True (docs/pytorch-allocator.md §14.8)");
  expect_unchanged(a, before);
  EXPECT_EQ(a.stats().num_sync_all_streams, 0);
  // Freeing c joins the runs: one unmap, which the count allows.
  a.free(c);
  a.empty_cache();
  EXPECT_EQ(cur(a.stats().reserved_bytes), 0);
}

// The same pool met by malloc's last retry (§3.1): the allocation is refused before the retry's
// release. Nothing else happened in this malloc (no events, no garbage collection, no oversize
// blocks; the cap refuses the new segment before any device call), so nothing changed.
TEST(PrivatePoolsWherePyTorchFails, MallocsLastRetryIntoSuchAPoolIsRefused) {
  auto h = host_alloc("expandable_segments:True", 8 * GiB);
  CachingAllocator& a = *h.a;
  a.set_trace(true);
  a.set_memory_fraction(100.0 / 8192.0);  // cap 100 MiB
  a.create_or_incref_pool(kMemPool1);
  a.begin_allocate_to_pool(kMemPool1, this_thread());
  a.free(a.allocate(60 * MiB, 0));  // pages 0-2 of the pool's reservation: count 1
  void* b = a.allocate(20 * MiB, 0);
  a.allocate(20 * MiB, 0);  // c, kept
  a.end_allocate_to_pool(kMemPool1);
  a.release_pool(kMemPool1);
  a.free(b);
  a.release_pool(kMemPool1);  // freeable, two free runs after one growth
  const Observed before = observe(a);
  // 60 MiB more would pass the cap (60 + 60 > 100): no cached block, no segment, the last retry.
  EXPECT_EQ(refusal([&] { a.allocate(60 * MiB, 0); }),
            "releasing private pool {0, 1}: PyTorch 2.11 fails here (\"block->pool->owner_PrivatePool->"
            "cudaMalloc_count > 0 INTERNAL ASSERT FAILED\"): its expandable segments would unmap 2 ranges but its "
            "device allocation count (cudaMalloc_count) is 1; cachet refuses and changes nothing. This memory of a "
            "private pool cannot be given back with expandable_segments:True (docs/pytorch-allocator.md §14.8)");
  expect_unchanged(a, before);
  EXPECT_EQ(a.stats().num_alloc_retries, 0);
  EXPECT_EQ(a.stats().num_ooms, 0);
}

// The count reaches 0 with pages still mapped (§14.8.1): PyTorch erases the pool with a block
// still allocated in it. gpu/ keeps the pool object (orphaned): unknown by its id, its memory
// counted, its segment shown as PyTorch's snapshot shows it (from an active block only), freeing
// the block safe, and nothing given back any more.
TEST(PrivatePoolsWherePyTorchFails, APoolErasedWithMemoryStillMappedIsOrphaned) {
  auto h = host_alloc("expandable_segments:True", 8 * GiB);
  CachingAllocator& a = *h.a;
  a.create_or_incref_pool(kMemPool1);
  a.begin_allocate_to_pool(kMemPool1, this_thread());
  a.free(a.allocate(60 * MiB, 0));   // pages 0-2 mapped in one growth: count 1
  void* x = a.allocate(10 * MiB, 0);  // [0, 10 MiB)
  void* b = a.allocate(20 * MiB, 0);  // [10, 30 MiB); [30, 60 MiB) free
  a.end_allocate_to_pool(kMemPool1);
  a.release_pool(kMemPool1);
  a.free(x);  // [0, 10 MiB) free: no whole page
  a.release_pool(kMemPool1);
  a.empty_cache();  // unmaps page 2 only: count 0, pages 0-1 still mapped
  EXPECT_EQ(a.stats().num_device_free, 1);
  EXPECT_EQ(cur(a.stats().reserved_bytes), static_cast<std::int64_t>(40 * MiB));
  EXPECT_EQ(cur(a.stats().allocated_bytes), static_cast<std::int64_t>(20 * MiB));
  EXPECT_THROW(a.pool_use_count(kMemPool1), UsageError);  // PyTorch erased it
  EXPECT_EQ(a.snapshot(), Snapshot{});  // its mapped run starts with a free block: not shown
  {
    // block_table() lists the run all the same (the stats still count b and both pages).
    const Snapshot t = a.block_table();
    const std::uint64_t base = addr(b) - 10 * MiB;
    ASSERT_EQ(t.size(), 1u);
    EXPECT_EQ(t[0].address, base);
    EXPECT_EQ(t[0].total_size, 40 * MiB);
    EXPECT_EQ(t[0].pool_id, kMemPool1);
    ASSERT_EQ(t[0].blocks.size(), 3u);
    EXPECT_EQ(t[0].blocks[0].address, base);
    EXPECT_EQ(t[0].blocks[0].size, 10 * MiB);
    EXPECT_EQ(t[0].blocks[0].state, BlockState::Inactive);
    EXPECT_EQ(t[0].blocks[1], (BlockSnapshot{base + 10 * MiB, 20 * MiB, 20 * MiB, BlockState::ActiveAllocated}));
    EXPECT_EQ(t[0].blocks[2].address, base + 30 * MiB);
    EXPECT_EQ(t[0].blocks[2].size, 10 * MiB);
    EXPECT_EQ(t[0].blocks[2].state, BlockState::Inactive);
  }
  a.free(b);
  a.empty_cache();  // an erased pool is never released again: PyTorch leaks it too
  EXPECT_EQ(cur(a.stats().reserved_bytes), static_cast<std::int64_t>(40 * MiB));
  EXPECT_EQ(cur(a.stats().active), 0);
  EXPECT_EQ(a.invariants(), std::vector<std::string>{});
}

// ----------------------------------------------------------------- §14.7: stream uses and a capture

// Values by hand from PyTorch's free, recordStream, process_events,
// insert_events_deferred_until_no_capture and remove_cudagraph_stream_uses (§6, §14.7). Block
// sizes are 1000 B rounded to 1024; c lives in the default small pool's segment at kBase, a and b
// in the graph's small pool's segment at kBase + 2 MiB.
TEST(PrivatePoolsStreamUses, FreesDuringACaptureWaitForItsEndThenDropTheCapturesUses) {
  auto h = host_alloc();
  CachingAllocator& a = *h.a;
  void* c = a.allocate(1000, 0);
  a.record_stream(c, 5);  // a use before the capture: it will need an event
  a.begin_allocate_to_pool(kGraph1, capture_on(kCapture));
  void* x = a.allocate(1000, kCapture);
  ASSERT_EQ(addr(c), kBase);
  ASSERT_EQ(addr(x), kBase + 2 * MiB);
  a.record_stream(x, 9);  // uses made during the capture need no event after it
  a.record_stream(c, 9);
  a.free(x);  // with stream uses during a capture: deferred, no event
  a.free(c);
  EXPECT_EQ(cur(a.stats().allocation), 0);
  EXPECT_EQ(cur(a.stats().allocated_bytes), 0);
  EXPECT_EQ(cur(a.stats().active), 2);
  EXPECT_EQ(cur(a.stats().active_bytes), 2048);
  EXPECT_EQ(h.sim->live_events(), 0u);
  {
    const Snapshot s = a.snapshot();
    ASSERT_EQ(s.size(), 2u);
    EXPECT_EQ(s[0].pool_id, PoolId{});
    EXPECT_EQ(s[1].pool_id, kGraph1);
    EXPECT_EQ(s[0].blocks[0], (BlockSnapshot{kBase, 1024, 1000, BlockState::ActivePendingFree}));
    EXPECT_EQ(s[1].blocks[0], (BlockSnapshot{kBase + 2 * MiB, 1024, 1000, BlockState::ActivePendingFree}));
  }
  try {
    a.free(x);
    ADD_FAILURE() << "a second free of a deferred block was accepted";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("waiting for the end of a capture (§14.7)"), std::string::npos) << e.what();
  }
  // Allocating during the capture processes nothing: x stays deferred, b takes the next block.
  void* b = a.allocate(1000, kCapture);
  EXPECT_EQ(addr(b), kBase + 2 * MiB + 1024);
  a.record_stream(b, 9);
  a.end_allocate_to_pool(kGraph1);

  // After the capture a free with stream uses records events on all of them, those of the
  // capture included (only a deferred free drops them): one event, on stream 9.
  a.free(b);
  EXPECT_EQ(h.sim->live_events(), 1u);
  EXPECT_EQ(cur(a.stats().active), 3);

  // The next allocation processes the deferred frees first: x had only a capture use, so it is
  // free at once; c keeps its use on stream 5 and gets an event. Then the queues: nothing done.
  void* d = a.allocate(1000, 0);
  EXPECT_EQ(addr(d), kBase + 1024);  // c's segment's free remainder; c still waits
  EXPECT_EQ(h.sim->live_events(), 2u);
  EXPECT_EQ(cur(a.stats().active), 3);  // c, b waiting; d
  EXPECT_EQ(cur(a.stats().active_bytes), 3072);
  EXPECT_EQ(cur(a.stats().allocation), 1);

  h.sim->complete_events(9);  // b's event: b frees and merges with x's block and the rest
  void* e = a.allocate(1000, 0);
  EXPECT_EQ(addr(e), kBase + 2048);
  EXPECT_EQ(cur(a.stats().active), 3);  // c waiting; d, e
  {
    const Snapshot s = a.snapshot();
    ASSERT_EQ(s.size(), 2u);
    ASSERT_EQ(s[1].blocks.size(), 1u);  // the graph's segment is one free block again
    EXPECT_EQ(s[1].blocks[0].size, 2 * MiB);
    EXPECT_EQ(s[1].blocks[0].state, BlockState::Inactive);
  }
  h.sim->complete_events(5);  // c's event: c frees; best fit takes its 1024 B block
  void* f = a.allocate(1000, 0);
  EXPECT_EQ(addr(f), kBase);
  EXPECT_EQ(cur(a.stats().active), 3);
  EXPECT_EQ(cur(a.stats().allocation), 3);
}

// PyTorch processes one batch of deferred frees in its hash map's order (§14.10.3); a replay gives
// it (set_deferred_free_order). The sequence of the recordings res_deferred_order_pair_j*: an 8 B
// block in a default small segment (its free remainder counts in inactive_split), then six 512 B
// blocks h0..h5 of the graph's small segment, h1 and h4 used on stream 2 during the capture, h3
// and h5 freed at once (h5 joins the free remainder R), h1 and h4 deferred. The next malloc frees
// them: h1 first (made order) leaves h1, h3 and R free (inactive_split 1 + 3) before h4 joins h3
// and R; h4 first joins them (1 + 1), then h1 (1 + 2): peaks 4 and 3, as recorded.
TEST(PrivatePoolsStreamUses, DeferredFreesTakeTheOrderGiven) {
  for (const bool given : {false, true}) {
    SCOPED_TRACE(given ? "h4 then h1 given" : "made order");
    auto hs = host_alloc();
    CachingAllocator& a = *hs.a;
    a.set_trace(true);
    void* small = a.allocate(8, 1);
    ASSERT_EQ(addr(small), kBase);
    a.begin_allocate_to_pool(kGraph1, capture_on(1));
    std::vector<void*> h;
    for (int k = 0; k < 6; ++k) h.push_back(a.allocate(512, 1));
    ASSERT_EQ(addr(h[0]), kBase + 2 * MiB);
    a.record_stream(h[1], 2);
    a.record_stream(h[4], 2);
    for (int k : {3, 5, 1, 4}) a.free(h[k]);
    EXPECT_EQ(a.deferred_frees(), (std::vector<void*>{h[1], h[4]}));
    // Bad orders change nothing: a block not deferred, one named twice.
    try {
      a.set_deferred_free_order({h[0]});
      ADD_FAILURE() << "a block that is no deferred free was accepted";
    } catch (const UsageError& e) {
      EXPECT_EQ(std::string(e.what()), "set_deferred_free_order: 0x7f0000200000 is not a free deferred by a capture and "
                                       "still pending (deferred_frees() lists them; docs/pytorch-allocator.md §14.10.3)");
    }
    EXPECT_THROW(a.set_deferred_free_order({h[4], h[4]}), UsageError);
    EXPECT_EQ(a.deferred_frees(), (std::vector<void*>{h[1], h[4]}));
    if (given) {
      a.set_deferred_free_order({h[4]});  // h4 first, the rest (h1) as it was
      EXPECT_EQ(a.deferred_frees(), (std::vector<void*>{h[4], h[1]}));
    }
    a.end_allocate_to_pool(kGraph1);
    EXPECT_EQ(a.stats().inactive_split[0].peak, 3);  // the default remainder, h3, R
    const std::size_t rows = a.trace().size();
    void* next = a.allocate(512, 1);  // process_events: the batch; then the default remainder
    EXPECT_EQ(addr(next), kBase + 512);
    EXPECT_TRUE(a.deferred_frees().empty());
    const std::vector<TraceEvent> all = a.trace();
    ASSERT_EQ(all.size(), rows + 3);  // two free_completed, alloc
    const std::uint64_t first = addr(given ? h[4] : h[1]), second = addr(given ? h[1] : h[4]);
    EXPECT_EQ(all[rows].action, TraceAction::FreeCompleted);
    EXPECT_EQ(all[rows].addr, first);
    EXPECT_EQ(all[rows + 1].action, TraceAction::FreeCompleted);
    EXPECT_EQ(all[rows + 1].addr, second);
    EXPECT_EQ(all[rows + 2].action, TraceAction::Alloc);
    EXPECT_EQ(a.stats().inactive_split[0].peak, given ? 3 : 4);
    EXPECT_EQ(a.stats().inactive_split[0].current, 3);  // the default remainder; h1; h3 + h4 + R
  }
}

// policy:cachet takes its deferred frees in the order they were made (R12): no order is taken.
TEST(PrivatePoolsStreamUses, PolicyCachetRefusesAnOrderOfDeferredFrees) {
  auto hs = host_alloc("policy:cachet");
  CachingAllocator& a = *hs.a;
  a.begin_allocate_to_pool(kGraph1, capture_on(1));
  void* x = a.allocate(512, 1);
  void* y = a.allocate(512, 1);
  a.record_stream(x, 2);
  a.record_stream(y, 2);
  a.free(x);
  a.free(y);
  EXPECT_EQ(a.deferred_frees(), (std::vector<void*>{x, y}));
  EXPECT_THROW(a.set_deferred_free_order({y}), UsageError);
  EXPECT_EQ(a.deferred_frees(), (std::vector<void*>{x, y}));
  a.end_allocate_to_pool(kGraph1);
}

// PyTorch walks its cuda_events hash map keyed by cudaStream_t: the streams of one process_events
// come in the hash order of their handles (§14.10.3); a replay gives it (set_event_stream_order).
// x (stream 1) used on stream 5 and y (stream 2) used on stream 4: one event each, both complete
// when the next allocation walks the queues. By stream value, stream 4's queue first: y's free
// completes before x's; stream 5 given first, x's before y's. Bad orders change nothing.
TEST(PrivatePoolsStreamUses, StreamsWalkedInTheOrderGiven) {
  for (const bool given : {false, true}) {
    SCOPED_TRACE(given ? "stream 5 given first" : "by stream value");
    auto hs = host_alloc();
    CachingAllocator& a = *hs.a;
    a.set_trace(true);
    void* x = a.allocate(512, 1);
    void* y = a.allocate(512, 2);
    ASSERT_EQ(addr(x), kBase);
    ASSERT_EQ(addr(y), kBase + 2 * MiB);
    a.record_stream(x, 5);
    a.record_stream(y, 4);
    a.free(x);
    a.free(y);
    using Queues = std::vector<std::pair<StreamId, std::vector<void*>>>;
    EXPECT_EQ(a.event_queues(), (Queues{{4, {y}}, {5, {x}}}));
    try {
      a.set_event_stream_order({5, 3});
      ADD_FAILURE() << "a stream with no pending events was accepted";
    } catch (const UsageError& e) {
      EXPECT_EQ(std::string(e.what()),
                "set_event_stream_order: stream 3 has no pending events (event_queues() lists the streams that have; "
                "docs/pytorch-allocator.md §14.10.3)");
    }
    try {
      a.set_event_stream_order({5, 5});
      ADD_FAILURE() << "a stream named twice was accepted";
    } catch (const UsageError& e) {
      EXPECT_EQ(std::string(e.what()), "set_event_stream_order: stream 5 is named twice; name each stream once");
    }
    a.set_event_stream_order({});  // nothing changes
    EXPECT_EQ(a.event_queues(), (Queues{{4, {y}}, {5, {x}}}));
    if (given) {
      a.set_event_stream_order({5});  // stream 5 first, the rest (4) as it was
      EXPECT_EQ(a.event_queues(), (Queues{{5, {x}}, {4, {y}}}));
    }
    hs.sim->complete_events(4);
    hs.sim->complete_events(5);
    const std::size_t rows = a.trace().size();
    void* next = a.allocate(512, 1);  // process_events: both queues; then x's block again
    EXPECT_EQ(next, x);
    EXPECT_TRUE(a.event_queues().empty());
    EXPECT_EQ(a.invariants(), std::vector<std::string>{});
    const std::vector<TraceEvent> all = a.trace();
    ASSERT_EQ(all.size(), rows + 3);  // two free_completed, alloc
    const std::uint64_t first = addr(given ? x : y), second = addr(given ? y : x);
    EXPECT_EQ(all[rows].action, TraceAction::FreeCompleted);
    EXPECT_EQ(all[rows].addr, first);
    EXPECT_EQ(all[rows].stream, given ? 1u : 2u);
    EXPECT_EQ(all[rows + 1].action, TraceAction::FreeCompleted);
    EXPECT_EQ(all[rows + 1].addr, second);
    EXPECT_EQ(all[rows + 2].action, TraceAction::Alloc);
    EXPECT_EQ(all[rows + 2].addr, addr(x));
  }
}

// policy:cachet walks its own streams' events: no order of streams is taken.
TEST(PrivatePoolsStreamUses, PolicyCachetRefusesAnOrderOfStreams) {
  auto hs = host_alloc("policy:cachet");
  CachingAllocator& a = *hs.a;
  void* x = a.allocate(512, 1);
  a.record_stream(x, 5);
  a.free(x);
  EXPECT_TRUE(a.event_queues().empty());
  EXPECT_THROW(a.set_event_stream_order({5}), UsageError);
}

}  // namespace
}  // namespace cachet::test

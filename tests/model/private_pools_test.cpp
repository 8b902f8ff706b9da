// Private pools and capture (docs/pytorch-allocator.md §14): the rules the recordings do not
// exercise (stream uses during a capture, the retry skipped, where PyTorch fails), with values
// worked out by hand from §14; the recordings themselves run in tests/conformance.
#include <fstream>

#include "cachet/errors.h"
#include "harness.h"

namespace cachet::model::test {
namespace {

constexpr PoolRoute kThread{PoolRoute::Kind::CurrentThread, 0};
PoolRoute capture(StreamId s) { return PoolRoute{PoolRoute::Kind::CaptureStream, s}; }

// use_mem_pool takes every allocation of the thread, whatever its stream; the pool's segments
// carry its id and stay until the pool is freeable and its cache emptied (§14.2, §14.4, §14.6).
TEST(PrivatePools, UseMemPoolRoutesEveryStreamAndCountsUsers) {
  Device d;
  const PoolId id{0, 1};
  d.alloc.create_or_incref_pool(id);  // torch.cuda.MemPool()
  EXPECT_EQ(d.alloc.pool_use_count(id), 1);
  d.alloc.begin_allocate_to_pool(id, kThread);  // use_mem_pool enter
  EXPECT_EQ(d.alloc.pool_use_count(id), 2);
  const auto a = d.malloc(1000, 0);
  const auto b = d.malloc(1000, 7);  // another stream: the pool too, a segment of stream 7
  d.alloc.end_allocate_to_pool(id);
  d.alloc.release_pool(id);  // use_mem_pool exit
  EXPECT_EQ(d.alloc.pool_use_count(id), 1);
  const auto c = d.malloc(1000, 0);  // no pool active: the default pool, a third segment
  Snapshot s = d.alloc.snapshot();
  ASSERT_EQ(s.size(), 3u);
  EXPECT_EQ(s[0].pool_id, id);
  EXPECT_EQ(s[1].pool_id, id);
  EXPECT_EQ(s[1].stream, 7u);
  EXPECT_EQ(s[2].pool_id, PoolId{});
  d.free(a);
  d.free(b);
  d.free(c);
  d.alloc.empty_cache();  // the pool has a user left: only the default segment goes
  EXPECT_EQ(d.alloc.stats().reserved_bytes[0].current, 2 * 2097152);
  EXPECT_EQ(d.alloc.stats().num_sync_all_streams, 1);
  d.alloc.release_pool(id);  // ~MemPool: releasePool, emptyCache(id)
  d.alloc.empty_cache(id);
  d.alloc.check_invariants();
  EXPECT_EQ(d.alloc.stats().reserved_bytes[0].current, 0);
  EXPECT_EQ(d.alloc.stats().num_sync_all_streams, 2);  // emptyCache(id) synchronizes too
  EXPECT_EQ(d.alloc.stats().num_device_free, 3);
  EXPECT_FALSE(d.alloc.has_pool(id));  // no segment left: forgotten
}

// A capture takes only its stream; allocations on other streams stay in the default pools.
TEST(PrivatePools, CaptureRoutesOnlyItsStream) {
  Device d;
  const PoolId id{1, 0};
  d.alloc.begin_allocate_to_pool(id, capture(5));
  d.malloc(1000, 5);
  d.malloc(1000, 0);
  d.alloc.end_allocate_to_pool(id);
  const Snapshot s = d.alloc.snapshot();
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(s[0].pool_id, id);
  EXPECT_EQ(s[0].stream, 5u);
  EXPECT_EQ(s[1].pool_id, PoolId{});
}

// Two graphs sharing a pool: the second capture reuses the first's free blocks; the pool is
// freeable only after both released it; a block freed after the release returns to the pool
// and its segment goes at the next empty_cache (§14.3-§14.5).
TEST(PrivatePools, SharedPoolAndBlocksFreedAfterRelease) {
  Device d;
  const PoolId id{1, 0};
  d.alloc.begin_allocate_to_pool(id, capture(5));
  const auto x = d.malloc(4 * MiB, 5);  // a 20 MiB segment of the pool
  d.free(x);
  d.alloc.end_allocate_to_pool(id);
  d.alloc.begin_allocate_to_pool(id, capture(6));  // graph 2 shares the pool, on stream 6
  EXPECT_EQ(d.alloc.pool_use_count(id), 2);
  const auto y = d.malloc(4 * MiB, 5);  // not stream 6: the default pool
  d.alloc.end_allocate_to_pool(id);
  d.alloc.begin_allocate_to_pool(id, capture(5));  // a third capture on stream 5
  const auto z = d.malloc(4 * MiB, 5);
  EXPECT_EQ(z, x);  // the pool's cached block
  d.alloc.end_allocate_to_pool(id);
  d.alloc.release_pool(id);
  d.alloc.release_pool(id);
  d.alloc.empty_cache();  // use count 1: the pool keeps its segment
  EXPECT_EQ(d.alloc.stats().segment[0].current, 2);
  d.alloc.release_pool(id);  // freeable, but z is alive
  d.alloc.empty_cache();
  EXPECT_EQ(d.alloc.stats().segment[0].current, 2);  // y's segment and z's
  EXPECT_TRUE(d.alloc.has_pool(id));
  d.free(z);  // back to the released pool
  d.free(y);
  d.alloc.empty_cache();
  EXPECT_EQ(d.alloc.stats().segment[0].current, 0);
  EXPECT_FALSE(d.alloc.has_pool(id));
  EXPECT_THROW(d.alloc.release_pool(id), UsageError);
}

// During a capture no event is recorded or queried: a free with stream uses waits (Deferred,
// active_pending_free); a use recorded during the capture needs no event afterwards; one
// recorded before it gets its event when the capture has ended (§14.7).
TEST(PrivatePools, StreamUsesDuringCapture) {
  Device d;
  const auto before = d.malloc(1000, 0);
  d.alloc.record_stream(before, 9);  // before the capture
  const PoolId id{1, 0};
  d.alloc.begin_allocate_to_pool(id, capture(5));
  const auto inside = d.malloc(1000, 5);
  d.alloc.record_stream(inside, 9);  // during the capture
  d.free(before);
  d.free(inside);
  // 1000 B rounds to 1024 (§1.2).
  EXPECT_EQ(d.blocks(0), (Blocks{{1024, 1000, P}, {2096128, 0, I}}));
  EXPECT_EQ(d.blocks(1), (Blocks{{1024, 1000, P}, {2096128, 0, I}}));
  EXPECT_EQ(d.alloc.stats().active_bytes[0].current, 2048);
  d.malloc(1000, 5);  // events are not processed during the capture: nothing completes
  EXPECT_EQ(d.alloc.stats().active_bytes[0].current, 3072);
  d.alloc.end_allocate_to_pool(id);
  d.malloc(600, 0);  // process_events: `inside` completes at once, `before` waits for stream 9
  EXPECT_EQ(d.blocks(0), (Blocks{{1024, 1000, P}, {1024, 600, A}, {2095104, 0, I}}));
  EXPECT_EQ(std::get<2>(d.blocks(1)[0]), I);
  d.alloc.complete_events(9);
  d.malloc(600, 0);
  EXPECT_EQ(std::get<2>(d.blocks(0)[0]), A);  // `before` completed and was reused
}

// PyTorch processes one batch of deferred frees in its hash map's order (§14.10.3); a replay gives
// it (set_deferred_free_order). The sequence of the recordings res_deferred_order_pair_j*: a small
// default segment with a free remainder (the recorder's 8 B tensor), then six 512 B blocks h0..h5
// of the graph's small segment, h1 and h4 used on stream 2 during the capture, h3 and h5 freed at
// once (h5 joins the graph segment's free remainder R), h1 and h4 deferred. After the capture the
// next malloc frees them (every use was the capture's): h1 first (made order) leaves h1, h3 and R
// free (inactive_split 1 + 3) before h4 joins h3 and R; h4 first joins them (1 + 1), then h1
// (1 + 2). The recordings' inactive_split.all.peak: 4 and 3.
TEST(PrivatePools, DeferredFreesTakeTheOrderGiven) {
  for (const bool given : {false, true}) {
    SCOPED_TRACE(given ? "h4 then h1 given" : "made order");
    Device d;
    const PoolId id{1, 0};
    d.malloc(8, 1);
    d.alloc.begin_allocate_to_pool(id, capture(1));
    std::vector<std::uint64_t> h;
    for (int k = 0; k < 6; ++k) h.push_back(d.malloc(512, 1));
    d.alloc.record_stream(h[1], 2);
    d.alloc.record_stream(h[4], 2);
    for (int k : {3, 5, 1, 4}) d.free(h[k]);
    EXPECT_EQ(d.alloc.deferred_frees(), (std::vector<std::uint64_t>{h[1], h[4]}));
    // Bad orders change nothing: a block not deferred, one named twice.
    EXPECT_THROW(d.alloc.set_deferred_free_order({h[0]}), UsageError);
    EXPECT_THROW(d.alloc.set_deferred_free_order({h[4], h[4]}), UsageError);
    EXPECT_EQ(d.alloc.deferred_frees(), (std::vector<std::uint64_t>{h[1], h[4]}));
    if (given) {
      d.alloc.set_deferred_free_order({h[4]});  // h4 first, the rest (h1) as it was
      EXPECT_EQ(d.alloc.deferred_frees(), (std::vector<std::uint64_t>{h[4], h[1]}));
    }
    d.alloc.end_allocate_to_pool(id);
    EXPECT_EQ(d.alloc.stats().inactive_split[0].peak, 3);  // the default remainder, h3, R
    const std::size_t rows = d.alloc.trace().size();
    d.malloc(512, 1);  // process_events: the batch; then the default segment's remainder
    d.alloc.check_invariants();
    EXPECT_TRUE(d.alloc.deferred_frees().empty());
    const std::vector<TraceEvent> t(d.alloc.trace().begin() + static_cast<std::ptrdiff_t>(rows), d.alloc.trace().end());
    ASSERT_EQ(t.size(), 3u);  // two free_completed, alloc
    const std::uint64_t first = given ? h[4] : h[1], second = given ? h[1] : h[4];
    EXPECT_EQ(t[0], (TraceEvent{TraceAction::FreeCompleted, first, 512, 1, 0}));
    EXPECT_EQ(t[1], (TraceEvent{TraceAction::FreeCompleted, second, 512, 1, 0}));
    EXPECT_EQ(t[2].action, TraceAction::Alloc);
    EXPECT_EQ(d.alloc.stats().inactive_split[0].peak, given ? 3 : 4);
    EXPECT_EQ(d.alloc.stats().inactive_split[0].current, 3);  // the default remainder; h1; h3 + h4 + R
  }
}

// The last retry (release_cached_blocks) is skipped during a capture: a request the cached
// default segment could have made room for runs out of memory instead (§14.6, §14.7).
TEST(PrivatePools, NoFreeAndRetryDuringCapture) {
  Device d(Config{}, 100 * MiB);
  d.free(d.malloc(60 * MiB));  // a 60 MiB default segment, cached
  const PoolId id{1, 0};
  d.alloc.begin_allocate_to_pool(id, capture(5));
  EXPECT_THROW(d.alloc.malloc(60 * MiB, 5), OutOfMemory);
  EXPECT_EQ(d.alloc.stats().num_alloc_retries, 0);
  EXPECT_EQ(d.alloc.stats().num_ooms, 1);
  d.alloc.end_allocate_to_pool(id);
  d.alloc.begin_allocate_to_pool(PoolId{0, 1}, kThread);  // a use_mem_pool is no capture
  EXPECT_THROW(d.alloc.malloc(60 * MiB, 5), OutOfMemory);  // but the retry is skipped too
  d.alloc.end_allocate_to_pool(PoolId{0, 1});
  d.malloc(60 * MiB, 5);  // no pool active: release_cached_blocks, then the retry
  EXPECT_EQ(d.alloc.stats().num_alloc_retries, 1);
}

// Where PyTorch 2.11 fails (§14.8): a cudaFree during a capture (here garbage collection).
TEST(PrivatePools, PyTorchFailsOnGarbageCollectionDuringCapture) {
  Config c = conf("garbage_collection_threshold:0.5");
  Device d(c);
  d.alloc.set_memory_fraction(static_cast<double>(100 * MiB) / static_cast<double>(kH200Total));
  d.free(d.malloc(60 * MiB));  // reserved 60 MiB > 50 MiB: the next miss collects
  d.alloc.begin_allocate_to_pool(PoolId{1, 0}, capture(5));
  try {
    d.alloc.malloc(30 * MiB, 5);
    FAIL() << "expected PyTorchFailure";
  } catch (const PyTorchFailure& e) {
    EXPECT_NE(std::string(e.what()).find("§14.8"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("cudaFree"), std::string::npos) << e.what();
  }
}

// ...a MemPool destroyed while another pool is in use (emptyCache(id) synchronizes, §14.8).
TEST(PrivatePools, PyTorchFailsOnEmptyCacheOfAPoolDuringAnother) {
  Device d;
  d.alloc.create_or_incref_pool(PoolId{0, 1});
  d.alloc.begin_allocate_to_pool(PoolId{0, 2}, kThread);
  d.alloc.release_pool(PoolId{0, 1});
  EXPECT_THROW(d.alloc.empty_cache(PoolId{0, 1}), PyTorchFailure);
}

// ...expandable segments unmapping more ranges than the pool grew by: one growth of three
// 20 MiB pages, two separate unmaps (§14.5, §14.8).
TEST(PrivatePools, PyTorchFailsOnExpandableUnmapCount) {
  Device d(conf("expandable_segments:True"));
  const PoolId id{0, 1};
  d.alloc.create_or_incref_pool(id);
  d.alloc.begin_allocate_to_pool(id, kThread);
  d.free(d.malloc(60 * MiB));  // one alloc_block: pages 0-2 mapped, device allocation count 1
  const auto b = d.malloc(20 * MiB);
  const auto c = d.malloc(20 * MiB);
  const auto e = d.malloc(20 * MiB);
  d.alloc.end_allocate_to_pool(id);
  d.alloc.release_pool(id);
  d.free(b);
  d.free(e);
  d.alloc.release_pool(id);  // freeable; page 1 (c) stays mapped
  try {
    d.alloc.empty_cache();  // unmaps page 0 (count 0), then page 2: PyTorch's assertion
    FAIL() << "expected PyTorchFailure";
  } catch (const PyTorchFailure& ex) {
    EXPECT_NE(std::string(ex.what()).find("cudaMalloc_count > 0"), std::string::npos) << ex.what();
  }
  (void)c;
}

// [INV-PRIV-2] holds only for a pool that never reserved an expandable segment: two growths of one
// page each count 2, the merged free run unmaps as one range (-1), so the pool keeps a count of 1
// with no segment left and stays known (§14.5, §14.8.1). The check must not fire here.
TEST(PrivatePools, ExpandableCountAboveZeroWithNoSegmentLeftIsNoViolation) {
  Device d(conf("expandable_segments:True"));
  const PoolId id{0, 1};
  d.alloc.create_or_incref_pool(id);
  d.alloc.begin_allocate_to_pool(id, kThread);
  const auto a = d.malloc(20 * MiB);  // growth 1: page 0, count 1
  const auto b = d.malloc(20 * MiB);  // growth 2: page 1, count 2
  d.alloc.end_allocate_to_pool(id);
  d.alloc.release_pool(id);
  d.alloc.release_pool(id);  // freeable
  d.free(a);
  d.free(b);  // pages 0-1 one free run
  d.alloc.empty_cache();  // one unmap of 40 MiB (count 1), then the reservation goes back
  EXPECT_EQ(d.alloc.stats().num_device_alloc, 2);
  EXPECT_EQ(d.alloc.stats().num_device_free, 1);
  EXPECT_EQ(d.alloc.stats().reserved_bytes[0].current, 0);
  EXPECT_TRUE(d.alloc.has_pool(id));  // count 1: PyTorch keeps the empty pool for ever
  EXPECT_EQ(d.alloc.pool_use_count(id), 0);
  EXPECT_NO_THROW(d.alloc.check_invariants());
  // The rule follows the pool, not the setting: turned off now, the pool still had expandable
  // segments, so it is still not checked.
  d.alloc.set_allocator_settings(conf("expandable_segments:False"));
  EXPECT_NO_THROW(d.alloc.check_invariants());
}

// The count reaches exactly 0 with pages still mapped (§14.8.1): one growth of three pages (count
// 1), then empty_cache unmaps page 2 only (count 0) while x's and b's pages 0-1 stay mapped.
// PyTorch erases the pool with b still allocated in it; the model keeps the pool object
// (orphaned, as gpu/ does): unknown by its id, its memory counted and never given back, its
// runs shown only from an active block on, and freeing b is safe.
TEST(PrivatePools, APoolErasedWithPagesStillMappedIsOrphaned) {
  Device d(conf("expandable_segments:True"));
  const PoolId id{0, 1};
  d.alloc.create_or_incref_pool(id);
  d.alloc.begin_allocate_to_pool(id, kThread);
  d.free(d.malloc(60 * MiB));        // pages 0-2 mapped in one growth: count 1
  const auto x = d.malloc(10 * MiB);  // [0, 10 MiB)
  const auto b = d.malloc(20 * MiB);  // [10, 30 MiB); [30, 60 MiB) free
  d.alloc.end_allocate_to_pool(id);
  d.alloc.release_pool(id);
  d.free(x);  // [0, 10 MiB) free: no whole page
  d.alloc.release_pool(id);
  d.alloc.empty_cache();  // unmaps page 2 only ([40, 60 MiB)): count 0, pages 0-1 mapped
  d.alloc.check_invariants();
  EXPECT_EQ(d.alloc.stats().num_device_free, 1);
  EXPECT_EQ(d.alloc.stats().reserved_bytes[0].current, static_cast<std::int64_t>(40 * MiB));
  EXPECT_EQ(d.alloc.stats().allocated_bytes[0].current, static_cast<std::int64_t>(20 * MiB));
  EXPECT_FALSE(d.alloc.has_pool(id));  // PyTorch erased it
  EXPECT_THROW((void)d.alloc.pool_use_count(id), UsageError);
  // PyTorch's snapshot walks the known pools' free blocks and the active ones: the mapped run
  // [0, 40 MiB) starts with x's free block, which it no longer finds, so nothing shows.
  EXPECT_EQ(d.alloc.snapshot(), Snapshot{});
  d.free(b);  // into the erased pool: merges with [0, 10) and [30, 40)
  EXPECT_EQ(d.alloc.snapshot(), Snapshot{});
  d.alloc.empty_cache();  // an erased pool is never released again: PyTorch leaks it too
  d.alloc.check_invariants();
  EXPECT_EQ(d.alloc.stats().reserved_bytes[0].current, static_cast<std::int64_t>(40 * MiB));
  EXPECT_EQ(d.alloc.stats().active_bytes[0].current, 0);
  EXPECT_EQ(d.alloc.stats().num_device_free, 1);
  // The id can name a new pool, which starts from nothing.
  d.alloc.create_or_incref_pool(id);
  EXPECT_EQ(d.alloc.pool_use_count(id), 1);
  d.alloc.check_invariants();
}

// The release order of freeable pools is ska::flat_hash_map's: hash = first or second, index =
// (hash * 11400714819323198485) >> (64 - log2 slots). Worked by hand: with 4 slots ids 1, 2
// land in slots 2 and 0; the third insert grows to 8 slots: 1 -> 4, 2 -> 1, 3 -> 6.
TEST(PrivatePools, FreeableOrderIsTheHashMapsOrder) {
  PrivatePool p1(PoolId{0, 1}), p2(PoolId{0, 2}), p3(PoolId{3, 0});
  FreeableOrder order;
  order.insert(&p1);
  order.insert(&p2);
  EXPECT_EQ(order.in_order(), (std::vector<PrivatePool*>{&p2, &p1}));
  order.insert(&p3);
  EXPECT_EQ(order.in_order(), (std::vector<PrivatePool*>{&p2, &p1, &p3}));
  order.erase(&p1);
  EXPECT_EQ(order.in_order(), (std::vector<PrivatePool*>{&p2, &p3}));
  EXPECT_EQ(order.size(), 2u);
}

TEST(PrivatePools, BadPoolCallsAreUsageErrors) {
  Device d;
  EXPECT_THROW(d.alloc.create_or_incref_pool(PoolId{}), UsageError);
  EXPECT_THROW(d.alloc.end_allocate_to_pool(PoolId{0, 1}), UsageError);
  EXPECT_THROW(d.alloc.release_pool(PoolId{0, 1}), UsageError);
  EXPECT_THROW((void)d.alloc.pool_use_count(PoolId{0, 1}), UsageError);
  d.alloc.begin_allocate_to_pool(PoolId{0, 1}, kThread);
  EXPECT_THROW(d.alloc.begin_allocate_to_pool(PoolId{0, 1}, kThread), UsageError);
  EXPECT_EQ(d.alloc.pool_use_count(PoolId{0, 1}), 1);  // unchanged by the refused call
}

}  // namespace
}  // namespace cachet::model::test

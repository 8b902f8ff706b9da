// Sleep and wake in the model of policy:pytorch (issue 24; cachet's rules, docs/sleep-wake.md):
// exact bytes, addresses and stats over the synthetic source.
#include "cachet/errors.h"
#include "cachet/tags.h"
#include "harness.h"

namespace cachet::model::test {
namespace {

constexpr std::uint64_t kSeg0 = 0x7f0000000000;  // the synthetic source's first cudaMalloc

TEST(Sleep, WeightsSleepAndWakeAtTheSameAddresses) {
  Device d(Config{}, 1 * GiB);
  std::uint64_t w = 0, kv = 0;
  {
    TagScope t("weights");
    w = d.malloc(30 * MiB);  // a 30 MiB segment
  }
  {
    TagScope t("kv_cache");
    kv = d.malloc(8 * MiB);  // a 20 MiB segment, 12 MiB of it free
  }
  // "default", on another stream (placement does not keep tags apart yet, docs/sleep-wake.md
  // section 9): a 20 MiB segment of its own.
  const auto other = d.malloc(4 * MiB, 7);
  EXPECT_EQ(w, kSeg0);
  EXPECT_EQ(d.source.in_use(), 70 * MiB);
  const DeviceStats before = d.alloc.stats();

  EXPECT_EQ(d.alloc.sleep({"weights", "kv_cache"}, {"weights"}), 50 * MiB);
  d.alloc.check_invariants();
  EXPECT_EQ(d.source.in_use(), 20 * MiB);
  DeviceStats expected = before;
  expected.num_sync_all_streams += 1;  // sleep synchronizes, as empty_cache does
  EXPECT_EQ(d.alloc.stats(), expected);  // PyTorch's 122 keys keep their meaning
  const SleepStats& s = d.alloc.sleep_stats();
  EXPECT_EQ(s.sleeping_segments.current, 2);
  EXPECT_EQ(s.sleeping_bytes.current, 50 * 1048576);
  EXPECT_EQ(s.sleeping_allocated_bytes.current, 38 * 1048576);
  EXPECT_EQ(s.backup_bytes.current, 30 * 1048576);
  EXPECT_EQ(d.alloc.sleeping(), (TagList{"kv_cache", "weights"}));
  const Snapshot snap = d.alloc.snapshot();
  ASSERT_EQ(snap.size(), 3u);
  EXPECT_TRUE(snap[0].is_sleeping);
  EXPECT_EQ(snap[0].backup_size, 30 * MiB);
  EXPECT_TRUE(snap[1].is_sleeping);
  EXPECT_EQ(snap[1].backup_size, 0u);
  EXPECT_FALSE(snap[2].is_sleeping);

  // No allocation lands in a sleeping range: best fit would be kv_cache's free 12 MiB.
  const auto fresh = d.malloc(8 * MiB, 7);
  EXPECT_EQ(fresh, other + 4 * MiB);
  d.alloc.check_invariants();

  d.alloc.wake({});
  d.alloc.check_invariants();
  EXPECT_EQ(d.source.in_use(), 70 * MiB);
  EXPECT_EQ(d.alloc.sleep_stats().sleeping_bytes.current, 0);
  EXPECT_EQ(d.alloc.sleep_stats().backup_bytes.current, 0);
  EXPECT_EQ(d.alloc.sleep_stats().num_sleeps, 1);
  EXPECT_EQ(d.alloc.sleep_stats().num_wakes, 1);
  EXPECT_TRUE(d.alloc.sleeping().empty());
  {  // kv_cache's free 12 MiB is found again (by kv_cache only: segments are tag-homogeneous).
    TagScope t("kv_cache");
    EXPECT_EQ(d.malloc(12 * MiB), kv + 8 * MiB);
  }
  d.free(w);
  d.free(kv);
  d.free(other);
  d.alloc.check_invariants();
}

TEST(Sleep, FreeWhileAsleepTakesEffectAtWake) {
  Device d(Config{}, 1 * GiB);
  std::uint64_t a = 0, b = 0;
  {
    TagScope t("weights");
    a = d.malloc(4 * MiB);
    b = d.malloc(4 * MiB);  // one 20 MiB segment, 12 MiB free
  }
  EXPECT_EQ(d.alloc.sleep({"weights"}, {"weights"}), 20 * MiB);
  d.free(a);
  d.alloc.check_invariants();
  EXPECT_EQ(d.alloc.stats().allocated_bytes[0].current, 4 * 1048576);
  EXPECT_EQ(d.alloc.sleep_stats().sleeping_allocated_bytes.current, 4 * 1048576);
  EXPECT_EQ(d.alloc.sleep_stats().backup_bytes.current, 4 * 1048576);
  EXPECT_EQ(d.alloc.sleep_stats().num_frees_while_asleep, 1);
  EXPECT_THROW(d.alloc.free(a), UsageError);  // no double free
  TagScope t("weights");
  EXPECT_EQ(d.malloc(4 * MiB), a + 20 * MiB);  // still asleep: a new segment, a not reused
  d.alloc.wake({"weights"});
  d.alloc.check_invariants();
  EXPECT_EQ(d.malloc(4 * MiB), a);  // the free took effect at wake
  d.free(b);
}

TEST(Sleep, WakeOutOfMemoryStaysAsleepAndSucceedsLater) {
  Device d(Config{}, 64 * MiB);
  std::uint64_t w = 0;
  {
    TagScope t("weights");
    w = d.malloc(30 * MiB);
  }
  EXPECT_EQ(d.alloc.sleep({}, {"weights"}), 30 * MiB);
  const auto big = d.malloc(50 * MiB);  // takes the memory the sleep gave back
  EXPECT_THROW(d.alloc.wake({}), OutOfMemory);
  d.alloc.check_invariants();
  EXPECT_EQ(d.alloc.sleep_stats().num_wake_ooms, 1);
  EXPECT_EQ(d.alloc.sleep_stats().sleeping_bytes.current, 30 * 1048576);
  EXPECT_EQ(d.alloc.sleep_stats().backup_bytes.current, 30 * 1048576);
  EXPECT_EQ(d.source.in_use(), 50 * MiB);
  d.free(big);
  d.alloc.empty_cache();
  d.alloc.wake({});
  EXPECT_EQ(d.source.in_use(), 30 * MiB);
  EXPECT_EQ(d.alloc.sleep_stats().backup_bytes.current, 0);
  d.free(w);
  d.alloc.check_invariants();
}

TEST(Sleep, FreeCachedSegmentsSleepWhateverTheTag) {
  Device d(Config{}, 1 * GiB);
  d.free(d.malloc(1 * MiB));  // a free cached small segment (2 MiB) of "default"
  std::uint64_t w = 0;
  {
    TagScope t("weights");
    w = d.malloc(12 * MiB);  // a 12 MiB segment
  }
  const auto def = d.malloc(12 * MiB);  // "default", live: stays awake
  EXPECT_EQ(d.alloc.sleep({"weights"}, {}), 14 * MiB);
  EXPECT_EQ(d.alloc.sleep({"weights"}, {}), 0u);  // already asleep
  EXPECT_EQ(d.source.in_use(), 12 * MiB);
  EXPECT_EQ(d.alloc.sleep_stats().backup_bytes.current, 0);
  d.alloc.wake({"weights"});  // the run with no live block wakes with any wake
  EXPECT_EQ(d.source.in_use(), 26 * MiB);
  d.free(w);
  d.free(def);
  d.alloc.check_invariants();
}

TEST(Sleep, SegmentsAreTagHomogeneous) {
  Device d(Config{}, 1 * GiB);
  const auto a = d.malloc(4 * MiB);  // "default": a 20 MiB segment, 16 MiB free
  std::uint64_t w = 0;
  {
    TagScope t("weights");
    w = d.malloc(4 * MiB);  // would fit a's segment: a segment of its own
  }
  EXPECT_EQ(w, kSeg0 + 20 * MiB);
  EXPECT_EQ(d.malloc(4 * MiB), a + 4 * MiB);  // "default" again: a's segment
  d.free(a);
  EXPECT_EQ(d.alloc.sleep({"weights"}, {}), 20 * MiB);
  EXPECT_EQ(d.source.in_use(), 20 * MiB);
  d.alloc.wake({});
  d.free(w);
  // A segment with no live block takes any tag.
  {
    TagScope t("kv_cache");
    EXPECT_EQ(d.malloc(8 * MiB), kSeg0 + 20 * MiB);
  }
}

// Expandable segments on a 1 GiB device (docs/pytorch-allocator.md §7): a large-pool reservation
// is ceil(1.125 GiB / 20 MiB) = 58 pages of 20 MiB = 1160 MiB, from 0x300000000 on.
constexpr std::uint64_t kRes0 = 0x300000000;
constexpr std::uint64_t kRes1 = kRes0 + 1160 * MiB;  // 0x348800000
constexpr std::uint64_t kRes2 = kRes1 + 1160 * MiB;  // 0x391000000

struct Small {
  explicit Small(const Config& c, Bytes capacity = 1 * GiB) : source(capacity, 1 * GiB), alloc(c, source) {}
  std::uint64_t malloc(Bytes n, StreamId s = 0) {
    const auto p = alloc.malloc(n, s);
    alloc.check_invariants();
    return p;
  }
  void free(std::uint64_t p) {
    alloc.free(p);
    alloc.check_invariants();
  }
  SyntheticSegmentSource source;
  Allocator alloc;
};

TEST(Sleep, ExpandableRunSleepsAndWakesAtItsAddresses) {
  Small d(conf("expandable_segments:True"));
  std::uint64_t w1 = 0, w2 = 0, k = 0;
  {
    TagScope t("weights");
    w1 = d.malloc(8 * MiB);  // maps the first 20 MiB page of a reservation
    w2 = d.malloc(8 * MiB);  // the same page; 4 MiB free after it
  }
  {
    TagScope t("kv_cache");
    // The first reservation holds live "weights": kv_cache grows a reservation of its own
    // (SLEEP-R1: an expandable segment is per (stream, tag)), not the first one's free 4 MiB.
    k = d.malloc(8 * MiB);
  }
  EXPECT_EQ(w1, kRes0);
  EXPECT_EQ(w2, kRes0 + 8 * MiB);
  EXPECT_EQ(k, kRes1);
  EXPECT_EQ(d.alloc.sleep({"weights"}, {"weights"}), 20 * MiB);  // one run, one page
  d.alloc.check_invariants();
  EXPECT_EQ(d.source.in_use(), 20 * MiB);
  const SleepStats& s = d.alloc.sleep_stats();
  EXPECT_EQ(s.sleeping_segments.current, 1);
  EXPECT_EQ(s.sleeping_bytes.current, 20 * 1048576);
  EXPECT_EQ(s.sleeping_allocated_bytes.current, 16 * 1048576);
  EXPECT_EQ(s.backup_bytes.current, 16 * 1048576);
  EXPECT_EQ(d.alloc.sleeping(), (TagList{"weights"}));
  const Snapshot snap = d.alloc.snapshot();
  ASSERT_EQ(snap.size(), 2u);
  EXPECT_EQ(snap[0].address, kRes0);
  EXPECT_TRUE(snap[0].is_sleeping && snap[0].is_expandable);
  EXPECT_EQ(snap[0].total_size, 20 * MiB);
  EXPECT_EQ(snap[0].backup_size, 16 * MiB);
  EXPECT_FALSE(snap[1].is_sleeping);
  std::uint64_t w3 = 0;
  {
    TagScope t("weights");
    // Not the sleeping run's free 4 MiB, not a page grown next to it (it would join the sleeping
    // run), not kv_cache's reservation: a third reservation.
    w3 = d.malloc(4 * MiB);
    EXPECT_EQ(w3, kRes2);
  }
  EXPECT_EQ(d.alloc.stats().reserved_bytes[0].current, 60 * 1048576);  // the sleeping 20 MiB too
  EXPECT_EQ(d.source.in_use(), 40 * MiB);
  d.free(w2);  // while asleep: takes effect at wake
  EXPECT_EQ(d.alloc.sleep_stats().sleeping_allocated_bytes.current, 8 * 1048576);
  EXPECT_EQ(d.alloc.sleep_stats().backup_bytes.current, 8 * 1048576);
  d.alloc.wake({"weights"});
  d.alloc.check_invariants();
  EXPECT_EQ(d.source.in_use(), 60 * MiB);
  EXPECT_EQ(d.alloc.sleep_stats().sleeping_bytes.current, 0);
  EXPECT_EQ(d.alloc.sleep_stats().backup_bytes.current, 0);
  EXPECT_EQ(d.alloc.stats().num_device_alloc, 3);  // three maps; sleep and wake are not counted
  EXPECT_TRUE(d.alloc.sleeping().empty());
  TagScope t("weights");
  // w2's 8 MiB merged with the 4 MiB after it: the best fit of 12 MiB (the third reservation's
  // free block is 16 MiB).
  EXPECT_EQ(d.malloc(12 * MiB), w2);
}

TEST(Sleep, TheFirstTaggedAllocationKeepsApartFromDefault) {
  Small d(conf("expandable_segments:True"));
  const auto a = d.malloc(4 * MiB);  // "default": the first reservation, 16 MiB free after a
  TagScope t("kv_cache");
  // The first allocation under another tag: not a's reservation (found by growing from its free
  // block), a reservation of its own.
  EXPECT_EQ(d.malloc(4 * MiB), kRes1);
  EXPECT_EQ(a, kRes0);
}

TEST(Sleep, ExpandableGrowthNeverJoinsASleepingRun) {
  Small d(conf("expandable_segments:True"));
  const auto a = d.malloc(20 * MiB);  // page 0
  const auto b = d.malloc(20 * MiB);  // page 1
  const auto c = d.malloc(20 * MiB);  // page 2
  EXPECT_EQ(c, kRes0 + 40 * MiB);
  d.free(b);
  d.alloc.empty_cache();  // page 1 unmapped: runs [0, 20) and [40, 60) MiB
  d.free(c);              // the second run: free, cached
  // Only the run with no live block sleeps (a's run holds "default", not named).
  EXPECT_EQ(d.alloc.sleep({"weights"}, {}), 20 * MiB);
  EXPECT_EQ(d.source.in_use(), 20 * MiB);
  // 40 MiB would fit page 1 (unmapped) plus the sleeping run's free page: growth may not map next to
  // a sleeping run, nor past it: a new reservation.
  const auto big = d.malloc(40 * MiB);
  EXPECT_EQ(big, kRes1);
  d.alloc.wake({"kv_cache"});  // a run with no live block wakes with any wake
  d.alloc.check_invariants();
  EXPECT_EQ(d.source.in_use(), 80 * MiB);
  EXPECT_EQ(d.malloc(20 * MiB), c);  // its free page is found again
  d.free(a);
  d.free(big);
}

TEST(Sleep, EmptyCacheGivesBackSleepingSegmentsWithNoLiveBlock) {
  Device d(Config{}, 1 * GiB);
  std::uint64_t w = 0, k = 0;
  {
    TagScope t("weights");
    w = d.malloc(30 * MiB);  // a 30 MiB segment at kSeg0
  }
  {
    TagScope t("kv_cache");
    k = d.malloc(8 * MiB);  // a 20 MiB segment at kSeg0 + 30 MiB
  }
  d.free(d.malloc(1 * MiB));  // a free cached 2 MiB small segment at kSeg0 + 50 MiB
  EXPECT_EQ(k, kSeg0 + 30 * MiB);
  EXPECT_EQ(d.alloc.sleep({}, {}), 52 * MiB);
  d.free(k);  // while asleep: the kv_cache segment now holds no live block
  const std::size_t rows = d.alloc.trace().size();
  d.alloc.empty_cache();
  d.alloc.check_invariants();
  // Both sleeping segments with no live block go back, addresses and all, as empty_cache gives
  // back awake ones (large pool first); the weights segment (live) stays asleep.
  const auto& tr = d.alloc.trace();
  ASSERT_EQ(tr.size(), rows + 2);
  EXPECT_EQ(tr[rows].action, TraceAction::SegmentFree);
  EXPECT_EQ(tr[rows].addr, kSeg0 + 30 * MiB);
  EXPECT_EQ(tr[rows].size, 20 * MiB);
  EXPECT_EQ(tr[rows + 1].action, TraceAction::SegmentFree);
  EXPECT_EQ(tr[rows + 1].addr, kSeg0 + 50 * MiB);
  EXPECT_EQ(tr[rows + 1].size, 2 * MiB);
  EXPECT_EQ(d.alloc.stats().segment[0].current, 1);
  EXPECT_EQ(d.alloc.stats().reserved_bytes[0].current, 30 * 1048576);
  EXPECT_EQ(d.alloc.stats().num_device_free, 2);
  EXPECT_EQ(d.alloc.total_allocated_memory(), 30 * MiB);
  EXPECT_EQ(d.alloc.sleep_stats().sleeping_segments.current, 1);
  EXPECT_EQ(d.alloc.sleep_stats().sleeping_bytes.current, 30 * 1048576);
  EXPECT_EQ(d.source.in_use(), 0u);  // nothing more: their memory went back at the sleep
  EXPECT_EQ(d.alloc.snapshot().size(), 1u);
  d.alloc.wake({});
  EXPECT_EQ(d.source.in_use(), 30 * MiB);
  TagScope t("kv_cache");
  EXPECT_EQ(d.malloc(8 * MiB), kSeg0 + 52 * MiB);  // a new segment: the old one is gone
  d.free(w);
}

TEST(Sleep, EmptyCacheUnmapsASleepingExpandableRunWithNoLiveBlock) {
  Small d(conf("expandable_segments:True"));
  const auto a = d.malloc(20 * MiB);
  const auto b = d.malloc(20 * MiB);
  const auto c = d.malloc(20 * MiB);
  d.free(b);
  d.alloc.empty_cache();  // page 1 unmapped: runs [0, 20) and [40, 60) MiB
  d.free(c);
  EXPECT_EQ(d.alloc.sleep({"weights"}, {}), 20 * MiB);  // the run with no live block
  d.alloc.empty_cache();
  d.alloc.check_invariants();
  const TraceEvent& last = d.alloc.trace().back();
  EXPECT_EQ(last.action, TraceAction::SegmentUnmap);
  EXPECT_EQ(last.addr, kRes0 + 40 * MiB);
  EXPECT_EQ(last.size, 20 * MiB);
  EXPECT_EQ(d.alloc.stats().reserved_bytes[0].current, 20 * 1048576);
  EXPECT_EQ(d.alloc.stats().num_device_free, 2);  // page 1, then the sleeping page 2
  EXPECT_EQ(d.alloc.sleep_stats().sleeping_segments.current, 0);
  EXPECT_EQ(d.alloc.sleep_stats().sleeping_bytes.current, 0);
  EXPECT_EQ(d.source.in_use(), 20 * MiB);
  // Nothing sleeps next to a's run any more: the segment grows right after it again.
  const auto big = d.malloc(40 * MiB);
  EXPECT_EQ(big, kRes0 + 20 * MiB);
  EXPECT_EQ(d.source.in_use(), 60 * MiB);
  d.free(a);
  d.free(big);
}

TEST(Sleep, UseOnOomPoolLendsOnlyWhatTheTagAllows) {
  Device d(Config{}, 64 * MiB);
  const PoolId pool{0, 1};
  d.alloc.set_use_on_oom(pool, true);
  d.alloc.begin_allocate_to_pool(pool, PoolRoute{});
  std::uint64_t g = 0;
  {
    TagScope t("graph");
    g = d.malloc(4 * MiB);  // the pool's 20 MiB segment at kSeg0, 16 MiB free after g
  }
  d.alloc.end_allocate_to_pool(pool);
  const auto x = d.malloc(40 * MiB);  // "default": 60 of the 64 MiB in use
  EXPECT_EQ(x, kSeg0 + 20 * MiB);
  {
    // No new 20 MiB segment fits; the pool's free block lies in a segment holding live "graph":
    // the fallback does not lend it to "weights" (SLEEP-R1), nothing else frees memory: OOM.
    TagScope t("weights");
    EXPECT_THROW(d.alloc.malloc(8 * MiB), OutOfMemory);
    d.alloc.check_invariants();
  }
  EXPECT_EQ(d.alloc.stats().num_ooms, 1);
  std::uint64_t borrowed = 0;
  {
    TagScope t("graph");
    borrowed = d.malloc(8 * MiB);  // the same tag: borrowed from the pool, after g
  }
  EXPECT_EQ(borrowed, kSeg0 + 4 * MiB);
  EXPECT_EQ(d.alloc.sleep({"graph"}, {}), 20 * MiB);
  EXPECT_EQ(d.alloc.sleep_stats().sleeping_allocated_bytes.current, 12 * 1048576);
  d.alloc.wake({});
  d.free(borrowed);
  d.free(g);
  d.free(x);
}

TEST(Sleep, SleepingBytesDoNotCountAgainstTheCap) {
  Small d(Config{});
  d.alloc.set_memory_fraction(0.0625);  // 1 GiB x 0.0625: a cap of 64 MiB
  std::uint64_t w = 0;
  {
    TagScope t("weights");
    w = d.malloc(40 * MiB);
  }
  EXPECT_EQ(d.alloc.sleep({}, {}), 40 * MiB);
  // SLEEP-R5: the cap counts reserved minus sleeping bytes, 0 + 40 MiB <= 64 MiB.
  const auto x = d.malloc(40 * MiB);
  EXPECT_EQ(x, kSeg0 + 40 * MiB);
  EXPECT_EQ(d.alloc.stats().reserved_bytes[0].current, 80 * 1048576);
  EXPECT_THROW(d.alloc.wake({}), OutOfMemory);  // 40 + 40 MiB awake would pass the cap
  EXPECT_EQ(d.alloc.sleep_stats().num_wake_ooms, 1);
  EXPECT_EQ(d.source.in_use(), 40 * MiB);
  d.free(x);
  d.alloc.empty_cache();
  d.alloc.wake({});
  d.alloc.check_invariants();
  EXPECT_EQ(d.source.in_use(), 40 * MiB);
  d.free(w);
}

TEST(Sleep, PendingFreesCompleteBeforeTheRunsAreChosen) {
  Device d(Config{}, 1 * GiB);
  {
    TagScope t("weights");
    d.malloc(4 * MiB);  // a 20 MiB segment at kSeg0
  }
  std::uint64_t k = 0;
  {
    TagScope t("kv_cache");
    k = d.malloc(4 * MiB);  // a 20 MiB segment at kSeg0 + 20 MiB
  }
  d.alloc.record_stream(k, 7);
  d.free(k);  // awaiting its event on stream 7: still live
  // The sleep waits for the event first (section 3, step 2): the kv_cache segment then holds no
  // live block and sleeps too.
  EXPECT_EQ(d.alloc.sleep({"weights"}, {}), 40 * MiB);
  d.alloc.check_invariants();
  EXPECT_EQ(d.alloc.stats().num_sync_all_streams, 1);
  EXPECT_EQ(d.alloc.sleep_stats().sleeping_segments.current, 2);
  EXPECT_EQ(d.source.in_use(), 0u);
}

TEST(Sleep, RefusalsChangeNothing) {
  Device d(Config{}, 1 * GiB);
  d.malloc(4 * MiB);
  EXPECT_THROW(d.alloc.sleep({"all"}, {}), UsageError);
  EXPECT_EQ(d.alloc.sleep_stats().num_sleeps, 0);
  EXPECT_EQ(d.source.in_use(), 20 * MiB);
}

TEST(Sleep, PrivatePoolSegmentsSleepAndWakeInTheirPool) {
  Device d(Config{}, 1 * GiB);
  const PoolId pool{0, 1};
  std::uint64_t g = 0, scratch = 0;
  d.alloc.begin_allocate_to_pool(pool, PoolRoute{});
  {
    TagScope t("graph");
    g = d.malloc(8 * MiB);        // the pool's 20 MiB segment
    scratch = d.malloc(4 * MiB);  // the same segment
  }
  try {
    d.alloc.sleep({}, {});
    ADD_FAILURE() << "no exception";
  } catch (const UsageError& e) {
    EXPECT_EQ(std::string(e.what()).rfind("sleep(): a CUDA graph capture or use_mem_pool is under way", 0), 0u);
  }
  d.free(scratch);
  d.alloc.end_allocate_to_pool(pool);
  const Snapshot before = d.alloc.snapshot();
  ASSERT_EQ(before.size(), 1u);
  EXPECT_EQ(before[0].pool_id, pool);
  EXPECT_EQ(d.alloc.sleep({"graph"}, {"graph"}), 20 * MiB);
  EXPECT_EQ(d.alloc.sleep_stats().backup_bytes.current, 8 * 1048576);
  EXPECT_EQ(d.malloc(4 * MiB), kSeg0 + 20 * MiB);  // the default pool: a segment of its own
  d.alloc.wake({"graph"});
  d.alloc.check_invariants();
  EXPECT_EQ(d.alloc.pool_use_count(pool), 1);
  Snapshot after = d.alloc.snapshot();
  ASSERT_EQ(after.size(), 2u);
  EXPECT_EQ(after[0], before[0]);  // the pool's segment as before: blocks, states, pool id
  d.alloc.begin_allocate_to_pool(pool, PoolRoute{});
  {
    TagScope t("graph");
    EXPECT_EQ(d.malloc(4 * MiB), scratch);  // the pool's free block again, at its address
  }
  d.alloc.end_allocate_to_pool(pool);
  d.free(g);
}

}  // namespace
}  // namespace cachet::model::test

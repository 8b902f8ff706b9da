// Sleep and wake in the model of policy:cachet (issue 24; cachet's rules, docs/sleep-wake.md): the
// 2 MiB page is the unit, pages are tag-homogeneous. Every address and figure below is worked out
// by hand from the rules (R1-R12 in gpu/include/cachet/gpu/policy_cachet.h, and
// docs/sleep-wake.md): the reservation starts at the synthetic source's first reservation address B
// = 0x300000000; requests of 1 MiB or less take the high end of R2's best fit, larger ones the low
// end; R3's window with no free neighbour of the stream starts at the unmapped block.
#include <gtest/gtest.h>

#include "cachet/config.h"
#include "cachet/errors.h"
#include "cachet/model/cachet_policy.h"
#include "cachet/model/segment_source.h"
#include "cachet/tags.h"

namespace cachet::model::test {
namespace {

constexpr std::uint64_t B = 0x300000000;

struct Cachet {
  explicit Cachet(Bytes capacity = 4 * GiB) : source(capacity) {}
  Config config = [] {
    Config c;
    c.policy = Policy::Cachet;
    return c;
  }();
  SyntheticSegmentSource source;
  CachetPolicy p{config, source};
  std::uint64_t malloc(Bytes n) {
    const auto ptr = p.malloc(n);
    p.check_invariants();
    return ptr;
  }
  void free(std::uint64_t ptr) {
    p.free(ptr);
    p.check_invariants();
  }
  std::int64_t reserved() const { return p.stats().reserved_bytes[0].current; }
};

TEST(CachetSleep, PagesOfATagSleepAndWakeAtTheSameAddresses) {
  Cachet c;
  std::uint64_t w = 0, k = 0;
  {
    TagScope t("weights");
    w = c.malloc(3 * MiB);  // R3 at B: pages 0 and 1; [B + 3 MiB, B + 4 MiB) free
  }
  {
    TagScope t("kv_cache");
    // The free 1 MiB shares page 1 with "weights": not a window's neighbour; page 2 is mapped.
    k = c.malloc(2 * MiB);
  }
  EXPECT_EQ(w, B);
  EXPECT_EQ(k, B + 4 * MiB);
  EXPECT_EQ(c.source.in_use(), 6 * MiB);
  EXPECT_EQ(c.p.sleep({"weights"}, {"weights"}), 4 * MiB);  // pages 0 and 1, one unmap
  c.p.check_invariants();
  EXPECT_EQ(c.source.in_use(), 2 * MiB);
  EXPECT_EQ(c.reserved(), 6 * 1048576);  // PyTorch's keys: still reserved, still one segment
  EXPECT_EQ(c.p.stats().segment[0].current, 1);
  const SleepStats& s = c.p.sleep_stats();
  EXPECT_EQ(s.sleeping_segments.current, 1);
  EXPECT_EQ(s.sleeping_bytes.current, 4 * 1048576);
  EXPECT_EQ(s.sleeping_allocated_bytes.current, 3 * 1048576);
  EXPECT_EQ(s.backup_bytes.current, 3 * 1048576);
  EXPECT_EQ(c.p.sleeping(), (TagList{"weights"}));
  const Snapshot snap = c.p.snapshot();
  ASSERT_EQ(snap.size(), 2u);
  EXPECT_EQ(snap[0].address, B);
  EXPECT_TRUE(snap[0].is_sleeping);
  EXPECT_EQ(snap[0].total_size, 4 * MiB);
  EXPECT_EQ(snap[0].backup_size, 3 * MiB);
  ASSERT_EQ(snap[0].blocks.size(), 2u);
  EXPECT_EQ(snap[1].address, B + 4 * MiB);
  EXPECT_FALSE(snap[1].is_sleeping);
  std::uint64_t w2 = 0;
  {
    TagScope t("weights");
    // R2 would take the high end of the sleeping page's free 1 MiB (B + 3.5 MiB): not while it
    // sleeps (SLEEP-R2); R3 maps page 3.
    w2 = c.malloc(512 * KiB);
  }
  EXPECT_EQ(w2, B + 6 * MiB);
  EXPECT_EQ(c.source.in_use(), 4 * MiB);
  c.free(w);  // while asleep: merges with the sleeping free 1 MiB, found again at the wake
  EXPECT_EQ(c.p.sleep_stats().sleeping_allocated_bytes.current, 0);
  EXPECT_EQ(c.p.sleep_stats().backup_bytes.current, 0);
  EXPECT_EQ(c.p.sleep_stats().num_frees_while_asleep, 1);
  EXPECT_EQ(c.p.stats().allocated_bytes[0].current, 2 * 1048576 + 512 * 1024);  // k and w2
  EXPECT_THROW(c.p.free(w), UsageError);                                        // no double free
  c.free(k);  // awake, next to the sleeping free 4 MiB: not merged with it
  {
    const Snapshot asleep = c.p.snapshot();
    ASSERT_EQ(asleep.size(), 2u);
    ASSERT_EQ(asleep[0].blocks.size(), 1u);
    EXPECT_EQ(asleep[0].blocks[0].size, 4 * MiB);
    EXPECT_EQ(asleep[1].blocks[0].address, B + 4 * MiB);
    EXPECT_EQ(asleep[1].blocks[0].size, 2 * MiB);
  }
  c.p.wake({"weights"});
  c.p.check_invariants();
  // At the wake the woken free 4 MiB merges with its awake free neighbour, as a free would.
  EXPECT_EQ(c.p.snapshot()[0].blocks[0].size, 6 * MiB);
  EXPECT_EQ(c.source.in_use(), 8 * MiB);
  EXPECT_EQ(c.p.sleep_stats().sleeping_bytes.current, 0);
  EXPECT_EQ(c.p.sleep_stats().sleeping_segments.current, 0);
  EXPECT_EQ(c.p.sleep_stats().num_sleeps, 1);
  EXPECT_EQ(c.p.sleep_stats().num_wakes, 1);
  EXPECT_TRUE(c.p.sleeping().empty());
  EXPECT_EQ(c.malloc(4 * MiB), B);  // "default": R2's best fit, the free 6 MiB's low end
}

TEST(CachetSleep, PagesAreTagHomogeneous) {
  Cachet c;
  std::uint64_t a = 0, b = 0;
  {
    TagScope t("weights");
    a = c.malloc(512 * KiB);  // R3 at B: page 0; [B + 512 KiB, B + 2 MiB) free
  }
  {
    TagScope t("kv_cache");
    b = c.malloc(512 * KiB);  // R2's high end B + 1.5 MiB is on page 0 ("weights"): page 1
  }
  EXPECT_EQ(a, B);
  EXPECT_EQ(b, B + 2 * MiB);
  EXPECT_EQ(c.p.sleep({"kv_cache"}, {}), 2 * MiB);  // page 1 only; page 0 holds live "weights"
  EXPECT_EQ(c.source.in_use(), 2 * MiB);
  c.p.wake({});
  c.free(b);
  {
    TagScope t("kv_cache");
    EXPECT_EQ(c.malloc(512 * KiB), B + 3584 * KiB);  // page 1, no live block: R2's high end
  }
}

TEST(CachetSleep, TheFirstTaggedAllocationKeepsApartFromDefault) {
  Cachet c;
  EXPECT_EQ(c.malloc(512 * KiB), B);  // "default": page 0
  TagScope t("kv_cache");
  EXPECT_EQ(c.malloc(512 * KiB), B + 2 * MiB);  // not page 0's high end: page 1
}

TEST(CachetSleep, SleepingFreeNeighboursMergeAndSplitAgainAtAPartialWake) {
  Cachet c;
  std::uint64_t k = 0, w1 = 0, w2 = 0;
  {
    TagScope t("kv_cache");
    k = c.malloc(3 * MiB);  // pages 0, 1; [B + 3 MiB, B + 4 MiB) free
  }
  EXPECT_EQ(c.p.sleep({"kv_cache"}, {}), 4 * MiB);
  {
    TagScope t("weights");
    w1 = c.malloc(3 * MiB);    // R3 past the sleeping pages: pages 2, 3
    w2 = c.malloc(512 * KiB);  // R2: the high end of [B + 7 MiB, B + 8 MiB)
  }
  EXPECT_EQ(w1, B + 4 * MiB);
  EXPECT_EQ(w2, B + 7680 * KiB);
  c.free(w1);  // [B + 4 MiB, B + 7.5 MiB) free; page 2 now holds no live block
  // Page 2 (free) and page 3 ("weights") sleep; the free 3.5 MiB merges with the sleeping free
  // 1 MiB before it.
  EXPECT_EQ(c.p.sleep({"weights"}, {}), 4 * MiB);
  c.p.check_invariants();
  Snapshot s = c.p.snapshot();
  ASSERT_EQ(s.size(), 1u);
  EXPECT_TRUE(s[0].is_sleeping);
  ASSERT_EQ(s[0].blocks.size(), 3u);
  EXPECT_EQ(s[0].blocks[1].address, B + 3 * MiB);
  EXPECT_EQ(s[0].blocks[1].size, 4608 * KiB);
  EXPECT_EQ(c.p.sleep_stats().sleeping_segments.current, 1);
  // kv_cache's pages wake, and page 2 (no live block at its sleep) with them; page 3 stays: the
  // free block is cut at B + 6 MiB.
  c.p.wake({"kv_cache"});
  c.p.check_invariants();
  EXPECT_EQ(c.p.sleep_stats().sleeping_bytes.current, 2 * 1048576);
  EXPECT_EQ(c.source.in_use(), 6 * MiB);
  s = c.p.snapshot();
  ASSERT_EQ(s.size(), 2u);
  EXPECT_FALSE(s[0].is_sleeping);
  EXPECT_EQ(s[0].total_size, 6 * MiB);
  ASSERT_EQ(s[0].blocks.size(), 2u);
  EXPECT_EQ(s[0].blocks[1].size, 3 * MiB);
  EXPECT_TRUE(s[1].is_sleeping);
  EXPECT_EQ(s[1].address, B + 6 * MiB);
  ASSERT_EQ(s[1].blocks.size(), 2u);
  EXPECT_EQ(s[1].blocks[0].size, 1536 * KiB);
  c.p.wake({});
  c.free(k);
  c.free(w2);
}

TEST(CachetSleep, WokenFreePagesBeyondTheBudgetAreUnmapped) {
  Cachet c;
  c.free(c.malloc(4 * MiB));  // pages 0, 1: T = 2, both free, still mapped
  EXPECT_EQ(c.p.sleep({}, {}), 4 * MiB);
  const auto y = c.malloc(4 * MiB);  // not the sleeping pages: pages 2, 3 (2 awake <= budget 2)
  EXPECT_EQ(y, B + 4 * MiB);
  c.p.wake({});  // pages 0, 1 wake: 4 awake pages, budget(2) = 2: R6 unmaps pages 0, 1 again
  c.p.check_invariants();
  EXPECT_EQ(c.reserved(), 4 * 1048576);
  EXPECT_EQ(c.source.in_use(), 4 * MiB);
  EXPECT_EQ(c.p.stats().num_device_free, 1);
  const TraceEvent& last = c.p.trace().back();
  EXPECT_EQ(last.action, TraceAction::SegmentUnmap);
  EXPECT_EQ(last.addr, B);
  EXPECT_EQ(last.size, 4 * MiB);
  c.free(y);
}

TEST(CachetSleep, FreePagesSleepAndEmptyCacheGivesThemBack) {
  Cachet c;
  const auto x = c.malloc(4 * MiB);  // pages 0, 1
  const auto y = c.malloc(4 * MiB);  // pages 2, 3
  EXPECT_EQ(y, B + 4 * MiB);
  c.free(y);  // pages 2 and 3 free, still mapped
  // Pages no live block touches sleep whatever the tags named.
  EXPECT_EQ(c.p.sleep({"weights"}, {}), 4 * MiB);
  EXPECT_EQ(c.p.sleep({"weights"}, {}), 0u);  // already asleep
  EXPECT_EQ(c.source.in_use(), 4 * MiB);
  EXPECT_TRUE(c.p.sleeping().empty());
  const auto z = c.malloc(4 * MiB);  // not the sleeping free pages: pages 4, 5
  EXPECT_EQ(z, B + 8 * MiB);
  EXPECT_EQ(c.reserved(), 12 * 1048576);
  c.p.empty_cache();
  c.p.check_invariants();
  // Pages 2 and 3 go back entirely, as R6 unmaps: one unmap, two runs of mapped pages left.
  EXPECT_EQ(c.reserved(), 8 * 1048576);
  EXPECT_EQ(c.p.stats().num_device_free, 1);
  EXPECT_EQ(c.p.stats().segment[0].current, 2);
  const TraceEvent& last = c.p.trace().back();
  EXPECT_EQ(last.action, TraceAction::SegmentUnmap);
  EXPECT_EQ(last.addr, B + 4 * MiB);
  EXPECT_EQ(last.size, 4 * MiB);
  EXPECT_EQ(c.p.sleep_stats().sleeping_bytes.current, 0);
  EXPECT_EQ(c.p.sleep_stats().sleeping_segments.current, 0);
  EXPECT_EQ(c.source.in_use(), 8 * MiB);  // nothing more: their memory went back at the sleep
  c.free(x);
  c.free(z);
}

TEST(CachetSleep, WakeOutOfMemoryStaysAsleepAndSucceedsLater) {
  Cachet c(8 * MiB);
  std::uint64_t w = 0;
  {
    TagScope t("weights");
    w = c.malloc(4 * MiB);  // pages 0, 1
  }
  EXPECT_EQ(c.p.sleep({}, {"weights"}), 4 * MiB);
  const auto big = c.malloc(6 * MiB);  // pages 2, 3, 4: the memory the sleep gave back
  EXPECT_EQ(big, B + 4 * MiB);
  EXPECT_THROW(c.p.wake({}), OutOfMemory);  // 4 MiB needed, 2 MiB free
  c.p.check_invariants();
  EXPECT_EQ(c.p.sleep_stats().num_wake_ooms, 1);
  EXPECT_EQ(c.p.sleep_stats().sleeping_bytes.current, 4 * 1048576);
  EXPECT_EQ(c.p.sleep_stats().backup_bytes.current, 4 * 1048576);
  EXPECT_EQ(c.source.in_use(), 6 * MiB);
  c.free(big);
  c.p.empty_cache();  // pages 2-4 unmapped; pages 0 and 1 hold live "weights": they stay asleep
  EXPECT_EQ(c.source.in_use(), 0u);
  EXPECT_EQ(c.p.sleep_stats().sleeping_bytes.current, 4 * 1048576);
  c.p.wake({});
  c.p.check_invariants();
  EXPECT_EQ(c.source.in_use(), 4 * MiB);
  EXPECT_EQ(c.p.sleep_stats().backup_bytes.current, 0);
  c.free(w);
}

TEST(CachetSleep, SleepingPagesDoNotCountAgainstTheCap) {
  Cachet c;
  c.p.set_memory_fraction(0.015625);  // 4 GiB x 1/64: a cap of 64 MiB, 32 pages
  std::uint64_t w = 0;
  {
    TagScope t("weights");
    w = c.malloc(40 * MiB);  // pages 0-19
  }
  EXPECT_EQ(c.p.sleep({}, {}), 40 * MiB);
  // SLEEP-R5: R7 counts awake pages, 0 + 20 <= 32.
  const auto x = c.malloc(40 * MiB);
  EXPECT_EQ(x, B + 40 * MiB);
  EXPECT_EQ(c.reserved(), 80 * 1048576);
  EXPECT_THROW(c.p.wake({}), OutOfMemory);  // 20 + 20 awake pages would pass the cap
  c.free(x);
  EXPECT_THROW(c.p.wake({}), OutOfMemory);  // x's free pages are still mapped
  c.p.empty_cache();                        // R9 unmaps them
  c.p.wake({});
  c.p.check_invariants();
  EXPECT_EQ(c.p.sleep_stats().num_wake_ooms, 2);
  EXPECT_EQ(c.source.in_use(), 40 * MiB);
  c.free(w);
}

TEST(CachetSleep, PendingFreesCompleteBeforeThePagesAreChosen) {
  Cachet c;
  {
    TagScope t("weights");
    c.malloc(4 * MiB);  // pages 0, 1
  }
  std::uint64_t k = 0;
  {
    TagScope t("kv_cache");
    k = c.malloc(4 * MiB);  // pages 2, 3
  }
  EXPECT_EQ(k, B + 4 * MiB);
  c.p.record_stream(k, 7);
  c.free(k);  // awaiting its event on stream 7: still live
  // R9's wait first: pages 2 and 3 then hold no live block and sleep too.
  EXPECT_EQ(c.p.sleep({"weights"}, {}), 8 * MiB);
  c.p.check_invariants();
  EXPECT_EQ(c.p.stats().num_sync_all_streams, 1);
  EXPECT_EQ(c.p.sleep_stats().sleeping_segments.current, 1);  // pages 0-3: one run
  EXPECT_EQ(c.source.in_use(), 0u);
}

TEST(CachetSleep, RefusedWhileAPoolIsActive) {
  Cachet c;
  const PoolId id{0, 1};
  c.p.begin_allocate_to_pool(id, PoolRoute{PoolRoute::Kind::CurrentThread, 0});
  c.malloc(1 * MiB);
  try {
    c.p.sleep({}, {});
    ADD_FAILURE() << "no exception";
  } catch (const UsageError& e) {
    EXPECT_EQ(std::string(e.what()).rfind(
                  "sleep(): a CUDA graph capture or use_mem_pool is under way", 0),
              0u);
  }
  EXPECT_EQ(c.p.sleep_stats().num_sleeps, 0);
  EXPECT_EQ(c.source.in_use(), 2 * MiB);
  EXPECT_THROW(c.p.sleep({"none"}, {}), UsageError);
}

}  // namespace
}  // namespace cachet::model::test

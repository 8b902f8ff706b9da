// Sleep and wake in gpu/ (issue 24; the rules are docs/sleep-wake.md): policy:pytorch over the host
// backend (which keeps the contents of mapped memory, so backups and restores are observable) and
// the fault backend (a wake's map and a backup's pinned buffer failing at a chosen call), with
// expandable segments off and on. Every case runs in validate mode (invariants() after every
// operation, INV-SLEEP-1..5 included). Exact pointers, stats and contents; the values are worked
// out by hand in the comments.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cachet/errors.h"
#include "cachet/gpu/allocator.h"
#include "cachet/gpu/fault_backend.h"
#include "cachet/gpu/host_backend.h"
#include "cachet/gpu/pinned_keep.h"
#include "cachet/tags.h"

namespace cachet::test {
namespace {

using gpu::DevicePtr;

// The host backend's first reservation (HostOptions::first_address + 2^44): cachet_sleep segments
// are reserved, and each reservation is followed by a 2 MiB guard gap.
constexpr DevicePtr kVa = 0x7f0000000000 + (DevicePtr{1} << 44);

DevicePtr dev(void* p) { return static_cast<DevicePtr>(reinterpret_cast<std::uintptr_t>(p)); }

struct Rig {
  std::shared_ptr<gpu::HostSim> sim;
  gpu::FaultInjector* faults = nullptr;
  std::unique_ptr<CachingAllocator> a;

  void* alloc(Bytes n, const char* tag = "default", StreamId s = 0) {
    TagScope t(tag);
    return a->allocate(n, s);
  }
  void fill(void* p, unsigned char byte, Bytes n) { ASSERT_TRUE(sim->fill(dev(p), byte, n).is_ok()); }
  // Every byte of [p, p+n) is `byte`.
  bool holds(void* p, unsigned char byte, Bytes n) const {
    std::vector<unsigned char> got(n);
    if (!sim->read(dev(p), got.data(), n).is_ok()) return false;
    for (unsigned char c : got)
      if (c != byte) return false;
    return true;
  }
};

Rig make_rig(bool expandable, Bytes capacity = 1 * GiB, bool sleep = true, Policy policy = Policy::PyTorch) {
  Rig r;
  gpu::HostOptions o;
  o.capacity = capacity;
  auto inj = std::make_unique<gpu::FaultInjector>(gpu::make_host_memory(o, &r.sim));
  r.faults = inj.get();
  Config c;
  c.expandable_segments = expandable;
  c.sleep = sleep;
  c.validate = true;
  c.policy = policy;
  r.a = std::make_unique<CachingAllocator>(std::move(inj), c);
  return r;
}

class Sleep : public ::testing::TestWithParam<bool> {
 protected:
  bool expandable() const { return GetParam(); }
};

TEST_P(Sleep, WeightsSleepAndWakeAtTheSameAddresses) {
  Rig r = make_rig(expandable());
  // Off: three segments, of 30 MiB (weights), 20 MiB (kv_cache) and 20 MiB ("default", stream 7).
  // On: one expandable segment per (stream, tag), 20 MiB pages: 40, 20 and 20 MiB mapped.
  void* w = r.alloc(30 * MiB, "weights");
  void* kv = r.alloc(8 * MiB, "kv_cache");
  void* other = r.alloc(4 * MiB, "default", 7);
  const Bytes seg_w = expandable() ? 40 * MiB : 30 * MiB;
  const Bytes va_w = expandable() ? 1162 * MiB : 32 * MiB;  // 58 pages of 20 MiB (1.125 GiB) + the gap
  EXPECT_EQ(dev(w), kVa);
  EXPECT_EQ(dev(kv), kVa + va_w);
  EXPECT_EQ(dev(other), kVa + va_w + (expandable() ? 1162 * MiB : 22 * MiB));
  EXPECT_EQ(r.sim->used(), seg_w + 40 * MiB);
  r.fill(w, 0x11, 30 * MiB);
  r.fill(kv, 0x22, 8 * MiB);
  r.fill(other, 0x33, 4 * MiB);
  const DeviceStats before = r.a->stats();

  EXPECT_EQ(r.a->sleep({"weights", "kv_cache"}, {"weights"}), seg_w + 20 * MiB);
  EXPECT_EQ(r.sim->used(), 20 * MiB);
  EXPECT_EQ(r.sim->pinned_bytes(), 30 * MiB);  // one buffer: the weights' live bytes
  DeviceStats expected = before;
  expected.num_sync_all_streams += 1;  // sleep synchronizes as empty_cache does
  EXPECT_EQ(r.a->stats(), expected);   // PyTorch's 122 keys keep their meaning
  const SleepStats s = r.a->sleep_stats();
  EXPECT_EQ(s.sleeping_segments.current, 2);
  EXPECT_EQ(s.sleeping_bytes.current, static_cast<std::int64_t>(seg_w + 20 * MiB));
  EXPECT_EQ(s.sleeping_allocated_bytes.current, 38 * 1048576);
  EXPECT_EQ(s.backup_bytes.current, 30 * 1048576);
  EXPECT_EQ(s.num_sleeps, 1);
  EXPECT_EQ(r.a->sleeping(), (TagList{"kv_cache", "weights"}));
  const Snapshot snap = r.a->snapshot();
  ASSERT_EQ(snap.size(), 3u);
  EXPECT_TRUE(snap[0].is_sleeping);
  EXPECT_EQ(snap[0].backup_size, 30 * MiB);
  EXPECT_EQ(snap[0].total_size, seg_w);
  EXPECT_TRUE(snap[1].is_sleeping);
  EXPECT_EQ(snap[1].backup_size, 0u);
  EXPECT_FALSE(snap[2].is_sleeping);
  EXPECT_FALSE(r.holds(w, 0x11, 1));  // no memory behind it now

  // No allocation lands in a sleeping range (kv_cache's free 12 MiB would be the best fit).
  void* fresh = r.alloc(8 * MiB, "default", 7);
  EXPECT_EQ(dev(fresh), dev(other) + 4 * MiB);
  EXPECT_EQ(r.a->sleep({"weights"}, {"weights"}), 0u);  // already asleep: nothing more

  const std::size_t pieces = r.sim->map_piece_calls();
  r.a->wake({});
  EXPECT_EQ(r.sim->map_piece_calls(), pieces + 2);  // one piece per range (each under 512 MiB)
  EXPECT_EQ(r.sim->used(), seg_w + 40 * MiB);
  EXPECT_EQ(r.sim->pinned_bytes(), 0u);
  EXPECT_TRUE(r.holds(w, 0x11, 30 * MiB));   // backed up and restored
  EXPECT_TRUE(r.holds(kv, 0xA5, 8 * MiB));   // not backed up: the backend's fresh pattern
  EXPECT_TRUE(r.holds(other, 0x33, 4 * MiB));  // never slept
  const SleepStats after = r.a->sleep_stats();
  EXPECT_EQ(after.sleeping_segments.current, 0);
  EXPECT_EQ(after.sleeping_bytes.current, 0);
  EXPECT_EQ(after.sleeping_bytes.peak, static_cast<std::int64_t>(seg_w + 20 * MiB));
  EXPECT_EQ(after.backup_bytes.current, 0);
  EXPECT_EQ(after.num_wakes, 1);
  EXPECT_TRUE(r.a->sleeping().empty());
  // kv_cache's free 12 MiB is found again, by kv_cache only (segments are tag-homogeneous).
  EXPECT_EQ(dev(r.alloc(12 * MiB, "kv_cache")), dev(kv) + 8 * MiB);
}

TEST_P(Sleep, FreeWhileAsleepTakesEffectAtWake) {
  Rig r = make_rig(expandable());
  void* a = r.alloc(4 * MiB, "weights");
  void* b = r.alloc(4 * MiB, "weights");  // one 20 MiB segment (page), 12 MiB free
  EXPECT_EQ(dev(b), dev(a) + 4 * MiB);
  r.fill(b, 0x5B, 4 * MiB);
  r.a->record_stream(b, 5);  // a stream use; sleep's synchronize has nothing to wait for
  EXPECT_EQ(r.a->sleep({"weights"}, {"weights"}), 20 * MiB);
  EXPECT_EQ(r.sim->pinned_bytes(), 8 * MiB);
  r.a->record_stream(a, 9);  // allowed while asleep: it only adds a stream use
  r.a->free(a);              // no event: nothing runs on memory that is not there
  EXPECT_EQ(r.a->stats().allocated_bytes[0].current, 4 * 1048576);
  EXPECT_EQ(r.a->stats().active_bytes[0].current, 4 * 1048576);
  EXPECT_EQ(r.a->sleep_stats().sleeping_allocated_bytes.current, 4 * 1048576);
  EXPECT_EQ(r.a->sleep_stats().backup_bytes.current, 4 * 1048576);
  EXPECT_EQ(r.a->sleep_stats().num_frees_while_asleep, 1);
  EXPECT_THROW(r.a->free(a), UsageError);  // no double free
  // Still asleep: a new segment, a is not reused. Expandable: a new reservation (58 pages of
  // 20 MiB and the 2 MiB gap after a's): growth never maps next to a sleeping run (section 4).
  void* c = r.alloc(4 * MiB, "weights");
  EXPECT_EQ(dev(c), dev(a) + (expandable() ? 1162 * MiB : 22 * MiB));
  r.a->wake({"weights"});
  EXPECT_TRUE(r.holds(b, 0x5B, 4 * MiB));
  EXPECT_EQ(r.alloc(4 * MiB, "weights"), a);  // the free took effect at wake
  EXPECT_EQ(r.sim->pinned_bytes(), 0u);
}

TEST_P(Sleep, WakeOutOfMemoryStaysAsleepAndSucceedsLater) {
  Rig r = make_rig(expandable(), 64 * MiB);
  void* w = r.alloc(30 * MiB, "weights");
  r.fill(w, 0x77, 30 * MiB);
  const Bytes seg_w = expandable() ? 40 * MiB : 30 * MiB;
  EXPECT_EQ(r.a->sleep({}, {"weights"}), seg_w);
  void* big = r.alloc(50 * MiB);  // takes the memory the sleep gave back (expandable: 60 MiB mapped)
  try {
    r.a->wake({});
    FAIL() << "wake fitted";
  } catch (const OutOfMemory& e) {
    EXPECT_NE(std::string(e.what()).find("waking needs " + std::to_string(seg_w) + " bytes"), std::string::npos)
        << e.what();
  }
  SleepStats s = r.a->sleep_stats();
  EXPECT_EQ(s.num_wake_ooms, 1);
  EXPECT_EQ(s.num_wakes, 0);
  EXPECT_EQ(s.sleeping_bytes.current, static_cast<std::int64_t>(seg_w));
  EXPECT_EQ(s.backup_bytes.current, 30 * 1048576);
  EXPECT_EQ(r.sim->pinned_bytes(), 30 * MiB);
  EXPECT_EQ(r.a->sleeping(), TagList{"weights"});
  r.a->free(big);
  r.a->empty_cache();
  r.a->wake({});
  EXPECT_TRUE(r.holds(w, 0x77, 30 * MiB));
  EXPECT_EQ(r.a->sleep_stats().backup_bytes.current, 0);
  EXPECT_EQ(r.sim->pinned_bytes(), 0u);
  r.a->free(w);
}

TEST_P(Sleep, AFailingMapLeavesEverythingAsleep) {
  Rig r = make_rig(expandable());
  void* w = r.alloc(30 * MiB, "weights");
  void* kv = r.alloc(8 * MiB, "kv_cache");
  r.fill(w, 0x42, 30 * MiB);
  r.a->sleep({}, {"weights"});
  const Bytes asleep = r.sim->used();
  // The second range's map fails: the first one's is undone.
  r.faults->set_plan({gpu::CallClass::Alloc, 2, 0.0, 1, true, false});
  EXPECT_THROW(r.a->wake({}), OutOfMemory);
  r.faults->clear();
  EXPECT_EQ(r.sim->used(), asleep);
  EXPECT_EQ(r.a->sleep_stats().num_wake_ooms, 1);
  EXPECT_EQ(r.a->sleep_stats().sleeping_segments.current, 2);
  EXPECT_EQ(r.a->sleeping(), (TagList{"kv_cache", "weights"}));
  r.a->wake({"kv_cache", "weights"});
  EXPECT_TRUE(r.holds(w, 0x42, 30 * MiB));
  r.a->free(w);
  r.a->free(kv);
}

TEST_P(Sleep, ABackupThatCannotBeHadChangesNothing) {
  Rig r = make_rig(expandable());
  void* w = r.alloc(30 * MiB, "weights");
  void* kv = r.alloc(8 * MiB, "kv_cache");
  r.fill(w, 0x42, 30 * MiB);
  r.a->free(r.alloc(2 * MiB));  // a free cached segment too
  const DeviceStats stats = r.a->stats();
  const Snapshot snap = r.a->snapshot();
  const Bytes used = r.sim->used();
  r.faults->set_plan({gpu::CallClass::HostAlloc, 2, 0.0, 1, true, false});  // the second tag's buffer
  EXPECT_THROW(r.a->sleep({}, {"weights", "kv_cache"}), OutOfMemory);
  r.faults->clear();
  DeviceStats expected = stats;
  expected.num_sync_all_streams = stats.num_sync_all_streams;
  EXPECT_EQ(r.a->stats(), expected);  // not even the synchronize happened
  EXPECT_EQ(r.sim->used(), used);
  EXPECT_EQ(r.sim->pinned_bytes(), 0u);
  EXPECT_EQ(r.a->sleep_stats().num_backup_failures, 1);
  EXPECT_EQ(r.a->sleep_stats().num_sleeps, 0);
  EXPECT_EQ(r.a->sleep_stats().sleeping_segments.current, 0);
  const Snapshot now = r.a->snapshot();
  ASSERT_EQ(now.size(), snap.size());
  for (std::size_t i = 0; i < now.size(); ++i) EXPECT_FALSE(now[i].is_sleeping);
  EXPECT_TRUE(r.holds(w, 0x42, 30 * MiB));
  // And once the host memory is there, the same sleep works.
  EXPECT_GT(r.a->sleep({}, {"weights", "kv_cache"}), 0u);
  EXPECT_EQ(r.sim->pinned_bytes(), 38 * MiB);
  r.a->wake({});
  EXPECT_TRUE(r.holds(w, 0x42, 30 * MiB));
  r.a->free(w);
  r.a->free(kv);
}

TEST_P(Sleep, SleepingBytesDoNotCountAgainstTheCap) {
  Rig r = make_rig(expandable());
  r.a->set_memory_fraction(0.0625);  // 64 MiB of 1 GiB
  void* w = r.alloc(30 * MiB, "weights");
  EXPECT_THROW(r.alloc(40 * MiB), OutOfMemory);  // 30 (40) + 40 MiB is over the cap
  r.a->sleep({"weights"}, {});
  void* t = r.alloc(40 * MiB);  // the memory the sleep gave back, under the same cap
  EXPECT_NE(t, nullptr);
  EXPECT_THROW(r.a->wake({}), OutOfMemory);  // the cap refuses the wake
  EXPECT_EQ(r.a->sleep_stats().num_wake_ooms, 1);
  r.a->free(t);
  r.a->empty_cache();
  r.a->wake({});
  r.a->free(w);
}

TEST_P(Sleep, EmptyCacheGivesBackSleepingRangesWithNoLiveBlock) {
  Rig r = make_rig(expandable());
  void* a = r.alloc(4 * MiB, "weights");
  void* keep = r.alloc(30 * MiB, "kv_cache");
  r.a->sleep({}, {"weights"});
  r.a->free(a);
  EXPECT_EQ(r.a->sleep_stats().backup_bytes.current, 0);
  const std::int64_t reserved = r.a->stats().reserved_bytes[0].current;
  r.a->empty_cache();
  // a's range (20 MiB) is gone, addresses and all; kv_cache's stays asleep.
  EXPECT_EQ(r.a->stats().reserved_bytes[0].current, reserved - 20 * 1048576);
  EXPECT_EQ(r.a->sleep_stats().sleeping_segments.current, 1);
  EXPECT_EQ(r.a->sleeping(), TagList{"kv_cache"});
  EXPECT_EQ(r.sim->pinned_bytes(), 0u);
  r.a->wake({});
  r.a->free(keep);
  r.a->empty_cache();
  EXPECT_EQ(r.a->stats().reserved_bytes[0].current, 0);
  EXPECT_EQ(r.sim->used(), 0u);
}

TEST_P(Sleep, OtherTagsKeepWorkingWhileAsleep) {
  Rig r = make_rig(expandable());
  void* w = r.alloc(2 * MiB, "weights");
  r.a->free(r.alloc(6 * MiB, "weights"));  // the weights' segment keeps free room
  r.a->sleep({"weights"}, {});
  for (int i = 0; i < 20; ++i) {
    void* p = r.alloc(static_cast<Bytes>(1 + i) * 512 * 1024, i % 2 ? "kv_cache" : "default");
    EXPECT_TRUE(r.a->invariants().empty());
    r.a->free(p);
  }
  r.a->wake({"weights"});
  r.a->free(w);
}

// A CUDA graph's private pool sleeps and wakes with its blocks, pointers and use count as before
// (docs/sleep-wake.md section 2: a capture's allocations carry the capturing thread's tag).
TEST_P(Sleep, AGraphPoolSleepsAndWakesWhole) {
  Rig r = make_rig(expandable());
  const PoolId pool{1, 7};
  r.a->create_or_incref_pool(pool);
  r.a->begin_allocate_to_pool(pool, [](StreamId) { return true; }, true);
  void* g = r.alloc(6 * MiB, "graph");
  void* h = r.alloc(3 * MiB, "graph");
  r.a->end_allocate_to_pool(pool);
  r.fill(g, 0x61, 6 * MiB);
  r.fill(h, 0x62, 3 * MiB);
  void* outside = r.alloc(2 * MiB, "graph");  // the default pool: a segment of its own
  const Snapshot before = r.a->snapshot();
  EXPECT_EQ(r.a->sleep({"graph"}, {"graph"}), 40 * MiB);  // the pool's 20 MiB and the default pool's 20 MiB
  EXPECT_EQ(r.a->pool_use_count(pool), 2);  // create_or_incref_pool and begin_allocate_to_pool: unchanged
  r.a->wake({"graph"});
  EXPECT_TRUE(r.holds(g, 0x61, 6 * MiB));
  EXPECT_TRUE(r.holds(h, 0x62, 3 * MiB));
  Snapshot after = r.a->snapshot();
  EXPECT_EQ(after, before);
  // The pool's free room is the pool's again after the wake.
  r.a->begin_allocate_to_pool(pool, [](StreamId) { return true; }, true);
  EXPECT_EQ(dev(r.alloc(MiB * 2, "graph")), dev(h) + 3 * MiB);
  r.a->end_allocate_to_pool(pool);
  r.a->free(outside);
}

// torch_memory_saver's disable() (python/cachet_torch/memory_saver.py): a MemPool entered with
// use_mem_pool while tags sleep takes the thread's allocations in awake memory of its own, and
// dropping it (releasePool twice, emptyCache of the pool: ATen's ~MemPool) gives back that memory
// only. The sleeping ranges, the free cached segment that slept with the weights included, stay
// asleep and wake whole. A sleep cannot start while the pool is in use (section 3 step 1).
TEST_P(Sleep, AMemPoolWhileAsleepGivesBackOnlyItsOwnMemory) {
  Rig r = make_rig(expandable());
  void* w = r.alloc(30 * MiB, "weights");
  r.fill(w, 0x11, 30 * MiB);
  r.a->free(r.alloc(40 * MiB));  // free cached memory: it sleeps with any sleep
  EXPECT_EQ(r.a->sleep({"weights"}, {"weights"}), (expandable() ? 40 * MiB : 30 * MiB) + 40 * MiB);
  const SleepStats asleep = r.a->sleep_stats();
  const std::int64_t reserved = r.a->stats().reserved_bytes[0].current;
  EXPECT_EQ(r.sim->used(), 0u);

  const PoolId pool{0, 1};
  r.a->create_or_incref_pool(pool);                 // torch.cuda.MemPool()
  r.a->begin_allocate_to_pool(pool, PoolRoute{});   // use_mem_pool(pool): this thread
  void* p = r.alloc(60 * MiB);  // a segment of 60 MiB (on: three pages of 20 MiB)
  EXPECT_EQ(r.sim->used(), 60 * MiB);
  EXPECT_THROW(r.a->sleep({"weights"}, {}), UsageError);
  r.a->free(p);
  r.a->end_allocate_to_pool(pool);
  r.a->release_pool(pool);
  r.a->release_pool(pool);  // del pool: releasePool, then emptyCache(pool)
  r.a->empty_cache(pool);

  EXPECT_EQ(r.sim->used(), 0u);
  EXPECT_EQ(r.a->stats().reserved_bytes[0].current, reserved);
  EXPECT_EQ(r.a->sleep_stats().sleeping_segments.current, asleep.sleeping_segments.current);
  EXPECT_EQ(r.a->sleep_stats().sleeping_bytes.current, asleep.sleeping_bytes.current);
  EXPECT_EQ(r.a->sleep_stats().backup_bytes.current, asleep.backup_bytes.current);
  r.a->wake({});
  EXPECT_EQ(r.sim->used(), static_cast<Bytes>(reserved));  // everything that slept is back
  EXPECT_TRUE(r.holds(w, 0x11, 30 * MiB));
  r.a->free(w);
}

// With every allocation under "default", cachet_sleep changes no decision: the same stats and the
// same block layout (relative to each segment) as without it.
TEST_P(Sleep, NoDecisionChangesWithoutTags) {
  auto run = [&](bool sleep) {
    Rig r = make_rig(expandable(), 1 * GiB, sleep);
    std::mt19937_64 rng(7);
    std::vector<void*> live;
    for (int i = 0; i < 400; ++i) {
      if (live.empty() || rng() % 3 != 0) {
        live.push_back(r.a->allocate(1 + rng() % (rng() % 4 == 0 ? 40 * MiB : MiB), rng() % 2));
      } else {
        const std::size_t j = rng() % live.size();
        r.a->free(live[j]);
        live.erase(live.begin() + static_cast<std::ptrdiff_t>(j));
      }
      if (i % 97 == 0) r.a->empty_cache();
    }
    std::vector<std::vector<std::pair<Bytes, cachet::BlockState>>> layout;
    for (const auto& s : r.a->snapshot()) {
      layout.emplace_back();
      for (const auto& b : s.blocks) layout.back().emplace_back(b.address - s.address, b.state);
    }
    return std::pair{r.a->stats(), layout};
  };
  const auto off = run(false);
  const auto on = run(true);
  EXPECT_EQ(off.first, on.first);
  EXPECT_EQ(off.second, on.second);
}

INSTANTIATE_TEST_SUITE_P(Expandable, Sleep, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? std::string("on") : std::string("off"); });

// --- policy:cachet (policy_cachet/sleep.cpp): the 2 MiB page is the unit; one reservation at kVa,
// placements left aligned in the first unmapped window (R3), every page mapped by its allocation;
// pages are tag-homogeneous (SLEEP-R1), so sleep and wake take any subset of tags.

Rig cachet_rig(Bytes capacity = 1 * GiB) { return make_rig(false, capacity, true, Policy::Cachet); }

TEST(CachetSleep, EveryPageSleepsAndWakesAtTheSameAddresses) {
  Rig r = cachet_rig();
  void* w = r.alloc(30 * MiB, "weights");        // pages 0-14
  void* kv = r.alloc(8 * MiB, "kv_cache");       // pages 15-18
  void* other = r.alloc(4 * MiB, "default", 7);  // pages 19-20
  EXPECT_EQ(dev(w), kVa);
  EXPECT_EQ(dev(kv), kVa + 30 * MiB);
  EXPECT_EQ(dev(other), kVa + 38 * MiB);
  EXPECT_EQ(r.sim->used(), 42 * MiB);
  r.fill(w, 0x11, 30 * MiB);
  r.fill(kv, 0x22, 8 * MiB);
  r.fill(other, 0x33, 4 * MiB);
  const DeviceStats before = r.a->stats();

  // Every tag with live blocks named: the same as no tags. One run of 21 pages, one unmap.
  EXPECT_EQ(r.a->sleep({"weights", "kv_cache", "default"}, {"weights"}), 42 * MiB);
  EXPECT_EQ(r.sim->used(), 0u);
  EXPECT_EQ(r.sim->pinned_bytes(), 30 * MiB);  // one buffer: the weights' live bytes
  // reserved_bytes and `segment` keep the sleeping pages; no event pending, so no wait (R9).
  EXPECT_EQ(r.a->stats(), before);
  const SleepStats s = r.a->sleep_stats();
  EXPECT_EQ(s.sleeping_segments.current, 1);
  EXPECT_EQ(s.sleeping_bytes.current, 42 * 1048576);
  EXPECT_EQ(s.sleeping_allocated_bytes.current, 42 * 1048576);
  EXPECT_EQ(s.backup_bytes.current, 30 * 1048576);
  EXPECT_EQ(s.num_sleeps, 1);
  EXPECT_EQ(r.a->sleeping(), (TagList{"default", "kv_cache", "weights"}));
  Snapshot snap = r.a->snapshot();
  ASSERT_EQ(snap.size(), 1u);
  EXPECT_TRUE(snap[0].is_sleeping);
  EXPECT_EQ(snap[0].backup_size, 30 * MiB);
  EXPECT_EQ(snap[0].total_size, 42 * MiB);
  EXPECT_FALSE(r.holds(w, 0x11, 1));  // no memory behind it now
  EXPECT_EQ(r.a->sleep({}, {"weights"}), 0u);  // already asleep: nothing more

  // While asleep: a new page right after the sleeping run (the run is no free neighbour); the
  // snapshot is cut where awake meets asleep, `segment` still counts one run of mapped pages.
  void* fresh = r.alloc(MiB, "default", 7);
  EXPECT_EQ(dev(fresh), kVa + 42 * MiB);
  EXPECT_EQ(r.sim->used(), 2 * MiB);
  snap = r.a->snapshot();
  ASSERT_EQ(snap.size(), 2u);
  EXPECT_TRUE(snap[0].is_sleeping);
  EXPECT_FALSE(snap[1].is_sleeping);
  EXPECT_EQ(r.a->stats().segment[0].current, 1);
  EXPECT_EQ(r.a->stats().reserved_bytes[0].current, 44 * 1048576);

  const std::size_t pieces = r.sim->map_piece_calls();
  r.a->wake({});
  EXPECT_EQ(r.sim->map_piece_calls(), pieces + 1);  // one piece for the run (under 512 MiB)
  EXPECT_EQ(r.sim->used(), 44 * MiB);
  EXPECT_EQ(r.sim->pinned_bytes(), 0u);
  EXPECT_TRUE(r.holds(w, 0x11, 30 * MiB));     // backed up and restored
  EXPECT_TRUE(r.holds(kv, 0xA5, 8 * MiB));     // not backed up: the backend's fresh pattern
  EXPECT_TRUE(r.holds(other, 0xA5, 4 * MiB));  // nor this one
  const SleepStats after = r.a->sleep_stats();
  EXPECT_EQ(after.sleeping_segments.current, 0);
  EXPECT_EQ(after.sleeping_bytes.current, 0);
  EXPECT_EQ(after.sleeping_bytes.peak, 42 * 1048576);
  EXPECT_EQ(after.backup_bytes.current, 0);
  EXPECT_EQ(after.num_wakes, 1);
  EXPECT_TRUE(r.a->sleeping().empty());
  // fresh's free MiB on its page is found again (stream 7).
  EXPECT_EQ(dev(r.alloc(MiB, "default", 7)), kVa + 43 * MiB);
}

TEST(CachetSleep, FreeWhileAsleepTakesEffectAtWake) {
  Rig r = cachet_rig();
  void* a = r.alloc(4 * MiB, "weights");  // pages 0-1
  void* b = r.alloc(4 * MiB, "weights");  // pages 2-3
  EXPECT_EQ(dev(b), dev(a) + 4 * MiB);
  r.fill(b, 0x5B, 4 * MiB);
  r.a->record_stream(b, 5);
  EXPECT_EQ(r.a->sleep({}, {"weights"}), 8 * MiB);
  EXPECT_EQ(r.sim->pinned_bytes(), 8 * MiB);
  r.a->record_stream(a, 9);  // allowed while asleep: it only adds a stream use
  r.a->free(a);              // no event: nothing runs on memory that is not there
  EXPECT_EQ(r.a->stats().allocated_bytes[0].current, 4 * 1048576);
  EXPECT_EQ(r.a->stats().active_bytes[0].current, 4 * 1048576);
  EXPECT_EQ(r.a->sleep_stats().sleeping_allocated_bytes.current, 4 * 1048576);
  EXPECT_EQ(r.a->sleep_stats().backup_bytes.current, 4 * 1048576);
  EXPECT_EQ(r.a->sleep_stats().num_frees_while_asleep, 1);
  EXPECT_THROW(r.a->free(a), UsageError);  // no double free
  // Still asleep: new pages after the run, a's are not reused.
  void* c = r.alloc(4 * MiB, "weights");
  EXPECT_EQ(dev(c), dev(a) + 8 * MiB);
  r.a->wake({"weights"});
  EXPECT_TRUE(r.holds(b, 0x5B, 4 * MiB));
  EXPECT_EQ(r.alloc(4 * MiB, "weights"), a);  // the free took effect at wake
  EXPECT_EQ(r.sim->pinned_bytes(), 0u);
}

TEST(CachetSleep, WakeOutOfMemoryStaysAsleepAndSucceedsLater) {
  Rig r = cachet_rig(64 * MiB);
  void* w = r.alloc(30 * MiB, "weights");
  r.fill(w, 0x77, 30 * MiB);
  EXPECT_EQ(r.a->sleep({}, {"weights"}), 30 * MiB);
  void* big = r.alloc(50 * MiB);  // the memory the sleep gave back, at kVa + 30 MiB
  EXPECT_EQ(dev(big), kVa + 30 * MiB);
  try {
    r.a->wake({});
    FAIL() << "wake fitted";
  } catch (const OutOfMemory& e) {
    EXPECT_NE(std::string(e.what()).find("waking needs 31457280 bytes"), std::string::npos) << e.what();
  }
  SleepStats s = r.a->sleep_stats();
  EXPECT_EQ(s.num_wake_ooms, 1);
  EXPECT_EQ(s.num_wakes, 0);
  EXPECT_EQ(s.sleeping_bytes.current, 30 * 1048576);
  EXPECT_EQ(s.backup_bytes.current, 30 * 1048576);
  EXPECT_EQ(r.sim->pinned_bytes(), 30 * MiB);
  EXPECT_EQ(r.sim->used(), 50 * MiB);
  EXPECT_EQ(r.a->sleeping(), TagList{"weights"});
  r.a->free(big);
  r.a->empty_cache();  // the 25 awake free pages go; the sleeping ones stay
  EXPECT_EQ(r.sim->used(), 0u);
  EXPECT_EQ(r.a->stats().reserved_bytes[0].current, 30 * 1048576);
  r.a->wake({});
  EXPECT_TRUE(r.holds(w, 0x77, 30 * MiB));
  EXPECT_EQ(r.a->sleep_stats().backup_bytes.current, 0);
  EXPECT_EQ(r.sim->pinned_bytes(), 0u);
  r.a->free(w);
}

TEST(CachetSleep, AFailingMapLeavesEverythingAsleep) {
  Rig r = cachet_rig();
  void* a = r.alloc(4 * MiB, "weights");  // pages 0-1
  void* gap = r.alloc(4 * MiB);           // pages 2-3
  void* c = r.alloc(4 * MiB, "kv_cache");  // pages 4-5
  r.fill(a, 0x42, 4 * MiB);
  r.a->free(gap);
  r.a->empty_cache();  // pages 2-3 go: two runs of mapped pages
  EXPECT_EQ(r.a->stats().segment[0].current, 2);
  EXPECT_EQ(r.a->sleep({}, {"weights"}), 8 * MiB);
  EXPECT_EQ(r.a->sleep_stats().sleeping_segments.current, 2);  // one unmap per run
  // The second run's map fails: the first one's is undone.
  r.faults->set_plan({gpu::CallClass::Alloc, 2, 0.0, 1, true, false});
  EXPECT_THROW(r.a->wake({}), OutOfMemory);
  r.faults->clear();
  EXPECT_EQ(r.sim->used(), 0u);
  EXPECT_EQ(r.a->sleep_stats().num_wake_ooms, 1);
  EXPECT_EQ(r.a->sleep_stats().sleeping_segments.current, 2);
  EXPECT_EQ(r.a->sleeping(), (TagList{"kv_cache", "weights"}));
  const std::size_t pieces = r.sim->map_piece_calls();
  r.a->wake({"kv_cache", "weights"});
  EXPECT_EQ(r.sim->map_piece_calls(), pieces + 2);
  EXPECT_TRUE(r.holds(a, 0x42, 4 * MiB));
  r.a->free(a);
  r.a->free(c);
}

TEST(CachetSleep, ABackupThatCannotBeHadChangesNothing) {
  Rig r = cachet_rig();
  void* w = r.alloc(30 * MiB, "weights");
  void* kv = r.alloc(8 * MiB, "kv_cache");
  r.fill(w, 0x42, 30 * MiB);
  r.a->free(r.alloc(2 * MiB));  // a free page too (page 19)
  const DeviceStats stats = r.a->stats();
  const Snapshot snap = r.a->snapshot();
  EXPECT_EQ(r.sim->used(), 40 * MiB);
  r.faults->set_plan({gpu::CallClass::HostAlloc, 2, 0.0, 1, true, false});  // the second tag's buffer
  EXPECT_THROW(r.a->sleep({}, {"weights", "kv_cache"}), OutOfMemory);
  r.faults->clear();
  EXPECT_EQ(r.a->stats(), stats);  // not even the synchronize happened
  EXPECT_EQ(r.sim->used(), 40 * MiB);
  EXPECT_EQ(r.sim->pinned_bytes(), 0u);
  EXPECT_EQ(r.a->sleep_stats().num_backup_failures, 1);
  EXPECT_EQ(r.a->sleep_stats().num_sleeps, 0);
  EXPECT_EQ(r.a->sleep_stats().sleeping_segments.current, 0);
  const Snapshot now = r.a->snapshot();
  ASSERT_EQ(now.size(), snap.size());
  for (std::size_t i = 0; i < now.size(); ++i) EXPECT_FALSE(now[i].is_sleeping);
  EXPECT_TRUE(r.holds(w, 0x42, 30 * MiB));
  // And once the host memory is there, the same sleep works.
  EXPECT_EQ(r.a->sleep({}, {"weights", "kv_cache"}), 40 * MiB);
  EXPECT_EQ(r.sim->pinned_bytes(), 38 * MiB);
  r.a->wake({});
  EXPECT_TRUE(r.holds(w, 0x42, 30 * MiB));
  r.a->free(w);
  r.a->free(kv);
}

TEST(CachetSleep, SleepingPagesDoNotCountAgainstTheCap) {
  Rig r = cachet_rig();
  r.a->set_memory_fraction(0.0625);  // 64 MiB of 1 GiB: 32 pages
  void* w = r.alloc(30 * MiB, "weights");
  EXPECT_THROW(r.alloc(40 * MiB), OutOfMemory);  // 15 + 20 pages
  r.a->sleep({}, {});
  void* t = r.alloc(40 * MiB);  // the memory the sleep gave back, under the same cap
  EXPECT_EQ(dev(t), kVa + 30 * MiB);
  EXPECT_THROW(r.a->wake({}), OutOfMemory);  // the cap refuses the wake
  EXPECT_EQ(r.a->sleep_stats().num_wake_ooms, 1);
  r.a->free(t);
  r.a->empty_cache();
  r.a->wake({});
  r.a->free(w);
}

TEST(CachetSleep, OtherTagsKeepWorkingWhileAsleep) {
  Rig r = cachet_rig();
  void* w = r.alloc(2 * MiB, "weights");
  r.a->free(r.alloc(6 * MiB, "weights"));  // free room on sleeping pages
  EXPECT_EQ(r.a->sleep({"weights"}, {}), 8 * MiB);  // page 0 (weights) and the free pages 1-3
  for (int i = 0; i < 20; ++i) {
    void* p = r.alloc(static_cast<Bytes>(1 + i) * 512 * 1024, i % 2 ? "kv_cache" : "default");
    EXPECT_GE(dev(p), kVa + 8 * MiB);  // never on a sleeping page
    EXPECT_TRUE(r.a->invariants().empty());
    r.a->free(p);
  }
  r.a->wake({"weights"});
  EXPECT_EQ(r.a->sleep_stats().sleeping_bytes.current, 0);
  r.a->free(w);
  EXPECT_TRUE(r.a->invariants().empty());
}

TEST(CachetSleep, EmptyCacheGivesBackSleepingPagesWithNoLiveBlock) {
  Rig r = cachet_rig();
  void* a = r.alloc(4 * MiB, "weights");       // pages 0-1
  void* keep = r.alloc(30 * MiB, "kv_cache");  // pages 2-16
  EXPECT_EQ(r.a->sleep({}, {"weights"}), 34 * MiB);
  r.a->free(a);
  EXPECT_EQ(r.a->sleep_stats().backup_bytes.current, 0);
  EXPECT_EQ(r.sim->pinned_bytes(), 4 * MiB);  // the weights' buffer, until nothing lies in it
  const DeviceStats before = r.a->stats();
  EXPECT_EQ(before.reserved_bytes[0].current, 34 * 1048576);
  r.a->empty_cache();
  // a's 2 pages go (no device call: their memory went at the sleep); kv_cache's stay asleep.
  EXPECT_EQ(r.a->stats().reserved_bytes[0].current, 30 * 1048576);
  EXPECT_EQ(r.a->stats().num_device_free, before.num_device_free + 1);
  EXPECT_EQ(r.a->stats().segment[0].current, 1);
  EXPECT_EQ(r.a->sleep_stats().sleeping_segments.current, 1);
  EXPECT_EQ(r.a->sleep_stats().sleeping_bytes.current, 30 * 1048576);
  EXPECT_EQ(r.a->sleeping(), TagList{"kv_cache"});
  EXPECT_EQ(r.sim->pinned_bytes(), 0u);
  // The pages are unmapped ones again: a new allocation maps them.
  void* b = r.alloc(2 * MiB);
  EXPECT_EQ(dev(b), kVa);
  EXPECT_EQ(r.sim->used(), 2 * MiB);
  r.a->wake({});
  EXPECT_EQ(r.sim->used(), 32 * MiB);
  r.a->free(b);
  r.a->free(keep);
  r.a->empty_cache();
  EXPECT_EQ(r.a->stats().reserved_bytes[0].current, 0);
  EXPECT_EQ(r.sim->used(), 0u);
}

TEST(CachetSleep, AGraphPoolSleepsAndWakesWhole) {
  Rig r = cachet_rig();
  const PoolId pool{1, 7};
  r.a->create_or_incref_pool(pool);
  r.a->begin_allocate_to_pool(pool, [](StreamId) { return true; }, true);
  void* g = r.alloc(6 * MiB, "graph");  // pages 0-2
  void* h = r.alloc(3 * MiB, "graph");  // pages 3-4, the pool's free [9, 10) MiB after it
  r.a->end_allocate_to_pool(pool);
  EXPECT_EQ(dev(h), kVa + 6 * MiB);
  r.fill(g, 0x61, 6 * MiB);
  r.fill(h, 0x62, 3 * MiB);
  void* outside = r.alloc(2 * MiB, "graph");  // the default pool: page 5
  EXPECT_EQ(dev(outside), kVa + 10 * MiB);
  const Snapshot before = r.a->snapshot();
  EXPECT_EQ(r.a->sleep({"graph"}, {"graph"}), 12 * MiB);
  EXPECT_EQ(r.sim->pinned_bytes(), 11 * MiB);  // one buffer, copies of g+h and of outside
  EXPECT_EQ(r.a->pool_use_count(pool), 2);     // create_or_incref_pool and begin_allocate_to_pool: unchanged
  r.a->wake({"graph"});
  EXPECT_TRUE(r.holds(g, 0x61, 6 * MiB));
  EXPECT_TRUE(r.holds(h, 0x62, 3 * MiB));
  EXPECT_EQ(r.a->snapshot(), before);
  // The pool's free room is the pool's again after the wake.
  r.a->begin_allocate_to_pool(pool, [](StreamId) { return true; }, true);
  void* i = r.alloc(MiB, "graph");
  EXPECT_EQ(dev(i), kVa + 9 * MiB);
  r.a->end_allocate_to_pool(pool);
  r.a->free(i);
  // Released while asleep (R11): its sleeping free block joins the default pool, asleep.
  EXPECT_EQ(r.a->sleep({}, {}), 12 * MiB);
  EXPECT_EQ(r.a->pool_use_count(pool), 3);  // each begin_allocate_to_pool took a use
  for (int k = 0; k < 3; ++k) r.a->release_pool(pool);
  EXPECT_TRUE(r.a->invariants().empty());
  r.a->wake({});
  r.a->free(g);
  r.a->free(h);
  r.a->free(outside);
  r.a->empty_cache();
  EXPECT_EQ(r.a->stats().reserved_bytes[0].current, 0);
}

// Random allocations, frees (awake and asleep), stream uses, empty_cache, sleeps and wakes of
// every tag or of one (weights, kv_cache), with the invariants checked after every op (validate
// mode) and every backed-up block's contents checked after the wake that woke it.
TEST(CachetSleep, RandomSequencesKeepEveryRuleAndTheBackups) {
  const char* const names[] = {"weights", "kv_cache"};
  for (std::uint32_t seed = 1; seed <= 4; ++seed) {
    Rig r = cachet_rig(256 * MiB);
    std::mt19937 rng(seed);
    struct Live {
      void* p;
      Bytes n;
      unsigned char byte;
      int tag;      // 0 weights, 1 kv_cache
      bool asleep;  // its tag slept since its allocation and has not woken
      bool backed;  // asleep with a backup
    };
    std::vector<Live> live;
    auto named = [&](int which, int tag) { return which == 2 || which == tag; };  // 2: every tag
    for (int op = 0; op < 400; ++op) {
      const int k = static_cast<int>(rng() % 10);
      if (k < 3) {
        const Bytes n = (1 + rng() % 64) * (rng() % 2 ? 512 * 1024 : 8192);
        const int t = static_cast<int>(rng() % 2);
        void* p = nullptr;
        try {
          p = r.alloc(n, names[t], rng() % 3 == 0 ? 3 : 0);
        } catch (const OutOfMemory&) {
          continue;
        }
        const auto byte = static_cast<unsigned char>(rng());
        r.fill(p, byte, n);
        live.push_back({p, n, byte, t, false, false});
      } else if (k == 3) {  // other work ("default"), never on a sleeping page
        try {
          void* p = r.alloc((1 + rng() % 8) * MiB, "default");
          r.a->free(p);
        } catch (const OutOfMemory&) {
        }
      } else if (k < 7 && !live.empty()) {
        const std::size_t i = rng() % live.size();
        if (rng() % 4 == 0) r.a->record_stream(live[i].p, 5);
        r.a->free(live[i].p);
        live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
      } else if (k == 7) {
        r.a->empty_cache();
      } else if (k == 8) {
        const int which = static_cast<int>(rng() % 3);
        const bool backup_weights = rng() % 4 != 0;
        r.a->sleep(which == 2 ? TagList{} : TagList{names[which]},
                   backup_weights ? TagList{"weights"} : TagList{});
        for (Live& l : live)
          if (!l.asleep && named(which, l.tag)) {
            l.asleep = true;
            l.backed = backup_weights && l.tag == 0;
          }
      } else if (k == 9) {
        const int which = static_cast<int>(rng() % 3);
        try {
          r.a->wake(which == 2 ? TagList{} : TagList{names[which]});
        } catch (const OutOfMemory&) {
          continue;  // stays asleep; a later wake succeeds once memory is free
        }
        for (Live& l : live) {
          if (!l.asleep || !named(which, l.tag)) continue;
          if (l.backed) {
            ASSERT_TRUE(r.holds(l.p, l.byte, l.n)) << "seed " << seed << " op " << op;
          }
          l.asleep = l.backed = false;
          l.byte = static_cast<unsigned char>(rng());  // undefined without a backup: write again
          r.fill(l.p, l.byte, l.n);
        }
        for (const Live& l : live)  // what did not wake is still asleep (no memory behind it)
          if (l.asleep) {
            ASSERT_FALSE(r.holds(l.p, l.byte, 1)) << "seed " << seed << " op " << op;
          }
      }
    }
    r.a->wake({});
    std::printf("seed %u: %lld sleeps, %lld wakes, %lld wake OOMs, %lld frees while asleep\n", seed,
                static_cast<long long>(r.a->sleep_stats().num_sleeps), static_cast<long long>(r.a->sleep_stats().num_wakes),
                static_cast<long long>(r.a->sleep_stats().num_wake_ooms),
                static_cast<long long>(r.a->sleep_stats().num_frees_while_asleep));
    EXPECT_GE(r.a->sleep_stats().num_wakes, 10);
    EXPECT_GE(r.a->sleep_stats().num_frees_while_asleep, 10);
    for (const Live& l : live) {
      if (!l.asleep || l.backed) {
        ASSERT_TRUE(r.holds(l.p, l.byte, l.n)) << "seed " << seed;
      }
      r.a->free(l.p);
    }
    r.a->empty_cache();
    EXPECT_EQ(r.a->stats().reserved_bytes[0].current, 0);
    EXPECT_EQ(r.sim->used(), 0u);
    EXPECT_EQ(r.sim->pinned_bytes(), 0u);
  }
}

// SLEEP-R1 (docs/sleep-wake.md section 2): R2 and R3 place a block only where no live block of
// another tag touches its pages; with every allocation under "default" nothing is skipped.
TEST(CachetSleep, PlacementKeepsPagesTagHomogeneous) {
  Rig r = cachet_rig();
  void* w = r.alloc(MiB, "weights");  // R3: [0, 1) MiB of page 0, [1, 2) MiB free
  EXPECT_EQ(dev(w), kVa);
  // R2's best fit is [1, 2) MiB, its high end [1.5, 2) MiB on the weights' page 0: skipped. R3:
  // the window [2 MiB, end) without its left neighbour (on page 0): page 1.
  void* kv = r.alloc(512 * 1024, "kv_cache");
  EXPECT_EQ(dev(kv), kVa + 2 * MiB);
  // The weights take their page's free high end; kv_cache its own page's ([2.5, 4) MiB).
  EXPECT_EQ(dev(r.alloc(512 * 1024, "weights")), kVa + 3 * MiB / 2);
  EXPECT_EQ(dev(r.alloc(MiB, "kv_cache")), kVa + 3 * MiB);
  // A large request of a third tag: no free block holds 3 MiB; R3 maps pages 2-3.
  EXPECT_EQ(dev(r.alloc(3 * MiB, "default")), kVa + 4 * MiB);
  EXPECT_EQ(r.sim->used(), 8 * MiB);
  EXPECT_TRUE(r.a->invariants().empty());

  // The same requests under "default" alone: R2 takes page 0's high end.
  Rig d = cachet_rig();
  EXPECT_EQ(dev(d.alloc(MiB)), kVa);
  EXPECT_EQ(dev(d.alloc(512 * 1024)), kVa + 3 * MiB / 2);
}

// sleep(tags) puts to sleep the pages of the named tags and the pages no live block touches;
// wake(tags) wakes the pages of the named tags and the pages that slept with no live block.
TEST(CachetSleep, ASubsetOfTagsSleepsAndWakes) {
  Rig r = cachet_rig();
  void* w = r.alloc(MiB, "weights");          // page 0
  void* kv = r.alloc(512 * 1024, "kv_cache");  // page 1 (as above)
  void* d = r.alloc(4 * MiB, "default");       // pages 2-3 (page 1's free room is kv_cache's)
  EXPECT_EQ(dev(kv), kVa + 2 * MiB);
  EXPECT_EQ(dev(d), kVa + 4 * MiB);
  EXPECT_EQ(r.sim->used(), 8 * MiB);
  r.fill(w, 0x11, MiB);
  r.fill(kv, 0x22, 512 * 1024);
  r.fill(d, 0x33, 4 * MiB);

  EXPECT_EQ(r.a->sleep({"weights"}, {"weights"}), 2 * MiB);  // page 0 alone
  EXPECT_EQ(r.sim->used(), 6 * MiB);
  EXPECT_EQ(r.sim->pinned_bytes(), MiB);
  EXPECT_EQ(r.a->sleeping(), TagList{"weights"});
  SleepStats s = r.a->sleep_stats();
  EXPECT_EQ(s.sleeping_segments.current, 1);
  EXPECT_EQ(s.sleeping_bytes.current, 2 * 1048576);
  EXPECT_EQ(s.sleeping_allocated_bytes.current, 1048576);
  EXPECT_EQ(s.backup_bytes.current, 1048576);
  Snapshot snap = r.a->snapshot();  // cut where the sleeping page 0 meets the awake page 1
  ASSERT_EQ(snap.size(), 2u);
  EXPECT_TRUE(snap[0].is_sleeping);
  EXPECT_EQ(snap[0].total_size, 2 * MiB);
  EXPECT_EQ(snap[0].backup_size, MiB);
  EXPECT_FALSE(snap[1].is_sleeping);
  EXPECT_EQ(snap[1].total_size, 6 * MiB);
  EXPECT_EQ(r.a->stats().segment[0].current, 1);  // one run of mapped pages, 0-3
  EXPECT_TRUE(r.holds(kv, 0x22, 512 * 1024));     // awake, untouched
  EXPECT_TRUE(r.holds(d, 0x33, 4 * MiB));

  // Then kv_cache, without backup: page 1 joins page 0's run.
  EXPECT_EQ(r.a->sleep({"kv_cache"}, {}), 2 * MiB);
  EXPECT_EQ(r.a->sleeping(), (TagList{"kv_cache", "weights"}));
  s = r.a->sleep_stats();
  EXPECT_EQ(s.sleeping_segments.current, 1);
  EXPECT_EQ(s.sleeping_bytes.current, 4 * 1048576);
  EXPECT_EQ(s.sleeping_allocated_bytes.current, 1572864);
  EXPECT_EQ(s.backup_bytes.current, 1048576);
  EXPECT_EQ(r.sim->used(), 4 * MiB);

  // The weights wake alone: one piece, their backup back; kv_cache sleeps on.
  std::size_t pieces = r.sim->map_piece_calls();
  r.a->wake({"weights"});
  EXPECT_EQ(r.sim->map_piece_calls(), pieces + 1);
  EXPECT_EQ(r.sim->used(), 6 * MiB);
  EXPECT_EQ(r.sim->pinned_bytes(), 0u);
  EXPECT_TRUE(r.holds(w, 0x11, MiB));
  EXPECT_EQ(r.a->sleeping(), TagList{"kv_cache"});
  s = r.a->sleep_stats();
  EXPECT_EQ(s.sleeping_segments.current, 1);
  EXPECT_EQ(s.sleeping_bytes.current, 2 * 1048576);
  EXPECT_EQ(s.sleeping_allocated_bytes.current, 524288);
  EXPECT_EQ(s.backup_bytes.current, 0);
  EXPECT_EQ(s.num_wakes, 1);
  // The weights' page's free room is theirs again; kv_cache's sleeps: a new page for it.
  EXPECT_EQ(dev(r.alloc(512 * 1024, "weights")), kVa + 3 * MiB / 2);
  EXPECT_EQ(dev(r.alloc(512 * 1024, "kv_cache")), kVa + 8 * MiB);
  r.a->wake({"weights"});  // nothing of the weights asleep: nothing happens
  EXPECT_EQ(r.a->sleep_stats().num_wakes, 2);
  EXPECT_EQ(r.a->sleep_stats().sleeping_bytes.current, 2 * 1048576);
  r.a->wake({});
  EXPECT_TRUE(r.holds(kv, 0xA5, 512 * 1024));  // not backed up: the backend's fresh pattern
  EXPECT_TRUE(r.a->sleeping().empty());
  EXPECT_EQ(r.sim->used(), 10 * MiB);
  EXPECT_TRUE(r.a->invariants().empty());
}

TEST(CachetSleep, PagesWithNoLiveBlockSleepWithAnySleepAndWakeWithAnyWake) {
  Rig r = cachet_rig();
  void* w = r.alloc(MiB, "weights");          // page 0
  void* kv = r.alloc(512 * 1024, "kv_cache");  // page 1
  r.a->free(r.alloc(4 * MiB, "default"));      // pages 2-3, free: [2.5, 8) MiB one free block
  r.fill(w, 0x11, MiB);
  // Page 0 (weights) and the free pages 2-3; the free block is cut at 4 MiB (page 1 stays awake).
  EXPECT_EQ(r.a->sleep({"weights"}, {"weights"}), 6 * MiB);
  EXPECT_EQ(r.sim->used(), 2 * MiB);
  EXPECT_EQ(r.a->sleeping(), TagList{"weights"});  // free pages carry no tag
  EXPECT_EQ(r.a->sleep_stats().sleeping_segments.current, 2);
  Snapshot snap = r.a->snapshot();
  ASSERT_EQ(snap.size(), 3u);
  EXPECT_EQ(snap[1].address, kVa + 2 * MiB);
  EXPECT_FALSE(snap[1].is_sleeping);
  ASSERT_EQ(snap[1].blocks.size(), 2u);
  EXPECT_EQ(snap[1].blocks[1].address, kVa + 5 * MiB / 2);
  EXPECT_EQ(snap[1].blocks[1].size, 3 * MiB / 2);
  EXPECT_TRUE(snap[2].is_sleeping);
  EXPECT_EQ(snap[2].total_size, 4 * MiB);

  // wake(kv_cache): nothing of kv_cache sleeps, but pages 2-3 slept with no live block: they wake
  // and their free block joins [2.5, 4) MiB again.
  std::size_t pieces = r.sim->map_piece_calls();
  r.a->wake({"kv_cache"});
  EXPECT_EQ(r.sim->map_piece_calls(), pieces + 1);
  EXPECT_EQ(r.sim->used(), 6 * MiB);
  EXPECT_EQ(r.a->sleeping(), TagList{"weights"});
  EXPECT_EQ(r.a->sleep_stats().sleeping_bytes.current, 2 * 1048576);
  snap = r.a->snapshot();
  ASSERT_EQ(snap.size(), 2u);
  ASSERT_EQ(snap[1].blocks.size(), 2u);
  EXPECT_EQ(snap[1].blocks[1].size, 11 * MiB / 2);
  EXPECT_EQ(r.alloc(512 * 1024, "kv_cache"), static_cast<char*>(kv) + 5 * MiB + 512 * 1024);  // R2: the high end
  // empty_cache gives back nothing asleep here (page 0 holds a live block).
  r.a->empty_cache();
  EXPECT_EQ(r.a->sleep_stats().sleeping_bytes.current, 2 * 1048576);
  r.a->wake({"weights"});
  EXPECT_TRUE(r.holds(w, 0x11, MiB));
  EXPECT_TRUE(r.a->invariants().empty());
}

// --- refusals (docs/sleep-wake.md sections 3 and 6) ---

// A backend with the VMM calls but without BackendCaps::sleep.
class NoSleepMemory final : public gpu::DeviceMemory {
 public:
  explicit NoSleepMemory(std::unique_ptr<gpu::DeviceMemory> in) : in_(std::move(in)) {}
  gpu::BackendCaps caps() const override {
    gpu::BackendCaps c = in_->caps();
    c.sleep = false;
    c.capture_graph = false;  // nor its capture graph calls
    return c;
  }
  DeviceIndex device() const override { return in_->device(); }
  gpu::Result<DevicePtr> malloc(Bytes n) override { return in_->malloc(n); }
  gpu::Status free(DevicePtr p) override { return in_->free(p); }
  gpu::Result<gpu::MemInfo> mem_get_info() override { return in_->mem_get_info(); }
  bool stream_valid(StreamId s) override { return in_->stream_valid(s); }
  gpu::Result<gpu::EventHandle> event_create() override { return in_->event_create(); }
  gpu::Status event_record(gpu::EventHandle e, StreamId s) override { return in_->event_record(e, s); }
  gpu::Result<bool> event_query(gpu::EventHandle e) override { return in_->event_query(e); }
  gpu::Status event_synchronize(gpu::EventHandle e) override { return in_->event_synchronize(e); }
  void event_destroy(gpu::EventHandle e) override { in_->event_destroy(e); }
  gpu::Result<DevicePtr> reserve(Bytes n) override { return in_->reserve(n); }
  gpu::Status unreserve(DevicePtr p, Bytes n) override { return in_->unreserve(p, n); }
  gpu::Status map(DevicePtr p, Bytes n) override { return in_->map(p, n); }
  gpu::Status unmap(DevicePtr p, Bytes n) override { return in_->unmap(p, n); }

 private:
  std::unique_ptr<gpu::DeviceMemory> in_;
};

TEST(SleepRefusals, ABackendWithoutSleepIsRefusedAtConstruction) {
  for (Policy policy : {Policy::PyTorch, Policy::Cachet}) {
    Config c;
    c.policy = policy;
    c.sleep = true;
    try {
      CachingAllocator a(std::make_unique<NoSleepMemory>(gpu::make_host_memory()), c);
      FAIL() << "constructed";
    } catch (const UsageError& e) {
      EXPECT_STREQ(e.what(),
                   "cachet_sleep:True needs a backend with the CUDA VMM calls (cuMemCreate/cuMemMap) and pinned host "
                   "memory; this one has none: use the CUDA VMM backend or drop cachet_sleep");
    }
  }
}

TEST(SleepRefusals, SleepAndWakeNeedTheKey) {
  for (Policy policy : {Policy::PyTorch, Policy::Cachet}) {
    Config c;
    c.policy = policy;
    CachingAllocator a(gpu::make_host_memory(), c);
    try {
      a.sleep({}, {});
      FAIL() << "slept";
    } catch (const UsageError& e) {
      EXPECT_STREQ(e.what(), "sleep(): sleep needs CACHET_ALLOC_CONF cachet_sleep:True set before the first allocation");
    }
    EXPECT_THROW(a.wake({}), UsageError);
    TagScope t("weights");  // tags may still be set
    a.free(a.allocate(MiB, 0));
    EXPECT_THROW(a.configure("cachet_sleep:True"), UsageError);  // fixed at construction
  }
}

TEST(SleepRefusals, BadTagsAndCapturesChangeNothing) {
  Rig r = make_rig(false);
  void* w = r.alloc(MiB, "weights");
  EXPECT_THROW(r.a->sleep({"no spaces"}, {}), UsageError);
  EXPECT_THROW(r.a->sleep({"all"}, {}), UsageError);
  EXPECT_THROW(r.a->sleep({"weights", "weights"}, {}), UsageError);
  EXPECT_THROW(r.a->wake({"none"}), UsageError);
  r.a->create_or_incref_pool({1, 1});
  r.a->begin_allocate_to_pool({1, 1}, [](StreamId) { return true; }, true);
  EXPECT_THROW(r.a->sleep({}, {}), UsageError);
  r.a->end_allocate_to_pool({1, 1});
  r.a->release_pool({1, 1});
  EXPECT_EQ(r.a->sleep_stats().num_sleeps, 0);
  EXPECT_EQ(r.a->sleep({}, {}), 2 * MiB);  // 1 MiB: a 2 MiB small-pool segment
  r.a->wake({});
  r.a->free(w);
}

// --- the pinned buffers a backend keeps between sleeps (docs/sleep-wake.md section 6) ---

// A backend that keeps its pinned buffers as the CUDA VMM backend does (PinnedKeep over the host
// backend's host_alloc/host_free, which stand for cudaHostAlloc/cudaFreeHost), counting the pins,
// the unpins and the host_trim calls.
class KeepingMemory final : public gpu::DeviceMemory {
 public:
  explicit KeepingMemory(std::unique_ptr<gpu::DeviceMemory> in) : in_(std::move(in)) {}
  gpu::BackendCaps caps() const override { return in_->caps(); }
  DeviceIndex device() const override { return in_->device(); }
  gpu::Result<DevicePtr> malloc(Bytes n) override { return in_->malloc(n); }
  gpu::Status free(DevicePtr p) override { return in_->free(p); }
  gpu::Result<gpu::MemInfo> mem_get_info() override { return in_->mem_get_info(); }
  bool stream_valid(StreamId s) override { return in_->stream_valid(s); }
  gpu::Result<gpu::EventHandle> event_create() override { return in_->event_create(); }
  gpu::Status event_record(gpu::EventHandle e, StreamId s) override { return in_->event_record(e, s); }
  gpu::Result<bool> event_query(gpu::EventHandle e) override { return in_->event_query(e); }
  gpu::Status event_synchronize(gpu::EventHandle e) override { return in_->event_synchronize(e); }
  void event_destroy(gpu::EventHandle e) override { in_->event_destroy(e); }
  gpu::Result<DevicePtr> reserve(Bytes n) override { return in_->reserve(n); }
  gpu::Status unreserve(DevicePtr p, Bytes n) override { return in_->unreserve(p, n); }
  gpu::Status map(DevicePtr p, Bytes n) override { return in_->map(p, n); }
  gpu::Status unmap(DevicePtr p, Bytes n) override { return in_->unmap(p, n); }
  gpu::Result<void*> host_alloc(Bytes n) override {
    if (void* h = keep_.take(n)) return {gpu::Status::ok(), h};
    for (void* h : keep_.make_room(n)) unpin(h);
    auto r = in_->host_alloc(n);
    if (r.is_ok()) {
      ++pins;
      keep_.pinned(r.value, n);
    }
    return r;
  }
  void host_free(void* h) override { (void)keep_.give(h); }
  Bytes host_trim() override {
    ++trims;
    Bytes given = 0;
    for (auto& [h, n] : keep_.release_kept()) {
      unpin(h);
      given += n;
    }
    return given;
  }
  gpu::Status copy_to_host(void* h, DevicePtr p, Bytes n) override { return in_->copy_to_host(h, p, n); }
  gpu::Status copy_to_device(DevicePtr p, const void* h, Bytes n) override { return in_->copy_to_device(p, h, n); }
  gpu::Status copy_synchronize() override { return in_->copy_synchronize(); }
  gpu::Status map_pieces(DevicePtr p, Bytes n) override { return in_->map_pieces(p, n); }
  gpu::Result<gpu::CaptureInfo> capture_info(StreamId s) override { return in_->capture_info(s); }
  gpu::Result<std::vector<gpu::GraphNode>> node_dependencies(gpu::GraphNode n) override {
    return in_->node_dependencies(n);
  }
  const gpu::PinnedKeep& keep() const { return keep_; }

  int pins = 0, unpins = 0, trims = 0;

 private:
  void unpin(void* h) {
    ++unpins;
    in_->host_free(h);
  }
  std::unique_ptr<gpu::DeviceMemory> in_;
  gpu::PinnedKeep keep_;
};

// A 1 GiB host device behind KeepingMemory, cachet_sleep:True and validate, for SleepKeptBuffers.
struct KeptBuffersAllocator {
  KeptBuffersAllocator(Policy policy, bool expandable) {
    gpu::HostOptions o;
    o.capacity = 1 * GiB;
    auto mem = std::make_unique<KeepingMemory>(gpu::make_host_memory(o, &sim));
    keeping = mem.get();
    Config c;
    c.sleep = true;
    c.validate = true;
    c.policy = policy;
    c.expandable_segments = expandable;
    allocator = std::make_unique<CachingAllocator>(std::move(mem), c);
  }
  void* alloc(Bytes n, const char* tag) {
    TagScope t(tag);
    return allocator->allocate(n, 0);
  }
  std::shared_ptr<gpu::HostSim> sim;
  KeepingMemory* keeping = nullptr;
  std::unique_ptr<CachingAllocator> allocator;
};

// empty_cache() gives back device memory only: the kept buffers stay, so the next sleep pins
// nothing (bench/tms_readme.py calls torch.cuda.empty_cache() between cycles). What is kept is
// bounded by the largest set of backups held at once, several tags counting together, and
// release_backup_buffers() gives it back, returning its bytes.
TEST(SleepKeptBuffers, EmptyCacheKeepsThemAndReleaseBackupBuffersGivesThemBack) {
  for (Policy policy : {Policy::PyTorch, Policy::Cachet}) {
    SCOPED_TRACE(policy == Policy::PyTorch ? "policy:pytorch" : "policy:cachet");
    KeptBuffersAllocator k(policy, false);
    std::shared_ptr<gpu::HostSim>& sim = k.sim;
    KeepingMemory* keeping = k.keeping;
    CachingAllocator& a = *k.allocator;
    auto alloc = [&](Bytes n, const char* tag) { return k.alloc(n, tag); };
    void* w = alloc(30 * MiB, "weights");
    void* kv = alloc(8 * MiB, "kv_cache");
    for (int cycle = 0; cycle < 3; ++cycle) {
      a.sleep({}, {"weights", "kv_cache"});  // one buffer per tag: 30 and 8 MiB
      EXPECT_EQ(sim->pinned_bytes(), 38 * MiB);
      a.wake({});
      EXPECT_EQ(sim->pinned_bytes(), 38 * MiB);  // kept for the next sleep
      a.empty_cache();
      EXPECT_EQ(sim->pinned_bytes(), 38 * MiB);  // device memory only
      EXPECT_EQ(keeping->pins, 2);                // the first cycle's, never again
      EXPECT_EQ(keeping->trims, 0);
    }
    // A larger backup of one tag: the smaller kept buffers go first, what is held stays within
    // the most in use at once (38 MiB before, 46 MiB now: kv_cache's 8 MiB and weights' 38 MiB).
    a.free(w);
    w = alloc(38 * MiB, "weights");
    a.sleep({}, {"weights", "kv_cache"});
    EXPECT_EQ(keeping->keep().in_use_bytes(), 46 * MiB);
    EXPECT_LE(sim->pinned_bytes(), 46 * MiB);
    a.wake({});
    EXPECT_LE(keeping->keep().kept_bytes(), keeping->keep().peak_bytes());
    EXPECT_EQ(keeping->keep().peak_bytes(), 46 * MiB);
    EXPECT_EQ(sim->pinned_bytes(), keeping->keep().kept_bytes());

    const Bytes kept = sim->pinned_bytes();
    EXPECT_EQ(a.release_backup_buffers(), kept);
    EXPECT_EQ(sim->pinned_bytes(), 0u);
    EXPECT_EQ(keeping->trims, 1);
    EXPECT_EQ(a.release_backup_buffers(), 0u);  // nothing kept any more
    // Asleep, the buffers holding backups stay: only kept ones go.
    a.sleep({"weights"}, {"weights"});
    EXPECT_EQ(a.release_backup_buffers(), 0u);
    EXPECT_EQ(sim->pinned_bytes(), 38 * MiB);
    a.wake({});
    EXPECT_EQ(a.release_backup_buffers(), 38 * MiB);
    a.free(w);
    a.free(kv);
  }
}

// prepare_backup_buffers pins, all at once, the buffers the next sleep of those tags takes, so that
// sleep pins nothing (docs/sleep-wake.md section 6); a tag not backed up and a block freed before
// count for nothing, and a backup that grew since takes a larger buffer at its sleep.
TEST(SleepKeptBuffers, PrepareBackupBuffersPinsWhatTheFirstSleepTakes) {
  for (Policy policy : {Policy::PyTorch, Policy::Cachet}) {
    for (bool expandable : {false, true}) {
      SCOPED_TRACE(std::string(policy == Policy::PyTorch ? "policy:pytorch" : "policy:cachet") +
                   (expandable ? ", expandable segments" : ""));
      KeptBuffersAllocator k(policy, expandable);
      std::shared_ptr<gpu::HostSim>& sim = k.sim;
      KeepingMemory* keeping = k.keeping;
      CachingAllocator& a = *k.allocator;
      auto alloc = [&](Bytes n, const char* tag) { return k.alloc(n, tag); };
      void* w1 = alloc(20 * MiB, "weights");
      void* w2 = alloc(10 * MiB, "weights");
      void* gone = alloc(4 * MiB, "weights");
      a.free(gone);
      void* kv = alloc(8 * MiB, "kv_cache");
      void* other = alloc(6 * MiB, "scratch");
      EXPECT_EQ(a.prepare_backup_buffers({"weights", "kv_cache"}), 38 * MiB);
      EXPECT_EQ(keeping->pins, 2);  // 30 MiB for weights, 8 MiB for kv_cache, held at once
      EXPECT_EQ(keeping->keep().kept_bytes(), 38 * MiB);
      EXPECT_EQ(a.prepare_backup_buffers({"weights", "kv_cache"}), 38 * MiB);
      EXPECT_EQ(keeping->pins, 2);  // taken from what is kept
      a.sleep({}, {"weights", "kv_cache"});
      EXPECT_EQ(keeping->pins, 2);  // the first sleep pins nothing
      EXPECT_EQ(sim->pinned_bytes(), 38 * MiB);
      a.wake({});
      EXPECT_EQ(a.prepare_backup_buffers({"nothing_here"}), 0u);
      void* w3 = alloc(12 * MiB, "weights");  // weights now need 42 MiB: a larger buffer at sleep
      a.sleep({}, {"weights", "kv_cache"});
      // weights' 42 MiB fits no kept buffer: both kept ones go first (PinnedKeep's bound), so
      // weights and kv_cache are pinned anew.
      EXPECT_EQ(keeping->pins, 4);
      EXPECT_EQ(sim->pinned_bytes(), 50 * MiB);
      a.wake({});
      EXPECT_THROW(a.prepare_backup_buffers({"bad tag!"}), UsageError);
      for (void* p : {w1, w2, w3, kv, other}) a.free(p);
    }
  }
  Config no_sleep;
  CachingAllocator plain(gpu::make_host_memory(gpu::HostOptions{}), no_sleep);
  EXPECT_THROW(plain.prepare_backup_buffers({"weights"}), UsageError);
}

}  // namespace
}  // namespace cachet::test

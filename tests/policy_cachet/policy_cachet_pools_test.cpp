// policy:cachet's private pools (rules R10-R12 in cachet/gpu/policy_cachet.h) in the production
// allocator, through CachingAllocator's pool members, on the host backend in validate mode
// (CachetPolicy::invariants() after every operation, [INV-PRIV-3] and [INV-PRIV-4] among them).
// Every address and figure is worked out by hand from the rules (2 MiB pages; addresses relative
// to the first allocation, which always gets the reservation's base): the same cases as the
// model's tests/model/cachet_policy_pools_test.cpp, plus what only gpu/ has (the stream filter,
// device events, the host backend's page counts).
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>

#include "cachet/config.h"
#include "cachet/errors.h"
#include "cachet/gpu/allocator.h"
#include "cachet/gpu/host_backend.h"

namespace cachet::test {
namespace {

constexpr Bytes kPage = 2 * MiB;
constexpr PoolRoute kThread{PoolRoute::Kind::CurrentThread, 0};
PoolRoute capture(StreamId s) { return PoolRoute{PoolRoute::Kind::CaptureStream, s}; }

struct H {
  std::shared_ptr<gpu::HostSim> sim;
  std::unique_ptr<CachingAllocator> a;
  std::int64_t reserved() const { return a->stats().reserved_bytes[0].current; }
};

H make() {
  H h;
  gpu::HostOptions o;
  o.capacity = 4 * GiB;
  Config c;
  c.policy = Policy::Cachet;
  c.validate = true;
  h.a = std::make_unique<CachingAllocator>(gpu::make_host_memory(o, &h.sim), c);
  return h;
}

std::uint64_t addr(void* p) { return reinterpret_cast<std::uintptr_t>(p); }
std::int64_t I(Bytes b) { return static_cast<std::int64_t>(b); }

// R10, R11: the pool's free tail is not handed to a default allocation; its free page survives
// empty_cache() while the pool has a user and joins the default pool at the release.
TEST(PolicyCachetPools, APoolKeepsItsBlocksUntilReleased) {
  H h = make();
  const PoolId id{0, 1};
  h.a->create_or_incref_pool(id);            // MemPool()
  h.a->begin_allocate_to_pool(id, kThread);  // use_mem_pool enter
  EXPECT_EQ(h.a->pool_use_count(id), 2);
  void* a = h.a->allocate(1 * MiB, 0);  // page 0 mapped for the pool, a at its start (R3, R5)
  const std::uint64_t B = addr(a);
  h.a->end_allocate_to_pool(id);  // use_mem_pool exit
  h.a->release_pool(id);
  EXPECT_EQ(h.a->pool_use_count(id), 1);
  // [B + 1 MiB, B + 2 MiB) is the pool's: a default 512 KiB request maps page 1.
  void* q = h.a->allocate(512 * KiB, 0);
  EXPECT_EQ(addr(q), B + 2 * MiB);
  EXPECT_EQ(h.reserved(), I(2 * kPage));
  h.a->free(a);
  h.a->empty_cache();  // R10: the pool's page is no whole free page while it has a user
  EXPECT_EQ(h.reserved(), I(2 * kPage));
  EXPECT_EQ(h.a->stats().num_device_free, 0);
  EXPECT_EQ(h.sim->used(), 2 * kPage);
  const Snapshot s = h.a->snapshot();
  ASSERT_EQ(s.size(), 2u);  // one run of pages, two pools: two segments
  EXPECT_EQ(s[0].address, B);
  EXPECT_EQ(s[0].pool_id, id);
  EXPECT_EQ(s[0].total_size, kPage);
  EXPECT_EQ(s[1].pool_id, PoolId{});
  EXPECT_EQ(h.a->stats().segment[0].current, 1);  // the stat counts runs of mapped pages
  // A default 1 MiB request: R2 in the default pool's free [B + 2.5 MiB, B + 4 MiB), high end.
  void* r = h.a->allocate(1 * MiB, 0);
  EXPECT_EQ(addr(r), B + 3 * MiB);
  EXPECT_EQ(h.a->stats().num_device_alloc, 2);
  h.a->release_pool(id);  // R11: page 0 joins the default pool; no live block: forgotten
  EXPECT_THROW(h.a->pool_use_count(id), UsageError);
  h.a->empty_cache();  // page 0 is a whole free page of the default pool now
  EXPECT_EQ(h.reserved(), I(kPage));
  EXPECT_EQ(h.a->stats().num_device_free, 1);
  EXPECT_EQ(h.sim->used(), kPage);
  EXPECT_TRUE(h.a->invariants().empty());
}

// PyTorch's refusals (§14.2, §14.4 of docs/pytorch-allocator.md), each changing nothing; a
// released pool with a live block stays known (count 0) until that block is freed.
TEST(PolicyCachetPools, UseCountsRefuseWhatPyTorchRefuses) {
  H h = make();
  const PoolId id{1, 0};
  EXPECT_THROW(h.a->create_or_incref_pool(PoolId{}), UsageError);
  EXPECT_THROW(h.a->release_pool(id), UsageError);
  EXPECT_THROW(h.a->pool_use_count(id), UsageError);
  EXPECT_THROW(h.a->end_allocate_to_pool(id), UsageError);
  h.a->begin_allocate_to_pool(id, capture(3));
  EXPECT_THROW(h.a->begin_allocate_to_pool(id, capture(3)), UsageError);
  EXPECT_EQ(h.a->pool_use_count(id), 1);
  void* a = h.a->allocate(4 * MiB, 3);
  h.a->end_allocate_to_pool(id);
  EXPECT_THROW(h.a->end_allocate_to_pool(id), UsageError);
  h.a->release_pool(id);  // graph reset: 0, but `a` is live: still known
  EXPECT_EQ(h.a->pool_use_count(id), 0);
  EXPECT_THROW(h.a->release_pool(id), UsageError);
  EXPECT_THROW(h.a->create_or_incref_pool(id), UsageError);
  h.a->free(a);  // joins the default pool; the pool is forgotten
  EXPECT_THROW(h.a->pool_use_count(id), UsageError);
  h.a->empty_cache();
  EXPECT_EQ(h.reserved(), 0);
  h.a->create_or_incref_pool(id);  // the id may be made again
  EXPECT_EQ(h.a->pool_use_count(id), 1);
}

// R10: the filter decides; the newest active pool wins.
TEST(PolicyCachetPools, RoutingByFilterNewestFirst) {
  H h = make();
  const PoolId g{1, 0}, m{0, 1};
  h.a->begin_allocate_to_pool(g, [](StreamId s) { return s == 5; }, /*capture=*/true);
  void* d = h.a->allocate(1 * MiB, 0);  // default: page 0
  const std::uint64_t B = addr(d);
  EXPECT_EQ(addr(h.a->allocate(1 * MiB, 5)), B + 2 * MiB);  // the graph's pool: page 1
  h.a->begin_allocate_to_pool(m, kThread);
  EXPECT_EQ(addr(h.a->allocate(1 * MiB, 5)), B + 4 * MiB);  // the MemPool, newer: page 2
  h.a->end_allocate_to_pool(m);
  h.a->end_allocate_to_pool(g);
  const Snapshot s = h.a->snapshot();
  ASSERT_EQ(s.size(), 3u);
  EXPECT_EQ(s[0].pool_id, PoolId{});
  EXPECT_EQ(s[1].pool_id, g);
  EXPECT_EQ(s[2].pool_id, m);
}

// R12: a free with stream uses while a pool is active records no event (the host backend counts
// live events); its event is recorded at the first allocation after the pool ends.
TEST(PolicyCachetPools, EventsWaitUntilNoPoolIsActive) {
  H h = make();
  const PoolId id{0, 1};
  void* a = h.a->allocate(1 * MiB, 0);
  h.a->record_stream(a, 2);
  h.a->begin_allocate_to_pool(id, kThread);
  h.a->free(a);
  EXPECT_EQ(h.sim->live_events(), 0u);  // deferred: no event
  EXPECT_EQ(h.a->snapshot()[0].blocks[0].state, cachet::BlockState::ActivePendingFree);
  h.sim->complete_events(2);
  h.a->allocate(512, 0);  // no event processing while the pool is active
  EXPECT_EQ(h.a->stats().active_bytes[0].current, I(1 * MiB + 512));
  h.a->end_allocate_to_pool(id);
  h.a->allocate(512, 0);  // records the event on stream 2 now; not completed
  EXPECT_EQ(h.sim->live_events(), 1u);
  EXPECT_EQ(h.a->stats().active_bytes[0].current, I(1 * MiB + 1024));
  h.sim->complete_events(2);
  h.a->allocate(512, 0);  // completed: `a` is free
  EXPECT_EQ(h.a->stats().active_bytes[0].current, 1536);
}

// R12: no page is unmapped while a pool is active; the end of the last one unmaps whole free
// pages down to budget(T).
TEST(PolicyCachetPools, NoUnmappingDuringACapture) {
  H h = make();
  const PoolId g{1, 0};
  void* a = h.a->allocate(4 * MiB, 0);  // pages 0-1 (T = 2, budget 2)
  const std::uint64_t B = addr(a);
  h.a->free(a);
  h.a->begin_allocate_to_pool(g, capture(1));
  // Stream 1 cannot use stream 0's pages: pages 2-3 are mapped without unmapping 0-1.
  EXPECT_EQ(addr(h.a->allocate(4 * MiB, 1)), B + 4 * MiB);
  EXPECT_EQ(h.reserved(), I(4 * kPage));
  h.a->empty_cache();  // nothing during a capture
  EXPECT_EQ(h.reserved(), I(4 * kPage));
  EXPECT_EQ(h.a->stats().num_device_free, 0);
  h.a->end_allocate_to_pool(g);  // mapped 4 > budget(2) = 2: pages 0-1 go, in one call
  EXPECT_EQ(h.reserved(), I(2 * kPage));
  EXPECT_EQ(h.a->stats().num_device_free, 1);
  EXPECT_EQ(h.sim->used(), 2 * kPage);
}

// R11: a release leaves no more than budget(T) mapped: the pool's free pages beyond it go.
TEST(PolicyCachetPools, ReleaseTrimsToTheBudget) {
  H h = make();
  const PoolId m{0, 1};
  h.a->create_or_incref_pool(m);
  h.a->begin_allocate_to_pool(m, kThread);
  void* p = h.a->allocate(4 * MiB, 0);  // the pool: pages 0-1 (T = 2)
  const std::uint64_t B = addr(p);
  h.a->end_allocate_to_pool(m);
  h.a->release_pool(m);  // 1 user left
  h.a->free(p);          // pages 0-1: the pool's free pages
  // Default: pages 2-3. R4: T = 2, budget 2, 4 pages after mapping: 2 too many, but no whole free
  // page of the default pool to unmap (the pool's are not whole free pages, R10).
  void* d = h.a->allocate(4 * MiB, 0);
  EXPECT_EQ(addr(d), B + 4 * MiB);
  EXPECT_EQ(h.reserved(), I(4 * kPage));
  EXPECT_EQ(h.a->stats().num_device_free, 0);
  h.a->release_pool(m);  // pages 0-1 join the default pool: 4 mapped > budget(2): they go
  EXPECT_EQ(h.reserved(), I(2 * kPage));
  EXPECT_EQ(h.a->stats().num_device_free, 1);
  EXPECT_EQ(h.sim->used(), 2 * kPage);
}

}  // namespace
}  // namespace cachet::test

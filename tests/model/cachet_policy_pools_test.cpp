// policy:cachet's private pools in the model (model::CachetPolicy; rules R10-R12 in
// gpu/include/cachet/gpu/policy_cachet.h): a private pool keeps its blocks until it is released,
// the use counts refuse what PyTorch refuses (docs/pytorch-allocator.md §14.4), no event is
// recorded and no page is unmapped while a pool is active. Every address and
// figure below is worked out by hand from the rules: the reservation starts at the synthetic
// source's first reservation address B = 0x300000000 and pages are 2 MiB.
#include <gtest/gtest.h>

#include "cachet/config.h"
#include "cachet/errors.h"
#include "cachet/model/cachet_policy.h"
#include "cachet/model/segment_source.h"

namespace cachet::model::test {
namespace {

constexpr std::uint64_t B = 0x300000000;
constexpr PoolRoute kThread{PoolRoute::Kind::CurrentThread, 0};
PoolRoute capture(StreamId s) { return PoolRoute{PoolRoute::Kind::CaptureStream, s}; }

struct Cachet {
  Config config = [] {
    Config c;
    c.policy = Policy::Cachet;
    return c;
  }();
  SyntheticSegmentSource source{4 * GiB};
  CachetPolicy p{config, source};
  std::int64_t reserved() const { return p.stats().reserved_bytes[0].current; }
};

// R10, R11: the pool's free tail is not handed to a default allocation; the pool's free page
// survives empty_cache() while the pool has a user, and joins the default pool at the release.
TEST(CachetPools, APoolKeepsItsBlocksUntilReleased) {
  Cachet c;
  const PoolId id{0, 1};
  c.p.create_or_incref_pool(id);                // MemPool()
  c.p.begin_allocate_to_pool(id, kThread);      // use_mem_pool enter
  EXPECT_EQ(c.p.pool_use_count(id), 2);
  const auto a = c.p.malloc(1 * MiB);  // maps page 0 for the pool, left aligned (R3, R5)
  EXPECT_EQ(a, B);
  c.p.end_allocate_to_pool(id);  // use_mem_pool exit
  c.p.release_pool(id);
  EXPECT_EQ(c.p.pool_use_count(id), 1);
  c.p.check_invariants();
  // [B + 1 MiB, B + 2 MiB) is free in the pool: a default 512 KiB request cannot take it and
  // maps page 1 (its window's left neighbour is the pool's block, not the default pool's).
  const auto q = c.p.malloc(512 * KiB);
  EXPECT_EQ(q, B + 2 * MiB);
  EXPECT_EQ(c.reserved(), static_cast<std::int64_t>(4 * MiB));
  c.p.free(a);      // the pool's page 0 is free in the pool
  c.p.empty_cache();  // R10: not a whole free page while the pool has a user
  EXPECT_EQ(c.reserved(), static_cast<std::int64_t>(4 * MiB));
  EXPECT_EQ(c.p.stats().num_device_free, 0);
  Snapshot s = c.p.snapshot();
  ASSERT_EQ(s.size(), 2u);  // one run of pages, two pools: two segments
  EXPECT_EQ(s[0].address, B);
  EXPECT_EQ(s[0].pool_id, id);
  EXPECT_EQ(s[0].total_size, 2 * MiB);
  EXPECT_EQ(s[1].address, B + 2 * MiB);
  EXPECT_EQ(s[1].pool_id, PoolId{});
  EXPECT_EQ(c.p.stats().segment[0].current, 1);  // the stat counts runs of mapped pages
  // A default 1 MiB request: R2 in the default pool's free [B + 2.5 MiB, B + 4 MiB), high end.
  const auto r = c.p.malloc(1 * MiB);
  EXPECT_EQ(r, B + 3 * MiB);
  EXPECT_EQ(c.p.stats().num_device_alloc, 2);
  c.p.release_pool(id);  // R11: page 0 joins the default pool; no live block: forgotten
  EXPECT_FALSE(c.p.has_pool(id));
  EXPECT_THROW(c.p.pool_use_count(id), UsageError);
  c.p.check_invariants();
  c.p.empty_cache();  // now page 0 is a whole free page of the default pool
  EXPECT_EQ(c.reserved(), static_cast<std::int64_t>(2 * MiB));
  EXPECT_EQ(c.p.stats().num_device_free, 1);
  c.p.check_invariants();
}

// PyTorch's refusals (§14.2, §14.4), each changing nothing; a released pool with a live block
// stays known (count 0) until that block is freed, which gives its page to the default pool.
TEST(CachetPools, UseCountsRefuseWhatPyTorchRefuses) {
  Cachet c;
  const PoolId id{1, 0};
  EXPECT_THROW(c.p.create_or_incref_pool(PoolId{}), UsageError);
  EXPECT_THROW(c.p.release_pool(id), UsageError);
  EXPECT_THROW(c.p.pool_use_count(id), UsageError);
  EXPECT_THROW(c.p.end_allocate_to_pool(id), UsageError);
  c.p.begin_allocate_to_pool(id, capture(3));  // a new pool, count 1
  EXPECT_THROW(c.p.begin_allocate_to_pool(id, capture(3)), UsageError);
  EXPECT_EQ(c.p.pool_use_count(id), 1);
  const auto a = c.p.malloc(4 * MiB, 3);
  EXPECT_EQ(a, B);
  c.p.end_allocate_to_pool(id);
  EXPECT_THROW(c.p.end_allocate_to_pool(id), UsageError);
  c.p.release_pool(id);  // graph reset: 0, but `a` is live: the pool stays known
  EXPECT_EQ(c.p.pool_use_count(id), 0);
  EXPECT_THROW(c.p.release_pool(id), UsageError);
  EXPECT_THROW(c.p.create_or_incref_pool(id), UsageError);
  c.p.check_invariants();
  c.p.free(a);  // joins the default pool; the pool is forgotten
  EXPECT_FALSE(c.p.has_pool(id));
  c.p.empty_cache();
  EXPECT_EQ(c.reserved(), 0);
  c.p.create_or_incref_pool(id);  // the id may be made again
  EXPECT_EQ(c.p.pool_use_count(id), 1);
  c.p.check_invariants();
}

// R10: a capture takes only its stream; the newest active pool wins.
TEST(CachetPools, RoutingByStreamNewestFirst) {
  Cachet c;
  const PoolId g{1, 0}, m{0, 1};
  c.p.begin_allocate_to_pool(g, capture(5));
  EXPECT_EQ(c.p.malloc(1 * MiB, 0), B);            // default: page 0
  EXPECT_EQ(c.p.malloc(1 * MiB, 5), B + 2 * MiB);  // graph pool: page 1
  c.p.begin_allocate_to_pool(m, kThread);
  EXPECT_EQ(c.p.malloc(1 * MiB, 5), B + 4 * MiB);  // the MemPool, newer: page 2
  c.p.end_allocate_to_pool(m);
  c.p.end_allocate_to_pool(g);
  const Snapshot s = c.p.snapshot();
  ASSERT_EQ(s.size(), 3u);
  EXPECT_EQ(s[0].pool_id, PoolId{});
  EXPECT_EQ(s[1].pool_id, g);
  EXPECT_EQ(s[2].pool_id, m);
  c.p.check_invariants();
}

// R12: a free with stream uses while a pool is active records no event; its events are recorded
// at the first allocation after the pool ends, so an event completed before that does not count.
TEST(CachetPools, EventsWaitUntilNoPoolIsActive) {
  Cachet c;
  const PoolId id{0, 1};
  const auto a = c.p.malloc(1 * MiB);
  c.p.record_stream(a, 2);
  c.p.begin_allocate_to_pool(id, kThread);
  c.p.free(a);  // deferred: active_pending_free, no event
  EXPECT_EQ(c.p.snapshot()[0].blocks[0].state, cachet::BlockState::ActivePendingFree);
  c.p.complete_events(2);
  c.p.malloc(512);  // no event processing while the pool is active
  EXPECT_EQ(c.p.stats().active_bytes[0].current, static_cast<std::int64_t>(1 * MiB + 512));
  c.p.check_invariants();
  c.p.end_allocate_to_pool(id);
  c.p.check_invariants();  // still deferred, no pool active
  c.p.malloc(512);  // records the event on stream 2 now; not completed yet
  EXPECT_EQ(c.p.stats().active_bytes[0].current, static_cast<std::int64_t>(1 * MiB + 1024));
  c.p.complete_events(2);
  c.p.malloc(512);  // the event completed: `a` is free
  EXPECT_EQ(c.p.stats().active_bytes[0].current, 1536);
  c.p.check_invariants();
}

// R12: no page is unmapped while a pool is active (R4 maps beyond the budget); the end of the
// last active pool unmaps whole free pages down to budget(T).
TEST(CachetPools, NoUnmappingDuringACapture) {
  Cachet c;
  const PoolId g{1, 0};
  c.p.free(c.p.malloc(4 * MiB));  // pages 0-1 mapped, free (T = 2, budget 2)
  EXPECT_EQ(c.reserved(), static_cast<std::int64_t>(4 * MiB));
  c.p.begin_allocate_to_pool(g, capture(1));
  // Stream 1 cannot use stream 0's pages: pages 2-3 are mapped; R4 would unmap pages 0-1 first.
  EXPECT_EQ(c.p.malloc(4 * MiB, 1), B + 4 * MiB);
  EXPECT_EQ(c.reserved(), static_cast<std::int64_t>(8 * MiB));
  c.p.empty_cache();  // R12: nothing during a capture
  EXPECT_EQ(c.reserved(), static_cast<std::int64_t>(8 * MiB));
  EXPECT_EQ(c.p.stats().num_device_free, 0);
  c.p.check_invariants();
  c.p.end_allocate_to_pool(g);  // the last active pool: mapped 4 pages > budget(2) = 2: unmap 0-1
  EXPECT_EQ(c.reserved(), static_cast<std::int64_t>(4 * MiB));
  EXPECT_EQ(c.p.stats().num_device_free, 1);
  c.p.check_invariants();
}

// R12: a use_mem_pool counts as a capture (the plug-in cannot tell them apart): empty_cache()
// gives nothing back while it is active.
TEST(CachetPools, NoUnmappingInUseMemPoolEither) {
  Cachet c;
  const PoolId m{0, 1};
  c.p.free(c.p.malloc(4 * MiB));  // pages 0-1 mapped, free in the default pool
  c.p.create_or_incref_pool(m);
  c.p.begin_allocate_to_pool(m, kThread);
  c.p.empty_cache();
  EXPECT_EQ(c.reserved(), static_cast<std::int64_t>(4 * MiB));
  c.p.end_allocate_to_pool(m);  // mapped 2 <= budget(2): nothing to trim
  EXPECT_EQ(c.reserved(), static_cast<std::int64_t>(4 * MiB));
  c.p.empty_cache();
  EXPECT_EQ(c.reserved(), 0);
  c.p.check_invariants();
}

}  // namespace
}  // namespace cachet::model::test

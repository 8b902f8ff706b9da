// The cachet policy (cachet/gpu/policy_cachet.h) on the host backend. Expected values are
// computed by hand from the policy's rules in the header (2 MiB pages, 512-byte blocks, best
// fit in the stream's mapped free blocks, else the placement needing the fewest new pages,
// whole free pages moved instead of growing); addresses are relative to the reservation's
// base, which the first allocation of an empty allocator always gets. Every allocator here
// runs in validate mode (CachetPolicy::invariants() after each operation); the random
// sequences also check the promises [INV-BUDGET-1], stream reuse and [INV-CAP-1] from outside,
// on snapshots and the trace only.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "cachet/config.h"
#include "cachet/errors.h"
#include "cachet/gpu/allocator.h"
#include "cachet/gpu/host_backend.h"
#include "cachet/replay/replay.h"
#include "outside.h"

namespace cachet::test {
namespace {

struct H {
  std::shared_ptr<gpu::HostSim> sim;
  std::unique_ptr<CachingAllocator> a;
};

H make(Bytes capacity = 80 * GiB) {
  H h;
  gpu::HostOptions o;
  o.capacity = capacity;
  Config c;
  c.policy = Policy::Cachet;
  c.validate = true;
  h.a = std::make_unique<CachingAllocator>(gpu::make_host_memory(o, &h.sim), c);
  return h;
}

std::uint64_t addr(void* p) {
  return reinterpret_cast<std::uintptr_t>(p);
}
std::int64_t cur(const StatArray& s) {
  return s[0].current;
}
std::int64_t peak(const StatArray& s) {
  return s[0].peak;
}
std::int64_t I(Bytes b) {
  return static_cast<std::int64_t>(b);
}

TEST(PolicyCachet, SelectedByConfigAndReported) {
  auto h = make();
  EXPECT_EQ(h.a->config().policy, Policy::Cachet);
  // A runtime configure() keeps the policy chosen at construction.
  h.a->configure("max_split_size_mb:64");
  EXPECT_EQ(h.a->config().policy, Policy::Cachet);
  EXPECT_TRUE(h.a->invariants().empty());
}

TEST(PolicyCachet, FirstAllocationMapsOnePage) {
  auto h = make();
  void* p = h.a->allocate(1000, 0);
  auto s = h.a->stats();
  EXPECT_EQ(cur(s.allocated_bytes), 1024);
  EXPECT_EQ(cur(s.requested_bytes), 1000);
  EXPECT_EQ(cur(s.reserved_bytes), I(kPage));
  EXPECT_EQ(s.reserved_bytes[2].current, I(kPage));  // large_pool holds the pages
  EXPECT_EQ(cur(s.segment), 1);
  EXPECT_EQ(s.num_device_alloc, 1);
  EXPECT_EQ(h.sim->used(), kPage);
  h.a->free(p);
  s = h.a->stats();
  EXPECT_EQ(cur(s.allocated_bytes), 0);
  EXPECT_EQ(cur(s.reserved_bytes), I(kPage));  // cached
  h.a->empty_cache();
  s = h.a->stats();
  EXPECT_EQ(cur(s.reserved_bytes), 0);
  EXPECT_EQ(cur(s.segment), 0);
  EXPECT_EQ(s.num_device_free, 1);
  EXPECT_EQ(h.sim->used(), 0u);
}

TEST(PolicyCachet, BlocksPackIntoPages) {
  auto h = make();
  // p0: nothing is mapped, so R3: the whole reservation is one unmapped block with no
  // neighbours; left aligned at its start costs 1 page (page 0). R4: mapped 0 + 1 = 1 page,
  // T = 1, budget(1) = 1 + 1/64 = 1: no unmapping. R5: page 0 becomes a free block of stream 0,
  // p0 is carved at its start: [0, 1 MiB); [1 MiB, 2 MiB) stays free.
  void* p0 = h.a->allocate(1 * MiB, 0);
  // p1: R2 hot path, best fit [1 MiB, 2 MiB) (exactly 1 MiB); 1 MiB is small (<= 1 MiB), so the
  // HIGH end: 2 MiB - 1 MiB = 1 MiB. Same address as a low-end split would give.
  void* p1 = h.a->allocate(1 * MiB, 0);
  // p2: no free block of stream 0 is mapped. R3: the unmapped block [2 MiB, end) has a live
  // left neighbour (p1), so the window is the unmapped block alone; left aligned at 2 MiB costs
  // 1 page (page 1). R4: mapped 1 + 1 = 2, T = 2, budget 2: no unmapping. R5 carves at the
  // placement's address (the low end: R2's high end is for the hot path only): p2 = 2 MiB.
  void* p2 = h.a->allocate(1 * MiB, 0);
  EXPECT_EQ(addr(p1), addr(p0) + 1 * MiB);
  EXPECT_EQ(addr(p2), addr(p0) + 2 * MiB);
  auto s = h.a->stats();
  EXPECT_EQ(cur(s.reserved_bytes), I(2 * kPage));
  EXPECT_EQ(s.num_device_alloc, 2);
  EXPECT_EQ(cur(s.segment), 1);  // one run of mapped pages
  // 100 requests of 100,000 B (rounded to 100,352 B = 196 x 512) fill 10,035,200 B: 5 pages,
  // not the 2 MiB + 20 MiB segments PyTorch would take. A page holds 2,097,152 / 100,352 = 20
  // of them (20.9): in page j (j = 0..4), v[20j] comes from the slow path and is carved at the
  // page's start (R3 left aligned at the unmapped block's start: its left neighbour is v[20j-19],
  // live, at the top of page j-1, so the window has no left part); each of v[20j+1..20j+19] is a
  // small request served by R2 from the page's one free block [start + 100,352, top), at its HIGH
  // end: top - k x 100,352 for k = 1..19. What stays free, [start + 100,352, start + 190,464)
  // (90,112 B), fits no later request, so v[20j+20] maps page j+1 (mapped = touched = T: R4
  // never unmaps, budget(T) = T for T < 64).
  auto g = make();
  std::vector<void*> v;
  for (int i = 0; i < 100; ++i) v.push_back(g.a->allocate(100000, 0));
  for (int i = 0; i < 100; ++i) {
    const std::uint64_t j = static_cast<std::uint64_t>(i / 20),
                        k = static_cast<std::uint64_t>(i % 20);
    const std::uint64_t want = k == 0 ? j * kPage : (j + 1) * kPage - k * 100352;
    EXPECT_EQ(addr(v[i]), addr(v[0]) + want) << "i " << i;
  }
  EXPECT_EQ(cur(g.a->stats().reserved_bytes), I(5 * kPage));
  EXPECT_EQ(g.a->stats().num_device_alloc, 5);
}

// [INV-BUDGET-1]: pages move to where they are needed instead of reserved growing.
TEST(PolicyCachet, FreePagesMoveInsteadOfGrowing) {
  auto h = make();
  void* a = h.a->allocate(2 * MiB, 0);
  void* b = h.a->allocate(2 * MiB, 0);
  void* c = h.a->allocate(2 * MiB, 0);
  EXPECT_EQ(addr(b), addr(a) + 2 * MiB);
  EXPECT_EQ(addr(c), addr(a) + 4 * MiB);
  EXPECT_EQ(cur(h.a->stats().reserved_bytes), I(3 * kPage));
  h.a->free(a);
  h.a->free(c);
  // 4 MiB fit nowhere mapped. Placement: c's free page plus one new page above it; a's page is
  // unmapped first, so reserved stays at 3 pages.
  void* d = h.a->allocate(4 * MiB, 0);
  EXPECT_EQ(addr(d), addr(a) + 4 * MiB);
  auto s = h.a->stats();
  EXPECT_EQ(cur(s.reserved_bytes), I(3 * kPage));
  EXPECT_EQ(peak(s.reserved_bytes), I(3 * kPage));
  EXPECT_EQ(s.num_device_alloc, 4);
  EXPECT_EQ(s.num_device_free, 1);
  EXPECT_EQ(cur(s.segment), 1);  // pages 1..3
  EXPECT_EQ(h.sim->used(), 3 * kPage);
  (void)b;
}

// Stream reuse: a stream's freed memory goes to another stream only through an unmap.
TEST(PolicyCachet, OtherStreamsGetMemoryOnlyAfterUnmap) {
  auto h = make();
  const StreamId s1 = 11, s2 = 22;
  void* x = h.a->allocate(1 * MiB, s1);
  void* y = h.a->allocate(1 * MiB, s2);
  const auto base = addr(x);
  EXPECT_EQ(addr(y), base + 2 * MiB);  // not beside x: page 0's free half belongs to s1
  h.a->free(x);
  void* z1 = h.a->allocate(1 * MiB, s2);
  EXPECT_EQ(addr(z1), base + 3 * MiB);  // s2's own free half, not x
  void* z2 = h.a->allocate(1 * MiB, s2);
  EXPECT_EQ(addr(z2), base + 4 * MiB);  // a new page; x's page is unmapped to pay for it
  auto s = h.a->stats();
  EXPECT_EQ(cur(s.reserved_bytes), I(2 * kPage));
  EXPECT_EQ(s.num_device_free, 1);
  // s1 now finds nothing mapped of its own: page 0 is mapped again for it.
  void* w = h.a->allocate(1 * MiB, s1);
  EXPECT_EQ(addr(w), base);
  s = h.a->stats();
  EXPECT_EQ(cur(s.reserved_bytes), I(3 * kPage));
  EXPECT_EQ(s.num_device_alloc, 4);
}

// Stream reuse: stream uses hold the block until their events complete.
TEST(PolicyCachet, PendingFreeWaitsForEvents) {
  auto h = make();
  void* p = h.a->allocate(2 * MiB, 0);
  h.a->record_stream(p, 7);
  h.a->free(p);
  auto s = h.a->stats();
  EXPECT_EQ(cur(s.allocated_bytes), 0);
  EXPECT_EQ(cur(s.active_bytes), I(2 * MiB));
  void* q = h.a->allocate(2 * MiB, 0);
  EXPECT_EQ(addr(q), addr(p) + 2 * MiB);
  h.sim->complete_events(7);
  void* r = h.a->allocate(2 * MiB, 0);
  EXPECT_EQ(addr(r), addr(p));
  s = h.a->stats();
  EXPECT_EQ(cur(s.reserved_bytes), I(2 * kPage));
  EXPECT_EQ(cur(s.active_bytes), I(4 * MiB));
  EXPECT_EQ(h.sim->live_events(), 1u);  // pooled for reuse
}

// [INV-CAP-1]: under a cap, free pages of any stream are given back before an OOM.
TEST(PolicyCachet, CapMovesPagesBetweenStreamsThenOoms) {
  auto h = make(64 * MiB);
  h.a->set_memory_fraction(1.0 / 32);  // 2 MiB
  // a: slow path, page 0 (R3 left aligned at the reservation's start), stream 1; T = 1.
  void* a = h.a->allocate(2 * MiB, 1);
  // Page 0 becomes a mapped free block of stream 1 (R8).
  h.a->free(a);
  // b, stream 2: no free block of stream 2 (R2). R3: unmapped [2 MiB, end), its left neighbour
  // is stream 1's free page (not stream 2's: no window extension): left aligned at 2 MiB, 1 new
  // page. R4: mapped 1 + 1 = 2 > budget(T = 1) = 1 and > the cap (1 page): one whole free page
  // elsewhere is unmapped first (R6: page 0), then page 1 is mapped. Reserved never exceeds
  // 1 page (unmap before map), so its peak stays at 1 page.
  void* b = h.a->allocate(2 * MiB, 2);
  EXPECT_EQ(addr(b), addr(a) + 2 * MiB);
  auto s = h.a->stats();
  EXPECT_EQ(cur(s.reserved_bytes), I(kPage));
  EXPECT_EQ(peak(s.reserved_bytes), I(kPage));
  EXPECT_EQ(s.num_ooms, 0);
  // 2 MiB live + 512 B > the cap. R3: the first unmapped block, page 0, has no mapped free
  // neighbour of stream 2 (b is live): 1 new page; mapped 1 + 1 = 2 > the cap (1 page) and no
  // whole free page lies outside page 0 (R7): retry once (num_alloc_retries; nothing to unmap),
  // then OutOfMemory.
  EXPECT_THROW(h.a->allocate(512, 2), OutOfMemory);
  s = h.a->stats();
  EXPECT_EQ(s.num_ooms, 1);
  EXPECT_EQ(s.num_alloc_retries, 1);
  EXPECT_EQ(cur(s.reserved_bytes), I(kPage));
  h.a->free(b);
  // c: R2 hot path: stream 2's free block is b's page [2 MiB, 4 MiB); 1 MiB is small, so the
  // HIGH end: 4 MiB - 1 MiB = b + 1 MiB. No device call, no OOM.
  void* c = h.a->allocate(1 * MiB, 2);
  EXPECT_EQ(addr(c), addr(b) + 1 * MiB);
  EXPECT_EQ(h.a->stats().num_device_alloc, 2);
  EXPECT_EQ(h.a->stats().num_ooms, 1);
}

TEST(PolicyCachet, EmptyCacheAndDestructorReleaseEverything) {
  auto h = make();
  std::vector<void*> v;
  for (int i = 0; i < 20; ++i)
    v.push_back(h.a->allocate(static_cast<Bytes>(i + 1) * 300000, i % 3));
  for (void* p : v) h.a->free(p);
  h.a->empty_cache();
  EXPECT_EQ(cur(h.a->stats().reserved_bytes), 0);
  EXPECT_EQ(h.sim->used(), 0u);
  void* keep = h.a->allocate(5 * MiB, 0);
  (void)keep;
  EXPECT_EQ(h.sim->used(), 3 * kPage);
  auto sim = h.sim;
  h.a.reset();
  EXPECT_EQ(sim->used(), 0u);
}

TEST(PolicyCachet, MisuseThrowsUsageError) {
  auto h = make();
  void* p = h.a->allocate(4096, 0);
  EXPECT_THROW(h.a->free(static_cast<char*>(p) + 512), UsageError);
  h.a->free(p);
  EXPECT_THROW(h.a->free(p), UsageError);
  EXPECT_THROW(h.a->record_stream(p, 3), UsageError);
  EXPECT_THROW(h.a->free(reinterpret_cast<void*>(std::uintptr_t{0x1000})), UsageError);
  EXPECT_THROW(h.a->set_memory_fraction(1.5), UsageError);
  EXPECT_EQ(h.a->allocate(0, 0), nullptr);
  EXPECT_THROW(h.a->allocate(Bytes{1} << 60, 0), OutOfMemory);
  EXPECT_TRUE(h.a->invariants().empty());
}

TEST(PolicyCachet, SnapshotShowsRunsOfMappedPages) {
  auto h = make();
  void* a = h.a->allocate(3 * MiB, 0);
  void* b = h.a->allocate(1 * MiB, 5);  // its own page (stream 5)
  (void)a;
  (void)b;
  Snapshot snap = h.a->snapshot();
  ASSERT_EQ(snap.size(), 1u);  // pages 0..2, one run
  EXPECT_EQ(snap[0].total_size, 3 * kPage);
  EXPECT_TRUE(snap[0].is_expandable);
  ASSERT_EQ(snap[0].blocks.size(), 4u);  // a, a's free MiB (stream 0), b, b's free MiB
  EXPECT_EQ(snap[0].blocks[0].size, 3 * MiB);
  EXPECT_EQ(snap[0].blocks[1].state, BlockState::Inactive);
  EXPECT_EQ(snap[0].blocks[2].address, addr(a) + 4 * MiB);
  EXPECT_EQ(snap[0].allocated_size(), 4 * MiB);
  EXPECT_FALSE(h.a->summary().empty());
}

// ------------------------------------------------------------------ random sequences

// PyTorch's policy (default or expandable segments) on the same host backend, for the OOM
// comparison under a cap.
H make_pytorch(Bytes capacity, bool expandable) {
  H h;
  gpu::HostOptions o;
  o.capacity = capacity;
  Config c;
  c.expandable_segments = expandable;
  h.a = std::make_unique<CachingAllocator>(gpu::make_host_memory(o, &h.sim), c);
  return h;
}

struct OomCounts {
  int total = 0;
  int under = 0;  // with live requested + request under the cap less 2 MiB per stream
};

// One random sequence on the cachet policy (validate mode: invariants after every op) with the
// promises checked from outside. Capped: the same sequence also runs, op by op, through PyTorch's
// default and expandable policies under the same cap (out[1], out[2]; out[0] is cachet); a
// handle whose allocation failed on one allocator is skipped there when freed or recorded.
void random_run(std::uint64_t seed, bool capped, OomCounts out[3] = nullptr) {
  SCOPED_TRACE("seed " + std::to_string(seed) + (capped ? " capped" : ""));
  const Bytes cap = 256 * MiB;
  const Bytes capacity = capped ? 1 * GiB : 80 * GiB;
  std::vector<H> hs;
  hs.push_back(make(capacity));
  if (capped) {
    hs.push_back(make_pytorch(capacity, false));
    hs.push_back(make_pytorch(capacity, true));
  }
  auto& h = hs[0];
  for (auto& x : hs)
    if (capped) x.a->set_memory_fraction(0.25);
  h.a->set_trace(true);
  std::mt19937_64 rng(seed);
  struct Live {
    void* p[3];
    Bytes size;
    StreamId stream;
  };
  std::vector<Live> live;
  std::map<StreamId, Ranges> dirty;  // freed memory per stream, not unmapped since
  std::set<StreamId> streams_used;
  OomCounts ooms[3];
  Bytes peak_touched = 0;  // [INV-BUDGET-1]'s T, kept here from the snapshots
  auto uniform = [&](std::uint64_t lo, std::uint64_t hi) {
    return std::uniform_int_distribution<std::uint64_t>(lo, hi)(rng);
  };
  for (int op = 0; op < 1500; ++op) {
    const auto r = uniform(0, 99);
    if (r < 55 || live.empty()) {
      const auto k = uniform(0, 99);
      const Bytes size = k < 70   ? uniform(1, 1 * MiB)
                         : k < 95 ? uniform(1 * MiB, 16 * MiB)
                                  : uniform(16 * MiB, 96 * MiB);
      const StreamId s = uniform(1, 3);
      streams_used.insert(s);
      Live l{{nullptr, nullptr, nullptr}, size, s};
      bool any = false;
      for (std::size_t i = 0; i < hs.size(); ++i) {
        // Counted before the attempt: live requested bytes + this request.
        const auto requested = static_cast<Bytes>(cur(hs[i].a->stats().requested_bytes));
        try {
          l.p[i] = hs[i].a->allocate(size, s);
          any = true;
        } catch (const OutOfMemory&) {
          ASSERT_TRUE(capped) << "op " << op;
          ++ooms[i].total;
          // Issue 9's stronger goal (live + request under the cap less 2 MiB per stream never
          // OOMs) does not hold on adversarial random sequences (free bytes stranded inside
          // touched pages); counted, not asserted: see bench/RESULTS.md.
          if (requested + size + kPage * streams_used.size() <= cap) ++ooms[i].under;
          if (i == 0) {
            // [INV-CAP-1]: an OOM only after every whole free page was given back: then every
            // mapped page holds live bytes.
            const Pages pg = pages_of(h.a->snapshot());
            EXPECT_EQ(I(pg.touched * kPage), cur(h.a->stats().reserved_bytes)) << "op " << op;
          }
        }
      }
      if (any) live.push_back(l);
    } else if (r < 90) {
      const auto i = uniform(0, live.size() - 1);
      const bool rec = uniform(0, 9) == 0;
      const StreamId rs = rec ? 7 + uniform(0, 1) : 0;
      for (std::size_t k = 0; k < hs.size(); ++k) {
        if (live[i].p[k] == nullptr) continue;
        if (rec) hs[k].a->record_stream(live[i].p[k], rs);
        hs[k].a->free(live[i].p[k]);
      }
      live[i] = live.back();
      live.pop_back();
    } else if (r < 98) {
      const StreamId s = 7 + uniform(0, 1);
      for (auto& x : hs) x.sim->complete_events(s);
    } else {
      for (auto& x : hs) x.a->empty_cache();
    }
    // The trace, read from outside, the stream-reuse promise: no block goes to another stream
    // before an unmap.
    for (const TraceEvent& e : h.a->trace()) {
      switch (e.action) {
        case TraceAction::Alloc: {
          const Bytes sz = (e.size + 511) / 512 * 512;
          for (auto& [s, rg] : dirty)
            if (s != e.stream) {
              EXPECT_FALSE(rg.intersects(e.addr, e.addr + sz))
                  << "op " << op << ": stream " << e.stream << " got stream " << s
                  << "'s freed memory";
            }
          dirty[e.stream].remove(e.addr, e.addr + sz);
          break;
        }
        case TraceAction::FreeCompleted:
          dirty[e.stream].add(e.addr, e.addr + (e.size + 511) / 512 * 512);
          break;
        case TraceAction::SegmentUnmap:
          for (auto& [s, rg] : dirty) rg.remove(e.addr, e.addr + e.size);
          break;
        default:
          break;
      }
    }
    h.a->clear_trace();
    const auto st = h.a->stats();
    // [INV-BUDGET-1], from the snapshot: mapped pages <= budget(T) = T + floor(T / 64), T the
    // high-water mark of pages touched by live blocks, plus the free pages split between free
    // blocks of different streams.
    const Pages pg = pages_of(h.a->snapshot());
    peak_touched = std::max(peak_touched, pg.touched);
    EXPECT_EQ(I(pg.mapped * kPage), cur(st.reserved_bytes)) << "op " << op;
    EXPECT_LE(pg.mapped, peak_touched + peak_touched / 64 + pg.split)
        << "op " << op << ": [INV-BUDGET-1] " << pg.mapped
        << " pages mapped, touched high-water mark " << peak_touched << ", " << pg.split
        << " split free pages";
    if (capped) {
      EXPECT_LE(cur(st.reserved_bytes), I(cap)) << "op " << op;
    }
    if (::testing::Test::HasFailure()) return;
  }
  if (capped) {
    std::printf(
        "seed %llu: OOMs cachet %d, pytorch default %d, expandable %d; with live requested "
        "+ request under the cap less 2 MiB per stream: cachet %d, default %d, expandable %d\n",
        static_cast<unsigned long long>(seed), ooms[0].total, ooms[1].total, ooms[2].total,
        ooms[0].under, ooms[1].under, ooms[2].under);
    if (out != nullptr)
      for (int i = 0; i < 3; ++i) out[i] = ooms[i];
  }
  for (const Live& l : live)
    for (std::size_t k = 0; k < hs.size(); ++k)
      if (l.p[k] != nullptr) hs[k].a->free(l.p[k]);
  for (auto& x : hs) {
    x.sim->complete_all_events();
    x.a->empty_cache();
    EXPECT_EQ(cur(x.a->stats().reserved_bytes), 0);
    EXPECT_EQ(x.sim->used(), 0u);
  }
}

TEST(PolicyCachetRandom, InvariantsAndPromisesAfterEveryOp) {
  for (std::uint64_t seed = 1; seed <= 6; ++seed) random_run(seed, false);
}

// Issue 9: under a cap, the cachet policy never has more OOMs than PyTorch's policy (default
// and expandable_segments) on the same sequence.
TEST(PolicyCachetRandom, UnderACap) {
  OomCounts sum[3];
  for (std::uint64_t seed = 1; seed <= 6; ++seed) {
    OomCounts o[3];
    random_run(seed, true, o);
    if (::testing::Test::HasFailure()) return;
    EXPECT_LE(o[0].total, o[1].total)
        << "seed " << seed << ": more OOMs than PyTorch's default policy";
    EXPECT_LE(o[0].total, o[2].total)
        << "seed " << seed << ": more OOMs than PyTorch's expandable segments";
    for (int i = 0; i < 3; ++i) {
      sum[i].total += o[i].total;
      sum[i].under += o[i].under;
    }
  }
  std::printf(
      "6 seeds: OOMs cachet %d, pytorch default %d, expandable %d (under the cap less 2 MiB per "
      "stream: "
      "%d, %d, %d)\n",
      sum[0].total, sum[1].total, sum[2].total, sum[0].under, sum[1].under, sum[2].under);
}

// ------------------------------------------------------------------ the oracle recordings

struct Waste {
  const char* file;
  int streams;
};

// Issue 9's goal on the recorded op sequences (one line per recording in bench/RESULTS.md):
// peak reserved <= 1.05 x peak requested + 2 MiB per stream, and never above PyTorch's default
// or expandable configuration. Replayed in validate mode.
TEST(PolicyCachetReplay, RecordingsWasteAtMostFivePercent) {
  const Waste rows[] = {{"res_frag_default.json.gz", 1},
                        {"res_mixed_default.json.gz", 2},
                        {"res_mixed_empty_default.json.gz", 3}};
  for (const auto& w : rows) {
    SCOPED_TRACE(w.file);
    auto lt = replay::load_trace(std::string(CACHET_TEST_DATA) + "/oracle/results/" + w.file);
    auto opts = replay::recorded_options(lt, replay::AddressMode::Synthetic);
    Config c;
    c.policy = Policy::Cachet;
    c.validate = true;
    auto r = replay::replay(lt.trace, c, opts);
    Config e;
    e.expandable_segments = true;
    auto pd = replay::replay(lt.trace, Config{}, opts);
    auto pe = replay::replay(lt.trace, e, opts);
    const auto req = r.stats.requested_bytes[0].peak;
    EXPECT_EQ(r.failed_allocs, 0u);
    EXPECT_LE(r.peak_reserved(),
              static_cast<std::int64_t>(1.05 * static_cast<double>(req)) + w.streams * I(kPage));
    EXPECT_LE(r.peak_reserved(), pd.peak_reserved());
    EXPECT_LE(r.peak_reserved(), pe.peak_reserved());
  }
}

}  // namespace
}  // namespace cachet::test

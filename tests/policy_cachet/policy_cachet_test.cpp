// The cachet policy (cachet/gpu/policy_cachet.h) on the host backend. Expected values are
// computed by hand from the policy's rules in the header (2 MiB pages, 512-byte blocks, best
// fit in the stream's mapped free blocks, else the placement needing the fewest new pages,
// whole free pages moved instead of growing); addresses are relative to the reservation's
// base, which the first allocation of an empty allocator always gets. Every allocator here
// runs in validate mode (CachetPolicy::invariants() after each operation); the random
// sequences also check promises [P1]-[P3] from outside, on snapshots and the trace only.
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

namespace cachet::test {
namespace {

constexpr Bytes kPage = 2 * MiB;

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

std::uint64_t addr(void* p) { return reinterpret_cast<std::uintptr_t>(p); }
std::int64_t cur(const StatArray& s) { return s[0].current; }
std::int64_t peak(const StatArray& s) { return s[0].peak; }
std::int64_t I(Bytes b) { return static_cast<std::int64_t>(b); }

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
  void* p0 = h.a->allocate(1 * MiB, 0);
  void* p1 = h.a->allocate(1 * MiB, 0);  // the rest of page 0
  void* p2 = h.a->allocate(1 * MiB, 0);  // page 1
  EXPECT_EQ(addr(p1), addr(p0) + 1 * MiB);
  EXPECT_EQ(addr(p2), addr(p0) + 2 * MiB);
  auto s = h.a->stats();
  EXPECT_EQ(cur(s.reserved_bytes), I(2 * kPage));
  EXPECT_EQ(s.num_device_alloc, 2);
  EXPECT_EQ(cur(s.segment), 1);  // one run of mapped pages
  // 100 requests of 100,000 B (rounded to 100,352 B) fill 9,800,000-odd bytes: 5 pages, not
  // the 2 MiB + 20 MiB segments PyTorch would take.
  auto g = make();
  std::vector<void*> v;
  for (int i = 0; i < 100; ++i) v.push_back(g.a->allocate(100000, 0));
  for (int i = 1; i < 100; ++i) EXPECT_EQ(addr(v[i]), addr(v[0]) + static_cast<std::uint64_t>(i) * 100352);
  EXPECT_EQ(cur(g.a->stats().reserved_bytes), I(5 * kPage));  // 100 x 100,352 = 10,035,200 B
}

// [P1]: pages move to where they are needed instead of reserved growing.
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

// [P2]: a stream's freed memory goes to another stream only through an unmap.
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

// [P2]: stream uses hold the block until their events complete.
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

// [P3]: under a cap, free pages of any stream are given back before an OOM.
TEST(PolicyCachet, CapMovesPagesBetweenStreamsThenOoms) {
  auto h = make(64 * MiB);
  h.a->set_memory_fraction(1.0 / 32);  // 2 MiB
  void* a = h.a->allocate(2 * MiB, 1);
  h.a->free(a);
  void* b = h.a->allocate(2 * MiB, 2);
  EXPECT_EQ(addr(b), addr(a) + 2 * MiB);
  auto s = h.a->stats();
  EXPECT_EQ(cur(s.reserved_bytes), I(kPage));
  EXPECT_EQ(peak(s.reserved_bytes), I(kPage));
  EXPECT_EQ(s.num_ooms, 0);
  EXPECT_THROW(h.a->allocate(512, 2), OutOfMemory);  // 2 MiB live + 512 B > the cap
  s = h.a->stats();
  EXPECT_EQ(s.num_ooms, 1);
  EXPECT_EQ(s.num_alloc_retries, 1);
  EXPECT_EQ(cur(s.reserved_bytes), I(kPage));
  h.a->free(b);
  void* c = h.a->allocate(1 * MiB, 2);
  EXPECT_EQ(addr(c), addr(b));
  EXPECT_EQ(h.a->stats().num_ooms, 1);
}

TEST(PolicyCachet, EmptyCacheAndDestructorReleaseEverything) {
  auto h = make();
  std::vector<void*> v;
  for (int i = 0; i < 20; ++i) v.push_back(h.a->allocate(static_cast<Bytes>(i + 1) * 300000, i % 3));
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

// Byte ranges, kept as disjoint [lo, hi) intervals.
class Ranges {
 public:
  void add(std::uint64_t lo, std::uint64_t hi) {
    remove(lo, hi);
    m_[lo] = hi;
  }
  void remove(std::uint64_t lo, std::uint64_t hi) {
    auto it = m_.lower_bound(lo);
    if (it != m_.begin()) --it;
    while (it != m_.end() && it->first < hi) {
      auto [a, b] = *it;
      if (b <= lo) {
        ++it;
        continue;
      }
      it = m_.erase(it);
      if (a < lo) m_[a] = lo;
      if (b > hi) m_[hi] = b;
    }
  }
  bool intersects(std::uint64_t lo, std::uint64_t hi) const {
    auto it = m_.lower_bound(lo);
    if (it != m_.begin()) --it;
    for (; it != m_.end() && it->first < hi; ++it)
      if (it->second > lo) return true;
    return false;
  }

 private:
  std::map<std::uint64_t, std::uint64_t> m_;
};

// Pages touched by live blocks, from a snapshot.
Bytes touched(const Snapshot& snap) {
  std::set<std::uint64_t> pages;
  for (const auto& seg : snap)
    for (const auto& b : seg.blocks)
      if (b.state != BlockState::Inactive)
        for (std::uint64_t p = b.address / kPage; p * kPage < b.address + b.size; ++p) pages.insert(p);
  return pages.size() * kPage;
}

void random_run(std::uint64_t seed, bool capped) {
  SCOPED_TRACE("seed " + std::to_string(seed) + (capped ? " capped" : ""));
  const Bytes cap = 256 * MiB;
  auto h = make(capped ? 1 * GiB : 80 * GiB);
  if (capped) h.a->set_memory_fraction(0.25);
  h.a->set_trace(true);
  std::mt19937_64 rng(seed);
  struct Live {
    void* p;
    Bytes size;
    StreamId stream;
  };
  std::vector<Live> live;
  std::map<StreamId, Ranges> dirty;  // freed memory per stream, not unmapped since
  std::set<StreamId> streams_used;
  int allocator_ooms = 0;
  auto uniform = [&](std::uint64_t lo, std::uint64_t hi) { return std::uniform_int_distribution<std::uint64_t>(lo, hi)(rng); };
  for (int op = 0; op < 1500; ++op) {
    const auto r = uniform(0, 99);
    const auto reserved_peak_before = peak(h.a->stats().reserved_bytes);
    bool allocated = false;
    if (r < 55 || live.empty()) {
      const auto k = uniform(0, 99);
      const Bytes size = k < 70 ? uniform(1, 1 * MiB) : k < 95 ? uniform(1 * MiB, 16 * MiB) : uniform(16 * MiB, 96 * MiB);
      const StreamId s = uniform(1, 3);
      try {
        void* p = h.a->allocate(size, s);
        live.push_back({p, size, s});
        streams_used.insert(s);
        allocated = true;
      } catch (const OutOfMemory&) {
        ASSERT_TRUE(capped) << "op " << op;
        // [P3]: an OOM only after every whole free page was given back: then every mapped page
        // holds live bytes.
        EXPECT_EQ(I(touched(h.a->snapshot())), cur(h.a->stats().reserved_bytes)) << "op " << op;
        // Issue 9's stronger goal (live + request under the cap less 2 MiB per stream never
        // OOMs) does not hold on adversarial random sequences (free bytes stranded inside
        // touched pages); counted, not asserted: see bench/RESULTS.md.
        const auto active = static_cast<Bytes>(cur(h.a->stats().active_bytes));
        if (active + size + kPage * streams_used.size() <= cap) ++allocator_ooms;
      }
    } else if (r < 90) {
      const auto i = uniform(0, live.size() - 1);
      if (uniform(0, 9) == 0) h.a->record_stream(live[i].p, 7 + uniform(0, 1));
      h.a->free(live[i].p);
      live[i] = live.back();
      live.pop_back();
    } else if (r < 98) {
      h.sim->complete_events(7 + uniform(0, 1));
    } else {
      h.a->empty_cache();
    }
    // The trace, read from outside: [P2] no block goes to another stream before an unmap.
    for (const TraceEvent& e : h.a->trace()) {
      switch (e.action) {
        case TraceAction::Alloc: {
          const Bytes sz = (e.size + 511) / 512 * 512;
          for (auto& [s, rg] : dirty)
            if (s != e.stream) {
              EXPECT_FALSE(rg.intersects(e.addr, e.addr + sz))
                  << "op " << op << ": stream " << e.stream << " got stream " << s << "'s freed memory";
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
    // [P1]: reserved rises above its high-water mark only when every mapped page holds live
    // bytes.
    if (allocated && cur(st.reserved_bytes) > reserved_peak_before) {
      EXPECT_EQ(I(touched(h.a->snapshot())), cur(st.reserved_bytes)) << "op " << op;
    }
    if (capped) {
      EXPECT_LE(cur(st.reserved_bytes), I(cap)) << "op " << op;
    }
    if (::testing::Test::HasFailure()) return;
  }
  if (capped) std::printf("seed %llu: %d OOMs with live + request under the cap less 2 MiB per stream\n",
                          static_cast<unsigned long long>(seed), allocator_ooms);
  for (const Live& l : live) h.a->free(l.p);
  h.sim->complete_all_events();
  h.a->empty_cache();
  EXPECT_EQ(cur(h.a->stats().reserved_bytes), 0);
  EXPECT_EQ(h.sim->used(), 0u);
}

TEST(PolicyCachetRandom, InvariantsAndPromisesAfterEveryOp) {
  for (std::uint64_t seed = 1; seed <= 6; ++seed) random_run(seed, false);
}

TEST(PolicyCachetRandom, UnderACap) {
  for (std::uint64_t seed = 1; seed <= 6; ++seed) random_run(seed, true);
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
  const Waste rows[] = {{"res_frag_default.json.gz", 1}, {"res_mixed_default.json.gz", 2},
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
    EXPECT_LE(r.peak_reserved(), static_cast<std::int64_t>(1.05 * static_cast<double>(req)) + w.streams * I(kPage));
    EXPECT_LE(r.peak_reserved(), pd.peak_reserved());
    EXPECT_LE(r.peak_reserved(), pe.peak_reserved());
  }
}

}  // namespace
}  // namespace cachet::test

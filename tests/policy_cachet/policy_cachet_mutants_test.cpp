// Mutants 17-23 of the cachet policy (gpu/src/mutant.h, gpu/README.md's table): seeded random
// sequences on policy:cachet in validate mode (CachetPolicy::invariants() after every op) plus
// this test's own promise checks, computed from outside (snapshots, stats, the trace):
//
//   R2-ends        a hot-path allocation (no map call) lies at the HIGH end of the free block it
//                  came from when small (<= 1 MiB), at its low end when large
//   stream-reuse   no allocation gets memory another stream freed, unless unmapped since
//   pending-event  a block freed with stream uses stays pending (in the snapshot, and no
//                  allocation overlaps it) until the events of those streams have completed
//   budget         mapped pages <= T + T/64 + free pages split between free blocks, T the
//                  high-water mark of pages touched by live blocks (kept here)
//   cap            reserved <= the memory cap (set once, never lowered here)
//   R7-fit         no OutOfMemory while a free block of the requesting stream, freed by it and
//                  not unmapped since, holds the request (R7's retry runs R2 after the wait)
//   reserved       reserved_bytes == the mapped pages of the snapshot
//   stats          allocated_bytes == the live blocks' rounded sizes; allocated <= reserved
//   no-overlap, align   live blocks are disjoint and 512-aligned
//   [INV-...]      an invariant of CachetPolicy::invariants(), by its ID (docs/invariants.md)
//
// On the real library (cachet_gpu) no check fires. Linked against cachet_gpu_mutants
// (policy_cachet_mutants_planted) with CACHET_MUTANT=<n> and CACHET_EXPECT_MUTANT=<n> in the
// environment (ctest policy_cachet_mutant_<n>_test, label
// mutants), the test passes only when the check named for n in kKilledBy fires on at least one
// of the sequences (each sequence stops at its first firing check) or on the scripted retry.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
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
#include "outside.h"

namespace cachet::test {
namespace {

// The check that must fire for each mutant.
const std::map<int, std::string> kKilledBy = {
    {17, "R2-ends"},     {18, "stream-reuse"},  {19, "[INV-BUDGET-1]"}, {20, "[INV-STATS-1]"},
    {21, "[INV-CAP-1]"}, {22, "pending-event"}, {23, "R7-fit"}};

struct Fired {
  std::string check, detail;
};

std::uint64_t addr(void* p) {
  return reinterpret_cast<std::uintptr_t>(p);
}
Bytes rounded(Bytes n) {
  return (n + 511) / 512 * 512;
}

struct Failed {
  Fired f;
};
[[noreturn]] void fire(const std::string& check, const std::string& detail) {
  throw Failed{{check, detail}};
}

// The tag of the first invariant in an InvariantViolation message ("[INV-STATS-1]").
std::string tag_of(const std::string& msg) {
  const auto a = msg.find("\n  [");
  if (a == std::string::npos) return "invariant";
  const auto b = msg.find(']', a);
  return msg.substr(a + 3, b - a - 2);
}

// One seeded sequence of `ops` operations; the first check that fires, or an empty check.
Fired run(std::uint64_t seed, bool capped, int ops) {
  const Bytes cap = 256 * MiB;
  std::shared_ptr<gpu::HostSim> sim;
  gpu::HostOptions o;
  o.capacity = capped ? 1 * GiB : 80 * GiB;
  Config c;
  c.policy = Policy::Cachet;
  c.validate = true;
  auto a = std::make_unique<CachingAllocator>(gpu::make_host_memory(o, &sim), c);
  if (capped) a->set_memory_fraction(0.25);
  a->set_trace(true);
  std::mt19937_64 rng(seed);
  auto uniform = [&](std::uint64_t lo, std::uint64_t hi) {
    return std::uniform_int_distribution<std::uint64_t>(lo, hi)(rng);
  };
  struct Live {
    void* p;
    Bytes size;
  };
  struct Pending {
    std::uint64_t addr;
    Bytes size;
    std::set<StreamId> left;  // use streams whose events have not completed
  };
  std::vector<Live> live;
  std::vector<Pending> pending;
  Ranges live_ranges;
  std::map<StreamId, Ranges> dirty;  // freed memory per stream, not unmapped since
  Bytes peak_touched = 0;
  int op = 0;
  auto at = [&op](const std::string& s) { return "op " + std::to_string(op) + ": " + s; };
  // The stream-reuse promise, from the trace; keeps `dirty` (freed memory per stream, not unmapped
  // since).
  auto scan_trace = [&] {
    for (const TraceEvent& e : a->trace()) {
      if (e.action == TraceAction::Alloc) {
        const Bytes sz = rounded(e.size);
        for (auto& [s, rg] : dirty)
          if (s != e.stream && rg.intersects(e.addr, e.addr + sz))
            fire("stream-reuse", at("stream " + std::to_string(e.stream) + " got stream " +
                                    std::to_string(s) + "'s freed memory"));
        dirty[e.stream].remove(e.addr, e.addr + sz);
      } else if (e.action == TraceAction::FreeCompleted) {
        dirty[e.stream].add(e.addr, e.addr + rounded(e.size));
      } else if (e.action == TraceAction::SegmentUnmap) {
        for (auto& [s, rg] : dirty) rg.remove(e.addr, e.addr + e.size);
      }
    }
    a->clear_trace();
  };
  try {
    for (; op < ops; ++op) {
      const auto r = uniform(0, 99);
      if (r < 55 || live.empty()) {
        const auto k = uniform(0, 99);
        const Bytes size = k < 60   ? uniform(1, 1 * MiB)
                           : k < 95 ? uniform(1 * MiB, 16 * MiB)
                                    : uniform(16 * MiB, 64 * MiB);
        const StreamId s = uniform(1, 3);
        const Snapshot before = a->snapshot();
        const auto maps_before = a->stats().num_device_alloc;
        const auto unmaps_before = a->stats().num_device_free;
        const auto syncs_before = a->stats().num_sync_all_streams;
        void* p = nullptr;
        try {
          p = a->allocate(size, s);
        } catch (const OutOfMemory&) {
          if (!capped) fire("oom", at("OutOfMemory without a cap"));
          scan_trace();  // the retry's event wait and unmaps
          for (const auto& seg : a->snapshot())
            for (const auto& b : seg.blocks)
              if (b.state == BlockState::Inactive && b.size >= rounded(size) &&
                  dirty[s].covers(b.address, b.address + b.size))
                fire("R7-fit", at("OutOfMemory for " + std::to_string(size) + " B on stream " +
                                  std::to_string(s) + " while its free block of " +
                                  std::to_string(b.size) + " B holds it"));
        }
        // R7's retry (successful or not) waited for every pending event.
        if (a->stats().num_sync_all_streams != syncs_before) pending.clear();
        if (p != nullptr) {
          const std::uint64_t lo = addr(p), hi = lo + rounded(size);
          if (lo % 512 != 0) fire("align", at("pointer not 512-aligned"));
          for (const Pending& pd : pending)
            if (lo < pd.addr + pd.size && pd.addr < hi)
              fire("pending-event",
                   at("allocation overlaps a block whose stream uses have not completed"));
          if (live_ranges.intersects(lo, hi))
            fire("no-overlap", at("allocation overlaps a live block"));
          live_ranges.add(lo, hi);
          live.push_back({p, size});
          if (a->stats().num_device_alloc == maps_before &&
              a->stats().num_device_free ==
                  unmaps_before) {  // R2's hot path, nothing unmapped first
            for (const auto& seg : before)
              for (const auto& b : seg.blocks)
                if (b.state == BlockState::Inactive && b.address <= lo &&
                    hi <= b.address + b.size) {
                  const bool small = rounded(size) <= kSmallSize;
                  if (small ? hi != b.address + b.size : lo != b.address)
                    fire("R2-ends",
                         at(std::string(small ? "small" : "large") + " request of " +
                            std::to_string(size) + " B at " + std::to_string(lo - b.address) +
                            " B into its free block of " + std::to_string(b.size) + " B"));
                }
          }
        }
      } else if (r < 90) {
        const auto i = uniform(0, live.size() - 1);
        const Live l = live[i];
        live[i] = live.back();
        live.pop_back();
        live_ranges.remove(addr(l.p), addr(l.p) + rounded(l.size));
        if (uniform(0, 9) == 0) {
          const StreamId u = 7 + uniform(0, 1);
          a->record_stream(l.p, u);
          pending.push_back({addr(l.p), rounded(l.size), {u}});
        }
        a->free(l.p);
      } else if (r < 98) {
        const StreamId u = 7 + uniform(0, 1);
        sim->complete_events(u);
        for (Pending& pd : pending) pd.left.erase(u);
        std::erase_if(pending, [](const Pending& pd) { return pd.left.empty(); });
      } else {
        a->empty_cache();
        pending.clear();
      }
      scan_trace();
      const Snapshot snap = a->snapshot();
      const auto st = a->stats();
      for (const Pending& pd : pending) {
        bool found = false;
        for (const auto& seg : snap)
          for (const auto& b : seg.blocks)
            if (b.address == pd.addr && b.state == BlockState::ActivePendingFree) found = true;
        if (!found)
          fire("pending-event", at("a block freed with stream uses is no longer pending before its "
                                   "events completed"));
      }
      const Pages pg = pages_of(snap);
      peak_touched = std::max(peak_touched, pg.touched);
      const auto reserved = st.reserved_bytes[0].current;
      if (static_cast<std::int64_t>(pg.mapped * kPage) != reserved)
        fire("reserved", at("reserved " + std::to_string(reserved) + " != mapped pages " +
                            std::to_string(pg.mapped)));
      if (pg.mapped > peak_touched + peak_touched / 64 + pg.split)
        fire("budget", at(std::to_string(pg.mapped) + " pages mapped, touched high-water mark " +
                          std::to_string(peak_touched)));
      if (capped && reserved > static_cast<std::int64_t>(cap))
        fire("cap", at("reserved above the cap"));
      Bytes allocated = 0;
      for (const Live& l : live) allocated += rounded(l.size);
      if (st.allocated_bytes[0].current != static_cast<std::int64_t>(allocated) ||
          st.allocated_bytes[0].current > reserved)
        fire("stats", at("allocated_bytes " + std::to_string(st.allocated_bytes[0].current) +
                         ", live blocks " + std::to_string(allocated) + ", reserved " +
                         std::to_string(reserved)));
    }
  } catch (const Failed& f) {
    return f.f;
  } catch (const InvariantViolation& e) {
    return {tag_of(e.what()), at(e.what())};
  }
  return {};
}

// R7's retry, scripted: cap two pages, four 1 MiB blocks fill them, the second is freed with a
// use on another stream. The next 1 MiB request needs the retry's event wait, after which that
// block (inactive, of the requesting stream) holds it: an OutOfMemory there fires R7-fit.
Fired retry_case() {
  gpu::HostOptions o;
  o.capacity = 1 * GiB;
  Config c;
  c.policy = Policy::Cachet;
  c.validate = true;
  std::shared_ptr<gpu::HostSim> sim;
  CachingAllocator a(gpu::make_host_memory(o, &sim), c);
  a.set_memory_fraction(4.0 / 1024.0);
  void* p[4];
  for (auto& q : p) q = a.allocate(1 * MiB, 1);
  a.record_stream(p[1], 7);
  a.free(p[1]);
  try {
    a.allocate(1 * MiB, 1);
  } catch (const OutOfMemory&) {
    for (const auto& seg : a.snapshot())
      for (const auto& b : seg.blocks)
        if (b.state == BlockState::Inactive && b.address == addr(p[1]) && b.size >= 1 * MiB)
          return {"R7-fit", "scripted retry: OutOfMemory while the freed 1 MiB block is free"};
    return {"oom", "scripted retry: OutOfMemory"};
  } catch (const InvariantViolation& e) {
    return {tag_of(e.what()), e.what()};
  }
  return {};
}

int expected_mutant() {
  const char* e = std::getenv("CACHET_EXPECT_MUTANT");
  return e != nullptr ? std::atoi(e) : 0;
}

TEST(PolicyCachetMutants, NamedCheckFiresOnlyForItsMutant) {
  const int n = expected_mutant();
  std::set<std::string> fired;
  for (std::uint64_t seed = 1; seed <= 4; ++seed)
    for (bool capped : {false, true}) {
      const Fired f = run(seed, capped, 600);
      if (f.check.empty()) continue;
      std::printf("seed %llu%s: %s fired: %s\n", static_cast<unsigned long long>(seed),
                  capped ? " capped" : "", f.check.c_str(), f.detail.substr(0, 300).c_str());
      fired.insert(f.check);
      if (n == 0)
        ADD_FAILURE() << "check " << f.check << " fired on the real library: " << f.detail;
    }
  if (const Fired f = retry_case(); !f.check.empty()) {
    std::printf("scripted retry: %s fired: %s\n", f.check.c_str(), f.detail.substr(0, 300).c_str());
    fired.insert(f.check);
    if (n == 0) ADD_FAILURE() << "check " << f.check << " fired on the real library: " << f.detail;
  }
  if (n == 0) return;
  const auto it = kKilledBy.find(n);
  ASSERT_NE(it, kKilledBy.end()) << "CACHET_EXPECT_MUTANT=" << n
                                 << " is not a cachet mutant (17-23)";
  EXPECT_TRUE(fired.count(it->second))
      << "mutant " << n << " survived: check " << it->second << " never fired";
}

}  // namespace
}  // namespace cachet::test

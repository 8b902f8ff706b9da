// policy:cachet against its reference model through the project's one lockstep harness
// (cachet/lockstep.h CachetLockstep: gpu::CachingAllocator with policy:cachet on the host
// backend, model::CachetPolicy fed the same addresses and the same capacity). After every op
// both sides must agree on the pointer or error, the device calls, the trace events in order,
// every stat, the snapshot, and both must pass their own invariants: the same checks as
// policy:pytorch's pair. Ops are the vocabulary of cachet/ops.h; a failure prints the case
// file (config, capacity, ops up to the failing one) that `props_test --replay FILE` replays.
// RapidCheck's state machine shrinks policy:cachet's failures (props/README.md).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "cachet/config.h"
#include "cachet/io/recording.h"
#include "cachet/lockstep.h"
#include "cachet/model/cachet_policy.h"
#include "cachet/stats.h"

namespace cachet::test {
namespace {

using lockstep::CachetLockstep;
using ops::Op;

struct Case {
  Bytes capacity = 4 * GiB;        // host backend capacity = total memory
  std::optional<double> fraction;  // set_memory_fraction before the first op
  std::vector<Op> ops;
};

// The case as a case file (cachet/ops.h): the initial fraction becomes the first op.
ops::Case case_file(const Case& c) {
  ops::Case f{"policy:cachet", c.capacity, {}};
  if (c.fraction) f.ops.push_back(ops::SetMemoryFraction{*c.fraction});
  f.ops.insert(f.ops.end(), c.ops.begin(), c.ops.end());
  return f;
}

// What a run exercised (the model's final counters, summed over cases).
struct Coverage {
  std::int64_t allocs = 0, ooms = 0, retries = 0, maps = 0, unmaps = 0, syncs = 0;
};

// Runs a case through the harness; "" when both sides agree after every op, else the report
// and the case file up to the failing op.
std::string run_case(const Case& c, Coverage* cov = nullptr) {
  const ops::Case f = case_file(c);
  lockstep::Options o;
  o.config.policy = Policy::Cachet;
  o.capacity = c.capacity;
  CachetLockstep ls(o);
  for (std::size_t i = 0; i < f.ops.size(); ++i)
    if (auto d = ls.apply(f.ops[i])) {
      ops::Case cut = f;
      cut.ops.resize(i + 1);
      return "op #" + std::to_string(i) + " (" + ops::show(f.ops[i]) + "): " + *d +
             "the case (save as a .ops file, replay with props_test --replay FILE):\n" + ops::show_case(cut);
    }
  if (cov) {
    const DeviceStats& s = ls.model().stats();
    cov->allocs += s.allocation[0].allocated;
    cov->ooms += s.num_ooms;
    cov->retries += s.num_alloc_retries;
    cov->maps += s.num_device_alloc;
    cov->unmaps += s.num_device_free;
    cov->syncs += s.num_sync_all_streams;
  }
  return "";
}

// ------------------------------------------------------------------ random cases

Bytes random_size(std::mt19937_64& rng) {
  static const Bytes kEdges[] = {512, 1 * MiB, 2 * MiB, 4 * MiB, 10 * MiB, 20 * MiB};
  std::uniform_int_distribution<int> pick(0, 9);
  switch (pick(rng)) {
    case 0:
    case 1:
    case 2: {  // within 1 KiB of a boundary (512 B, 1 MiB, 2 MiB, ...)
      const Bytes e = kEdges[std::uniform_int_distribution<int>(0, 5)(rng)];
      const auto d = std::uniform_int_distribution<std::int64_t>(-1024, 1024)(rng);
      const auto v = static_cast<std::int64_t>(e) + d;
      return v < 1 ? 1 : static_cast<Bytes>(v);
    }
    case 3:  // an exact multiple of 512 B up to 4 MiB
      return std::uniform_int_distribution<Bytes>(1, 8192)(rng) * 512;
    case 4:  // large: 2 .. 64 MiB
      return std::uniform_int_distribution<Bytes>(2 * MiB, 64 * MiB)(rng);
    default: {  // log-uniform 1 B .. 64 MiB
      const double x = std::uniform_real_distribution<double>(0.0, 26.0)(rng);
      return std::max<Bytes>(1, static_cast<Bytes>(std::exp2(x)));
    }
  }
}

Case random_case(std::uint64_t seed, int n_ops) {
  std::mt19937_64 rng(seed);
  Case c;
  const int streams = std::uniform_int_distribution<int>(1, 3)(rng);
  const int shape = std::uniform_int_distribution<int>(0, 9)(rng);
  if (shape <= 1)
    c.capacity =
        256 * MiB + std::uniform_int_distribution<Bytes>(0, 64)(rng) * 2 * MiB;  // device refuses
  if (shape >= 7) c.fraction = std::uniform_real_distribution<double>(0.02, 0.3)(rng);  // a cap
  std::vector<std::uint64_t> ids;  // allocated and not freed (on the generator's side)
  std::uint64_t next_id = 0;
  auto stream = [&] {
    return static_cast<StreamId>(std::uniform_int_distribution<int>(0, streams - 1)(rng));
  };
  for (int i = 0; i < n_ops; ++i) {
    const int r = std::uniform_int_distribution<int>(0, 99)(rng);
    // Keep the live set moderate: free more when many blocks are live.
    const int alloc_share = ids.size() > 60 ? 30 : 55;
    if (r < alloc_share || ids.empty()) {
      {
        const Bytes size = random_size(rng);
        c.ops.push_back(ops::Allocate{size, stream(), next_id});
      }
      ids.push_back(next_id++);
    } else if (r < 85) {
      const auto k = std::uniform_int_distribution<std::size_t>(0, ids.size() - 1)(rng);
      c.ops.push_back(ops::Free{ids[k]});
      ids.erase(ids.begin() + static_cast<std::ptrdiff_t>(k));
    } else if (r < 93) {
      const auto k = std::uniform_int_distribution<std::size_t>(0, ids.size() - 1)(rng);
      c.ops.push_back(ops::RecordStream{ids[k], stream()});
    } else if (r < 97) {
      c.ops.push_back(ops::CompleteEvents{stream()});
    } else if (r < 98) {
      c.ops.push_back(ops::CompleteAllEvents{});
    } else if (r < 99 || !c.fraction) {
      c.ops.push_back(ops::EmptyCache{});
    } else {  // a new cap, often below the mapped bytes (R7's trim)
      c.ops.push_back(
          ops::SetMemoryFraction{static_cast<double>(std::uniform_int_distribution<Bytes>(10'000, 300'000)(rng)) / 1e6});
    }
  }
  return c;
}

std::uint64_t env_u64(const char* name, std::uint64_t fallback) {
  const char* v = std::getenv(name);
  return v ? std::strtoull(v, nullptr, 0) : fallback;
}

TEST(Lockstep, RandomSequences) {
  const std::uint64_t first = env_u64("CACHET_LOCKSTEP_SEED", 1);
  const std::uint64_t cases = env_u64("CACHET_LOCKSTEP_CASES", 300);
  const int n_ops = static_cast<int>(env_u64("CACHET_LOCKSTEP_OPS_PER_CASE", 400));
  Coverage cov;
  const auto t0 = std::chrono::steady_clock::now();
  std::uint64_t ops = 0, failures = 0, ran = 0;
  for (std::uint64_t seed = first; seed < first + cases; ++seed, ++ran) {
    const Case c = random_case(seed, n_ops);
    ops += c.ops.size();
    if (const std::string f = run_case(c, &cov); !f.empty()) {
      ADD_FAILURE() << "seed " << seed << " (CACHET_LOCKSTEP_SEED=" << seed << " CACHET_LOCKSTEP_CASES=1), " << f;
      if (++failures == 3) break;
    }
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf(
      "lockstep: %llu sequences, %llu ops, %.2f s; model totals: %lld allocations, %lld OOMs, %lld "
      "retries, %lld maps, %lld unmaps, %lld event syncs\n",
      static_cast<unsigned long long>(ran), static_cast<unsigned long long>(ops), s,
      static_cast<long long>(cov.allocs), static_cast<long long>(cov.ooms), static_cast<long long>(cov.retries),
      static_cast<long long>(cov.maps), static_cast<long long>(cov.unmaps), static_cast<long long>(cov.syncs));
  if (failures == 0 && cases >= 100) {  // the generator still reaches every rule
    EXPECT_GT(cov.ooms, 0);
    EXPECT_GT(cov.retries, cov.ooms);
    EXPECT_GT(cov.unmaps, 0);
    EXPECT_GT(cov.syncs, 0);
  }
}

// The oracle op lists (tests/data/oracle/ops; id-addressed, stream indices used as streams), on
// a roomy device and on a tight one (OOMs and device refusals), with and without a cap.
TEST(Lockstep, OracleOpLists) {
  const std::string dir = std::string(CACHET_TEST_DATA) + "/oracle/ops";
  std::vector<std::string> files;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.path().string().ends_with(".json.gz")) files.push_back(e.path().string());
  std::sort(files.begin(), files.end());
  ASSERT_FALSE(files.empty());
  for (const std::string& path : files) {
    Case base;
    base.ops = io::read_ops(path);
    struct Variant {
      const char* name;
      Bytes capacity;
      std::optional<double> fraction;
    };
    for (const Variant& v : {Variant{"80 GiB", 80 * GiB, std::nullopt}, Variant{"1 GiB", 1 * GiB, std::nullopt},
                             Variant{"8 GiB, fraction 0.05", 8 * GiB, 0.05}}) {
      Case c = base;
      c.capacity = v.capacity;
      c.fraction = v.fraction;
      if (const std::string f = run_case(c); !f.empty())
        ADD_FAILURE() << std::filesystem::path(path).filename().string() << " on " << v.name << ": " << f;
    }
  }
}

// A few hand-written cases through the runner (they print nothing when both sides agree).
TEST(Lockstep, HandWritten) {
  // Pending blocks, a second stream, then empty_cache.
  Case c;
  c.ops = ops::parse_ops(R"(alloc h0 1048576 s0
alloc h1 1048576 s0
record h1 s1
free h1
alloc h2 3145728 s1
complete s1
alloc h3 512 s0
free h0
alloc h4 5242880 s0
empty_cache
free h2
free h3
free h4
empty_cache
)");
  EXPECT_EQ(run_case(c), "");
}

// The model alone on a 1 GiB synthetic device, for hand-computed expectations.
struct ModelOn1GiB {
  model::SyntheticSegmentSource src{1 * GiB};
  Config config = [] {
    Config c;
    c.policy = Policy::Cachet;
    return c;
  }();
  model::CachetPolicy m{config, src};
};

// R7's retry runs R2 again after the event wait. Cap one page: a = [0, 1 MiB) and b =
// [1 MiB, 2 MiB) fill it; b is freed with a use on stream 1 (pending). The next 1 MiB request
// finds no free block (R2) and no window under the cap (R3 needs page 1), so it retries: the wait
// frees b, and R2 hands b's bytes back with no device call.
TEST(Lockstep, RetryRunsBestFitAfterTheWait) {
  Case c;
  c.capacity = 1 * GiB;
  c.fraction = 2.0 / 1024.0;  // cap: one page
  c.ops = ops::parse_ops("alloc h0 1048576 s0\nalloc h1 1048576 s0\nrecord h1 s1\nfree h1\nalloc h2 1048576 s0\n");
  EXPECT_EQ(run_case(c), "");
  ModelOn1GiB on;
  model::CachetPolicy& m = on.m;
  m.set_memory_fraction(2.0 / 1024.0);
  const auto a = m.malloc(1 * MiB, 0);
  const auto b = m.malloc(1 * MiB, 0);
  EXPECT_EQ(b, a + 1 * MiB);  // small: the high end of the page's free rest
  m.record_stream(b, 1);
  m.free(b);
  EXPECT_EQ(m.malloc(1 * MiB, 0), b);
  EXPECT_EQ(m.stats().num_ooms, 0);
  EXPECT_EQ(m.stats().num_alloc_retries, 1);
  EXPECT_EQ(m.stats().num_sync_all_streams, 1);
  EXPECT_EQ(m.stats().num_device_alloc, 1);
  EXPECT_EQ(m.stats().num_device_free, 0);
  m.check_invariants();
}

// The same with the freed block away from any unmapped block: cap two pages, four 1 MiB blocks
// fill pages 0 and 1, the second is freed with a use on stream 1. The retry's R2 returns it.
TEST(Lockstep, RetryRunsBestFitInsideMappedPages) {
  Case c;
  c.capacity = 1 * GiB;
  c.fraction = 4.0 / 1024.0;  // cap: two pages
  c.ops = ops::parse_ops(
      "alloc h0 1048576 s0\nalloc h1 1048576 s0\nalloc h2 1048576 s0\nalloc h3 1048576 s0\nrecord h1 s1\n"
      "free h1\nalloc h4 1048576 s0\n");
  EXPECT_EQ(run_case(c), "");
  ModelOn1GiB on;
  model::CachetPolicy& m = on.m;
  m.set_memory_fraction(4.0 / 1024.0);
  std::vector<std::uint64_t> p;
  for (int i = 0; i < 4; ++i) p.push_back(m.malloc(1 * MiB, 0));
  EXPECT_EQ(p[3], p[0] + 3 * MiB);
  m.record_stream(p[1], 1);
  m.free(p[1]);
  EXPECT_EQ(m.malloc(1 * MiB, 0), p[1]);
  EXPECT_EQ(m.stats().num_ooms, 0);
  EXPECT_EQ(m.stats().num_alloc_retries, 1);
  EXPECT_EQ(m.stats().num_sync_all_streams, 1);
  EXPECT_EQ(m.stats().num_device_alloc, 2);
  m.check_invariants();
}

// A cap lowered below the mapped bytes unmaps whole free pages down to it (R7), at once when
// there are free pages, else at the free() that makes them. Two 10 MiB blocks map pages 0-9.
TEST(Lockstep, LoweredCapTrimsToTheCap) {
  Case c;
  c.capacity = 1 * GiB;
  // Fraction 0.0085 of 1 GiB: cap 9,126,805 B, 4 whole pages.
  c.ops = ops::parse_ops(
      "alloc h0 10485760 s0\nalloc h1 10485760 s0\nfraction 0.0085\nfree h0\nfree h1\nalloc h2 6291456 s0\n");
  EXPECT_EQ(run_case(c), "");
  ModelOn1GiB on;
  model::CachetPolicy& m = on.m;
  const auto a = m.malloc(10 * MiB, 0);
  const auto b = m.malloc(10 * MiB, 0);
  EXPECT_EQ(m.mapped_bytes(), 20 * MiB);
  m.set_memory_fraction(0.0085);  // below the live blocks' 10 pages: nothing to unmap yet
  EXPECT_EQ(m.mapped_bytes(), 20 * MiB);
  EXPECT_EQ(m.stats().num_device_free, 0);
  m.check_invariants();  // [INV-CAP-1] allows it: no whole free page is mapped
  m.free(a);             // pages 0-4 whole free, 6 over the cap: all 5 unmapped, in one call
  EXPECT_EQ(m.mapped_bytes(), 10 * MiB);
  EXPECT_EQ(m.stats().num_device_free, 1);
  m.check_invariants();  // still above the cap, with no whole free page
  m.free(b);             // pages 5-9 whole free, 1 over the cap: the highest one (page 9) unmapped
  EXPECT_EQ(m.mapped_bytes(), 8 * MiB);
  EXPECT_EQ(m.stats().num_device_free, 2);
  EXPECT_EQ(m.stats().reserved_bytes[0].current, static_cast<std::int64_t>(8 * MiB));
  m.check_invariants();
  EXPECT_EQ(m.malloc(6 * MiB, 0), b);  // R2: the mapped free block [b, b + 8 MiB) holds it
  EXPECT_EQ(m.stats().num_ooms, 0);
}

}  // namespace
}  // namespace cachet::test

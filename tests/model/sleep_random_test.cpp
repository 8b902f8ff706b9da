// Sleep and wake under random op sequences (fixed seeds), both model policies: every invariant of
// docs/invariants.md, INV-SLEEP-1 to -3 included, holds after every op; no pointer malloc returns
// lies in a sleeping range (malloc's own INV-SLEEP-1 check); every live block keeps its address
// through sleeps and wakes; the sleep stats return to 0 once everything is awake. The exact values
// are in sleep_test.cpp and cachet_policy_sleep_test.cpp; this file looks for states those miss.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <stdexcept>
#include <vector>

#include "cachet/config.h"
#include "cachet/errors.h"
#include "cachet/model/allocator.h"
#include "cachet/model/cachet_policy.h"
#include "cachet/model/segment_source.h"
#include "cachet/tags.h"

namespace cachet::model::test {
namespace {

const std::vector<std::string> kTags = {"default", "weights", "kv_cache"};
const std::vector<Bytes> kSizes = {512, 100 * KiB, 1 * MiB, 3 * MiB, 12 * MiB, 25 * MiB};

TagList random_tags(std::mt19937_64& rng) {
  TagList out;
  for (const auto& t : kTags)
    if (rng() % 2 == 0) out.push_back(t);
  return out;
}

template <class A>
void run(A& a, std::uint64_t seed, int ops) {
  std::mt19937_64 rng(seed);
  std::map<std::uint64_t, Bytes> live;  // ptr -> size
  std::vector<PoolId> active;           // use_mem_pool entered, not left
  std::map<PoolId, int> refs;           // the users each pool still has from this run
  bool pools_used = false;
  for (int i = 0; i < ops; ++i) {
    const int op = static_cast<int>(rng() % 100);
    SCOPED_TRACE("seed " + std::to_string(seed) + " op " + std::to_string(i) + " kind " +
                 std::to_string(op));
    try {
      if (op < 40) {
        TagScope t(kTags[rng() % kTags.size()]);
        try {
          const auto p = a.malloc(kSizes[rng() % kSizes.size()], rng() % 4 == 0 ? 1 : 0);
          ASSERT_FALSE(live.contains(p));
          live.emplace(p, 0);
        } catch (const OutOfMemory&) {
        }
      } else if (op < 65 && !live.empty()) {
        auto it = live.begin();
        std::advance(it, static_cast<long>(rng() % live.size()));
        if (rng() % 4 == 0) a.record_stream(it->first, 2);
        a.free(it->first);
        live.erase(it);
      } else if (op < 70) {
        a.complete_all_events();
      } else if (op < 78) {
        // Refused (UsageError, nothing changes) while a pool is active.
        if (!active.empty())
          EXPECT_THROW(a.sleep(random_tags(rng), random_tags(rng)), UsageError);
        else
          a.sleep(random_tags(rng), random_tags(rng));
      } else if (op < 86) {
        try {
          a.wake(random_tags(rng));
        } catch (const OutOfMemory&) {
        }
      } else if (op < 90) {
        a.empty_cache();
      } else if (op < 94) {  // use_mem_pool enters a pool
        const PoolId id{0, 1 + static_cast<std::uint64_t>(rng() % 2)};
        if (std::find(active.begin(), active.end(), id) == active.end() &&
            (refs[id] > 0 || !a.has_pool(id))) {
          a.begin_allocate_to_pool(id, PoolRoute{PoolRoute::Kind::CurrentThread, 0, 0});
          active.push_back(id);
          ++refs[id];
          pools_used = true;
        }
      } else if (op < 98) {  // ... and leaves it, the MemPool released half of the time
        if (!active.empty()) {
          const PoolId id = active.back();
          active.pop_back();
          a.end_allocate_to_pool(id);
          if (rng() % 2 == 0) {
            // A marked pool whose users all released it is where PyTorch fails (§15.2): unmarked.
            if constexpr (requires { a.set_use_on_oom(id, false); })
              if (refs[id] == 1) a.set_use_on_oom(id, false);
            a.release_pool(id);
            --refs[id];
          }
        }
      } else if (op < 99) {
        const double fractions[] = {1.0, 0.5, 0.25};
        a.set_memory_fraction(fractions[rng() % 3]);
      } else if constexpr (requires { a.set_use_on_oom(PoolId{0, 1}, true); }) {
        // MemPool(use_on_oom=True): the fallback lends only what the tag allows (SLEEP-R1).
        const PoolId id{0, 1 + static_cast<std::uint64_t>(rng() % 2)};
        if (refs[id] > 0) a.set_use_on_oom(id, rng() % 2 == 0);
      }
    } catch (const PyTorchFailure&) {
      return;  // where PyTorch 2.11 itself fails, the run ends (docs/pytorch-allocator.md §14.8)
    }
    try {
      a.check_invariants();
    } catch (const std::logic_error& e) {
      FAIL() << "seed " << seed << ", after op " << i << " (kind " << op << "): " << e.what();
    }
  }
  while (!active.empty()) {
    a.end_allocate_to_pool(active.back());
    active.pop_back();
  }
  // Everything wakes, if the memory is there once the awake cache is emptied (sleeping memory is
  // not counted against anything: the sleeping ranges may hold more than the device).
  a.set_memory_fraction(1.0);
  a.empty_cache();
  try {
    a.wake({});
  } catch (const OutOfMemory&) {
  }
  a.check_invariants();
  for (const auto& [p, size] : live) a.free(p);  // every pointer is still the caller's
  live.clear();
  a.complete_all_events();
  // (The requires-expression names a PoolId of its own: clang-14 refuses a structured binding
  // there, "reference to local binding declared in enclosing function".)
  for (auto& [id, n] : refs) {
    if constexpr (requires { a.set_use_on_oom(PoolId{0, 1}, false); }) a.set_use_on_oom(id, false);
    for (; n > 0; --n) a.release_pool(id);
  }
  a.empty_cache();  // the sleeping ranges hold no live block now: they go back
  a.wake({});
  a.check_invariants();
  EXPECT_TRUE(a.sleeping().empty());
  EXPECT_EQ(a.sleep_stats().sleeping_bytes.current, 0);
  EXPECT_EQ(a.sleep_stats().sleeping_segments.current, 0);
  EXPECT_EQ(a.sleep_stats().backup_bytes.current, 0);
  a.empty_cache();
  a.check_invariants();
  EXPECT_EQ(a.stats().allocated_bytes[0].current, 0);
  // (A pool PyTorch erases with expandable pages still mapped keeps them for good, §14.8.1.)
  if (!pools_used) {
    EXPECT_EQ(a.stats().reserved_bytes[0].current, 0);
  }
}

TEST(SleepRandom, PytorchCudaMallocSegments) {
  for (std::uint64_t seed = 1; seed <= 20; ++seed) {
    SyntheticSegmentSource source(256 * MiB, 256 * MiB);
    Allocator a(Config{}, source);
    run(a, seed, 400);
  }
}

TEST(SleepRandom, PytorchExpandableSegments) {
  for (std::uint64_t seed = 1; seed <= 20; ++seed) {
    SyntheticSegmentSource source(256 * MiB, 256 * MiB);
    Allocator a(parse_config("expandable_segments:True").config, source);
    run(a, seed, 400);
  }
}

TEST(SleepRandom, Cachet) {
  for (std::uint64_t seed = 1; seed <= 20; ++seed) {
    Config c;
    c.policy = Policy::Cachet;
    SyntheticSegmentSource source(256 * MiB, 256 * MiB);
    CachetPolicy a(c, source);
    run(a, seed, 400);
  }
}

}  // namespace
}  // namespace cachet::model::test

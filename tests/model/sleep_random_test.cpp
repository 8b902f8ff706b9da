// Sleep and wake under random op sequences (fixed seeds), both model policies: every invariant of
// docs/invariants.md, INV-SLEEP-1 to -3 included, holds after every op; no pointer malloc returns
// lies in a sleeping range (malloc's own INV-SLEEP-1 check); every live block keeps its address
// through sleeps and wakes; the sleep stats return to 0 once everything is awake. The exact values
// are in sleep_test.cpp and cachet_policy_sleep_test.cpp; this file looks for states those miss.
#include <gtest/gtest.h>

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
  for (int i = 0; i < ops; ++i) {
    const int op = static_cast<int>(rng() % 100);
    SCOPED_TRACE("seed " + std::to_string(seed) + " op " + std::to_string(i) + " kind " + std::to_string(op));
    if (op < 45) {
      TagScope t(kTags[rng() % kTags.size()]);
      try {
        const auto p = a.malloc(kSizes[rng() % kSizes.size()], rng() % 4 == 0 ? 1 : 0);
        ASSERT_FALSE(live.contains(p));
        live.emplace(p, 0);
      } catch (const OutOfMemory&) {
      }
    } else if (op < 75 && !live.empty()) {
      auto it = live.begin();
      std::advance(it, static_cast<long>(rng() % live.size()));
      if (rng() % 4 == 0) a.record_stream(it->first, 2);
      a.free(it->first);
      live.erase(it);
    } else if (op < 80) {
      a.complete_all_events();
    } else if (op < 88) {
      a.sleep(random_tags(rng), random_tags(rng));
    } else if (op < 96) {
      try {
        a.wake(random_tags(rng));
      } catch (const OutOfMemory&) {
      }
    } else {
      a.empty_cache();
    }
    try {
      a.check_invariants();
    } catch (const std::logic_error& e) {
      FAIL() << "seed " << seed << ", after op " << i << " (kind " << op << "): " << e.what();
    }
  }
  // Everything wakes, if the memory is there once the awake cache is emptied (sleeping memory is
  // not counted against anything: the sleeping ranges may hold more than the device).
  a.empty_cache();
  try {
    a.wake({});
  } catch (const OutOfMemory&) {
  }
  a.check_invariants();
  for (const auto& [p, size] : live) a.free(p);  // every pointer is still the caller's
  live.clear();
  a.complete_all_events();
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
  EXPECT_EQ(a.stats().reserved_bytes[0].current, 0);
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

// Tags (cachet/tags.h), the sleep stats' keys (cachet/stats.h SleepStats) and the summary's
// sleep lines (cachet/summary.h sleep_summary): docs/sleep-wake.md, sections 1 and 5.
#include <gtest/gtest.h>

#include <string>
#include <algorithm>
#include <map>
#include <thread>

#include "cachet/errors.h"
#include "cachet/stats.h"
#include "cachet/summary.h"
#include "cachet/tags.h"

namespace cachet {
namespace {

TEST(Tags, DefaultUntilSetAndPerThread) {
  EXPECT_EQ(current_tag(), "default");
  {
    TagScope weights("weights");
    EXPECT_EQ(current_tag(), "weights");
    {
      TagScope kv("kv_cache");
      EXPECT_EQ(current_tag(), "kv_cache");
    }
    EXPECT_EQ(current_tag(), "weights");
    std::string other;
    std::thread([&] { other = current_tag(); }).join();
    EXPECT_EQ(other, "default");  // thread-local: a new thread starts at "default"
  }
  EXPECT_EQ(current_tag(), "default");
}

TEST(Tags, BadTagsAreRefusedAndChangeNothing) {
  for (const char* bad : {"", "all", "none", "a b", "a,b", "w!", "x/y"}) {
    EXPECT_FALSE(valid_tag(bad)) << bad;
    try {
      set_current_tag(bad);
      ADD_FAILURE() << "no exception for '" << bad << "'";
    } catch (const UsageError& e) {
      EXPECT_EQ(std::string(e.what()).rfind("tag '" + std::string(bad) + "' is not a tag: a tag is 1 to 64", 0), 0u)
          << e.what();
    }
    EXPECT_EQ(current_tag(), "default");
  }
  EXPECT_TRUE(valid_tag(std::string(64, 'a')));
  EXPECT_FALSE(valid_tag(std::string(65, 'a')));
  EXPECT_TRUE(valid_tag("kv-cache.0_x"));
}

TEST(Tags, EmptyListNamesEveryTagOrNone) {
  EXPECT_TRUE(names_tag({}, "weights"));
  EXPECT_TRUE(names_tag({"a", "weights"}, "weights"));
  EXPECT_FALSE(names_tag({"a"}, "weights"));
  EXPECT_FALSE(lists_tag({}, "weights"));
  EXPECT_TRUE(lists_tag({"weights"}, "weights"));
}

TEST(SleepStats, TwentyOneSortedKeys) {
  SleepStats s;
  s.sleeping_bytes.increase(4 * MiB);
  s.sleeping_bytes.decrease(2 * MiB);
  s.num_wakes = 3;
  const auto kv = flatten(s);
  ASSERT_EQ(kv.size(), 21u);
  EXPECT_TRUE(std::is_sorted(kv.begin(), kv.end()));
  EXPECT_EQ(kv.front().first, "sleep.backup_bytes.allocated");
  EXPECT_EQ(kv.back().first, "sleep.sleeping_segments.peak");
  const std::map<std::string, std::int64_t> m(kv.begin(), kv.end());
  EXPECT_EQ(m.at("sleep.sleeping_bytes.current"), 2 * 1048576);
  EXPECT_EQ(m.at("sleep.sleeping_bytes.peak"), 4 * 1048576);
  EXPECT_EQ(m.at("sleep.sleeping_bytes.freed"), 2 * 1048576);
  EXPECT_EQ(m.at("sleep.num_wakes"), 3);
  s.reset_accumulated();
  EXPECT_EQ(s.sleeping_bytes, (Stat{2 * 1048576, 4 * 1048576, 0, 0}));
  EXPECT_EQ(s.num_wakes, 0);
  s.reset_peak();
  EXPECT_EQ(s.sleeping_bytes.peak, 2 * 1048576);
}

TEST(SleepStats, SummaryLinesOnlyAfterASleep) {
  SleepStats s;
  EXPECT_EQ(sleep_summary(s), "");
  s.num_sleeps = 2;
  s.num_wakes = 1;
  s.num_wake_ooms = 1;
  s.sleeping_segments.increase(3);
  s.sleeping_bytes.increase(22 * MiB);
  s.sleeping_allocated_bytes.increase(20 * MiB);
  s.backup_bytes.increase(512 * KiB);
  EXPECT_EQ(sleep_summary(s),
            "Sleeping: 3 segments, 22.00 MiB (20.00 MiB of it allocated); host backups: 512.00 KiB\n"
            "Sleeps: 2, wakes: 1, wakes out of memory: 1\n");
}

}  // namespace
}  // namespace cachet

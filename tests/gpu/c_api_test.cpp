// The C ABI (cachet/cachet.h) over the host backend: statuses, messages, JSON shapes.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "cachet/cachet.h"

namespace {

TEST(CApi, AllocateFreeStatsSnapshot) {
  cachet_allocator* a = cachet_create_host(1ULL << 34, "max_split_size_mb:40");
  ASSERT_NE(a, nullptr) << cachet_last_error();
  void* p = nullptr;
  ASSERT_EQ(cachet_allocate(a, 1000, 0, &p), CACHET_OK);
  ASSERT_NE(p, nullptr);
  char* stats = cachet_stats_json(a);
  ASSERT_NE(stats, nullptr);
  const std::string s = stats;
  cachet_string_free(stats);
  EXPECT_NE(s.find("\"allocated_bytes.all.current\": 1024"), std::string::npos) << s;
  EXPECT_NE(s.find("\"max_split_size\": 41943040"), std::string::npos) << s;
  EXPECT_NE(s.find("\"reserved_bytes.all.current\": 2097152"), std::string::npos) << s;
  char* snap = cachet_snapshot_json(a);
  ASSERT_NE(snap, nullptr);
  const std::string j = snap;
  cachet_string_free(snap);
  EXPECT_NE(j.find("\"segment_type\": \"small\""), std::string::npos) << j;
  EXPECT_NE(j.find("\"state\": \"active_allocated\""), std::string::npos) << j;
  EXPECT_NE(j.find("\"requested_size\": 1000"), std::string::npos) << j;
  EXPECT_NE(j.find("\"size\": 2096128, \"requested_size\": 0, \"state\": \"inactive\""), std::string::npos) << j;
  EXPECT_EQ(cachet_free(a, p), CACHET_OK);
  EXPECT_EQ(cachet_empty_cache(a), CACHET_OK);
  cachet_destroy(a);
}

TEST(CApi, SleepAndWake) {
  cachet_allocator* a = cachet_create_host(1ULL << 30, "cachet_sleep:True");
  ASSERT_NE(a, nullptr) << cachet_last_error();
  ASSERT_EQ(cachet_set_tag("weights"), CACHET_OK);
  void* w = nullptr;
  ASSERT_EQ(cachet_allocate(a, 30 << 20, 0, &w), CACHET_OK);
  ASSERT_EQ(cachet_set_tag("default"), CACHET_OK);
  const char* const backup[] = {"weights"};
  std::uint64_t given = 0;
  ASSERT_EQ(cachet_sleep(a, nullptr, 0, backup, 1, &given), CACHET_OK) << cachet_last_error();
  EXPECT_EQ(given, 30u << 20);
  char* sleeping = cachet_sleeping_json(a);
  ASSERT_NE(sleeping, nullptr);
  EXPECT_STREQ(sleeping, "[\"weights\"]");
  cachet_string_free(sleeping);
  char* snap = cachet_snapshot_json(a);
  ASSERT_NE(snap, nullptr);
  EXPECT_NE(std::string(snap).find("\"is_sleeping\": true, \"backup_size\": 31457280"), std::string::npos) << snap;
  cachet_string_free(snap);
  char* stats = cachet_sleep_stats_json(a);
  ASSERT_NE(stats, nullptr);
  EXPECT_NE(std::string(stats).find("\"sleep.backup_bytes.current\": 31457280"), std::string::npos) << stats;
  cachet_string_free(stats);
  ASSERT_EQ(cachet_wake(a, nullptr, 0), CACHET_OK);
  given = 1;
  EXPECT_EQ(cachet_release_backup_buffers(a, &given), CACHET_OK);  // the host backend keeps none
  EXPECT_EQ(given, 0u);
  EXPECT_EQ(cachet_release_backup_buffers(nullptr, &given), CACHET_ERR_USAGE);
  EXPECT_EQ(cachet_set_tag("not a tag"), CACHET_ERR_USAGE);
  EXPECT_EQ(cachet_free(a, w), CACHET_OK);
  cachet_destroy(a);
  cachet_allocator* b = cachet_create_host(1ULL << 30, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(cachet_wake(b, nullptr, 0), CACHET_ERR_USAGE);
  EXPECT_NE(std::string(cachet_last_error()).find("cachet_sleep:True"), std::string::npos) << cachet_last_error();
  cachet_destroy(b);
}

TEST(CApi, ErrorsAreReportedNotThrown) {
  EXPECT_EQ(cachet_create_host(1ULL << 30, "max_split_size_mb:2"), nullptr);
  EXPECT_NE(std::string(cachet_last_error()).find("max_split_size_mb"), std::string::npos) << cachet_last_error();
  cachet_allocator* a = cachet_create_host(1ULL << 30, nullptr);
  ASSERT_NE(a, nullptr);
  void* p = nullptr;
  EXPECT_EQ(cachet_allocate(a, 2ULL << 30, 0, &p), CACHET_ERR_OUT_OF_MEMORY);
  EXPECT_EQ(std::string(cachet_last_error()).rfind("CUDA out of memory. Tried to allocate 2.00 GiB.", 0), 0u)
      << cachet_last_error();
  EXPECT_EQ(cachet_free(a, reinterpret_cast<void*>(0x1000)), CACHET_ERR_USAGE);
  EXPECT_NE(std::string(cachet_last_error()).find("unknown pointer"), std::string::npos);
  EXPECT_EQ(cachet_set_memory_fraction(a, 3.0), CACHET_ERR_USAGE);
  EXPECT_EQ(cachet_allocate(a, 10, 0, nullptr), CACHET_ERR_USAGE);
  EXPECT_EQ(cachet_free(nullptr, nullptr), CACHET_ERR_USAGE);
  EXPECT_EQ(cachet_allocate(a, 0, 0, &p), CACHET_OK);
  EXPECT_EQ(p, nullptr);
  cachet_destroy(a);
}

TEST(CApi, CudaDeviceWithoutCudaIsAnError) {
  // On a machine without a GPU (or a build without CUDA) this reports instead of aborting.
  cachet_allocator* a = cachet_create(99, nullptr);
  EXPECT_EQ(a, nullptr);
  EXPECT_NE(std::string(cachet_last_error()), "");
}

}  // namespace

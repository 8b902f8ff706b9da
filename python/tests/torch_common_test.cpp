// python/tests/torch_common_test.cpp: the per-device allocators both PyTorch libraries share
// (python/torch_common.h), over host-simulated devices: the sole allocator the c10 backend's
// allocate and free read without a call or a lock is the first one created, and none once a
// second device has one; the private pool of a thread that torch_memory_saver's disable() takes
// over the plug-in.
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "cachet/errors.h"
#include "cachet/gpu/allocator.h"
#include "cachet/gpu/host_backend.h"
#include "cachet/tags.h"
#include "torch_common.h"

namespace tc = cachet::torch_common;

namespace {
cachet::CachingAllocator* host_allocator() {
  return std::make_unique<cachet::CachingAllocator>(cachet::gpu::make_host_memory()).release();  // kept, as the libraries keep theirs
}
}  // namespace

TEST(SoleAllocator, IsTheFirstUntilASecondDeviceHasOne) {
  EXPECT_EQ(tc::sole_allocator().allocator, nullptr);
  EXPECT_EQ(tc::sole_allocator().device, -1);

  cachet::CachingAllocator* first = host_allocator();
  tc::register_allocator(2, first);
  EXPECT_EQ(tc::sole_allocator().allocator, first);
  EXPECT_EQ(tc::sole_allocator().device, 2);
  EXPECT_EQ(tc::existing_allocator(2), first);
  EXPECT_EQ(tc::state().created.load(), 1);

  cachet::CachingAllocator* second = host_allocator();
  tc::register_allocator(5, second);
  EXPECT_EQ(tc::sole_allocator().allocator, nullptr);  // owner() must then ask the pointer's device
  EXPECT_EQ(tc::sole_allocator().device, -1);
  EXPECT_EQ(tc::existing_allocator(2), first);
  EXPECT_EQ(tc::existing_allocator(5), second);
  EXPECT_EQ(tc::state().created.load(), 2);
  EXPECT_EQ(tc::device_count_hint(), 6);
}

// torch_memory_saver's disable() over the plug-in (cachet_torch/memory_saver.py, _own_pool): the
// calling thread's allocations go to a pool of their own, and its end gives back that pool's
// memory only. What pause() put to sleep, a free cached segment included, stays asleep, where
// empty_cache() (the disable() of before) gives the sleeping free segment back for good.
extern "C" int cachet_torch_begin_thread_pool(int device, unsigned long long* id_out);
extern "C" int cachet_torch_end_thread_pool(int device, unsigned long long id);
extern "C" char* cachet_torch_last_error(void);
extern "C" void cachet_torch_string_free(char* p);

TEST(ThreadPool, TakesThisThreadsAllocationsAndGivesBackOnlyThem) {
  constexpr int kDevice = 7;
  constexpr std::int64_t MiB = 1 << 20;
  std::shared_ptr<cachet::gpu::HostSim> sim;
  cachet::gpu::HostOptions o;
  o.capacity = 1 * cachet::GiB;
  cachet::Config c;
  c.sleep = true;
  c.validate = true;
  auto* a = new cachet::CachingAllocator(cachet::gpu::make_host_memory(o, &sim), c);  // kept, as the libraries keep theirs
  tc::register_allocator(kDevice, a);

  void* w = nullptr;
  {
    cachet::TagScope t("tms.weights.cpu");
    w = a->allocate(30 * MiB, 0);
  }
  a->free(a->allocate(40 * MiB, 0));  // a free cached segment ("default")
  EXPECT_EQ(a->sleep({"tms.weights.cpu"}, {"tms.weights.cpu"}), static_cast<cachet::Bytes>(70 * MiB));
  const std::int64_t reserved = a->stats().reserved_bytes[0].current;
  const cachet::SleepStats asleep = a->sleep_stats();
  EXPECT_EQ(asleep.sleeping_segments.current, 2);
  EXPECT_EQ(sim->used(), 0u);

  unsigned long long id = 0;
  ASSERT_EQ(cachet_torch_begin_thread_pool(kDevice, &id), 0);
  EXPECT_EQ(id, 1ULL << 63);
  const cachet::PoolId pool{0, id};
  EXPECT_EQ(a->pool_use_count(pool), 2);  // MemPool() and use_mem_pool, as upstream's disable()
  void* inside = a->allocate(64 * MiB, 0);   // this thread: the pool
  void* other = nullptr;
  std::thread([&] { other = a->allocate(512 * 1024, 0); }).join();  // another thread: the default pool (2 MiB)
  auto pool_of = [&](void* p) {
    const auto at = reinterpret_cast<std::uintptr_t>(p);
    for (const auto& seg : a->snapshot())
      if (seg.address <= at && at < seg.address + seg.total_size) return seg.pool_id;
    return cachet::PoolId{~0ULL, ~0ULL};
  };
  EXPECT_EQ(pool_of(inside), pool);
  EXPECT_TRUE(pool_of(other).is_default());
  EXPECT_EQ(sim->used(), static_cast<cachet::Bytes>(64 * MiB + 2 * MiB));
  a->free(inside);
  ASSERT_EQ(cachet_torch_end_thread_pool(kDevice, id), 0);

  // The pool's 64 MiB went back; the sleeping ranges (weights, and the free cached segment) stay.
  EXPECT_EQ(sim->used(), static_cast<cachet::Bytes>(2 * MiB));
  EXPECT_EQ(a->stats().reserved_bytes[0].current, reserved + 2 * MiB);
  EXPECT_EQ(a->sleep_stats().sleeping_segments.current, 2);
  EXPECT_EQ(a->sleep_stats().sleeping_bytes.current, asleep.sleeping_bytes.current);
  EXPECT_THROW(a->pool_use_count(pool), cachet::UsageError);  // forgotten
  EXPECT_TRUE(a->invariants().empty());

  // A second pool gets the next id; an end without a begin is refused with the reason.
  ASSERT_EQ(cachet_torch_begin_thread_pool(kDevice, &id), 0);
  EXPECT_EQ(id, (1ULL << 63) + 1);
  ASSERT_EQ(cachet_torch_end_thread_pool(kDevice, id), 0);
  EXPECT_EQ(cachet_torch_end_thread_pool(kDevice, id), -1);
  char* err = cachet_torch_last_error();
  EXPECT_NE(std::string(err), "");
  cachet_torch_string_free(err);
  EXPECT_EQ(cachet_torch_end_thread_pool(kDevice + 1, id), -1);  // no allocator there

  // empty_cache() instead (what disable() did before): the sleeping free segment goes for good.
  a->empty_cache();
  EXPECT_EQ(a->sleep_stats().sleeping_segments.current, 1);
  a->wake({});
  a->free(w);
  a->free(other);
}

// release_backup_buffers (docs/sleep-wake.md section 6): the host backend keeps no pinned buffers,
// so every device gives back 0 bytes; a device with no allocator too, and none is created.
extern "C" long long cachet_torch_release_backup_buffers(int device);

TEST(ReleaseBackupBuffers, GivesBackWhatTheBackendsKeepAndCreatesNothing) {
  const int created = tc::state().created.load();
  EXPECT_EQ(cachet_torch_release_backup_buffers(-1), 0);
  EXPECT_EQ(cachet_torch_release_backup_buffers(7), 0);
  EXPECT_EQ(cachet_torch_release_backup_buffers(40), 0);
  EXPECT_EQ(tc::existing_allocator(40), nullptr);
  EXPECT_EQ(tc::state().created.load(), created);
}

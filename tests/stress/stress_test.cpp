// Concurrency stress on the host backend: 8 threads allocate, free, record stream uses and
// empty the cache at once on one allocator; then the invariants hold, the stats equal a
// recount, and every byte comes back. Run under ThreadSanitizer by scripts/test (tsan tree).
#include <gtest/gtest.h>

#include <atomic>
#include <random>
#include <thread>
#include <vector>

#include "cachet/gpu/allocator.h"
#include "cachet/gpu/host_backend.h"

namespace cachet::test {
namespace {

// ThreadSanitizer slows every access ~10x: fewer ops there, the same interleavings.
#if defined(__SANITIZE_THREAD__)
constexpr int kScale = 4;
#else
constexpr int kScale = 1;
#endif

void stress(const Config& config, int ops_per_thread) {
  std::shared_ptr<gpu::HostSim> sim;
  gpu::HostOptions o;
  o.capacity = 64 * GiB;
  CachingAllocator a(gpu::make_host_memory(o, &sim), config);
  constexpr int kThreads = 8;
  std::atomic<std::int64_t> allocated{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(static_cast<std::uint64_t>(t) * 7919 + 1);
      std::vector<void*> live;
      const StreamId own = static_cast<StreamId>(t % 3);
      for (int i = 0; i < ops_per_thread; ++i) {
        const int kind = static_cast<int>(rng() % 100);
        if (kind < 50 || live.empty()) {
          const Bytes size = (rng() % 4 == 0) ? 1 + rng() % (30 * MiB) : 1 + rng() % (256 * KiB);
          void* p = a.allocate(size, own);
          if (p) {
            live.push_back(p);
            allocated.fetch_add(1, std::memory_order_relaxed);
          }
        } else if (kind < 90) {
          const std::size_t j = rng() % live.size();
          a.free(live[j]);
          live[j] = live.back();
          live.pop_back();
        } else if (kind < 97) {
          a.record_stream(live[rng() % live.size()], 10 + rng() % 4);
          sim->complete_events(10 + rng() % 4);
        } else if (kind < 99) {
          a.empty_cache();
        } else {
          (void)a.stats();
          (void)a.snapshot();
        }
      }
      for (void* p : live) a.free(p);
    });
  }
  for (auto& th : threads) th.join();

  EXPECT_EQ(a.invariants(), std::vector<std::string>{});
  DeviceStats s = a.stats();
  EXPECT_EQ(s.allocation[0].current, 0);
  EXPECT_EQ(s.allocated_bytes[0].current, 0);
  EXPECT_EQ(s.allocation[0].allocated, allocated.load());
  sim->complete_all_events();
  a.empty_cache();
  s = a.stats();
  EXPECT_EQ(s.active[0].current, 0);
  EXPECT_EQ(s.reserved_bytes[0].current, 0);
  EXPECT_EQ(s.requested_bytes[0].current, 0);
  EXPECT_EQ(sim->used(), 0u);
  EXPECT_EQ(a.invariants(), std::vector<std::string>{});
}

TEST(Stress, EightThreadsDefault) { stress(Config{}, 20000 / kScale); }

TEST(Stress, EightThreadsExpandable) {
  Config c;
  c.expandable_segments = true;
  stress(c, 10000 / kScale);
}

TEST(Stress, EightThreadsValidateMode) {
  Config c;
  c.validate = true;
  c.max_split_size = 40 * MiB;
  stress(c, 1500 / kScale);
}

}  // namespace
}  // namespace cachet::test

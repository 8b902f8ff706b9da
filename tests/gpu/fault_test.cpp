// Fault injection: every failing device call (allocation, map, event, free) leaves the
// allocator's invariants clean, its stats consistent with its blocks, and loses no block:
// once the faults stop, freeing everything and empty_cache() gives every byte back.
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <tuple>

#include "cachet/errors.h"
#include "cachet/gpu/allocator.h"
#include "cachet/gpu/fault_backend.h"
#include "cachet/gpu/host_backend.h"

namespace cachet::test {
namespace {

struct Rig {
  std::shared_ptr<gpu::HostSim> sim;
  gpu::FaultInjector* faults = nullptr;
  std::unique_ptr<CachingAllocator> a;
};

Rig make_rig(bool expandable, Bytes capacity = 2 * GiB) {
  Rig r;
  gpu::HostOptions o;
  o.capacity = capacity;
  auto inj = std::make_unique<gpu::FaultInjector>(gpu::make_host_memory(o, &r.sim));
  r.faults = inj.get();
  Config c;
  c.expandable_segments = expandable;
  c.max_split_size = 64 * MiB;
  r.a = std::make_unique<CachingAllocator>(std::move(inj), c);
  return r;
}

// A seeded workload of allocations (1 B .. 80 MiB), frees, stream uses and empty_cache.
// Returns the number of device errors seen; checks invariants after every op.
int run_workload(Rig& r, std::uint64_t seed, int ops) {
  std::mt19937_64 rng(seed);
  std::vector<void*> live;
  int errors = 0;
  for (int i = 0; i < ops; ++i) {
    const int kind = static_cast<int>(rng() % 10);
    try {
      if (kind < 5 || live.empty()) {
        const Bytes size = (rng() % 3 == 0) ? 1 + rng() % (80 * MiB) : 1 + rng() % MiB;
        void* p = r.a->allocate(size, rng() % 2);
        if (p) live.push_back(p);
      } else if (kind < 8) {
        const std::size_t j = rng() % live.size();
        r.a->free(live[j]);
        live.erase(live.begin() + static_cast<std::ptrdiff_t>(j));
      } else if (kind < 9) {
        r.a->record_stream(live[rng() % live.size()], 2 + rng() % 2);
        if (rng() % 2) r.sim->complete_all_events();
      } else {
        r.a->empty_cache();
      }
    } catch (const DeviceError&) {
      ++errors;
    } catch (const OutOfMemory&) {
    }
    const auto v = r.a->invariants();
    EXPECT_TRUE(v.empty()) << "op " << i << ": " << v.front();
    if (!v.empty()) return errors;
  }
  // Faults off: everything must come back.
  r.faults->clear();
  for (void* p : live) r.a->free(p);
  r.sim->complete_all_events();
  r.a->empty_cache();
  const auto s = r.a->stats();
  EXPECT_EQ(s.reserved_bytes[0].current, 0);
  EXPECT_EQ(s.active[0].current, 0);
  EXPECT_EQ(r.sim->used(), 0u) << "device memory leaked";
  EXPECT_TRUE(r.a->invariants().empty());
  return errors;
}

class FaultKth : public ::testing::TestWithParam<std::tuple<gpu::CallClass, bool, bool>> {};

TEST_P(FaultKth, EveryFailingCallLeavesStateConsistent) {
  const auto [cls, as_oom, expandable] = GetParam();
  std::uint64_t injected = 0;
  for (std::uint64_t k = 1; k <= 12; ++k) {
    Rig r = make_rig(expandable);
    gpu::FaultPlan plan;
    plan.cls = cls;
    plan.fail_kth = k;
    plan.as_oom = as_oom;
    r.faults->set_plan(plan);
    run_workload(r, 1000 + k, 300);
    injected += r.faults->failures();
    if (::testing::Test::HasFailure()) return;
  }
  EXPECT_GT(injected, 0u) << "the workload never reached the planned call";
}

INSTANTIATE_TEST_SUITE_P(
    Classes, FaultKth,
    ::testing::Combine(::testing::Values(gpu::CallClass::Alloc, gpu::CallClass::Event, gpu::CallClass::Free),
                       ::testing::Bool(), ::testing::Bool()));

TEST(FaultRandom, SeededRandomFailures) {
  for (std::uint64_t seed = 1; seed <= 20; ++seed) {
    for (auto cls : {gpu::CallClass::Alloc, gpu::CallClass::Event, gpu::CallClass::Free}) {
      Rig r = make_rig(seed % 2 == 0);
      gpu::FaultPlan plan;
      plan.cls = cls;
      plan.probability = 0.2;
      plan.seed = seed;
      r.faults->set_plan(plan);
      run_workload(r, seed, 200);
      if (::testing::Test::HasFailure()) return;
    }
  }
}

TEST(FaultSpecific, FailedEventRecordLeavesTheBlockAllocated) {
  Rig r = make_rig(false);
  void* p = r.a->allocate(4096, 0);
  r.a->record_stream(p, 5);
  const DeviceStats before = r.a->stats();
  gpu::FaultPlan plan;
  plan.cls = gpu::CallClass::Event;
  plan.fail_kth = 1;
  r.faults->set_plan(plan);
  EXPECT_THROW(r.a->free(p), DeviceError);
  EXPECT_EQ(r.a->stats(), before);
  r.faults->clear();
  r.a->free(p);  // the block is still there and can be freed
  EXPECT_EQ(r.a->stats().allocated_bytes[0].current, 0);
}

TEST(FaultSpecific, FailedCudaFreeKeepsTheSegmentCached) {
  Rig r = make_rig(false);
  r.a->free(r.a->allocate(4096, 0));
  gpu::FaultPlan plan;
  plan.cls = gpu::CallClass::Free;
  plan.fail_kth = 1;
  r.faults->set_plan(plan);
  EXPECT_THROW(r.a->empty_cache(), DeviceError);
  EXPECT_EQ(r.a->stats().reserved_bytes[0].current, 2097152);
  EXPECT_EQ(r.a->stats().num_device_free, 0);
  r.faults->clear();
  r.a->empty_cache();
  EXPECT_EQ(r.a->stats().reserved_bytes[0].current, 0);
}

TEST(FaultSpecific, CudaMallocOomGoesThroughTheRetryPath) {
  Rig r = make_rig(false);
  gpu::FaultPlan plan;
  plan.cls = gpu::CallClass::Alloc;
  plan.fail_kth = 1;
  plan.as_oom = true;
  r.faults->set_plan(plan);
  void* p = r.a->allocate(4096, 0);  // first cudaMalloc OOMs, the retry after release succeeds
  EXPECT_NE(p, nullptr);
  const auto s = r.a->stats();
  EXPECT_EQ(s.num_alloc_retries, 1);
  EXPECT_EQ(s.num_sync_all_streams, 1);
  EXPECT_EQ(s.num_ooms, 0);
}

}  // namespace
}  // namespace cachet::test

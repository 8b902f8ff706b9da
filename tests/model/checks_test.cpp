// Unusual input (docs/pytorch-allocator.md §1.2, errors.h): size 0, >= 1 EiB, misuse; no-caching
// mode (§4.1, probe nocache.json, §9.22); all 122 counters after PyTorch's init (probe env.json,
// §5.3). § numbers refer to docs/pytorch-allocator.md; probe files are in
// tests/data/probe/probe-torch-2.11-h200.tar.gz.
#include <map>

#include "cachet/errors.h"
#include "harness.h"

namespace cachet::model::test {
namespace {

// The whole observable state, to show that a refused call changed nothing.
struct State {
  DeviceStats stats;
  Snapshot snapshot;
  std::size_t trace_size;
  bool operator==(const State&) const = default;
};
State state(const Allocator& a) { return {a.stats(), a.snapshot(), a.trace().size()}; }

TEST(Checks, SizeZeroReturnsNullAndChangesNothing) {
  Device d;
  d.malloc(1000);
  const State before = state(d.alloc);
  EXPECT_EQ(d.alloc.malloc(0), 0u);
  EXPECT_EQ(state(d.alloc), before);
  d.alloc.free(0);  // freeing null is a no-op
  EXPECT_EQ(state(d.alloc), before);
}

TEST(Checks, OneExbibyteFailsFirstAndChangesNothing) {
  Device d;
  d.malloc(1000);
  const State before = state(d.alloc);
  try {
    d.alloc.malloc(kMaxRequest);
    FAIL() << "no OutOfMemory";
  } catch (const OutOfMemory& e) {
    EXPECT_STREQ(e.what(), "CUDA out of memory. Tried to allocate more than 1EB memory.");
  }
  EXPECT_EQ(state(d.alloc), before);  // not even num_ooms
  EXPECT_EQ(d.alloc.stats().num_ooms, 0);
}

TEST(Checks, MisuseThrowsUsageErrorAndChangesNothing) {
  Device d;
  const auto p = d.malloc(1000);
  const auto q = d.malloc(4 * MiB);
  d.free(q);
  const State before = state(d.alloc);
  EXPECT_THROW(d.alloc.free(0xdeadbeef), UsageError);    // unknown
  EXPECT_THROW(d.alloc.free(p + 512), UsageError);       // interior
  EXPECT_THROW(d.alloc.free(q), UsageError);             // double free
  EXPECT_THROW(d.alloc.record_stream(q, 5), UsageError);  // record_stream on a freed block
  EXPECT_THROW(d.alloc.record_stream(p + 8, 5), UsageError);
  EXPECT_EQ(state(d.alloc), before);
  // Freeing a block that is waiting for its stream-use events is a double free too.
  d.alloc.record_stream(p, 5);
  d.free(p);
  const State pending = state(d.alloc);
  try {
    d.alloc.free(p);
    FAIL() << "no UsageError";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("already freed"), std::string::npos) << e.what();
  }
  EXPECT_EQ(state(d.alloc), pending);
}

TEST(Checks, NoCachingModeKeepsEveryStatAtZero) {
  Config c;
  c.no_caching = true;
  Device d(c);
  const auto a = d.alloc.malloc(1 * MiB);
  const auto b = d.alloc.malloc(1000);
  EXPECT_NE(a, 0u);
  EXPECT_NE(b, 0u);
  EXPECT_EQ(d.source.in_use(), 1 * MiB + 1000);  // raw device allocations of the request size
  d.alloc.free(a);
  d.alloc.free(b);
  d.alloc.empty_cache();
  EXPECT_EQ(d.source.in_use(), 0u);
  for (const auto& [key, value] : flatten(d.alloc.stats()))
    EXPECT_EQ(value, key == "max_split_size" ? -1 : 0) << key;  // nocache.json
  EXPECT_THROW(d.alloc.free(a), UsageError);
  // §9.22: requested_bytes.all.allocated moves by 1,048,576 only when caching.
  Device cached;
  cached.alloc.free(cached.alloc.malloc(1 * MiB));
  EXPECT_EQ(cached.alloc.stats().requested_bytes[0].allocated, 1048576);
}

TEST(Checks, AllCountersAfterTorchInit) {
  // probe env.json stats_after_init: torch.empty(1) (4 bytes), del, empty_cache.
  Device d;
  d.warm_up();
  const std::map<std::string, std::int64_t> nonzero = {
      {"active.all.allocated", 1}, {"active.all.freed", 1}, {"active.all.peak", 1},
      {"active.small_pool.allocated", 1}, {"active.small_pool.freed", 1},
      {"active.small_pool.peak", 1}, {"active_bytes.all.allocated", 512},
      {"active_bytes.all.freed", 512}, {"active_bytes.all.peak", 512},
      {"active_bytes.small_pool.allocated", 512}, {"active_bytes.small_pool.freed", 512},
      {"active_bytes.small_pool.peak", 512}, {"allocated_bytes.all.allocated", 512},
      {"allocated_bytes.all.freed", 512}, {"allocated_bytes.all.peak", 512},
      {"allocated_bytes.small_pool.allocated", 512}, {"allocated_bytes.small_pool.freed", 512},
      {"allocated_bytes.small_pool.peak", 512}, {"allocation.all.allocated", 1},
      {"allocation.all.freed", 1}, {"allocation.all.peak", 1},
      {"allocation.small_pool.allocated", 1}, {"allocation.small_pool.freed", 1},
      {"allocation.small_pool.peak", 1}, {"inactive_split.all.allocated", 1},
      {"inactive_split.all.freed", 1}, {"inactive_split.all.peak", 1},
      {"inactive_split.small_pool.allocated", 1}, {"inactive_split.small_pool.freed", 1},
      {"inactive_split.small_pool.peak", 1}, {"inactive_split_bytes.all.allocated", 2096640},
      {"inactive_split_bytes.all.freed", 2096640}, {"inactive_split_bytes.all.peak", 2096640},
      {"inactive_split_bytes.small_pool.allocated", 2096640},
      {"inactive_split_bytes.small_pool.freed", 2096640},
      {"inactive_split_bytes.small_pool.peak", 2096640}, {"max_split_size", -1},
      {"num_device_alloc", 1}, {"num_device_free", 1}, {"num_sync_all_streams", 1},
      {"requested_bytes.all.allocated", 4}, {"requested_bytes.all.freed", 4},
      {"requested_bytes.all.peak", 4}, {"requested_bytes.small_pool.allocated", 4},
      {"requested_bytes.small_pool.freed", 4}, {"requested_bytes.small_pool.peak", 4},
      {"reserved_bytes.all.allocated", 2097152}, {"reserved_bytes.all.freed", 2097152},
      {"reserved_bytes.all.peak", 2097152}, {"reserved_bytes.small_pool.allocated", 2097152},
      {"reserved_bytes.small_pool.freed", 2097152}, {"reserved_bytes.small_pool.peak", 2097152},
      {"segment.all.allocated", 1}, {"segment.all.freed", 1}, {"segment.all.peak", 1},
      {"segment.small_pool.allocated", 1}, {"segment.small_pool.freed", 1},
      {"segment.small_pool.peak", 1}};
  const auto flat = flatten(d.alloc.stats());
  EXPECT_EQ(flat.size(), 122u);
  for (const auto& [key, value] : flat) {
    const auto it = nonzero.find(key);
    EXPECT_EQ(value, it == nonzero.end() ? 0 : it->second) << key;
  }
}

TEST(Checks, TraceOfAPendingFreeP15) {
  // snapshot.json's order: alloc, free_requested ... free_completed at the next malloc.
  Device d;
  const auto b = d.malloc(3 * MiB);
  d.alloc.record_stream(b, 9);
  d.free(b);
  d.alloc.complete_events(9);
  d.malloc(512);
  std::vector<TraceAction> actions;
  for (const auto& t : d.alloc.trace()) actions.push_back(t.action);
  EXPECT_EQ(actions, (std::vector<TraceAction>{TraceAction::SegmentAlloc, TraceAction::Alloc,
                                               TraceAction::FreeRequested, TraceAction::FreeCompleted,
                                               TraceAction::SegmentAlloc, TraceAction::Alloc}));
  EXPECT_EQ(d.alloc.trace()[3], (TraceEvent{TraceAction::FreeCompleted, b, 3 * MiB, 0, 0}));
}

}  // namespace
}  // namespace cachet::model::test

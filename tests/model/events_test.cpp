// record_stream, pending frees and simulated events (docs/pytorch-allocator.md §6). Values: probe
// P6 (record_stream.json), PyTorch's test_record_stream / test_caching_allocator_record_stream_oom
// (§9.7, §9.9). § numbers refer to docs/pytorch-allocator.md.
#include "cachet/errors.h"
#include "harness.h"

namespace cachet::model::test {
namespace {

constexpr StreamId s1 = 1001;
constexpr StreamId s2 = 1002;

TEST(Events, RecordStreamPendingFreeP6) {
  Device d;
  d.warm_up();
  const auto x = d.malloc(4 * MiB);
  EXPECT_PROBE(d.alloc, 4194304, 20971520, 4194304, 16777216, 1, 1, 4194304, 0, 0, 1, 2, 1, 0, 0);
  d.alloc.record_stream(x, s1);
  d.free(x);  // allocated drops now; active and requested wait for the event
  EXPECT_PROBE(d.alloc, 0, 20971520, 4194304, 16777216, 1, 1, 4194304, 0, 0, 1, 2, 1, 0, 0);
  EXPECT_EQ(d.blocks(0), (Blocks{{4194304, 4194304, P}, {16777216, 0, I}}));
  const auto y = d.malloc(4 * MiB);  // event not complete: x is not reused
  EXPECT_NE(y, x);
  EXPECT_PROBE(d.alloc, 4194304, 20971520, 8388608, 12582912, 1, 1, 8388608, 0, 0, 1, 2, 1, 0, 0);
  d.alloc.complete_all_events();  // torch.cuda.synchronize()
  d.malloc(512);                  // process_events frees x
  EXPECT_PROBE(d.alloc, 4194816, 23068672, 4194816, 18873856, 3, 2, 4194816, 0, 0, 1, 3, 1, 0, 0);
  EXPECT_EQ(d.blocks(0), (Blocks{{4194304, 4194304, I}, {4194304, 4194304, A}, {12582912, 0, I}}));
  const auto w = d.malloc(4 * MiB);
  EXPECT_EQ(w, x);
  EXPECT_PROBE(d.alloc, 8389120, 23068672, 8389120, 14679552, 2, 2, 8389120, 0, 0, 1, 3, 1, 0, 0);
  const auto v = d.malloc(512);
  d.alloc.record_stream(v, s1);
  d.free(v);
  d.alloc.empty_cache();  // synchronize_and_free_events completes v; nothing to release
  EXPECT_PROBE(d.alloc, 8389120, 23068672, 8389120, 14679552, 2, 2, 8389120, 0, 0, 2, 3, 1, 0, 0);
}

TEST(Events, EveryStreamUseMustComplete) {
  Device d;
  const auto x = d.malloc(4 * MiB);
  d.alloc.record_stream(x, s1);
  d.alloc.record_stream(x, s2);
  d.free(x);
  d.alloc.complete_events(s1);
  d.malloc(512);  // s2's event is still pending
  EXPECT_EQ(std::get<2>(d.blocks(0)[0]), P);
  d.alloc.complete_events(s2);
  d.malloc(512);
  EXPECT_EQ(std::get<2>(d.blocks(0)[0]), I);
  EXPECT_EQ(d.alloc.stats().num_sync_all_streams, 0);  // process_events never syncs
}

TEST(Events, EventsRecordedAfterCompletionArePending) {
  Device d;
  const auto x = d.malloc(4 * MiB);
  d.alloc.complete_events(s1);  // nothing recorded yet: completes nothing later
  d.alloc.record_stream(x, s1);
  d.free(x);
  d.malloc(512);
  EXPECT_EQ(std::get<2>(d.blocks(0)[0]), P);
}

TEST(Events, UseOnTheAllocatingStreamNeedsNoEvent) {
  Device d;
  const auto x = d.malloc(4 * MiB, s1);
  d.alloc.record_stream(x, s1);
  d.free(x);
  EXPECT_EQ(d.blocks(0), (Blocks{{20971520, 4194304, I}}));
  EXPECT_EQ(d.alloc.stats().active[0].current, 0);
}

TEST(Events, PendingBlocksDoNotMerge) {
  Device d;
  const auto a = d.malloc(1000);
  const auto b = d.malloc(1000);
  d.alloc.record_stream(a, s1);
  d.free(a);
  d.free(b);  // b merges with the remainder only: a is pending
  EXPECT_EQ(d.blocks(0), (Blocks{{1024, 1000, P}, {2096128, 1000, I}}));
  d.alloc.complete_events(s1);
  d.malloc(4 * MiB);  // a large malloc still runs process_events for every pool
  EXPECT_EQ(d.blocks(0), (Blocks{{2097152, 1000, I}}));
}

// §9.9: 100 x (160 MB + record_stream + free) on a device that holds a few: the final retry's
// synchronize_and_free_events reclaims the pending blocks, so nothing OOMs.
TEST(Events, RecordStreamOomIsAvoidedByTheRetrySync) {
  Device d(Config{}, 1 * GiB);
  for (int i = 0; i < 100; ++i) {
    const auto p = d.malloc(160'000'000);
    d.alloc.record_stream(p, s1);
    d.free(p);
  }
  EXPECT_EQ(d.alloc.stats().num_ooms, 0);
  EXPECT_GT(d.alloc.stats().num_alloc_retries, 0);
}

}  // namespace
}  // namespace cachet::model::test

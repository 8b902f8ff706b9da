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

// PyTorch walks its cuda_events hash map keyed by cudaStream_t: the streams of one process_events
// come in the hash order of their handles (§14.10.3); a replay gives it (set_event_stream_order).
// a (stream 1) used on stream 5 and b (stream 2) used on stream 4: one event each, both complete
// when the next malloc walks the queues. By stream id, stream 4's queue first: b's free completes
// before a's; stream 5 given first, a's before b's. Bad orders change nothing.
TEST(Events, StreamsWalkedInTheOrderGiven) {
  for (const bool given : {false, true}) {
    SCOPED_TRACE(given ? "stream 5 given first" : "by stream id");
    Device d;
    const auto a = d.malloc(512, 1);
    const auto b = d.malloc(512, 2);
    d.alloc.record_stream(a, 5);
    d.alloc.record_stream(b, 4);
    d.free(a);
    d.free(b);
    using Queues = std::vector<std::pair<StreamId, std::vector<std::uint64_t>>>;
    EXPECT_EQ(d.alloc.event_queues(), (Queues{{4, {b}}, {5, {a}}}));
    try {
      d.alloc.set_event_stream_order({5, 3});
      ADD_FAILURE() << "a stream with no pending events was accepted";
    } catch (const UsageError& e) {
      EXPECT_EQ(std::string(e.what()),
                "set_event_stream_order: stream 3 has no pending events (event_queues() lists the streams that have; "
                "docs/pytorch-allocator.md §14.10.3)");
    }
    try {
      d.alloc.set_event_stream_order({5, 5});
      ADD_FAILURE() << "a stream named twice was accepted";
    } catch (const UsageError& e) {
      EXPECT_EQ(std::string(e.what()), "set_event_stream_order: stream 5 is named twice; name each stream once");
    }
    d.alloc.set_event_stream_order({});  // nothing changes
    EXPECT_EQ(d.alloc.event_queues(), (Queues{{4, {b}}, {5, {a}}}));
    if (given) {
      d.alloc.set_event_stream_order({5});  // stream 5 first, the rest (4) as it was
      EXPECT_EQ(d.alloc.event_queues(), (Queues{{5, {a}}, {4, {b}}}));
    }
    d.alloc.complete_events(4);
    d.alloc.complete_events(5);
    const std::size_t rows = d.alloc.trace().size();
    d.malloc(512, 1);  // process_events: both queues; then a's block again
    d.alloc.check_invariants();
    EXPECT_TRUE(d.alloc.event_queues().empty());
    const std::vector<TraceEvent> t(d.alloc.trace().begin() + static_cast<std::ptrdiff_t>(rows), d.alloc.trace().end());
    ASSERT_EQ(t.size(), 3u);  // two free_completed, alloc
    const TraceEvent ra{TraceAction::FreeCompleted, a, 512, 1, 0}, rb{TraceAction::FreeCompleted, b, 512, 2, 0};
    EXPECT_EQ(t[0], given ? ra : rb);
    EXPECT_EQ(t[1], given ? rb : ra);
    EXPECT_EQ(t[2], (TraceEvent{TraceAction::Alloc, a, 512, 1, 0}));
  }
}

}  // namespace
}  // namespace cachet::model::test

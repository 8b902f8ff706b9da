// The lockstep harness: agreement on a small sequence, and a planted
// disagreement it must report.
#include <gtest/gtest.h>

#include <tuple>

#include "cachet/lockstep.h"
#include "cachet/model/memory_cap.h"

namespace cachet::lockstep {
namespace {

TEST(Lockstep, AgreesOnASmallSequence) {
  Options o;
  o.capacity = 1 * GiB;
  PytorchLockstep ls(o);
  const auto ops = parse_ops(R"(alloc 1000 s0
alloc 3000000 s1
record h0 s2
free h0
alloc 600000000 s0
alloc 600000000 s0
complete s2
alloc 100 s0
free h1
free h1
free h9
fraction 0.5
empty_cache
)");
  EXPECT_EQ(ls.run(ops), std::nullopt);
  EXPECT_EQ(ls.handle_count(), 4u);
  EXPECT_FALSE(ls.live(1));
  EXPECT_GE(ls.model().stats().num_ooms, 1);
}

// Sleep and wake on both sides (docs/sleep-wake.md section 8): policy:pytorch with cachet_sleep and
// cudaMalloc-style segments; the same pointers, bytes given back, stats, snapshots (sleeping
// segments marked) and trace events.
TEST(Lockstep, AgreesOnSleepAndWake) {
  Options o;
  o.capacity = 256 * MiB;
  o.config.sleep = true;
  PytorchLockstep ls(o);
  const auto ops = parse_ops(R"(tag weights
alloc 4194304 s0
alloc 4194304 s0
tag kv_cache
alloc 8388608 s0
tag default
sleep tags weights,kv_cache backup weights
alloc 8388608 s0
free h1
free h1
sleep tags all backup none
tag weights
alloc 4194304 s0
alloc 220000000 s0
wake tags all
free h5
empty_cache
wake tags weights
tag kv_cache
alloc 12582912 s0
wake tags all
)");
  EXPECT_EQ(ls.run(ops), std::nullopt);
  EXPECT_EQ(ls.sut().sleep_stats().num_sleeps, 2);
  EXPECT_EQ(ls.sut().sleep_stats().num_wake_ooms, 1);
  EXPECT_EQ(ls.sut().sleep_stats().num_wakes, 2);
  EXPECT_EQ(ls.sut().sleep_stats().num_frees_while_asleep, 1);
  EXPECT_EQ(ls.sut().sleep_stats().sleeping_bytes.peak, 60 * 1048576);
  EXPECT_TRUE(ls.sut().sleeping().empty());
}

// The same over expandable segments (a run of mapped pages sleeps as one range; a segment with no
// live block is any tag's, SLEEP-R1; growth never maps next to a sleeping run).
TEST(Lockstep, AgreesOnSleepAndWakeOverExpandableSegments) {
  Options o;
  o.capacity = 256 * MiB;
  o.config.sleep = true;
  o.config.expandable_segments = true;
  PytorchLockstep ls(o);
  const auto ops = parse_ops(R"(tag weights
alloc 4194304 s0
alloc 4194304 s0
tag kv_cache
alloc 8388608 s0
alloc 1 s0
free h3
tag default
sleep tags weights backup weights
alloc 1 s0
alloc 8388608 s0
free h1
sleep tags all backup none
tag weights
alloc 4194304 s0
wake tags weights
free h5
empty_cache
tag kv_cache
alloc 1 s0
wake tags all
)");
  EXPECT_EQ(ls.run(ops), std::nullopt);
  EXPECT_EQ(ls.sut().sleep_stats().num_sleeps, 2);
  EXPECT_EQ(ls.sut().sleep_stats().num_wakes, 2);
  EXPECT_EQ(ls.sut().sleep_stats().num_frees_while_asleep, 2);  // h1 (weights) and h5 (slept by "all")
  EXPECT_TRUE(ls.sut().sleeping().empty());
}

// policy:cachet (docs/sleep-wake.md section 2-4): pages are tag-homogeneous, a subset of tags sleeps
// and wakes by the 2 MiB page (with the free pages), frees while asleep, empty_cache gives back
// sleeping pages with no live block; both sides agree on every pointer, stat, snapshot and trace
// event, and the weights' backup is back after each wake.
TEST(Lockstep, AgreesOnSleepAndWakeOfSubsetsUnderPolicyCachet) {
  Options o;
  o.capacity = 256 * MiB;
  o.config = parse_config("policy:cachet,cachet_sleep:True").config;
  CachetLockstep ls(o);
  const auto ops = parse_ops(R"(tag weights
alloc 1048576 s0
tag kv_cache
alloc 524288 s0
tag default
alloc 4194304 s0
alloc 1048576 s1
sleep tags weights backup weights
alloc 524288 s0
free h0
sleep tags kv_cache backup none
wake tags weights
tag weights
alloc 1048576 s0
alloc 1048576 s0
wake tags all
free h1
free h2
sleep tags weights backup weights,kv_cache
empty_cache
wake tags kv_cache
tag kv_cache
alloc 3145728 s0
sleep tags all backup kv_cache
empty_cache
wake tags default
wake tags all
)");
  EXPECT_EQ(ls.run(ops), std::nullopt);
  const SleepStats s = ls.sut().sleep_stats();
  EXPECT_EQ(s.num_sleeps, 4);
  EXPECT_EQ(s.num_wakes, 5);
  EXPECT_EQ(s.num_wake_ooms, 0);
  EXPECT_EQ(s.num_frees_while_asleep, 1);
  EXPECT_EQ(s.sleeping_bytes.current, 0);
  EXPECT_TRUE(ls.sut().sleeping().empty());
}

// Where the configuration has no cachet_sleep, the ops are Unsupported on both sides and nothing
// is applied (expandable segments on or off).
TEST(Lockstep, SleepOpsAreUnsupportedWithoutCachetSleep) {
  for (bool expandable : {false, true}) {
    Options o;
    o.config.sleep = false;
    o.config.expandable_segments = expandable;
    PytorchLockstep ls(o);
    auto d = ls.apply(*parse_op("sleep tags all backup none"));
    ASSERT_TRUE(d.has_value());
    EXPECT_NE(d->find("not supported by this pair"), std::string::npos) << *d;
    EXPECT_EQ(ls.last_sut().kind, Outcome::Kind::Unsupported);
    EXPECT_EQ(ls.sut().sleep_stats().num_sleeps, 0);
  }
}

TEST(Lockstep, ReportsADisagreement) {
  PytorchLockstep ls(Options{});
  ASSERT_EQ(ls.apply(Allocate{1000, 0, {}}), std::nullopt);
  ls.model().malloc(512, 0);  // behind the runner's back: the stats now differ
  auto d = ls.apply(Allocate{1000, 0, {}});
  ASSERT_TRUE(d.has_value());
  EXPECT_NE(d->find("differ"), std::string::npos) << *d;
}

TEST(Lockstep, ComparesTraceEventsInOrder) {
  PytorchLockstep ls(Options{});
  ASSERT_EQ(ls.apply(Allocate{1000, 0, {}}), std::nullopt);
  // The sut's trace is on, and holds only the last op's events (segment_alloc, alloc) and the
  // snapshot event of the comparison's memory_snapshot().
  const auto t = ls.sut().trace();
  ASSERT_EQ(t.size(), 3u);
  EXPECT_EQ(t[2].action, TraceAction::Snapshot);
  EXPECT_EQ(t[0].action, TraceAction::SegmentAlloc);
  EXPECT_EQ(t[1].action, TraceAction::Alloc);
  // Behind the runner's back the model sees a stream use: its free waits for an event (one
  // event), the sut's completes at once (two): no result or device call differs, the trace does.
  ls.model().record_stream(ls.address(0), 1);
  auto d = ls.apply(Free{0});
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->rfind("trace events differ at event #1 of this op (model 1 events, sut 2)", 0), 0u) << *d;
  EXPECT_NE(d->find("model: (no more events)"), std::string::npos) << *d;
  EXPECT_NE(d->find("sut:   free_completed addr 0x"), std::string::npos) << *d;
}

// Project issue 23: props_gpu_test's failure on an H100, replayed on the host backend. A block
// used on stream 0 is freed during a capture (deferred, §14.7); the next malloc's process_events
// records its event and queries it in the same call. Where events complete when recorded (a real
// device running no kernels) the block is free before the search: the 1 MiB + 1 B request splits
// its start. Where they wait for a complete op, a new page is mapped after it.
constexpr const char* kDeferredCase = R"(alloc 1073741824 s1
record h0 s0
capture_begin g1 s1 pool new
free h0
capture_end g1
alloc 1048577 s1
)";

Options deferred_case_options(bool when_recorded, const char* policy = "") {
  Options o;
  o.config = parse_config(std::string("expandable_segments:True,max_non_split_rounding_mb:22,"
                                      "garbage_collection_threshold:0.3") + policy).config;
  o.events_complete_immediately = when_recorded;
  return o;
}

TEST(Lockstep, DeferredFreeEventsCompleteWhenRecorded) {
  PytorchLockstep ls(deferred_case_options(true));
  EXPECT_EQ(ls.run(parse_ops(kDeferredCase)), std::nullopt);
  EXPECT_EQ(ls.address(0), 0x8f0000000000u);  // the expandable segment's base
  EXPECT_EQ(ls.last_sut().ptr, 0x8f0000000000u);
  EXPECT_EQ(ls.last_model().ptr, 0x8f0000000000u);
  // 52 pages of 20 MiB for the 1 GiB block, none more; 2 MiB for the generator's seed and offset
  // (512 B each, a small segment on stream 1, §14.9).
  EXPECT_EQ(ls.sut().stats().reserved_bytes[0].current, 52 * 20971520 + 2097152);
  EXPECT_EQ(ls.sut().stats().active_bytes[0].current, 1049088 + 1024);  // the 1 GiB block is free
}

TEST(Lockstep, DeferredFreeEventsWaitForACompleteOp) {
  PytorchLockstep ls(deferred_case_options(false));
  EXPECT_EQ(ls.run(parse_ops(kDeferredCase)), std::nullopt);
  EXPECT_EQ(ls.last_sut().ptr, 0x8f0040000000u);  // 1 GiB on, in the 52nd page's free tail
  EXPECT_EQ(ls.sut().stats().reserved_bytes[0].current, 52 * 20971520 + 2097152);
  EXPECT_EQ(ls.sut().stats().active_bytes[0].current, 1073741824 + 1049088 + 1024);  // the block waits
}

// The bug put back: the model not told that events complete when recorded (the lockstep once
// completed its events only after each op) disagrees with the device as on the H100.
TEST(Lockstep, DeferredFreeEventsBugPutBack) {
  PytorchLockstep ls(deferred_case_options(true));
  ls.model().set_events_complete_when_recorded(false);
  const auto d = ls.run(parse_ops(kDeferredCase));
  ASSERT_TRUE(d.has_value());
  EXPECT_NE(d->find("op #5 alloc 1048577 s1"), std::string::npos) << *d;
  EXPECT_NE(d->find("model: pointer 0x8f0040000000"), std::string::npos) << *d;
  EXPECT_NE(d->find("sut:   pointer 0x8f0000000000"), std::string::npos) << *d;
}

// policy:cachet: its deferred frees (R12) get their events at the same point.
TEST(Lockstep, CachetDeferredFreeEventsCompleteWhenRecorded) {
  CachetLockstep ls(deferred_case_options(true, ",policy:cachet"));
  EXPECT_EQ(ls.run(parse_ops(kDeferredCase)), std::nullopt);
  // The 1 GiB block is free again (active: the request and the generator's two 512 B tensors);
  // R2's best fit takes a smaller free run in the last mapped 2 MiB page.
  EXPECT_EQ(ls.sut().stats().active_bytes[0].current, 1049088 + 1024);
  EXPECT_EQ(ls.last_sut().ptr, 0x8f0040000200u);
  EXPECT_EQ(ls.sut().stats().reserved_bytes[0].current, 1073741824 + 2097152);
  CachetLockstep bug(deferred_case_options(true, ",policy:cachet"));
  bug.model().set_events_complete_when_recorded(false);
  const auto d = bug.run(parse_ops(kDeferredCase));
  ASSERT_TRUE(d.has_value());
  EXPECT_NE(d->find("op #5 alloc 1048577 s1"), std::string::npos) << *d;
}

// Ids addressing (recordings): an id is bound only when its allocation returns memory, so a
// free of an OOMed id is skipped and later ids still name the right blocks.
TEST(Lockstep, IdsAddressing) {
  Options o;
  o.capacity = 1 * GiB;
  PytorchLockstep ls(o);
  const auto ops = parse_ops(R"(alloc h10 1000 s0
alloc h11 2000000000 s0
alloc h12 3000 s0
free h11
free h10
record h12 s1
)");
  EXPECT_EQ(ls.run(ops), std::nullopt);
  EXPECT_EQ(ls.handle_count(), 2u);
  EXPECT_FALSE(ls.live(10));
  EXPECT_FALSE(ls.live(11));
  EXPECT_TRUE(ls.live(12));
  EXPECT_EQ(ls.live_handles(), std::vector<Handle>{12});
  EXPECT_EQ(ls.requested(12), 3000u);
}

// Pool and capture ops run on both sides through the one front end; exact values from
// docs/pytorch-allocator.md §14 (ids §14.1, routing §14.2, use counts §14.4, the generator's
// tensors §14.9).
TEST(Lockstep, PoolAndCaptureOpsRunOnBothSides) {
  PytorchLockstep ls(Options{});
  auto segments_of = [&](PoolId id) {
    std::vector<std::pair<Bytes, StreamId>> r;
    for (const auto& s : ls.sut().snapshot())
      if (s.pool_id == id) r.emplace_back(s.total_size, s.stream);
    return r;
  };
  using Segs = std::vector<std::pair<Bytes, StreamId>>;
  ASSERT_EQ(ls.run(parse_ops("use_pool p0\nalloc 1000 s0\nalloc 3000000 s1\n")), std::nullopt);
  // MemPool 0 is {0, 1}; use_mem_pool takes both streams: a 2 MiB small segment on stream 0 and a
  // 20 MiB large one on stream 1, both in the pool.
  EXPECT_EQ(segments_of(PoolId{0, 1}), (Segs{{2 * MiB, 0}, {20 * MiB, 1}}));
  EXPECT_EQ(ls.sut().pool_use_count(PoolId{0, 1}), 2);  // the MemPool and its use_mem_pool
  EXPECT_EQ(ls.model().pool_use_count(PoolId{0, 1}), 2);
  ASSERT_EQ(ls.run(parse_ops("end_pool p0\nalloc 1000 s0\nrelease_pool p0\n")), std::nullopt);
  EXPECT_EQ(segments_of(PoolId{}), (Segs{{2 * MiB, 0}}));  // h2: the default pool again
  EXPECT_EQ(segments_of(PoolId{0, 1}).size(), 2u);  // released, but h0 and h1 are live
  // A capture on stream 1: the generator's seed and offset (8 B each) in a default segment on
  // stream 1, then the graph's pool {1, 0} takes stream 1 only.
  ASSERT_EQ(ls.run(parse_ops("capture_begin g0 s1 pool new\nalloc 5000 s1\nalloc 5000 s2\n")), std::nullopt);
  EXPECT_EQ(segments_of(PoolId{1, 0}), (Segs{{2 * MiB, 1}}));
  EXPECT_EQ(segments_of(PoolId{}), (Segs{{2 * MiB, 0}, {2 * MiB, 1}, {2 * MiB, 2}}));
  // 1000 -> 1024, 3000000 -> 3000320 (512-byte multiples), 1024, seed and offset 512 each, 5120 twice.
  EXPECT_EQ(ls.sut().stats().allocated_bytes[0].current, 1024 + 3000320 + 1024 + 2 * 512 + 5120 + 5120);
  ASSERT_EQ(ls.run(parse_ops("capture_end g0\nfree h0\nfree h1\nfree h3\ngraph_reset g0\nempty_cache\n")),
            std::nullopt);
  // Every private segment went back: pool {0, 1} at its blocks' frees and the empty_cache, the
  // graph's pool at the empty_cache after its reset; only h2 and h4 hold default segments.
  for (const auto& seg : ls.sut().snapshot()) EXPECT_TRUE(seg.pool_id.is_default());
  EXPECT_EQ(segments_of(PoolId{}), (Segs{{2 * MiB, 0}, {2 * MiB, 2}}));
}

// wait_stream and kernel on both sides (docs/pytorch-allocator.md §14.10.1): PyTorch's
// test_graph_capture_reclaim_2_streams as ops (tests/gpu/capture_reuse_test.cpp has it on gpu/
// alone). With graph_capture_record_stream_reuse:True, h4 takes h1's block during the capture
// once stream 1 waited on stream 2's kernel; without it, h1 waits for the end of the capture. A
// capturing stream waiting on a stream outside every capture is refused on both sides.
TEST(Lockstep, WaitStreamAndKernelRunOnBothSides) {
  const char* ops = "capture_begin g0 s1 pool new\nalloc 32 s1\nalloc 32 s1\nwait_stream s2 s1\nalloc 32 s2\n"
                    "kernel s2\nrecord h1 s2\nfree h1\nalloc 32 s1\nwait_stream s1 s2\nkernel s1\nalloc 32 s1\n";
  for (const bool reuse : {true, false}) {
    SCOPED_TRACE(reuse ? "reuse" : "no reuse");
    Options o;
    o.config = parse_config(reuse ? "graph_capture_record_stream_reuse:True" : "").config;
    PytorchLockstep ls(o);
    ASSERT_TRUE(ls.runs_stream_ops());
    ASSERT_EQ(ls.run(parse_ops(ops)), std::nullopt);
    // The handles' addresses (the generator's seed and offset are in a default segment).
    std::vector<std::uint64_t> ptrs;
    for (Handle h = 0; h < ls.handle_count(); ++h) ptrs.push_back(ls.address(h));
    ASSERT_EQ(ptrs.size(), 5u);
    EXPECT_EQ(ptrs[1] - ptrs[0], 512u);
    EXPECT_EQ(ptrs[3] - ptrs[0], 1024u);  // stream 1 not yet ordered after stream 2's kernel
    // The last op's trace events (the lockstep keeps each op's only; the snapshot events of its
    // checks, where they built the sut's snapshot and not only its digest, left out): under
    // reuse the free of h1 completed, then the allocation.
    std::vector<TraceAction> last;
    for (const TraceEvent& e : ls.sut().trace())
      if (e.action != TraceAction::Snapshot) last.push_back(e.action);
    if (reuse) {
      EXPECT_EQ(last, (std::vector<TraceAction>{TraceAction::FreeCompleted, TraceAction::Alloc}));
      EXPECT_EQ(ptrs[4], ptrs[1]);  // h1's block, reused during the capture
    } else {
      EXPECT_EQ(last, (std::vector<TraceAction>{TraceAction::Alloc}));
      EXPECT_EQ(ptrs[4] - ptrs[0], 1536u);
    }
  }
  PytorchLockstep ls(Options{});
  ASSERT_EQ(ls.run(parse_ops("capture_begin g0 s1 pool new\n")), std::nullopt);
  EXPECT_EQ(ls.apply(*parse_op("wait_stream s1 s3")), std::nullopt);  // refused alike
  EXPECT_EQ(ls.last_sut().kind, Outcome::Kind::UsageError);
  EXPECT_EQ(ls.last_model().kind, Outcome::Kind::UsageError);
  // Under policy:cachet the pair has no capture graph: not applied.
  Options c;
  c.config = parse_config("policy:cachet").config;
  CachetLockstep cl(c);
  EXPECT_FALSE(cl.runs_stream_ops());
  EXPECT_NE(cl.apply(*parse_op("kernel s1")), std::nullopt);
  EXPECT_EQ(cl.last_sut().kind, Outcome::Kind::Unsupported);
}

// The thread filter (docs/pytorch-allocator.md §14.10.2): use_mem_pool takes only the allocations
// of the thread that entered it, whatever the stream, even when another pool is newer; other
// threads' allocations go to their own pools or the default ones. The sut's calls of thread k run
// on an OS thread of their own.
TEST(Lockstep, UseMemPoolTakesOnlyItsThreadsAllocations) {
  PytorchLockstep ls(Options{});
  auto segments_of = [&](PoolId id) {
    std::vector<std::pair<Bytes, StreamId>> r;
    for (const auto& s : ls.sut().snapshot())
      if (s.pool_id == id) r.emplace_back(s.total_size, s.stream);
    return r;
  };
  using Segs = std::vector<std::pair<Bytes, StreamId>>;
  ASSERT_EQ(ls.run(parse_ops("use_pool p0 t1\nalloc 1000 s0 t1\nalloc 1000 s0\nalloc 1000 s1 t2\n"
                             "use_pool p1\nalloc 3000000 s0 t1\nalloc 3000000 s1\nend_pool p1\nend_pool p0\n")),
            std::nullopt);
  // MemPool 0 ({0, 1}, thread 1): h0 (small) and h3 (large, though MemPool 1 is newer).
  EXPECT_EQ(segments_of(PoolId{0, 1}), (Segs{{2 * MiB, 0}, {20 * MiB, 0}}));
  // MemPool 1 ({0, 2}, thread 0): h4 only.
  EXPECT_EQ(segments_of(PoolId{0, 2}), (Segs{{20 * MiB, 1}}));
  // Default pools: h1 (thread 0 before MemPool 1) and h2 (thread 2, in no pool).
  EXPECT_EQ(segments_of(PoolId{}), (Segs{{2 * MiB, 0}, {2 * MiB, 1}}));
  // The same in a case file, for both policies' pairs.
  CachetLockstep cachet(Options{parse_config("policy:cachet").config});
  EXPECT_EQ(cachet.run(parse_ops("use_pool p0 t1\nalloc 1000 s0 t1\nalloc 1000 s0\nend_pool p0\n")), std::nullopt);
  auto pool_at = [&](std::uint64_t addr) {
    for (const auto& seg : cachet.sut().snapshot())
      if (addr >= seg.address && addr < seg.address + seg.total_size) return seg.pool_id;
    return PoolId{9, 9};
  };
  EXPECT_EQ(pool_at(cachet.address(0)), (PoolId{0, 1}));  // thread 1's MemPool
  EXPECT_EQ(pool_at(cachet.address(1)), PoolId{});        // thread 0: the default pool
}

// What the front end refuses (no allocator call) and what the allocator refuses (a pool shared
// by a capture while another capture allocates to it): a UsageError on both sides.
TEST(Lockstep, RefusedPoolOpsAreUsageErrorsOnBothSides) {
  PytorchLockstep ls(Options{});
  for (const char* line : {"end_pool p0", "release_pool p3", "capture_end g0", "graph_reset g1",
                           "capture_begin g0 s0 pool new"}) {
    EXPECT_EQ(ls.apply(*parse_op(line)), std::nullopt) << line;
    EXPECT_EQ(ls.last_sut().kind, Outcome::Kind::UsageError) << line;
    EXPECT_EQ(ls.last_model().kind, Outcome::Kind::UsageError) << line;
  }
  ASSERT_EQ(ls.run(parse_ops("capture_begin g0 s1 pool new\ncapture_end g0\ncapture_begin g1 s1 pool g0\n")),
            std::nullopt);
  EXPECT_EQ(ls.apply(*parse_op("capture_begin g2 s2 pool g0")), std::nullopt);
  EXPECT_EQ(ls.last_sut().kind, Outcome::Kind::UsageError);
  EXPECT_EQ(ls.last_model().kind, Outcome::Kind::UsageError);
  EXPECT_EQ(ls.pools().graph(2), front_end::PoolFrontEnd::GraphState::None);
  EXPECT_FALSE(ls.ended());
}

// §14.8.3: dropping a MemPool while another is entered. The model says PyTorch fails, gpu/
// refuses naming §14.8 and changes nothing; the case ends there.
TEST(Lockstep, APyTorchFailureEndsTheCase) {
  PytorchLockstep ls(Options{});
  ASSERT_EQ(ls.run(parse_ops("use_pool p0\nalloc 1000 s0\nend_pool p0\nuse_pool p1\n")), std::nullopt);
  EXPECT_EQ(ls.apply(*parse_op("release_pool p0")), std::nullopt);
  EXPECT_EQ(ls.last_model().kind, Outcome::Kind::PyTorchFailure);
  EXPECT_EQ(ls.last_sut().kind, Outcome::Kind::UsageError);
  EXPECT_NE(ls.last_sut().message.find("§14.8"), std::string::npos) << ls.last_sut().message;
  EXPECT_TRUE(ls.ended());
  EXPECT_EQ(ls.apply(Allocate{1000, 0, {}}), std::nullopt);
  EXPECT_EQ(ls.last_sut().kind, Outcome::Kind::Ended);
}

// graph_capture_record_stream_reuse:True (§14.10.1): a block allocated in graph 0's capture on
// stream 1 and used on stream 2, which captures graph 1, is freed: record_free_markers asserts.
TEST(Lockstep, RecordStreamReuseAcrossTwoCapturesIsAPyTorchFailure) {
  Options o;
  o.config = parse_config("graph_capture_record_stream_reuse:True").config;
  PytorchLockstep ls(o);
  ASSERT_EQ(ls.run(parse_ops("capture_begin g0 s1 pool new\ncapture_begin g1 s2 pool new\n"
                             "alloc 1000 s1\nrecord h0 s2\n")),
            std::nullopt);
  EXPECT_EQ(ls.apply(Free{0}), std::nullopt);
  EXPECT_EQ(ls.last_model().kind, Outcome::Kind::PyTorchFailure);
  EXPECT_NE(ls.last_model().message.find("All streams in the same capture should agree on the graph"),
            std::string::npos) << ls.last_model().message;
  EXPECT_EQ(ls.last_sut().kind, Outcome::Kind::UsageError);
  EXPECT_NE(ls.last_sut().message.find("§14.10.1"), std::string::npos) << ls.last_sut().message;
  EXPECT_TRUE(ls.ended());
}

// The same free waits for the end of the captures (§14.7) without the option, and with it when
// one of the block's streams is outside every capture (stream 3 here: PyTorch's walk may stop
// there first, and cachet takes it so).
TEST(Lockstep, RecordStreamReuseWithoutAssertionDefersTheFree) {
  const char* ops = "capture_begin g0 s1 pool new\ncapture_begin g1 s2 pool new\nalloc 1000 s1\nrecord h0 s2\n";
  for (const char* conf : {"graph_capture_record_stream_reuse:False", "graph_capture_record_stream_reuse:True"}) {
    Options o;
    o.config = parse_config(conf).config;
    PytorchLockstep ls(o);
    ASSERT_EQ(ls.run(parse_ops(ops)), std::nullopt);
    if (std::string(conf).ends_with("True")) {
      ASSERT_EQ(ls.apply(RecordStream{0, 3}), std::nullopt);
    }
    EXPECT_EQ(ls.apply(Free{0}), std::nullopt) << conf;
    EXPECT_EQ(ls.last_model().kind, Outcome::Kind::Ok) << conf;
    EXPECT_FALSE(ls.ended()) << conf;
    // Deferred: no longer allocated, still active (1024 B of the block, 1024 B of the generator).
    EXPECT_EQ(ls.sut().stats().allocated_bytes[0].current, 1024) << conf;
    EXPECT_EQ(ls.sut().stats().active_bytes[0].current, 2048) << conf;
    EXPECT_EQ(ls.run(parse_ops("capture_end g0\ncapture_end g1\nalloc 1 s0\n")), std::nullopt) << conf;
  }
}

// The sut must refuse where PyTorch fails: here only the model has another pool entered
// (behind the runner's back), so only the model fails.
TEST(Lockstep, ReportsASutThatDoesNotRefuseWherePyTorchFails) {
  PytorchLockstep ls(Options{});
  ASSERT_EQ(ls.run(parse_ops("use_pool p0\nend_pool p0\n")), std::nullopt);
  ls.model().begin_allocate_to_pool(PoolId{0, 9}, PoolRoute{});
  const auto d = ls.apply(*parse_op("release_pool p0"));
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->rfind("result differs (PyTorch 2.11 fails here: the sut must refuse with a UsageError naming §14.8)", 0),
            0u)
      << *d;
  EXPECT_TRUE(ls.ended());
}

// Every pool's use count is compared after every op.
TEST(Lockstep, ComparesPoolUseCounts) {
  PytorchLockstep ls(Options{});
  ASSERT_EQ(ls.apply(*parse_op("use_pool p0")), std::nullopt);
  ls.model().create_or_incref_pool(PoolId{0, 1});  // behind the runner's back: 3 users, sut 2
  const auto d = ls.apply(CompleteAllEvents{});
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(*d, "pool use counts differ\n  pool {0, 1}: model 3, sut 2\n");
}

// A pair runs its own policy only.
TEST(Lockstep, PairAndPolicyMustMatch) {
  Options o;
  o.config.policy = Policy::Cachet;
  EXPECT_THROW(PytorchLockstep{o}, std::invalid_argument);
  EXPECT_THROW(CachetLockstep{Options{}}, std::invalid_argument);
  EXPECT_NO_THROW(CachetLockstep{o});
  EXPECT_TRUE(visit_policy(Policy::Cachet, []<class LS>(std::type_identity<LS>) {
    return std::is_same_v<LS, CachetLockstep>;
  }));
}


// ------------------------------------------------------------------ a device larger than the capacity

constexpr Bytes k80GiB = 80 * GiB;

// fraction_for_cap: the fraction whose cap (fraction x total in double, truncated, as PyTorch's
// setMemoryFraction and model::memory_cap) is exactly the bytes asked, for devices of odd sizes.
TEST(Lockstep, FractionForCapIsExact) {
  // 80 GiB; totals of the size an H100 and an H200 report (not multiples of a power of two); a prime.
  for (const Bytes total : {k80GiB, Bytes{85021196288}, Bytes{150109765632}, Bytes{1000000007}})
    for (const Bytes cap : {Bytes{0}, Bytes{1}, Bytes{512}, 8 * GiB - 1, 8 * GiB, 8 * GiB + 1, Bytes{123456789},
                            total / 3, total - 1}) {
      if (cap >= total) continue;
      const double f = fraction_for_cap(cap, total);
      EXPECT_LT(f, 1.0);
      EXPECT_EQ(model::memory_cap(f, total), std::optional<Bytes>(cap)) << "cap " << cap << " of " << total;
    }
  EXPECT_EQ(fraction_for_cap(k80GiB, k80GiB), 1.0);  // the whole device: no cap
  EXPECT_EQ(fraction_for_cap(k80GiB + 1, k80GiB), 1.0);
}

Options capped(const char* conf = "") {
  Options o;
  o.config = parse_config(conf).config;
  o.capacity = 8 * GiB;
  o.device_total = k80GiB;
  o.events_complete_immediately = true;
  return o;
}

// The capacity is a cap of an 80 GiB host device on both sides: a request beyond it is out of
// memory with the device's total and the cap in the message (no device call), as props_gpu_test
// on an 80 GiB H100.
TEST(Lockstep, DeviceTotalMakesTheCapacityACap) {
  PytorchLockstep ls(capped());
  EXPECT_EQ(ls.total_memory(), k80GiB);
  EXPECT_EQ(ls.cap(), std::optional<Bytes>(8 * GiB));
  EXPECT_EQ(ls.model().allowed_memory_maximum(), std::optional<Bytes>(8 * GiB));
  ASSERT_EQ(ls.apply(Allocate{9 * GiB, 0, {}}), std::nullopt);
  EXPECT_EQ(ls.last_sut().kind, Outcome::Kind::OutOfMemory);
  EXPECT_EQ(text(ls.last_sut()),
            "CUDA out of memory. Tried to allocate 9.00 GiB. GPU 0 has a total capacity of 80.00 GiB of which "
            "80.00 GiB is free. Including non-PyTorch memory, this process has 0 bytes memory in use. 8.00 GiB "
            "allowed; Of the allocated memory 0 bytes is allocated by PyTorch, and 0 bytes is reserved by PyTorch "
            "but unallocated. If reserved but unallocated memory is large try setting "
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for "
            "Memory Management  (https://docs.pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-"
            "with-pytorch-cuda-alloc-conf)");
  EXPECT_EQ(ls.device_counters().mallocs + ls.device_counters().oom_calls, 0u);  // the cap refused it
  // Exactly the cap is allowed (§13.4); one more segment is not.
  ASSERT_EQ(ls.apply(Allocate{8 * GiB, 0, {}}), std::nullopt);
  EXPECT_EQ(ls.last_sut().kind, Outcome::Kind::Pointer);
  ASSERT_EQ(ls.apply(Allocate{1, 0, {}}), std::nullopt);
  EXPECT_EQ(ls.last_sut().kind, Outcome::Kind::OutOfMemory);
  EXPECT_EQ(ls.sut().stats().num_ooms, 2);
  // A fraction op replaces the cap: a fraction of the 80 GiB device, as in PyTorch.
  ASSERT_EQ(ls.apply(SetMemoryFraction{0.25}), std::nullopt);
  EXPECT_EQ(ls.cap(), std::optional<Bytes>(20 * GiB));
}

// The same sequence, a 3 GiB block cached then a 6 GiB request: on an 8 GiB device (no cap)
// the device runs out and the cache is freed and the call retried; under the 8 GiB cap of an
// 80 GiB device the cap refuses before any device call and the retry follows; with a garbage
// collection threshold (0.3: 2.4 GiB), garbage collection releases the 3 GiB block first (it
// runs only under a cap, §3.5), and no retry is needed.
TEST(Lockstep, DeviceTotalReachesRetryAndGarbageCollection) {
  const auto ops = parse_ops("alloc 3221225472 s0\nfree h0\nalloc 6442450944 s0\n");
  Options plain;
  plain.capacity = 8 * GiB;
  for (const auto& [o, retries, gc_frees, what] :
       {std::tuple{plain, 1, 1, "8 GiB device"}, std::tuple{capped(), 1, 1, "8 GiB cap"},
        std::tuple{capped("garbage_collection_threshold:0.3"), 0, 1, "8 GiB cap, GC"}}) {
    PytorchLockstep ls(o);
    ASSERT_EQ(ls.run(ops), std::nullopt) << what;
    EXPECT_EQ(ls.last_sut().kind, Outcome::Kind::Pointer) << what;
    const DeviceStats& st = ls.sut().stats();
    EXPECT_EQ(st.num_alloc_retries, retries) << what;
    EXPECT_EQ(st.num_device_free, gc_frees) << what;
    EXPECT_EQ(st.num_ooms, 0) << what;
    EXPECT_EQ(st.reserved_bytes[0].current, 6 * static_cast<std::int64_t>(GiB)) << what;
  }
}

// The real-device constructor, as props_gpu_test builds it, on a host backend of 80 GiB: the
// model takes the device's outcomes and the free bytes the sut read, and the capacity is a cap.
// A device_total that is not the device's is refused.
TEST(Lockstep, DeviceTotalOnTheRealDevicePath) {
  auto device = [] {
    gpu::HostOptions ho;
    ho.capacity = k80GiB;
    ho.events_complete_when_recorded = true;
    return gpu::make_host_memory(ho);
  };
  PytorchLockstep ls(capped("garbage_collection_threshold:0.3"), device());
  EXPECT_EQ(ls.sim(), nullptr);
  EXPECT_EQ(ls.cap(), std::optional<Bytes>(8 * GiB));
  ASSERT_EQ(ls.run(parse_ops("alloc 3221225472 s0\nfree h0\nalloc 6442450944 s0\nalloc 3221225472 s1\n")),
            std::nullopt);
  EXPECT_EQ(ls.last_sut().kind, Outcome::Kind::OutOfMemory);
  EXPECT_NE(text(ls.last_sut()).find("GPU 0 has a total capacity of 80.00 GiB of which 74.00 GiB is free. "),
            std::string::npos)
      << text(ls.last_sut());
  EXPECT_EQ(ls.sut().stats().num_device_free, 1);  // garbage collection
  Options wrong = capped();
  wrong.device_total = 40 * GiB;
  try {
    PytorchLockstep bad(wrong, device());
    ADD_FAILURE() << "a device_total other than the device's was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()),
              "lockstep: Options::device_total says 42949672960 bytes but the device's total memory is 85899345920; "
              "read it from the device (mem_get_info) or leave it unset");
  }
}

}  // namespace
}  // namespace cachet::lockstep

// Replaying a snapshot whose segments name private pools (cachet/replay/pools.h): the real run
// tests/data/oracle-h100/snapshots/graphed_mlp.pickle.gz, a small hand-made trace for each way a
// window's entry is told, and a snapshot without private pools, which replays as before.
//
// graphed_mlp's figures were found by hand from the pickle (CPython, an Unpickler whose
// find_class raises, no torch): a walk over device_traces[0] that keeps the live segments by
// address and gives each alloc the segment it lies in, and each segment alive at the end the
// segment_pool_id of the snapshot segment at its address. (0, 1)'s allocations are trace events
// 119, 121, 123, 125, 127 (the forward graph's capture) and 141..157 (8, the backward graph's,
// after the empty_cache() of events 139-140), all on stream 661764992; events 116 and 117 are
// the CUDA generator's 8-byte seed and offset on that stream in the default pool's segment
// 0x7fb1b1c00000; (0, 2)'s are events 163, 164, 166 (3, 17 and 40 MiB on stream 0); the 7
// segment_free events release 304 MiB of segments that held 18 allocations. The final stats are
// graphed_mlp.stats.json.gz's (PyTorch's memory_stats() after the dump).
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "cachet/replay/replay.h"
#include "cachet/replay/report.h"
#include "cachet/stats.h"

namespace {

using namespace cachet;
using namespace cachet::replay;

const std::string kGraphed = std::string(CACHET_TEST_DATA) + "/oracle-h100/snapshots/graphed_mlp.pickle.gz";
constexpr StreamId kCapture = 661764992;

std::vector<std::pair<OpKind, std::uint32_t>> pool_ops(const Trace& t) {  // (kind, trace event)
  std::vector<std::pair<OpKind, std::uint32_t>> out;
  for (const Op& o : t.ops)
    if (o.kind == OpKind::BeginPool || o.kind == OpKind::EndPool) out.emplace_back(o.kind, o.event);
  return out;
}

TEST(ReplayPools, GraphedMlpWhichAllocationWentWhereAndWhen) {
  const LoadedTrace lt = load_trace(kGraphed);
  const PoolInference& inf = lt.trace.pools;
  ASSERT_EQ(inf.pools.size(), 2u);
  const ReplayPool& g = inf.pools[0];
  EXPECT_EQ(g.id, (PoolId{0, 1}));
  EXPECT_EQ(g.allocations, 13u);
  EXPECT_EQ(g.first_event, 119u);
  EXPECT_EQ(g.last_event, 157u);
  EXPECT_EQ(g.streams, std::vector<StreamId>{kCapture});
  EXPECT_EQ(g.windows[static_cast<int>(PoolEntry::Capture)], 2u);  // forward and backward capture
  EXPECT_NE(g.capture_evidence.find("trace events 116 and 117"), std::string::npos) << g.capture_evidence;
  EXPECT_EQ(g.end_segments, 8u);
  EXPECT_EQ(g.end_reserved, 257949696u);   // 2 + 16 + 64 + 32 + 16 + 20 + 32 + 64 MiB
  EXPECT_EQ(g.end_allocated, 210804736u);
  const ReplayPool& m = inf.pools[1];
  EXPECT_EQ(m.id, (PoolId{0, 2}));
  EXPECT_EQ(m.allocations, 3u);
  EXPECT_EQ(m.first_event, 163u);
  EXPECT_EQ(m.last_event, 166u);
  EXPECT_EQ(m.windows[static_cast<int>(PoolEntry::Unknown)], 1u);  // use_mem_pool, which it was
  EXPECT_TRUE(m.capture_evidence.empty());
  EXPECT_EQ(m.end_segments, 2u);
  EXPECT_EQ(m.end_reserved, 62914560u);  // 20 + 40 MiB
  EXPECT_EQ(m.end_allocated, 0u);
  EXPECT_EQ(inf.released_segments, 7u);
  EXPECT_EQ(inf.released_bytes, 318767104u);
  EXPECT_EQ(inf.released_allocations, 18u);
  EXPECT_EQ(inf.unplaced_allocations, 0u);
  EXPECT_EQ(inf.split_by_empty_cache, 1u);
  // The windows: (0, 1) from its first allocation to the last before the empty_cache() (event
  // 127), again from 141 to 157; (0, 2) from 163 to 166.
  ASSERT_EQ(inf.windows.size(), 3u);
  EXPECT_EQ(inf.windows[0].route.kind, PoolRoute::Kind::CaptureStream);
  EXPECT_EQ(inf.windows[0].route.stream, kCapture);
  EXPECT_EQ(inf.windows[2].route.kind, PoolRoute::Kind::CurrentThread);
  using P = std::pair<OpKind, std::uint32_t>;
  EXPECT_EQ(pool_ops(lt.trace), (std::vector<P>{{OpKind::BeginPool, 119}, {OpKind::EndPool, 127},
                                                {OpKind::BeginPool, 141}, {OpKind::EndPool, 157},
                                                {OpKind::BeginPool, 163}, {OpKind::EndPool, 166}}));
}

TEST(ReplayPools, GraphedMlpEndsAsPyTorchDid) {
  const LoadedTrace lt = load_trace(kGraphed);
  ReplayOptions o = recorded_options(lt, AddressMode::Recorded);
  o.keep_allocator = true;
  const ReplayResult r = cachet::replay::replay(lt.trace, lt.run.config, o);
  EXPECT_TRUE(r.recorded_addresses) << r.note;
  EXPECT_EQ(r.pytorch_failures, 0u) << r.pytorch_failure;
  // Every one of the 122 keys of PyTorch's memory_stats() after the dump, and some by value.
  ASSERT_EQ(lt.file.final_stats.size(), 122u);
  std::size_t compared = 0;
  for (const auto& [k, v] : flatten(r.stats)) {
    auto it = lt.file.final_stats.find(k);
    ASSERT_NE(it, lt.file.final_stats.end()) << k;
    EXPECT_EQ(v, it->second) << k;
    ++compared;
  }
  EXPECT_EQ(compared, 122u);
  EXPECT_EQ(r.stats.reserved_bytes[0].peak, 591396864);
  EXPECT_EQ(r.stats.reserved_bytes[0].current, 591396864);
  EXPECT_EQ(r.stats.allocated_bytes[0].peak, 509691904);
  EXPECT_EQ(r.stats.num_device_alloc, 27);
  EXPECT_EQ(r.stats.num_device_free, 7);
  EXPECT_EQ(r.stats.num_sync_all_streams, 2);  // the two empty_cache(), no pool in use
  // The segments, blocks and pools of the snapshot, exactly.
  const Snapshot end = r.allocator->snapshot();
  ASSERT_EQ(end.size(), lt.file.devices[0].segments.size());
  for (std::size_t i = 0; i < end.size(); ++i) EXPECT_EQ(end[i], lt.file.devices[0].segments[i]) << "segment " << i;
  ASSERT_EQ(r.pool_ends.size(), 2u);
  EXPECT_EQ(r.pool_ends[0].segments, 8u);
  EXPECT_EQ(r.pool_ends[0].reserved, 257949696u);
  EXPECT_EQ(r.pool_ends[1].reserved, 62914560u);
  EXPECT_EQ(final_stats_line(r, lt.file.final_stats),
            "final stats: all 122 memory_stats() keys equal PyTorch's recorded ones\n");
}

// Other configurations replay too (synthetic addresses), policy:cachet included: the blocks the
// program holds at the end are the same, in the same pools.
TEST(ReplayPools, GraphedMlpUnderOtherConfigurations) {
  const LoadedTrace lt = load_trace(kGraphed);
  for (const char* conf : {"expandable_segments:True", "max_split_size_mb:128", "policy:cachet"}) {
    SCOPED_TRACE(conf);
    const Config c = parse_config(conf, ConfigSource::Cachet).config;
    const ReplayResult r = cachet::replay::replay(lt.trace, c, recorded_options(lt, AddressMode::Synthetic));
    EXPECT_EQ(r.failed_allocs, 0u);
    EXPECT_EQ(r.pytorch_failures, 0u) << r.pytorch_failure;
    ASSERT_EQ(r.pool_ends.size(), 2u);
    EXPECT_EQ(r.pool_ends[0].allocated, 210804736u);  // (0, 1)'s live blocks stay in it
    EXPECT_EQ(r.pool_ends[1].allocated, 0u);
    EXPECT_EQ(r.stats.allocated_bytes[0].current, 425805312);  // what the program holds at the end
  }
}

// A hand-made trace: each way a window's entry is told. Segments (20 MiB, one 4 MiB allocation
// each at a time): (0, 5) on stream 1, the default pools on stream 0, (0, 6) on streams 1 and 2,
// (3, 0) on streams 1 and 2, (0, 7) on stream 0, and one default segment released at the end.
TEST(ReplayPools, HowEachWindowWasEntered) {
  constexpr Bytes M4 = 4 * MiB, M20 = 20 * MiB;
  auto e = [](TraceAction a, std::uint64_t addr, Bytes size, StreamId s) { return TraceEvent{a, addr, size, s, 0}; };
  using A = TraceAction;
  const std::vector<TraceEvent> ev = {
      e(A::SegmentAlloc, 0x10000000, M20, 1), e(A::Alloc, 0x10000000, M4, 1),       // 0, 1: (0, 5)
      e(A::SegmentAlloc, 0x20000000, M20, 0), e(A::Alloc, 0x20000000, M4, 0),       // 2, 3: default
      e(A::Alloc, 0x10400000, M4, 1),                                               // 4: (0, 5) again
      e(A::SegmentAlloc, 0x30000000, M20, 1), e(A::Alloc, 0x30000000, M4, 1),       // 5, 6: (0, 6)
      e(A::SegmentAlloc, 0x40000000, M20, 2), e(A::Alloc, 0x40000000, M4, 2),       // 7, 8: (0, 6)
      e(A::Alloc, 0x30400000, M4, 1),                                               // 9: (0, 6)
      e(A::Alloc, 0x20400000, M4, 0),                                               // 10: default
      e(A::SegmentAlloc, 0x50000000, M20, 1), e(A::Alloc, 0x50000000, M4, 1),       // 11, 12: (3, 0)
      e(A::SegmentAlloc, 0x58000000, M20, 2), e(A::Alloc, 0x58000000, M4, 2),       // 13, 14: (3, 0)
      e(A::SegmentAlloc, 0x70000000, M20, 0), e(A::Alloc, 0x70000000, M4, 0),       // 15, 16: (0, 7)
      e(A::SegmentAlloc, 0x80000000, M20, 0), e(A::Alloc, 0x80000000, M4, 0),       // 17, 18: released
      e(A::FreeRequested, 0x80000000, M4, 0), e(A::FreeCompleted, 0x80000000, M4, 0),  // 19, 20
      e(A::SegmentFree, 0x80000000, M20, 0),                                        // 21: empty_cache()
  };
  auto seg = [&](std::uint64_t addr, StreamId s, PoolId id) {
    SegmentSnapshot x;
    x.address = addr;
    x.total_size = M20;
    x.stream = s;
    x.is_large = true;
    x.pool_id = id;
    return x;
  };
  const Snapshot segs = {seg(0x10000000, 1, {0, 5}), seg(0x20000000, 0, {0, 0}), seg(0x30000000, 1, {0, 6}),
                         seg(0x40000000, 2, {0, 6}), seg(0x50000000, 1, {3, 0}), seg(0x58000000, 2, {3, 0}),
                         seg(0x70000000, 0, {0, 7})};
  Trace t = prepare_trace(ev, RecordedRun{});
  route_to_pools(t, ev, segs);
  const PoolInference& inf = t.pools;
  ASSERT_EQ(inf.pools.size(), 4u);  // (0, 5), (0, 6), (0, 7), (3, 0)
  auto windows = [&](std::size_t p, PoolEntry k) { return inf.pools[p].windows[static_cast<int>(k)]; };
  // (0, 5): event 3 on stream 0 went to the default pools while it was in use, then it took
  // event 4: a capture of stream 1 (use_mem_pool would have taken event 3).
  EXPECT_EQ(windows(0, PoolEntry::Capture), 1u);
  EXPECT_NE(inf.pools[0].capture_evidence.find("trace event 3 "), std::string::npos) << inf.pools[0].capture_evidence;
  // (0, 6): one window taking streams 1 and 2: use_mem_pool.
  EXPECT_EQ(windows(1, PoolEntry::UseMemPool), 1u);
  EXPECT_EQ(inf.pools[1].streams, (std::vector<StreamId>{1, 2}));
  // (0, 7): one stream, nothing tells.
  EXPECT_EQ(windows(2, PoolEntry::Unknown), 1u);
  // (3, 0): an id only a capture makes: a capture per stream, two windows.
  EXPECT_EQ(windows(3, PoolEntry::Capture), 2u);
  EXPECT_EQ(inf.released_segments, 1u);
  EXPECT_EQ(inf.released_allocations, 1u);
  using P = std::pair<OpKind, std::uint32_t>;
  EXPECT_EQ(pool_ops(t), (std::vector<P>{{OpKind::BeginPool, 1},  {OpKind::EndPool, 4},  {OpKind::BeginPool, 6},
                                         {OpKind::EndPool, 9},    {OpKind::BeginPool, 12}, {OpKind::EndPool, 12},
                                         {OpKind::BeginPool, 14}, {OpKind::EndPool, 14}, {OpKind::BeginPool, 16},
                                         {OpKind::EndPool, 16}}));
  // Where a request at each allocation goes (what `cachet explain` uses).
  auto op_of = [&](std::uint32_t event) {
    for (std::size_t k = 0; k < t.ops.size(); ++k)
      if (t.ops[k].kind == OpKind::Alloc && t.ops[k].event == event) return k;
    return t.ops.size();
  };
  EXPECT_EQ(request_pool(t, op_of(4), 1), (PoolId{0, 5}));
  EXPECT_EQ(request_pool(t, op_of(3), 0), (PoolId{0, 0}));
  EXPECT_EQ(request_pool(t, op_of(8), 2), (PoolId{0, 6}));
  EXPECT_EQ(request_pool(t, op_of(14), 2), (PoolId{3, 0}));
  EXPECT_EQ(request_pool(t, op_of(18), 0), (PoolId{0, 0}));
  // Replayed: each pool's blocks in its own segments (20 MiB per stream it allocated on).
  const ReplayResult r = cachet::replay::replay(t, Config{});
  ASSERT_EQ(r.pool_ends.size(), 4u);
  EXPECT_EQ(r.pool_ends[0].reserved, M20);
  EXPECT_EQ(r.pool_ends[0].allocated, 2 * M4);
  EXPECT_EQ(r.pool_ends[1].reserved, 2 * M20);
  EXPECT_EQ(r.pool_ends[1].allocated, 3 * M4);
  EXPECT_EQ(r.pool_ends[2].reserved, M20);
  EXPECT_EQ(r.pool_ends[3].reserved, 2 * M20);
  EXPECT_EQ(r.stats.reserved_bytes[0].current, static_cast<std::int64_t>(7 * M20));  // + the default one
}

// Where PyTorch itself would fail (docs/pytorch-allocator.md §14.8): under a 32 MiB cap with
// garbage_collection_threshold:0.5, the capture's first allocation (pool (1, 0), a capture's id)
// finds no free block in its pool, and garbage collection would give the default pools' free
// 20 MiB segment back (reserved 20 MiB > 0.5 x 32 MiB) during the capture. gpu/ refuses it,
// the replay counts it; the recorded configuration has nothing to collect.
TEST(ReplayPools, WherePyTorchWouldFailIsCounted) {
  constexpr Bytes M4 = 4 * MiB, M20 = 20 * MiB;
  auto e = [](TraceAction a, std::uint64_t addr, Bytes size, StreamId s) { return TraceEvent{a, addr, size, s, 0}; };
  using A = TraceAction;
  const std::vector<TraceEvent> ev = {
      e(A::SegmentAlloc, 0x10000000, M20, 0),   e(A::Alloc, 0x10000000, M4, 0),
      e(A::FreeRequested, 0x10000000, M4, 0),  e(A::FreeCompleted, 0x10000000, M4, 0),
      e(A::SegmentAlloc, 0x20000000, M20, 1),   e(A::Alloc, 0x20000000, M4, 1),  // 5: in (1, 0)
  };
  SegmentSnapshot d, g;
  d.address = 0x10000000;
  g.address = 0x20000000;
  d.total_size = g.total_size = M20;
  d.is_large = g.is_large = true;
  g.stream = 1;
  g.pool_id = PoolId{1, 0};
  Trace t = prepare_trace(ev, RecordedRun{});
  route_to_pools(t, ev, Snapshot{d, g});
  ASSERT_EQ(t.pools.windows.size(), 1u);
  EXPECT_EQ(t.pools.windows[0].entry, PoolEntry::Capture);
  ReplayOptions o;
  o.device_memory = 1024 * MiB;
  o.cap = 32 * MiB;
  const ReplayResult ok = cachet::replay::replay(t, Config{}, o);
  EXPECT_EQ(ok.pytorch_failures, 0u) << ok.pytorch_failure;
  const ReplayResult gc =
      cachet::replay::replay(t, parse_config("garbage_collection_threshold:0.5", ConfigSource::PyTorch).config, o);
  EXPECT_EQ(gc.pytorch_failures, 1u);
  EXPECT_NE(gc.pytorch_failure.find("trace event 5: "), std::string::npos) << gc.pytorch_failure;
  EXPECT_NE(gc.pytorch_failure.find("14.8"), std::string::npos) << gc.pytorch_failure;
}

// An oracle recording's op list says where each pool was entered and left, even where no segment
// is left at the end to name the pool: res_flip_pool_retry (a 60 MiB cap; ops a0 f0 pb0 a1 pe0
// a2 f2 pr0 e). Its trace events: 0 segment_alloc (30 MiB), 1 alloc, 2-3 free, 4 oom (a1, 40 MiB,
// inside use_mem_pool: no free-and-retry there, docs/pytorch-allocator.md §14.6), 5 segment_free
// (a2's free-and-retry), 6 segment_alloc (40 MiB), 7 alloc (a2), 8-9 free, 10 segment_free (e).
TEST(ReplayPools, RecordingOpListEntersItsPools) {
  const LoadedTrace lt =
      load_trace(std::string(CACHET_TEST_DATA) + "/oracle-h100/results/res_flip_pool_retry.json.gz");
  const PoolInference& inf = lt.trace.pools;
  EXPECT_EQ(inf.op_list, "ops_flip_pool_retry.json.gz");
  ASSERT_EQ(inf.pools.size(), 1u);
  EXPECT_EQ(inf.pools[0].id, (PoolId{0, 1}));  // torch.cuda.MemPool(): {0, 1}
  EXPECT_EQ(inf.pools[0].allocations, 0u);
  ASSERT_EQ(inf.windows.size(), 1u);
  EXPECT_EQ(inf.windows[0].entry, PoolEntry::UseMemPool);
  EXPECT_TRUE(inf.windows[0].create);
  EXPECT_TRUE(inf.windows[0].release_at_end);
  EXPECT_EQ(inf.releases, 1u);  // pr0
  using P = std::pair<OpKind, std::uint32_t>;
  std::vector<P> ops;
  for (const Op& o : lt.trace.ops) ops.emplace_back(o.kind, o.event);
  // pr0 is releasePool + emptyCache((0, 1)); e is the op list's empty_cache(), which released
  // the 40 MiB default segment (event 10).
  EXPECT_EQ(ops, (std::vector<P>{{OpKind::Alloc, 1}, {OpKind::Free, 2}, {OpKind::BeginPool, 4},
                                 {OpKind::OomRequest, 4}, {OpKind::EndPool, 7}, {OpKind::Alloc, 7},
                                 {OpKind::Free, 8}, {OpKind::ReleasePool, 10}, {OpKind::EmptyCache, 10}}));
  EXPECT_EQ(lt.trace.empty_cache_calls, 1u);
  const std::size_t oom = 3;
  ASSERT_EQ(lt.trace.ops[oom].kind, OpKind::OomRequest);
  EXPECT_EQ(request_pool(lt.trace, oom, 0), (PoolId{0, 1}));
  EXPECT_EQ(request_pool(lt.trace, 5, 0), (PoolId{0, 0}));  // a2, after pe0
  // Replayed with its cap, it fails where PyTorch did and ends as PyTorch did.
  const ReplayResult r = cachet::replay::replay(lt.trace, lt.run.config, recorded_options(lt, AddressMode::Recorded));
  EXPECT_TRUE(r.recorded_addresses) << r.note;
  EXPECT_EQ(r.oom_requests, 1u);
  EXPECT_EQ(r.oom_requests_ok, 0u);
  EXPECT_EQ(r.stats.num_ooms, 1);
  EXPECT_EQ(r.stats.num_alloc_retries, 1);
  EXPECT_EQ(r.peak_reserved(), 41943040);
  EXPECT_EQ(final_stats_line(r, lt.file.final_stats),
            "final stats: all 122 memory_stats() keys equal PyTorch's recorded ones\n");
}

// Every recording with pool or capture ops replays from its op list's windows and ends with all
// 122 of PyTorch's final memory_stats() keys (the snapshot's segments alone left many pools'
// allocations in the default pools: 39 to 110 keys).
TEST(ReplayPools, RecordingsWithPoolOpsEndAsPyTorchDid) {
  const std::string h100 = std::string(CACHET_TEST_DATA) + "/oracle-h100/results/";
  for (const char* name : {"res_pools_default", "res_pools_defaultcap", "res_pools_gc", "res_pools_gccap",
                           "res_pools_msplit128", "res_graphs_default", "res_graphs_defaultcap",
                           "res_graphs_expandable", "res_graphs_gc", "res_graphs_msplit128", "res_nested_default",
                           "res_nested_gc", "res_nested_msplit40", "res_flip_pool_empty_cache",
                           "res_flip_pool_retry"}) {
    SCOPED_TRACE(name);
    const LoadedTrace lt = load_trace(h100 + name + ".json.gz");
    EXPECT_FALSE(lt.trace.pools.op_list.empty());
    const ReplayResult r =
        cachet::replay::replay(lt.trace, lt.run.config, recorded_options(lt, AddressMode::Recorded));
    EXPECT_EQ(r.pytorch_failures, 0u) << r.pytorch_failure;
    EXPECT_EQ(final_stats_line(r, lt.file.final_stats),
              "final stats: all 122 memory_stats() keys equal PyTorch's recorded ones\n");
  }
}

// A snapshot without private pools replays exactly as before: no pool op, nothing said.
TEST(ReplayPools, NoPrivatePoolNoChange) {
  const LoadedTrace lt = load_trace(std::string(CACHET_TEST_DATA) + "/oracle/snapshots/mlp_train.pickle.gz");
  EXPECT_FALSE(lt.trace.pools.any());
  EXPECT_TRUE(pool_ops(lt.trace).empty());
  const Trace plain = prepare_trace(lt.file.devices[0].events, lt.run);
  EXPECT_EQ(lt.trace.ops.size(), plain.ops.size());
  EXPECT_EQ(pool_lines(lt.trace), "");
}

}  // namespace

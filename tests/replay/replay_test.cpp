// The replay library: trace preparation (pending frees, empty_cache detection, mid-run traces),
// the pickle snapshot, tune.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "cachet/replay/replay.h"
#include "cachet/replay/report.h"
#include "cachet/replay/tune.h"

namespace {

using namespace cachet;
using namespace cachet::replay;

const std::string kData = std::string(CACHET_TEST_DATA) + "/oracle/";

TraceEvent ev(TraceAction a, std::uint64_t addr, Bytes size, StreamId s = 0) { return {a, addr, size, s, 0}; }

std::size_t count(const Trace& t, OpKind k) {
  return static_cast<std::size_t>(std::count_if(t.ops.begin(), t.ops.end(), [&](const Op& o) { return o.kind == k; }));
}

TEST(Replay, PickleSnapshotReplays) {
  LoadedTrace lt = load_trace(kData + "snapshots/mlp_train.pickle.gz");
  EXPECT_EQ(lt.file.format, io::TraceFormat::SnapshotPickle);
  EXPECT_GT(lt.trace.events, 0u);
  ReplayResult r = cachet::replay::replay(lt.trace, lt.run.config, recorded_options(lt, AddressMode::Recorded));
  EXPECT_GT(r.peak_allocated(), 0);
  EXPECT_GE(r.peak_reserved(), r.peak_allocated());
  EXPECT_EQ(r.stats.num_ooms, 0);
  // It ends where the snapshot's segments say PyTorch ended.
  ASSERT_TRUE(lt.end_reserved && lt.end_allocated);
  EXPECT_EQ(static_cast<Bytes>(r.stats.reserved_bytes[0].current), *lt.end_reserved);
  EXPECT_EQ(static_cast<Bytes>(r.stats.allocated_bytes[0].current), *lt.end_allocated);
}

TEST(Replay, PendingFreeWaitsForItsCompletion) {
  // A is freed with a pending stream use; B (same size) must not reuse it until free_completed.
  const Bytes sz = 600 * KiB;
  std::vector<TraceEvent> e = {
      ev(TraceAction::SegmentAlloc, 0x1000000, 2 * MiB), ev(TraceAction::Alloc, 0x1000000, sz),
      ev(TraceAction::FreeRequested, 0x1000000, sz),     ev(TraceAction::Alloc, 0x1096000, sz),
      ev(TraceAction::FreeCompleted, 0x1000000, sz),     ev(TraceAction::Alloc, 0x1000000, sz),
  };
  Trace t = prepare_trace(e, RecordedRun{});
  EXPECT_EQ(count(t, OpKind::FreePending), 1u);
  EXPECT_EQ(count(t, OpKind::Complete), 1u);
  EXPECT_EQ(t.pseudo_streams, 1u);
  ReplayOptions o;
  o.stop_after = 3;  // alloc A, pending free A, alloc B
  o.keep_allocator = true;
  ReplayResult mid = cachet::replay::replay(t, Config{}, o);
  Snapshot s = mid.allocator->snapshot();
  ASSERT_EQ(s.size(), 1u);
  ASSERT_GE(s[0].blocks.size(), 2u);
  EXPECT_EQ(s[0].blocks[0].state, BlockState::ActivePendingFree);
  EXPECT_EQ(s[0].blocks[1].state, BlockState::ActiveAllocated);
  ReplayResult end = cachet::replay::replay(t, Config{}, ReplayOptions{});
  EXPECT_EQ(end.stats.allocation[0].current, 2);
  EXPECT_EQ(end.stats.active[0].current, 2);  // the pending block was reused by the third alloc
  EXPECT_EQ(end.stats.segment[0].current, 1);
}

TEST(Replay, EmptyCacheIsToldFromTheAllocatorsOwnReleases) {
  auto calls = [](const std::string& rec) { return load_trace(kData + "results/" + rec).trace.empty_cache_calls; };
  EXPECT_GT(calls("res_mixed_empty_default.json.gz"), 0u);
  EXPECT_GT(calls("res_frag_default.json.gz"), 0u);
  EXPECT_EQ(calls("res_pressure_default.json.gz"), 0u);  // releases inside malloc: OOM retries
  EXPECT_EQ(calls("res_mixed_gc.json.gz"), 0u);          // garbage collection
  EXPECT_EQ(calls("res_small_default.json.gz"), 0u);
}

TEST(Replay, MidRunTraceIsReportedNotFatal) {
  LoadedTrace lt = load_trace(kData + "workloads/gpt2_train.trace.json.gz");
  const auto& all = lt.file.devices.at(0).events;
  std::vector<TraceEvent> tail(all.begin() + static_cast<std::ptrdiff_t>(all.size() / 3), all.end());
  Trace t = prepare_trace(tail, lt.run, "tail");
  EXPECT_TRUE(t.stats.starts_mid_run());
  EXPECT_GT(t.ignored_events, 0u);
  EXPECT_NE(trace_note(t).find("mid-run"), std::string::npos);
  ReplayResult r = cachet::replay::replay(t, lt.run.config, recorded_options(lt, AddressMode::Recorded));
  EXPECT_GT(r.peak_allocated(), 0);
  EXPECT_EQ(r.stats.num_ooms, 0);
  EXPECT_EQ(r.events, tail.size());
}

TEST(Replay, OomRequestsAreReplayed) {
  LoadedTrace lt = load_trace(kData + "results/res_pressure_default.json.gz");
  ReplayResult rec = cachet::replay::replay(lt.trace, lt.run.config, recorded_options(lt, AddressMode::Recorded));
  EXPECT_EQ(rec.oom_requests, static_cast<std::uint64_t>(lt.file.final_stats.at("num_ooms")));
  EXPECT_EQ(rec.oom_requests_ok, 0u);
  // Without the cap every request fits.
  ReplayOptions o = recorded_options(lt, AddressMode::Synthetic);
  o.cap = 0;
  ReplayResult free_run = cachet::replay::replay(lt.trace, lt.run.config, o);
  EXPECT_EQ(free_run.stats.num_ooms, 0);
  EXPECT_EQ(free_run.oom_requests_ok, free_run.oom_requests);
}

TEST(Replay, TuneFindsNoWorseThanRecorded) {
  LoadedTrace lt = load_trace(kData + "workloads/gpt2_train.trace.json.gz");
  const auto space = tune_space(lt.run.config, false);
  EXPECT_GE(space.size(), 50u);
  TuneResult tr = tune(lt.trace, lt.run.config, space, recorded_options(lt, AddressMode::Synthetic), 2);
  EXPECT_EQ(tr.baseline.peak_reserved(), lt.file.final_stats.at("reserved_bytes.all.peak"));
  ASSERT_NE(tr.best, kRecorded);
  const ReplayResult& b = tr.results[tr.best];
  EXPECT_LE(b.peak_reserved(), tr.baseline.peak_reserved());
  EXPECT_LE(b.stats.num_ooms, tr.baseline.stats.num_ooms);
  for (const auto& r : tr.results)
    if (r.stats.num_ooms <= b.stats.num_ooms) {
      EXPECT_GE(r.peak_reserved(), b.peak_reserved());
    }
}

TEST(Replay, TuneWithCapSearchesGarbageCollection) {
  const auto space = tune_space(Config{}, true);
  EXPECT_TRUE(std::any_of(space.begin(), space.end(),
                          [](const TuneCandidate& c) { return c.config.garbage_collection_threshold > 0; }));
  const auto no_cap = tune_space(Config{}, false);
  EXPECT_TRUE(std::none_of(no_cap.begin(), no_cap.end(),
                           [](const TuneCandidate& c) { return c.config.garbage_collection_threshold > 0; }));
}

TEST(Replay, TuneSpaceHasTheCachetPolicyOnce) {
  for (bool cap : {false, true})
    for (const char* base_text : {"", "expandable_segments:True,max_split_size_mb:128", "roundup_power2_divisions:4"}) {
      const Config base = parse_config(base_text, ConfigSource::PyTorch).config;
      const auto space = tune_space(base, cap);
      const auto n = std::count_if(space.begin(), space.end(),
                                   [](const TuneCandidate& c) { return c.config.policy == Policy::Cachet; });
      EXPECT_EQ(n, 1) << base_text << " cap " << cap;
      const auto it = std::find_if(space.begin(), space.end(),
                                   [](const TuneCandidate& c) { return c.config.policy == Policy::Cachet; });
      ASSERT_NE(it, space.end());
      // The PyTorch policy's keys are left out: it reads as CACHET_ALLOC_CONF would set it.
      EXPECT_EQ(it->conf, "policy:cachet") << base_text;
      EXPECT_EQ(it->config, parse_config("policy:cachet", ConfigSource::Cachet).config);
    }
}

// The cachet policy's tune result is a plain replay of policy:cachet, and wins when it reserves least.
TEST(Replay, TuneReplaysTheCachetPolicy) {
  LoadedTrace lt = load_trace(kData + "workloads/resnet50_train.trace.json.gz");
  const auto space = tune_space(lt.run.config, false);
  const ReplayOptions o = recorded_options(lt, AddressMode::Synthetic);
  TuneResult tr = tune(lt.trace, lt.run.config, space, o, 2);
  std::size_t k = space.size();
  for (std::size_t i = 0; i < space.size(); ++i)
    if (space[i].config.policy == Policy::Cachet) k = i;
  ASSERT_LT(k, space.size());
  EXPECT_EQ(tr.results[k].conf, "policy:cachet");
  Config c = lt.run.config;
  c.policy = Policy::Cachet;
  const ReplayResult direct = cachet::replay::replay(lt.trace, c, o);
  EXPECT_EQ(tr.results[k].peak_reserved(), direct.peak_reserved());
  // No OOM anywhere without a cap: the ranking is by peak reserved, whatever the policy.
  std::int64_t best = tr.baseline.peak_reserved();
  for (const auto& r : tr.results) {
    EXPECT_EQ(r.stats.num_ooms, 0) << r.conf;
    best = std::min(best, r.peak_reserved());
  }
  ASSERT_NE(tr.best, kRecorded);
  EXPECT_EQ(tr.results[tr.best].peak_reserved(), best);
}

TEST(Replay, ParseBytes) {
  EXPECT_EQ(parse_bytes("1024"), 1024u);
  EXPECT_EQ(parse_bytes("80GiB"), 80 * GiB);
  EXPECT_EQ(parse_bytes("1.5 G"), GiB + GiB / 2);
  EXPECT_EQ(parse_bytes("512mb"), 512 * MiB);
  EXPECT_FALSE(parse_bytes("lots"));
  EXPECT_FALSE(parse_bytes("12 parsecs"));
}

// The axes `cachet plot` and `cachet report` share (plot_axes): values worked by hand.
TEST(Replay, PlotAxes) {
  constexpr auto G = static_cast<std::int64_t>(GiB);
  constexpr auto M = static_cast<std::int64_t>(MiB);
  // Highest value 3 GiB: GiB; 3 x 1.05 = 3.15 over 6 steps is 0.525 a step, rounded up to 1 (0.5
  // is short), so y runs to 4 GiB. x from 0 to 10 over 10 steps: 1.
  PlotAxes a = plot_axes({{0, G, 3 * G}, {10, 0, 2 * G}});
  EXPECT_EQ(a.xmin, 0);
  EXPECT_EQ(a.xmax, 10);
  EXPECT_EQ(a.xstep, 1);
  EXPECT_TRUE(a.gib);
  EXPECT_EQ(a.unit, static_cast<double>(GiB));
  EXPECT_STREQ(a.unit_name, "GiB");
  EXPECT_EQ(a.ystep, 1);
  EXPECT_EQ(a.ymax, 4);
  // Highest value 900 MiB: MiB; 945 / 6 = 157.5 a step, rounded up to 200, y to 1000 MiB.
  // x from 5 to 30: 25 / 10 = 2.5 a step, a step of its own.
  a = plot_axes({{5, 900 * M, 0}, {7, 0, 100 * M}, {30, 1, 1}});
  EXPECT_EQ(a.xmin, 5);
  EXPECT_EQ(a.xmax, 30);
  EXPECT_EQ(a.xstep, 2.5);
  EXPECT_FALSE(a.gib);
  EXPECT_EQ(a.unit, static_cast<double>(MiB));
  EXPECT_STREQ(a.unit_name, "MiB");
  EXPECT_EQ(a.ystep, 200);
  EXPECT_EQ(a.ymax, 1000);
  // One point: x is one unit wide.
  a = plot_axes({{3, 0, 512 * M}});
  EXPECT_EQ(a.xmin, 3);
  EXPECT_EQ(a.xmax, 4);
  // Columns: x 0..10 over 4 + 1 columns; 2.5 and 3 fall in column 1 (its maxima kept), 10 in 4.
  const std::vector<PlotColumn> cols =
      plot_columns({{0, 1, 2}, {2.5, 5, 3}, {3, 4, 9}, {10, 7, 8}}, plot_axes({{0, 0, 0}, {10, 0, 0}}), 4);
  ASSERT_EQ(cols.size(), 5u);
  EXPECT_TRUE(cols[0].set && cols[0].allocated == 1 && cols[0].reserved == 2);
  EXPECT_TRUE(cols[1].set && cols[1].allocated == 5 && cols[1].reserved == 9);
  EXPECT_FALSE(cols[2].set || cols[3].set);
  EXPECT_TRUE(cols[4].set && cols[4].allocated == 7 && cols[4].reserved == 8);
}

}  // namespace

namespace {

TEST(Replay, RecordedAddressesFallBackWhenTheReplayDiverges) {
  using namespace cachet;
  using namespace cachet::replay;
  LoadedTrace lt = load_trace(std::string(CACHET_TEST_DATA) + "/oracle/workloads/gpt2_train.trace.json.gz");
  const Config other = parse_config("roundup_power2_divisions:4", ConfigSource::PyTorch).config;
  ReplayResult r = cachet::replay::replay(lt.trace, other, recorded_options(lt, AddressMode::Recorded));
  EXPECT_FALSE(r.recorded_addresses);
  EXPECT_NE(r.note.find("synthetic"), std::string::npos) << r.note;
  ReplayResult s = cachet::replay::replay(lt.trace, other, recorded_options(lt, AddressMode::Synthetic));
  EXPECT_EQ(r.stats, s.stats);
}

}  // namespace

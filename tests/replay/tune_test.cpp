// tune's ranking (fewest out-of-memory errors first), best and best_native on capped traces,
// memory_needed, and what a trace says of the device's memory (the cap a PyTorch snapshot's
// out-of-memory entry reveals). Exact figures come from PyTorch: the oracle recording
// res_pressure_default (6 GiB cap, 23 OOMs) and snapshots/gpt2_train_oom_cap12g.json (a GPT-2
// run on an H100 under a 12 GiB cap, dumped in its OutOfMemoryError handler).
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <string>

#include "cachet/replay/replay.h"
#include "cachet/replay/report.h"
#include "cachet/replay/tune.h"

namespace {

using namespace cachet;
using namespace cachet::replay;

const std::string kData = std::string(CACHET_TEST_DATA) + "/oracle/";
const std::string kOomPickle = kData + "snapshots/gpt2_train_oom_cap12g.pickle.gz";
// gpt2_train_oom_cap12g.json: what PyTorch recorded.
constexpr Bytes kOomCap = 12884901888;               // "cap": 12 GiB
constexpr std::int64_t kOomPeakReserved = 12750684160;  // "reserved_bytes.all.peak"

ReplayResult fake(std::int64_t ooms, std::int64_t peak, std::int64_t calls) {
  ReplayResult r;
  r.stats.num_ooms = ooms;
  r.stats.reserved_bytes[0].peak = peak;
  r.stats.num_device_alloc = calls;
  return r;
}

TEST(Tune, RanksByOomsThenPeakReservedThenDeviceCalls) {
  EXPECT_TRUE(ranks_before(fake(0, 10 * GiB, 9), fake(1, 5 * GiB, 1)));  // failing reserves less: still after
  EXPECT_FALSE(ranks_before(fake(1, 5 * GiB, 1), fake(0, 10 * GiB, 9)));
  EXPECT_TRUE(ranks_before(fake(2, 5 * GiB, 9), fake(2, 6 * GiB, 1)));
  EXPECT_TRUE(ranks_before(fake(2, 5 * GiB, 1), fake(2, 5 * GiB, 2)));
  EXPECT_FALSE(ranks_before(fake(2, 5 * GiB, 2), fake(2, 5 * GiB, 2)));  // a tie
}

TEST(Tune, PytorchAcceptsNoCachetOnlyKey) {
  EXPECT_TRUE(pytorch_accepts(parse_config("expandable_segments:True", ConfigSource::PyTorch).config));
  EXPECT_TRUE(pytorch_accepts(Config{}));
  EXPECT_FALSE(pytorch_accepts(parse_config("policy:cachet", ConfigSource::Cachet).config));
  EXPECT_FALSE(pytorch_accepts(parse_config("cachet_validate:True", ConfigSource::Cachet).config));
}

struct Capped {
  std::string path;
  std::optional<Bytes> cap;  // nullopt: the recorded one
};

// The Done-when of issue 17: on capped traces, best fails no more requests than any candidate
// tried (nor the recorded configuration), best_native no more than any candidate PyTorch's
// allocator accepts; each is one of those with the fewest.
TEST(Tune, BestFailsNoMoreRequestsThanAnyCandidateOnCappedTraces) {
  const std::vector<Capped> traces = {
      {kData + "workloads/gpt2_train.trace.json.gz", static_cast<Bytes>(13.5 * GiB)},
      {kData + "workloads/resnet50_train.trace.json.gz", 3 * GiB},
      {kData + "results/res_pressure_default.json.gz", std::nullopt},
      {kData + "results/res_pressure_expandable.json.gz", std::nullopt},
      {kData + "results/res_pressure_msplit128.json.gz", std::nullopt},
      {kOomPickle, kOomCap},
      {kOomPickle, 11 * GiB},
  };
  for (const Capped& c : traces) {
    SCOPED_TRACE(c.path);
    LoadedTrace lt = load_trace(c.path, LoadOptions{.cap = c.cap});
    ASSERT_GT(lt.run.cap, 0u);
    const ReplayOptions o = recorded_options(lt, AddressMode::Synthetic);
    const auto space = tune_space(lt.run.config, true);
    EXPECT_GE(space.size() + 1, 64u);  // at least the 64 configurations tune tried before issue 17
    TuneResult tr = tune(lt.trace, lt.run.config, space, o, 2);
    std::int64_t fewest = tr.baseline.stats.num_ooms, fewest_native = tr.baseline.stats.num_ooms;
    for (const ReplayResult& r : tr.results) {
      fewest = std::min(fewest, r.stats.num_ooms);
      if (pytorch_accepts(r.config)) fewest_native = std::min(fewest_native, r.stats.num_ooms);
    }
    EXPECT_EQ(tr.at(tr.best).stats.num_ooms, fewest);
    EXPECT_EQ(tr.at(tr.best_native).stats.num_ooms, fewest_native);
    EXPECT_TRUE(pytorch_accepts(tr.at(tr.best_native).config)) << tr.at(tr.best_native).conf;
    ASSERT_EQ(tr.ranking.size(), tr.results.size());
    for (std::size_t k = 1; k < tr.ranking.size(); ++k)
      EXPECT_FALSE(ranks_before(tr.results[tr.ranking[k]], tr.results[tr.ranking[k - 1]]));
  }
}

// Figures the issue measured: gpt2_train under 13.5 GiB fails 3 requests with the default
// (PyTorch's own verdict on this trace was OOM / no-OOM per configuration, 12 of 12 matched), and
// expandable_segments:True and policy:cachet avoid them; res_pressure_default fails 23 (PyTorch's
// num_ooms) and policy:cachet avoids all.
TEST(Tune, CappedTracesRecommendWhatAvoidsTheOoms) {
  {
    LoadedTrace lt = load_trace(kData + "workloads/gpt2_train.trace.json.gz",
                                LoadOptions{.cap = static_cast<Bytes>(13.5 * GiB)});
    TuneResult tr = tune(lt.trace, lt.run.config, tune_space(lt.run.config, true),
                         recorded_options(lt, AddressMode::Synthetic), 2);
    EXPECT_EQ(tr.baseline.stats.num_ooms, 3);
    EXPECT_EQ(tr.at(tr.best).stats.num_ooms, 0);
    EXPECT_EQ(tr.at(tr.best_native).conf, "expandable_segments:True");
    EXPECT_EQ(tr.at(tr.best_native).stats.num_ooms, 0);
  }
  {
    LoadedTrace lt = load_trace(kData + "results/res_pressure_default.json.gz");
    TuneResult tr = tune(lt.trace, lt.run.config, tune_space(lt.run.config, true),
                         recorded_options(lt, AddressMode::Synthetic), 2);
    EXPECT_EQ(tr.baseline.stats.num_ooms, 23);
    EXPECT_EQ(tr.at(tr.best).stats.num_ooms, 0);
    const std::size_t p = best_plugin(tr);
    ASSERT_NE(p, kRecorded);
    EXPECT_EQ(tr.results[p].conf, "policy:cachet");
    EXPECT_EQ(tr.results[p].stats.num_ooms, 0);
  }
}

// PyTorch's snapshot records no cap, but its out-of-memory entry records the device's free
// bytes: 66.55 GiB free for a 1.54 GiB request (PyTorch's message) is a cap, and cachet asks for it.
TEST(Tune, OomEntryRevealsACapAndTheProcessMemory) {
  LoadedTrace lt = load_trace(kOomPickle);
  EXPECT_TRUE(lt.memory.oom_seen);
  EXPECT_TRUE(lt.memory.cap_in_force);
  EXPECT_EQ(lt.memory.source, DeviceMemoryFacts::Source::OomEntry);
  // Dumped in the OutOfMemoryError handler: the segments at the end are those at the OOM.
  EXPECT_EQ(lt.memory.oom_reserved, static_cast<Bytes>(kOomPeakReserved));
  EXPECT_EQ(lt.end_reserved, static_cast<Bytes>(kOomPeakReserved));
  // "GPU 0 has a total capacity of 79.18 GiB of which 66.55 GiB is free"
  EXPECT_NEAR(static_cast<double>(lt.memory.oom_free) / static_cast<double>(GiB), 66.55, 0.005);
  EXPECT_EQ(lt.run.total_memory, lt.memory.oom_reserved + lt.memory.oom_free);
  EXPECT_LT(lt.run.total_memory, static_cast<Bytes>(79.18 * GiB));
  const std::string e = missing_cap_error(lt);
  EXPECT_NE(e.find("--cap"), std::string::npos) << e;
  EXPECT_NE(e.find("66.55 GiB free"), std::string::npos) << e;
  // With the cap given, nothing is missing, and the replay is PyTorch's run: its peak, 1 OOM, 2 retries.
  LoadedTrace capped = load_trace(kOomPickle, LoadOptions{.cap = kOomCap});
  EXPECT_EQ(missing_cap_error(capped), "");
  const ReplayResult r = cachet::replay::replay(capped.trace, capped.run.config, recorded_options(capped, AddressMode::Recorded));
  EXPECT_TRUE(r.recorded_addresses) << r.note;
  EXPECT_EQ(r.peak_reserved(), kOomPeakReserved);
  EXPECT_EQ(r.stats.num_ooms, 1);
  EXPECT_EQ(r.stats.num_alloc_retries, 2);
}

// A device that was full (free below the request) is no cap: what the process could get is
// reserved + free, and the replay runs out of memory where the recording did.
TEST(Tune, OomEntryWithoutACapGivesTheDeviceMemory) {
  const std::string p = ::testing::TempDir() + "/full_device.json";
  {
    std::ofstream f(p);
    f << R"({"segments": [], "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": ""}, "device_traces": [[)"
      << R"({"action": "segment_alloc", "addr": 140000000000000, "size": 20971520, "stream": 0},)"
      << R"({"action": "alloc", "addr": 140000000000000, "size": 20971520, "stream": 0},)"
      << R"({"action": "oom", "device_free": 10485760, "size": 20971520, "stream": 0})"
      << "]]}";
  }
  LoadedTrace lt = load_trace(p);
  EXPECT_FALSE(lt.memory.cap_in_force);
  EXPECT_EQ(lt.memory.source, DeviceMemoryFacts::Source::OomEntry);
  EXPECT_EQ(lt.run.total_memory, 30 * MiB);  // 20 MiB reserved + 10 MiB free
  EXPECT_EQ(missing_cap_error(lt), "");
  const ReplayResult r = cachet::replay::replay(lt.trace, lt.run.config, recorded_options(lt, AddressMode::Synthetic));
  EXPECT_EQ(r.stats.num_ooms, 1);
  EXPECT_NE(device_memory_line(lt, 0).find("out-of-memory entry"), std::string::npos);
  // Nothing tells the size of mlp_train's device: no limit, and said.
  LoadedTrace none = load_trace(kData + "snapshots/mlp_train.pickle.gz");
  EXPECT_EQ(none.memory.source, DeviceMemoryFacts::Source::Unknown);
  EXPECT_EQ(none.run.total_memory, kNoDeviceLimit);
  EXPECT_NE(device_memory_line(none, GiB).find("--device-memory"), std::string::npos);
}

// memory_needed: the smallest limit, to 2 MiB, with no OOM; 2 MiB less fails. PyTorch failed at
// 12 GiB, so it is more.
TEST(Tune, MemoryNeededIsTheSmallestCapWithoutOom) {
  LoadedTrace lt = load_trace(kOomPickle, LoadOptions{.cap = kOomCap});
  const ReplayOptions o = recorded_options(lt, AddressMode::Synthetic);
  unsigned replays = 0;
  const auto need = memory_needed(lt.trace, lt.run.config, o, &replays);
  ASSERT_TRUE(need);
  EXPECT_EQ(*need % (2 * MiB), 0u);
  EXPECT_GT(*need, kOomCap);
  EXPECT_LT(replays, 40u);
  ReplayOptions at = o;
  at.cap = *need;
  EXPECT_EQ(cachet::replay::replay(lt.trace, lt.run.config, at).stats.num_ooms, 0);
  at.cap = *need - 2 * MiB;
  EXPECT_GT(cachet::replay::replay(lt.trace, lt.run.config, at).stats.num_ooms, 0);
}

// A run is not monotone in the cap: the side-stream MLP recorded uncapped on the H200
// (snapshots/capped/side_stream_mlp.native, PyTorch's peak reserved 2539651072 bytes in its .json)
// fits under a 2,164 MiB cap and fails under 2,200 MiB (the allocator frees its cache and retries
// at other moments). memory_needed is the smallest cap from which every larger cap fits: above
// 2,200 MiB, 2 MiB less fails, and every 2 MiB step from it up to PyTorch's uncapped peak (above
// which no cap is reached) fits. (ResNet-18's resnet18_cxx, once found non-monotone, is monotone
// in the replay now: it fits from 1,550 MiB up.)
TEST(Tune, MemoryNeededIsTheCapFromWhichEveryLargerCapFits) {
  LoadedTrace lt = load_trace(kData + "snapshots/capped/side_stream_mlp.native.pickle.gz");
  ReplayOptions o = recorded_options(lt, AddressMode::Recorded);
  auto ooms = [&](Bytes cap) {
    ReplayOptions at = o;
    at.cap = cap;
    at.device_memory = std::max(at.device_memory, cap);
    return cachet::replay::replay(lt.trace, lt.run.config, at).stats.num_ooms;
  };
  ASSERT_EQ(ooms(2164 * MiB), 0);
  ASSERT_GT(ooms(2200 * MiB), 0);
  const auto need = memory_needed(lt.trace, lt.run.config, o);
  ASSERT_TRUE(need);
  EXPECT_EQ(*need % (2 * MiB), 0u);
  EXPECT_GT(*need, 2200 * MiB);
  EXPECT_GT(ooms(*need - 2 * MiB), 0);
  // The same from a cap it fits under (the verdict of `replay --cap 2164M`): a bisection down
  // from there would answer a cap under 2,164 MiB.
  ReplayOptions at = o;
  at.cap = 2164 * MiB;
  EXPECT_EQ(memory_needed(lt.trace, lt.run.config, at), need);
  constexpr Bytes kPeak = 2539651072;  // side_stream_mlp.native.json: "peak_reserved"
  for (Bytes cap = *need; cap <= kPeak + 2 * MiB; cap += 2 * MiB) EXPECT_EQ(ooms(cap), 0) << cap;
}

// With garbage_collection_threshold the walk strides (about kGcProbes caps up to peak / threshold)
// and walks every 2 MiB above the first cap that fails. res_pools_gc (oracle-h100, threshold 0.6 in
// its recorded configuration) has a pocket of failing caps between 2.10 and 2.40 GiB: the walk that
// replayed every 2 MiB step (the gc path before the stride) answered 2,579,496,960 bytes; a stride
// of 1/24 of the range stepped over the pocket and answered 2,252,341,248.
TEST(Tune, MemoryNeededWithGarbageCollectionFindsTheFailingPocket) {
  LoadedTrace lt = load_trace(std::string(CACHET_TEST_DATA) + "/oracle-h100/results/res_pools_gc.json.gz");
  ASSERT_GT(lt.run.config.garbage_collection_threshold, 0.0);
  ReplayOptions o = recorded_options(lt, AddressMode::Recorded);
  const auto need = memory_needed(lt.trace, lt.run.config, o);
  ASSERT_TRUE(need);
  EXPECT_EQ(*need, 2579496960u);
  ReplayOptions at = o;
  at.cap = *need - 2 * MiB;
  at.device_memory = std::max(at.device_memory, at.cap);
  EXPECT_GT(cachet::replay::replay(lt.trace, lt.run.config, at).stats.num_ooms, 0);
}

TEST(Tune, ChangeInPlainWords) {
  ReplayResult from = fake(3, 14 * GiB, 150), to = fake(0, 13 * GiB, 100);
  from.stats.num_alloc_retries = 3;
  const std::string s = describe_change(from, to);
  EXPECT_EQ(s, "All 3 requests that ran out of memory succeed. Peak reserved 13.00 GiB instead of 14.00 GiB "
               "(7.1% less); retries 0 instead of 3; device calls 100 instead of 150.");
  EXPECT_TRUE(plugin_clearly_better(fake(0, 9 * GiB, 0), fake(0, 10 * GiB, 0)));   // 10% less
  EXPECT_FALSE(plugin_clearly_better(fake(0, 95 * GiB / 10, 0), fake(0, 10 * GiB, 0)));  // 5% less
  EXPECT_TRUE(plugin_clearly_better(fake(0, 12 * GiB, 0), fake(1, 10 * GiB, 0)));  // fewer OOMs
  // Under a 10 GiB cap, 5% less is enough when it leaves 256 MiB where the native pick leaves less.
  EXPECT_TRUE(plugin_clearly_better(fake(0, 95 * GiB / 10, 0), fake(0, 10 * GiB - 100 * MiB, 0), 10 * GiB));
  EXPECT_FALSE(plugin_clearly_better(fake(0, 95 * GiB / 10, 0), fake(0, 10 * GiB - 300 * MiB, 0), 10 * GiB));
  EXPECT_FALSE(plugin_clearly_better(fake(0, 10 * GiB - 200 * MiB, 0), fake(0, 10 * GiB - 100 * MiB, 0), 10 * GiB));
}

}  // namespace

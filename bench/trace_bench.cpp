// bench/trace_bench.cpp: trace throughput (project issue 7), under "Trace/":
//
//   Trace/parse/gpt2_train           io::parse_trace of the gpt2_train workload trace, from its
//                                    gzip bytes in memory (gunzip + JSON)   counter events_per_s
//   Trace/replay/gpt2_train          replay::replay of the prepared trace through the production
//                                    allocator (host backend, recorded config), one thread;
//                                    target >= 5 million events/s           counter events_per_s
//   Trace/tune/300k/50configs        replay::tune of 50 configurations over a 300,000-event trace
//                                    (the shared workload traces joined end to end) on 2 worker
//                                    threads; target < 10 s                 counter configs_per_s
//
// The replay benchmarks exist only when the replay library (tools/replay, cachet_replay) is
// built (CACHET_HAVE_REPLAY); bench/README.md says so.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <exception>
#include <stdexcept>
#include <string>
#include <vector>

#include "cachet/io/file.h"
#include "cachet/io/trace_reader.h"

#ifdef CACHET_HAVE_REPLAY
#include "cachet/replay/replay.h"
#include "cachet/replay/tune.h"
#endif

namespace cachet::bench {

void register_trace_benchmarks();

namespace {

const std::string kWorkloads = std::string(CACHET_TEST_DATA) + "/oracle/workloads/";

void bm_parse(benchmark::State& state, const std::string& file) {
  std::string bytes;
  std::size_t events = 0;
  try {
    // Raw file bytes (still gzip): the timed parse includes gunzip, as reading a file does.
    bytes = io::read_file(file);
    events = io::parse_trace(bytes, file).event_count();
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
    return;
  }
  for (auto _ : state) {
    io::TraceFile t = io::parse_trace(bytes, file);
    benchmark::DoNotOptimize(t.devices.data());
  }
  state.counters["events"] = static_cast<double>(events);
  state.counters["events_per_s"] = benchmark::Counter(
      static_cast<double>(events) * static_cast<double>(state.iterations()),
      benchmark::Counter::kIsRate);
  state.SetBytesProcessed(static_cast<std::int64_t>(bytes.size()) * state.iterations());
}

#ifdef CACHET_HAVE_REPLAY

void bm_replay(benchmark::State& state, const std::string& file) {
  replay::LoadedTrace lt;
  Config config;
  replay::ReplayOptions opts;
  try {
    lt = replay::load_trace(file);
    config = lt.recorded_config.value_or(Config{});
    opts = replay::recorded_options(lt, replay::AddressMode::Synthetic);
    (void)replay::replay(lt.trace, config, opts);  // warm the caches once
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
    return;
  }
  for (auto _ : state) {
    replay::ReplayResult r = replay::replay(lt.trace, config, opts);
    benchmark::DoNotOptimize(r.stats);
  }
  const auto events = static_cast<double>(lt.trace.events);
  state.counters["events"] = events;
  state.counters["ops"] = static_cast<double>(lt.trace.ops.size());
  state.counters["events_per_s"] = benchmark::Counter(
      events * static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
}

// The workload traces joined end to end until `min_events` trace events: each piece's ops are
// renumbered (slots, pseudo streams, event indices) and its blocks still live at its end are
// freed before the next piece starts, so every piece starts from the same live set.
replay::Trace join_traces(const std::vector<const replay::Trace*>& pieces, std::uint64_t min_events) {
  replay::Trace out;
  out.name = "joined";
  std::vector<bool> live;
  while (out.events < min_events) {
    for (const replay::Trace* p : pieces) {
      if (out.events >= min_events) break;
      const std::uint32_t slot0 = out.slots;
      const std::uint32_t aux0 = out.pseudo_streams;
      const auto event0 = static_cast<std::uint32_t>(out.events);
      live.assign(p->slots, false);
      for (replay::Op op : p->ops) {
        if (op.kind == replay::OpKind::Alloc) live[op.slot] = true;
        if (op.kind == replay::OpKind::Free || op.kind == replay::OpKind::FreePending) {
          live[op.slot] = false;
        }
        op.slot += slot0;
        op.aux += aux0;
        op.event += event0;
        out.ops.push_back(op);
      }
      for (std::uint32_t s = 0; s < p->slots; ++s) {
        if (!live[s]) continue;
        replay::Op f;
        f.kind = replay::OpKind::Free;
        f.slot = s + slot0;
        f.event = event0 + static_cast<std::uint32_t>(p->events);
        out.ops.push_back(f);
      }
      out.slots += p->slots;
      out.pseudo_streams += p->pseudo_streams;
      out.events += p->events;
    }
  }
  return out;
}

constexpr std::uint64_t kTuneEvents = 300'000;
constexpr std::size_t kTuneConfigs = 50;
constexpr unsigned kTuneThreads = 2;

void bm_tune(benchmark::State& state) {
  std::vector<replay::LoadedTrace> loaded;
  replay::Trace joined;
  std::vector<replay::TuneCandidate> space;
  replay::ReplayOptions opts;
  try {
    for (const char* w : {"gpt2_train", "resnet50_train", "gpt2_train_exp", "resnet50_train_exp"}) {
      loaded.push_back(replay::load_trace(kWorkloads + w + ".trace.json.gz"));
    }
    std::vector<const replay::Trace*> pieces;
    for (const replay::LoadedTrace& lt : loaded) pieces.push_back(&lt.trace);
    joined = join_traces(pieces, kTuneEvents);
    const std::vector<replay::TuneCandidate> all = replay::tune_space(Config{}, false);
    if (all.empty()) throw std::runtime_error("tune_space is empty");
    for (std::size_t i = 0; space.size() < kTuneConfigs; ++i) space.push_back(all[i % all.size()]);
    state.counters["space"] = static_cast<double>(all.size());
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
    return;
  }
  for (auto _ : state) {
    replay::TuneResult r = replay::tune(joined, Config{}, space, opts, kTuneThreads);
    benchmark::DoNotOptimize(r.results.data());
  }
  const auto events = static_cast<double>(joined.events);
  state.counters["events"] = events;
  state.counters["configs"] = static_cast<double>(space.size());
  state.counters["configs_per_s"] = benchmark::Counter(
      static_cast<double>(space.size()) * static_cast<double>(state.iterations()),
      benchmark::Counter::kIsRate);
  state.counters["events_per_s"] = benchmark::Counter(
      events * static_cast<double>(space.size() + 1) * static_cast<double>(state.iterations()),
      benchmark::Counter::kIsRate);
}

#endif  // CACHET_HAVE_REPLAY

}  // namespace

void register_trace_benchmarks() {
  const std::string gpt2 = kWorkloads + "gpt2_train.trace.json.gz";
  benchmark::RegisterBenchmark("Trace/parse/gpt2_train",
                               [gpt2](benchmark::State& s) { bm_parse(s, gpt2); })
      ->Unit(benchmark::kMillisecond)->UseRealTime();
#ifdef CACHET_HAVE_REPLAY
  benchmark::RegisterBenchmark("Trace/replay/gpt2_train",
                               [gpt2](benchmark::State& s) { bm_replay(s, gpt2); })
      ->Unit(benchmark::kMillisecond)->UseRealTime();
  benchmark::RegisterBenchmark("Trace/tune/300k/50configs", bm_tune)
      ->Unit(benchmark::kSecond)->Iterations(1)->UseRealTime();
#endif
}

}  // namespace cachet::bench

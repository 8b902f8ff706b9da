// bench/bench_main.cpp: cachet_bench. The allocation patterns, run for every peer that this
// build and this machine have, side by side in one run (names "<Peer>/<pattern>..."):
//
//   pair/512B, pair/1MiB, pair/64MiB    same-size alloc+free pairs        counter ns_per_pair
//   window/1B-1MiB/64live               random window, 64 live blocks     counter ns_per_op
//   window/512B-256MiB/128live          random window, 128 live blocks    counter ns_per_op
//   pair_mt/1MiB (threads:1,2,4,8)      1 MiB pairs on N threads sharing  counter ns_per_pair
//                                       one allocator (aggregate: wall time / all pairs)
//
// A window op is one call (an allocate or a free); each iteration frees a randomly chosen live
// block and allocates a new size in its place (2 ops). Sizes are log-uniform over the range
// and come, with the victims, from a fixed-seed sequence (splitmix64, seed 0x5eed) that is the
// same for every peer. Warm-up (the first allocations, the window's fill) happens before the
// timed loop; cached memory is given back (trim) after it.
//
// Counters are in nanoseconds: Counter(ops * 1e-9, kIsRate | kInvert) is seconds * 1e9 / ops,
// with seconds the real time (UseRealTime; with threads, the threads' mean wall time, and the
// ops summed over threads: the aggregate figure). bench/report.py turns --benchmark_out JSON
// into a markdown table with the ratios cachet/PyTorch and cachet/cudaMallocAsync, and a second
// one with the host backend's two policies side by side (Host: policy:pytorch,
// HostCachetPolicy: policy:cachet; same patterns, same sequences, same run).
//
// Trace benchmarks (trace_bench.cpp) register themselves under "Trace/".
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstdlib>
#include <exception>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "hot_path.h"
#include "peers.h"

namespace cachet::bench {

void register_trace_benchmarks();  // trace_bench.cpp

namespace {

using PeerFn = Peer* (*)(std::string*);

struct PeerEntry {
  const char* name;
  PeerFn get;
};

constexpr PeerEntry kPeers[] = {
    {"Cachet", cachet_cuda_peer},
    {"PyTorch", torch_peer},
    {"CudaMallocAsync", cuda_malloc_async_peer},
    {"Host", host_peer},                           // host backend, policy:pytorch
    {"HostCachetPolicy", host_cachet_policy_peer},  // host backend, policy:cachet
};

// The peer, or nullptr after SkipWithError (the loop then does not run).
Peer* peer_or_skip(benchmark::State& state, PeerFn get) {
  std::string why;
  Peer* p = get(&why);
  if (p == nullptr) state.SkipWithError(("peer unavailable: " + why).c_str());
  return p;
}

void set_ns_counter(benchmark::State& state, const char* name, double ops_per_iteration) {
  state.counters[name] = benchmark::Counter(
      static_cast<double>(state.iterations()) * ops_per_iteration * 1e-9,
      benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}

// --- same-size pairs ------------------------------------------------------------------------

void run_pairs(benchmark::State& state, PeerFn get, std::size_t size) {
  Peer* p = peer_or_skip(state, get);
  if (p == nullptr) return;
  try {
    p->free(p->alloc(size));  // warm: the segment exists before timing
    for (auto _ : state) {
      void* ptr = p->alloc(size);
      benchmark::DoNotOptimize(ptr);
      p->free(ptr);
    }
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
    return;
  }
  set_ns_counter(state, "ns_per_pair", 1.0);
  if (state.thread_index() == 0 && state.threads() == 1) p->trim();
}

// --- random windows -------------------------------------------------------------------------

using hot_path::kSeqLen;
using hot_path::make_window_seq;  // the sequence (bench/hot_path.h), shared with the A/B tools
using hot_path::WindowSeq;

void run_window(benchmark::State& state, PeerFn get, const WindowSeq& seq, std::uint32_t live) {
  Peer* p = peer_or_skip(state, get);
  if (p == nullptr) return;
  std::vector<void*> slots(live, nullptr);
  std::size_t k = 0;
  try {
    for (std::uint32_t i = 0; i < live; ++i) slots[i] = p->alloc(seq.sizes[k++]);
    for (auto _ : state) {
      const std::size_t j = k & (kSeqLen - 1);
      void*& slot = slots[seq.victims[j]];
      p->free(slot);
      slot = p->alloc(seq.sizes[j]);
      ++k;
    }
    for (void* s : slots) p->free(s);
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
    return;
  }
  set_ns_counter(state, "ns_per_op", 2.0);
  p->trim();
}

// --- registration ---------------------------------------------------------------------------

void register_patterns() {
  static const WindowSeq small = make_window_seq(1, 1 << 20, 64);
  static const WindowSeq large = make_window_seq(512, std::size_t{256} << 20, 128);
  struct PairSize {
    const char* label;
    std::size_t size;
  };
  constexpr PairSize kPairs[] = {{"512B", 512}, {"1MiB", 1 << 20}, {"64MiB", 64 << 20}};

  for (const PeerEntry& peer : kPeers) {
    const std::string n = peer.name;
    const PeerFn get = peer.get;
    for (const PairSize& ps : kPairs) {
      const std::size_t size = ps.size;
      benchmark::RegisterBenchmark((n + "/pair/" + ps.label).c_str(),
                                   [get, size](benchmark::State& s) { run_pairs(s, get, size); })
          ->UseRealTime();
    }
    benchmark::RegisterBenchmark((n + "/window/1B-1MiB/64live").c_str(),
                                 [get](benchmark::State& s) { run_window(s, get, small, 64); })
        ->UseRealTime();
    benchmark::RegisterBenchmark((n + "/window/512B-256MiB/128live").c_str(),
                                 [get](benchmark::State& s) { run_window(s, get, large, 128); })
        ->UseRealTime();
    benchmark::RegisterBenchmark((n + "/pair_mt/1MiB").c_str(),
                                 [get](benchmark::State& s) { run_pairs(s, get, 1 << 20); })
        ->Threads(1)->Threads(2)->Threads(4)->Threads(8)->UseRealTime();
  }
}

// Google Benchmark 1.8 wants --benchmark_min_time=<x>s (a bare number still works there, with a
// deprecation warning); 1.7 takes only a bare number of seconds. Accept both spellings on both.
std::string normalise_arg(std::string_view a) {
  constexpr std::string_view kMinTime = "--benchmark_min_time=";
  if (a.substr(0, kMinTime.size()) != kMinTime) return std::string(a);
  std::string v(a.substr(kMinTime.size()));
#if CACHET_BENCHMARK_VERSION_MAJOR > 1 || \
    (CACHET_BENCHMARK_VERSION_MAJOR == 1 && CACHET_BENCHMARK_VERSION_MINOR >= 8)
  if (!v.empty() && v.back() != 's' && v.back() != 'x') v += 's';
#else
  if (!v.empty() && v.back() == 's') v.pop_back();
#endif
  return std::string(kMinTime) + v;
}

}  // namespace
}  // namespace cachet::bench

int main(int argc, char** argv) {
  using namespace cachet::bench;
  std::vector<std::string> args;
  args.reserve(static_cast<std::size_t>(argc));
  for (int i = 0; i < argc; ++i) args.push_back(normalise_arg(argv[i]));
  std::vector<char*> ptrs;
  for (std::string& a : args) ptrs.push_back(a.data());
  ptrs.push_back(nullptr);
  int n = argc;

  const std::string dev = cuda_device_name();
  benchmark::AddCustomContext("cachet_cuda_device", dev.empty() ? "none" : dev);
#ifdef CACHET_HAVE_CUDA
  benchmark::AddCustomContext("cachet_cuda_build", "yes");
#else
  benchmark::AddCustomContext("cachet_cuda_build", "no");
#endif
#ifdef CACHET_HAVE_TORCH
  benchmark::AddCustomContext("cachet_torch_build", "yes");
#else
  benchmark::AddCustomContext("cachet_torch_build", "no");
#endif

  register_patterns();
  register_trace_benchmarks();
  benchmark::Initialize(&n, ptrs.data());
  if (benchmark::ReportUnrecognizedArguments(n, ptrs.data())) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

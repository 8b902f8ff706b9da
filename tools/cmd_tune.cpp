// `cachet tune TRACE [--cap BYTES] [--threads N] [--json]`: replays the trace under a space of
// configurations (max_split_size_mb, roundup_power2_divisions, garbage_collection_threshold
// with a cap, expandable_segments, large_segment_size_mb; and cachet's own policy once,
// policy:cachet) on worker threads and recommends the string with the lowest peak reserved and
// no new OOMs, with its gain over the recorded one. policy:cachet is recommended as
// CACHET_ALLOC_CONF (PyTorch rejects the key in PYTORCH_CUDA_ALLOC_CONF).
#if __has_include("cachet/replay/replay.h")
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <numeric>
#include <string>
#include <thread>

#include "cachet/io/file.h"
#include "cachet/replay/replay.h"
#include "cachet/replay/report.h"
#include "command.h"

namespace cachet::cli {
namespace {

struct Args {
  std::string path;
  std::string cap;
  std::string device_memory;
  unsigned threads = 2;
  std::size_t top = 10;
  bool json = false;
};

int run_tune(const Args& a) {
  using namespace cachet::replay;
  std::optional<Bytes> mem, cap;
  if (!a.device_memory.empty() && !(mem = parse_bytes(a.device_memory))) {
    std::fprintf(stderr, "cachet tune: --device-memory: not a size: '%s'\n", a.device_memory.c_str());
    return kExitBadInput;
  }
  if (!a.cap.empty() && !(cap = parse_bytes(a.cap))) {
    std::fprintf(stderr, "cachet tune: --cap: not a size: '%s'\n", a.cap.c_str());
    return kExitBadInput;
  }
  LoadedTrace lt;
  try {
    lt = load_trace(a.path, mem);
  } catch (const io::ReadError& e) {
    std::fprintf(stderr, "cachet tune: %s\n", e.what());
    return kExitBadInput;
  }
  if (!lt.device_note.empty()) std::fprintf(stderr, "cachet tune: %s\n", lt.device_note.c_str());
  if (!lt.config_note.empty()) std::fprintf(stderr, "cachet tune: %s\n", lt.config_note.c_str());
  ReplayOptions o = recorded_options(lt, AddressMode::Synthetic);
  if (cap && (*cap == 0 || *cap > lt.run.total_memory)) {  // set_per_process_memory_fraction takes (0, 1]
    const std::string whence = mem                       ? "--device-memory"
                               : lt.file.total_memory ? "recorded beside the trace"
                                                      : "assumed: the trace does not record it";
    std::fprintf(stderr, "cachet tune: --cap %s: %s\n", a.cap.c_str(),
                 *cap == 0 ? "a cap of 0 bytes; leave --cap out for no cap"
                           : fmt::format("more than the device's memory ({}, {}); give a smaller cap, or the "
                                         "device's memory with --device-memory",
                                         human_bytes(static_cast<std::int64_t>(lt.run.total_memory)), whence)
                                 .c_str());
    return kExitBadInput;
  }
  if (cap) o.cap = *cap;
  const auto space = tune_space(lt.run.config, o.cap > 0);
  Progress progress("tuning");
  TuneResult tr;
  try {
    tr = tune(lt.trace, lt.run.config, space, o, std::max(1u, a.threads),
              [&](std::size_t done, std::size_t total) { progress.update(done, total); });
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cachet tune: %s\n", e.what());
    return kExitBadInput;
  }
  std::vector<std::size_t> order(tr.results.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](std::size_t x, std::size_t y) {
    const auto& rx = tr.results[x];
    const auto& ry = tr.results[y];
    const bool okx = rx.stats.num_ooms <= tr.baseline.stats.num_ooms && rx.failed_allocs <= tr.baseline.failed_allocs;
    const bool oky = ry.stats.num_ooms <= tr.baseline.stats.num_ooms && ry.failed_allocs <= tr.baseline.failed_allocs;
    if (okx != oky) return okx;
    return rx.peak_reserved() < ry.peak_reserved();
  });
  const bool found = tr.best != static_cast<std::size_t>(-1);
  if (a.json) {
    std::vector<const ReplayResult*> rows{&tr.baseline};
    for (std::size_t i : order) rows.push_back(&tr.results[i]);
    std::string j = results_json(rows);
    std::fputs(fmt::format("{{\"baseline\": 0, \"best\": {}, \"results\": {}}}\n",
                           found ? static_cast<long long>(std::find(order.begin(), order.end(), tr.best) - order.begin()) + 1 : -1,
                           j)
                   .c_str(),
               stdout);
    return kExitOk;
  }
  std::string out;
  out += fmt::format("trace: {} ({} events); {} configurations replayed on {} threads\n", lt.file.name, lt.trace.events,
                     space.size() + 1, a.threads);
  if (o.cap) out += fmt::format("memory cap: {}\n", human_bytes(static_cast<std::int64_t>(o.cap)));
  if (auto note = trace_note(lt.trace); !note.empty()) out += note + "\n";
  out += "\nrecorded configuration:\n";
  out += results_table({&tr.baseline});
  out += fmt::format("\nbest {} of {} (no new OOMs first, by peak reserved):\n", std::min(a.top, order.size()), order.size());
  std::vector<const ReplayResult*> rows;
  for (std::size_t k = 0; k < order.size() && k < a.top; ++k) rows.push_back(&tr.results[order[k]]);
  out += results_table(rows);
  // The cachet policy's row, when the ranking above did not show it.
  for (std::size_t k = a.top; k < order.size(); ++k)
    if (tr.results[order[k]].config.policy == Policy::Cachet) {
      out += fmt::format("\ncachet policy (rank {} of {}):\n", k + 1, order.size());
      out += results_table({&tr.results[order[k]]});
    }
  if (found) {
    const ReplayResult& b = tr.results[tr.best];
    const std::int64_t gain = tr.baseline.peak_reserved() - b.peak_reserved();
    out += fmt::format(
        "\nrecommended: {}=\"{}\"\n  peak reserved {} instead of {}: {} less ({:.1f}%), "
        "reserved/allocated {:.3f} instead of {:.3f}, OOMs {} (recorded configuration: {})\n",
        b.config.policy == Policy::Cachet ? "CACHET_ALLOC_CONF" : "PYTORCH_CUDA_ALLOC_CONF", b.conf,
        human_bytes(b.peak_reserved()), human_bytes(tr.baseline.peak_reserved()), human_bytes(gain),
        tr.baseline.peak_reserved() ? 100.0 * static_cast<double>(gain) / static_cast<double>(tr.baseline.peak_reserved()) : 0.0,
        b.fragmentation(), tr.baseline.fragmentation(), b.stats.num_ooms, tr.baseline.stats.num_ooms);
  } else {
    out += "\nrecommended: keep the recorded configuration (no configuration searched reserves less without new OOMs)\n";
  }
  std::fputs(out.c_str(), stdout);
  return kExitOk;
}

Runner setup(CLI::App& sub) {
  auto a = std::make_shared<Args>();
  sub.add_option("TRACE", a->path, "PyTorch memory snapshot (pickle or JSON) or an oracle recording")->required();
  sub.add_option("--cap", a->cap,
                 "memory cap in bytes (set_per_process_memory_fraction; suffixes K/M/G/T ok); also searches "
                 "garbage_collection_threshold");
  sub.add_option("--device-memory", a->device_memory, "device memory (default: beside the trace, else 80 GiB)");
  sub.add_option("--threads", a->threads, "worker threads (default 2)");
  sub.add_option("--top", a->top, "rows of the ranking to print (default 10)");
  sub.add_flag("--json", a->json, "print JSON: {baseline, best, results: [...]}");
  return [a] { return run_tune(*a); };
}

[[maybe_unused]] const bool registered = register_command(
    {"tune", "Search allocator configurations for the lowest peak reserved memory on a trace", setup});

}  // namespace
}  // namespace cachet::cli
#endif

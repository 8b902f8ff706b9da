// `cachet tune TRACE [--cap BYTES] [--device-memory BYTES] [--threads N] [--top N] [--json]`:
// replays the trace under the recorded configuration and a space of others (tune_space) on
// worker threads, ranks them (fewest out-of-memory errors, then peak reserved, then device
// calls: cachet/replay/tune.h) and names two answers: the best configuration PyTorch's own
// allocator accepts (PYTORCH_CUDA_ALLOC_CONF) and, when clearly better, cachet's plug-in
// (CACHET_ALLOC_CONF). When nothing avoids the out-of-memory errors it says how much memory the
// recommended configuration needs (memory_needed). The recommendation and the verdict are
// cachet/replay/recommend.h's, the same explain, report and predict give. Exit 0, or 2 on bad input.
#if __has_include("cachet/replay/replay.h")
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>

#include "cachet/io/file.h"
#include "cachet/replay/recommend.h"
#include "cachet/replay/replay.h"
#include "cachet/replay/report.h"
#include "cachet/replay/tune.h"
#include "command.h"
#include "trace_input.h"

namespace cachet::cli {
namespace {

using namespace cachet::replay;

struct Args {
  std::string path;
  std::string cap;
  std::string fraction;  // --fraction F: the cap is F x the device memory
  std::string device_memory;
  std::optional<std::string> conf;  // --conf: start from it in place of the recorded configuration
  int threads = 2;
  std::size_t top = 10;
  bool json = false;
};

// What tune decided, beside the TuneResult: the one recommendation (cachet/replay/recommend.h)
// and the verdict on the recorded configuration.
struct Answer {
  Recommendation rec;
  Verdict verdict;
};

const char* source_name(DeviceMemoryFacts::Source s) {
  switch (s) {
    case DeviceMemoryFacts::Source::Option: return "option";
    case DeviceMemoryFacts::Source::Recorded: return "recorded";
    case DeviceMemoryFacts::Source::OomEntry: return "oom_entry";
    case DeviceMemoryFacts::Source::Unknown: break;
  }
  return "unknown";
}

std::string to_json(const LoadedTrace& lt, const ReplayOptions& o, const TuneResult& tr, const Answer& an) {
  // results: [0] the recorded configuration, then the ranking.
  std::vector<const ReplayResult*> rows{&tr.baseline};
  std::vector<long long> pos(tr.results.size(), -1);
  for (std::size_t k = 0; k < tr.ranking.size(); ++k) {
    pos[tr.ranking[k]] = static_cast<long long>(k) + 1;
    rows.push_back(&tr.results[tr.ranking[k]]);
  }
  auto idx = [&](std::size_t i) { return i == kRecorded ? 0LL : pos[i]; };
  auto num = [](const std::optional<Bytes>& b) { return b ? std::to_string(*b) : std::string("null"); };
  return fmt::format(
      "{{\"baseline\": 0, \"best\": {}, \"best_native\": {}, \"best_plugin\": {}, \"recommend_plugin\": {}, "
      "\"memory_needed\": {}, \"memory_needed_native\": {}, \"cap\": {}, \"device_memory\": {}, "
      "\"device_memory_source\": \"{}\", \"pick\": {}, \"only_plugin_avoids\": {}, \"fewest_keys\": {}, "
      "\"verdict\": {}, \"results\": {}}}\n",
      idx(tr.best), idx(tr.best_native), an.rec.plugin == kRecorded ? -1LL : idx(an.rec.plugin),
      an.rec.recommend_plugin ? "true" : "false", num(an.rec.needed_best), num(an.rec.needed_native), o.cap,
      o.device_memory, source_name(lt.memory.source), idx(an.rec.pick), an.rec.only_plugin_avoids ? "true" : "false",
      an.rec.fewest_keys == kRecorded ? -1LL : idx(an.rec.fewest_keys), verdict_json(an.verdict), results_json(rows));
}

std::string to_text(const Args& a, const LoadedTrace& lt, const ReplayOptions& o, const TuneResult& tr,
                    const Answer& an) {
  const std::size_t n = tr.results.size();
  std::string out;
  out += fmt::format("trace: {} ({} events)\n", lt.file.name, lt.trace.events);
  out += device_memory_line(lt, o.cap) + "\n";
  if (o.cap) out += fmt::format("memory cap: {} (set_per_process_memory_fraction)\n", human_bytes_exact(o.cap));
  if (auto note = trace_note(lt.trace); !note.empty()) out += note + "\n";
  if (auto line = failed_request_line(lt); !line.empty()) out += line + "\n";
  out += fmt::format("{} configurations replayed on {} threads: the recorded one and {} candidates\n", n + 1,
                     a.threads, n);
  const char* start = an.rec.from_given ? "given configuration (--conf)" : "recorded configuration";
  out += fmt::format("\n{}:\n", start) + results_table({&tr.baseline});
  if (!tr.baseline.note.empty()) out += fmt::format("note ({}): {}\n", start, tr.baseline.note);
  if (auto note = recorded_peak_note(lt, tr.baseline, o.cap); !note.empty() && !an.rec.from_given) out += note + "\n";
  const std::size_t shown = std::min(a.top, n);
  out += fmt::format("\nranking, fewest OOMs first, then peak reserved, then device calls ({} of {}):\n", shown, n);
  std::vector<const ReplayResult*> rows;
  std::vector<std::string> ranks;
  for (std::size_t k = 0; k < shown; ++k) {
    rows.push_back(&tr.results[tr.ranking[k]]);
    ranks.push_back(std::to_string(k + 1));
  }
  // The plug-in's row, when the rows above do not show it (none with --top 0).
  for (std::size_t k = shown; k < n && shown > 0; ++k)
    if (tr.ranking[k] == an.rec.plugin) {
      rows.push_back(&tr.results[an.rec.plugin]);
      ranks.push_back(std::to_string(k + 1));
    }
  out += results_table(rows, ranks);

  const std::size_t width = output_width();
  out += "\n" + verdict_text(an.verdict, width);
  if (auto c = oom_end_caveat(lt); !c.empty() && tr.baseline.stats.num_ooms > 0)
    out += "\n" + wrap_text("Caveat: " + c + ".", width, "");
  out += "\n" + recommendation_text(tr, an.rec, o, width);
  return out;
}

int run_tune(const Args& a) {
  std::optional<Bytes> mem, cap;
  if (a.threads < 1) {
    std::fprintf(stderr, "cachet tune: --threads: at least 1, not %d\n", a.threads);
    return kExitBadInput;
  }
  std::string cap_text = a.cap;  // --cap, or --fraction's cap in bytes
  if (!fraction_to_cap("tune", a.path, a.fraction, a.device_memory, cap_text)) return kExitBadInput;
  if (!size_option("tune", "--device-memory", a.device_memory, mem) || !size_option("tune", "--cap", cap_text, cap))
    return kExitBadInput;
  LoadedTrace lt;
  try {
    lt = load_trace(a.path, LoadOptions{.device_memory = mem, .cap = cap});
  } catch (const io::ReadError& e) {
    std::fprintf(stderr, "cachet tune: %s\n", e.what());
    return kExitBadInput;
  }
  if (!lt.device_note.empty()) std::fprintf(stderr, "cachet tune: %s\n", lt.device_note.c_str());
  if (!lt.config_note.empty()) std::fprintf(stderr, "cachet tune: %s\n", lt.config_note.c_str());
  if (auto e = missing_cap_error(lt); !e.empty()) {
    std::fprintf(stderr, "cachet tune: %s\n", e.c_str());
    return kExitBadInput;
  }
  if (!cap_fits("tune", lt, cap_text, cap)) return kExitBadInput;
  ReplayOptions o = recorded_options(lt, AddressMode::Synthetic);
  ReplayOptions ov = recorded_options(lt, AddressMode::Recorded);  // the verdict's, as replay's
  if (!start_from_conf("tune", a.conf, lt, &ov)) return kExitBadInput;
  o.baseline_recorded_addresses = ov.baseline_recorded_addresses;
  const auto space = tune_space(lt.run.config, o.cap > 0);
  Progress progress("tuning");
  TuneResult tr;
  Answer an;
  try {
    tr = tune(lt.trace, lt.run.config, space, o, static_cast<unsigned>(a.threads),
              [&](std::size_t done, std::size_t total) { progress.update(done, total); });
    an.rec = recommend(lt.trace, lt.run.config, tr, o);
    an.rec.from_given = !o.baseline_recorded_addresses;
    an.verdict = judge(lt, tr.baseline, ov, cap_text);
  } catch (const std::exception& e) {
    progress.clear();
    std::fprintf(stderr, "cachet tune: %s\n", e.what());
    return kExitBadInput;
  }
  progress.clear();
  const std::string out = a.json ? to_json(lt, o, tr, an) : fit_lines(to_text(a, lt, o, tr, an), output_width());
  std::fputs(out.c_str(), stdout);
  return kExitOk;
}

Runner setup(CLI::App& sub) {
  auto a = std::make_shared<Args>();
  sub.add_option("TRACE", a->path, "PyTorch memory snapshot (pickle or JSON) or an oracle recording")->required();
  sub.add_option("--cap", a->cap,
                 "memory cap (set_per_process_memory_fraction) in bytes, or with a suffix K/M/G/T (powers of 1024): "
                 "'13.5G'; also searches garbage_collection_threshold");
  sub.add_option("--fraction", a->fraction, kFractionHelp);
  sub.add_option("--conf", a->conf, kStartConfHelp);
  sub.add_option("--device-memory", a->device_memory, kDeviceMemoryHelp);
  sub.add_option("--threads", a->threads, "worker threads, at least 1 (default 2)");
  sub.add_option("--top", a->top, "rows of the ranking to print (default 10)");
  sub.add_flag("--json", a->json,
               "print JSON: {baseline, best, best_native, best_plugin, recommend_plugin, memory_needed, "
               "memory_needed_native, cap, device_memory, device_memory_source, pick, only_plugin_avoids, "
               "fewest_keys, verdict: {...}, results: [...]}");
  return [a] { return run_tune(*a); };
}

[[maybe_unused]] const bool registered = register_command(
    {"tune", "Search allocator configurations: fewest out-of-memory errors, then lowest peak reserved", setup});

}  // namespace
}  // namespace cachet::cli
#endif

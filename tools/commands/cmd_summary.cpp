// `cachet summary TRACE [--conf STRING] [--abbreviated]`: PyTorch's memory_summary() table after
// replaying the trace, at the end and at the moment of peak reserved memory.
#if __has_include("cachet/replay/replay.h")
#include <fmt/format.h>

#include <cstdio>
#include <memory>
#include <string>

#include "cachet/errors.h"
#include "cachet/io/file.h"
#include "cachet/replay/replay.h"
#include "cachet/replay/report.h"
#include "cachet/summary.h"
#include "command.h"
#include "trace_input.h"

namespace cachet::cli {
namespace {

struct Args {
  std::string path;
  std::optional<std::string> conf;
  std::string device_memory;
  std::string cap;
  std::string fraction;  // --fraction F: the cap is F x the device memory
  bool abbreviated = false;
};

int run_summary(const Args& a) {
  using namespace cachet::replay;
  std::string cap_text = a.cap;  // --cap, or --fraction's cap in bytes
  if (!fraction_to_cap("summary", a.path, a.fraction, a.device_memory, cap_text)) return kExitBadInput;
  auto in = load_trace_input("summary", a.path, a.conf, a.device_memory, cap_text, /*draw_without_cap=*/true);
  if (!in) return kExitBadInput;
  const LoadedTrace& lt = in->loaded;
  const Config& config = in->config;
  const bool recorded = in->recorded;
  ReplayOptions o = recorded_options(lt, recorded ? AddressMode::Recorded : AddressMode::Synthetic);
  std::int64_t best = -1;
  std::size_t peak_op = 0;
  DeviceStats at_peak;
  o.observer = [&](std::size_t k, const CachingAllocator& al) {
    DeviceStats s = al.stats();
    if (s.reserved_bytes[0].current > best) {
      best = s.reserved_bytes[0].current;
      peak_op = k;
      at_peak = s;
    }
  };
  ReplayResult r = cachet::replay::replay(lt.trace, config, o);
  std::string out;
  out += fmt::format("trace: {} ({} events), configuration: {}\n", lt.file.name, lt.trace.events,
                     r.conf.empty() ? "(default)" : r.conf);
  // The cap the replay ran under, said (a summary's figures depend on it).
  out += lt.run.cap ? fmt::format("memory cap: {} (set_per_process_memory_fraction, {})\n", human_bytes_exact(lt.run.cap),
                                  !a.fraction.empty() ? "--fraction" : !a.cap.empty() ? "--cap" : "recorded")
                    : std::string("memory cap: none (replayed without one; --cap gives it)\n");
  if (auto note = trace_note(lt.trace); !note.empty()) out += note + "\n";
  if (!r.note.empty()) out += "note: " + r.note + "\n";
  out += "\n== at the end of the trace ==\n";
  out += memory_summary(r.stats, lt.device, a.abbreviated);
  if (best >= 0) {
    const std::uint32_t ev = lt.trace.ops.empty() ? 0 : lt.trace.ops[peak_op].event;
    out += fmt::format("\n== at peak reserved ({}), trace event {} of {} ==\n", human_bytes(best), ev, lt.trace.events);
    out += memory_summary(at_peak, lt.device, a.abbreviated);
  }
  std::fputs(out.c_str(), stdout);
  return kExitOk;
}

Runner setup(CLI::App& sub) {
  auto a = std::make_shared<Args>();
  sub.add_option("TRACE", a->path, "PyTorch memory snapshot (pickle or JSON) or an oracle recording")->required();
  sub.add_option("--conf", a->conf, "configuration (default: the recorded one)");
  sub.add_option("--device-memory", a->device_memory, kDeviceMemoryHelp);
  sub.add_option("--cap", a->cap, "memory cap (set_per_process_memory_fraction), same syntax: '12G'");
  sub.add_option("--fraction", a->fraction, kFractionHelp);
  sub.add_flag("--abbreviated", a->abbreviated, "memory_summary(abbreviated=True)");
  return [a] { return run_summary(*a); };
}

[[maybe_unused]] const bool registered = register_command(
    {"summary", "PyTorch's memory_summary() after replaying a trace, at the end and at the peak", setup});

}  // namespace
}  // namespace cachet::cli
#endif

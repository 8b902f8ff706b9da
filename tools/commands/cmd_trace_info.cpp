// `cachet trace-info TRACE`: what a trace file holds before it is replayed: its format, the
// devices, the recorded allocator settings, total memory, event counts per action and the
// anomalies of a trace recorded mid-run. Exit 2 when the file cannot be read.
#include <fmt/format.h>

#include <cstdio>
#include <string>

#include "cachet/config.h"
#include "cachet/errors.h"
#include "cachet/io/file.h"
#include "cachet/io/trace_reader.h"
#include "cachet/io/trace_stats.h"
#include "cachet/replay/report.h"
#include "command.h"

namespace cachet::cli {
namespace {

// One unit style across the commands (replay, tune, explain): "11.88 GiB = 12750684160 bytes".
std::string gib(Bytes b) { return replay::human_bytes_exact(b); }

int run_trace_info(const std::string& path, bool all_settings) {
  io::TraceFile t;
  try {
    t = io::read_trace(path);
  } catch (const io::ReadError& e) {
    std::fprintf(stderr, "cachet trace-info: %s\n", e.what());
    return kExitBadInput;
  }
  std::string out;
  out += fmt::format("file:          {}\n", t.name);
  out += fmt::format("format:        {}\n", io::to_string(t.format));
  if (!t.sidecar.empty()) out += fmt::format("stats sidecar: {}\n", t.sidecar);
  if (!t.device_name.empty()) out += fmt::format("device name:   {}\n", t.device_name);
  out += fmt::format("total memory:  {}\n", t.total_memory ? gib(*t.total_memory)
                                    : "not recorded (replay and tune take it from an out-of-memory entry, "
                                      "or --device-memory, and say which)");
  if (t.cap) out += fmt::format("memory cap:    {}\n", *t.cap ? gib(*t.cap) : "none");
  out += fmt::format("alloc conf:    {}\n",
                     !t.settings.conf ? "not recorded"
                     : t.settings.conf->empty() ? "(default)"
                                                : "\"" + *t.settings.conf + "\"");
  if (t.settings.conf) {
    try {
      (void)parse_config(*t.settings.conf, ConfigSource::PyTorch);
    } catch (const ConfigError& e) {
      out += fmt::format("               not understood: {}; replay uses the default\n", e.what());
    }
  }
  if (all_settings)
    for (const auto& [k, v] : t.settings.fields) out += fmt::format("  {} = {}\n", k, v);
  if (!t.final_stats.empty()) {
    auto stat = [&](const char* key) {
      auto it = t.final_stats.find(key);
      return it == t.final_stats.end() ? std::string("?") : gib(static_cast<Bytes>(it->second));
    };
    out += fmt::format("recorded peak: allocated {}, reserved {}\n",
                       stat("allocated_bytes.all.peak"), stat("reserved_bytes.all.peak"));
  }
  if (t.devices.empty()) out += "devices:       none (no trace events, no segments)\n";
  for (const auto& d : t.devices) {
    std::size_t blocks = 0;
    Bytes reserved = 0;
    for (const auto& s : d.segments) {
      blocks += s.blocks.size();
      reserved += s.total_size;
    }
    out += fmt::format("device {}:\n", d.device);
    const io::TraceStats st = io::analyze_trace(d.events);
    // The snapshot's segments (the end state) and the trace's live blocks come from two parts
    // of the file; an empty segment list beside live blocks means it was not saved.
    if (d.segments.empty() && (st.allocs_never_freed > 0 || st.segments_at_end > 0))
      out += fmt::format("  segments at end: not in the file (its \"segments\" list is empty, yet the trace "
                         "ends with {} blocks live{}); the replay does not need them\n",
                         st.allocs_never_freed,
                         st.segments_at_end ? fmt::format(" and {} segments not freed", st.segments_at_end) : "");
    else
      out += fmt::format("  segments at end: {} ({} blocks, {} reserved)\n", d.segments.size(), blocks,
                         gib(reserved));
    out += fmt::format("  trace: {}\n", st.one_line());
    if (st.lacks_segment_events()) out += fmt::format("  note: {}\n", io::kNoSegmentEvents);
    // Each out-of-memory entry: PyTorch writes the failed request's size (after its rounding) and,
    // in addr, the device's free bytes at the error (oracle recordings write null there: 0).
    for (std::size_t i = 0; i < d.events.size(); ++i) {
      const TraceEvent& e = d.events[i];
      if (e.action != TraceAction::Oom) continue;
      out += fmt::format("  out of memory: trace event {} of {}: a request of {} (after PyTorch's rounding) on "
                         "stream {}; {}\n",
                         i,
                         d.events.size(), gib(e.size), e.stream,
                         e.addr ? fmt::format("the device had {} free (recorded in the entry)", gib(e.addr))
                                : std::string("the device's free memory is not recorded in the entry"));
    }
    if (st.last_time_us > st.first_time_us)
      out += fmt::format("  recorded span: {:.3f} s\n",
                         static_cast<double>(st.last_time_us - st.first_time_us) / 1e6);
  }
  std::fputs(out.c_str(), stdout);
  return kExitOk;
}

Runner setup(CLI::App& sub) {
  auto path = std::make_shared<std::string>();
  auto all = std::make_shared<bool>(false);
  sub.add_option("TRACE", *path,
                 "PyTorch memory snapshot (_dump_snapshot pickle, or JSON), or an oracle "
                 "recording; gzip or plain")
      ->required();
  sub.add_flag("--settings", *all, "print every recorded allocator_settings field");
  return [path, all] { return run_trace_info(*path, *all); };
}

[[maybe_unused]] const bool registered = register_command(
    {"trace-info", "Describe a memory trace or snapshot: format, settings, events, anomalies",
     setup});

}  // namespace
}  // namespace cachet::cli

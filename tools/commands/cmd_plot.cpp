// `cachet plot TRACE -o FILE.svg [--conf STRING] [--from T] [--to T]`: memory over time (allocated and reserved)
// and the segment map at peak reserved (blocks coloured by state), as one self-contained SVG
// (no scripts, no network) that opens in any browser.
#if __has_include("cachet/replay/replay.h")
#include <fmt/format.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include "cachet/errors.h"
#include "cachet/io/file.h"
#include "cachet/replay/replay.h"
#include "cachet/replay/report.h"
#include "command.h"
#include "trace_input.h"

namespace cachet::cli {
namespace {

struct Args {
  std::string path;
  std::string output;
  std::optional<std::string> conf;
  std::string device_memory;
  std::string cap;
  std::string fraction;  // --fraction F: the cap is F x the device memory
  std::string from, to;  // --from/--to: a time window ("12.5s") or trace events (a bare integer)
};

// One end of --from/--to: seconds since the first event ("12.5s") or a trace event (a bare
// whole number). Gives false, with the error printed, on anything else.
struct WindowEnd {
  bool set = false;
  bool seconds = false;
  double value = 0;
};
bool parse_window_end(const char* option, const std::string& text, WindowEnd& out) {
  if (text.empty()) return true;
  std::string num = text;
  out.seconds = num.ends_with('s');
  if (out.seconds) num.pop_back();
  char* end = nullptr;
  const double v = std::strtod(num.c_str(), &end);
  const bool whole = num.find_first_not_of("0123456789") == std::string::npos;
  if (num.empty() || end != num.c_str() + num.size() || !(v >= 0) || (!out.seconds && !whole)) {
    std::fprintf(stderr,
                 "cachet plot: %s %s: not a time or a trace event: give seconds since the first event with an s "
                 "('12.5s') or a trace event as a whole number ('5754')\n",
                 option, text.c_str());
    return false;
  }
  out.set = true;
  out.value = v;
  return true;
}

std::string base_name(const std::string& p) {
  const auto s = p.find_last_of('/');
  return s == std::string::npos ? p : p.substr(s + 1);
}

// Why `path` cannot be written, checked before the replay (a missing folder, a folder given as
// the file), or "" when it looks writable.
std::string output_problem(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_directory(path, ec))
    return fmt::format("{} is a folder; give a file name, for example {}/memory.svg", path,
                       path.ends_with('/') ? path.substr(0, path.size() - 1) : path);
  const fs::path parent = fs::path(path).parent_path();
  if (parent.empty()) return "";
  const fs::file_status st = fs::status(parent, ec);
  if (ec || !fs::exists(st))
    return fmt::format("the folder {} does not exist ({}); create it first", parent.string(),
                       ec ? ec.message() : std::strerror(ENOENT));
  if (!fs::is_directory(st)) return fmt::format("{} is not a folder ({})", parent.string(), std::strerror(ENOTDIR));
  return "";
}

int run_plot(const Args& a) {
  using namespace cachet::replay;
  if (a.output.empty()) {
    std::fprintf(stderr, "cachet plot: -o: an empty file name; give the SVG file to write, for example -o memory.svg\n");
    return kExitBadInput;
  }
  if (const std::string why = output_problem(a.output); !why.empty()) {
    std::fprintf(stderr, "cachet plot: -o %s: cannot write there: %s\n", a.output.c_str(), why.c_str());
    return kExitBadInput;
  }
  std::string cap_text = a.cap;  // --cap, or --fraction's cap in bytes
  if (!fraction_to_cap("plot", a.path, a.fraction, a.device_memory, cap_text)) return kExitBadInput;
  WindowEnd from, to;
  if (!parse_window_end("--from", a.from, from) || !parse_window_end("--to", a.to, to)) return kExitBadInput;
  auto in = load_trace_input("plot", a.path, a.conf, a.device_memory, cap_text, /*draw_without_cap=*/true);
  if (!in) return kExitBadInput;
  const LoadedTrace& lt = in->loaded;
  const Config& config = in->config;
  const bool recorded = in->recorded;
  const Trace& t = lt.trace;
  PlotData d;
  d.x_is_time = !t.event_time_us.empty() && t.event_time_us.back() > t.event_time_us.front();
  const std::int64_t t0 = d.x_is_time ? t.event_time_us.front() : 0;
  auto xof = [&](std::size_t k) {
    return d.x_is_time ? static_cast<double>(t.event_time_us[k] - t0) / 1e6 : static_cast<double>(t.ops[k].event);
  };
  if ((from.set && from.seconds) || (to.set && to.seconds))
    if (!d.x_is_time) {
      std::fprintf(stderr, "cachet plot: --from/--to in seconds: the trace records no times; give trace events (whole "
                           "numbers) instead\n");
      return kExitBadInput;
    }
  // Op k is in the window when its x (seconds) or its trace event is within both ends.
  auto in_window = [&](std::size_t k) {
    auto after = [&](const WindowEnd& w) {
      return !w.set || (w.seconds ? xof(k) >= w.value : t.ops[k].event >= w.value);
    };
    auto before = [&](const WindowEnd& w) {
      return !w.set || (w.seconds ? xof(k) <= w.value : t.ops[k].event <= w.value);
    };
    return after(from) && before(to);
  };
  const bool windowed = from.set || to.set;
  ReplayOptions o = recorded_options(lt, recorded ? AddressMode::Recorded : AddressMode::Synthetic);
  std::int64_t best = -1;
  std::size_t peak_op = 0;
  d.timeline.reserve(t.ops.size());
  o.observer = [&](std::size_t k, const CachingAllocator& al) {
    if (windowed && !in_window(k)) return;
    const DeviceStats s = al.stats();
    d.timeline.push_back({xof(k), s.allocated_bytes[0].current, s.reserved_bytes[0].current});
    if (s.reserved_bytes[0].current > best) {
      best = s.reserved_bytes[0].current;
      peak_op = k;
    }
  };
  ReplayResult r = cachet::replay::replay(t, config, o);
  if (windowed && d.timeline.empty()) {
    std::fprintf(stderr, "cachet plot: --from %s --to %s: no event of the trace is in that window (it has %llu "
                         "events%s)\n",
                 a.from.empty() ? "(start)" : a.from.c_str(), a.to.empty() ? "(end)" : a.to.c_str(),
                 static_cast<unsigned long long>(t.events),
                 d.x_is_time ? fmt::format(" over {:.3f} s", xof(t.ops.size() - 1)).c_str() : "");
    return kExitBadInput;
  }
  if (!t.ops.empty()) {
    ReplayOptions at = recorded_options(lt, r.recorded_addresses ? AddressMode::Recorded : AddressMode::Synthetic);
    at.stop_after = peak_op + 1;
    at.keep_allocator = true;
    ReplayResult p = cachet::replay::replay(t, config, at);
    d.peak_segments = p.allocator->snapshot();
    d.peak_x = xof(peak_op);
  }
  for (std::size_t k = 0; k < t.ops.size(); ++k)
    if (t.ops[k].kind == OpKind::OomRequest && (!windowed || in_window(k))) d.ooms.push_back(xof(k));
  d.cap = static_cast<std::int64_t>(o.cap);
  d.title = base_name(lt.file.name);
  d.subtitle = fmt::format("configuration: {}   |   peak allocated {}, peak reserved {} (reserved/allocated {:.3f})   |   {} events{}",
                           r.conf.empty() ? "(default)" : r.conf, human_bytes(r.peak_allocated()),
                           human_bytes(r.peak_reserved()), r.fragmentation(), t.events,
                           windowed ? fmt::format("   |   window {} to {}; the segment map at its peak reserved",
                                                  a.from.empty() ? "start" : a.from, a.to.empty() ? "end" : a.to)
                                    : std::string());
  const std::string svg = render_svg(d);
  errno = 0;
  std::ofstream f(a.output, std::ios::binary);
  if (!f || !f.write(svg.data(), static_cast<std::streamsize>(svg.size())) || !f.flush()) {
    std::fprintf(stderr, "cachet plot: -o %s: cannot write there: %s\n", a.output.c_str(),
                 errno ? std::strerror(errno) : "write error");
    return kExitBadInput;
  }
  if (auto note = trace_note(t); !note.empty()) std::fprintf(stderr, "%s\n", note.c_str());
  if (!r.note.empty()) std::fprintf(stderr, "note: %s\n", r.note.c_str());
  std::printf("wrote %s (%zu bytes)\n", a.output.c_str(), svg.size());
  return kExitOk;
}

Runner setup(CLI::App& sub) {
  auto a = std::make_shared<Args>();
  sub.add_option("TRACE", a->path, "PyTorch memory snapshot (pickle or JSON) or an oracle recording")->required();
  sub.add_option("-o,--output", a->output, "the SVG file to write")->required();
  sub.add_option("--conf", a->conf, "configuration (default: the recorded one)");
  sub.add_option("--device-memory", a->device_memory, kDeviceMemoryHelp);
  sub.add_option("--cap", a->cap, "memory cap (set_per_process_memory_fraction), same syntax: '12G'");
  sub.add_option("--fraction", a->fraction, kFractionHelp);
  sub.add_option("--from", a->from,
                 "start of the window drawn: seconds since the first event ('12.5s') or a trace event (a whole number)");
  sub.add_option("--to", a->to, "end of the window drawn, as --from (the out-of-memory requests in it are marked)");
  return [a] { return run_plot(*a); };
}

[[maybe_unused]] const bool registered = register_command(
    {"plot", "Draw memory over time and the segment map at the peak as an SVG", setup});

}  // namespace
}  // namespace cachet::cli
#endif

// `cachet report TRACE -o report.html [--cap BYTES] [--device-memory BYTES]`: one self-contained
// HTML file (no script, no font, nothing fetched): memory over time with the out-of-memory
// requests marked, the segment map at peak reserved and at the first out-of-memory, the explain
// text (cmd_explain.cpp) and the configurations tried, ranked (tools/replay/src/html_report.cpp).
#if __has_include("cachet/replay/html_report.h")
#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <numeric>
#include <string>

#include "cachet/replay/explain.h"
#include "cachet/replay/html_report.h"
#include "cachet/replay/recommend.h"
#include "command.h"
#include "explain_input.h"

namespace cachet::cli {
namespace {

struct Args {
  std::string path;
  std::string output;
  std::string cap;
  std::string fraction;  // --fraction F: the cap is F x the device memory
  std::string device_memory;
  std::optional<std::string> conf;  // --conf: start from it in place of the recorded configuration
  unsigned threads = 2;
  std::size_t top = 20;
};

std::string base_name(const std::string& p) {
  const auto s = p.find_last_of('/');
  return s == std::string::npos ? p : p.substr(s + 1);
}

// Why `path` cannot be written, checked before the work (an empty name, a folder given as the
// file, a missing folder), or "" when it looks writable.
std::string output_problem(const std::string& path) {
  namespace fs = std::filesystem;
  if (path.empty()) return "an empty file name; give the HTML file to write, for example -o report.html";
  std::error_code ec;
  if (fs::is_directory(path, ec)) return fmt::format("{} is a folder; give a file name, for example {}/report.html", path, path);
  const fs::path parent = fs::path(path).parent_path();
  if (parent.empty()) return "";
  const fs::file_status st = fs::status(parent, ec);
  if (ec || !fs::exists(st)) return fmt::format("the folder {} does not exist; create it first", parent.string());
  if (!fs::is_directory(st)) return fmt::format("{} is not a folder", parent.string());
  return "";
}

int run_report(const Args& a) {
  using namespace cachet::replay;
  if (const std::string why = output_problem(a.output); !why.empty()) {
    std::fprintf(stderr, "cachet report: -o %s: cannot write there: %s\n", a.output.c_str(), why.c_str());
    return kExitBadInput;
  }
  std::string cap_text = a.cap;  // --cap, or --fraction's cap in bytes
  if (!fraction_to_cap("report", a.path, a.fraction, a.device_memory, cap_text)) return kExitBadInput;
  auto in = load_explain_input("report", a.path, cap_text, a.device_memory, a.threads, a.conf);
  if (!in) return kExitBadInput;
  const LoadedTrace& lt = in->loaded;
  const Trace& t = lt.trace;
  ExplainOptions eo;
  eo.threads = a.threads;
  eo.cap_text = cap_text;
  Explanation e = explain(lt, in->options, in->frames, eo);

  HtmlReport r;
  r.title = base_name(lt.file.name);
  r.subtitle = fmt::format("configuration: {}; device memory {}{}; {} events", e.conf.empty() ? "(default)" : e.conf,
                           !e.device_memory_known ? std::string("not recorded (no device limit)")
                               : human_bytes(static_cast<std::int64_t>(e.device_memory)),
                           e.cap ? "; cap " + human_bytes(static_cast<std::int64_t>(e.cap)) : std::string(), t.events);
  r.cap = static_cast<std::int64_t>(in->options.cap);
  r.x_is_time = !t.event_time_us.empty() && t.event_time_us.back() > t.event_time_us.front();
  const std::int64_t t0 = r.x_is_time ? t.event_time_us.front() : 0;
  auto xof = [&](std::size_t k) {
    return r.x_is_time ? static_cast<double>(t.event_time_us[k] - t0) / 1e6 : static_cast<double>(t.ops[k].event);
  };
  ReplayOptions o = in->options;
  if (!e.baseline.recorded_addresses) o.addresses = AddressMode::Synthetic;
  std::int64_t best = -1;
  std::size_t peak_op = 0;
  std::int64_t ooms = 0;
  o.observer = [&](std::size_t k, const CachingAllocator& al) {
    const DeviceStats s = al.stats();
    r.timeline.push_back({xof(k), s.allocated_bytes[0].current, s.reserved_bytes[0].current});
    if (s.reserved_bytes[0].current > best) {
      best = s.reserved_bytes[0].current;
      peak_op = k;
    }
    if (s.num_ooms > ooms) {
      ooms = s.num_ooms;
      r.ooms.push_back(xof(k));
    }
  };
  (void)cachet::replay::replay(t, lt.run.config, o);
  r.peak_x = t.ops.empty() ? 0 : xof(peak_op);
  if (!t.ops.empty()) {
    ReplayOptions at = o;
    at.observer = nullptr;
    at.stop_after = peak_op + 1;
    at.keep_allocator = true;
    r.peak_segments = cachet::replay::replay(t, lt.run.config, at).allocator->snapshot();
  }
  if (e.at.oom) r.oom_segments = e.at.segments;
  r.explain = explain_text(e);

  // The table: tune's space (explain's search), in tune's ranking: the one recommendation heads it.
  const TuneResult& tr = *e.tried;
  r.rows.push_back(&tr.baseline);
  for (std::size_t k = 0; k < tr.ranking.size() && k < a.top; ++k) r.rows.push_back(&tr.results[tr.ranking[k]]);
  const std::size_t tried = tr.results.size();
  r.rows_note = fmt::format(
      "{} configurations replayed (synthetic addresses{}); the best {} in cachet tune's ranking: fewest "
      "out-of-memory errors, then peak reserved, then device calls. The first row is the recorded configuration.",
      tried + 1, e.cap ? ", the same cap" : "", std::min(a.top, tried));

  const std::string html = render_html(r);
  errno = 0;
  std::ofstream f(a.output, std::ios::binary | std::ios::trunc);
  if (!f || !f.write(html.data(), static_cast<std::streamsize>(html.size())) || !f.flush()) {
    std::fprintf(stderr, "cachet report: -o %s: cannot write there: %s\n", a.output.c_str(),
                 errno ? std::strerror(errno) : "write error");
    return kExitBadInput;
  }
  std::printf("wrote %s (%zu bytes): %s, %zu segments at the peak%s\n", a.output.c_str(), html.size(),
              e.at.oom ? "first out-of-memory explained" : "no out-of-memory, the peak explained",
              r.peak_segments.size(),
              r.oom_segments ? fmt::format(", {} at the out-of-memory", r.oom_segments->size()).c_str() : "");
  // The one recommendation and the verdict, as tune, explain and replay give them.
  const Recommendation& rec = *e.rec;
  const Verdict& v = *e.verdict;
  std::printf("recommendation (cachet tune's pick): %s\n",
              rec.pick == kRecorded ? fmt::format("keep the recorded configuration, \"{}\"", e.conf).c_str()
                                    : fmt::format("{}=\"{}\"{}", conf_variable(tr.results[rec.pick].config),
                                                  tr.results[rec.pick].conf,
                                                  rec.only_plugin_avoids ? " (only cachet's plug-in avoids the out-of-memory)" : "")
                                          .c_str());
  std::printf("verdict: the recorded configuration %s%s\n", v.fits() ? "fits" : "does not fit",
              v.smallest_cap ? fmt::format("; the smallest cap at and above which it fits: {}", human_bytes_exact(*v.smallest_cap)).c_str()
                             : "");
  return kExitOk;
}

Runner setup(CLI::App& sub) {
  auto a = std::make_shared<Args>();
  sub.add_option("TRACE", a->path, "PyTorch memory snapshot (pickle or JSON) or an oracle recording")->required();
  sub.add_option("-o,--output", a->output, "the HTML file to write")->required();
  sub.add_option("--cap", a->cap,
                 "the memory cap the run had (set_per_process_memory_fraction x total memory; K/M/G/T ok)");
  sub.add_option("--fraction", a->fraction, kFractionHelp);
  sub.add_option("--conf", a->conf, kStartConfHelp);
  sub.add_option("--device-memory", a->device_memory, kDeviceMemoryHelp);
  sub.add_option("--threads", a->threads, "worker threads for the configurations (default 2)");
  sub.add_option("--top", a->top, "rows of the configuration table (default 20)");
  return [a] { return run_report(*a); };
}

[[maybe_unused]] const bool registered = register_command(
    {"report", "Write one self-contained HTML report: memory over time, segment maps, explain, tune", setup});

}  // namespace
}  // namespace cachet::cli
#endif

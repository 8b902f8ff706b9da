// Output of the replay commands: table, JSON, sizes, progress, SVG.
#include "cachet/replay/report.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <fmt/format.h>
#include <vector>

#include "cachet/replay/html_report.h"  // html_escape, for the SVG text too
#include "cachet/stats.h"

namespace cachet::replay {

std::string human_bytes(std::int64_t b) {
  const double v = static_cast<double>(b);
  const double a = std::fabs(v);
  if (a >= static_cast<double>(GiB)) return fmt::format("{:.2f} GiB", v / static_cast<double>(GiB));
  if (a >= static_cast<double>(MiB)) return fmt::format("{:.2f} MiB", v / static_cast<double>(MiB));
  if (a >= static_cast<double>(KiB)) return fmt::format("{:.2f} KiB", v / static_cast<double>(KiB));
  return fmt::format("{} B", b);
}

std::string human_bytes_exact(Bytes b) {
  const std::string h = human_bytes(static_cast<std::int64_t>(b));
  return b < KiB ? h : fmt::format("{} = {} bytes", h, b);
}

std::optional<Bytes> parse_bytes(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  std::size_t i = 0;
  while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.')) ++i;
  if (i == 0) return std::nullopt;
  const std::string num(s.substr(0, i));
  std::string unit(s.substr(i));
  unit.erase(std::remove_if(unit.begin(), unit.end(), [](char c) { return std::isspace(static_cast<unsigned char>(c)); }),
             unit.end());
  for (auto& c : unit) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  double mult = 1;
  if (unit.empty() || unit == "b") mult = 1;
  else if (unit == "k" || unit == "kb" || unit == "kib") mult = static_cast<double>(KiB);
  else if (unit == "m" || unit == "mb" || unit == "mib") mult = static_cast<double>(MiB);
  else if (unit == "g" || unit == "gb" || unit == "gib") mult = static_cast<double>(GiB);
  else if (unit == "t" || unit == "tb" || unit == "tib") mult = static_cast<double>(GiB) * 1024.0;
  else return std::nullopt;
  if (num.find('.') == std::string::npos && mult == 1) {
    try {
      return static_cast<Bytes>(std::stoull(num));
    } catch (...) {
      return std::nullopt;
    }
  }
  char* end = nullptr;
  const double v = std::strtod(num.c_str(), &end);
  if (end != num.c_str() + num.size() || !(v >= 0) || v * mult > 1.8e19) return std::nullopt;
  return static_cast<Bytes>(v * mult);
}

SizeParse parse_size(std::string_view text) {
  SizeParse r;
  std::string_view s = text;
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  std::size_t i = 0;
  while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.')) ++i;
  const std::string num(s.substr(0, i));
  std::string unit(s.substr(i));
  std::erase_if(unit, [](char c) { return std::isspace(static_cast<unsigned char>(c)); });
  std::string lower = unit;
  for (auto& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  static constexpr const char* kForm =
      "bytes, or with a suffix K, M, G or T (or KiB, MiB, GiB, TiB), powers of 1024: '13.5G', '80GiB'";
  if (num.empty() || std::count(num.begin(), num.end(), '.') > 1 || num == ".") {
    r.error = fmt::format("not a size: '{}' ({})", text, kForm);
    return r;
  }
  if (lower == "kb" || lower == "mb" || lower == "gb" || lower == "tb") {
    const char p = static_cast<char>(std::toupper(static_cast<unsigned char>(lower[0])));
    r.error = fmt::format("'{}': {} is ambiguous (powers of 1000 or of 1024?): write {}{} or {}{}iB for powers of 1024 "
                          "(PyTorch's messages print GiB and MiB), or the size in bytes",
                          text, unit, num, p, num, p);
    return r;
  }
  const auto b = parse_bytes(s);
  if (!b) {
    r.error = fmt::format("not a size: '{}' ({})", text, kForm);
    return r;
  }
  if (*b > 0 && *b < kMinSize) {
    if (lower.empty() || lower == "b")
      r.error = fmt::format("'{}' is {} byte{}: did you mean {}{}? (a size without a suffix is in bytes; K, M, G and T "
                            "are powers of 1024; no cap or device is under 1 MiB)",
                            text, num, num == "1" ? "" : "s", num, *b < 1024 ? "G" : "M");
    else
      r.error = fmt::format("'{}' is {}: under 1 MiB, which no cap or device is; did you mean {}{}?", text,
                            human_bytes(static_cast<std::int64_t>(*b)), num,
                            lower[0] == 'k' ? "M" : "G");
    return r;
  }
  r.bytes = b;
  return r;
}

std::string json_quote(std::string_view s) {
  std::string o = "\"";
  for (char c : s) {
    switch (c) {
      case '"': o += "\\\""; break;
      case '\\': o += "\\\\"; break;
      case '\n': o += "\\n"; break;
      case '\t': o += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) o += fmt::format("\\u{:04x}", static_cast<int>(c));
        else o += c;
    }
  }
  return o + "\"";
}

static std::string conf_label(const ReplayResult& r) { return r.conf.empty() ? "(default)" : r.conf; }

std::size_t output_width() {
  winsize ws{};
  if (::isatty(1) && ::ioctl(1, TIOCGWINSZ, &ws) == 0 && ws.ws_col >= 40) return ws.ws_col;
  return 100;
}

namespace {

// `text` cut into lines of at most `width` characters, after its commas where it can.
std::vector<std::string> wrap_conf(const std::string& text, std::size_t width) {
  std::vector<std::string> lines;
  std::string line;
  std::size_t at = 0;
  while (at < text.size()) {
    std::size_t comma = text.find(',', at);
    std::string piece = text.substr(at, comma == std::string::npos ? std::string::npos : comma + 1 - at);
    at = comma == std::string::npos ? text.size() : comma + 1;
    if (!line.empty() && line.size() + piece.size() > width) {
      lines.push_back(line);
      line.clear();
    }
    line += piece;
    while (line.size() > width) {
      lines.push_back(line.substr(0, width));
      line.erase(0, width);
    }
  }
  if (!line.empty() || lines.empty()) lines.push_back(line);
  return lines;
}

}  // namespace

std::string results_table(const std::vector<const ReplayResult*>& rows, const std::vector<std::string>& ranks,
                          std::size_t width) {
  if (width == 0) width = output_width();
  constexpr std::size_t kCols = 8;
  const bool ranked = !ranks.empty();
  // Two header lines; the numbers right-aligned under them.
  const std::array<std::string, kCols> head1{"", "", "peak", "peak", "reserved/", "", "", "device calls"};
  const std::array<std::string, kCols> head2{ranked ? "#" : "", "configuration", "allocated", "reserved",
                                             "allocated", "OOMs", "retries", "allocs/frees"};
  std::vector<std::array<std::string, kCols>> cells;
  for (std::size_t k = 0; k < rows.size(); ++k) {
    const ReplayResult& r = *rows[k];
    cells.push_back({ranked && k < ranks.size() ? ranks[k] : "", conf_label(r), human_bytes(r.peak_allocated()),
                     human_bytes(r.peak_reserved()), fmt::format("{:.3f}", r.fragmentation()),
                     fmt::format("{}", r.stats.num_ooms), fmt::format("{}", r.stats.num_alloc_retries),
                     fmt::format("{}/{}", r.stats.num_device_alloc, r.stats.num_device_free)});
  }
  std::array<std::size_t, kCols> w{};
  for (std::size_t c = 0; c < kCols; ++c) w[c] = std::max(head1[c].size(), head2[c].size());
  for (const auto& row : cells)
    for (std::size_t c = 0; c < kCols; ++c)
      if (c != 1) w[c] = std::max(w[c], row[c].size());
  std::size_t fixed = 0;
  for (std::size_t c = 0; c < kCols; ++c)
    if (c != 1 && (c != 0 || ranked)) fixed += w[c] + 2;
  std::size_t longest = head2[1].size();
  for (const auto& row : cells) longest = std::max(longest, row[1].size());
  w[1] = std::min(longest, width > fixed + 16 ? width - fixed : 16);
  auto line = [&](const std::array<std::string, kCols>& row) {
    std::string out;
    if (ranked) out += fmt::format("{:>{}}  ", row[0], w[0]);
    out += fmt::format("{:<{}}", row[1], w[1]);
    for (std::size_t c = 2; c < kCols; ++c) out += fmt::format("  {:>{}}", row[c], w[c]);
    while (!out.empty() && out.back() == ' ') out.pop_back();
    return out + "\n";
  };
  std::string out = line(head1) + line(head2);
  out += std::string(fixed + w[1], '-') + "\n";
  for (auto& row : cells) {
    const std::vector<std::string> conf = wrap_conf(row[1], w[1]);
    row[1] = conf[0];
    out += line(row);
    std::array<std::string, kCols> more{};
    for (std::size_t k = 1; k < conf.size(); ++k) {
      more[1] = "  " + conf[k];
      if (more[1].size() > w[1]) more[1] = conf[k];
      out += line(more);
    }
  }
  return out;
}

std::string results_json(const std::vector<const ReplayResult*>& rows, const std::vector<std::string>& verdicts) {
  std::string o = "[";
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const ReplayResult& r = *rows[i];
    o += i ? ",\n " : "\n ";
    o += "{";
    o += "\"conf\": " + json_quote(r.conf);
    o += fmt::format(", \"peak_allocated\": {}, \"peak_reserved\": {}, \"fragmentation\": {:.6f}", r.peak_allocated(),
                     r.peak_reserved(), r.fragmentation());
    o += fmt::format(", \"num_ooms\": {}, \"num_alloc_retries\": {}, \"num_device_alloc\": {}, \"num_device_free\": {}",
                     r.stats.num_ooms, r.stats.num_alloc_retries, r.stats.num_device_alloc, r.stats.num_device_free);
    o += fmt::format(", \"second_half_device_calls\": {}", r.second_half_device_calls);
    const std::int64_t preq = r.stats.requested_bytes[0].peak;
    o += fmt::format(", \"peak_requested\": {}, \"waste\": {:.6f}", preq,
                     preq > 0 ? static_cast<double>(r.peak_reserved()) / static_cast<double>(preq) : 0.0);
    o += fmt::format(", \"failed_allocs\": {}, \"oom_requests\": {}, \"oom_requests_ok\": {}", r.failed_allocs,
                     r.oom_requests, r.oom_requests_ok);
    o += fmt::format(", \"pytorch_failures\": {}, \"pytorch_failure\": {}", r.pytorch_failures,
                     json_quote(r.pytorch_failure));
    o += fmt::format(", \"events\": {}, \"ops\": {}, \"addresses\": \"{}\", \"seconds\": {:.6f}", r.events, r.ops,
                     r.recorded_addresses ? "recorded" : "synthetic", r.seconds);
    o += ", \"note\": " + json_quote(r.note);
    o += ", \"final_stats\": {";
    bool first = true;
    for (const auto& [k, v] : flatten(r.stats)) {
      o += fmt::format("{}{}: {}", first ? "" : ", ", json_quote(k), v);
      first = false;
    }
    o += "}";
    if (i < verdicts.size()) o += ", \"verdict\": " + verdicts[i];
    o += "}";
  }
  return o + "\n]\n";
}

std::string trace_note(const Trace& t) {
  const io::TraceStats& s = t.stats;
  std::string out;
  if (s.starts_mid_run() || s.allocs_over_live > 0 || t.ignored_events > 0)
    out = fmt::format(
        "note: the trace starts mid-run or was truncated (ring buffer): {} frees of blocks never seen allocated, "
        "{} completions without a request, {} allocations over live blocks, {} segment frees of unseen segments; "
        "those events were skipped, so blocks allocated before the trace are missing from the peaks",
        s.frees_without_alloc, s.completions_without_request, s.allocs_over_live, s.segment_frees_without_alloc);
  return out;
}

Progress::Progress(std::string what) : what_(std::move(what)), on_(::isatty(2) != 0) {}
Progress::~Progress() { clear(); }
void Progress::clear() {
  if (on_ && last_ >= 0) {
    std::fputs("\r\033[K", stderr);
    std::fflush(stderr);
  }
  last_ = -1;
}
void Progress::update(std::size_t done, std::size_t total) {
  if (!on_ || total == 0) return;
  const int pct = static_cast<int>(100.0 * static_cast<double>(done) / static_cast<double>(total));
  if (pct == last_) return;
  last_ = pct;
  std::fprintf(stderr, "\r%s: %zu/%zu (%d%%)", what_.c_str(), done, total, pct);
  std::fflush(stderr);
}

// ---------------------------------------------------------------- SVG

namespace {

std::string fmt_num(double v) {
  if (std::fabs(v - std::round(v)) < 1e-9) return fmt::format("{:.0f}", v);
  if (std::fabs(v * 10 - std::round(v * 10)) < 1e-9) return fmt::format("{:.1f}", v);
  return fmt::format("{:.2f}", v);
}

constexpr const char* kAllocColor = "#3b78c3";
constexpr const char* kReservedColor = "#e8833a";
constexpr const char* kPendingColor = "#f2c14e";
constexpr const char* kInactiveColor = "#e2e8f0";  // free: the same grey as the report's

}  // namespace

double nice_step(double range, int ticks) {
  if (range <= 0) return 1;
  const double raw = range / ticks;
  const double p = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 2.5, 5.0, 10.0})
    if (m * p >= raw) return m * p;
  return 10 * p;
}

std::string cap_label(std::int64_t cap) { return "cap " + human_bytes(cap); }

PlotAxes plot_axes(const std::vector<TimelinePoint>& timeline, std::int64_t cap) {
  PlotAxes a;
  std::int64_t ymax_b = std::max<std::int64_t>(1, cap);
  if (!timeline.empty()) {
    a.xmin = timeline.front().x;
    a.xmax = timeline.back().x;
    for (const auto& p : timeline) ymax_b = std::max({ymax_b, p.reserved, p.allocated});
  }
  if (a.xmax <= a.xmin) a.xmax = a.xmin + 1;
  a.xstep = nice_step(a.xmax - a.xmin, 10);
  a.gib = ymax_b >= static_cast<std::int64_t>(GiB);
  a.unit = static_cast<double>(a.gib ? GiB : MiB);
  a.unit_name = a.gib ? "GiB" : "MiB";
  const double top = static_cast<double>(ymax_b) / a.unit * 1.05;  // 5% of headroom
  a.ystep = nice_step(top, 6);
  a.ymax = std::ceil(top / a.ystep) * a.ystep;
  return a;
}

std::vector<PlotColumn> plot_columns(const std::vector<TimelinePoint>& timeline, const PlotAxes& axes, int cols) {
  std::vector<PlotColumn> col(static_cast<std::size_t>(cols) + 1);
  for (const auto& p : timeline) {
    const double at = (p.x - axes.xmin) / (axes.xmax - axes.xmin) * cols;
    PlotColumn& k = col[static_cast<std::size_t>(std::clamp(at, 0.0, static_cast<double>(cols)))];
    k.set = true;
    k.allocated = std::max(k.allocated, p.allocated);
    k.reserved = std::max(k.reserved, p.reserved);
  }
  return col;
}

std::string render_svg(const PlotData& d) {
  const double W = 1200, left = 90, right = 1160;
  const double t_top = 110, t_bottom = 420;  // timeline panel
  const double s_top = 520;                  // segment map panel
  const int rows = kSegmentMapRows;
  const double row_h = 14, row_gap = 4;
  const double s_bottom = s_top + rows * (row_h + row_gap);
  const double H = s_bottom + 70;
  std::string o;
  o += fmt::format(
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" viewBox=\"0 0 {0} {1}\" "
      "font-family=\"Helvetica, Arial, sans-serif\">\n",
      W, H);
  o += fmt::format("<title>{}</title>\n", html_escape("cachet: " + d.title));
  o += fmt::format("<rect x=\"0\" y=\"0\" width=\"{}\" height=\"{}\" fill=\"#ffffff\"/>\n", W, H);
  o += fmt::format("<text x=\"{}\" y=\"34\" font-size=\"20\" font-weight=\"bold\" fill=\"#222\">{}</text>\n", left,
                   html_escape("Memory over time: " + d.title));
  o += fmt::format("<text x=\"{}\" y=\"58\" font-size=\"13\" fill=\"#555\">{}</text>\n", left, html_escape(d.subtitle));

  // --- timeline
  const PlotAxes axes = plot_axes(d.timeline, d.cap);
  const double xmin = axes.xmin, xmax = axes.xmax, unit = axes.unit, ystep = axes.ystep, ymax = axes.ymax;
  const char* unit_name = axes.unit_name;
  auto X = [&](double x) { return left + (x - xmin) / (xmax - xmin) * (right - left); };
  auto Y = [&](double v) { return t_bottom - v / ymax * (t_bottom - t_top); };

  o += "<g id=\"timeline\">\n";
  for (double v = 0; v <= ymax + 1e-9; v += ystep) {
    o += fmt::format("<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#e6e6e6\"/>\n", left, Y(v),
                     right, Y(v));
    o += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"11\" text-anchor=\"end\" fill=\"#444\">{}</text>\n",
                     left - 6, Y(v) + 4, fmt_num(v));
  }
  const double xstep = axes.xstep;
  for (double v = std::ceil(xmin / xstep) * xstep; v <= xmax + 1e-9; v += xstep) {
    o += fmt::format("<line x1=\"{0:.1f}\" y1=\"{1:.1f}\" x2=\"{0:.1f}\" y2=\"{2:.1f}\" stroke=\"#999\"/>\n", X(v),
                     t_bottom, t_bottom + 5);
    o += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"11\" text-anchor=\"middle\" fill=\"#444\">{}</text>\n",
                     X(v), t_bottom + 18, fmt_num(v));
  }
  o += fmt::format(
      "<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"12\" text-anchor=\"middle\" fill=\"#222\">{}</text>\n",
      (left + right) / 2, t_bottom + 36, d.x_is_time ? "time since the first event (s)" : "trace event");
  o += fmt::format(
      "<text transform=\"translate({:.1f},{:.1f}) rotate(-90)\" font-size=\"12\" text-anchor=\"middle\" "
      "fill=\"#222\">memory ({})</text>\n",
      left - 52, (t_top + t_bottom) / 2, unit_name);

  // Downsample to at most ~2 points per pixel column, keeping each column's maximum.
  const std::vector<PlotColumn> col = plot_columns(d.timeline, axes, static_cast<int>(right - left));
  auto series = [&](bool reserved) {
    std::string pts;
    double prev_y = Y(0);
    pts += fmt::format("{:.1f},{:.1f} ", X(xmin), Y(0));
    for (std::size_t c = 0; c < col.size(); ++c) {
      if (!col[c].set) continue;
      const double x = left + static_cast<double>(c);
      const double y = Y(static_cast<double>(reserved ? col[c].reserved : col[c].allocated) / unit);
      pts += fmt::format("{:.1f},{:.1f} {:.1f},{:.1f} ", x, prev_y, x, y);
      prev_y = y;
    }
    pts += fmt::format("{:.1f},{:.1f}", right, prev_y);
    return pts;
  };
  const std::string rs = series(true), as = series(false);
  o += fmt::format("<polygon id=\"reserved-area\" points=\"{} {:.1f},{:.1f}\" fill=\"{}\" fill-opacity=\"0.15\"/>\n", rs,
                   right, Y(0), kReservedColor);
  o += fmt::format("<polygon id=\"allocated-area\" points=\"{} {:.1f},{:.1f}\" fill=\"{}\" fill-opacity=\"0.5\"/>\n", as,
                   right, Y(0), kAllocColor);
  o += fmt::format("<polyline id=\"reserved\" points=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"1.6\"/>\n", rs,
                   kReservedColor);
  o += fmt::format("<polyline id=\"allocated\" points=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"1.6\"/>\n", as,
                   kAllocColor);
  if (!d.timeline.empty()) {
    o += fmt::format(
        "<line x1=\"{0:.1f}\" y1=\"{1:.1f}\" x2=\"{0:.1f}\" y2=\"{2:.1f}\" stroke=\"#c0392b\" stroke-dasharray=\"4 3\"/>\n",
        X(d.peak_x), t_top - 6, t_bottom);
    o += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"11\" fill=\"#c0392b\" text-anchor=\"middle\">peak reserved</text>\n",
                     X(d.peak_x), t_top - 10);
  }
  if (d.cap > 0) {
    const double y = Y(static_cast<double>(d.cap) / unit);
    o += fmt::format("<g id=\"cap\"><line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#c0392b\" "
                     "stroke-width=\"1.2\"/><text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"11\" fill=\"#c0392b\" "
                     "text-anchor=\"end\">{}</text></g>\n",
                     left, y, right, y, right - 4, y - 4, cap_label(d.cap));
  }
  if (!d.ooms.empty()) {
    o += "<g id=\"ooms\">\n";
    for (double x : d.ooms)
      o += fmt::format("<path d=\"M{0:.1f},{1:.1f} l-4,-7 h8 z\" fill=\"#c0392b\"/>\n", X(x), t_bottom - 1);
    o += "</g>\n";
  }
  o += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#888\"/>\n", left, t_top,
                   right - left, t_bottom - t_top);
  // legend
  const double lx = left + 14, ly = t_top + 14;
  o += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"250\" height=\"{}\" fill=\"#ffffff\" fill-opacity=\"0.9\" stroke=\"#ccc\"/>\n",
                   lx - 6, ly - 8, d.ooms.empty() ? 46 : 66);
  if (!d.ooms.empty()) {
    o += fmt::format("<path d=\"M{:.1f},{:.1f} l-5,-9 h10 z\" fill=\"#c0392b\"/>", lx + 9, ly + 49);
    o += fmt::format("<text x=\"{}\" y=\"{}\" font-size=\"12\" fill=\"#222\">out of memory in the recorded run ({})</text>\n",
                     lx + 26, ly + 49, d.ooms.size());
  }
  o += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"18\" height=\"10\" fill=\"{}\"/>", lx, ly, kReservedColor);
  o += fmt::format("<text x=\"{}\" y=\"{}\" font-size=\"12\" fill=\"#222\">reserved (segments from the device)</text>\n",
                   lx + 26, ly + 9);
  o += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"18\" height=\"10\" fill=\"{}\"/>", lx, ly + 20, kAllocColor);
  o += fmt::format("<text x=\"{}\" y=\"{}\" font-size=\"12\" fill=\"#222\">allocated (blocks in use)</text>\n", lx + 26,
                   ly + 29);
  o += "</g>\n";

  // --- segment map at the peak
  Bytes total = 0;
  for (const auto& s : d.peak_segments) total += s.total_size;
  o += "<g id=\"segments\">\n";
  o += fmt::format(
      "<text x=\"{}\" y=\"{}\" font-size=\"16\" font-weight=\"bold\" fill=\"#222\">Segments at peak reserved: {} in {} "
      "segments</text>\n",
      left, s_top - 34, html_escape(human_bytes(static_cast<std::int64_t>(total))), d.peak_segments.size());
  const double per_row = segment_map_per_row(total);
  o += fmt::format(
      "<text x=\"{}\" y=\"{}\" font-size=\"12\" fill=\"#555\">each row is {} of device memory, segments in address "
      "order; thin dark lines mark segment starts</text>\n",
      left, s_top - 14, html_escape(human_bytes(static_cast<std::int64_t>(per_row))));
  auto span = [&](double from, double to, const char* fill, const char* cls) {
    // from/to: byte offsets in the concatenated segment list; split across rows.
    for_each_row_piece(from, to, per_row, left, right, [&](double row, double x0, double x1) {
      // Blocks wide enough to tell apart get a thin white edge.
      o += fmt::format("<rect class=\"{}\" x=\"{:.2f}\" y=\"{:.1f}\" width=\"{:.2f}\" height=\"{}\" fill=\"{}\"{}/>\n", cls,
                       x0, s_top + row * (row_h + row_gap), std::max(x1 - x0, 0.3), row_h, fill,
                       x1 - x0 > 4 ? " stroke=\"#ffffff\" stroke-width=\"0.6\"" : "");
    });
  };
  for (int r = 0; r < rows; ++r)
    o += fmt::format("<rect x=\"{}\" y=\"{:.1f}\" width=\"{}\" height=\"{}\" fill=\"#fafafa\" stroke=\"#ddd\"/>\n", left,
                     s_top + r * (row_h + row_gap), right - left, row_h);
  double off = 0;
  std::string starts;
  for (const auto& s : d.peak_segments) {
    double b = off;
    for (const auto& blk : s.blocks) {
      const char* fill = blk.state == BlockState::ActiveAllocated     ? kAllocColor
                         : blk.state == BlockState::ActivePendingFree ? kPendingColor
                                                                      : kInactiveColor;
      const char* cls = blk.state == BlockState::ActiveAllocated     ? "allocated"
                        : blk.state == BlockState::ActivePendingFree ? "pending"
                                                                     : "inactive";
      span(b, b + static_cast<double>(blk.size), fill, cls);
      b += static_cast<double>(blk.size);
    }
    const double row = std::floor(off / per_row);
    const double x = left + (off - row * per_row) / per_row * (right - left);
    starts += fmt::format("<line x1=\"{0:.2f}\" y1=\"{1:.1f}\" x2=\"{0:.2f}\" y2=\"{2:.1f}\" stroke=\"#111\" stroke-width=\"1.5\"/>\n",
                          x, s_top + row * (row_h + row_gap) - 1, s_top + row * (row_h + row_gap) + row_h + 1);
    off += static_cast<double>(s.total_size);
  }
  o += starts;
  const double gy = s_bottom + 16;
  double gx = left;
  for (auto [color, label] : {std::pair{kAllocColor, "allocated block"}, std::pair{kPendingColor, "freed, waiting for stream uses"},
                              std::pair{kInactiveColor, "cached, free (reserved but unused)"}}) {
    o += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"18\" height=\"10\" fill=\"{}\" stroke=\"#999\" stroke-width=\"0.5\"/>",
                     gx, gy, color);
    o += fmt::format("<text x=\"{}\" y=\"{}\" font-size=\"12\" fill=\"#222\">{}</text>\n", gx + 24, gy + 9, label);
    gx += 24 + 8.0 * static_cast<double>(std::string_view(label).size()) + 30;
  }
  o += "</g>\n";
  o += fmt::format("<text x=\"{}\" y=\"{}\" font-size=\"10\" fill=\"#999\" text-anchor=\"end\">cachet plot</text>\n", right,
                   H - 10);
  o += "</svg>\n";
  return o;
}

}  // namespace cachet::replay

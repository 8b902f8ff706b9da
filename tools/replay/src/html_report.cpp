// `cachet report`'s HTML (html_report.h): inline CSS and SVG, no script, no external resource.
#include "cachet/replay/html_report.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

namespace cachet::replay {

namespace {

constexpr const char* kAllocColor = "#2b6cb0";
constexpr const char* kPendingColor = "#d69e2e";
constexpr const char* kFreeColor = "#e2e8f0";
constexpr const char* kReservedColor = "#c05621";

std::string num(double v) {
  std::string s = fmt::format("{:.3f}", v);
  while (!s.empty() && s.back() == '0') s.pop_back();
  if (!s.empty() && s.back() == '.') s.pop_back();
  return s;
}

std::string timeline_svg(const HtmlReport& r) {
  const double W = 1100, left = 70, right = 1080, top = 20, bottom = 300, H = 350;
  const PlotAxes axes = plot_axes(r.timeline, r.cap);
  const double xmin = axes.xmin, xmax = axes.xmax, unit = axes.unit, ystep = axes.ystep, ymax = axes.ymax;
  auto X = [&](double x) { return left + (x - xmin) / (xmax - xmin) * (right - left); };
  auto Y = [&](double v) { return bottom - v / ymax * (bottom - top); };
  std::string o = fmt::format(
      "<svg id=\"timeline-svg\" xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" viewBox=\"0 0 {0} {1}\" "
      "role=\"img\" aria-label=\"memory over time\">\n",
      W, H);
  for (double v = 0; v <= ymax + 1e-9; v += ystep)
    o += fmt::format("<line x1=\"{0}\" y1=\"{1:.1f}\" x2=\"{2}\" y2=\"{1:.1f}\" stroke=\"#e6e6e6\"/>"
                     "<text x=\"{3}\" y=\"{4:.1f}\" class=\"tick\" text-anchor=\"end\">{5}</text>\n",
                     left, Y(v), right, left - 6, Y(v) + 4, num(v));
  const double xstep = axes.xstep;
  for (double v = std::ceil(xmin / xstep) * xstep; v <= xmax + 1e-9; v += xstep)
    o += fmt::format("<text x=\"{:.1f}\" y=\"{}\" class=\"tick\" text-anchor=\"middle\">{}</text>\n", X(v), bottom + 16,
                     num(v));
  o += fmt::format("<text x=\"{}\" y=\"{}\" class=\"axis\" text-anchor=\"middle\">{}</text>\n", (left + right) / 2,
                   bottom + 36, r.x_is_time ? "time since the first event (s)" : "trace event");
  o += fmt::format("<text x=\"14\" y=\"{}\" class=\"axis\" transform=\"rotate(-90 14 {})\" text-anchor=\"middle\">"
                   "memory ({})</text>\n",
                   (top + bottom) / 2, (top + bottom) / 2, axes.unit_name);
  // One point per pixel column (its maximum), as steps.
  const std::vector<PlotColumn> col = plot_columns(r.timeline, axes, static_cast<int>(right - left));
  for (bool reserved : {true, false}) {
    std::string pts;
    double prev = Y(0);
    for (std::size_t c = 0; c < col.size(); ++c) {
      if (!col[c].set) continue;
      const double y = Y(static_cast<double>(reserved ? col[c].reserved : col[c].allocated) / unit);
      pts += fmt::format("{0:.1f},{1:.1f} {0:.1f},{2:.1f} ", left + static_cast<double>(c), prev, y);
      prev = y;
    }
    o += fmt::format("<polyline id=\"{}\" points=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"1.5\"/>\n",
                     reserved ? "reserved-line" : "allocated-line", pts, reserved ? kReservedColor : kAllocColor);
  }
  if (!r.timeline.empty())
    o += fmt::format("<line class=\"peak\" x1=\"{0:.1f}\" y1=\"{1}\" x2=\"{0:.1f}\" y2=\"{2}\" stroke=\"#555\" "
                     "stroke-dasharray=\"4 3\"/>\n",
                     X(r.peak_x), top, bottom);
  if (r.cap > 0) {
    const double y = Y(static_cast<double>(r.cap) / unit);
    o += fmt::format("<g class=\"cap\"><line x1=\"{0}\" y1=\"{1:.1f}\" x2=\"{2}\" y2=\"{1:.1f}\" stroke=\"#c53030\" "
                     "stroke-width=\"1.2\"/><text x=\"{3}\" y=\"{4:.1f}\" class=\"tick\" text-anchor=\"end\">{5}</text></g>\n",
                     left, y, right, right - 4, y - 4, cap_label(r.cap));
  }
  for (double x : r.ooms)
    o += fmt::format("<path class=\"oom\" d=\"M{:.1f},{} l-5,-9 h10 z\" fill=\"#c53030\"><title>out of memory</title>"
                     "</path>\n",
                     X(x), bottom - 1);
  o += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#888\"/>\n</svg>\n", left,
                   top, right - left, bottom - top);
  return o;
}

// Segments in address order laid end to end over `rows` rows; each segment one <g>.
std::string segment_map_svg(const Snapshot& segs, const char* id) {
  const double left = 10, right = 1090, row_h = 14, gap = 4;
  const int rows = kSegmentMapRows;  // the plot's SVG has as many: one scale in both
  Bytes total = 0;
  for (const auto& s : segs) total += s.total_size;
  const double per_row = segment_map_per_row(total);
  std::string o = fmt::format(
      "<svg id=\"{}\" class=\"segmap\" xmlns=\"http://www.w3.org/2000/svg\" width=\"1100\" height=\"{}\" "
      "viewBox=\"0 0 1100 {}\" role=\"img\" aria-label=\"segment map\">\n",
      id, rows * (row_h + gap) + 4, rows * (row_h + gap) + 4);
  for (int k = 0; k < rows; ++k)
    o += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"#fafafa\" stroke=\"#ddd\"/>\n", left,
                     k * (row_h + gap), right - left, row_h);
  double off = 0;
  for (const auto& s : segs) {
    o += fmt::format("<g class=\"segment\" data-address=\"{}\" data-bytes=\"{}\"><title>segment {:#x}: {} ({} pool, "
                     "stream {}{})</title>\n",
                     s.address, s.total_size, s.address, human_bytes(static_cast<std::int64_t>(s.total_size)),
                     s.is_large ? "large" : "small", s.stream, s.is_expandable ? ", expandable" : "");
    double b = off;
    for (const auto& blk : s.blocks) {
      const char* fill = blk.state == BlockState::ActiveAllocated     ? kAllocColor
                         : blk.state == BlockState::ActivePendingFree ? kPendingColor
                                                                      : kFreeColor;
      const double to = b + static_cast<double>(blk.size);
      for_each_row_piece(b, to, per_row, left, right, [&](double row, double x0, double x1) {
        o += fmt::format("<rect x=\"{:.2f}\" y=\"{}\" width=\"{:.2f}\" height=\"{}\" fill=\"{}\"/>", x0,
                         row * (row_h + gap), std::max(x1 - x0, 0.3), row_h, fill);
      });
      b = to;
    }
    const double row = std::floor(off / per_row);
    const double x = left + (off - row * per_row) / per_row * (right - left);
    o += fmt::format("<line x1=\"{0:.2f}\" y1=\"{1}\" x2=\"{0:.2f}\" y2=\"{2}\" stroke=\"#111\"/></g>\n", x,
                     row * (row_h + gap), row * (row_h + gap) + row_h);
    off += static_cast<double>(s.total_size);
  }
  return o + "</svg>\n";
}

std::string map_section(const char* id, const std::string& heading, const Snapshot& segs) {
  Bytes total = 0, alloc = 0;
  for (const auto& s : segs) {
    total += s.total_size;
    alloc += s.allocated_size();
  }
  return fmt::format("<section id=\"{}\">\n<h2>{}</h2>\n<p><span class=\"count\">{}</span> segments, {} reserved, {} "
                     "allocated; segments in address order, end to end, each row {} of them.</p>\n{}</section>\n",
                     id, html_escape(heading), segs.size(), human_bytes(static_cast<std::int64_t>(total)),
                     human_bytes(static_cast<std::int64_t>(alloc)),
                     human_bytes(static_cast<std::int64_t>(segment_map_per_row(total))),
                     segment_map_svg(segs, (std::string(id) + "-svg").c_str()));
}

}  // namespace

std::string html_escape(std::string_view s) {
  std::string o;
  o.reserve(s.size());
  for (char c : s) switch (c) {
      case '&': o += "&amp;"; break;
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '"': o += "&quot;"; break;
      default: o += c;
    }
  return o;
}

std::string render_html(const HtmlReport& r) {
  std::string o;
  o += "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<link rel=\"icon\" href=\"data:,\">\n";
  o += fmt::format("<title>cachet report: {}</title>\n", html_escape(r.title));
  o += "<style>\n"
       "body{font-family:sans-serif;margin:24px;color:#222;max-width:1120px}\n"
       "h1{font-size:22px}h2{font-size:17px;margin-top:28px}\n"
       "pre{background:#f7f7f7;padding:10px;white-space:pre-wrap;overflow-wrap:anywhere;font-size:12px}\n"
       "table{border-collapse:collapse;font-size:12px}td,th{border:1px solid #ccc;padding:3px 6px;text-align:right}\n"
       "td.conf,th.conf{text-align:left}tr.recorded{background:#fff5e6}\n"
       ".tick{font-size:10px;fill:#444}.axis{font-size:12px;fill:#222}\n"
       ".key span{display:inline-block;width:14px;height:10px;margin:0 4px 0 12px}\n"
       "</style>\n</head>\n<body>\n";
  o += fmt::format("<h1>cachet report: {}</h1>\n<p id=\"subtitle\">{}</p>\n", html_escape(r.title),
                   html_escape(r.subtitle));
  o += "<section id=\"timeline\">\n<h2>Memory over time</h2>\n";
  o += fmt::format("<p class=\"key\"><span style=\"background:{}\"></span>reserved<span style=\"background:{}\"></span>"
                   "allocated<span style=\"background:#c53030\"></span>out of memory ({})"
                   "; the dashed vertical line marks when peak reserved was reached{}.</p>\n",
                   kReservedColor, kAllocColor, r.ooms.size(),
                   r.cap > 0 ? "; the red horizontal line is the cap, " + human_bytes(r.cap) : std::string());
  o += timeline_svg(r) + "</section>\n";
  o += fmt::format("<p class=\"key\"><span style=\"background:{}\"></span>allocated block<span style=\"background:{}\">"
                   "</span>freed, waiting for stream uses<span style=\"background:{}\"></span>free (cached)</p>\n",
                   kAllocColor, kPendingColor, kFreeColor);
  o += map_section("segments-peak", "Segments at peak reserved", r.peak_segments);
  if (r.oom_segments) o += map_section("segments-oom", "Segments at the first out-of-memory", *r.oom_segments);
  o += fmt::format("<section id=\"explain\">\n<h2>{}</h2>\n<pre>{}</pre>\n</section>\n",
                   r.oom_segments ? "Why it ran out of memory" : "The peak, taken apart", html_escape(r.explain));
  o += fmt::format("<section id=\"tune\">\n<h2>Configurations tried</h2>\n<p>{}</p>\n<table>\n", html_escape(r.rows_note));
  o += "<tr><th>#</th><th class=\"conf\">configuration</th><th>OOMs</th><th>failed allocations</th><th>peak "
       "reserved</th><th>peak allocated</th><th>reserved/allocated</th><th>retries</th><th>device calls</th></tr>\n";
  for (std::size_t i = 0; i < r.rows.size(); ++i) {
    const ReplayResult& x = *r.rows[i];
    o += fmt::format("<tr{}><td>{}</td><td class=\"conf\">{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{:.3f}"
                     "</td><td>{}</td><td>{}</td></tr>\n",
                     i == 0 ? " class=\"recorded\"" : "", i == 0 ? std::string("recorded") : std::to_string(i),
                     html_escape(x.conf.empty() ? "(default)" : x.conf), x.stats.num_ooms, x.failed_allocs,
                     human_bytes(x.peak_reserved()), human_bytes(x.peak_allocated()), x.fragmentation(),
                     x.stats.num_alloc_retries, x.stats.num_device_alloc + x.stats.num_device_free);
  }
  o += "</table>\n</section>\n<p class=\"footer\">made by cachet report</p>\n</body>\n</html>\n";
  return o;
}

}  // namespace cachet::replay

// cachet/replay/report.h: what `cachet replay|tune|summary|plot` print: the results table, the
// JSON form, byte sizes, progress on stderr, and the SVG picture.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cachet/replay/replay.h"
#include "cachet/snapshot.h"

namespace cachet::replay {

// "15286140928" -> "14.24 GiB" (binary units, two decimals).
std::string human_bytes(std::int64_t bytes);
// The same with the exact count where the rounding hides it: "1.53 GiB = 1646821376 bytes";
// "512 B" as is.
std::string human_bytes_exact(Bytes bytes);

// Parses "80GiB", "80G", "1.5 GiB", "85899345920", "512MB" (K/M/G/T = powers of 1024).
// nullopt when not a size.
std::optional<Bytes> parse_bytes(std::string_view text);

// A size given on the command line (--cap, --device-memory), strictly: bytes, or a number with
// K, M, G or T, or KiB, MiB, GiB or TiB (powers of 1024). KB, MB, GB and TB are refused (10^9 or
// 2^30? the text does not say), and so is a size under 1 MiB, which no cap or device is: "8"
// is 8 bytes, most likely meant as 8G. `error` (empty when `bytes` is set) says what was wrong
// and what to write, without the option's name.
struct SizeParse {
  std::optional<Bytes> bytes;
  std::string error;
};
inline constexpr Bytes kMinSize = 1024 * 1024;
SizeParse parse_size(std::string_view text);

// The width tables are fitted to: the terminal's when stdout is one, else 100 columns.
std::size_t output_width();

// The aligned table: conf, peak allocated, peak reserved, fragmentation, OOMs, retries,
// device allocations/frees; `ranks` (when given) in a first "#" column. It fits `width`
// columns (0: output_width()): a long conf is wrapped after its commas.
std::string results_table(const std::vector<const ReplayResult*>& rows, const std::vector<std::string>& ranks = {},
                          std::size_t width = 0);

// One JSON object per result (conf, peak_allocated, peak_reserved, fragmentation, num_ooms,
// num_alloc_retries, num_device_alloc, num_device_free, failed_allocs, pytorch_failures and the
// first one, events, addresses, note, final_stats with PyTorch's key names). `verdicts` (when not
// empty, one per row: verdict_json, recommend.h) adds each row's "verdict" object after final_stats.
std::string results_json(const std::vector<const ReplayResult*>& rows, const std::vector<std::string>& verdicts = {});

// A JSON string literal.
std::string json_quote(std::string_view s);

// One line on the trace: events and anomalies (frees of blocks never seen allocated...), or "".
std::string trace_note(const Trace& t);

// One line comparing the replay's memory_stats() with PyTorch's recorded final ones (the keys
// both have): how many are equal, and each that differs; "" when none are recorded.
std::string final_stats_line(const ReplayResult& r, const std::map<std::string, std::int64_t>& recorded);
// Per private pool (Trace::pools): its segments at the end of the replay against the snapshot's.
std::string pool_end_lines(const Trace& t, const ReplayResult& r);

// Progress on stderr, only when stderr is a terminal.
class Progress {
 public:
  explicit Progress(std::string what);
  ~Progress();
  void update(std::size_t done, std::size_t total);
  void clear();  // erases the line (before the results are printed); update() may draw it again
  bool enabled() const { return on_; }

 private:
  std::string what_;
  bool on_ = false;
  int last_ = -1;
};

// --- the picture ---

struct TimelinePoint {
  double x = 0;  // seconds since the first event, or the event index when no times were recorded
  std::int64_t allocated = 0;
  std::int64_t reserved = 0;
};

struct PlotData {
  std::string title;     // trace name
  std::string subtitle;  // configuration, peaks
  bool x_is_time = false;
  std::vector<TimelinePoint> timeline;
  double peak_x = 0;
  std::vector<double> ooms;  // x of the requests that ran out of memory in the recorded run
  Snapshot peak_segments;  // memory_snapshot() at peak reserved
  std::int64_t cap = 0;    // the cap the replay ran under (a horizontal line "cap 12.00 GiB"); 0 = none
};

std::string render_svg(const PlotData& d);

// The axes of a memory-over-time picture, shared by `cachet plot` (render_svg) and `cachet
// report`'s timeline: x runs from the first point's x to the last's (a width of 1 when they
// coincide or there is no point); y is in GiB when the highest allocated or reserved reaches
// 1 GiB, else in MiB, and runs from 0 to 5% above that highest value (or the cap, when one is
// given and higher: its line stays in the picture) rounded up to a whole y step. Steps are 1, 2, 2.5 or 5 times a power of ten: about 6 on y, about 10 on x.
struct PlotAxes {
  double xmin = 0, xmax = 1, xstep = 1;
  bool gib = false;
  double unit = 0;                // bytes per y unit (GiB or MiB)
  const char* unit_name = "MiB";  // "GiB" or "MiB"
  double ystep = 1, ymax = 1;     // in units
};
PlotAxes plot_axes(const std::vector<TimelinePoint>& timeline, std::int64_t cap = 0);

// The label of the cap's line in both charts: "cap 12.00 GiB".
std::string cap_label(std::int64_t cap);

// The step for about `ticks` ticks over `range`: 1, 2, 2.5 or 5 times a power of ten (1 when
// range <= 0).
double nice_step(double range, int ticks);

// The segment maps of both charts (the plot's SVG, the HTML report) have this many rows, so one
// trace gets one scale in both: segment_map_per_row bytes of device memory per row.
inline constexpr int kSegmentMapRows = 20;
inline double segment_map_per_row(Bytes total) {
  return total > 0 ? std::ceil(static_cast<double>(total) / kSegmentMapRows) : 1.0;
}

// The segment maps of both charts (the plot's SVG, the HTML report) lay the segments end to end
// in rows of `per_row` bytes drawn from x = left to right: the bytes [from, to) of that line, cut
// at row ends, as f(row, x0, x1) per piece.
template <class F>
void for_each_row_piece(double from, double to, double per_row, double left, double right, F&& f) {
  while (from < to) {
    const double row = std::floor(from / per_row);
    const double end = std::min(to, (row + 1) * per_row);
    f(row, left + (from - row * per_row) / per_row * (right - left),
      left + (end - row * per_row) / per_row * (right - left));
    if (end <= from) break;  // a row too narrow to advance: drawn once
    from = end;
  }
}

// The timeline reduced to `cols` + 1 pixel columns over [axes.xmin, axes.xmax]: each column's
// highest allocated and reserved (set: some point fell in it).
struct PlotColumn {
  bool set = false;
  std::int64_t allocated = 0, reserved = 0;
};
std::vector<PlotColumn> plot_columns(const std::vector<TimelinePoint>& timeline, const PlotAxes& axes, int cols);

}  // namespace cachet::replay

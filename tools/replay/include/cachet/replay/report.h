// cachet/replay/report.h: what `cachet replay|tune|summary|plot` print: the results table, the
// JSON form, byte sizes, progress on stderr, and the SVG picture.
#pragma once

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

// The width tables are fitted to: the terminal's when stdout is one, else 100 columns.
std::size_t output_width();

// The aligned table: conf, peak allocated, peak reserved, fragmentation, OOMs, retries,
// device allocations/frees; `ranks` (when given) in a first "#" column. It fits `width`
// columns (0: output_width()): a long conf is wrapped after its commas.
std::string results_table(const std::vector<const ReplayResult*>& rows, const std::vector<std::string>& ranks = {},
                          std::size_t width = 0);

// One JSON object per result (conf, peak_allocated, peak_reserved, fragmentation, num_ooms,
// num_alloc_retries, num_device_alloc, num_device_free, failed_allocs, pytorch_failures and the
// first one, events, addresses, note, final_stats with PyTorch's key names).
std::string results_json(const std::vector<const ReplayResult*>& rows);

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
};

std::string render_svg(const PlotData& d);

}  // namespace cachet::replay

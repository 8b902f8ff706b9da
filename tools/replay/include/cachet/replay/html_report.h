// cachet/replay/html_report.h: `cachet report`'s one self-contained HTML file: memory over time
// with the out-of-memory requests marked, the segment map at peak reserved and at the first
// out-of-memory, the explain text and the table of configurations tried. Inline CSS and SVG
// only: no script, no font, nothing fetched.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "cachet/replay/replay.h"
#include "cachet/replay/report.h"
#include "cachet/snapshot.h"

namespace cachet::replay {

struct HtmlReport {
  std::string title;     // trace name
  std::string subtitle;  // configuration, device memory, cap
  bool x_is_time = false;
  std::vector<TimelinePoint> timeline;
  double peak_x = 0;
  std::vector<double> ooms;             // x of the out-of-memory requests (replayed)
  std::int64_t cap = 0;                 // the cap the replay ran under (a line "cap 12.00 GiB"); 0 = none
  Snapshot peak_segments;               // at peak reserved
  std::optional<Snapshot> oom_segments; // at the first out-of-memory
  std::string explain;                  // explain_text()
  std::vector<const ReplayResult*> rows;  // the recorded configuration first, then the ranking
  std::string rows_note;                  // how the rows are ranked
};

// The HTML text. Each segment of a map is one <g class="segment"> (data-address, data-bytes).
std::string render_html(const HtmlReport& r);

// HTML/XML text escaping (&, <, >, ").
std::string html_escape(std::string_view s);

}  // namespace cachet::replay

// What tune says about its results: the plug-in threshold, the one-or-two-sentence change
// against the recorded configuration, the keys policy:cachet ignores. See cachet/replay/tune.h.
#include <fmt/format.h>

#include "cachet/replay/report.h"
#include "cachet/replay/tune.h"

namespace cachet::replay {

std::vector<std::string> keys_policy_cachet_ignores(const Config& c) {
  const Config d{};
  std::vector<std::string> keys;
  if (c.expandable_segments != d.expandable_segments) keys.emplace_back("expandable_segments");
  if (c.max_split_size != d.max_split_size) keys.emplace_back("max_split_size_mb");
  if (c.roundup_power2_divisions != d.roundup_power2_divisions) keys.emplace_back("roundup_power2_divisions");
  if (c.large_segment_size != d.large_segment_size) keys.emplace_back("large_segment_size_mb");
  // max_non_split_rounding follows large_segment_size unless set.
  if (c.max_non_split_rounding != c.large_segment_size) keys.emplace_back("max_non_split_rounding_mb");
  if (c.garbage_collection_threshold != d.garbage_collection_threshold)
    keys.emplace_back("garbage_collection_threshold");
  return keys;
}

bool plugin_clearly_better(const ReplayResult& plugin, const ReplayResult& native, Bytes cap) {
  if (plugin.stats.num_ooms != native.stats.num_ooms) return plugin.stats.num_ooms < native.stats.num_ooms;
  if (cap > 0 && plugin.stats.num_ooms == 0 && is_safe_under_cap(plugin.peak_reserved(), cap) &&
      !is_safe_under_cap(native.peak_reserved(), cap))
    return true;
  return static_cast<double>(plugin.peak_reserved()) <=
         (1.0 - kPluginMinSaving) * static_cast<double>(native.peak_reserved());
}

std::string wrap_text(std::string_view text, std::size_t width, std::string_view indent) {
  std::string out, line(indent);
  std::size_t at = 0;
  while (at < text.size()) {
    std::size_t end = text.find(' ', at);
    if (end == std::string_view::npos) end = text.size();
    const std::string_view word = text.substr(at, end - at);
    if (line.size() > indent.size() && line.size() + 1 + word.size() > width) {
      out += line + "\n";
      line = indent;
    }
    if (line.size() > indent.size()) line += ' ';
    line += word;
    at = end + 1;
  }
  if (line.size() > indent.size()) out += line + "\n";
  return out;
}

std::string fit_lines(std::string_view text, std::size_t width) {
  std::string out;
  std::size_t at = 0;
  while (at < text.size()) {
    std::size_t nl = text.find('\n', at);
    if (nl == std::string_view::npos) nl = text.size();
    const std::string_view line = text.substr(at, nl - at);
    if (line.size() <= width) {
      out += line;
      out += '\n';
    } else {
      // The first line as wrap_text cuts it (keeping the line's own indentation), the rest
      // indented by two more.
      std::size_t lead = 0;
      while (lead < line.size() && line[lead] == ' ') ++lead;
      const std::string indent(line.substr(0, lead));
      const std::string first = wrap_text(line.substr(lead), width, indent);
      const std::size_t cut = first.find('\n');
      out += first.substr(0, cut + 1);
      std::size_t used = cut;
      while (used < line.size() && line[used] == ' ') ++used;
      out += wrap_text(line.substr(used), width, indent + "  ");
    }
    at = nl + 1;
  }
  return out;
}

std::size_t best_plugin(const TuneResult& tr) {
  for (std::size_t i : tr.ranking)
    if (!pytorch_accepts(tr.results[i].config)) return i;
  return kRecorded;
}

namespace {

std::string requests(std::int64_t n) { return n == 1 ? "1 request" : fmt::format("{} requests", n); }

std::string ooms_sentence(std::int64_t from, std::int64_t to) {
  if (from == to)
    return from == 0   ? ""
           // Said of the recorded configuration's replay, which may fail where the recorded run did not.
           : from == 1 ? "The request that runs out of memory with the recorded configuration still does. "
                       : fmt::format("The same {} requests still run out of memory. ", from);
  if (to == 0) return from == 1 ? "The request that ran out of memory succeeds. "
                                : fmt::format("All {} that ran out of memory succeed. ", requests(from));
  if (to < from)
    return fmt::format("{} of the {} that ran out of memory succeed; {} still fail. ", from - to, requests(from), to);
  return fmt::format("{} more run out of memory ({} instead of {}). ", to - from == 1 ? std::string("1 request")
                                                                                       : requests(to - from),
                     to, from);
}

}  // namespace

std::string describe_change(const ReplayResult& from, const ReplayResult& to) {
  std::string s = ooms_sentence(from.stats.num_ooms, to.stats.num_ooms);
  const std::int64_t a = from.peak_reserved(), b = to.peak_reserved();
  if (a == b) {
    s += fmt::format("Peak reserved unchanged ({})", human_bytes(b));
  } else {
    const double pct = a > 0 ? 100.0 * static_cast<double>(b > a ? b - a : a - b) / static_cast<double>(a) : 0.0;
    s += fmt::format("Peak reserved {} instead of {} ({:.1f}% {})", human_bytes(b), human_bytes(a), pct,
                     b < a ? "less" : "more");
  }
  auto count = [](const char* what, std::int64_t b, std::int64_t a) {
    return a == b ? fmt::format("; {} unchanged ({})", what, b) : fmt::format("; {} {} instead of {}", what, b, a);
  };
  s += count("retries", to.stats.num_alloc_retries, from.stats.num_alloc_retries);
  s += count("device calls", device_calls(to), device_calls(from)) + ".";
  return s;
}

}  // namespace cachet::replay

// The trace front door (cachet/io/trace_reader.h): format detection, gzip, the sidecar. The
// formats' readers live in trace_pickle.cpp and trace_json.cpp.
#include "cachet/io/trace_reader.h"

#include <fmt/format.h>

#include <filesystem>

#include "cachet/io/file.h"
#include "trace_build.h"

namespace cachet::io {
namespace {

constexpr std::string_view kTraceFormats =
    "cachet reads a PyTorch memory snapshot (a pickle from torch.cuda.memory._dump_snapshot(), or the "
    "same dict as JSON: {\"segments\": ..., \"device_traces\": ...}) or a cachet oracle recording "
    "(results/res_*.json), either one optionally gzipped";

// What an unreadable file holds, as far as its first bytes tell (`b` starts at the first
// non-blank byte).
std::string what_it_is(std::string_view b) {
  const auto first = static_cast<unsigned char>(b[0]);
  if (b[0] == '[') {
    // The first element: an op list's rows are ["a", id, size, stream]; memory_snapshot() is a
    // list of segment dicts.
    const std::string_view head = b.substr(0, 4096);
    std::size_t j = 1;
    while (j < head.size() && (head[j] == ' ' || head[j] == '\n' || head[j] == '\r' || head[j] == '\t')) ++j;
    if (j < head.size() && head[j] == '[' && head.find("[\"a\"", j) == j)
      return "a JSON array of ops, a cachet op list (ops_*.json), which `cachet conform OPS RESULT` reads, "
             "not a trace";
    if (j < head.size() && head[j] == '{' && (head.find("\"segment_type\"") != std::string_view::npos ||
                                              head.find("\"total_size\"") != std::string_view::npos))
      return "a JSON array of segments (torch.cuda.memory_snapshot()): segments only, no trace events to "
             "replay; save torch.cuda.memory._snapshot() (a dict with \"device_traces\") instead";
    return "a JSON array (a list), not a trace";
  }
  if (b.substr(0, 4) == "PK\x03\x04")
    return "a zip archive (torch.save() writes these: a model or tensors, not a memory trace)";
  if (first >= 0x20 && first < 0x7f)
    return fmt::format("unrecognised format (first byte 0x{:02x} '{}')", first, b[0]);
  return fmt::format("unrecognised format (first byte 0x{:02x})", first);
}

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

}  // namespace

TraceFile parse_trace(std::string_view bytes, std::string_view name) {
  if (is_gzip(bytes)) {
    const std::string plain = gunzip(bytes, name);
    if (is_gzip(plain)) throw ReadError(std::string(name) + ": gzip inside gzip is not read");
    return parse_trace(plain, name);
  }
  if (bytes.empty())
    throw ReadError(fmt::format("{}: empty file (0 bytes; was it written completely?): {}", name, kTraceFormats));
  if (static_cast<unsigned char>(bytes[0]) == 0x80) return parse_snapshot_pickle(bytes, name);
  std::size_t i = 0;
  if (bytes.substr(0, 3) == "\xEF\xBB\xBF") i = 3;  // UTF-8 byte order mark
  while (i < bytes.size() && (bytes[i] == ' ' || bytes[i] == '\n' || bytes[i] == '\r' ||
                              bytes[i] == '\t'))
    ++i;
  if (i < bytes.size() && bytes[i] == '{') return parse_trace_json(bytes.substr(i), name);
  if (i == bytes.size()) throw ReadError(fmt::format("{}: only white space ({} bytes): {}", name, bytes.size(), kTraceFormats));
  throw ReadError(fmt::format("{}: {}: {}", name, what_it_is(bytes.substr(i)), kTraceFormats));
}

std::string stats_sidecar_path(std::string_view path) {
  std::string base(path);
  for (std::string_view suffix : {".gz", ".json", ".pickle", ".pkl", ".trace"})
    if (ends_with(base, suffix)) base.resize(base.size() - suffix.size());
  return base + ".stats.json";
}

TraceFile read_trace(const std::string& path) {
  check_not_directory(path, kTraceFormats);
  const std::string bytes = read_file(path);  // gunzipped when gzip
  TraceFile t = parse_trace(bytes, path);
  if (t.format != TraceFormat::OracleRecording) {
    std::string side = stats_sidecar_path(path);
    std::error_code ec;
    if (!std::filesystem::is_regular_file(side, ec)) side += ".gz";  // read_file gunzips it
    if (side != path && std::filesystem::is_regular_file(side, ec)) {
      apply_stats_sidecar(t, read_file(side), side);
      t.sidecar = side;
    }
  }
  return t;
}

}  // namespace cachet::io

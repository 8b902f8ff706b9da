// cachet/io/trace_json.h: the JSON trace reader's entry points (src/trace_json.cpp): a
// _snapshot() dictionary as JSON or an oracle recording, and the .stats.json sidecar.
// Bytes must already be gunzipped for parse_trace_json; the front door (trace_reader.h) detects
// the format and gunzips. Bad input throws ReadError (trace_reader.h says how it reads).
#pragma once

#include <string_view>

#include "cachet/io/trace_file.h"

namespace cachet::io {

// JSON: a snapshot dictionary or an oracle recording (told apart by their keys).
TraceFile parse_trace_json(std::string_view bytes, std::string_view name);

// Applies a stats sidecar's JSON text (total_memory, final_stats, device, conf; gzip or plain)
// to `t`.
void apply_stats_sidecar(TraceFile& t, std::string_view json, std::string_view name);

}  // namespace cachet::io

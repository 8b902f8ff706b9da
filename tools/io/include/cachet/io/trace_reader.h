// cachet/io/trace_reader.h: one front door for the allocator traces users have on disk, read
// into one in-memory form (TraceFile, cachet/io/trace_file.h): the trace events of each device,
// the snapshot's segments, the recorded allocator settings and the device's total memory when
// known.
//
// Formats, detected by content (never by file name):
//   - SnapshotPickle: torch.cuda.memory._dump_snapshot() output (pickle, PROTO 0x80 first);
//   - SnapshotJson: the same dictionary as JSON ({"segments", "device_traces",
//     "allocator_settings"}), e.g. the oracle's workloads/*.trace.json.gz;
//   - OracleRecording: an oracle recording results/*.json.gz ("steps", and "trace" rows
//     [action, addr, size, stream]); only its trace, conf, cap, total_memory and final
//     segments are read here (tools/io's recording reader reads the rest).
// Any of them may be gzipped (magic 1f 8b).
//
// Bad input throws ReadError "<name>: <where>: <problem>", where <where> is a byte offset, a
// pickle offset or a field path such as device_traces[0][17].size. Nothing aborts; memory is
// bounded by a small multiple of the input size.
#pragma once

#include <string>
#include <string_view>

#include "cachet/io/trace_file.h"
#include "cachet/io/trace_json.h"
#include "cachet/io/trace_pickle.h"

namespace cachet::io {

// Parses bytes (gzip or plain) of any of the three formats. `name` names the source in errors
// and becomes TraceFile::name. No file is touched (no sidecar): this is the fuzzing entry.
TraceFile parse_trace(std::string_view bytes, std::string_view name);

// The same, one format at a time (bytes already gunzipped): trace_pickle.h's
// parse_snapshot_pickle and trace_json.h's parse_trace_json.

// Reads `path` (gzip or plain, any format) and, for snapshots, the `.stats.json` sidecar beside
// it when one exists (<base>.stats.json, or gzipped <base>.stats.json.gz, for
// <base>[.trace][.json|.pickle|.pkl][.gz]): its total_memory, final_stats, device and conf fill
// what the snapshot lacks.
TraceFile read_trace(const std::string& path);

// (trace_json.h's apply_stats_sidecar applies a sidecar's text to a TraceFile.)

// The sidecar path read_trace() looks for beside `path`.
std::string stats_sidecar_path(std::string_view path);

}  // namespace cachet::io

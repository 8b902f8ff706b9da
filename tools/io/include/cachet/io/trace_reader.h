// cachet/io/trace_reader.h: one front door for the allocator traces users have on disk, read
// into one in-memory form (TraceFile): the trace events of each device, the snapshot's
// segments, the recorded allocator settings and the device's total memory when known.
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

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cachet/snapshot.h"
#include "cachet/trace.h"
#include "cachet/types.h"

namespace cachet::io {

enum class TraceFormat : std::uint8_t { SnapshotPickle, SnapshotJson, OracleRecording };

// "snapshot-pickle", "snapshot-json", "oracle-recording".
std::string_view to_string(TraceFormat f);

// _snapshot()["allocator_settings"] (docs/pytorch-allocator.md §8), or what a recording says of its settings.
struct AllocatorSettings {
  // PYTORCH_CUDA_ALLOC_CONF as recorded (the last settings string); nullopt when the file did
  // not record one. Parse it with cachet::parse_config(..., ConfigSource::PyTorch).
  std::optional<std::string> conf;
  // Every recorded field, in file order, its value rendered as text (Python-like: True,
  // -1, 0.0, {'1': 0, ...}), including PYTORCH_CUDA_ALLOC_CONF itself.
  std::vector<std::pair<std::string, std::string>> fields;
};

struct DeviceTrace {
  DeviceIndex device = 0;
  std::vector<TraceEvent> events;  // device_traces[device], oldest first
  Snapshot segments;               // segments whose "device" is this one, by address
};

struct TraceFile {
  TraceFormat format = TraceFormat::SnapshotJson;
  std::string name;                  // what it was read from (path or the name given)
  std::vector<DeviceTrace> devices;  // devices with a trace or a segment, by index
  AllocatorSettings settings;
  std::optional<Bytes> total_memory;  // device total memory, when recorded (stats sidecar,
                                      // recording)
  std::optional<Bytes> cap;           // recording: set_per_process_memory_fraction cap, 0 = none
  std::string device_name;            // e.g. "NVIDIA H200", when recorded
  std::map<std::string, std::int64_t> final_stats;  // memory_stats() at the end, when recorded
  std::string sidecar;                // the .stats.json read beside it ("" if none)

  std::size_t event_count() const;
  // The trace of `device`, or nullptr.
  const DeviceTrace* device(DeviceIndex d) const;
};

// Limits that keep hostile input from costing unbounded memory or time.
inline constexpr std::size_t kMaxDevices = 1024;  // device indices 0..1023

// Parses bytes (gzip or plain) of any of the three formats. `name` names the source in errors
// and becomes TraceFile::name. No file is touched (no sidecar): this is the fuzzing entry.
TraceFile parse_trace(std::string_view bytes, std::string_view name);

// The same, one format at a time (bytes already gunzipped).
TraceFile parse_snapshot_pickle(std::string_view bytes, std::string_view name);
// JSON: a snapshot dictionary or an oracle recording (told apart by their keys).
TraceFile parse_trace_json(std::string_view bytes, std::string_view name);

// Reads `path` (gzip or plain, any format) and, for snapshots, the `.stats.json` sidecar beside
// it when one exists (<base>.stats.json, or gzipped <base>.stats.json.gz, for
// <base>[.trace][.json|.pickle|.pkl][.gz]): its total_memory, final_stats, device and conf fill
// what the snapshot lacks.
TraceFile read_trace(const std::string& path);

// Applies a stats sidecar's JSON text (total_memory, final_stats, device, conf) to `t`.
void apply_stats_sidecar(TraceFile& t, std::string_view json, std::string_view name);

// The sidecar path read_trace() looks for beside `path`.
std::string stats_sidecar_path(std::string_view path);

}  // namespace cachet::io

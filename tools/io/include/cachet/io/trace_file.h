// cachet/io/trace_file.h: the in-memory form of an allocator trace read from disk (TraceFile), the
// one every reader fills and every consumer reads.
//
// Glossary:
//   TraceFormat        which of the three file formats it was read from (trace_reader.h's
//                      header comment lists them);
//   DeviceTrace        one device's trace events, oldest first, and its snapshot segments;
//   AllocatorSettings  the recorded allocator settings (_snapshot()["allocator_settings"]).
//
// Who fills it: trace_pickle.h (pickled snapshots), trace_json.h (JSON snapshots, recordings and
// the .stats.json sidecar); trace_reader.h is the front door that tells the formats apart. This
// header depends on none of them, so the readers and the front door all include it and none of
// them includes another's header for the types.
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

}  // namespace cachet::io

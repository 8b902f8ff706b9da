// TraceFile's small members and TraceFormat's names (cachet/io/trace_file.h).
#include "cachet/io/trace_file.h"

namespace cachet::io {

std::string_view to_string(TraceFormat f) {
  switch (f) {
    case TraceFormat::SnapshotPickle: return "snapshot-pickle";
    case TraceFormat::SnapshotJson: return "snapshot-json";
    case TraceFormat::OracleRecording: return "oracle-recording";
  }
  return "unknown";
}

std::size_t TraceFile::event_count() const {
  std::size_t n = 0;
  for (const auto& d : devices) n += d.events.size();
  return n;
}

const DeviceTrace* TraceFile::device(DeviceIndex d) const {
  for (const auto& t : devices)
    if (t.device == d) return &t;
  return nullptr;
}

}  // namespace cachet::io

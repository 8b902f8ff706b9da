// tools/io/src/trace_build.h (private to cachet_io): what the pickle and JSON trace readers
// share: collecting devices, checking values, error messages.
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>

#include "cachet/io/file.h"
#include "cachet/io/trace_file.h"

namespace cachet::io::detail {

[[noreturn]] inline void fail(std::string_view name, std::string_view where,
                              std::string_view what) {
  throw ReadError(fmt::format("{}: {}: {}", name, where, what));
}

// Checks a size or address read from a trace. Sizes of 2^60 bytes or more cannot appear in a
// real trace (PyTorch refuses such requests before recording anything).
// `where` is a callable returning the field path; it is called only on error, so the hot
// path formats nothing.
template <class Where>
inline Bytes checked_size(std::int64_t v, std::string_view name, Where&& where) {
  if (v < 0) [[unlikely]]
    fail(name, where(), fmt::format("negative size {}", v));
  if (static_cast<Bytes>(v) >= kMaxRequest) [[unlikely]]
    fail(name, where(), fmt::format("absurd size {} (2^60 bytes or more)", v));
  return static_cast<Bytes>(v);
}

template <class Where>
inline DeviceIndex checked_device(std::int64_t v, std::string_view name, Where&& where) {
  if (v < 0 || static_cast<std::uint64_t>(v) >= kMaxDevices)
    fail(name, where(), fmt::format("device index {} out of range 0..{}", v, kMaxDevices - 1));
  return static_cast<DeviceIndex>(v);
}

// trace_action_from_string, with the common names first.
inline std::optional<TraceAction> fast_action(std::string_view s) {
  switch (s.size()) {
    case 5:
      if (s == "alloc") return TraceAction::Alloc;
      break;
    case 14:
      if (s == "free_requested") return TraceAction::FreeRequested;
      if (s == "free_completed") return TraceAction::FreeCompleted;
      break;
    default: break;
  }
  return trace_action_from_string(s);
}

template <class Where>
inline TraceAction checked_action(std::string_view s, std::string_view name, Where&& where) {
  if (auto a = fast_action(s)) return *a;
  fail(name, where(),
       fmt::format("unknown trace action '{}' (expected alloc, free_requested, free_completed, "
                   "segment_alloc, segment_free, segment_map, segment_unmap, snapshot or oom)",
                   s.substr(0, 64)));
}

template <class Where>
inline BlockState checked_state(std::string_view s, std::string_view name, Where&& where) {
  if (auto st = block_state_from_string(s)) return *st;
  fail(name, where(),
       fmt::format("unknown block state '{}' (expected active_allocated, active_pending_free or "
                   "inactive)",
                   s.substr(0, 64)));
}

// Devices in index order.
class DeviceSet {
 public:
  DeviceTrace& at(DeviceIndex d) {
    auto [it, inserted] = devices_.try_emplace(d);
    if (inserted) it->second.device = d;
    return it->second;
  }
  std::vector<DeviceTrace> take() {
    std::vector<DeviceTrace> out;
    out.reserve(devices_.size());
    for (auto& [d, t] : devices_) {
      std::stable_sort(t.segments.begin(), t.segments.end(),
                       [](const SegmentSnapshot& a, const SegmentSnapshot& b) {
                         return a.address < b.address;
                       });
      out.push_back(std::move(t));
    }
    return out;
  }

 private:
  std::map<DeviceIndex, DeviceTrace> devices_;
};

}  // namespace cachet::io::detail

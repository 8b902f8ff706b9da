// Loading a trace for replay: the file, the recorded configuration, and what it says of the
// device's memory (DeviceMemoryFacts). See cachet/replay/replay.h.
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <variant>

#include "cachet/errors.h"
#include "cachet/io/file.h"
#include "cachet/io/frames.h"
#include "cachet/io/recording.h"
#include "cachet/replay/explain.h"
#include "cachet/replay/replay.h"
#include "cachet/replay/report.h"

namespace cachet::replay {
namespace {

// The first out-of-memory entry with the device's free bytes, and the trace's reserved bytes
// there (segment events up to it); the trace's peak reserved (all its segment events).
DeviceMemoryFacts oom_facts(const std::vector<TraceEvent>& ev) {
  DeviceMemoryFacts f;
  Bytes reserved = 0;
  for (std::size_t i = 0; i < ev.size(); ++i) {
    const TraceEvent& e = ev[i];
    switch (e.action) {
      case TraceAction::SegmentAlloc:
      case TraceAction::SegmentMap:
        reserved += e.size;
        f.trace_peak_reserved = std::max(f.trace_peak_reserved, reserved);
        break;
      case TraceAction::SegmentFree:
      case TraceAction::SegmentUnmap:
        reserved = e.size > reserved ? 0 : reserved - e.size;
        break;
      case TraceAction::Oom:
        if (f.oom_seen) break;
        f.oom_seen = true;
        f.oom_event = i;
        f.oom_request = e.size;
        f.oom_free = e.addr;  // TraceEvent: an oom's addr is the device's free bytes
        f.oom_reserved = reserved;
        f.cap_in_force = e.addr > e.size + kCapEvidence;
        break;
      default:
        break;
    }
  }
  return f;
}

// An oracle recording and the op list it replayed, when needed: the recording has an `oom` event
// (size_failed_requests) or its op list has pool or capture ops (route_recording_pools).
// nullopt: not a recording, not needed, or no op list readable beside it.
struct RecordingOps {
  io::Recording rec;
  std::vector<ops::Op> ops;
  std::string ops_path;
};

std::optional<RecordingOps> read_recording_ops(const LoadedTrace& lt, const std::string& path,
                                               const io::DeviceTrace& d) {
  if (lt.file.format != io::TraceFormat::OracleRecording) return std::nullopt;
  try {
    RecordingOps r;
    r.ops_path = io::ops_path_for(path);
    r.ops = io::read_ops(r.ops_path);
    const bool oom = std::any_of(d.events.begin(), d.events.end(),
                                 [](const TraceEvent& e) { return e.action == TraceAction::Oom; });
    if (!oom && std::none_of(r.ops.begin(), r.ops.end(), [](const ops::Op& o) { return ops::is_pool_op(o); }))
      return std::nullopt;
    r.rec = io::read_recording(path);
    return r;
  } catch (const io::ReadError&) {  // no op list beside it, or unreadable
    return std::nullopt;
  }
}

// The size each `oom` event asked for (FailedRequest), then the replay's OomRequest ops set to
// it. PyTorch's oom entry records round_size(request); its alloc entries record the request
// itself. Sources, best first: the op list an oracle recording replayed (its k-th "oom" step is
// the trace's k-th oom event); the latest earlier alloc with the entry's stack whose size rounds
// to the entry's (a training step repeats its requests); for an entry with no stack, the latest
// earlier one at the same place in the allocation sequence (FailedRequest::SameContext); else the
// rounded size, assumed.
void size_failed_requests(LoadedTrace& lt, const std::string& path, const io::DeviceTrace& d,
                          const std::optional<RecordingOps>& ro) {
  using Source = FailedRequest::Source;
  const Config& c = lt.run.config;
  for (std::size_t i = 0; i < d.events.size(); ++i)
    if (d.events[i].action == TraceAction::Oom) {
      FailedRequest f;
      f.event = i;
      f.recorded = f.size = d.events[i].size;
      lt.failed_requests.push_back(f);
    }
  if (lt.failed_requests.empty()) return;
  if (lt.file.format == io::TraceFormat::OracleRecording) {
    if (ro) {  // else no op list beside it, or unreadable: the rounded size stays
      const io::Recording& rec = ro->rec;
      const std::vector<ops::Op>& ops = ro->ops;
      std::size_t k = 0;
      for (std::size_t i = 0; i < rec.steps.size() && i < ops.size() && k < lt.failed_requests.size(); ++i) {
        if (!rec.steps[i].oom) continue;
        FailedRequest& f = lt.failed_requests[k++];
        const auto* a = std::get_if<ops::Allocate>(&ops[i]);
        if (a == nullptr || pytorch_round_size(a->size, c) != f.recorded) continue;  // not this request
        f.size = a->size;
        f.source = Source::OpList;
        f.from = i;
        f.op_list = ro->ops_path;
      }
    }
  } else {
    std::vector<std::vector<io::Frame>> frames;
    try {
      frames = io::read_event_frames(path, lt.device);
    } catch (const io::ReadError&) {
    }
    auto frameless = [&](std::size_t i) { return i >= frames.size() || frames[i].empty(); };
    std::vector<std::size_t> allocs;  // the alloc events, in order
    for (std::size_t i = 0; i < d.events.size(); ++i)
      if (d.events[i].action == TraceAction::Alloc) allocs.push_back(i);
    // The kContextAllocs allocs before event i (their positions in `allocs`): [from, to).
    auto context_end = [&](std::size_t i) {
      return static_cast<std::size_t>(std::lower_bound(allocs.begin(), allocs.end(), i) - allocs.begin());
    };
    auto same_context = [&](std::size_t a_end, std::size_t b_end) {
      if (a_end < kContextAllocs || b_end < kContextAllocs) return false;
      for (std::size_t j = 1; j <= kContextAllocs; ++j) {
        const TraceEvent& x = d.events[allocs[a_end - j]];
        const TraceEvent& y = d.events[allocs[b_end - j]];
        if (x.size != y.size || x.stream != y.stream) return false;
      }
      return true;
    };
    for (FailedRequest& f : lt.failed_requests) {
      if (frameless(f.event)) {
        const std::size_t mine = context_end(f.event);
        for (std::size_t p = mine; p-- > 0;) {
          const TraceEvent& e = d.events[allocs[p]];
          if (!frameless(allocs[p]) || e.stream != d.events[f.event].stream ||
              pytorch_round_size(e.size, c) != f.recorded || !same_context(p, mine))
            continue;
          f.size = e.size;
          f.source = Source::SameContext;
          f.from = allocs[p];
          break;
        }
        continue;
      }
      for (std::size_t k = f.event; k-- > 0;) {
        const TraceEvent& e = d.events[k];
        if (e.action != TraceAction::Alloc || k >= frames.size() || pytorch_round_size(e.size, c) != f.recorded ||
            frames[k] != frames[f.event])
          continue;
        f.size = e.size;
        f.source = Source::SameStack;
        f.from = k;
        break;
      }
    }
  }
  std::size_t k = 0;
  for (Op& op : lt.trace.ops) {
    if (op.kind != OpKind::OomRequest) continue;
    while (k < lt.failed_requests.size() && lt.failed_requests[k].event < op.event) ++k;
    if (k < lt.failed_requests.size() && lt.failed_requests[k].event == op.event) op.size = lt.failed_requests[k].size;
  }
}

}  // namespace

std::string failed_request_source(const FailedRequest& f, const Config& c) {
  using Source = FailedRequest::Source;
  switch (f.source) {
    case Source::OpList:
      return fmt::format("what the program asked for, from op {} of the op list {}; PyTorch's oom entry records {} "
                         "bytes, the size after its rounding",
                         f.from, std::filesystem::path(f.op_list).filename().string(), f.recorded);
    case Source::SameStack:
      return fmt::format("the size of trace event {}, an earlier allocation with the same stack whose size rounds to "
                         "the oom entry's {} bytes (the entry records the size after PyTorch's rounding, not the "
                         "request)",
                         f.from, f.recorded);
    case Source::SameContext:
      return fmt::format("the size of trace event {}, an earlier allocation at the same place in a repeated step (no "
                         "stack recorded for either; the {} allocations before each have the same sizes and streams) "
                         "whose size rounds to the oom entry's {} bytes (the entry records the size after PyTorch's "
                         "rounding, not the request)",
                         f.from, kContextAllocs, f.recorded);
    case Source::Rounded:
      break;
  }
  return fmt::format("the size after PyTorch's rounding that its oom entry records: nothing in the trace tells the "
                     "request (no op list, no earlier allocation that rounds to it with its stack or at its place in a "
                     "repeated step), so the rounded "
                     "size is assumed; the program asked for {} to {} bytes",
                     smallest_request_rounding_to(f.recorded, c), f.recorded);
}

std::string failed_request_line(const LoadedTrace& lt) {
  if (lt.failed_requests.empty()) return {};
  const FailedRequest& f = lt.failed_requests.front();
  std::string s = fmt::format("the request that ran out of memory in the recorded run (trace event {}) is replayed at "
                              "{} bytes, {}",
                              f.event, f.size, failed_request_source(f, lt.run.config));
  if (lt.failed_requests.size() > 1) {
    std::size_t n[4] = {0, 0, 0, 0};
    for (const FailedRequest& r : lt.failed_requests) ++n[static_cast<int>(r.source)];
    s += fmt::format("; of the {} requests that ran out of memory, {} are sized from the op list, {} from an earlier "
                     "allocation with the same stack, {} from one at the same place in a repeated step, {} at the "
                     "rounded size (assumed)",
                     lt.failed_requests.size(), n[0], n[1], n[2], n[3]);
  }
  return s;
}

LoadedTrace load_trace(const std::string& path, std::optional<Bytes> device_memory, DeviceIndex device) {
  return load_trace(path, LoadOptions{.device_memory = device_memory, .cap = std::nullopt, .device = device});
}

LoadedTrace load_trace(const std::string& path, const LoadOptions& opt) {
  if (opt.device_memory && *opt.device_memory == 0)
    throw io::ReadError("device memory of 0 bytes: give the GPU's memory, for example --device-memory 80GiB");
  LoadedTrace lt;
  lt.file = io::read_trace(path);
  const io::DeviceTrace* d = nullptr;
  if (opt.device >= 0) {
    d = lt.file.device(opt.device);
    if (d == nullptr) throw io::ReadError(path + ": no trace for device " + std::to_string(opt.device));
  } else {
    std::string with_events;
    std::size_t n = 0;
    for (const auto& dt : lt.file.devices)
      if (!dt.events.empty()) {
        if (d == nullptr) d = &dt;
        with_events += fmt::format("{}{}", n++ ? ", " : "", dt.device);
      }
    if (n > 1)
      lt.device_note = fmt::format("the file has trace events for {} devices ({}); device {} is replayed (the first), "
                                   "the others are not",
                                   n, with_events, d->device);
  }
  lt.device = d ? d->device : 0;
  if (d != nullptr && !d->segments.empty()) {
    Bytes reserved = 0, allocated = 0;
    for (const auto& seg : d->segments) {
      reserved += seg.total_size;
      allocated += seg.allocated_size();
    }
    lt.end_reserved = reserved;
    lt.end_allocated = allocated;
  }
  if (lt.file.settings.conf) {
    lt.recorded_conf_text = *lt.file.settings.conf;
    try {
      lt.recorded_config = parse_config(lt.recorded_conf_text, ConfigSource::PyTorch).config;
    } catch (const ConfigError& e) {
      lt.config_note = std::string("recorded configuration not understood (") + e.what() + "); using the default";
    }
  }
  lt.run.config = lt.recorded_config.value_or(Config{});
  lt.run.cap = opt.cap ? *opt.cap : lt.file.cap.value_or(0);
  if (d != nullptr) {
    lt.memory = oom_facts(d->events);
    // Oracle recordings write an oom's free bytes as null (0): they record total_memory and the cap.
    if (lt.file.format == io::TraceFormat::OracleRecording) {
      const Bytes peak = lt.memory.trace_peak_reserved;
      lt.memory = DeviceMemoryFacts{};
      lt.memory.trace_peak_reserved = peak;
    }
  }
  // The limit the recorded allocator ran under, for telling its own releases from the user's
  // empty_cache(): never a what-if --cap. A cap the trace shows but does not record was at least
  // the trace's peak reserved: a release that a new segment needed beyond that peak was the
  // allocator's (its free-and-retry, garbage collection), whatever --cap asks.
  if (lt.file.cap)
    lt.run.release_limit = *lt.file.cap;
  else if (lt.memory.cap_in_force)
    lt.run.release_limit = lt.memory.trace_peak_reserved;
  using Source = DeviceMemoryFacts::Source;
  if (opt.device_memory) {
    lt.memory.source = Source::Option;
    lt.run.total_memory = *opt.device_memory;
  } else if (lt.file.total_memory) {
    lt.memory.source = Source::Recorded;
    lt.run.total_memory = *lt.file.total_memory;
  } else if (lt.memory.oom_seen) {
    // What the process could get: its reserved bytes and the device's free ones.
    lt.memory.source = Source::OomEntry;
    lt.run.total_memory = std::max(lt.memory.oom_reserved + lt.memory.oom_free, lt.run.cap);
  } else {
    lt.memory.source = Source::Unknown;
    lt.run.total_memory = std::max(kNoDeviceLimit, lt.run.cap);
  }
  static const std::vector<TraceEvent> none;
  lt.trace = prepare_trace(d ? std::span<const TraceEvent>(d->events) : std::span<const TraceEvent>(none), lt.run,
                           lt.file.name);
  const std::optional<RecordingOps> ro = d != nullptr ? read_recording_ops(lt, path, *d) : std::nullopt;
  // Private pools: where an oracle recording's op list entered and left them, else inferred
  // from the snapshot's segments (cachet/replay/pools.h).
  if (d != nullptr && !(ro && route_recording_pools(lt.trace, d->events, d->segments, ro->rec, ro->ops, ro->ops_path)))
    route_to_pools(lt.trace, d->events, d->segments);
  if (d != nullptr) size_failed_requests(lt, path, *d, ro);
  const io::TraceStats& file_stats = lt.trace.stats;
  if (file_stats.count(TraceAction::Alloc) == 0 && file_stats.count(TraceAction::Oom) == 0) {
    std::size_t segments = 0;
    for (const auto& dt : lt.file.devices) segments += dt.segments.size();
    throw io::ReadError(fmt::format(
        "{}: nothing to replay: the trace has no alloc or oom event ({} trace events, {} segments in the file); "
        "the snapshot was taken without torch.cuda.memory._record_memory_history() (or after it was turned off): "
        "call _record_memory_history(max_entries=1000000) before the code to study, then _dump_snapshot()",
        path, file_stats.events, segments));
  }
  return lt;
}

std::string missing_cap_error(const LoadedTrace& lt) {
  const DeviceMemoryFacts& m = lt.memory;
  if (!m.cap_in_force || lt.run.cap > 0) return {};
  return fmt::format(
      "{}: a memory cap was in force: the request that ran out of memory (trace event {}, {}) found {} free on "
      "the device, so a cap (torch.cuda.set_per_process_memory_fraction) refused it, and the trace does not "
      "record its size. Give it with --cap BYTES (PyTorch's out-of-memory message says it: \"... GiB allowed\")",
      lt.file.name, m.oom_event, human_bytes_exact(m.oom_request), human_bytes(static_cast<std::int64_t>(m.oom_free)));
}

std::string device_memory_line(const LoadedTrace& lt, Bytes cap) {
  const DeviceMemoryFacts& m = lt.memory;
  const std::string size = human_bytes_exact(lt.run.total_memory);
  switch (m.source) {
    case DeviceMemoryFacts::Source::Option:
      return fmt::format("device memory: {} (--device-memory)", size);
    case DeviceMemoryFacts::Source::Recorded:
      return fmt::format("device memory: {} (recorded beside the trace)", size);
    case DeviceMemoryFacts::Source::OomEntry:
      return fmt::format(
          "device memory: {} for this process, from the trace's out-of-memory entry (reserved {} + {} free on the "
          "device); --device-memory overrides it",
          size, human_bytes(static_cast<std::int64_t>(m.oom_reserved)), human_bytes(static_cast<std::int64_t>(m.oom_free)));
    case DeviceMemoryFacts::Source::Unknown:
      break;
  }
  if (cap > 0 || m.oom_seen || lt.trace.stats.count(TraceAction::Oom) > 0)
    return fmt::format(
        "note: the trace does not record the device's memory; replayed with no device limit{} (give the GPU's "
        "memory with --device-memory BYTES, e.g. --device-memory 80GiB)",
        cap > 0 ? ", only the cap" : "");
  return "device memory: not recorded in the trace (no cap, no out-of-memory error: replayed with no device limit)";
}

std::string own_releases_line(const LoadedTrace& lt) {
  const Trace& t = lt.trace;
  std::string out;
  const std::uint64_t n = t.retry_releases + t.retry_releases_before_oom;
  if (n > 0)
    out += fmt::format(
        "the recorded allocator's own segment releases (its free-and-retry, garbage collection): {} ({} before a new "
        "segment, {} before an out-of-memory error); not replayed as empty_cache(): the replayed allocator releases "
        "when its own limit requires\n",
        n, t.retry_releases, t.retry_releases_before_oom);
  return out;
}

std::optional<Bytes> recorded_peak_reserved(const LoadedTrace& lt, std::string* source) {
  if (auto it = lt.file.final_stats.find("reserved_bytes.all.peak"); it != lt.file.final_stats.end()) {
    if (source) *source = "PyTorch's reserved_bytes.all.peak";
    return static_cast<Bytes>(it->second);
  }
  if (lt.memory.trace_peak_reserved > 0) {
    if (source) *source = "the trace's segment events";
    return lt.memory.trace_peak_reserved;
  }
  return std::nullopt;
}

std::string recorded_peak_note(const LoadedTrace& lt, const ReplayResult& r, Bytes cap) {
  std::string source;
  const auto rec = recorded_peak_reserved(lt, &source);
  if (!rec || static_cast<Bytes>(r.peak_reserved()) == *rec) return {};
  std::vector<std::string> why;
  const DeviceMemoryFacts& m = lt.memory;
  if (lt.file.cap) {
    if (cap != *lt.file.cap)
      why.push_back(fmt::format("the cap, {}, is not the recorded run's, {}", human_bytes(static_cast<std::int64_t>(cap)),
                                human_bytes(static_cast<std::int64_t>(*lt.file.cap))));
  } else if (m.cap_in_force && m.oom_seen && cap >= m.oom_reserved + m.oom_request) {
    why.push_back(fmt::format("the cap, {}, is above the recorded run's (there a request of {} failed with {} reserved)",
                              human_bytes(static_cast<std::int64_t>(cap)), human_bytes_exact(m.oom_request),
                              human_bytes(static_cast<std::int64_t>(m.oom_reserved))));
  } else if (cap > 0 && cap < m.trace_peak_reserved) {
    why.push_back(fmt::format("the cap, {}, is below what the recorded run reserved",
                              human_bytes(static_cast<std::int64_t>(cap))));
  }
  if (!r.recorded_addresses) why.push_back("synthetic addresses (best-fit ties between equal sizes differ)");
  if (lt.trace.stats.starts_mid_run() || lt.trace.ignored_events > 0)
    why.push_back("the trace starts mid-run: segments reserved before it are missing from its own figure");
  if (why.empty()) why.push_back("the replay differs from the recorded run: please report");
  std::string list;
  for (std::size_t i = 0; i < why.size(); ++i) list += (i ? "; " : "") + why[i];
  return fmt::format("peak reserved of the recorded configuration: {} replayed, {} recorded ({}); they differ: {}",
                     human_bytes_exact(static_cast<Bytes>(r.peak_reserved())), human_bytes_exact(*rec), source, list);
}

std::string oom_end_caveat(const LoadedTrace& lt) {
  const io::DeviceTrace* d = lt.file.device(lt.device);
  if (d == nullptr) return {};
  std::size_t first_oom = d->events.size();
  for (std::size_t i = 0; i < d->events.size(); ++i)
    if (d->events[i].action == TraceAction::Oom) {
      first_oom = i;
      break;
    }
  if (first_oom == d->events.size()) return {};
  for (std::size_t i = first_oom + 1; i < d->events.size(); ++i)
    if (d->events[i].action == TraceAction::Alloc || d->events[i].action == TraceAction::Oom) return {};
  return fmt::format(
      "the trace ends at its out-of-memory error (trace event {}; nothing is allocated after it): what the "
      "program would have done next is not in the trace, so a configuration or cap that avoids the error is judged on "
      "the steps before it only; record a run that gets past it (a larger cap) to see the rest",
      first_oom);
}

std::string headroom_text(std::int64_t peak, Bytes cap) {
  if (cap == 0) return {};
  const auto p = static_cast<Bytes>(std::max<std::int64_t>(peak, 0));
  if (p > cap) return {};
  const Bytes room = cap - p;
  std::string s = fmt::format("headroom under the cap: {} (peak reserved {} of {})", human_bytes_exact(room),
                              human_bytes(peak), human_bytes(static_cast<std::int64_t>(cap)));
  if (room < kSafeHeadroom)
    s += fmt::format("; close to the cap (under {}): on the GPU, other libraries' memory or another allocation order "
                     "can still make it fail, so prefer a pick with more headroom or a slightly larger cap",
                     human_bytes(static_cast<std::int64_t>(kSafeHeadroom)));
  return s;
}

ReplayOptions recorded_options(const LoadedTrace& lt, AddressMode addresses) {
  ReplayOptions o;
  o.device_memory = lt.run.total_memory;
  o.cap = lt.run.cap;
  o.addresses = addresses;
  return o;
}

}  // namespace cachet::replay

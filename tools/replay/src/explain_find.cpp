// explain: finding the moment (the first out-of-memory, else peak reserved) and the smallest
// change of configuration that avoids the out-of-memory (explain.h).
#include <algorithm>
#include <stdexcept>

#include <fmt/format.h>

#include "cachet/replay/explain.h"
#include "cachet/replay/recommend.h"
#include "cachet/replay/report.h"

namespace cachet::replay {

namespace {

// The first op after which num_ooms rose, and the op of peak reserved, under `config`.
struct Scan {
  std::optional<std::size_t> first_oom;
  std::size_t peak_op = 0;
  ReplayResult result;
};

Scan scan(const Trace& t, const Config& config, const ReplayOptions& o) {
  Scan s;
  ReplayOptions x = o;
  std::int64_t best = -1;
  x.observer = [&](std::size_t k, const CachingAllocator& al) {
    const DeviceStats st = al.stats();
    if (!s.first_oom && st.num_ooms > 0) s.first_oom = k;
    if (st.reserved_bytes[0].current > best) {
      best = st.reserved_bytes[0].current;
      s.peak_op = k;
    }
  };
  s.result = replay(t, config, x);
  return s;
}

bool avoids(const ReplayResult& r) { return r.stats.num_ooms == 0 && r.failed_allocs == 0; }

}  // namespace

Explanation explain(const LoadedTrace& lt, const ReplayOptions& o, const std::vector<std::vector<io::Frame>>& frames,
                    const ExplainOptions& eo) {
  const Trace& t = lt.trace;
  const Config& config = lt.run.config;
  Explanation e;
  e.trace = lt.file.name;
  e.conf = to_string(config);
  e.device_memory = o.device_memory;
  e.device_memory_known = lt.memory.source != DeviceMemoryFacts::Source::Unknown;
  e.cap = o.cap;
  e.frames_recorded = !frames.empty();
  e.rounding_set = config.roundup_power2_divisions != Config{}.roundup_power2_divisions;
  if (t.ops.empty()) throw std::invalid_argument(lt.file.name + ": the trace has no allocations to explain");

  Scan s = scan(t, config, o);
  e.baseline = std::move(s.result);
  std::optional<std::size_t> recorded_oom;
  for (std::size_t k = 0; k < t.ops.size() && !recorded_oom; ++k)
    if (t.ops[k].kind == OpKind::OomRequest) recorded_oom = k;
  const io::DeviceTrace* dt = lt.file.device(lt.device);
  auto event_of = [&](std::size_t op) -> const TraceEvent* {
    const std::uint32_t ev = t.ops[op].event;
    return dt && ev < dt->events.size() ? &dt->events[ev] : nullptr;
  };
  if (recorded_oom && !s.first_oom) {
    const TraceEvent* ev = event_of(*recorded_oom);
    std::string why;
    if (ev && ev->action == TraceAction::Oom && lt.file.format != io::TraceFormat::OracleRecording)
      why = fmt::format(" PyTorch's driver reported {} free at that moment, so the process could have had about {} "
                        "more: a cap (set_per_process_memory_fraction) was in force, or the device was shared.",
                        human_bytes(static_cast<std::int64_t>(ev->addr)), human_bytes(static_cast<std::int64_t>(ev->addr)));
    throw std::invalid_argument(fmt::format(
        "the recorded run ran out of memory (a request of {} at trace event {}) but the replay, with {} of device "
        "memory and {}, did not.{} Give the cap the run had with --cap (fraction x total memory, e.g. --cap 12G), or "
        "the device's memory with --device-memory.",
        human_bytes(static_cast<std::int64_t>(t.ops[*recorded_oom].size)), t.ops[*recorded_oom].event,
        human_bytes(static_cast<std::int64_t>(o.device_memory)),
        o.cap ? "a cap of " + human_bytes(static_cast<std::int64_t>(o.cap)) : std::string("no cap"), why));
  }
  if (!recorded_oom && s.first_oom)
    e.notes.push_back("the recorded run had no out-of-memory error; this replay has one (a smaller cap or device "
                      "memory than the recording's); what follows explains the replay's first out-of-memory error");

  Moment& m = e.at;
  m.oom = s.first_oom.has_value();
  m.op = m.oom ? *s.first_oom : s.peak_op;
  const Op& op = t.ops[m.op];
  m.event = op.event;
  m.size = op.size;
  m.stream = op.stream;
  if (op.kind != OpKind::Alloc && op.kind != OpKind::OomRequest) {
    // Peak reserved reached by something other than an allocation (cannot happen: only an
    // allocation reserves); keep the numbers, say so.
    e.notes.push_back("peak reserved was reached by an op that is not an allocation");
  }
  if (m.event < frames.size()) m.frames = frames[m.event];
  if (m.frames.empty() && !frames.empty() && dt)
    for (std::uint64_t k = std::min<std::uint64_t>(m.event, frames.size()); k-- > 0;)
      if (!frames[k].empty() && k < dt->events.size()) {
        m.nearest_event = k;
        m.nearest_what = fmt::format("{} of {}, {} events before", to_string(dt->events[k].action),
                                     human_bytes(static_cast<std::int64_t>(dt->events[k].size)), m.event - k);
        m.nearest_frames = frames[k];
        break;
      }
  // An oracle recording writes an oom's free bytes as null (read as 0): not a figure to print.
  if (const TraceEvent* ev = event_of(m.op);
      ev && ev->action == TraceAction::Oom && lt.file.format != io::TraceFormat::OracleRecording)
    m.device_free = ev->addr;
  take_apart(lt, config, o, m);
  if (op.kind == OpKind::OomRequest)
    for (const FailedRequest& f : lt.failed_requests)
      if (f.event == m.event) {
        m.recorded_size = f.recorded;
        m.size_source = failed_request_source(f, config);
        m.size_source_kind = f.source;
      }
  if (m.oom) {
    // PyTorch's get_allocation_size: the segment the request needed.
    const Bytes segment = m.rounded <= kSmallSize       ? kSmallBuffer
                          : m.rounded < kMinLargeAlloc ? config.large_segment_size
                                                       : (m.rounded + kRoundLarge - 1) / kRoundLarge * kRoundLarge;
    const Bytes limit = o.cap > 0 ? std::min(o.cap, o.device_memory) : o.device_memory;
    const auto need = static_cast<Bytes>(std::max<std::int64_t>(m.reserved, 0)) + segment;
    if (!config.expandable_segments && need > limit) m.lacked = need - limit;
    m.request_rounding = m.rounded - (m.size + kMinBlockSize - 1) / kMinBlockSize * kMinBlockSize;
    m.rounding_is_a_cause =
        m.lacked > 0 && static_cast<Bytes>(std::max<std::int64_t>(m.allocated - m.requested, 0)) + m.request_rounding >= m.lacked;
  }
  e.sites = sites_at(t, m.op, frames, eo.top_sites);
  if (std::any_of(e.sites.begin(), e.sites.end(), [](const Site& s) { return s.where == kNoUsableFrameSite; }) &&
      std::all_of(e.sites.begin(), e.sites.end(),
                  [](const Site& s) { return s.where == kNoUsableFrameSite || s.where == kNoFramesSite; }))
    e.notes.push_back("no allocation live at the moment has a usable stack frame: their stacks hold only PyTorch's own "
                      "C++ frames (torch::unwind, c10::, at::, unsymbolised ?\?); record with "
                      "_record_memory_history(stacks=\"python\") or stacks=\"all\" for the Python lines");
  if (std::string note = recorded_peak_note(lt, e.baseline, o.cap); !note.empty() && o.baseline_recorded_addresses)
    e.notes.push_back(note);
  if (std::string c = oom_end_caveat(lt); !c.empty() && m.oom) e.notes.push_back(c);
  if (std::string line = device_memory_line(lt, o.cap); !line.empty())
    e.notes.push_back(line.starts_with("note: ") ? line.substr(6) : line);

  // The verdict on the recorded configuration, as replay, tune and report give it.
  e.verdict = judge(lt, e.baseline, o, eo.cap_text);
  if (!eo.search_fix) return e;
  // The recommendation is tune's (cachet/replay/recommend.h): one answer in every command.
  const auto space = tune_space(config, o.cap > 0);
  ReplayOptions x = o;
  x.observer = nullptr;
  x.addresses = AddressMode::Synthetic;
  TuneResult tr = tune(t, config, space, x, eo.threads);
  e.candidates = space.size();
  for (std::size_t i = 0; i < space.size(); ++i) e.candidates_without_oom += avoids(tr.results[i]) ? 1 : 0;
  Recommendation rec = recommend(t, config, tr, x);
  rec.from_given = !o.baseline_recorded_addresses;  // --conf gave the configuration to start from
  auto change = [&](std::size_t i) -> std::optional<Change> {
    if (i == kRecorded || !avoids(tr.results[i])) return std::nullopt;
    return Change{space[i].conf, changed_keys(config, space[i].config), i};
  };
  if (m.oom) {
    e.fix = change(rec.pick);
    e.native_fix = change(rec.native);
    e.smallest_fix = change(rec.fewest_keys);
    if (e.smallest_fix && e.native_fix && e.smallest_fix->index == e.native_fix->index) e.smallest_fix.reset();
    if (!e.native_fix) e.cap_needed = e.verdict->smallest_cap;
  }
  e.rec = std::move(rec);
  e.tried = std::move(tr);
  return e;
}

}  // namespace cachet::replay

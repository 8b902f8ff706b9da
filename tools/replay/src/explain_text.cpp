// explain: the text and JSON forms of an Explanation (explain.h). Text lines fit 100 columns
// except stack frames, which are printed as recorded.
#include <fmt/format.h>

#include "cachet/replay/explain.h"
#include "cachet/replay/recommend.h"
#include "cachet/replay/report.h"

namespace cachet::replay {

namespace {

std::string hb(std::int64_t b) { return human_bytes(b); }
std::string hb(Bytes b) { return human_bytes(static_cast<std::int64_t>(b)); }

const char* label(const std::string& key) {
  if (key == "too_small") return "too small";
  if (key == "oversize_rule") return "oversize rule";
  if (key == "usable") return "usable";
  if (key == "other_pool") return "other pool";
  if (key == "other_streams") return "other streams";
  if (key == "private_pools") return "private pools";
  if (key == "pending_free") return "pending free";
  return "unaccounted";
}

std::string variable(const Config& c) {
  return c.policy == Policy::Cachet ? "CACHET_ALLOC_CONF" : "PYTORCH_CUDA_ALLOC_CONF";
}

std::string join(const std::vector<std::string>& v, const char* sep) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : sep) + x;
  return s;
}

// The Python frames of a stack, one a line (clipped to kMaxFrameLine); its C++ frames (stacks="all")
// counted in one line.
std::string stack_lines(const std::vector<io::Frame>& fr) {
  std::string o;
  std::size_t cpp = 0, python = 0;
  for (const auto& f : fr) python += io::is_python_frame(f) ? 1 : 0;
  const io::Frame* first_cpp = nullptr;
  for (const auto& f : fr) {
    // With no Python frame, the C++ frames that name user or library code are listed; PyTorch's
    // own (torch::unwind, c10::, at::, ??, ...) are counted.
    const bool shown = io::is_python_frame(f) || (python == 0 && !io::is_internal_cpp_frame(f));
    if (!shown) {
      if (cpp++ == 0 || (first_cpp && io::is_internal_cpp_frame(*first_cpp) && !io::is_internal_cpp_frame(f)))
        first_cpp = &f;
      continue;
    }
    o += clip_line(io::is_python_frame(f) ? fmt::format("    {} {}:{}", f.name, f.filename, f.line)
                                          : "    " + io::to_string(f),
                   kMaxFrameLine) +
         "\n";
  }
  std::string node;
  for (const auto& f : fr)
    if (node.empty()) node = io::autograd_node(f);
  if (cpp > 0)
    o += clip_line(fmt::format("    ({} C++ frame{} left out{}{}; --json lists them)", cpp, cpp == 1 ? "" : "s",
                               io::is_internal_cpp_frame(*first_cpp)
                                   ? std::string(", PyTorch's own (torch::unwind, c10::, at::, ?\?)")
                                   : ", the innermost " + first_cpp->name,
                               python == 0 && !node.empty() ? ", in autograd's backward of " + node : std::string()),
                   kMaxFrameLine) +
         "\n";
  return o;
}

std::string frames_json(const std::vector<io::Frame>& fr) {
  std::string s = "[";
  for (std::size_t i = 0; i < fr.size(); ++i)
    s += fmt::format("{}{{\"name\": {}, \"filename\": {}, \"line\": {}}}", i ? ", " : "", json_quote(fr[i].name),
                     json_quote(fr[i].filename), fr[i].line);
  return s + "]";
}

std::string pool_text(PoolId id) { return fmt::format("({}, {})", id.first, id.second); }

const char* entry_text(PoolEntry e) {
  switch (e) {
    case PoolEntry::Capture:
      return "a CUDA graph capture";
    case PoolEntry::UseMemPool:
      return "use_mem_pool";
    case PoolEntry::Unknown:
      break;
  }
  return "use_mem_pool or a capture: the trace cannot tell";
}

const char* entry_key(PoolEntry e) {
  switch (e) {
    case PoolEntry::Capture:
      return "capture";
    case PoolEntry::UseMemPool:
      return "use_mem_pool";
    case PoolEntry::Unknown:
      break;
  }
  return "unknown";
}

// ", large pool." or ", large pool, in the private pool (0, 1) (use_mem_pool)."
std::string where_text(const Moment& m) {
  std::string s = fmt::format(", {} pool", m.small_pool ? "small" : "large");
  if (!m.pool.is_default()) s += fmt::format(", in the private pool {} ({})", pool_text(m.pool), entry_text(m.pool_entry));
  return s + ".\n";
}

// An out-of-memory in a private pool: PyTorch released nothing of the default pools for it.
std::string private_pool_oom_text(const Moment& m) {
  std::string o = fmt::format(
      "  in a private pool PyTorch does not free the default pools' cached segments and retry, as it does outside one "
      "(no free-and-retry while use_mem_pool or a capture is under way, docs/pytorch-allocator.md §14.6): ");
  if (m.default_idle_segments == 0)
    return o + "the default pools held no segment without a block in use, so here that changed nothing\n";
  o += fmt::format("the default pools' {} segment{} with no block in use, {} ({} bytes), stayed reserved", m.default_idle_segments,
                   m.default_idle_segments == 1 ? "" : "s", hb(m.default_idle_bytes), m.default_idle_bytes);
  if (m.lacked > 0 && m.default_idle_bytes >= m.lacked)
    o += fmt::format("; releasing {} (torch.cuda.empty_cache() before entering the pool) would have made room for the "
                     "request, which lacked {}",
                     m.default_idle_segments == 1 ? "it" : "them", hb(m.lacked));
  else if (m.lacked > 0)
    o += fmt::format("; releasing {} would not have been enough: the request lacked {}",
                     m.default_idle_segments == 1 ? "it" : "them", hb(m.lacked));
  return o + "\n";
}

}  // namespace

std::string explain_text(const Explanation& e) {
  const Moment& m = e.at;
  std::string o;
  o += fmt::format("trace: {}\nconfiguration: {}; device memory {}{}\n", e.trace, e.conf.empty() ? "(default)" : e.conf,
                   e.device_memory_known ? hb(e.device_memory) : std::string("not recorded (no device limit)"),
                   e.cap ? "; cap " + hb(e.cap) : std::string());
  for (const auto& n : e.notes) o += "note: " + n + "\n";
  if (e.verdict) o += "\n" + verdict_text(*e.verdict, 100);
  o += "\n";
  if (m.oom)
    o += fmt::format("The first out-of-memory, at trace event {}: a request of {} ({} bytes) on stream {}{}", m.event,
                     hb(m.size), m.size, m.stream, where_text(m));
  else
    o += fmt::format("No out-of-memory; peak reserved, at trace event {}: a request of {} ({} bytes) on stream {}{}",
                     m.event, hb(m.size), m.size, m.stream, where_text(m));
  if (m.rounded != m.size) o += fmt::format("  rounded to {} bytes (docs/pytorch-allocator.md §1.2)\n", m.rounded);
  if (!m.size_source.empty()) o += fmt::format("  the size replayed: {}\n", m.size_source);
  if (m.oom && !m.pool.is_default()) o += private_pool_oom_text(m);
  if (m.device_free) o += fmt::format("  the driver reported {} free on the device then\n", hb(*m.device_free));
  if (!m.frames.empty()) {
    o += "  stack, innermost first, as PyTorch recorded it:\n" + stack_lines(m.frames);
  } else if (!m.nearest_frames.empty()) {
    o += fmt::format("  (no stack recorded for this request; the nearest recorded one before it, trace event {}, {}):\n",
                     m.nearest_event, m.nearest_what);
    o += stack_lines(m.nearest_frames);
  } else {
    o += e.frames_recorded ? "  (no stack recorded for this request)\n"
                           : "  (no stacks recorded: _record_memory_history(stacks=\"python\") records them)\n";
  }
  // At the peak, the figures are those of one moment, the first of peak reserved: allocated and
  // requested then, not their own peaks (replay's "peak allocated" is another moment).
  o += m.oom ? fmt::format("\nMemory when it failed (trace event {}: that moment's figures; the run's peak reserved is "
                           "the verdict's):\n",
                           m.event)
             : fmt::format("\nMemory at peak reserved (trace event {}; allocated and requested as they were then, not "
                           "their own peaks):\n",
                           m.event);
  o += fmt::format("  reserved  {:>11}  {:>15} bytes (segments from the device)\n", hb(m.reserved), m.reserved);
  o += fmt::format("  allocated {:>11}  {:>15} bytes (blocks in use)\n", hb(m.allocated), m.allocated);
  o += fmt::format("  requested {:>11}  {:>15} bytes (what the program asked for; rounding: {})\n", hb(m.requested),
                   m.requested, hb(m.allocated - m.requested));
  if (m.rounding_is_a_cause) {
    const Bytes live = static_cast<Bytes>(m.allocated - m.requested);
    o += fmt::format("  rounding is a cause: the live blocks hold {} more than was asked for{}, {} of rounding in all, "
                     "at least the {} the request lacked under the {}; reserved but not allocated was {}{}\n",
                     hb(static_cast<std::int64_t>(live)),
                     m.request_rounding ? fmt::format(" and the request itself was rounded up by {} ({} to {} bytes)",
                                                      hb(static_cast<std::int64_t>(m.request_rounding)), m.size, m.rounded)
                                        : std::string(),
                     hb(static_cast<std::int64_t>(live + m.request_rounding)), hb(static_cast<std::int64_t>(m.lacked)),
                     e.cap ? "cap" : "device's memory", hb(m.reserved - m.allocated),
                     e.rounding_set ? "; the recorded configuration sets roundup_power2_divisions, which rounds "
                                      "requests up beyond 512 bytes"
                                    : "");
  }
  o += fmt::format("\nWhere the {} reserved but not allocated was ({} bytes):\n", hb(m.reserved - m.allocated),
                   m.reserved - m.allocated);
  for (const auto& p : m.parts)
    o += fmt::format("  {:<14}{:>11} {:>6} blocks  {}\n", label(p.key), hb(p.bytes), p.blocks, p.what);
  Bytes sum = 0;
  for (const auto& p : m.parts) sum += p.bytes;
  o += fmt::format("  {:<14}{:>11}  = reserved - allocated, exactly ({} bytes)\n", "sum", hb(sum), sum);

  if (!e.sites.empty()) {
    o += fmt::format("\nAllocation sites holding the most memory {} (innermost frame outside PyTorch):\n",
                     m.oom ? "when it failed" : "at peak reserved");
    for (const auto& s : e.sites) o += fmt::format("  {:>11} {:>6} blocks  {}\n", hb(s.bytes), s.blocks, s.where);
  }

  if (!e.rec) return o;
  const Recommendation& rec = *e.rec;
  const TuneResult& tr = *e.tried;
  const char* start = rec.from_given ? "given configuration (--conf)" : "recorded configuration";
  auto change = [&](const ReplayResult& r, const std::vector<std::string>& keys) {
    const ReplayResult& b = e.base();
    o += fmt::format("  {}=\"{}\"\n", variable(r.config), r.conf);
    o += fmt::format("  {} key{} changed: {}\n", keys.size(), keys.size() == 1 ? "" : "s", join(keys, ", "));
    // Two figures that are the same are said once ("0, unchanged"), never "0 instead of 0"; two
    // sizes that print alike but differ get their bytes.
    auto vs = [](std::int64_t now, std::int64_t before) {
      return now == before ? fmt::format("{}, unchanged", now) : fmt::format("{} instead of {}", now, before);
    };
    auto vs_bytes = [](std::int64_t now, std::int64_t before) {
      if (now == before) return fmt::format("{}, unchanged", hb(now));
      if (hb(now) == hb(before)) return fmt::format("{} = {} bytes instead of {} bytes", hb(now), now, before);
      return fmt::format("{} instead of {}", hb(now), hb(before));
    };
    o += fmt::format("  out-of-memory errors: {}\n", vs(r.stats.num_ooms, b.stats.num_ooms));
    o += fmt::format("  peak reserved {} (the {}{})\n"
                     "  device calls (segment allocations and frees) {}; allocation retries {}\n",
                     vs_bytes(r.peak_reserved(), b.peak_reserved()), start,
                     b.recorded_addresses ? ", replayed with its recorded addresses" : ", replayed the same way",
                     vs(r.stats.num_device_alloc + r.stats.num_device_free,
                        b.stats.num_device_alloc + b.stats.num_device_free),
                     vs(r.stats.num_alloc_retries, b.stats.num_alloc_retries));
    if (std::string h = headroom_text(r.peak_reserved(), e.cap); !h.empty() && r.stats.num_ooms == 0) o += "  " + h + "\n";
    if (r.config.policy == Policy::Cachet)
      o += "  (policy:cachet needs cachet's plug-in, python/README.md; PyTorch rejects the key in its own variables)\n";
  };
  o += fmt::format("\nRecommended {} (cachet tune's pick: fewest out-of-memory errors, then lowest peak reserved; "
                   "cachet's plug-in only when clearly better; by replay: {} configurations tried, {} without "
                   "out-of-memory):\n",
                   m.oom ? "change" : "configuration", e.candidates, e.candidates_without_oom);
  if (m.oom && !e.fix) {
    o += "  none of them avoids it.\n";
    // Nothing avoids it, yet tune has a pick (fewest out-of-memory errors): named, never left unsaid.
    if (rec.pick != kRecorded) {
      o += fmt::format("  cachet tune's pick still runs out of memory, with the fewest requests that fail ({} instead "
                       "of {}):\n",
                       tr.results[rec.pick].stats.num_ooms, e.base().stats.num_ooms);
      change(tr.results[rec.pick], rec.pick_keys);
    } else {
      o += fmt::format("  cachet tune's pick: keep the {}, no configuration tried fails fewer requests.\n", start);
    }
  } else if (rec.pick == kRecorded) {
    o += fmt::format("  keep the {}: no configuration tried fails fewer requests, reserves less or makes fewer "
                     "device calls.\n",
                     start);
  } else {
    change(tr.results[rec.pick], rec.pick_keys);
  }
  if (rec.only_plugin_avoids)
    o += "  Only cachet's plug-in avoids it: with PyTorch's own allocator, none of the configurations tried does.\n";
  if (m.oom && e.fix && e.native_fix && e.native_fix->index != e.fix->index) {
    o += "With PyTorch's own allocator (its pick among what PyTorch accepts):\n";
    change(e.result(*e.native_fix), e.native_fix->keys);
  }
  if (m.oom && !e.native_fix && e.fix && !rec.only_plugin_avoids)
    o += "With PyTorch's own allocator, none of the configurations tried avoids it.\n";
  if (e.cap_needed)
    o += fmt::format("  The {} fits under a cap of {} ({} bytes) and under every larger one (found by replay to 2 MiB).\n",
                     rec.from_given ? "given configuration" : "recorded configuration", hb(*e.cap_needed), *e.cap_needed);
  if (e.smallest_fix) {
    const ReplayResult& r = e.result(*e.smallest_fix);
    std::string h = headroom_text(r.peak_reserved(), e.cap);
    o += fmt::format("The change with the fewest keys that also avoids it (a second answer, not the recommendation): "
                     "{}=\"{}\", {} key{} changed ({}); peak reserved {}{}\n",
                     variable(r.config), e.smallest_fix->conf, e.smallest_fix->keys.size(),
                     e.smallest_fix->keys.size() == 1 ? "" : "s", join(e.smallest_fix->keys, ", "),
                     hb(r.peak_reserved()), h.empty() ? std::string() : "; " + h);
  }
  return o;
}

std::string explain_json(const Explanation& e) {
  const Moment& m = e.at;
  std::string o = "{";
  o += fmt::format("\"trace\": {}, \"conf\": {}, \"device_memory\": {}, \"cap\": {}, ", json_quote(e.trace),
                   json_quote(e.conf), e.device_memory, e.cap);
  // The recorded configuration over the whole trace, as replay, tune and the others give it.
  o += fmt::format("\"recorded_configuration_peak_reserved\": {}, ", e.baseline.peak_reserved());
  static constexpr const char* kSources[] = {"op_list", "same_stack", "same_context", "rounded"};
  o += fmt::format("\"moment\": {{\"kind\": \"{}\", \"op\": {}, \"event\": {}, \"size\": {}, \"rounded\": {}, "
                   "\"recorded_size\": {}, \"size_source\": {}, "
                   "\"stream\": {}, \"pool\": \"{}\", \"private_pool\": {}, \"pool_entry\": {}, "
                   "\"default_idle_segments\": {}, \"default_idle_bytes\": {}, \"device_free\": {}, \"frames\": {}}}, ",
                   m.oom ? "oom" : "peak", m.op, m.event, m.size, m.rounded,
                   m.size_source.empty() ? "null" : std::to_string(m.recorded_size),
                   m.size_source.empty() ? "null"
                                         : fmt::format("\"{}\"", kSources[static_cast<int>(m.size_source_kind)]),
                   m.stream, m.small_pool ? "small" : "large",
                   m.pool.is_default() ? "null" : fmt::format("[{}, {}]", m.pool.first, m.pool.second),
                   m.pool.is_default() ? "null" : fmt::format("\"{}\"", entry_key(m.pool_entry)),
                   m.oom && !m.pool.is_default() ? std::to_string(m.default_idle_segments) : "null",
                   m.oom && !m.pool.is_default() ? std::to_string(m.default_idle_bytes) : "null",
                   m.device_free ? std::to_string(*m.device_free) : "null", frames_json(m.frames));
  o += fmt::format("\"reserved\": {}, \"allocated\": {}, \"requested\": {}, \"rounding\": {}, ", m.reserved, m.allocated,
                   m.requested, m.allocated - m.requested);
  o += fmt::format("\"request_rounding\": {}, \"lacked\": {}, \"rounding_is_a_cause\": {}, ", m.request_rounding,
                   m.lacked, m.rounding_is_a_cause ? "true" : "false");
  o += "\"partition\": [";
  for (std::size_t i = 0; i < m.parts.size(); ++i)
    o += fmt::format("{}{{\"key\": \"{}\", \"bytes\": {}, \"blocks\": {}, \"what\": {}}}", i ? ", " : "",
                     m.parts[i].key, m.parts[i].bytes, m.parts[i].blocks, json_quote(m.parts[i].what));
  o += "], \"sites\": [";
  for (std::size_t i = 0; i < e.sites.size(); ++i)
    o += fmt::format("{}{{\"where\": {}, \"bytes\": {}, \"blocks\": {}, \"frames\": {}}}", i ? ", " : "",
                     json_quote(e.sites[i].where), e.sites[i].bytes, e.sites[i].blocks, frames_json(e.sites[i].frames));
  auto change = [&](const std::optional<Change>& c) -> std::string {
    if (!c) return "null";
    const ReplayResult& r = e.result(*c);
    const ReplayResult& b = e.base();
    std::vector<std::string> q;
    for (const auto& k : c->keys) q.push_back(json_quote(k));
    return fmt::format("{{\"variable\": \"{}\", \"conf\": {}, \"keys\": [{}], \"peak_reserved\": {}, "
                       "\"baseline_peak_reserved\": {}, \"num_ooms\": {}, \"baseline_num_ooms\": {}, "
                       "\"num_alloc_retries\": {}, \"baseline_num_alloc_retries\": {}, \"device_calls\": {}, "
                       "\"baseline_device_calls\": {}}}",
                       variable(r.config), json_quote(c->conf), join(q, ", "), r.peak_reserved(), b.peak_reserved(),
                       r.stats.num_ooms, b.stats.num_ooms, r.stats.num_alloc_retries, b.stats.num_alloc_retries,
                       r.stats.num_device_alloc + r.stats.num_device_free,
                       b.stats.num_device_alloc + b.stats.num_device_free);
  };
  o += "], \"fix\": " + change(e.fix) + ", \"native_fix\": " + change(e.native_fix);
  o += ", \"smaller_fix_passed_over\": " + change(e.smallest_fix) +
       ", \"smaller_native_fix_passed_over\": " + change(e.smallest_native_fix);
  if (e.rec) {
    const Recommendation& rec = *e.rec;
    auto conf_or_null = [&](std::size_t i) {
      return i == kRecorded ? std::string("null") : json_quote(e.tried->results[i].conf);
    };
    o += fmt::format(", \"recommendation\": {{\"variable\": \"{}\", \"conf\": {}, \"keep_recorded\": {}, "
                     "\"recommend_plugin\": {}, \"only_plugin_avoids\": {}, \"native\": {}, \"fewest_keys\": {}}}",
                     rec.pick == kRecorded ? "PYTORCH_CUDA_ALLOC_CONF" : variable(e.tried->results[rec.pick].config),
                     rec.pick == kRecorded ? json_quote(e.conf) : conf_or_null(rec.pick),
                     rec.pick == kRecorded ? "true" : "false", rec.recommend_plugin ? "true" : "false",
                     rec.only_plugin_avoids ? "true" : "false", conf_or_null(rec.native), conf_or_null(rec.fewest_keys));
  } else {
    o += ", \"recommendation\": null";
  }
  o += ", \"verdict\": " + (e.verdict ? verdict_json(*e.verdict) : std::string("null"));
  o += fmt::format(", \"candidates\": {}, \"candidates_without_oom\": {}, \"cap_needed\": {}, \"notes\": [", e.candidates,
                   e.candidates_without_oom, e.cap_needed ? std::to_string(*e.cap_needed) : "null");
  for (std::size_t i = 0; i < e.notes.size(); ++i) o += (i ? ", " : "") + json_quote(e.notes[i]);
  return o + "]}\n";
}

}  // namespace cachet::replay

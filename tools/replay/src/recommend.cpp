// One recommendation (tune's) and one verdict for every command: cachet/replay/recommend.h.
#include "cachet/replay/recommend.h"

#include <algorithm>
#include <cctype>

#include <fmt/format.h>

#include "cachet/replay/explain.h"
#include "cachet/replay/report.h"

namespace cachet::replay {

namespace {

bool avoids(const ReplayResult& r) { return r.stats.num_ooms == 0 && r.failed_allocs == 0; }

std::string requests(std::int64_t n) { return n == 1 ? "1 request" : fmt::format("{} requests", n); }

std::string hb(std::int64_t b) { return human_bytes(b); }
std::string hb(Bytes b) { return human_bytes(static_cast<std::int64_t>(b)); }

}  // namespace

std::string conf_variable(const Config& c) {
  return c.policy == Policy::Cachet ? "CACHET_ALLOC_CONF" : "PYTORCH_CUDA_ALLOC_CONF";
}

Recommendation recommend(const Trace& t, const Config& recorded, const TuneResult& tr, const ReplayOptions& o) {
  Recommendation rec;
  rec.native = tr.best_native;
  rec.plugin = best_plugin(tr);
  rec.recommend_plugin = rec.plugin != kRecorded && rec.plugin == tr.best &&
                         plugin_clearly_better(tr.results[rec.plugin], tr.at(tr.best_native), o.cap);
  rec.pick = rec.recommend_plugin ? rec.plugin : rec.native;
  if (rec.pick != kRecorded) rec.pick_keys = changed_keys(recorded, tr.results[rec.pick].config);

  const bool base_fails = !avoids(tr.baseline);
  if (base_fails && rec.plugin != kRecorded && avoids(tr.results[rec.plugin])) {
    bool native_avoids = false;
    for (std::size_t i = 0; i < tr.results.size() && !native_avoids; ++i)
      native_avoids = pytorch_accepts(tr.results[i].config) && avoids(tr.results[i]);
    rec.only_plugin_avoids = !native_avoids;
  }
  if (base_fails) {
    std::size_t best = kRecorded;
    std::vector<std::string> best_keys;
    for (std::size_t i = 0; i < tr.results.size(); ++i) {
      const ReplayResult& r = tr.results[i];
      if (!avoids(r)) continue;
      std::vector<std::string> keys = changed_keys(recorded, r.config);
      bool better = best == kRecorded;
      if (!better) {
        const ReplayResult& b = tr.results[best];
        if (keys.size() != best_keys.size())
          better = keys.size() < best_keys.size();
        else if (r.peak_reserved() != b.peak_reserved())
          better = r.peak_reserved() < b.peak_reserved();
        else
          better = r.conf.size() < b.conf.size();
      }
      if (better) {
        best = i;
        best_keys = std::move(keys);
      }
    }
    // A second answer only when it changes fewer keys than the pick: one with as many is no
    // smaller change, and the pick ranks before it.
    if (best != kRecorded && best != rec.pick && (rec.pick == kRecorded || best_keys.size() < rec.pick_keys.size())) {
      rec.fewest_keys = best;
      rec.fewest_keys_keys = std::move(best_keys);
    }
  }
  auto needed = [&](std::size_t i) -> std::optional<Bytes> {
    if (tr.at(i).stats.num_ooms == 0) return std::nullopt;
    return memory_needed(t, tr.at(i).config, o);
  };
  rec.needed_best = needed(tr.best);
  rec.needed_native = tr.best_native == tr.best ? rec.needed_best : needed(tr.best_native);
  if (rec.plugin != kRecorded) rec.needed_plugin = rec.plugin == tr.best ? rec.needed_best : needed(rec.plugin);
  return rec;
}

std::string recommendation_text(const TuneResult& tr, const Recommendation& rec, const ReplayOptions& o,
                                std::size_t width) {
  const ReplayResult& base = tr.baseline;
  const ReplayResult& native = tr.at(tr.best_native);
  auto needs = [&](const std::optional<Bytes>& m) {
    if (!m) return std::string();
    return fmt::format(" To avoid them it needs {} of memory (found by replay, to 2 MiB: the smallest from which every "
                       "larger limit fits too): {}.",
                       human_bytes_exact(*m), o.cap ? fmt::format("a cap of that or more, {} now", hb(o.cap))
                             : fmt::format("that much device memory for the process, {} now", hb(o.device_memory)));
  };
  auto headroom = [&](const ReplayResult& r) {
    std::string h = headroom_text(r.peak_reserved(), o.cap);
    if (h.empty() || r.stats.num_ooms > 0) return std::string();
    h[0] = 'H';
    return " " + h + ".";
  };
  std::string out;
  if (tr.best_native == kRecorded)
    out += fmt::format("With PyTorch's allocator: keep the {} configuration, PYTORCH_CUDA_ALLOC_CONF=\"{}\"\n",
                       rec.from_given ? "given" : "recorded", base.conf) +
           wrap_text("No candidate tried fails fewer requests, reserves less or makes fewer device calls." +
                         needs(rec.needed_native),
                     width, "  ");
  else
    out += fmt::format("With PyTorch's allocator: PYTORCH_CUDA_ALLOC_CONF=\"{}\"\n", native.conf) +
           wrap_text(describe_change(base, native) + headroom(native) + needs(rec.needed_native), width, "  ");
  if (rec.plugin != kRecorded) {
    const ReplayResult& p = tr.results[rec.plugin];
    const auto rank = std::find(tr.ranking.begin(), tr.ranking.end(), rec.plugin) - tr.ranking.begin() + 1;
    if (rec.recommend_plugin)
      out += fmt::format("With cachet's plug-in (python/README.md): CACHET_ALLOC_CONF=\"{}\"\n", p.conf) +
             wrap_text(describe_change(base, p) + headroom(p) + needs(rec.needed_plugin), width, "  ");
    else if (rec.plugin != tr.best)
      out += wrap_text(fmt::format("With cachet's plug-in: nothing better: CACHET_ALLOC_CONF=\"{}\" ranks {}.", p.conf,
                                   rank),
                       width, "");
    else
      out += wrap_text(
          fmt::format("With cachet's plug-in: not recommended: CACHET_ALLOC_CONF=\"{}\" ranks {} but is not clearly "
                      "better than PyTorch's allocator (it would need fewer OOMs, or as many and at least {:.0f}% less "
                      "peak reserved{}: {} against {}).",
                      p.conf, rank, 100 * kPluginMinSaving,
                      o.cap ? fmt::format(", or, with none, {} under the cap where PyTorch's allocator leaves less",
                                          hb(kSafeHeadroom))
                            : std::string(),
                      hb(p.peak_reserved()), hb(native.peak_reserved())),
          width, "");
  }
  if (rec.only_plugin_avoids) {
    std::size_t native_tried = 0;
    for (const auto& r : tr.results) native_tried += pytorch_accepts(r.config) ? 1 : 0;
    out += wrap_text(fmt::format("Only cachet's plug-in avoids the out-of-memory: none of the {} configurations "
                                 "tried that PyTorch's own allocator accepts does; CACHET_ALLOC_CONF=\"{}\" needs the "
                                 "plug-in (python/README.md), PyTorch rejects the key in its own variables.",
                                 native_tried, tr.results[rec.plugin].conf),
                     width, "");
  }
  if (tr.at(tr.best).stats.num_ooms > 0)
    out += "\n" + wrap_text(fmt::format("No configuration tried avoids running out of memory: the best still fails {}.",
                                         requests(tr.at(tr.best).stats.num_ooms)) +
                                 needs(rec.needed_best),
                             width, "");
  return out;
}

// --- the verdict ---

Bytes cap_text_rounding(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  std::size_t i = 0, dot = std::string_view::npos;
  while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.')) {
    if (s[i] == '.') dot = i;
    ++i;
  }
  if (i == 0) return 0;
  std::string unit(s.substr(i));
  std::erase_if(unit, [](char c) { return std::isspace(static_cast<unsigned char>(c)); });
  for (auto& c : unit) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (unit != "g" && unit != "gib") return 0;
  const std::size_t decimals = dot == std::string_view::npos ? 0 : i - dot - 1;
  if (decimals > 2) return 0;
  return GiB / 200;  // 0.005 GiB
}

Verdict judge(const LoadedTrace& lt, const ReplayResult& r, const ReplayOptions& o, std::string_view cap_text) {
  Verdict v;
  v.conf = r.conf;
  v.recorded_conf = r.config == lt.recorded_config.value_or(Config{});
  for (const Op& op : lt.trace.ops)
    if (op.kind == OpKind::OomRequest) {
      v.recorded_run_failed = true;
      break;
    }
  v.cap = o.cap;
  v.device_memory = o.device_memory;
  v.device_memory_known = lt.memory.source != DeviceMemoryFacts::Source::Unknown;
  v.num_ooms = r.stats.num_ooms;
  v.retries = r.stats.num_alloc_retries;
  v.peak_reserved = r.peak_reserved();
  v.smallest_cap = memory_needed(lt.trace, r.config, o);
  v.gc_threshold = r.config.garbage_collection_threshold;
  if (o.cap) v.cap_rounding = cap_text_rounding(cap_text);
  return v;
}

std::string verdict_text(const Verdict& v, std::size_t width) {
  std::string who = fmt::format("{} configuration{}", v.recorded_conf ? "the recorded" : "the given",
                                v.conf.empty() ? " (PyTorch's defaults)" : fmt::format(" '{}'", v.conf));
  std::string where = v.cap ? fmt::format("under the cap of {}", hb(v.cap))
                      : v.device_memory_known
                          ? fmt::format("on the device's {} (no cap)", hb(v.device_memory))
                          : std::string("with no device limit (the device's memory is not known: --device-memory gives it)");
  std::string s = fmt::format("Verdict for {} {}: ", who, where);
  const std::int64_t limit = static_cast<std::int64_t>(v.limit());
  if (v.fits()) {
    s += fmt::format("it fits, no out-of-memory. Peak reserved {} = {} bytes", hb(v.peak_reserved), v.peak_reserved);
    if (v.cap || v.device_memory_known) {
      const std::int64_t room = limit - v.peak_reserved;
      s += fmt::format(", {} under the {}", human_bytes_exact(static_cast<Bytes>(std::max<std::int64_t>(room, 0))),
                       v.cap ? "cap" : "device's memory");
      if (v.cap && static_cast<Bytes>(room) < kSafeHeadroom)
        s += fmt::format(" (close: under {}, other libraries' memory on the GPU or another allocation order can still "
                         "make it fail)",
                         hb(kSafeHeadroom));
    }
    s += ".";
  } else {
    s += fmt::format("it does not fit: {} run{} out of memory (peak reserved {} = {} bytes).", requests(v.num_ooms),
                     v.num_ooms == 1 ? "s" : "", hb(v.peak_reserved), v.peak_reserved);
  }
  if (v.retries == 0)
    s += " No allocation retry.";
  else
    s += fmt::format(" {} allocation retr{}: the allocator reached the {}, freed its cached blocks and tried again.",
                     v.retries, v.retries == 1 ? "y" : "ies", v.cap ? "cap" : "limit");
  if (v.recorded_conf && !v.recorded_run_failed && !v.fits())
    s += " The recorded run never ran out of memory: this is the replay under the limit given.";
  if (v.recorded_conf && v.recorded_run_failed && v.fits())
    s += " The recorded run ran out of memory; under this limit the replay does not.";
  if (v.smallest_cap) {
    s += fmt::format(" The smallest cap at and above which it fits: {} (by replay, to 2 MiB{})",
                     human_bytes_exact(*v.smallest_cap),
                     v.gc_threshold > 0 ? fmt::format("; with garbage_collection_threshold, the caps above it up to "
                                                      "peak / {} checked about 1/{} of that apart",
                                                      v.gc_threshold, kGcProbes)
                                        : std::string());
    if (v.device_memory_known && *v.smallest_cap > v.device_memory)
      s += fmt::format(", more than the device's {}", hb(v.device_memory));
    else if (v.cap && !v.fits())
      s += fmt::format(", {} more than the cap", hb(*v.smallest_cap - v.cap));
    else if (v.cap && *v.smallest_cap > v.cap)
      s += fmt::format(", {} more than this cap, under which it fits all the same: a run is not monotone in the cap "
                       "(the allocator frees its cache and retries at other moments), and a cap between the two fails",
                       hb(*v.smallest_cap - v.cap));
    if (static_cast<std::int64_t>(*v.smallest_cap) < v.peak_reserved)
      s += "; less than its peak reserved: under a cap the allocator frees its cached blocks and retries";
    s += ".";
  } else {
    s += " No cap up to 1 TiB avoids the out-of-memory (a request larger than any device).";
  }
  if (v.cap_rounding) {
    const double half_mib = static_cast<double>(v.cap_rounding) / static_cast<double>(MiB);
    s += fmt::format(" If the cap is from PyTorch's \"{:.2f} GiB allowed\", which is rounded to 0.01 GiB, the true cap "
                     "lies within {:.2f} MiB of it",
                     static_cast<double>(v.cap) / static_cast<double>(GiB), half_mib);
    const bool close_fit = v.fits() && static_cast<std::int64_t>(v.cap) - v.peak_reserved < static_cast<std::int64_t>(v.cap_rounding);
    const bool close_fail = !v.fits() && v.smallest_cap && *v.smallest_cap <= v.cap + v.cap_rounding;
    if (close_fit)
      s += ": the verdict may not hold, the configuration fits with less to spare than that.";
    else if (close_fail)
      s += ": the verdict may not hold, the smallest cap at and above which it fits is within that range.";
    else if (v.fits() || v.smallest_cap)
      s += fmt::format(": the verdict holds across that range ({} {} the cap).",
                       v.fits() ? "peak reserved is" : "the smallest cap at and above which it fits is",
                       v.fits() ? hb(static_cast<std::int64_t>(v.cap) - v.peak_reserved) + " under"
                                : hb(*v.smallest_cap - v.cap) + " above");
    else
      s += ".";
  }
  return wrap_text(s, width, "");
}

std::string verdict_json(const Verdict& v) {
  const std::int64_t limit = static_cast<std::int64_t>(v.limit());
  return fmt::format(
      "{{\"conf\": {}, \"recorded_conf\": {}, \"fits\": {}, \"num_ooms\": {}, \"num_alloc_retries\": {}, "
      "\"peak_reserved\": {}, \"cap\": {}, \"limit\": {}, \"headroom\": {}, \"smallest_cap\": {}, \"cap_rounding\": {}, "
      "\"recorded_run_failed\": {}}}",
      json_quote(v.conf), v.recorded_conf ? "true" : "false", v.fits() ? "true" : "false", v.num_ooms, v.retries,
      v.peak_reserved, v.cap, limit,
      v.fits() && (v.cap || v.device_memory_known) ? std::to_string(limit - v.peak_reserved) : std::string("null"),
      v.smallest_cap ? std::to_string(*v.smallest_cap) : std::string("null"), v.cap_rounding,
      v.recorded_run_failed ? "true" : "false");
}

OneAnswer one_answer(const LoadedTrace& lt, const ReplayOptions& o, unsigned threads, std::string_view cap_text) {
  OneAnswer a;
  ReplayOptions x = o;
  x.observer = nullptr;
  x.progress = nullptr;
  x.addresses = AddressMode::Synthetic;
  a.tried = tune(lt.trace, lt.run.config, tune_space(lt.run.config, o.cap > 0), x, threads);
  a.rec = recommend(lt.trace, lt.run.config, a.tried, x);
  a.rec.from_given = !o.baseline_recorded_addresses;
  a.verdict = judge(lt, a.tried.baseline, o, cap_text);
  return a;
}

}  // namespace cachet::replay

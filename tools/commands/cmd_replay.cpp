// `cachet replay TRACE [--conf STRING]... [--policy pytorch|cachet] [--addresses recorded|synthetic]
// [--cap BYTES] [--device-memory BYTES] [--json]`: replays a PyTorch memory trace (snapshot pickle or JSON,
// or an oracle recording) through cachet's production allocator under each configuration and
// reports peak allocated, peak reserved, fragmentation, OOMs, retries, device calls.
// Without --conf: the configuration recorded in the trace. Exit 2 on unreadable input or an
// invalid configuration. policy:cachet replays with synthetic addresses unless --addresses
// recorded is given (said in the result's "note").
#if __has_include("cachet/replay/replay.h")
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "cachet/errors.h"
#include "cachet/io/file.h"
#include "cachet/replay/recommend.h"
#include "cachet/replay/replay.h"
#include "cachet/replay/report.h"
#include "cachet/replay/tune.h"
#include "command.h"
#include "trace_input.h"

namespace cachet::cli {
namespace {

struct Args {
  std::string path;
  std::vector<std::string> confs;
  std::string policy = "pytorch";
  std::string addresses;
  std::string device_memory;
  std::string cap;
  std::string fraction;  // --fraction F: the cap is F x the device memory
  bool json = false;
};

int run_replay(const Args& a) {
  using namespace cachet::replay;
  std::optional<Bytes> mem, cap;
  std::string cap_text = a.cap;  // --cap, or --fraction's cap in bytes
  if (!fraction_to_cap("replay", a.path, a.fraction, a.device_memory, cap_text)) return kExitBadInput;
  if (!size_option("replay", "--device-memory", a.device_memory, mem) || !size_option("replay", "--cap", cap_text, cap))
    return kExitBadInput;
  LoadedTrace lt;
  try {
    lt = load_trace(a.path, LoadOptions{.device_memory = mem, .cap = cap});
  } catch (const io::ReadError& e) {
    std::fprintf(stderr, "cachet replay: %s\n", e.what());
    return kExitBadInput;
  }
  if (!lt.device_note.empty()) std::fprintf(stderr, "cachet replay: %s\n", lt.device_note.c_str());
  if (auto e = missing_cap_error(lt); !e.empty()) {
    std::fprintf(stderr, "cachet replay: %s\n", e.c_str());
    return kExitBadInput;
  }
  if (!cap_fits("replay", lt, cap_text, cap)) return kExitBadInput;
  if (!lt.config_note.empty()) std::fprintf(stderr, "cachet replay: %s\n", lt.config_note.c_str());
  struct Job {
    Config config;
    bool recorded;
  };
  std::vector<Job> jobs;
  if (a.confs.empty()) {
    jobs.push_back({lt.run.config, true});
  } else {
    for (const auto& text : a.confs) {
      try {
        Config c = parse_config(text, ConfigSource::Cachet).config;
        jobs.push_back({c, lt.recorded_config ? c == *lt.recorded_config : text.empty() && !lt.file.settings.conf});
      } catch (const ConfigError& e) {
        std::fprintf(stderr, "cachet replay: --conf '%s': %s\n", text.c_str(), e.what());
        return kExitBadInput;
      }
    }
  }
  if (a.policy != "pytorch" && a.policy != "cachet") {
    std::fprintf(stderr, "cachet replay: --policy: 'pytorch' or 'cachet', not '%s'\n", a.policy.c_str());
    return kExitBadInput;
  }
  // --policy cachet against a --conf that says policy:pytorch (parsed over a cachet base, only an
  // explicit key gives PyTorch back).
  Config cachet_base;
  cachet_base.policy = Policy::Cachet;
  for (const auto& text : a.confs)
    if (a.policy == "cachet" && parse_config(text, ConfigSource::Cachet, cachet_base).config.policy == Policy::PyTorch) {
      std::fprintf(stderr, "cachet replay: --policy cachet and --conf '%s' (policy:pytorch) disagree; give one\n",
                   text.c_str());
      return kExitBadInput;
    }
  for (auto& j : jobs)
    if (a.policy == "cachet") j.config.policy = Policy::Cachet;
  // The recorded segment addresses (and the snapshot's end state) are the PyTorch policy's: a
  // configuration with policy:cachet (--policy cachet, or --conf policy:cachet) is never "the
  // recorded one", so it replays with synthetic addresses unless --addresses recorded is given.
  for (auto& j : jobs)
    if (j.config.policy == Policy::Cachet) j.recorded = false;

  std::vector<ReplayResult> results;
  std::vector<ReplayOptions> used;  // each row's options (its verdict replays under them)
  Progress progress("replaying");
  for (std::size_t i = 0; i < jobs.size(); ++i) {
    AddressMode mode = jobs[i].recorded ? AddressMode::Recorded : AddressMode::Synthetic;
    if (a.addresses == "recorded") mode = AddressMode::Recorded;
    if (a.addresses == "synthetic") mode = AddressMode::Synthetic;
    ReplayOptions o = recorded_options(lt, mode);
    used.push_back(o);
    if (progress.enabled() && lt.trace.ops.size() > 1'000'000)
      o.progress = [&, i](std::size_t done, std::size_t total) {
        progress.update(i * total + done, jobs.size() * total);
      };
    try {
      results.push_back(cachet::replay::replay(lt.trace, jobs[i].config, o));
      ReplayResult& r = results.back();
      if (jobs[i].config.policy == Policy::Cachet && a.addresses.empty() && r.note.empty())
        r.note = "policy:cachet: synthetic addresses (the recorded ones are the PyTorch policy's)";
    } catch (const std::exception& e) {
      progress.clear();
      std::fprintf(stderr, "cachet replay: configuration '%s' cannot be replayed: %s\n",
                   to_string(jobs[i].config).c_str(), e.what());
      return kExitBadInput;
    }
  }
  progress.clear();  // before the results, on a terminal
  std::vector<const ReplayResult*> rows;
  for (const auto& r : results) rows.push_back(&r);
  // The verdict for each configuration (cachet/replay/recommend.h): fits or not, headroom, retries,
  // the smallest cap that fits, as tune, explain and report give it; in the text and in --json.
  std::vector<Verdict> judged;
  for (std::size_t i = 0; i < results.size(); ++i) judged.push_back(judge(lt, results[i], used[i], cap_text));
  if (a.json) {
    std::vector<std::string> verdicts;
    for (const Verdict& v : judged) verdicts.push_back(verdict_json(v));
    std::fputs(results_json(rows, verdicts).c_str(), stdout);
    return kExitOk;
  }
  std::string out;
  out += fmt::format("trace: {} ({}, device {}, {} events)\n", lt.file.name, io::to_string(lt.file.format), lt.device,
                     lt.trace.events);
  out += device_memory_line(lt, lt.run.cap) + "\n";
  if (lt.run.cap)
    out += fmt::format("memory cap: {} (set_per_process_memory_fraction{})\n", human_bytes_exact(lt.run.cap),
                       cap ? ", --cap" : ", recorded");
  out += fmt::format("recorded configuration: {}\n", !lt.file.settings.conf         ? "not recorded (default)"
                                                     : lt.recorded_conf_text.empty() ? "(default)"
                                                                                     : "'" + lt.recorded_conf_text + "'");
  // policy:cachet: said once, with the keys it does not use.
  bool any_cachet = false;
  for (std::size_t i = 0; i < jobs.size(); ++i) {
    if (jobs[i].config.policy != Policy::Cachet) continue;
    if (!any_cachet && a.addresses.empty())
      out += "policy:cachet: replayed with synthetic addresses (the recorded ones are the PyTorch policy's)\n";
    any_cachet = true;
    const auto ignored = keys_policy_cachet_ignores(jobs[i].config);
    if (!ignored.empty())
      out += fmt::format("policy:cachet does not use {} (given in '{}'): its row is the same without {}\n",
                         fmt::join(ignored, ", "), a.confs.empty() ? lt.recorded_conf_text : a.confs[i],
                         ignored.size() == 1 ? "it" : "them");
  }
  // Keys the replay cannot honour as asked, said (never silently dropped).
  for (std::size_t i = 0; i < jobs.size(); ++i) {
    const Config& c = jobs[i].config;
    const std::string name = to_string(c).empty() ? "(default)" : to_string(c);
    if (c.backend == Backend::CudaMallocAsync)
      out += fmt::format("warning: backend:cudaMallocAsync (in '{}') is CUDA's own stream-ordered allocator, not the caching "
                         "allocator: there is nothing of it to replay; its row is the native caching allocator's\n",
                         name);
    if (c.per_process_memory_fraction && *c.per_process_memory_fraction < 1.0) {
      const auto implied = static_cast<Bytes>(*c.per_process_memory_fraction * static_cast<double>(lt.run.total_memory));
      if (lt.run.cap)
        out += fmt::format("warning: per_process_memory_fraction (in '{}'): {}, a cap of {}, is replaced by the cap in force, "
                           "{}, as a program's set_per_process_memory_fraction() call replaces it in PyTorch; leave "
                           "--cap out to replay under it\n",
                           name, *c.per_process_memory_fraction, human_bytes(static_cast<std::int64_t>(implied)),
                           human_bytes(static_cast<std::int64_t>(lt.run.cap)));
      else
        out += fmt::format("per_process_memory_fraction (in '{}'): {}, a cap of {} ({} of device memory{})\n", name,
                           *c.per_process_memory_fraction, human_bytes(static_cast<std::int64_t>(implied)),
                           human_bytes(static_cast<std::int64_t>(lt.run.total_memory)),
                           lt.memory.source == DeviceMemoryFacts::Source::Unknown
                               ? ", unknown: give --device-memory for the true cap"
                               : "");
    }
  }
  if (lt.trace.empty_cache_calls) out += fmt::format("empty_cache() calls in the trace: {}\n", lt.trace.empty_cache_calls);
  out += own_releases_line(lt);
  if (auto line = failed_request_line(lt); !line.empty()) out += line + "\n";
  if (auto note = trace_note(lt.trace); !note.empty()) out += note + "\n";
  out += pool_lines(lt.trace);
  auto pa = lt.file.final_stats.find("allocated_bytes.all.peak");
  auto pr = lt.file.final_stats.find("reserved_bytes.all.peak");
  if (pa != lt.file.final_stats.end() && pr != lt.file.final_stats.end())
    out += fmt::format("PyTorch recorded: peak allocated {}, peak reserved {} ({:.3f})\n", human_bytes(pa->second),
                       human_bytes(pr->second),
                       pa->second ? static_cast<double>(pr->second) / static_cast<double>(pa->second) : 0.0);
  out += "\n" + results_table(rows);
  for (std::size_t i = 0; i < results.size(); ++i) {
    const ReplayResult& r = results[i];
    if (jobs[i].recorded && lt.end_reserved && lt.end_allocated) {
      const bool same = static_cast<Bytes>(r.stats.reserved_bytes[0].current) == *lt.end_reserved &&
                        static_cast<Bytes>(r.stats.allocated_bytes[0].current) == *lt.end_allocated;
      out += fmt::format("end state {} the snapshot's segments (reserved {}, allocated {}{})\n",
                         same ? "matches" : "differs from", human_bytes(static_cast<std::int64_t>(*lt.end_reserved)),
                         human_bytes(static_cast<std::int64_t>(*lt.end_allocated)),
                         same ? "" : fmt::format("; replay: reserved {}, allocated {}",
                                                 human_bytes(r.stats.reserved_bytes[0].current),
                                                 human_bytes(r.stats.allocated_bytes[0].current)));
      out += pool_end_lines(lt.trace, r);
    }
    // The final stats are compared whether or not the snapshot lists segments (a trace saved after
    // its last segment was released lists none).
    if (jobs[i].recorded) out += final_stats_line(r, lt.file.final_stats);
    if (jobs[i].config == lt.run.config && jobs[i].config.policy == Policy::PyTorch)
      if (auto note = recorded_peak_note(lt, r, lt.run.cap); !note.empty()) out += note + "\n";
    if (r.config.garbage_collection_threshold > 0 && lt.run.cap == 0)
      out += fmt::format("{}: garbage_collection_threshold does nothing without a memory cap "
                         "(set_per_process_memory_fraction), as in PyTorch\n", r.conf);
    if (!r.note.empty() && !(r.config.policy == Policy::Cachet && r.note.starts_with("policy:cachet:")))
      out += fmt::format("note ({}): {}\n", r.conf.empty() ? "(default)" : r.conf, r.note);
    if (r.failed_allocs)
      out += fmt::format("{}: {} allocations that succeeded in the recorded run ran out of memory\n",
                         r.conf.empty() ? "(default)" : r.conf, r.failed_allocs);
    if (r.oom_requests)
      out += fmt::format("{}: {} of the {} requests that ran out of memory in the recorded run succeed\n",
                         r.conf.empty() ? "(default)" : r.conf, r.oom_requests_ok, r.oom_requests);
    if (r.pytorch_failures)
      out += fmt::format("{}: PyTorch 2.11 itself would fail here with private pools ({} operation{} refused, "
                         "docs/pytorch-allocator.md §14.8); the first, {}\n",
                         r.conf.empty() ? "(default)" : r.conf, r.pytorch_failures, r.pytorch_failures == 1 ? "" : "s",
                         r.pytorch_failure);
  }
  std::string verdicts;
  for (const Verdict& v : judged) verdicts += "\n" + verdict_text(v, output_width());
  if (auto c = oom_end_caveat(lt); !c.empty())
    verdicts += "\n" + wrap_text("Caveat: " + c + ".", output_width(), "");
  std::fputs(fit_lines(out, output_width()).c_str(), stdout);
  std::fputs(verdicts.c_str(), stdout);
  return kExitOk;
}

Runner setup(CLI::App& sub) {
  auto a = std::make_shared<Args>();
  sub.add_option("TRACE", a->path,
                 "PyTorch memory snapshot (_dump_snapshot pickle, or the same dictionary as JSON) or an oracle "
                 "recording; gzip or plain")
      ->required();
  sub.add_option("--conf", a->confs,
                 "configuration to replay (PYTORCH_CUDA_ALLOC_CONF syntax; repeatable; '' = default). Default: "
                 "the one recorded in the trace")
      ->allow_extra_args(false);
  sub.add_option("--policy", a->policy, "allocation policy: pytorch (default) or cachet");
  sub.add_option("--addresses", a->addresses,
                 "recorded: hand out the trace's segment addresses (default for the recorded configuration); "
                 "synthetic")
      ->check(CLI::IsMember({"recorded", "synthetic"}));
  sub.add_option("--cap", a->cap,
                 "memory cap (set_per_process_memory_fraction) in bytes, or with a suffix K/M/G/T (powers of 1024): "
                 "'13.5G'. Default: the recorded one (oracle recordings), else none");
  sub.add_option("--fraction", a->fraction, kFractionHelp);
  sub.add_option("--device-memory", a->device_memory, kDeviceMemoryHelp);
  sub.add_flag("--json", a->json,
               "print a JSON array, one object per configuration: {conf, peak_allocated, peak_reserved, "
               "fragmentation, num_ooms, num_alloc_retries, num_device_alloc, num_device_free, "
               "second_half_device_calls, peak_requested, waste, failed_allocs, oom_requests, oom_requests_ok, "
               "pytorch_failures, pytorch_failure, events, ops, addresses, seconds, note, final_stats: {...}, "
               "verdict: {conf, recorded_conf, fits, num_ooms, num_alloc_retries, peak_reserved, cap, limit, "
               "headroom, smallest_cap, cap_rounding, recorded_run_failed}} (verdict: the one tune, explain and "
               "report give)");
  return [a] { return run_replay(*a); };
}

[[maybe_unused]] const bool registered = register_command(
    {"replay", "Replay a PyTorch memory trace under configurations: peaks, fragmentation, OOMs", setup});

}  // namespace
}  // namespace cachet::cli
#endif

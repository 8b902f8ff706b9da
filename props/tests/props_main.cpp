// RapidCheck state-machine properties (project issue 5): the model and the production allocator
// in lockstep (cachet/lockstep.h), with named invariants computed from the allocator's own state
// after every command. See props/README.md.
//
// Properties run: "lockstep machine" (every command, every named check), "replay" (the same
// commands twice after freeing everything and empty_cache: reserved memory does not grow), and
// "coverage" (the hard paths occur in at least 1% of the cases of the machine).
//
// Environment:
//   RC_PARAMS            RapidCheck's (default here: max_success=1000 max_size=300)
//   CACHET_PROPS_CHECKS  comma-separated names of the checks to run (default: all); the mutant
//                        tests run one check at a time to show which check kills which mutant
//   CACHET_PROPS_SKIP    comma-separated properties to skip: machine, replay, coverage
//   CACHET_PROPS_CASE_OUT  a path: the first failing property's shrunk case is written there as
//                        a case file (cachet/lockstep.h show_case), ready for props/regressions
// Exit status 0 when every property holds; 1 otherwise; 77 (GPU build) without a device.
// A failure prints "property failed: <check>" and the shrunk command sequence, the config and
// the lockstep replay (a case file: "# config:", "# capacity:", the ops), then RapidCheck's
// reproduce line.
//
// props_test --device-total BYTES (host builds): the host backend is a device of BYTES (above the
// 8 GiB capacity), the capacity a cap on both sides (set_memory_fraction before the first op,
// lockstep::Options::device_total), fraction commands the same caps in bytes: what
// props_gpu_test does on the real device, which always runs so (its device's total, events
// complete when recorded). --events-when-recorded: every event completes when recorded (as on
// a device). ctest props_device_cap_test runs both flags.
//
// props_test --replay PATH...  (host builds): replays case files (a directory: every *.ops in
// it, by name) through the same steps and enabled checks, outside RapidCheck; prints
// "ok <file>" or the failure for each; exit 0 when all pass (props/regressions, ctest
// props_regressions).
#include "props.h"

namespace cachet::props {
namespace {

// ------------------------------------------------------------------------------- properties

bool machine_property() {
  return rc::check("lockstep machine: model == sut, named invariants after every command", [] {
    const Config config = *gen_config();
    RC_TAG(config.policy == Policy::Cachet ? "policy:cachet" : config.expandable_segments ? "expandable" : "cudaMalloc");
    PModel m0;
    m0.config = config;
    // Half the cases also enter MemPools and capture graphs, where the pair has private pools.
    m0.pools.enabled = pools_supported(config.policy) && *rc::gen::inRange(0, 2) == 0;
    RC_TAG(m0.pools.enabled ? "pools" : "no pools");
    // Every case the lockstep runs tag, sleep and wake in draws them (props.h sleep_supported).
    m0.sleep.enabled = sleep_supported(config);
    if (m0.sleep.enabled) RC_TAG("sleep");
    // A sleep case runs on 64 MiB: the host backend keeps every byte a backup copies and a wake
    // restores (the larger requests then run out of memory, as wakes do more often).
    PSut sut(config, m0.sleep.enabled ? 64 * MiB : 8 * GiB, g_events_when_recorded, g_device_total);
    rc::state::check(m0, sut, gen_command);
    g_totals.add(sut.coverage(), m0.pools.enabled, m0.sleep.enabled);
  });
}

bool replay_property() {
  return rc::check("replay: the same commands again after free-all + empty_cache do not grow reserved", [] {
    const Config config = *gen_config();
    PModel m0;
    m0.config = config;
    const auto cmds = *rc::state::gen::commands(m0, gen_command);
    PSut sut(config, 8 * GiB, g_events_when_recorded, g_device_total);
    rc::state::runAll(cmds, m0, sut);
    const DeviceStats first = sut.ls().sut().stats();
    sut.drain();
    sut.ls().sut().reset_peak_stats();
    if (auto* m = sut.ls().pytorch_model()) m->reset_peak_stats();
    sut.restart_slots();
    rc::state::runAll(cmds, m0, sut);
    const DeviceStats second = sut.ls().sut().stats();
    if (on("replay") && (second.reserved_bytes[0].peak > first.reserved_bytes[0].peak ||
                         second.reserved_bytes[0].current > first.reserved_bytes[0].current))
      sut.fail("replay", "first run: reserved peak " + std::to_string(first.reserved_bytes[0].peak) + ", end " +
                             std::to_string(first.reserved_bytes[0].current) + "; replay: peak " +
                             std::to_string(second.reserved_bytes[0].peak) + ", end " +
                             std::to_string(second.reserved_bytes[0].current));
  });
}

bool coverage_property() {
  const auto& t = g_totals;
  const double n = static_cast<double>(std::max<std::size_t>(t.cases, 1));
  std::vector<std::pair<const char*, std::size_t>> rows;
  if (g_policy == Policy::Cachet)
    rows = {{"free-and-retry", t.retry},       {"out of memory", t.oom}, {"event-deferred free", t.deferred_free},
            {"page map", t.exp_map},           {"page unmap", t.exp_unmap}};
  else
    rows = {{"oversize handling", t.oversize},      {"garbage collection", t.gc},
            {"free-and-retry", t.retry},            {"out of memory", t.oom},
            {"event-deferred free", t.deferred_free}, {"expandable map", t.exp_map},
            {"expandable unmap", t.exp_unmap}};
  bool ok = true;
  std::printf("coverage over %zu cases of the machine:\n", t.cases);
  for (const auto& [name, k] : rows) {
    const double pct = 100.0 * static_cast<double>(k) / n;
    std::printf("  %-22s %6.2f%%%s\n", name, pct, pct < 1.0 ? "  < 1%: FAIL" : "");
    if (pct < 1.0) ok = false;
  }
  // Over the cases that generated pool and capture ops (none where the pair has no pools). A
  // PyTorch failure (docs/pytorch-allocator.md §14.8) is reported, not required.
  if (t.pool_cases > 0) {
    const double np = static_cast<double>(t.pool_cases);
    std::printf("over the %zu cases with private pools:\n", t.pool_cases);
    for (const auto& [name, k, required] :
         {std::tuple{"private pool block", t.pool_alloc, true}, std::tuple{"graph capture", t.capture, true},
          std::tuple{"PyTorch failure (§14.8)", t.pytorch_failure, false},
          std::tuple{"reuse during a capture", t.capture_reuse, false}}) {
      const double pct = 100.0 * static_cast<double>(k) / np;
      const bool low = required && pct < 1.0;
      std::printf("  %-22s %6.2f%%%s\n", name, pct, low ? "  < 1%: FAIL" : "");
      if (low) ok = false;
    }
  }
  // Over the cases that drew tag, sleep and wake ops: the cases with at least one of each (the
  // sleep.* counts of gpu/, compared with the model's by the lockstep), and the totals. A wake
  // that ran out of memory is reported, not required.
  if (t.sleep_cases > 0) {
    const double ns = static_cast<double>(t.sleep_cases);
    std::printf("over the %zu cases with sleep ops (cases with one or more; total):\n", t.sleep_cases);
    for (const auto& [name, k, total, required] :
         {std::tuple{"sleep", t.slept, t.sleeps, true}, std::tuple{"wake", t.woke, t.wakes, true},
          std::tuple{"free while asleep", t.freed_asleep, t.frees_while_asleep, true},
          std::tuple{"wake out of memory", t.wake_oomed, t.wake_ooms, false}}) {
      const double pct = 100.0 * static_cast<double>(k) / ns;
      const bool low = required && pct < 1.0;
      std::printf("  %-22s %6.2f%%  (%zu)%s\n", name, pct, total, low ? "  < 1%: FAIL" : "");
      if (low) ok = false;
    }
  }
  if (!ok) std::printf("property failed: coverage (a hard path occurs in under 1%% of cases)\n");
  return ok;
}

#ifndef CACHET_PROPS_CUDA
// --replay: every case file named (a directory: its *.ops, by name). 0 when all pass.
int replay_files(const std::vector<std::string>& args) {
  namespace fs = std::filesystem;
  std::vector<fs::path> files;
  for (const auto& a : args) {
    if (fs::is_directory(a)) {
      std::vector<fs::path> in;
      for (const auto& e : fs::directory_iterator(a))
        if (e.path().extension() == ".ops") in.push_back(e.path());
      std::sort(in.begin(), in.end());
      files.insert(files.end(), in.begin(), in.end());
    } else {
      files.emplace_back(a);
    }
  }
  if (files.empty()) {
    std::printf("--replay: no case files\n");
    return 1;
  }
  g_replaying = true;
  int failed = 0;
  for (const auto& f : files) {
    std::ifstream in(f);
    const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    std::string error;
    std::size_t n = 0;
    try {
      if (!in) throw std::runtime_error("cannot read the file");
      const lockstep::Case c = lockstep::parse_case(text);
      if (c.ops.empty()) throw std::runtime_error("no ops");
      n = c.ops.size();
      PSut sut(parse_config(c.config).config, c.capacity, c.events_when_recorded, c.device_total);
      for (const Op& op : c.ops) sut.step(op);
    } catch (const ReplayFailure& e) {
      error = e.message;
    } catch (const std::exception& e) {
      error = std::string("error: ") + e.what();
    }
    if (error.empty()) {
      std::printf("ok %s (%zu ops)\n", f.string().c_str(), n);
    } else {
      ++failed;
      std::printf("FAILED %s\n%s\n", f.string().c_str(), error.c_str());
    }
  }
  std::printf("%zu case files, %d failed\n", files.size(), failed);
  return failed == 0 ? 0 : 1;
}
#endif

}  // namespace
}  // namespace cachet::props

int main(int argc, char** argv) {
  using namespace cachet::props;
#ifdef CACHET_PROPS_CUDA
  if (cachet::gpu::cuda_device_count() <= 0) {
    std::printf("no CUDA device: skipped\n");
    return 77;
  }
#endif
  for (bool more = true; more && argc >= 2;) {
    const std::string a = argv[1];
    if (a == "--policy" && argc >= 3) {  // on the device too (props_gpu_cachet_test)
      const std::string p = argv[2];
      if (p != "pytorch" && p != "cachet") {
        std::printf("--policy %s: expected pytorch or cachet\n", p.c_str());
        return 2;
      }
      g_policy = p == "cachet" ? cachet::Policy::Cachet : cachet::Policy::PyTorch;
      argc -= 2;
      argv += 2;
#ifndef CACHET_PROPS_CUDA
    } else if (a == "--device-total" && argc >= 3) {
      const std::string v = argv[2];
      char* end = nullptr;
      const unsigned long long n = std::strtoull(v.c_str(), &end, 10);
      if (v.empty() || *end != '\0' || n <= 8 * cachet::GiB) {
        std::printf("--device-total %s: expected a whole number of bytes above the capacity (8589934592), "
                    "e.g. 85899345920 (80 GiB)\n",
                    v.c_str());
        return 2;
      }
      g_device_total = n;
      argc -= 2;
      argv += 2;
    } else if (a == "--events-when-recorded") {
      g_events_when_recorded = true;
      argc -= 1;
      argv += 1;
#endif
    } else {
      more = false;
    }
  }
#ifndef CACHET_PROPS_CUDA
  if (argc >= 2 && std::string(argv[1]) == "--replay") {
    std::printf("checks:");
    for (const auto& c : enabled_checks()) std::printf(" %s", c.c_str());
    std::printf("\n");
    return replay_files(std::vector<std::string>(argv + 2, argv + argc));
  }
#endif
  if (argc >= 2) {
    std::printf("usage: props_test [--policy pytorch|cachet] [--device-total BYTES] [--events-when-recorded] "
                "[--replay CASE_FILE_OR_DIR...]\n");
    return 2;
  }
#ifdef CACHET_PROPS_CUDA
  {  // the device's total: the 8 GiB capacity is a cap of it (PSut, lockstep::Options::device_total)
    std::size_t free = 0, total = 0;
    if (cudaMemGetInfo(&free, &total) != cudaSuccess) {
      std::printf("cudaMemGetInfo failed on device 0\n");
      return 1;
    }
    g_device_total = total;
    g_events_when_recorded = true;
  }
#endif
  setenv("RC_PARAMS", "max_success=1000 max_size=300", 0);
  const auto skip = split_list(std::getenv("CACHET_PROPS_SKIP"));
  std::printf("policy:%s\nRC_PARAMS=%s\nchecks:", g_policy == cachet::Policy::Cachet ? "cachet" : "pytorch",
              std::getenv("RC_PARAMS"));
  for (const auto& c : enabled_checks()) std::printf(" %s", c.c_str());
  std::printf("\n");
  if (g_device_total)
    std::printf("device: %llu bytes in all, the capacity of %llu bytes a cap on both sides (fraction %.17g)%s\n",
                static_cast<unsigned long long>(*g_device_total), static_cast<unsigned long long>(8 * cachet::GiB),
                cachet::lockstep::fraction_for_cap(8 * cachet::GiB, *g_device_total),
                g_events_when_recorded ? "; events complete when recorded" : "");
  else
    std::printf("device: host backend of %llu bytes (the capacity), no cap%s\n",
                static_cast<unsigned long long>(8 * cachet::GiB),
                g_events_when_recorded ? "; events complete when recorded" : "");
  bool ok = true;
  if (!skip.count("machine")) {
    ok = machine_property() && ok;
    g_case_frozen = !ok;
    if (ok && !skip.count("coverage")) ok = coverage_property() && ok;
  }
  // replay (reserved does not grow on a second run) is policy:pytorch's property: policy:cachet
  // promises a budget (R4), not a replay bound, and its model keeps its peaks.
  if (!skip.count("replay") && g_policy != cachet::Policy::Cachet) ok = replay_property() && ok;
  if (!ok) {
    const char* out = std::getenv("CACHET_PROPS_CASE_OUT");
    std::printf("props: failed. Reproduce: RC_PARAMS=\"reproduce=...\" from RapidCheck's line above (the run "
                "used RC_PARAMS=%s and the seed printed at the start). Keep the shrunk case as a regression: "
                "save its case file (after 'lockstep replay') as props/regressions/<name>.ops%s%s\n",
                std::getenv("RC_PARAMS"), out && *out ? "; it was written to " : "", out && *out ? out : "");
  }
  return ok ? 0 : 1;
}

// `cachet predict (--gpu NAME | --device-memory BYTES --arch sm_XY) [--conf STR]... [--cap BYTES]...
//   [--batch-arg NAME] [--json] [--dump-snapshot FILE] [--python PYTHON] [--fail-on-oom]
//   -- (SCRIPT | -m MODULE) [ARGS...]`
//
// Peak memory of a PyTorch program before its first GPU run (docs/predict.md). The program runs
// unmodified in the user's Python on cachet's fake CUDA device for the target GPU (python/fakecuda,
// python/cachet_torch/_capture.py): PyTorch's own allocator runs on it, so the capture is a PyTorch
// memory snapshot of what the GPU would see. The answers come from cachet's own commands on that
// snapshot, so they are the same answers `cachet replay`, `tune` and `explain` give: peaks and
// verdicts per configuration and cap (replay), the recommendation (tune), the first out-of-memory
// error's account (explain).
//
// Exit codes: 0 a verdict (a predicted out-of-memory error is an answer); 1 only with
// --fail-on-oom when one is predicted; 2 bad input (unknown GPU, no torch for --python, a program
// that raised: its traceback, and the prediction up to there, "partial": true).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cachet/config.h"
#include "cachet/errors.h"
#include "cachet/replay/report.h"
#include "command.h"
#include "predict_process.h"
#include "predict_targets.h"

namespace cachet::cli {
namespace {
namespace fs = std::filesystem;
using nlohmann::json;

struct Args {
  std::string gpu, device_memory, arch, batch_arg, dump_snapshot, python;
  std::vector<std::string> confs, caps, program;
  bool json_out = false, fail_on_oom = false;
};

struct Target {
  GpuTarget gpu;
  bool named = false;  // --gpu (else --device-memory/--arch)
};

std::string arch_text(int arch) { return fmt::format("sm_{}", arch); }

std::string human(std::uint64_t b) { return replay::human_bytes(static_cast<std::int64_t>(b)); }

// One capture of the program (with `batch` for --batch-arg when set).
struct Capture {
  bool ok = false;           // the capture ran (the program may have raised or run out of memory)
  int exit_code = 0;
  std::string dir, snapshot;
  json info;                 // capture.json
  double seconds = 0;
};

// Reads a capture folder's capture.json and finds its snapshot.pickle into `c` (c.ok on success);
// `missing` is the error when either is absent.
bool read_capture(Capture& c, const std::string& missing, std::string* error) {
  c.snapshot = c.dir + "/snapshot.pickle";
  std::ifstream in(c.dir + "/capture.json");
  if (!in || !fs::exists(c.snapshot)) {
    *error = missing;
    return false;
  }
  try {
    in >> c.info;
  } catch (const std::exception& e) {
    *error = fmt::format("{}/capture.json: {}", c.dir, e.what());
    return false;
  }
  c.ok = true;
  return true;
}

Capture run_capture(const Args& a, const Target& t, const std::string& fakecuda, const std::string& pydir,
                    std::optional<long long> batch, std::string* error) {
  Capture c;
  if (const char* replayed = std::getenv("CACHET_PREDICT_USE_CAPTURE"); replayed && *replayed && !batch) {
    // Offline: the answers for a capture made before (its folder: capture.json, snapshot.pickle),
    // without running the program again. Tests use it where there is no torch.
    c.dir = replayed;
    if (read_capture(c, fmt::format("CACHET_PREDICT_USE_CAPTURE={}: no capture.json and snapshot.pickle there", replayed),
                     error))
      c.seconds = c.info.value("seconds", 0.0);
    return c;
  }
  char tmpl[] = "/tmp/cachet-predict-XXXXXX";
  if (!mkdtemp(tmpl)) {
    *error = "cannot create a temporary folder under /tmp";
    return c;
  }
  c.dir = tmpl;
  std::vector<std::string> argv = {a.python, "-m", "cachet_torch._capture", "--out", c.dir};
  if (batch) {
    argv.insert(argv.end(), {"--batch-arg", a.batch_arg, "--batch", std::to_string(*batch)});
  }
  argv.push_back("--");
  argv.insert(argv.end(), a.program.begin(), a.program.end());
  std::string pythonpath = pydir;
  if (const char* pp = std::getenv("PYTHONPATH"); pp && *pp) pythonpath += std::string(":") + pp;
  std::string preload = fakecuda;
  // The fake cuDNN beside the fake device, where NVIDIA's cannot run (docs/predict.md section 3).
  if (const char* fc = std::getenv("CACHET_FAKE_CUDNN"); fc && std::string(fc) == "fake")
    preload += ":" + (fs::path(fakecuda).parent_path() / "libcachet_fakecudnn.so").string();
  if (const char* lp = std::getenv("LD_PRELOAD"); lp && *lp) preload += std::string(":") + lp;
  const std::map<std::string, std::string> env = {
      {"LD_PRELOAD", preload},
      {"PYTHONPATH", pythonpath},
      {"PYTHONUNBUFFERED", "1"},
      {"CACHET_FAKE_GPU_NAME", t.gpu.name},
      {"CACHET_FAKE_GPU_MEMORY", std::to_string(t.gpu.total_memory)},
      {"CACHET_FAKE_OUTSIDE_ALLOCATOR", std::to_string(kOutsideAllocatorBytes)},
      {"CACHET_FAKE_GPU_ARCH", std::to_string(t.gpu.arch)},
      {"CACHET_FAKE_GPU_ARCH_TEXT", arch_text(t.gpu.arch)},
      {"CACHET_FAKE_GPU_SMS", std::to_string(t.gpu.sm_count)},
      {"CACHET_FAKE_GPU_SMEM_OPTIN", std::to_string(t.gpu.smem_optin)},
      {"CACHET_FAKE_GPU_L2", std::to_string(t.gpu.l2_bytes)},
      {"CACHET_FAKE_GPU_PCI_ID", std::to_string(t.gpu.pci_device_id)},
      {"CACHET_FAKE_LEDGER", c.dir + "/ledger.tsv"},
  };
  const auto t0 = std::chrono::steady_clock::now();
  auto r = run_process(argv, env, false, error);
  c.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!r) {
    *error = fmt::format("cannot start {}: {}; give the Python that has torch with --python", a.python, *error);
    return c;
  }
  c.exit_code = r->exit_code;
  read_capture(c,
               r->exit_code == 2 ? "the capture could not start (its message is above)"
                                 : fmt::format("the capture ended with exit code {} before writing its snapshot "
                                               "(the program's output is above)",
                                               r->exit_code),
               error);
  return c;
}

// `cachet <args...>` on the snapshot: its JSON, or nullopt with the reason.
std::optional<json> cachet_json(const std::vector<std::string>& args, std::string* error) {
  std::vector<std::string> argv = {self_path()};
  argv.insert(argv.end(), args.begin(), args.end());
  auto r = run_process(argv, {}, true, error);
  if (!r) return std::nullopt;
  if (r->exit_code != 0 && r->out.empty()) {
    *error = fmt::format("cachet {} exited with {}", args.front(), r->exit_code);
    return std::nullopt;
  }
  try {
    return json::parse(r->out);
  } catch (const std::exception& e) {
    *error = fmt::format("cachet {}: unreadable JSON: {}", args.front(), e.what());
    return std::nullopt;
  }
}

// The allocator's share of the device: what the replay may use before the device says no.
std::uint64_t allocator_memory(const Target& t) {
  return t.gpu.total_memory > kOutsideAllocatorBytes ? t.gpu.total_memory - kOutsideAllocatorBytes : 0;
}

// The allocations PyTorch makes for the libraries, found in the capture (docs/predict.md section 3).
json hidden_allocations(const Capture& c) {
  json out = json::array();
  std::uint64_t cublas = 0;
  int n = 0;
  for (const auto& row : c.info.value("ledger", json::array())) {
    if (row.size() >= 3 && row[0] == "cublas_workspace") {
      cublas += std::stoull(row[2].get<std::string>());
      ++n;
    }
  }
  if (n) out.push_back({{"kind", "cublas_workspace"}, {"bytes", cublas}, {"count", n},
                        {"rule", "one per (handle, stream): CUBLAS_WORKSPACE_CONFIG, else 32 MiB on sm_90 (PyTorch's "
                                 "CublasHandlePool.cpp), allocated by PyTorch through its allocator"}});
  if (c.info.value("cudnn", std::string()) == "fake")
    out.push_back({{"kind", "cudnn_workspace"}, {"bytes", 0},
                   {"rule", "the fake cuDNN (CACHET_FAKE_CUDNN=fake) asks for no workspace (docs/predict.md section 3)"}});
  else
    out.push_back({{"kind", "cudnn_workspace"}, {"bytes", nullptr},
                   {"rule", "NVIDIA's cuDNN chose the target's engines on the fake device; their workspaces are "
                            "PyTorch allocations, not counted apart (docs/predict.md section 3)"}});
  return out;
}

std::vector<std::string> defaults_from_env(const Capture& c, std::string* source) {
  const json env = c.info.value("env_conf", json::object());
  for (const char* v : {"CACHET_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"}) {
    if (env.contains(v)) {
      const std::string text = env[v].get<std::string>();
      *source = fmt::format("{}={} (the program's environment)", v, text);
      return {text};
    }
  }
  *source = "none set: PyTorch's defaults";
  return {""};
}

struct Row {
  std::string conf;
  std::optional<std::uint64_t> cap;
  json replay;  // cachet replay's row
  bool oom = false;
  json first_oom = nullptr;
};

std::vector<std::string> cap_args(std::optional<std::uint64_t> cap, std::uint64_t device) {
  std::vector<std::string> v = {"--device-memory", std::to_string(device)};
  if (cap) v.insert(v.end(), {"--cap", std::to_string(*cap)});
  return v;
}

int fail(const Args& a, const std::string& msg) {
  std::fprintf(stderr, "cachet predict: %s\n", msg.c_str());
  (void)a;
  return kExitBadInput;
}

std::optional<std::uint64_t> size_arg(const std::string& option, const std::string& text, std::string* error) {
  // The sizes of every cachet command (replay::parse_size): K/M/G/T and KiB..TiB are powers of
  // 1024, KB/MB/GB/TB are refused as ambiguous, and under 1 MiB is refused with what was meant.
  const replay::SizeParse p = replay::parse_size(text);
  if (!p.bytes) {
    *error = fmt::format("{} {}: {}", option, text, p.error);
    return std::nullopt;
  }
  return *p.bytes;
}

// The batch value the program's arguments give (--NAME X or --NAME=X), if any.
std::optional<long long> batch_in_args(const std::vector<std::string>& prog, const std::string& name) {
  const std::string flag = "--" + name;
  for (std::size_t i = 0; i < prog.size(); ++i) {
    if (prog[i] == flag && i + 1 < prog.size()) return std::atoll(prog[i + 1].c_str());
    if (prog[i].rfind(flag + "=", 0) == 0) return std::atoll(prog[i].c_str() + flag.size() + 1);
  }
  return std::nullopt;
}

int run(Args& a) {
  const auto t0 = std::chrono::steady_clock::now();
  Target t;
  std::string error;
  if (!a.gpu.empty()) {
    if (!a.device_memory.empty() || !a.arch.empty())
      return fail(a, "--gpu names the device; leave out --device-memory and --arch (or give them without --gpu)");
    auto g = find_gpu(a.gpu);
    if (!g) return fail(a, fmt::format("--gpu {}: not a GPU cachet knows. Known (or give --device-memory BYTES --arch sm_XY):\n{}", a.gpu, gpu_list_text()));
    t.gpu = *g;
    t.named = true;
  } else {
    if (a.device_memory.empty() || a.arch.empty())
      return fail(a, fmt::format("name the target GPU: --gpu NAME, or --device-memory BYTES with --arch sm_XY. Known GPUs:\n{}", gpu_list_text()));
    auto mem = size_arg("--device-memory", a.device_memory, &error);
    if (!mem) return fail(a, error);
    auto arch = parse_arch(a.arch);
    if (!arch) return fail(a, fmt::format("--arch {}: not a CUDA architecture PyTorch 2.11 builds for (sm_70, sm_75, sm_80, sm_86, sm_89, sm_90, sm_100, sm_120, ...)", a.arch));
    t.gpu = custom_target(*mem, *arch);
  }
  std::vector<std::optional<std::uint64_t>> caps;
  for (const std::string& c : a.caps) {
    auto v = size_arg("--cap", c, &error);
    if (!v) return fail(a, error);
    if (*v > allocator_memory(t))
      return fail(a, fmt::format("--cap {}: more than the allocator can have on this GPU ({} of {}, the rest is the "
                                 "CUDA context and libraries); give a smaller cap",
                                 c, human(allocator_memory(t)), human(t.gpu.total_memory)));
    caps.push_back(*v);
  }
  // The device row (no cap) always comes first: the program's peaks on the target as it is.
  caps.insert(caps.begin(), std::nullopt);
  for (const std::string& c : a.confs) {
    try {
      (void)parse_config(c, ConfigSource::Cachet);
    } catch (const std::exception& e) {
      return fail(a, fmt::format("--conf '{}': {}", c, e.what()));
    }
  }
  if (a.program.empty()) return fail(a, "no program: give it after --, as `cachet predict --gpu H100 -- train.py --batch-size 8`");
  if (a.program[0] == "-m" && a.program.size() < 2) return fail(a, "-m needs a module name");
  if (a.program[0] != "-m" && !fs::exists(a.program[0])) return fail(a, fmt::format("{}: no such script", a.program[0]));
  if (a.python.empty()) a.python = "python3";
  const bool offline = std::getenv("CACHET_PREDICT_USE_CAPTURE") && *std::getenv("CACHET_PREDICT_USE_CAPTURE");
  const std::string pydir = offline ? std::string() : find_python_package_dir(a.python);
  if (pydir.empty() && !offline)
    return fail(a, "the cachet_torch package was not found; set CACHET_PYTHONPATH to the folder holding it");
  const std::string fakecuda = offline ? std::string() : find_fakecuda(pydir);
  if (fakecuda.empty() && !offline)
    return fail(a, "libcachet_fakecuda.so not found (built with the CUDA Toolkit's headers, installed to lib/cachet/); set CACHET_FAKECUDA to its path");

  Capture cap = run_capture(a, t, fakecuda, pydir, std::nullopt, &error);
  if (!cap.ok) return fail(a, error);
  const std::string status = cap.info.value("status", "");
  const bool partial = status == "raised" || status == "exited";

  std::string conf_source = "--conf";
  std::vector<std::string> confs = a.confs;
  if (confs.empty()) confs = defaults_from_env(cap, &conf_source);
  const std::uint64_t device = allocator_memory(t);

  std::vector<Row> rows;
  for (const auto& c : caps) {
    std::vector<std::string> args = {"replay", cap.snapshot, "--json"};
    for (const std::string& conf : confs) args.insert(args.end(), {"--conf", conf});
    for (const std::string& s : cap_args(c, device)) args.push_back(s);
    auto j = cachet_json(args, &error);
    if (!j || !j->is_array()) return fail(a, "replaying the capture failed: " + error);
    for (std::size_t i = 0; i < j->size() && i < confs.size(); ++i) {
      Row r{confs[i], c, (*j)[i]};
      r.oom = (*j)[i].value("num_ooms", std::int64_t{0}) > 0 || (*j)[i].value("failed_allocs", std::int64_t{0}) > 0;
      if (r.oom) {
        std::vector<std::string> ea = {"explain", cap.snapshot, "--json"};
        for (const std::string& s : cap_args(c, device)) ea.push_back(s);
        std::string e2;
        if (auto ej = cachet_json(ea, &e2)) r.first_oom = *ej;
      }
      rows.push_back(std::move(r));
    }
  }
  json recommendation = nullptr;
  {
    std::vector<std::string> ta = {"tune", cap.snapshot, "--json"};
    for (const std::string& s : cap_args(caps.size() > 1 ? caps[1] : std::nullopt, device)) ta.push_back(s);
    std::string e2;
    if (auto tj = cachet_json(ta, &e2)) recommendation = *tj;
  }

  json batch = nullptr;
  if (!a.batch_arg.empty()) {
    // The largest value of the program's batch option that fits under the first cap (or the
    // device), found by capture: doubling until a capture does not fit, then bisection.
    const auto limit = caps.size() > 1 ? caps[1] : std::nullopt;
    json tried = json::array();
    auto fits = [&](long long b) -> std::optional<bool> {
      std::string e3;
      Capture c = run_capture(a, t, fakecuda, pydir, b, &e3);
      if (!c.ok) return std::nullopt;
      bool ok = c.info.value("status", "") == "ended";
      std::int64_t peak = 0;
      if (ok) {
        std::vector<std::string> args = {"replay", c.snapshot, "--json"};
        args.insert(args.end(), {"--conf", confs.front()});
        for (const std::string& s : cap_args(limit, device)) args.push_back(s);
        auto j = cachet_json(args, &e3);
        if (j && j->is_array() && !j->empty()) {
          ok = (*j)[0].value("num_ooms", std::int64_t{0}) == 0 && (*j)[0].value("failed_allocs", std::int64_t{0}) == 0;
          peak = (*j)[0].value("peak_reserved", std::int64_t{0});
        }
      }
      tried.push_back({{"value", b}, {"fits", ok}, {"peak_reserved", peak}, {"status", c.info.value("status", "")}});
      std::fprintf(stderr, "cachet predict: --%s %lld: %s\n", a.batch_arg.c_str(), b, ok ? "fits" : "does not fit");
      return ok;
    };
    long long lo = 0, hi = 0;
    long long b = std::max(1LL, batch_in_args(a.program, a.batch_arg).value_or(1));
    auto f = fits(b);
    if (f && *f) {
      lo = b;
      while (true) {
        if (lo > (1LL << 24)) { hi = 0; break; }
        auto g = fits(lo * 2);
        if (!g) break;
        if (!*g) { hi = lo * 2; break; }
        lo *= 2;
      }
    } else if (f) {
      hi = b;
      while (hi > 1) {
        auto g = fits(hi / 2);
        if (!g) break;
        if (*g) { lo = hi / 2; break; }
        hi /= 2;
      }
    }
    while (lo && hi && hi - lo > 1) {
      const long long mid = lo + (hi - lo) / 2;
      auto g = fits(mid);
      if (!g) break;
      (*g ? lo : hi) = mid;
    }
    batch = {{"arg", a.batch_arg}, {"largest_fit", lo ? json(lo) : json(nullptr)}, {"tried", tried},
             {"cap", limit ? json(*limit) : json(device)}};
  }

  if (!a.dump_snapshot.empty()) {
    std::error_code ec;
    fs::copy_file(cap.snapshot, a.dump_snapshot, fs::copy_options::overwrite_existing, ec);
    if (ec) return fail(a, fmt::format("--dump-snapshot {}: {}", a.dump_snapshot, ec.message()));
  }
  json assumptions = cap.info.value("assumptions", json::array());
  assumptions.push_back(fmt::format("{} of the device is outside the allocator (CUDA context and libraries): measured "
                                    "on an H200 with PyTorch 2.11 (bench/predict/RESULTS.md), taken for every GPU",
                                    human(kOutsideAllocatorBytes)));
  assumptions.push_back(fmt::format("the device's total memory: {}", t.gpu.source));
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const bool any_oom = std::any_of(rows.begin(), rows.end(), [](const Row& r) { return r.oom; });

  if (a.json_out) {
    json out;
    out["gpu"] = t.named ? json(t.gpu.name) : json(nullptr);
    out["device_memory"] = t.gpu.total_memory;
    out["arch"] = arch_text(t.gpu.arch);
    out["conf_source"] = conf_source;
    out["results"] = json::array();
    for (const Row& r : rows)
      out["results"].push_back({{"conf", r.conf},
                                {"cap", r.cap ? json(*r.cap) : json(nullptr)},
                                {"peak_reserved", r.replay.value("peak_reserved", std::int64_t{0})},
                                {"peak_allocated", r.replay.value("peak_allocated", std::int64_t{0})},
                                {"oom", r.oom},
                                {"num_alloc_retries", r.replay.value("num_alloc_retries", std::int64_t{0})},
                                {"first_oom", r.first_oom}});
    out["recommendation"] = recommendation;
    out["hidden"] = hidden_allocations(cap);
    out["outside_allocator_bytes"] = kOutsideAllocatorBytes;
    out["assumptions"] = assumptions;
    out["partial"] = partial;
    out["program_status"] = status;
    out["program_error"] = cap.info.value("error", json(nullptr));
    out["batch"] = batch;
    out["capture_seconds"] = cap.seconds;
    out["seconds"] = seconds;
    std::printf("%s\n", out.dump(1).c_str());
  } else {
    std::printf("cachet predict: %s, %s as cudaMemGetInfo reports it, %s, %d SMs (no GPU used)\n", t.gpu.name.c_str(),
                human(t.gpu.total_memory).c_str(), arch_text(t.gpu.arch).c_str(), t.gpu.sm_count);
    std::printf("program: %s: %s in %.1f s on the CPU\n", fmt::format("{}", fmt::join(a.program, " ")).c_str(),
                status == "ended" ? "ran to the end" : status == "oom" ? "ran out of memory" : "raised (partial prediction)",
                cap.seconds);
    std::printf("configuration: %s\n\n", conf_source.c_str());
    std::printf("%-34s %-12s %14s %15s  %s\n", "configuration", "cap", "peak reserved", "peak allocated", "verdict");
    for (const Row& r : rows) {
      const std::int64_t pr = r.replay.value("peak_reserved", std::int64_t{0});
      const std::uint64_t limit = r.cap ? *r.cap : device;
      std::string verdict = r.oom ? "OUT OF MEMORY" : fmt::format("fits, {} to spare", human(limit - static_cast<std::uint64_t>(pr)));
      if (!r.oom && r.replay.value("num_alloc_retries", std::int64_t{0}) > 0)
        verdict += fmt::format(" ({} retries: the cache was freed to fit)", r.replay.value("num_alloc_retries", std::int64_t{0}));
      std::printf("%-34s %-12s %14s %15s  %s\n", r.conf.empty() ? "(default)" : r.conf.c_str(),
                  r.cap ? human(*r.cap).c_str() : "device", human(static_cast<std::uint64_t>(pr)).c_str(),
                  human(r.replay.value("peak_allocated", std::uint64_t{0})).c_str(), verdict.c_str());
    }
    std::printf("\npeak reserved: the most memory PyTorch's allocator held from the device (what runs out);\n"
                "peak allocated: the most its live tensors took (a different moment).\n");
    std::printf("outside the allocator: %s (CUDA context and libraries; the device cap above leaves it out)\n",
                human(kOutsideAllocatorBytes).c_str());
    for (const auto& h : hidden_allocations(cap)) {
      if (h["bytes"].is_number_unsigned() && h["bytes"].get<std::uint64_t>() > 0)
        std::printf("in the trace: %s %s (%d)\n", h["kind"].get<std::string>().c_str(),
                    human(h["bytes"].get<std::uint64_t>()).c_str(), h.value("count", 0));
      else if (h["bytes"].is_null())
        std::printf("in the trace: %s (%s)\n", h["kind"].get<std::string>().c_str(),
                    h["rule"].get<std::string>().c_str());
    }
    if (recommendation.is_object()) {
      const auto best = recommendation.value("best", -1);
      const auto& res = recommendation["results"];
      const std::string where = caps.size() > 1 ? fmt::format("under the {} cap", human(*caps[1])) : "on the device";
      if (best >= 0 && best < static_cast<int>(res.size())) {
        const json& b = res[best];
        std::printf("recommendation %s (cachet tune): %s: peak reserved %s, %s\n", where.c_str(),
                    b.value("conf", "").c_str(), human(b.value("peak_reserved", std::uint64_t{0})).c_str(),
                    b.value("num_ooms", std::int64_t{0}) ? "still out of memory" : "no out-of-memory error");
        if (b.value("num_ooms", std::int64_t{0}) && recommendation.contains("memory_needed") &&
            recommendation["memory_needed"].is_number())
          std::printf("  no configuration tune tries fits under this cap: the program needs a cap of at least %s\n",
                      human(recommendation["memory_needed"].get<std::uint64_t>()).c_str());
      } else {
        std::printf("recommendation %s (cachet tune): keep the configuration: none of tune's candidates does better\n",
                    where.c_str());
      }
    }
    if (!a.batch_arg.empty() && batch.is_object())
      std::printf("largest --%s that fits: %s\n", a.batch_arg.c_str(),
                  batch["largest_fit"].is_null() ? "none (even the smallest tried runs out of memory)"
                                                 : std::to_string(batch["largest_fit"].get<long long>()).c_str());
    std::printf("\nassumed:\n");
    for (const auto& s : assumptions) std::printf("  - %s\n", s.get<std::string>().c_str());
    if (partial)
      std::printf("\nthe program raised before its end (traceback above): this prediction covers what ran until then\n");
  }
  if (partial) return kExitBadInput;
  if (a.fail_on_oom && any_oom) return kExitCheckFailed;
  return kExitOk;
}

Runner setup(CLI::App& sub) {
  auto a = std::make_shared<Args>();
  sub.add_option("--gpu", a->gpu, "the target GPU (see the list below)");
  sub.add_option("--device-memory", a->device_memory, "the target's memory as cudaMemGetInfo reports it (with --arch; K/M/G/T are powers of 1024)");
  sub.add_option("--arch", a->arch, "the target's architecture, sm_XY (with --device-memory)");
  sub.add_option("--conf", a->confs, "a configuration to predict under (repeatable; PyTorch syntax, or policy:cachet); "
                                     "default: the one the program's torch would read");
  sub.add_option("--cap", a->caps, "a memory cap (set_per_process_memory_fraction in bytes; repeatable)");
  sub.add_option("--batch-arg", a->batch_arg, "the program's option that sets the batch size: find its largest value that fits");
  sub.add_flag("--json", a->json_out, "print JSON on stdout (the program's own output goes to stderr)");
  sub.add_option("--dump-snapshot", a->dump_snapshot, "write the predicted trace as a PyTorch memory snapshot (pickle)");
  sub.add_option("--python", a->python, "the Python that has torch (default: python3 on PATH)");
  sub.add_flag("--fail-on-oom", a->fail_on_oom, "exit 1 when an out-of-memory error is predicted");
  // Everything from the first positional (or `--`) on is the program's: its own options are not
  // predict's (CLI11's prefix command).
  sub.prefix_command();
  sub.positionals_at_end(false);
  sub.description("Predict a PyTorch program's peak GPU memory before it runs (no GPU needed).\n  cachet predict (--gpu NAME | --device-memory BYTES --arch sm_XY) [OPTIONS] -- (SCRIPT | -m MODULE) [ARGS...]");
  sub.footer("GPUs (--gpu):\n" + gpu_list_text() +
             "\nExit codes: 0 a verdict (also a predicted out-of-memory error); 1 with --fail-on-oom when one is "
             "predicted; 2 bad input, or a program that raised (partial prediction).");
  return [a, &sub] {
    a->program = trailing_args().empty() ? sub.remaining() : trailing_args();
    if (!a->program.empty() && a->program.front() == "--") a->program.erase(a->program.begin());
    return run(*a);
  };
}

const bool registered = register_command(
    {"predict", "Predict a PyTorch program's peak GPU memory before it runs (no GPU needed)", setup});

}  // namespace
}  // namespace cachet::cli

// `cachet conform [OPS] RESULT`: replays an oracle recording's ops through an engine (the model,
// the production allocator, or both) with PyTorch's device addresses, and compares every
// returned pointer, the six stats after every op, every final memory_stats() key, the final
// segments and blocks, the memory_summary() text, the trace, and OOMs (same ops, same message
// with the driver figures masked). Exit 0: no mismatch; 1: mismatches; 2: bad input.
// This file is the command: its options, the checks that the op list and the recording belong
// together, and the choice of replay: conform_pytorch.h (compared with PyTorch, per engine) or
// conform_cachet.h (--policy cachet). The engines are engine_model.cpp and engine_gpu.cpp.
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "cachet/config.h"
#include "cachet/errors.h"
#include "cachet/rule_flip.h"
#include "cachet/io/file.h"
#include "cachet/io/recording.h"
#include "command.h"
#include "conform_cachet.h"
#include "conform_pytorch.h"
#include "engine.h"

namespace cachet::cli {
namespace {

// An op list and a recording belong together when every allocation's step returned a pointer
// or ran out of memory, every free's and empty_cache's step neither, and (requested_bytes being
// exact) each allocation that succeeded grew requested_bytes.all.current by its size. (In a list
// with record_stream, frees whose events complete, or that a capture deferred, are processed by
// the next allocation, docs/pytorch-allocator.md §6, §14.7: there it grows by its size at most.)
// The first op that breaks this, with how many do; "" when none does.
std::string pairing_problem(const std::vector<ops::Op>& ops, const io::Recording& rec, const std::string& ops_path,
                            const std::string& rec_path) {
  const auto req = std::find(rec.stat_keys.begin(), rec.stat_keys.end(), "requested_bytes.all.current");
  const std::size_t k = static_cast<std::size_t>(req - rec.stat_keys.begin());
  auto op_text = [](const ops::Op& op) {
    if (const auto* a = std::get_if<ops::Allocate>(&op)) return fmt::format("an allocation of {} bytes", a->size);
    if (std::holds_alternative<ops::Free>(op)) return std::string("a free");
    if (std::holds_alternative<ops::RecordStream>(op)) return std::string("a record_stream");
    if (std::holds_alternative<ops::EmptyCache>(op)) return std::string("empty_cache()");
    return ops::show(op);  // a pool or capture op
  };
  const bool stream_uses = std::any_of(ops.begin(), ops.end(), [](const ops::Op& op) {
    return std::holds_alternative<ops::RecordStream>(op);
  });
  std::string first;
  std::size_t bad = 0;
  std::int64_t requested = 0;
  for (std::size_t i = 0; i < ops.size(); ++i) {
    const io::Step& st = rec.steps[i];
    const auto* a = std::get_if<ops::Allocate>(&ops[i]);
    const bool alloc = a != nullptr;
    std::string why;
    if (alloc != (st.oom || st.result.has_value())) {
      why = fmt::format("op {} of {} is {}, but step {} of {} {}", i, ops_path, op_text(ops[i]), i, rec_path,
                        st.oom ? "ran out of memory" : st.result ? "returned a pointer" : "returned no pointer");
    } else if (alloc && st.result && k < 6 &&
               (stream_uses ? st.stats[k] - requested > static_cast<std::int64_t>(a->size)
                            : st.stats[k] - requested != static_cast<std::int64_t>(a->size))) {
      why = fmt::format("op {} of {} allocates {} bytes, but at step {} of {} requested_bytes.all.current grew by {}",
                        i, ops_path, a->size, i, rec_path, st.stats[k] - requested);
    }
    if (k < 6) requested = st.stats[k];
    if (why.empty()) continue;
    if (bad++ == 0) first = why;
  }
  if (bad == 0) return "";
  return fmt::format("the op list and the recording do not belong together: {} ({} of {} ops disagree with their "
                     "steps); pass the op list the recording was made from (results/res_<regime>_<config> pairs "
                     "with ops/ops_<regime>)",
                     first, bad, ops.size());
}

struct Options {
  std::vector<std::string> files;
  std::string ops;
  std::string engine;  // "": model (--policy pytorch), both (--policy cachet)
  std::string policy = "pytorch";
  std::size_t max_printed = 20;
};

// --policy cachet (conform_cachet.h): policy:cachet's waste on the recording; exit 1 when its two
// implementations disagree or an invariant breaks.
int run_cachet(const io::Recording& rec, const std::vector<ops::Op>& ops, const std::string& ops_path,
               const std::string& result_path, const std::string& engine, std::size_t max_printed) {
  std::vector<std::string> engines;  // policy:cachet's engines: its model, the production allocator
  if (engine == "model" || engine == "both" || engine.empty()) engines.push_back("cachet-model");
  if (engine == "impl" || engine == "both" || engine.empty()) engines.push_back("impl");
  if (engines.empty()) {
    std::fprintf(stderr, "cachet conform: --engine must be model, impl or both (got \"%s\")\n", engine.c_str());
    return kExitBadInput;
  }
  if (ops.size() != rec.steps.size()) {
    std::fprintf(stderr, "cachet conform: %s has %zu ops but %s has %zu steps; pass the right --ops FILE\n",
                 ops_path.c_str(), ops.size(), result_path.c_str(), rec.steps.size());
    return kExitBadInput;
  }
  if (const std::string why = pairing_problem(ops, rec, ops_path, result_path); !why.empty()) {
    std::fprintf(stderr, "cachet conform: %s\n", why.c_str());
    return kExitBadInput;
  }
  try {
    const CachetWaste w = conform_cachet(rec, ops, engines, max_printed);
    if (!rec.conf.empty())
      std::printf("(the recording's conf \"%s\" is PyTorch's; policy:cachet has none of its knobs, only the cap)\n",
                  rec.conf.c_str());
    print_cachet_waste(result_path, w);
    return w.problem_count == 0 ? kExitOk : kExitCheckFailed;
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "cachet conform: %s\n", e.what());
    return kExitBadInput;
  }
}

int run(const Options& o) {
#if defined(CACHET_RULE_FLIPS) && CACHET_RULE_FLIPS
  // cachet-flips (tools/CMakeLists.txt): say which rule flip applies, refuse an unknown one.
  try {
    if (const RuleFlip flip = active_rule_flip(); flip != RuleFlip::None)
      for (const RuleFlipInfo& f : rule_flips())
        if (f.flip == flip)
          std::printf("rule flip %s (docs/pytorch-allocator.md §%s): %s\n", std::string(f.name).c_str(),
                      std::string(f.section).c_str(), std::string(f.what).c_str());
  } catch (const UsageError& e) {
    std::fprintf(stderr, "cachet conform: %s\n", e.what());
    return kExitBadInput;
  }
#endif
  std::string ops_path;
  std::string result_path;
  if (o.files.size() == 2) {
    ops_path = o.files[0];
    result_path = o.files[1];
  } else if (o.files.size() == 1) {
    result_path = o.files[0];
  } else {
    std::fprintf(stderr, "cachet conform: %zu files given; expected OPS RESULT, or RESULT alone\n", o.files.size());
    return kExitBadInput;
  }
  if (!o.ops.empty() && !ops_path.empty() && o.ops != ops_path) {
    std::fprintf(stderr, "cachet conform: the op list is given twice, as OPS (%s) and as --ops (%s): give it once\n",
                 ops_path.c_str(), o.ops.c_str());
    return kExitBadInput;
  }
  if (!o.ops.empty()) ops_path = o.ops;
  if (o.policy != "pytorch" && o.policy != "cachet") {
    std::fprintf(stderr, "cachet conform: --policy must be pytorch or cachet (got \"%s\")\n", o.policy.c_str());
    return kExitBadInput;
  }

  std::vector<std::string> names;
  if (o.engine.empty() || o.engine == "model" || o.engine == "impl") {
    names.push_back(o.engine.empty() ? "model" : o.engine);
  } else if (o.engine == "both") {
    names = {"model", "impl"};
  } else {
    std::fprintf(stderr, "cachet conform: --engine must be model, impl or both (got \"%s\")\n", o.engine.c_str());
    return kExitBadInput;
  }
  std::vector<const EngineFactory*> factories;
  for (const std::string& n : names) {
    const EngineFactory* f = find_engine(n);
    if (f == nullptr) {
      std::fprintf(stderr,
                   "cachet conform: engine \"%s\" is not built into this cachet (the production "
                   "allocator's replay adapter, tools/engine_gpu.cpp, was not part of the build); "
                   "use --engine model\n",
                   n.c_str());
      return kExitBadInput;
    }
    factories.push_back(f);
  }

  io::Recording rec;
  std::vector<ops::Op> ops;
  Config config;
  try {
    rec = io::read_recording(result_path);
    if (ops_path.empty()) ops_path = io::ops_path_for(result_path);
    ops = io::read_ops(ops_path);
  } catch (const io::ReadError& e) {
    std::fprintf(stderr, "cachet conform: %s\n", e.what());
    return kExitBadInput;
  }
  if (o.policy == "cachet") return run_cachet(rec, ops, ops_path, result_path, o.engine, o.max_printed);
  if (ops.size() != rec.steps.size()) {
    std::fprintf(stderr,
                 "cachet conform: %s has %zu ops but %s has %zu steps; they do not belong together "
                 "(pass the right --ops FILE)\n",
                 ops_path.c_str(), ops.size(), result_path.c_str(), rec.steps.size());
    return kExitBadInput;
  }
  if (const std::string why = pairing_problem(ops, rec, ops_path, result_path); !why.empty()) {
    std::fprintf(stderr, "cachet conform: %s\n", why.c_str());
    return kExitBadInput;
  }
  try {
    config = parse_config(rec.conf, ConfigSource::PyTorch).config;
  } catch (const ConfigError& e) {
    std::fprintf(stderr, "cachet conform: %s: conf \"%s\": %s\n", result_path.c_str(), rec.conf.c_str(), e.what());
    return kExitBadInput;
  }
  if (config.backend != Backend::Native) {
    std::fprintf(stderr,
                 "cachet conform: %s: conf \"%s\" selects backend:cudaMallocAsync; only the native "
                 "caching allocator is modelled\n",
                 result_path.c_str(), rec.conf.c_str());
    return kExitBadInput;
  }
  if (rec.cap > rec.total_memory) {
    std::fprintf(stderr, "cachet conform: %s: cap %llu exceeds total_memory %llu\n", result_path.c_str(),
                 static_cast<unsigned long long>(rec.cap), static_cast<unsigned long long>(rec.total_memory));
    return kExitBadInput;
  }

  ConformReport report;
  report.max_printed = o.max_printed;
  std::size_t ran = 0;
  for (std::size_t k = 0; k < names.size(); ++k) {
    try {
      ran = std::max(ran, conform_one(names[k], *factories[k], rec, ops, config, report));
    } catch (const std::invalid_argument& e) {
      std::fprintf(stderr, "cachet conform: %s\n", e.what());
      return kExitBadInput;
    }
  }
  std::printf("conform: %zu ops, %zu mismatches\n", ops.size(), report.mismatches);
  return report.mismatches == 0 ? kExitOk : kExitCheckFailed;
}

Runner setup(CLI::App& sub) {
  auto o = std::make_shared<Options>();
  // Named FILE with no upper count (CLI11 2.1 writes a 1-to-2 positional as "files(1x)" in the
  // usage line); more than two is refused in run_conform.
  sub.add_option("FILE", o->files, "OPS RESULT, or RESULT alone (ops found in ../ops/ beside it)")
      ->type_name("[OPS] RESULT")
      ->required()
      ->expected(1, CLI::detail::expected_max_vector_size);
  sub.add_option("--ops", o->ops, "the op list (ops_<regime>.json[.gz]) to replay");
  sub.add_option("--engine", o->engine,
                 "model (default), impl (the production allocator) or both; with --policy cachet: policy:cachet's "
                 "model, the production allocator, or both (default)");
  sub.add_option("--policy", o->policy,
                 "pytorch (default: compare with the recording) or cachet (policy:cachet's model and production "
                 "allocator side by side, invariants after every op; prints its waste against PyTorch's figures)");
  sub.add_option("--max-report", o->max_printed, "mismatches printed in detail (default 20)")
      ->check(CLI::Validator(
          [](std::string& v) { return v.starts_with('-') ? "a count, 0 or more, not " + v : std::string(); }, "COUNT"));
  return [o] { return run(*o); };
}

const bool registered = register_command(
    {"conform", "Replay an oracle recording and compare with what PyTorch did", setup});

}  // namespace
}  // namespace cachet::cli

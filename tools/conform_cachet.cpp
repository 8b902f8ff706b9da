// `cachet conform RESULT --policy cachet` (conform_cachet.h): policy:cachet's waste on a
// recording, through its reference model and the production allocator side by side.
#include "conform_cachet.h"

#include <fmt/format.h>

#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>

#include "cachet/errors.h"
#include "cachet/model/cachet_policy.h"
#include "cachet/model/segment_source.h"
#include "engine.h"
#include "pool_front_end.h"

namespace cachet::cli {
namespace {

// ---- the "cachet-model" engine: model::CachetPolicy on synthetic addresses ----

class CachetModelEngine final : public ReplayEngine {
 public:
  explicit CachetModelEngine(const EngineSetup& s) : source_(s.total_memory), policy_(s.config, source_) {
    policy_.set_events_complete_when_recorded(true);  // engine.h
    if (s.cap > 0) policy_.set_memory_fraction(static_cast<double>(s.cap) / static_cast<double>(s.total_memory));
  }
  std::uint64_t malloc(Bytes size, StreamId stream, ThreadIndex thread) override {
    return checked([&] { return policy_.malloc(size, stream, thread); });
  }
  void record_stream(std::uint64_t ptr, StreamId stream) override {
    checked([&] { return policy_.record_stream(ptr, stream), 0; });
  }
  void free(std::uint64_t ptr) override { checked([&] { return policy_.free(ptr), 0; }); }
  void empty_cache() override { checked([&] { return policy_.empty_cache(), 0; }); }
  DeviceStats stats() const override { return policy_.stats(); }
  Snapshot snapshot() const override { return policy_.snapshot(); }
  std::vector<TraceEvent> trace() const override { return policy_.trace(); }
  void create_or_incref_pool(PoolId id) override { checked([&] { return policy_.create_or_incref_pool(id), 0; }); }
  void begin_allocate_to_pool(PoolId id, PoolRoute r) override {
    checked([&] { return policy_.begin_allocate_to_pool(id, r), 0; });
  }
  void end_allocate_to_pool(PoolId id) override { checked([&] { return policy_.end_allocate_to_pool(id), 0; }); }
  void release_pool(PoolId id) override { checked([&] { return policy_.release_pool(id), 0; }); }
  void empty_cache_of(PoolId id) override { checked([&] { return policy_.empty_cache(id), 0; }); }
  int pool_use_count(PoolId id) const override { return policy_.pool_use_count(id); }

 private:
  // The model's invariants after every op, as the production allocator's validate mode; an
  // OutOfMemory leaves a state that must be valid too.
  template <class F>
  auto checked(F&& f) -> decltype(f()) {
    try {
      auto r = f();
      policy_.check_invariants();
      return r;
    } catch (const OutOfMemory&) {
      policy_.check_invariants();
      throw;
    }
  }
  model::SyntheticSegmentSource source_;
  model::CachetPolicy policy_;
};

const bool cachet_model_registered = register_engine(
    "cachet-model", [](const EngineSetup& s) { return std::make_unique<CachetModelEngine>(s); });

// One engine's replay state.
struct Run {
  std::string name;
  std::unique_ptr<ReplayEngine> engine;
  std::unique_ptr<PoolFrontEnd> pools;
  std::map<std::uint64_t, std::uint64_t> pointers;  // op id -> pointer
  bool failed = false;
};

// The outcome of one op on one engine, compared across engines.
struct Outcome {
  bool oom = false;
  std::string error;
  std::int64_t allocated = 0, reserved = 0, active = 0, requested = 0;
  bool operator==(const Outcome&) const = default;
};

std::string show(const Outcome& o) {
  if (!o.error.empty()) return "error: " + o.error;
  return fmt::format("{}allocated {} reserved {} active {} requested {}", o.oom ? "OOM, " : "", o.allocated,
                     o.reserved, o.active, o.requested);
}

Outcome apply(Run& r, const ops::Op& op, const std::vector<StreamId>& streams, std::size_t i) {
  Outcome out;
  try {
    if (const auto* a = std::get_if<ops::Allocate>(&op)) {
      if (a->stream >= streams.size())
        throw std::invalid_argument(
            fmt::format("op {}: stream index {} but the recording has {} streams", i, a->stream, streams.size()));
      try {
        r.pointers[a->id.value()] = r.engine->malloc(a->size, streams[a->stream], a->thread);
      } catch (const OutOfMemory&) {
        out.oom = true;
      }
    } else if (const auto* f = std::get_if<ops::Free>(&op)) {
      // An allocation that ran out of memory here has nothing to free.
      if (auto it = r.pointers.find(f->handle); it != r.pointers.end()) {
        r.engine->free(it->second);
        r.pointers.erase(it);
      }
    } else if (const auto* rs = std::get_if<ops::RecordStream>(&op)) {
      if (rs->stream >= streams.size())
        throw std::invalid_argument(
            fmt::format("op {}: stream index {} but the recording has {} streams", i, rs->stream, streams.size()));
      if (auto it = r.pointers.find(rs->handle); it != r.pointers.end())
        r.engine->record_stream(it->second, streams[rs->stream]);
    } else if (std::holds_alternative<ops::EmptyCache>(op)) {
      r.engine->empty_cache();
    } else if (ops::is_pool_op(op)) {
      r.pools->apply(op);
    } else {
      throw std::invalid_argument(fmt::format("op {} ({}): not an op of a recording", i, ops::show(op)));
    }
  } catch (const std::invalid_argument&) {
    throw;
  } catch (const std::exception& e) {  // UsageError, an invariant broken, a device refusal
    out.error = e.what();
    r.failed = true;
    return out;
  }
  const DeviceStats s = r.engine->stats();
  out.allocated = s.allocated_bytes[0].current;
  out.reserved = s.reserved_bytes[0].current;
  out.active = s.active_bytes[0].current;
  out.requested = s.requested_bytes[0].current;
  return out;
}

}  // namespace

CachetWaste conform_cachet(const io::Recording& rec, const std::vector<ops::Op>& ops,
                           const std::vector<std::string>& engines, std::size_t max_problems) {
  // policy:cachet has none of PyTorch's knobs: the recording's conf does not apply, its cap does.
  CachetWaste w;
  EngineSetup setup;
  setup.config.policy = Policy::Cachet;
  setup.config.validate = true;  // the production allocator's invariants after every op
  setup.total_memory = rec.total_memory;
  setup.cap = rec.cap;  // device_events stay empty: synthetic addresses
  std::vector<Run> runs;
  for (const std::string& name : engines) {
    const EngineFactory* f = find_engine(name);
    if (f == nullptr)
      throw std::invalid_argument("engine \"" + name + "\" is not built into this cachet (the production "
                                  "allocator's replay adapter, tools/engine_gpu.cpp, was not part of the build)");
    Run r;
    r.name = name;
    r.engine = (*f)(setup);
    r.pools = std::make_unique<PoolFrontEnd>(*r.engine, rec.streams);
    runs.push_back(std::move(r));
    w.engines.push_back(name);
  }
  auto problem = [&](std::string what) {
    ++w.problem_count;
    if (w.problems.size() < max_problems) w.problems.push_back(std::move(what));
  };
  for (std::size_t i = 0; i < ops.size(); ++i) {
    std::vector<Outcome> got;
    for (Run& r : runs) {
      got.push_back(apply(r, ops[i], rec.streams, i));
      if (!got.back().error.empty()) problem(fmt::format("op {} ({}) on {}: {}", i, ops::show(ops[i]), r.name, got.back().error));
    }
    if (got.size() == runs.size() && runs.size() == 2 && !(got[0] == got[1]))
      problem(fmt::format("op {} ({}): {} {} but {} {}", i, ops::show(ops[i]), runs[0].name, show(got[0]), runs[1].name,
                          show(got[1])));
    ++w.ops;
    bool failed = false;
    for (const Run& r : runs) failed = failed || r.failed;
    if (failed) break;  // an engine failed: stop (reported above)
  }
  if (!runs.empty()) {
    const DeviceStats s = runs[0].engine->stats();
    w.peak_requested = s.requested_bytes[0].peak;
    w.peak_reserved = s.reserved_bytes[0].peak;
    w.end_reserved = s.reserved_bytes[0].current;
    w.ooms = s.num_ooms;
  }
  auto recorded_stat = [&](const char* key) {
    auto it = rec.final_stats.find(key);
    return it == rec.final_stats.end() ? std::int64_t{0} : it->second;
  };
  w.pytorch_peak_reserved = recorded_stat("reserved_bytes.all.peak");
  w.pytorch_end_reserved = recorded_stat("reserved_bytes.all.current");
  w.pytorch_peak_requested = recorded_stat("requested_bytes.all.peak");
  w.pytorch_ooms = recorded_stat("num_ooms");
  return w;
}

void print_cachet_waste(const std::string& name, const CachetWaste& w) {
  auto ratio = [](std::int64_t a, std::int64_t b) { return b > 0 ? fmt::format("{:.4f}", double(a) / double(b)) : "-"; };
  std::string engines;
  for (const auto& e : w.engines) engines += (engines.empty() ? "" : " and ") + e;
  std::printf("%s: policy:cachet, %zu ops through %s (invariants after every op)\n", name.c_str(), w.ops,
              engines.c_str());
  std::printf("  peak requested: policy:cachet %lld B, PyTorch %lld B\n", static_cast<long long>(w.peak_requested),
              static_cast<long long>(w.pytorch_peak_requested));
  std::printf("  peak reserved: policy:cachet %lld B (%s x peak requested), PyTorch %lld B (%s)\n",
              static_cast<long long>(w.peak_reserved), ratio(w.peak_reserved, w.peak_requested).c_str(),
              static_cast<long long>(w.pytorch_peak_reserved),
              ratio(w.pytorch_peak_reserved, w.pytorch_peak_requested).c_str());
  std::printf("  reserved at end: policy:cachet %lld B, PyTorch %lld B\n", static_cast<long long>(w.end_reserved),
              static_cast<long long>(w.pytorch_end_reserved));
  std::printf("  OOMs: policy:cachet %lld, PyTorch %lld\n", static_cast<long long>(w.ooms),
              static_cast<long long>(w.pytorch_ooms));
  for (const auto& p : w.problems) std::printf("  problem: %s\n", p.c_str());
  std::printf("conform --policy cachet: %zu ops, %zu problems\n", w.ops, w.problem_count);
}

}  // namespace cachet::cli

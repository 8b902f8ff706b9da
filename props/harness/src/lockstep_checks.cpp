// The lockstep runner's checks after each op (lockstep_state.h, cachet/lockstep.h): compare()
// runs them in order, the first that fails making the report: the result, the device calls, the
// op's trace events, the stats (and sleep stats), both sides' invariants, the snapshots and the
// pools' use counts. end_case() is the check of a refusal where PyTorch fails (§14.8).
#include <algorithm>
#include <optional>
#include <stdexcept>
#include <cstdint>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "cachet/errors.h"
#include "cachet/snapshot.h"
#include "cachet/snapshot_digest.h"
#include "cachet/stats.h"
#include "cachet/trace.h"
#include "lockstep_state.h"

namespace cachet::lockstep {

namespace {
// The keys whose values differ, "key: model vs key: sut" a line (both lists sorted by key).
void report_keys(std::ostringstream& r, const std::vector<std::pair<std::string, std::int64_t>>& m,
                 const std::vector<std::pair<std::string, std::int64_t>>& s) {
  for (std::size_t i = 0; i < m.size() && i < s.size(); ++i)
    if (m[i] != s[i])
      r << "  " << m[i].first << ": " << m[i].second << " vs " << s[i].first << ": " << s[i].second << "\n";
}
}  // namespace

template <class Model, class Impl>
std::optional<std::string> Lockstep<Model, Impl>::State::end_case(const SutState& before) {
  ended = true;
  std::ostringstream r;
  const bool refused = last_sut.kind == Outcome::Kind::UsageError ||
                       (last_sut.kind == Outcome::Kind::DeviceError && sim == nullptr);
  if (!refused || last_sut.message.find("§14.8") == std::string::npos) {
    r << "result differs (PyTorch 2.11 fails here: the sut must refuse with a UsageError naming §14.8)\n  model: "
      << show(last_model) << "\n  sut:   " << show(last_sut) << "\n";
    return r.str();
  }
  const SutState after = sut_state(*sut);
  // Before it refuses, a malloc during a capture may complete the frees the capture had already
  // made safe (graph_capture_record_stream_reuse, docs/pytorch-allocator.md §14.10.1), as
  // PyTorch does before it fails. When the sut's trace of the op holds free_completed events
  // and nothing else (but snapshot events of the checks' snapshots), its stats and
  // snapshot are not compared with those before the op (what the frees changed is not
  // recomputed here); its invariants still are.
  const bool only_safe_frees = opts.compare_trace && [&] {
    const std::vector<TraceEvent> t = sut->trace();
    const auto frees = std::count_if(t.begin(), t.end(), [](const TraceEvent& e) { return e.action == TraceAction::FreeCompleted; });
    const auto snaps = std::count_if(t.begin(), t.end(), [](const TraceEvent& e) { return e.action == TraceAction::Snapshot; });
    return frees > 0 && frees + snaps == static_cast<std::ptrdiff_t>(t.size());
  }();
  if (after.stats != before.stats && !only_safe_frees) r << "the sut refused (§14.8) but its stats changed\n";
  else if (after.snapshot_digest != before.snapshot_digest && !only_safe_frees)
    r << "the sut refused (§14.8) but its snapshot changed\n";
  else if (opts.check_invariants)
    for (const auto& v : sut_violations())
      r << (r.str().empty() ? "sut invariants() violated after a §14.8 refusal\n" : "") << "  " << v << "\n";
  if (r.str().empty()) return std::nullopt;
  r << "  model: " << show(last_model) << "\n  sut:   " << show(last_sut) << "\n";
  return r.str();
}

template <class Model, class Impl>
std::vector<std::string> Lockstep<Model, Impl>::State::sut_violations() {
  auto bad = sut->invariants();
  const Bytes reserved = static_cast<Bytes>(sut->stats().reserved_bytes[0].current);
  const auto c = cap();
  if (!c || reserved <= *c) over_cap_ceiling = 0;
  // [INV-SLEEP-5] is INV-CAP-1 with sleeping bytes left out (docs/sleep-wake.md section 7): the same.
  std::erase_if(bad, [&](const std::string& v) {
    return (v.find("[INV-CAP-1]") != std::string::npos || v.find("[INV-SLEEP-5]") != std::string::npos) &&
           reserved <= over_cap_ceiling;
  });
  return bad;
}

template <class Model, class Impl>
std::optional<std::string> Lockstep<Model, Impl>::State::compare_use_counts() {
  if constexpr (kPools) {
    // Unknown: has_pool() says so, without pool_use_count's refusal (an exception) for every pool
    // gone; on the full-check ops (compare()), has_pool() is checked against that refusal too.
    auto refused = [](const auto& a, PoolId id) {
      try {
        a.pool_use_count(id);
        return false;
      } catch (const UsageError&) {
        return true;
      }
    };
    auto count = [&](const auto& a, PoolId id, const char* side) -> std::optional<int> {
      const bool known = a.has_pool(id);
      if (full_check && known == refused(a, id))
        throw std::logic_error(std::string("the ") + side + "'s has_pool(" + show_pool(id) + ") says " +
                               (known ? "known" : "unknown") + ", its pool_use_count " + (known ? "refuses" : "answers"));
      if (!known) return std::nullopt;
      return a.pool_use_count(id);
    };
    try {
      for (const PoolId id : pools.ids_used()) {
        const auto mc = count(*model, id, "model"), sc = count(*sut, id, "sut");
        if (mc != sc)
          return "pool use counts differ\n  pool " + show_pool(id) + ": model " +
                 (mc ? std::to_string(*mc) : "unknown") + ", sut " + (sc ? std::to_string(*sc) : "unknown") + "\n";
      }
    } catch (const std::logic_error& e) {
      return std::string("pool use counts: ") + e.what() + "\n";
    }
  }
  return std::nullopt;
}

template <class Model, class Impl>
std::optional<std::string> Lockstep<Model, Impl>::State::compare_trace() {
  const auto& all = model->trace();
  std::vector<TraceEvent> mt(all.begin() + static_cast<std::ptrdiff_t>(model_trace_mark), all.end());
  std::vector<TraceEvent> st = sut->trace();
  // The snapshots the checks take (memory_snapshot() records one) are not the op's events.
  for (auto* side : {&mt, &st})
    std::erase_if(*side, [](const TraceEvent& t) { return t.action == TraceAction::Snapshot; });
  // policy:cachet's rules (R7, R9: wait for every pending event) do not order the blocks that
  // one wait frees: each run of consecutive free_completed events is compared in address order.
  // policy:pytorch's order is PyTorch's (per stream, in event order): compared as it is.
  if constexpr (kPolicy == Policy::Cachet)
    for (auto* side : {&mt, &st})
      for (auto b = side->begin(); b != side->end();) {
        auto e = std::find_if(b, side->end(), [](const TraceEvent& t) { return t.action != TraceAction::FreeCompleted; });
        std::sort(b, e, [](const TraceEvent& x, const TraceEvent& y) { return x.addr < y.addr; });
        b = e == side->end() ? e : e + 1;
      }
  std::size_t i = 0;
  while (i < mt.size() && i < st.size() && same_event(mt[i], st[i])) ++i;
  if (i == mt.size() && i == st.size()) return std::nullopt;
  std::ostringstream r;
  r << "trace events differ at event #" << i << " of this op (model " << mt.size() << " events, sut " << st.size()
    << ")\n  model: " << (i < mt.size() ? show_event(mt[i]) : "(no more events)")
    << "\n  sut:   " << (i < st.size() ? show_event(st[i]) : "(no more events)") << "\n";
  for (const auto* side : {&mt, &st}) {
    r << (side == &mt ? "  the model's events:\n" : "  the sut's events:\n");
    for (std::size_t k = 0; k < side->size(); ++k) r << "    #" << k << " " << show_event((*side)[k]) << "\n";
  }
  return r.str();
}

template <class Model, class Impl>
std::optional<std::string> Lockstep<Model, Impl>::State::compare_snapshots() {
  // policy:pytorch: by digest after every op (cachet/snapshot_digest.h: each side walks its own
  // blocks); built and compared in full on the full-check ops (the first op and every
  // kFullCheckEvery-th after it) and whenever the digests differ, each side's digest then checked
  // against its snapshot's. policy:cachet: in full after every op, the sut's digest checked too.
  const bool full = kPolicy == Policy::Cachet || full_check;
  std::uint64_t model_digest = 0;
  if constexpr (kPolicy == Policy::PyTorch) {
    model_digest = model->snapshot_digest();
    if (!full && model_digest == sut_before.snapshot_digest) return std::nullopt;
  }
  Snapshot ms = model->snapshot();
  Snapshot ss = sut->snapshot();
  const std::uint64_t sut_digest = digest(ss);  // before any masking
  // policy:cachet's rules do not decide what a free block's requested size reads (gpu/ leaves the
  // last caller's, the model 0): compared for live blocks only. policy:pytorch keeps PyTorch's
  // stale value, which the model reproduces: compared for every block.
  if constexpr (kPolicy == Policy::Cachet)
    for (Snapshot* snap : {&ms, &ss})
      for (auto& seg : *snap)
        for (auto& b : seg.blocks)
          if (b.state == BlockState::Inactive) b.requested_size = 0;
  if (ms != ss) {
    std::ostringstream r;
    r << "snapshots differ\n";
    std::size_t i = 0;
    for (; i < ms.size() && i < ss.size(); ++i)
      if (ms[i] != ss[i]) {
        r << "  model: " << show_segment(ms[i]) << "\n  sut:   " << show_segment(ss[i]) << "\n";
        break;
      }
    if (ms.size() != ss.size()) r << "  model has " << ms.size() << " segments, sut " << ss.size() << "\n";
    return r.str();
  }
  // Each digest against its side's snapshot (the model's: policy:pytorch; it has none under
  // policy:cachet, whose sut digest only the §14.8 checks use).
  std::string wrong;
  if constexpr (kPolicy == Policy::PyTorch)
    if (digest(ms) != model_digest)
      wrong += "  the model's: snapshot_digest() " + hex(model_digest) + ", digest(snapshot()) " + hex(digest(ms)) + "\n";
  if (sut_digest != sut_before.snapshot_digest)
    wrong += "  the sut's: snapshot_digest() " + hex(sut_before.snapshot_digest) + ", digest(snapshot()) " + hex(sut_digest) + "\n";
  if (!wrong.empty()) return "snapshots equal but a snapshot digest is not its snapshot's\n" + wrong;
  checked_snapshot = std::move(ss);
  checked_snapshot_op = ops_applied;
  return std::nullopt;
}

template <class Model, class Impl>
std::optional<std::string> Lockstep<Model, Impl>::State::compare() {
  full_check = checks++ % kFullCheckEvery == 0;
  // The report's stream, made only when a check fails (an ostringstream costs a locale).
  std::optional<std::ostringstream> report;
  auto r = [&]() -> std::ostringstream& { return report ? *report : report.emplace(); };
  // Usage and device errors: the same kind (the wording is each implementation's own);
  // out-of-memory: PyTorch's exact text.
  const bool same = last_sut.kind == last_model.kind && last_sut.ptr == last_model.ptr &&
                    (last_sut.kind == Outcome::Kind::UsageError || last_sut.kind == Outcome::Kind::DeviceError ||
                     same_text(last_sut, last_model));
  if (!same) {
    r() << "result differs\n  model: " << show(last_model) << "\n  sut:   " << show(last_sut) << "\n";
    return r().str();
  }
  if (!log.notes.empty()) {
    r() << "device calls differ\n";
    for (const auto& n : log.notes) r() << "  " << n << "\n";
    return r().str();
  }
  for (auto* q : {&log.malloc, &log.reserve, &log.map})
    for (const DeviceCall& c : *q)
      r() << "  the sut called " << (c.kind == DeviceCall::Kind::Malloc ? "cudaMalloc" : c.kind == DeviceCall::Kind::Reserve ? "reserve" : "map")
        << "(" << c.size << ") at " << hex(c.addr) << ", the model did not\n";
  if (report) return "device calls differ\n" + report->str();
  if (opts.compare_trace) {
    if (auto d = compare_trace()) return d;
  }
  // The sut's state now: compared here, and the state a §14.8 refusal of the next op must keep.
  sut_before = sut_state(*sut);
  if (opts.compare_stats) {
    // Compared as the accounting records' numbers (DeviceStats, SleepStats); flattened to their
    // keys only to report a difference. flatten() names every field once (the 122 keys, the 21
    // sleep keys), so two records are equal exactly when their keys are.
    const DeviceStats ms = model->stats();
    if (ms != sut_before.stats) {
      r() << "stats differ (key: model vs sut)\n";
      report_keys(r(), flatten(ms), flatten(sut_before.stats));
      return r().str();
    }
    // The 21 sleep.* keys beside them (docs/sleep-wake.md section 5), where both sides sleep.
    if constexpr (HasSleep<Model> && HasSleep<Impl>) {
      if (opts.config.sleep) {
        const SleepStats msl = model->sleep_stats();
        const SleepStats ssl = sut->sleep_stats();
        if (msl != ssl) {
          r() << "sleep stats differ (key: model vs sut)\n";
          report_keys(r(), flatten(msl), flatten(ssl));
          return r().str();
        }
      }
    }
  }
  if (opts.check_invariants) {
    const auto bad = sut_violations();
    if (!bad.empty()) {
      r() << "sut invariants() violated\n";
      for (const auto& b : bad) r() << "  " << b << "\n";
      return r().str();
    }
    try {
      model->check_invariants();
    } catch (const std::exception& e) {
      r() << "model invariants violated\n  " << e.what() << "\n";
      return r().str();
    }
  }
  if (opts.compare_snapshots) {
    if (auto d = compare_snapshots()) return d;
  }
  return compare_use_counts();
}

template std::optional<std::string> Lockstep<model::Allocator, CachingAllocator>::State::end_case(const SutState& before);
template std::vector<std::string> Lockstep<model::Allocator, CachingAllocator>::State::sut_violations();
template std::optional<std::string> Lockstep<model::Allocator, CachingAllocator>::State::compare_use_counts();
template std::optional<std::string> Lockstep<model::Allocator, CachingAllocator>::State::compare_trace();
template std::optional<std::string> Lockstep<model::Allocator, CachingAllocator>::State::compare_snapshots();
template std::optional<std::string> Lockstep<model::Allocator, CachingAllocator>::State::compare();
template std::optional<std::string> Lockstep<model::CachetPolicy, CachingAllocator>::State::end_case(const SutState& before);
template std::vector<std::string> Lockstep<model::CachetPolicy, CachingAllocator>::State::sut_violations();
template std::optional<std::string> Lockstep<model::CachetPolicy, CachingAllocator>::State::compare_use_counts();
template std::optional<std::string> Lockstep<model::CachetPolicy, CachingAllocator>::State::compare_trace();
template std::optional<std::string> Lockstep<model::CachetPolicy, CachingAllocator>::State::compare_snapshots();
template std::optional<std::string> Lockstep<model::CachetPolicy, CachingAllocator>::State::compare();

}  // namespace cachet::lockstep

// tune: replay a prepared trace under many configurations on worker threads, rank them (fewest
// out-of-memory errors, then peak reserved, then device calls), and find the memory a
// configuration needs. See cachet/replay/tune.h.
#include "cachet/replay/tune.h"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <thread>

#include <fmt/format.h>

#include "cachet/errors.h"

namespace cachet::replay {

std::vector<TuneCandidate> tune_space(const Config& base, bool with_cap) {
  std::vector<std::string> texts;
  const int msplits[] = {0, 64, 128, 256, 512, 1024};
  const int divs[] = {0, 2, 4, 8};
  const int lss[] = {20, 64};
  for (int l : lss)
    for (int m : msplits)
      for (int d : divs) {
        std::string s = "expandable_segments:False";
        if (m) s += fmt::format(",max_split_size_mb:{}", m);
        if (d) s += fmt::format(",roundup_power2_divisions:{}", d);
        s += fmt::format(",large_segment_size_mb:{}", l);
        texts.push_back(s);
      }
  for (int l : lss)
    for (int d : divs) {
      std::string s = "expandable_segments:True";
      if (d) s += fmt::format(",roundup_power2_divisions:{}", d);
      s += fmt::format(",large_segment_size_mb:{}", l);
      texts.push_back(s);
    }
  if (with_cap)
    for (const char* g : {"0.6", "0.8"})
      for (int m : {0, 128, 512}) {
        std::string s = fmt::format("expandable_segments:False,garbage_collection_threshold:{}", g);
        if (m) s += fmt::format(",max_split_size_mb:{}", m);
        texts.push_back(s);
      }
  std::vector<TuneCandidate> out;
  for (const auto& s : texts) {
    try {
      Config c = parse_config(s, ConfigSource::PyTorch, base).config;
      out.push_back({to_string(c), c});
    } catch (const ConfigError&) {
      // a key this build does not know: leave the candidate out
    }
  }
  // The cachet policy (policy:cachet, CACHET_ALLOC_CONF only), once: it has no segments, no
  // split limit and no rounding beyond 512 B, so the PyTorch policy's keys (expandable_segments,
  // max_split_size_mb, roundup_power2_divisions, large_segment_size_mb,
  // max_non_split_rounding_mb, garbage_collection_threshold) are left out, not crossed with it.
  {
    Config c = base;
    const Config d{};
    c.max_split_size = d.max_split_size;
    c.max_non_split_rounding = d.max_non_split_rounding;
    c.large_segment_size = d.large_segment_size;
    c.roundup_power2_divisions = d.roundup_power2_divisions;
    c.garbage_collection_threshold = d.garbage_collection_threshold;
    c.expandable_segments = d.expandable_segments;
    c.policy = Policy::Cachet;
    out.push_back({to_string(c), c});
  }
  // Drop duplicates (a base that already sets a key may make two strings equal).
  std::vector<TuneCandidate> unique;
  for (auto& c : out)
    if (std::none_of(unique.begin(), unique.end(), [&](const TuneCandidate& u) { return u.config == c.config; }))
      unique.push_back(std::move(c));
  return unique;
}

bool pytorch_accepts(const Config& c) {
  try {
    return parse_config(to_string(c), ConfigSource::PyTorch).config == c;
  } catch (const ConfigError&) {
    return false;
  }
}

std::int64_t device_calls(const ReplayResult& r) { return r.stats.num_device_alloc + r.stats.num_device_free; }

bool ranks_before(const ReplayResult& a, const ReplayResult& b) {
  if (a.pytorch_failures != b.pytorch_failures) return a.pytorch_failures < b.pytorch_failures;
  if (a.stats.num_ooms != b.stats.num_ooms) return a.stats.num_ooms < b.stats.num_ooms;
  if (a.peak_reserved() != b.peak_reserved()) return a.peak_reserved() < b.peak_reserved();
  return device_calls(a) < device_calls(b);
}

namespace {

void rank(TuneResult& tr) {
  tr.ranking.resize(tr.results.size());
  for (std::size_t i = 0; i < tr.ranking.size(); ++i) tr.ranking[i] = i;
  std::stable_sort(tr.ranking.begin(), tr.ranking.end(), [&](std::size_t x, std::size_t y) {
    const ReplayResult& rx = tr.results[x];
    const ReplayResult& ry = tr.results[y];
    if (ranks_before(rx, ry)) return true;
    if (ranks_before(ry, rx)) return false;
    return rx.conf.size() < ry.conf.size();
  });
  tr.best = tr.best_native = kRecorded;
  for (std::size_t i : tr.ranking) {
    if (!ranks_before(tr.results[i], tr.baseline)) break;  // the recorded one is as good: keep it
    if (tr.best == kRecorded) tr.best = i;
    if (pytorch_accepts(tr.results[i].config)) {
      tr.best_native = i;
      break;
    }
  }
}

}  // namespace

TuneResult tune(const Trace& t, const Config& recorded, const std::vector<TuneCandidate>& space,
                const ReplayOptions& opts, unsigned threads,
                const std::function<void(std::size_t, std::size_t)>& progress) {
  TuneResult tr;
  ReplayOptions o = opts;
  o.observer = nullptr;
  o.keep_allocator = false;
  // The recorded configuration (and a candidate equal to it) with the trace's own addresses, as
  // `cachet replay` does: one figure for it everywhere (synthetic addresses change best-fit
  // ties); it falls back to synthetic addresses, with a note, where the addresses do not hold.
  ReplayOptions ob = o;
  if (opts.baseline_recorded_addresses) ob.addresses = AddressMode::Recorded;
  tr.results.resize(space.size());
  std::atomic<std::size_t> next{0};
  std::mutex mu;
  std::size_t done = 0;
  const std::size_t total = space.size() + 1;
  std::exception_ptr error;
  auto worker = [&] {
    for (;;) {
      const std::size_t i = next.fetch_add(1);
      if (i > space.size()) return;
      try {
        const Config& c = i == 0 ? recorded : space[i - 1].config;
        ReplayResult r = replay(t, c, c == recorded ? ob : o);
        std::lock_guard lock(mu);
        (i == 0 ? tr.baseline : tr.results[i - 1]) = std::move(r);
        ++done;
        if (progress) progress(done, total);
      } catch (...) {
        std::lock_guard lock(mu);
        if (!error) error = std::current_exception();
      }
    }
  };
  threads = std::max(1u, std::min<unsigned>(threads, static_cast<unsigned>(total)));
  std::vector<std::thread> pool;
  for (unsigned k = 1; k < threads; ++k) pool.emplace_back(worker);
  worker();
  for (auto& th : pool) th.join();
  if (error) std::rethrow_exception(error);

  rank(tr);
  return tr;
}

std::optional<Bytes> memory_needed(const Trace& t, const Config& config, const ReplayOptions& opts,
                                   unsigned* replays) {
  constexpr Bytes kStep = 2 * MiB;
  constexpr Bytes kUnlimited = 1024 * GiB;  // 1 TiB: more than any device
  // The cap is a fraction of the device memory in the allocator (set_per_process_memory_fraction),
  // so a cap of R bytes may allow a byte less: a cap certified by a peak reserved R is one at least
  // this much above it.
  constexpr Bytes kSlack = 4096;
  ReplayOptions o = opts;
  o.observer = nullptr;
  o.progress = nullptr;
  o.keep_allocator = false;
  o.stop_after = static_cast<std::size_t>(-1);
  std::atomic<unsigned> n{0};
  // The replay under a limit of `units` x 2 MiB: a cap when the device is larger, else the device
  // itself.
  auto under = [&](Bytes units) {
    ReplayOptions at = o;
    const Bytes limit = units * kStep;
    at.device_memory = std::max(opts.device_memory, limit);
    at.cap = limit;
    ++n;
    return replay(t, config, at);
  };
  auto fails = [&](Bytes units) { return under(units).stats.num_ooms > 0; };
  auto done = [&](std::optional<Bytes> out) {
    if (replays) *replays = n.load();
    return out;
  };
  // A run is not monotone in the cap (a smaller cap can fit where a larger one fails: the
  // allocator frees its cache and retries at other moments), so no bisection: the caps are walked
  // down from 1 TiB, 2 MiB at a time, to the first that fails; the answer is the step above it, the
  // smallest cap from which every larger cap fits.
  //
  // Without garbage_collection_threshold the cap acts only where the allocator compares reserved
  // memory plus a new segment with it. A replay under cap C that fits with peak reserved R made
  // every segment allocation it made with reserved + size <= R and was refused the others with
  // reserved + size > C: under any cap between R and C every comparison comes out the same, so the
  // replay is the same and fits. One replay vouches for every step from R to C, and the walk jumps.
  Bytes hi = kUnlimited / kStep;  // in steps; `hi` fits, and every cap above it
  ReplayResult top = under(hi);
  if (top.stats.num_ooms > 0) return done(std::nullopt);
  if (config.garbage_collection_threshold <= 0) {
    std::int64_t peak = top.peak_reserved();
    for (;;) {
      const Bytes next = std::min(hi - 1, (static_cast<Bytes>(peak) + kSlack - 1) / kStep);
      if (next == 0) return done(kStep);  // fits under every cap down to 2 MiB
      ReplayResult r = under(next);
      if (r.stats.num_ooms > 0) return done((next + 1) * kStep);  // the steps above `next` are vouched for
      hi = next;
      peak = r.peak_reserved();
    }
  }
  // With garbage_collection_threshold (a fraction g of the cap) the allocator also compares
  // reserved memory with g x cap, so a cap below C may change the run although it is above R. A
  // cap of at least R / g (R the peak reserved with no cap) is never reached and garbage collection
  // never starts: those fit. Below, the caps are replayed every kGcStride steps (docs: at most
  // kGcProbes caps between R and R / g, so a verdict costs tens of replays, not hundreds), down to
  // the first that fails, then every 2 MiB step between it and the last that fitted: the answer is
  // exact to 2 MiB next to it, and the caps further up were checked at that stride (said by
  // gc_stride()). Replays run on worker threads in batches.
  const Bytes top_steps =
      std::min(hi, static_cast<Bytes>(static_cast<double>(top.peak_reserved() + static_cast<std::int64_t>(kSlack)) /
                                          config.garbage_collection_threshold / static_cast<double>(kStep)) +
                       1);
  const Bytes stride = gc_stride(top.peak_reserved(), config.garbage_collection_threshold) / kStep;
  const unsigned threads = std::clamp(std::thread::hardware_concurrency(), 1u, 8u);
  // Replays the caps `caps` (in steps, descending) and returns the index of the first that fails.
  auto first_failing = [&](const std::vector<Bytes>& caps) -> std::optional<std::size_t> {
    for (std::size_t at = 0; at < caps.size(); at += threads) {
      const std::size_t batch = std::min<std::size_t>(threads, caps.size() - at);
      std::vector<char> failed(batch, 0);
      std::vector<std::thread> pool;
      std::exception_ptr error;
      std::mutex mu;
      auto work = [&](std::size_t k) {
        try {
          failed[k] = fails(caps[at + k]) ? 1 : 0;
        } catch (...) {
          std::lock_guard lock(mu);
          if (!error) error = std::current_exception();
        }
      };
      for (std::size_t k = 1; k < batch; ++k) pool.emplace_back(work, k);
      work(0);
      for (auto& th : pool) th.join();
      if (error) std::rethrow_exception(error);
      for (std::size_t k = 0; k < batch; ++k)
        if (failed[k]) return at + k;
    }
    return std::nullopt;
  };
  std::vector<Bytes> coarse;
  for (Bytes c = top_steps; c > stride; c -= stride) coarse.push_back(c - stride);  // top_steps fits
  if (coarse.empty() || coarse.back() > 1) coarse.push_back(1);
  auto f = first_failing(coarse);
  if (!f) return done(kStep);
  const Bytes failing = coarse[*f];
  const Bytes fitted = *f == 0 ? top_steps : coarse[*f - 1];
  std::vector<Bytes> fine;
  for (Bytes c = fitted - 1; c > failing; --c) fine.push_back(c);
  auto g = first_failing(fine);
  return done(((g ? fine[*g] : failing) + 1) * kStep);
}

Bytes gc_stride(std::int64_t uncapped_peak_reserved, double gc_threshold) {
  constexpr Bytes kStep = 2 * MiB;
  if (gc_threshold <= 0) return kStep;
  const double span = static_cast<double>(std::max<std::int64_t>(uncapped_peak_reserved, 0)) / gc_threshold;
  const Bytes steps = static_cast<Bytes>(span / static_cast<double>(kStep) / static_cast<double>(kGcProbes)) + 1;
  return steps * kStep;
}

}  // namespace cachet::replay

// tune: replay a prepared trace under many configurations on worker threads and pick the one
// with the lowest peak reserved and no new out-of-memory errors.
#include <algorithm>
#include <atomic>
#include <mutex>
#include <thread>

#include <fmt/format.h>

#include "cachet/errors.h"
#include "cachet/replay/replay.h"

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

TuneResult tune(const Trace& t, const Config& recorded, const std::vector<TuneCandidate>& space,
                const ReplayOptions& opts, unsigned threads,
                const std::function<void(std::size_t, std::size_t)>& progress) {
  TuneResult tr;
  ReplayOptions o = opts;
  o.observer = nullptr;
  o.keep_allocator = false;
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
        ReplayResult r = replay(t, i == 0 ? recorded : space[i - 1].config, o);
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

  const ReplayResult& b = tr.baseline;
  std::int64_t best_reserved = b.peak_reserved();
  for (std::size_t i = 0; i < tr.results.size(); ++i) {
    const ReplayResult& r = tr.results[i];
    if (r.stats.num_ooms > b.stats.num_ooms || r.failed_allocs > b.failed_allocs) continue;
    const bool better = r.peak_reserved() < best_reserved ||
                        (tr.best != static_cast<std::size_t>(-1) && r.peak_reserved() == best_reserved &&
                         r.conf.size() < tr.results[tr.best].conf.size());
    if (better) {
      best_reserved = r.peak_reserved();
      tr.best = i;
    }
  }
  return tr;
}

}  // namespace cachet::replay

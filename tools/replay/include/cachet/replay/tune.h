// cachet/replay/tune.h: searching allocator configurations on a prepared trace, ranking them,
// and the memory a configuration needs to run a trace without running out of memory.
//
// The ranking (ranks_before) is the answer to "my run ran out of memory: which configuration
// fixes it?": fewer requests that raised out-of-memory (num_ooms, PyTorch's stat) first, then
// lower peak reserved, then fewer device calls (num_device_alloc + num_device_free). Under a
// cap a configuration that fails reserves less, so peak reserved alone would prefer failing.
#pragma once

#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cachet/config.h"
#include "cachet/replay/replay.h"
#include "cachet/types.h"

namespace cachet::replay {

struct TuneCandidate {
  std::string conf;  // to_string(config): PyTorch syntax, "policy:cachet" (CACHET_ALLOC_CONF) for the cachet policy
  Config config;
};

// The configurations tune searches (max_split_size_mb, roundup_power2_divisions,
// garbage_collection_threshold when a cap is set, expandable_segments, large_segment_size_mb),
// and the cachet policy once (policy:cachet, last; the PyTorch policy's keys left out).
std::vector<TuneCandidate> tune_space(const Config& base, bool with_cap);

// PyTorch's own allocator accepts `c` in PYTORCH_CUDA_ALLOC_CONF: it sets no cachet-only key
// (policy:cachet, cachet_validate).
bool pytorch_accepts(const Config& c);

// Device calls counted by the ranking: num_device_alloc + num_device_free.
std::int64_t device_calls(const ReplayResult& r);

// The ranking: true when `a` comes strictly before `b` (fewer operations PyTorch itself would
// fail at with private pools, ReplayResult::pytorch_failures; then fewer num_ooms; then lower
// peak reserved; then fewer device calls). Equal results are ties (neither ranks before the other).
bool ranks_before(const ReplayResult& a, const ReplayResult& b);

inline constexpr std::size_t kRecorded = static_cast<std::size_t>(-1);

struct TuneResult {
  ReplayResult baseline;              // the recorded configuration
  std::vector<ReplayResult> results;  // one per candidate, in tune_space order
  // Indexes into results, best first (ranks_before; ties: the shorter conf, then tune_space order).
  std::vector<std::size_t> ranking;
  // The first of the ranking, or kRecorded when no candidate ranks before the recorded
  // configuration (ties keep the recorded one: no change for nothing). Never a candidate with
  // more num_ooms than any candidate tried or the recorded configuration.
  std::size_t best = kRecorded;
  // The same among the candidates pytorch_accepts (PyTorch's own allocator), or kRecorded.
  std::size_t best_native = kRecorded;

  const ReplayResult& at(std::size_t i) const { return i == kRecorded ? baseline : results.at(i); }
};

// The stride of memory_needed's walk under garbage_collection_threshold `gc_threshold` (a multiple
// of 2 MiB: R0 / threshold split into about kGcProbes caps, R0 the peak reserved with no cap);
// 2 MiB without the threshold.
inline constexpr unsigned kGcProbes = 64;
Bytes gc_stride(std::int64_t uncapped_peak_reserved, double gc_threshold);

// Replays every candidate on `threads` (>= 1) worker threads (std::thread), then ranks them. The
// recorded configuration, and a candidate equal to it, replay with the trace's addresses
// (AddressMode::Recorded, synthetic where they do not hold, ReplayResult::note), as `cachet
// replay` does; the other candidates with opts.addresses.
// `progress(done, total)` is called from the workers (under a lock) when set.
TuneResult tune(const Trace& t, const Config& recorded, const std::vector<TuneCandidate>& space,
                const ReplayOptions& opts, unsigned threads,
                const std::function<void(std::size_t, std::size_t)>& progress = {});

// The smallest cap, a multiple of 2 MiB, from which `config` replays `t` with no out-of-memory
// error (num_ooms == 0) under it and under every larger cap: the cap (set_per_process_memory_fraction,
// in bytes) the run needs, or the device memory when above opts.device_memory. A run is not
// monotone in the cap (the allocator frees its cache and retries at other moments under another
// cap: side_stream_mlp.native, tests/data/oracle/snapshots/capped, fits under 2,164 MiB and fails
// under 2,200 MiB), so a cap below the answer may
// fit too, yet one above it would fail. Found by replay: the caps walked down from 1 TiB, 2 MiB at a
// time, to the first that fails; a replay that fits under cap C with peak reserved R vouches for
// every cap from R to C (the same comparisons, the same run), so the walk jumps to R. With
// garbage_collection_threshold g (which compares with g x cap) caps below R0 / g (R0: the peak
// with no cap) are replayed every gc_stride() bytes (about kGcProbes caps) down to the first that
// fails, then every 2 MiB step above it: exact to 2 MiB next to the answer, the caps further up
// checked at that stride. `replays` (when given) counts the replays made. nullopt when even a
// 1 TiB cap fails.
std::optional<Bytes> memory_needed(const Trace& t, const Config& config, const ReplayOptions& opts,
                                   unsigned* replays = nullptr);

// The keys of `c` that policy:cachet does not use (it has no segments, no split limit and no
// rounding beyond 512 B): expandable_segments, max_split_size_mb, roundup_power2_divisions,
// large_segment_size_mb, max_non_split_rounding_mb, garbage_collection_threshold, where set.
std::vector<std::string> keys_policy_cachet_ignores(const Config& c);

// --- what tune says ---

// cachet's plug-in is recommended over PyTorch's allocator only when it is clearly better: fewer
// requests that run out of memory, or, with as many, peak reserved lower by at least this share,
// or, under a cap (`cap` > 0) and with none, at least kSafeHeadroom under it where PyTorch's
// allocator's pick leaves less (is_safe_under_cap): the safer pick within the margin.
inline constexpr double kPluginMinSaving = 0.10;
bool plugin_clearly_better(const ReplayResult& plugin, const ReplayResult& native, Bytes cap = 0);

// What `to` changes against `from` in one or two plain sentences: requests that no longer fail
// (or still do), peak reserved, retries, device calls.
std::string describe_change(const ReplayResult& from, const ReplayResult& to);

// `text` as lines of at most `width` columns (a longer word stays whole), each starting with
// `indent`, each ending in a newline.
std::string wrap_text(std::string_view text, std::size_t width, std::string_view indent = "");

// Every line of `text` over `width` columns wrapped at spaces, its continuation lines indented
// by two more than the line itself (lines that fit, tables included, are kept as they are).
std::string fit_lines(std::string_view text, std::size_t width);

// The plug-in's candidate worth naming: `best` when it is cachet-only, else the first cachet-only
// one of the ranking; kRecorded when none was tried.
std::size_t best_plugin(const TuneResult& tr);

}  // namespace cachet::replay

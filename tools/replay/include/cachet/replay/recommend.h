// cachet/replay/recommend.h: one recommendation and one verdict for every command that judges a
// configuration (`cachet tune`, `explain`, `report`, `replay`, `predict`).
//
// The recommendation is tune's (tune.h: the ranking ranks_before, fewest out-of-memory errors,
// then lowest peak reserved, then fewest device calls): PyTorch's own allocator's best
// (TuneResult::best_native) and, only when clearly better (plugin_clearly_better), cachet's
// plug-in (policy:cachet), which is then the headline. explain's fix, report's recommendation and
// predict's are this pick; the change with the fewest keys is a second answer, labelled as such,
// never the headline.
//
// The verdict is what the user's configuration does under the cap (or the device's memory): it
// fits or not, its headroom, its allocation retries, and the smallest cap from which it has no
// out-of-memory under every larger cap too, found by replay (memory_needed) whether or not the
// recorded run failed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cachet/replay/replay.h"
#include "cachet/replay/tune.h"

namespace cachet::replay {

struct Recommendation {
  std::size_t native = kRecorded;  // TuneResult::best_native (kRecorded: keep the recorded configuration)
  std::size_t plugin = kRecorded;  // best_plugin(): the plug-in's candidate named (kRecorded: none tried)
  bool recommend_plugin = false;   // the plug-in is the best of the ranking and clearly better than `native`
  // The headline: `plugin` when recommend_plugin, else `native` (kRecorded: keep the recorded one).
  std::size_t pick = kRecorded;
  // The recorded configuration runs out of memory, the plug-in's candidate does not, and neither
  // does any configuration PyTorch's own allocator accepts: only the plug-in avoids it.
  bool only_plugin_avoids = false;
  // Among the candidates with no out-of-memory (when the recorded configuration has one): the one
  // changing the fewest keys of the recorded configuration (then lowest peak reserved, then the
  // shorter string); kRecorded when none, when it is the pick, or when it changes no fewer keys
  // than the pick.
  std::size_t fewest_keys = kRecorded;
  std::vector<std::string> pick_keys, fewest_keys_keys;  // the keys each changes (changed_keys)
  // The configuration tune started from is not the recorded one (a command's --conf): said as
  // "the given configuration".
  bool from_given = false;
  // memory_needed of the ranking's best, of `native` and of `plugin`, where they still run out of memory.
  std::optional<Bytes> needed_best, needed_native, needed_plugin;
};

// Tune's recommendation from its results: `t` and `o` (the options tune replayed the candidates
// with) are for memory_needed. `recorded` is the configuration tune started from.
Recommendation recommend(const Trace& t, const Config& recorded, const TuneResult& tr, const ReplayOptions& o);

// The environment variable a configuration goes in: CACHET_ALLOC_CONF for policy:cachet, else
// PYTORCH_CUDA_ALLOC_CONF.
std::string conf_variable(const Config& c);

// Tune's answer in text (lines wrapped to `width`): "With PyTorch's allocator: ..." and "With
// cachet's plug-in: ..." with what each changes and its headroom, the line saying plainly when
// only the plug-in avoids the out-of-memory, and how much memory the pick needs when nothing
// avoids it. Printed by tune, and by explain and report under their own headings.
std::string recommendation_text(const TuneResult& tr, const Recommendation& rec, const ReplayOptions& o,
                                std::size_t width);

// --- the verdict ---

struct Verdict {
  std::string conf;              // the configuration judged (to_string; "" = PyTorch's defaults)
  bool recorded_conf = true;     // it is the configuration recorded in the trace
  bool recorded_run_failed = false;  // the recorded run ran out of memory (the trace has an oom entry)
  Bytes cap = 0;                 // 0: none
  Bytes device_memory = 0;
  bool device_memory_known = true;
  std::int64_t num_ooms = 0;     // requests that run out of memory in the replay
  std::int64_t retries = 0;      // num_alloc_retries: the allocator freed its cache and retried
  std::int64_t peak_reserved = 0;
  // The smallest cap (to 2 MiB) from which the configuration has no out-of-memory under it and
  // under every larger cap, by replay (memory_needed: a run is not monotone in the cap, a smaller
  // one may fit too); nullopt: none up to 1 TiB.
  std::optional<Bytes> smallest_cap;
  // The configuration's garbage_collection_threshold (0: none): memory_needed then checks the caps
  // above the answer at gc_stride() apart, and the text says so.
  double gc_threshold = 0;
  // When the cap was given as PyTorch's rounded text ("8.12 GiB allowed": two decimals of GiB),
  // half its rounding: the true cap lies within this many bytes of `cap` (cap_text_rounding).
  Bytes cap_rounding = 0;

  bool fits() const { return num_ooms == 0; }
  Bytes limit() const { return cap ? cap : device_memory; }
};

// The verdict on `r`, a replay of the whole trace under `o` (the cap and device memory in force;
// the recorded configuration with the recorded addresses, as `cachet replay` replays it). Runs
// memory_needed (at most a replay per 2 MiB between the answer and the unlimited peak reserved,
// usually a few: each replay that fits vouches for the caps down to its peak reserved). `cap_text`: the --cap as given (for cap_rounding; "" when none).
Verdict judge(const LoadedTrace& lt, const ReplayResult& r, const ReplayOptions& o, std::string_view cap_text = {});

// The verdict in a paragraph beginning "Verdict for ...", lines wrapped to `width`, wording for
// a run that fits, fails, and for a recorded run that never ran out of memory.
std::string verdict_text(const Verdict& v, std::size_t width);
// {"conf", "fits", "num_ooms", "num_alloc_retries", "peak_reserved", "cap", "limit", "headroom"
// (null: no fit), "smallest_cap" (null: none), "cap_rounding", "recorded_run_failed"}
std::string verdict_json(const Verdict& v);

// Half the rounding of a cap written as PyTorch prints it in its out-of-memory message ("8.12
// GiB allowed": two decimals of GiB, so within 0.005 GiB = 5368709 bytes): that, when `text` is a
// size in G or GiB with at most two decimals, else 0.
Bytes cap_text_rounding(std::string_view text);

// --- all of it in one call (for `cachet predict` and any other command) ---

struct OneAnswer {
  TuneResult tried;    // tune's space replayed from the starting configuration (lt.run.config)
  Recommendation rec;  // recommend(): the pick
  Verdict verdict;     // judge() on the starting configuration
};

// What `cachet tune` computes, in one call: tune_space(lt.run.config, cap), replayed on
// `threads` workers (synthetic addresses; the starting configuration as `o` says, recorded
// addresses when o.baseline_recorded_addresses), recommend(), and judge() of the starting
// configuration under `o` (as `cachet replay` replays it). `o`: recorded_options(lt,
// AddressMode::Recorded), with the cap and device memory in force. `cap_text`: --cap as given.
OneAnswer one_answer(const LoadedTrace& lt, const ReplayOptions& o, unsigned threads, std::string_view cap_text = {});

}  // namespace cachet::replay

// cachet/replay/explain.h: why a recorded run ran out of memory (`cachet explain`, `cachet
// report`). The trace is replayed under its recorded configuration up to its first
// out-of-memory (with none, up to peak reserved), and the allocator's state there is taken
// apart:
//   - the request: size (where it came from: LoadedTrace::failed_requests), rounded size,
//     stream, pool, the private pool it went to (use_mem_pool or a capture) and, at an
//     out-of-memory there, the default pools' idle segments PyTorch did not release for it
//     (no free-and-retry inside a private pool, docs/pytorch-allocator.md §14.6), the stack
//     frames PyTorch recorded;
//   - reserved, allocated and requested bytes; whether rounding is a cause (at least what the
//     request lacked);
//   - reserved - allocated as a partition (docs/pytorch-allocator.md §2.1, §2.2, §2.5; the
//     rules are spelled out in docs/explain.md): free blocks of the request's stream and pool
//     too small for it, large enough but refused by the oversize rules, large enough and usable,
//     free in the other pool, free in other streams' pools, free in private pools, and blocks
//     freed but waiting for stream-use events. The parts sum exactly to reserved - allocated;
//   - allocated - requested (rounding), beside it;
//   - the allocation sites (innermost frame outside PyTorch's own code) holding the most bytes;
//   - the smallest change of configuration that avoids the out-of-memory, found by replay (under
//     a cap, one leaving kSafeHeadroom first).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "cachet/io/frames.h"
#include "cachet/replay/recommend.h"
#include "cachet/replay/replay.h"
#include "cachet/replay/tune.h"
#include "cachet/snapshot.h"

namespace cachet::replay {

// Frames are printed one a line, each at most this long (C++ template names run to thousands of
// characters): longer ones end in "...".
inline constexpr std::size_t kMaxFrameLine = 160;
std::string clip_line(std::string s, std::size_t width);

// PyTorch's round_size (docs/pytorch-allocator.md §1.2) under `c`.
Bytes pytorch_round_size(Bytes size, const Config& c);
// The smallest request that pytorch_round_size rounds to `rounded` (or above) under `c`.
Bytes smallest_request_rounding_to(Bytes rounded, const Config& c);

// One part of reserved - allocated.
struct FreePart {
  std::string key;   // "too_small", "oversize_rule", "usable", "other_pool", "other_streams",
                     // "private_pools", "pending_free"
  std::string what;  // one line for people
  Bytes bytes = 0;
  std::uint64_t blocks = 0;
};

// Site::where when the allocation has no frame, and when it has only PyTorch's own C++ frames
// (torch::unwind, c10::, at::, unsymbolised ??: io::is_internal_cpp_frame).
inline constexpr const char* kNoFramesSite = "(no frames recorded)";
inline constexpr const char* kNoUsableFrameSite =
    "(no usable frame: only PyTorch's own C++ frames, torch::unwind, c10::, at::, ?\?)";

struct Site {
  std::string where;               // io::to_string of the site frame ("(no frames recorded)")
  std::vector<io::Frame> frames;   // the whole stack of the first block seen there
  Bytes bytes = 0;                 // requested bytes allocated there and live at the moment
  std::uint64_t blocks = 0;
};

struct Moment {
  bool oom = false;         // true: the first out-of-memory; false: peak reserved
  std::size_t op = 0;       // index into Trace::ops
  std::uint64_t event = 0;  // index of the trace event
  Bytes size = 0;           // requested bytes (an `oom` event: LoadedTrace::failed_requests' size)
  Bytes rounded = 0;        // pytorch_round_size
  // An `oom` event records the size after PyTorch's rounding: the size it records, and where the
  // size replayed came from (failed_request_source; "" for an allocation).
  Bytes recorded_size = 0;
  std::string size_source;
  FailedRequest::Source size_source_kind = FailedRequest::Source::Rounded;
  StreamId stream = 0;
  bool small_pool = false;  // rounded <= 1 MiB
  // The private pool the request went to (a window of it was open for the request: use_mem_pool
  // or a CUDA graph capture, cachet/replay/pools.h); {0, 0}: the default pools.
  PoolId pool;
  PoolEntry pool_entry = PoolEntry::Unknown;  // how that window was entered (private pools only)
  // An out-of-memory in a private pool: the default pools' segments with no block in use and
  // their bytes. Outside a private pool PyTorch's last retry releases them (free-and-retry);
  // inside one it does not (docs/pytorch-allocator.md §14.6), so they stayed reserved.
  std::uint64_t default_idle_segments = 0;
  Bytes default_idle_bytes = 0;
  std::vector<io::Frame> frames;
  // When the request has no frames but others do: the nearest earlier event with frames.
  std::uint64_t nearest_event = 0;
  std::string nearest_what;  // its action and size, e.g. "alloc of 1.53 GiB"
  std::vector<io::Frame> nearest_frames;
  std::optional<Bytes> device_free;  // the `oom` event's driver figure
  std::int64_t reserved = 0, allocated = 0, requested = 0;
  std::vector<FreePart> parts;       // sums to reserved - allocated
  // An out-of-memory: the bytes the request lacked (reserved + its segment - the limit, the cap
  // or the device memory; 0 when not known: expandable segments, or nothing lacked), the
  // rounding of the request itself (rounded - size to 512 B) and whether the rounding (of the
  // live blocks, allocated - requested, and of the request) is at least what it lacked.
  Bytes lacked = 0;
  Bytes request_rounding = 0;
  bool rounding_is_a_cause = false;
  Snapshot segments;                 // memory_snapshot() at that moment
};

struct Change {
  std::string conf;               // to_string(config)
  std::vector<std::string> keys;  // the keys changed from the recorded configuration
  std::size_t index = 0;          // into tune_space() and Explanation::tried->results
};

struct Explanation {
  std::string trace;   // file name
  std::string conf;    // recorded configuration ("" = default)
  Bytes device_memory = 0;
  bool device_memory_known = true;  // false: nothing told it (kNoDeviceLimit), said as such
  Bytes cap = 0;
  Moment at;
  std::vector<Site> sites;            // most bytes first
  bool frames_recorded = false;
  bool rounding_set = false;          // the recorded configuration sets roundup_power2_divisions
  ReplayResult baseline;              // the recorded configuration, whole trace
  // At an out-of-memory: tune's recommendation (rec.pick, cachet/replay/recommend.h) when it avoids
  // the out-of-memory: the one answer tune, report and predict give too.
  std::optional<Change> fix;
  // PyTorch's own allocator's pick (rec.native) when it avoids the out-of-memory.
  std::optional<Change> native_fix;
  // The change of fewest keys (then lowest peak reserved) that avoids it, when it is neither `fix`
  // nor `native_fix`: a second answer, labelled as such, never the headline.
  std::optional<Change> smallest_fix;
  std::optional<Change> smallest_native_fix;  // no longer set (kept for the --json field)
  std::optional<Recommendation> rec;  // tune's recommendation (with or without an out-of-memory)
  std::optional<Verdict> verdict;     // the recorded configuration under the cap (judge)
  std::size_t candidates = 0;         // configurations tried for the fix
  std::size_t candidates_without_oom = 0;
  // With no native fix: the smallest memory cap (to 2 MiB, by replay) from which the recorded
  // configuration has no out-of-memory under it and every larger cap (the verdict's smallest_cap);
  // nullopt when not searched or none up to the device.
  std::optional<Bytes> cap_needed;
  // Every configuration replayed for the fix (results[i] is tune_space()[i]), when searched.
  std::optional<TuneResult> tried;
  std::vector<std::string> notes;     // what was assumed

  const ReplayResult& result(const Change& c) const { return tried->results[c.index]; }
  const ReplayResult& base() const { return tried->baseline; }  // the recorded configuration, same way
};

// The keys whose values differ between `a` and `b` (PyTorch's names; "policy" for the policy).
std::vector<std::string> changed_keys(const Config& a, const Config& b);

// The state at `m.op` replayed under `config` (recorded addresses when they hold); fills
// reserved/allocated/requested, parts and segments of `m`, whose op, size, stream are set.
void take_apart(const LoadedTrace& lt, const Config& config, const ReplayOptions& o, Moment& m);

// The live blocks at op `op` grouped by site, most bytes first (at most `top`).
std::vector<Site> sites_at(const Trace& t, std::size_t op, const std::vector<std::vector<io::Frame>>& frames,
                           std::size_t top);

struct ExplainOptions {
  unsigned threads = 2;
  std::size_t top_sites = 8;
  bool search_fix = true;  // replay tune's space for the recommendation
  std::string cap_text;    // the --cap as given (Verdict::cap_rounding)
};

// The whole analysis. `o`: the recorded run's options (device memory, cap). Throws UsageError
// when the trace's out-of-memory does not happen in the replay (a cap or the device's memory
// was not given), naming what to pass.
Explanation explain(const LoadedTrace& lt, const ReplayOptions& o, const std::vector<std::vector<io::Frame>>& frames,
                    const ExplainOptions& eo = {});

std::string explain_text(const Explanation& e);
std::string explain_json(const Explanation& e);

}  // namespace cachet::replay

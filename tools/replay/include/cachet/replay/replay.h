// cachet/replay/replay.h: replaying a recorded PyTorch memory trace through the production
// allocator (cachet::CachingAllocator on the host backend) under any configuration.
//
// A trace is prepared once (prepare_trace) into a compact list of the user's actions: allocate,
// free, free that waits for stream uses, the completion of such a free, empty_cache, and the
// requests that ran out of memory. The allocator's own device calls (segment_alloc/free/map/
// unmap) are not actions: the replayed allocator makes its own. Segment frees that the recorded
// allocator could not have made by itself (no memory limit near, no garbage collection due)
// are the user's empty_cache() calls; the others (its free-and-retry before a new segment or an
// out-of-memory error, garbage collection) are its reactions to the limit it ran under, which
// the replayed allocator makes again, or not, under the limit it is given (README.md).
//
// replay() then runs those actions with no per-event heap allocation or string work (blocks are
// found by their slot index, not by address), so one Trace can be replayed under many
// configurations, from several threads at once (a Trace is immutable).
//
// Pending frees: PyTorch logs free_requested when free() is called and free_completed when the
// block goes back to its pool (after the events of its recorded stream uses). A free whose
// free_completed does not follow at once is replayed as record_stream() on a private
// pseudo-stream plus free(); its free_completed completes that pseudo-stream's events, and the
// next allocate processes them, as PyTorch's process_events does. Completions that come from a
// synchronize (empty_cache, the out-of-memory retry) are left to the replayed allocator's own
// synchronize, and completed after the next allocation at the latest.
//
// Private pools (CUDA graphs, MemPool): when the snapshot's segments name them, load_trace also
// adds BeginPool/EndPool actions around the allocations that went to them (route_to_pools,
// cachet/replay/pools.h: what is inferred and what the trace cannot tell). For an oracle
// recording whose op list has pool or capture ops, the op list says where (route_recording_pools).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "cachet/config.h"
#include "cachet/gpu/allocator.h"
#include "cachet/io/recording.h"
#include "cachet/io/trace_reader.h"
#include "cachet/io/trace_stats.h"
#include "cachet/replay/pools.h"
#include "cachet/snapshot.h"
#include "cachet/stats.h"
#include "cachet/trace.h"
#include "cachet/types.h"

namespace cachet::replay {

enum class OpKind : std::uint8_t {
  Alloc,        // slot = allocate(size, stream)
  Free,         // free(slot)
  FreePending,  // record_stream(slot, pseudo stream `aux`); free(slot)
  Complete,     // complete the events of pseudo stream `aux`
  EmptyCache,   // empty_cache()
  OomRequest,   // a request that raised OutOfMemory in the recorded run: allocate(size, stream),
                // and free at once if it succeeds here (the program never got the block)
  BeginPool,    // begin_allocate_to_pool of window `aux` (Trace::pools.windows): its pool (made
                // with one user the first time) and route
  EndPool,      // end_allocate_to_pool of window `aux`; release_pool (the window's user) when
                // its release_at_end
  ReleasePool,  // release_pool of pool `aux` (Trace::pools.pools); slot 1: then empty_cache(its id)
                // (a MemPool dropped), slot 0: no more (a graph reset)
};

struct Op {
  OpKind kind = OpKind::Alloc;
  std::uint32_t slot = 0;   // Alloc/Free/FreePending: the block, numbered by its alloc
  std::uint32_t aux = 0;    // FreePending/Complete: pseudo-stream index; Begin/EndPool: window index
  std::uint32_t event = 0;  // index of the trace event this op came from
  Bytes size = 0;           // Alloc/OomRequest: requested bytes
  StreamId stream = 0;      // Alloc/OomRequest
};

// Pseudo streams (FreePending/Complete) are kPseudoStreamBase + aux.
inline constexpr StreamId kPseudoStreamBase = 0xC0C0'0000'0000'0000ull;

// A prepared trace: immutable, shareable between threads.
struct Trace {
  std::string name;
  std::vector<Op> ops;
  std::uint32_t slots = 0;           // number of Alloc ops
  std::uint32_t pseudo_streams = 0;  // most frees pending at once
  std::uint64_t events = 0;          // trace events read
  std::vector<std::int64_t> event_time_us;  // time of each op's event (empty when none recorded)
  std::vector<gpu::DevicePtr> recorded_addresses;  // segment_alloc/segment_map addresses, in order
  // Per entry of recorded_addresses, the recorded device call: its size, whether it was a
  // cudaMalloc (segment_alloc; else a map), and how many segments allocated inside the trace had
  // been freed (segment_free) before it. Recorded addresses hold only while the replay makes
  // these calls (replay.cpp, CheckedMemory).
  struct RecordedCall {
    Bytes size = 0;
    bool malloc = false;
    std::uint32_t frees_before = 0;
  };
  std::vector<RecordedCall> recorded_calls;
  io::TraceStats stats;              // counts and anomalies (mid-run traces)
  std::uint64_t empty_cache_calls = 0;
  // Runs of segment releases made by the recorded allocator itself inside a malloc, not
  // replayed: followed by the out-of-memory error (its last free-and-retry), or by the new
  // segment it needed (a free-and-retry, the release of oversize blocks or garbage collection).
  std::uint64_t retry_releases_before_oom = 0;
  std::uint64_t retry_releases = 0;
  std::uint64_t ignored_events = 0;  // frees of unknown blocks, completions without request
  PoolInference pools;  // private pools (route_to_pools); none: everything in the default pools
};

// What the recorded run was: needed to tell the user's empty_cache() from the allocator's own
// releases (out-of-memory retry, garbage collection).
struct RecordedRun {
  Config config;
  Bytes total_memory = 80 * GiB;  // load_trace: see LoadedTrace::memory
  Bytes cap = 0;  // the cap to replay under (set_per_process_memory_fraction in bytes); 0 = none
  // The limit the recorded allocator ran under, to tell its own releases from empty_cache():
  // never a what-if cap (load_trace: the recorded cap; else, when an out-of-memory entry shows a
  // cap whose size the trace does not record, the trace's peak reserved, the least that cap can
  // be; else the cap given). nullopt: `cap`.
  std::optional<Bytes> release_limit;
};

Trace prepare_trace(std::span<const TraceEvent> events, const RecordedRun& run, std::string name = {});

// When `segments` (the snapshot's, at the end of `events`) name private pools: fills t.pools and
// adds BeginPool/EndPool ops so that each allocation is replayed into its segment's pool
// (cachet/replay/pools.h says how, and what is assumed). Otherwise leaves `t` as it is.
void route_to_pools(Trace& t, std::span<const TraceEvent> events, const Snapshot& segments);
// An oracle recording (`rec`, read from the trace's file) whose op list `ops` (read from the
// file `op_list`) has pool or capture ops: fills t.pools and puts BeginPool/EndPool/ReleasePool
// and EmptyCache ops where the op list has them (cachet/replay/pools.h), matching its ops to the
// trace's events by the recorded results. False, leaving `t` as it is, when the list has no pool
// or capture op, or cannot be matched (PyTorch refused ops; an op on another thread; an event
// missing): then route_to_pools infers them from the snapshot.
bool route_recording_pools(Trace& t, std::span<const TraceEvent> events, const Snapshot& segments,
                           const io::Recording& rec, const std::vector<ops::Op>& ops, const std::string& op_list);
// The pool a request on `stream` goes to at op `op` (before it), by the trace's BeginPool/EndPool.
PoolId request_pool(const Trace& t, std::size_t op, StreamId stream);
// The window (Trace::pools.windows) whose pool that request goes to; nullopt: the default pools.
std::optional<std::uint32_t> request_window(const Trace& t, std::size_t op, StreamId stream);
// What route_to_pools inferred and assumed, and what the trace cannot tell, as lines ("" when no
// private pool).
std::string pool_lines(const Trace& t);

enum class AddressMode : std::uint8_t {
  Synthetic,  // the host backend's deterministic addresses
  Recorded,   // the trace's segment addresses, in order (falls back to Synthetic on divergence)
};

struct ReplayOptions {
  Bytes device_memory = 80 * GiB;  // the simulated device's capacity and total_memory
  Bytes cap = 0;                   // memory cap in bytes (set_memory_fraction); 0 = none
  AddressMode addresses = AddressMode::Synthetic;
  // Called after each op (index into Trace::ops) when set; for timelines. Slows the replay.
  std::function<void(std::size_t op, const CachingAllocator&)> observer;
  // Called every 65,536 ops with (ops done, ops in all) when set (progress display).
  std::function<void(std::size_t, std::size_t)> progress;
  // Stop after this many ops (e.g. at the peak, to look at the allocator there).
  std::size_t stop_after = static_cast<std::size_t>(-1);
  // Keep the allocator in ReplayResult::allocator (for snapshot()/summary()).
  bool keep_allocator = false;
  // tune(): the configuration it starts from replays with the trace's addresses (it is the recorded
  // one). false when a command's --conf gave another starting configuration: then it replays with
  // `addresses`, as `cachet replay --conf` replays a configuration other than the recorded one.
  bool baseline_recorded_addresses = true;
};

struct ReplayResult {
  Config config;
  std::string conf;  // to_string(config)
  DeviceStats stats;  // memory_stats() at the end (or at stop_after)
  std::uint64_t events = 0;        // trace events read
  std::uint64_t ops = 0;           // ops replayed
  std::uint64_t failed_allocs = 0;  // allocations that succeeded in the recording, OOM here
  std::uint64_t oom_requests = 0;   // requests that raised OOM in the recording
  std::uint64_t oom_requests_ok = 0;  // ... and succeeded here
  // Operations PyTorch 2.11 itself would fail at with private pools (docs/pytorch-allocator.md
  // §14.8: memory given back during a capture, ...): gpu/ refused them, changing nothing; the
  // first one's op and message.
  std::uint64_t pytorch_failures = 0;
  std::string pytorch_failure;
  // Device calls (segment allocations/frees, page maps/unmaps) in the second half of the ops:
  // a training trace in its steady state should make none.
  std::uint64_t second_half_device_calls = 0;
  // Private pools (Trace::pools): each one's segments at the end (or at stop_after), by
  // Trace::pools index.
  struct PoolEnd {
    std::uint64_t segments = 0;
    Bytes reserved = 0;
    Bytes allocated = 0;
  };
  std::vector<PoolEnd> pool_ends;
  bool recorded_addresses = false;  // the trace's addresses were used throughout
  std::string note;  // e.g. why recorded addresses were given up
  double seconds = 0;
  std::unique_ptr<CachingAllocator> allocator;  // keep_allocator

  std::int64_t peak_allocated() const { return stats.allocated_bytes[0].peak; }
  std::int64_t peak_reserved() const { return stats.reserved_bytes[0].peak; }
  double fragmentation() const {
    return peak_allocated() > 0 ? static_cast<double>(peak_reserved()) / static_cast<double>(peak_allocated()) : 0.0;
  }
};

// Replays `t` under `config`. Throws ConfigError/UsageError for a configuration the host
// backend cannot run; never throws for out-of-memory (counted) or address divergence (falls
// back to synthetic addresses, noted).
ReplayResult replay(const Trace& t, const Config& config, const ReplayOptions& opts = {});

// What the trace says of the device's memory (load_trace fills it). A recording or a stats
// sidecar records the device's total memory; a PyTorch snapshot does not, but its out-of-memory
// entries record the device's free bytes: the memory the process could still get there was the
// trace's reserved bytes + that free memory.
struct DeviceMemoryFacts {
  enum class Source : std::uint8_t {
    Option,    // --device-memory (LoadOptions::device_memory)
    Recorded,  // total_memory beside the trace (recording, .stats.json)
    OomEntry,  // reserved + free at the trace's first out-of-memory entry
    Unknown,   // nothing tells: replayed with no device limit (kNoDeviceLimit)
  };
  Source source = Source::Unknown;
  // The first out-of-memory entry with the device's free bytes (not in oracle recordings).
  bool oom_seen = false;
  std::size_t oom_event = 0;  // its index in the device's trace
  Bytes oom_request = 0;      // its size (the rounded request)
  Bytes oom_free = 0;         // the device's free bytes then
  Bytes oom_reserved = 0;     // the trace's reserved bytes then (its segment events up to there)
  // oom_free exceeds the request by more than kCapEvidence: the device had room, so a cap
  // (set_per_process_memory_fraction) refused the request. Its value is not in the trace.
  bool cap_in_force = false;
  // The highest reserved bytes of the trace's segment events (from its start).
  Bytes trace_peak_reserved = 0;
};

// Free bytes beyond the request that prove a cap (cudaMalloc fails only when the device lacks
// the request, to its 2 MiB granularity).
inline constexpr Bytes kCapEvidence = 64 * MiB;
// The simulated device when nothing tells its size: larger than any GPU, so only a cap limits.
inline constexpr Bytes kNoDeviceLimit = 1024 * GiB;

// A request that ran out of memory in the recorded run (an `oom` trace event). PyTorch's entry
// records the size after its rounding (round_size, docs/pytorch-allocator.md §1.2), not what the
// program asked for; the replay asks for `size`, from the best source load_trace found.
struct FailedRequest {
  enum class Source : std::uint8_t {
    OpList,     // the op list an oracle recording replayed: the request itself
    SameStack,  // the latest earlier alloc with the entry's stack whose size rounds to the entry's
    // The entry has no stack (not recorded, or the autograd thread's): the latest earlier alloc
    // with none either, on its stream, whose size rounds to the entry's and whose kContextAllocs
    // allocations before it have the sizes and streams of those before the entry (a repeated step)
    SameContext,
    Rounded,    // nothing tells: the rounded size is assumed
  };
  std::size_t event = 0;  // the oom event's index in the device's trace
  Bytes recorded = 0;     // the entry's size (after PyTorch's rounding)
  Bytes size = 0;         // what the replay asks for
  Source source = Source::Rounded;
  std::size_t from = 0;   // SameStack: that alloc's trace event; OpList: the op's index
  std::string op_list;    // OpList: the op list's path
};

inline constexpr std::size_t kContextAllocs = 8;

// A trace file read and prepared for device `device` (the first device with events when -1).
struct LoadedTrace {
  io::TraceFile file;
  Trace trace;
  DeviceIndex device = 0;
  std::optional<Config> recorded_config;  // the allocator_settings' conf, parsed (nullopt: none)
  std::string recorded_conf_text;         // as recorded ("" when none)
  std::string config_note;                // why the recorded conf could not be used, if so
  std::string device_note;                // which device was chosen when several have events
  RecordedRun run;                        // run.total_memory: see memory.source; run.cap: 0 = none
  DeviceMemoryFacts memory;
  // The snapshot's segments at the end (when it has any): reserved and allocated bytes. A replay
  // of the recorded configuration should end in the same state.
  std::optional<Bytes> end_reserved;
  std::optional<Bytes> end_allocated;
  // Each `oom` event's request, in trace order; the replay's OomRequest ops ask for their `size`.
  std::vector<FailedRequest> failed_requests;
};

struct LoadOptions {
  std::optional<Bytes> device_memory = std::nullopt;  // overrides what the trace says (--device-memory)
  std::optional<Bytes> cap = std::nullopt;  // the run's memory cap in bytes (--cap); overrides a recording's
  DeviceIndex device = -1;
};

// Reads `path` (io::read_trace) and prepares it. Device memory, in order: the option, the total
// memory recorded beside the trace, reserved + free at its first out-of-memory entry (when no
// cap was in force), else kNoDeviceLimit (memory.source says which). Throws io::ReadError, also
// when the trace has no alloc or oom event to replay, or device_memory is 0.
LoadedTrace load_trace(const std::string& path, const LoadOptions& o);
LoadedTrace load_trace(const std::string& path, std::optional<Bytes> device_memory = std::nullopt,
                       DeviceIndex device = -1);

// When the trace shows a cap was in force (memory.cap_in_force) and none was given (run.cap ==
// 0): the error to print, asking for --cap. "" otherwise.
std::string missing_cap_error(const LoadedTrace& lt);

// One line on where the device memory came from, or a note naming --device-memory when nothing
// told and it matters (a cap, out-of-memory errors in the trace). `cap`: the cap in force.
std::string device_memory_line(const LoadedTrace& lt, Bytes cap);

// The recorded allocator's own segment releases (Trace::retry_releases, retry_releases_before_oom)
// in one line, "" when none.
std::string own_releases_line(const LoadedTrace& lt);

// The recorded run's peak reserved: PyTorch's reserved_bytes.all.peak when recorded beside the
// trace (a stats sidecar, a recording), else the trace's own segment events (from its start);
// nullopt when neither tells. `source` (when given) names where it came from.
std::optional<Bytes> recorded_peak_reserved(const LoadedTrace& lt, std::string* source = nullptr);

// For a replay `r` of the recorded configuration under `cap`: "" when its peak reserved is the
// recorded one (recorded_peak_reserved), else one line giving both figures and why they differ
// (a cap other than the recorded run's, the recorded addresses given up, a trace that starts
// mid-run).
std::string recorded_peak_note(const LoadedTrace& lt, const ReplayResult& r, Bytes cap);

// Where the size replayed for the recorded run's first failed request comes from, in one line
// (and how the others were sized, when there are more): "" when the trace has no `oom` event.
std::string failed_request_line(const LoadedTrace& lt);
// Where `f`'s replayed size comes from, as a clause ("what the program asked for, from op 776 of
// the op list ..."); `c` is the recorded configuration (the rounding of an assumed size).
std::string failed_request_source(const FailedRequest& f, const Config& c);

// When the trace ends at its first out-of-memory error (no allocation after it): one sentence
// saying that what the program did next is unseen, so a configuration that avoids the error is
// judged on the steps before it only. "" otherwise.
std::string oom_end_caveat(const LoadedTrace& lt);

// How close peak reserved `peak` comes to `cap`: "headroom under the cap: X (peak reserved P of
// cap C)", with a warning below kSafeHeadroom. "" when cap is 0.
std::string headroom_text(std::int64_t peak, Bytes cap);
// Under this much headroom a pick is close to the cap: a replay is exact only for the recorded
// configuration with its addresses, and other libraries (cuBLAS workspaces, NCCL) take memory
// outside the allocator.
inline constexpr Bytes kSafeHeadroom = 256 * MiB;
// Peak reserved `peak` leaves at least kSafeHeadroom under `cap` (always true without a cap).
inline bool is_safe_under_cap(std::int64_t peak, Bytes cap) {
  return cap == 0 || (peak >= 0 && static_cast<Bytes>(peak) + kSafeHeadroom <= cap);
}

// The options that replay `lt` as it was recorded (capacity, cap; addresses as given).
ReplayOptions recorded_options(const LoadedTrace& lt, AddressMode addresses);

}  // namespace cachet::replay

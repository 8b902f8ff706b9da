// cachet/lockstep.h: a reference model and the production allocator, side by side, one op at a
// time.
//
// Shared by props/ (RapidCheck state machines), fuzz/ (fuzz_ops, fuzz_cachet_policy) and the
// tests: one runner, templated over (model, implementation), for each policy's pair:
//   PytorchLockstep  model::Allocator     and CachingAllocator under policy:pytorch
//   CachetLockstep   model::CachetPolicy  and CachingAllocator under policy:cachet
// The ops and their text and case-file forms are the project's one vocabulary (cachet/ops.h),
// re-exported here.
//
//   Lockstep  holds the model ("model") and cachet::CachingAllocator ("sut"), applies one op to
//             the sut, then to the model, and returns a divergence report (nullopt = both
//             agree): the same pointer or the same error (OOM: the same message text; usage
//             and device errors: the same kind, wording is free), the same device calls
//             (malloc / reserve / map: address, size, outcome), the same trace events in the
//             same order (action, address, size, stream: so the order of cudaFree and unmap
//             calls is compared too), the same 122 stats (flatten), the same snapshot, and both
//             implementations' invariants clean. The same checks for both pairs.
//   handles   ops name allocations by handle (cachet/ops.h "Addressing"): in a Handles list,
//             handle k is the k-th allocation that returned memory; in an Ids list, the id its
//             Allocate bound. Free/RecordStream of a handle that was freed passes its old
//             address to both allocators (both must report the same usage error, or free the
//             block that now lives at that address); a handle never bound is skipped.
//   pools     the pool and capture ops (issue 16) go through ONE front end (tools/front_end,
//             cachet/front_end/pool_front_end.h: PyTorch's MemPool, use_mem_pool, CUDAGraph and
//             the generator's graph tensors, docs/pytorch-allocator.md §14.9): each allocator call
//             it makes is applied to the sut, then to the model, and their results compared
//             (the first that differs ends the op); then the same checks as any op, plus every
//             pool's use count (getPoolUseCount) on both sides. An op the front end refuses
//             (leaving a pool never entered, ...) is a UsageError on both sides, nothing applied.
//             A pair whose model or implementation has no private pools answers them
//             Outcome::Kind::Unsupported on both sides with a report, nothing applied.
//   §14.8     where the model throws cachet::PyTorchFailure (PyTorch 2.11 itself fails), the
//             sut must refuse with a UsageError (a DeviceError on a real device) whose message
//             names §14.8, its stats and snapshot as before the refused call and its invariants
//             clean; then the case has ended (ended()): the two states may differ from there on,
//             so later ops are not applied (Outcome::Kind::Ended, no report).
//
// Addresses: the sut's backend is wrapped so that every malloc / reserve / map it makes is
// logged; the model's SegmentSource hands the model exactly those addresses, in order (one
// queue per kind), and checks sizes. On the host backend the model also decides out-of-memory
// by itself, from the same capacity (a device call the sut did not make, or made with another
// size or outcome, is a divergence). On a real device the device's outcome is taken.
#pragma once

#include <concepts>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <variant>
#include <vector>

#include "cachet/config.h"
#include "cachet/front_end/pool_front_end.h"
#include "cachet/gpu/allocator.h"
#include "cachet/gpu/backend.h"
#include "cachet/gpu/host_backend.h"
#include "cachet/model/allocator.h"
#include "cachet/model/cachet_policy.h"
#include "cachet/ops.h"
#include "cachet/snapshot.h"
#include "cachet/summary.h"
#include "cachet/types.h"

namespace cachet::lockstep {

// The vocabulary (cachet/ops.h).
using ops::Allocate;
using ops::Case;
using ops::CompleteAllEvents;
using ops::CompleteEvents;
using ops::EmptyCache;
using ops::Free;
using ops::Handle;
using ops::Op;
using ops::parse_case;
using ops::parse_op;
using ops::parse_ops;
using ops::RecordStream;
using ops::SetMemoryFraction;
using ops::show;
using ops::show_case;

// What one side did with one op.
struct Outcome {
  enum class Kind : std::uint8_t {
    Ok,           // non-allocating op succeeded
    Pointer,      // allocate returned `ptr` (0 for size 0)
    OutOfMemory,  // cachet::OutOfMemory; message = what()
    UsageError,   // cachet::UsageError; message = what()
    DeviceError,  // cachet::DeviceError; message = what()
    Other,        // any other exception (an invariant violation, a logic_error, ...)
    Skipped,      // the op named a handle that was never bound: not applied
    Unsupported,  // a pool or capture op on a pair without private pools, wait_stream, kernel, cfg; not applied
    PyTorchFailure,  // the model: cachet::PyTorchFailure (PyTorch 2.11 fails here, §14.8)
    Ended,        // the case ended at an earlier PyTorchFailure: not applied
  };
  Kind kind = Kind::Ok;
  std::uint64_t ptr = 0;
  std::string message;  // what(); empty for an OutOfMemory made from facts (text() formats it)
  std::optional<OomFacts> oom;  // the facts of an OutOfMemory made from them (cachet/errors.h)
  friend bool operator==(const Outcome&, const Outcome&) = default;
};
std::string show(const Outcome& o);
// The outcome's message: `message`, or PyTorch's text of its out-of-memory facts.
std::string text(const Outcome& o);
// Whether both messages read the same: the same facts (both texts are oom_message of them), else
// the same text.
bool same_text(const Outcome& a, const Outcome& b);

struct Options {
  Config config;                 // both allocators get it (per_process_memory_fraction too)
  // The memory the pair may use. Without device_total: the host backend is a device of exactly
  // `capacity` bytes (its total memory), which runs out there; a real device is taken as it is
  // (capacity unused: nothing runs out on a device much larger than what the ops ask).
  Bytes capacity = 8 * GiB;
  // The device's total memory (cudaMemGetInfo's total) when it is larger than `capacity`: the
  // host backend is then a device of device_total bytes (a real device must have exactly this
  // total: PSut reads it from the device), and `capacity` is a cap on both sides, as PyTorch's
  // per-process fraction (docs/pytorch-allocator.md §3.6): before the first op both get
  // set_memory_fraction(fraction_for_cap(capacity, device_total)), whose cap is exactly
  // `capacity` bytes. So a real device of 80 GiB runs out, garbage-collects (a cap below 1) and
  // frees-and-retries at the same 8 GiB as the host backend, and both sides state the same total,
  // free memory and cap in their out-of-memory messages. A SetMemoryFraction op later replaces
  // the cap (a fraction of device_total, as in PyTorch). A configuration with
  // per_process_memory_fraction keeps its own cap (nothing is applied). nullopt: no cap.
  std::optional<Bytes> device_total = std::nullopt;
  bool check_invariants = true;  // sut invariants() and model check_invariants() after each op
  bool compare_stats = true;     // all 122 memory_stats() keys
  bool compare_snapshots = true; // memory_snapshot(): segments and blocks
  // The trace events each side recorded during the op (cachet/trace.h), in order: action,
  // address, size and stream of each (not the time stamp). Turns the sut's trace on.
  bool compare_trace = true;
  // Real devices run no kernels, so a recorded event completes at once, even within the call
  // that recorded it (process_events queries the events it has just recorded for the frees a
  // capture deferred, §14.7): the model is told set_events_complete_when_recorded(true), and a
  // host backend the pair makes completes every event when recorded too (HostOptions::
  // events_complete_when_recorded), so a case of a real device replays on the host. (False:
  // events wait for CompleteEvents / CompleteAllEvents.)
  bool events_complete_immediately = false;
};

// The fraction of `total` whose cap (model::memory_cap: fraction x total in double, truncated,
// as PyTorch's setMemoryFraction) is exactly `cap` bytes; 1.0 (no cap) when cap >= total.
// Throws std::invalid_argument if no fraction gives exactly `cap` (only above 2^52 bytes).
double fraction_for_cap(Bytes cap, Bytes total);

// Device calls the sut made (the backend wrapper's log); what the model's source consumes.
struct DeviceCall {
  enum class Kind : std::uint8_t { Malloc, Reserve, Map } kind;
  std::uint64_t addr = 0;
  Bytes size = 0;
  bool ok = false;  // false: the device said out of memory (or failed)
};

// Counters of what the sut's backend saw, for classifying cases.
struct DeviceCounters {
  std::uint64_t mallocs = 0, frees = 0, reserves = 0, maps = 0, unmaps = 0, oom_calls = 0;
};

// Model: model::Allocator or model::CachetPolicy; Impl: CachingAllocator (both instantiations
// live in lockstep.cpp). Options::config.policy must be the model's policy (else the
// constructor throws std::invalid_argument saying which pair the policy needs).
// An allocator with PyTorch's private-pool calls (docs/pytorch-allocator.md §14).
template <class A>
concept HasPrivatePools = requires(A& a, const A& c, PoolId id, PoolRoute route) {
  a.create_or_incref_pool(id);
  a.begin_allocate_to_pool(id, route);
  a.end_allocate_to_pool(id);
  a.release_pool(id);
  a.empty_cache(id);
  { c.pool_use_count(id) } -> std::convertible_to<int>;
};

template <class Model, class Impl = CachingAllocator>
class Lockstep {
 public:
  using ModelType = Model;
  using ImplType = Impl;
  static constexpr Policy kPolicy =
      std::is_same_v<Model, model::CachetPolicy> ? Policy::Cachet : Policy::PyTorch;
  // Whether both sides have private pools: else the pool and capture ops are Unsupported.
  static constexpr bool kPools = HasPrivatePools<Model> && HasPrivatePools<Impl>;

  // Host simulation backend of options.capacity bytes (options.device_total, when set, with
  // the capacity as a cap).
  explicit Lockstep(Options options);
  // Any backend (a real CUDA device): the model takes the device's addresses and outcomes;
  // its total and free memory are the device's (mem_get_info: the figures the sut last read in
  // the op, so both sides' out-of-memory messages state the same free bytes). With
  // options.device_total (which must equal the device's total, else std::invalid_argument) the
  // capacity is a cap on both sides.
  Lockstep(Options options, std::unique_ptr<gpu::DeviceMemory> memory);
  ~Lockstep();
  Lockstep(const Lockstep&) = delete;
  Lockstep& operator=(const Lockstep&) = delete;

  // Applies `op` to both; nullopt when they agree and every check passes, else a readable
  // report naming what differs (first line: the check that failed).
  std::optional<std::string> apply(const Op& op);
  // Applies ops in order; stops at the first divergence and prefixes "op #i <line>: ".
  std::optional<std::string> run(const std::vector<Op>& ops);

  const Outcome& last_model() const;
  const Outcome& last_sut() const;
  // The case ended at a PyTorch failure (§14.8) both sides reported; later ops are not applied.
  bool ended() const;
  // Whether tag, sleep and wake ops are applied (else apply() reports them as not supported by
  // this pair): both sides sleep and the configuration is one the lockstep runs them under
  // (docs/sleep-wake.md section 8).
  bool runs_sleep_ops() const;
  // Whether wait_stream and kernel run here (the host backend, policy:pytorch with private pools:
  // both sides keep a capture graph, docs/pytorch-allocator.md §14.10.1); elsewhere they are
  // answered Unsupported.
  bool runs_stream_ops() const;
  // The sut's snapshot the checks took after the last op, moved out (policy:cachet: free blocks'
  // requested sizes read 0, as compared); nullopt when they took none after it or it was taken.
  std::optional<Snapshot> take_checked_snapshot();
  // The front end of the pool and capture ops (what is entered, capturing, alive).
  const front_end::PoolFrontEnd& pools() const;

  std::uint32_t handle_count() const;            // allocations bound so far (live or freed)
  bool live(Handle handle) const;                 // bound and not freed
  std::uint64_t address(Handle handle) const;
  Bytes requested(Handle handle) const;           // the size asked for
  StreamId stream(Handle handle) const;           // the stream it was allocated on
  std::vector<Handle> live_handles() const;       // in increasing handle order
  // The cap set_memory_fraction put on both (nullopt: none), as model::memory_cap computes it.
  std::optional<Bytes> cap() const;
  // The device's total memory both sides use (cudaMemGetInfo's; the host backend's).
  Bytes total_memory() const;

  Model& model();
  Impl& sut();
  gpu::HostSim* sim();  // nullptr on a real device
  std::shared_ptr<gpu::HostSim> shared_sim() const;  // the same; outlives the pair
  const Options& options() const;
  const DeviceCounters& device_counters() const;

  struct State;

 private:
  std::unique_ptr<State> s_;
};

using PytorchLockstep = Lockstep<model::Allocator>;
using CachetLockstep = Lockstep<model::CachetPolicy>;

// Calls f(tag) with tag = std::type_identity<PytorchLockstep> or <CachetLockstep>, the pair
// for `policy` (a case file's configuration picks it).
template <class F>
decltype(auto) visit_policy(Policy policy, F&& f) {
  if (policy == Policy::Cachet) return f(std::type_identity<CachetLockstep>{});
  return f(std::type_identity<PytorchLockstep>{});
}

}  // namespace cachet::lockstep

// cachet/lockstep.h: the model and the production allocator, side by side, one op at a time.
//
// Shared by props/ (RapidCheck state machines) and fuzz/ (fuzz_ops): one op vocabulary, one
// runner, one replayable text form. The API is stable; add, do not change.
//
//   Op        Allocate{size, stream} | Free{handle} | RecordStream{handle, stream} |
//             CompleteEvents{stream} | EmptyCache | SetMemoryFraction{fraction}
//   handle    the index of a successful, non-null allocation, in the order they happened
//             (0, 1, 2, ...). Free/RecordStream of a handle that was freed passes its old
//             address to both allocators (both must report the same usage error, or free the
//             block that now lives at that address); a handle never handed out is skipped.
//   Lockstep  holds cachet::model::Allocator ("model") and cachet::CachingAllocator ("sut"),
//             applies one op to the sut, then to the model, and returns a divergence report
//             (nullopt = both agree): the same pointer or the same error (OOM: the same
//             message text; usage and device errors: the same kind, wording is free), the
//             same device calls (malloc / reserve / map: address, size, outcome), the same
//             trace events in the same order (action, address, size, stream: so the order of
//             cudaFree and unmap calls is compared too), the same 122 stats (flatten), the
//             same snapshot, and both implementations' invariants clean.
//
// Addresses: the sut's backend is wrapped so that every malloc / reserve / map it makes is
// logged; the model's SegmentSource hands the model exactly those addresses, in order (one
// queue per kind), and checks sizes. On the host backend the model also decides out-of-memory
// by itself, from the same capacity (a device call the sut did not make, or made with another
// size or outcome, is a divergence). On a real device the device's outcome is taken.
//
// Text form (show / parse_op), one op per line:
//   alloc <bytes> s<stream> | free h<handle> | record h<handle> s<stream> | complete s<stream>
//   | empty_cache | fraction <double>
// Blank lines and lines starting with '#' are ignored by parse_ops.
//
// A case file (.ops: props/regressions, tests/fuzz_regressions; show_case / parse_case):
//   # config: <CACHET_ALLOC_CONF string>     (absent: the defaults)
//   # capacity: <bytes>                      (absent: 8 GiB)
//   <one op per line>                        other '#' lines are comments
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "cachet/config.h"
#include "cachet/gpu/allocator.h"
#include "cachet/gpu/backend.h"
#include "cachet/gpu/host_backend.h"
#include "cachet/model/allocator.h"
#include "cachet/types.h"

namespace cachet::lockstep {

struct Allocate {
  Bytes size = 0;
  StreamId stream = 0;
  friend bool operator==(const Allocate&, const Allocate&) = default;
};
struct Free {
  std::uint32_t handle = 0;
  friend bool operator==(const Free&, const Free&) = default;
};
struct RecordStream {
  std::uint32_t handle = 0;
  StreamId stream = 0;
  friend bool operator==(const RecordStream&, const RecordStream&) = default;
};
struct CompleteEvents {  // every event recorded so far on `stream` completes
  StreamId stream = 0;
  friend bool operator==(const CompleteEvents&, const CompleteEvents&) = default;
};
struct EmptyCache {
  friend bool operator==(const EmptyCache&, const EmptyCache&) = default;
};
struct SetMemoryFraction {
  double fraction = 1.0;
  friend bool operator==(const SetMemoryFraction&, const SetMemoryFraction&) = default;
};

using Op = std::variant<Allocate, Free, RecordStream, CompleteEvents, EmptyCache, SetMemoryFraction>;

// One op as a replayable line (no newline).
std::string show(const Op& op);
// The inverse of show(); nullopt when `line` is not one op.
std::optional<Op> parse_op(std::string_view line);
// Ops one per line.
std::string show(const std::vector<Op>& ops);
// Lines of show() output; throws std::invalid_argument naming the first bad line (1-based).
std::vector<Op> parse_ops(std::string_view text);

// A replayable case: the configuration string, the device capacity and the ops.
struct Case {
  std::string config;          // CACHET_ALLOC_CONF form ("" = the defaults)
  Bytes capacity = 8 * GiB;
  std::vector<Op> ops;
};
// "# config: ...\n# capacity: ...\n" then show(ops).
std::string show_case(const Case& c);
// The inverse of show_case(); throws std::invalid_argument on a bad op line or capacity.
Case parse_case(std::string_view text);

// What one side did with one op.
struct Outcome {
  enum class Kind : std::uint8_t {
    Ok,           // non-allocating op succeeded
    Pointer,      // allocate returned `ptr` (0 for size 0)
    OutOfMemory,  // cachet::OutOfMemory; message = what()
    UsageError,   // cachet::UsageError; message = what()
    DeviceError,  // cachet::DeviceError; message = what()
    Other,        // any other exception (an invariant violation, a logic_error, ...)
    Skipped,      // the op named a handle that was never handed out: not applied
  };
  Kind kind = Kind::Ok;
  std::uint64_t ptr = 0;
  std::string message;
  friend bool operator==(const Outcome&, const Outcome&) = default;
};
std::string show(const Outcome& o);

struct Options {
  Config config;                 // both allocators get it (per_process_memory_fraction too)
  Bytes capacity = 8 * GiB;      // host backend capacity = the model's capacity
  bool check_invariants = true;  // sut invariants() and model check_invariants() after each op
  bool compare_stats = true;     // all 122 memory_stats() keys
  bool compare_snapshots = true; // memory_snapshot(): segments and blocks
  // The trace events each side recorded during the op (cachet/trace.h), in order: action,
  // address, size and stream of each (not the time stamp). Turns the sut's trace on.
  bool compare_trace = true;
  // Real devices run no kernels, so a recorded event completes at once: the model is told
  // complete_all_events() after every op. (Host backend: false; events wait for CompleteEvents.)
  bool events_complete_immediately = false;
};

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

class Lockstep {
 public:
  // Host simulation backend with options.capacity.
  explicit Lockstep(Options options);
  // Any backend (a real CUDA device): the model takes the device's addresses and outcomes;
  // its total and free memory are the device's (mem_get_info).
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

  std::uint32_t handle_count() const;            // handles handed out so far
  bool live(std::uint32_t handle) const;          // allocated and not freed
  std::uint64_t address(std::uint32_t handle) const;
  Bytes requested(std::uint32_t handle) const;    // the size asked for
  StreamId stream(std::uint32_t handle) const;    // the stream it was allocated on
  std::vector<std::uint32_t> live_handles() const;

  model::Allocator& model();
  CachingAllocator& sut();
  gpu::HostSim* sim();  // nullptr on a real device
  const Options& options() const;
  const DeviceCounters& device_counters() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace cachet::lockstep

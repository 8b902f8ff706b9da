// cachet/ops.h: the op vocabulary. One list of what a caller can do to an allocator, with one
// text form (one op per line) and one case-file form, used by every place that holds op
// sequences: props/ (RapidCheck commands, props/regressions/*.ops), the lockstep harness
// (props/harness), fuzz/ (decoded inputs, tests/fuzz_regressions/*.ops), tests/behaviour (its
// dump lines), and tools/io (io::read_ops: the op lists of PyTorch recordings).
//
// It lives in common/ because it names caller actions only (sizes, streams, handles, pools),
// needs neither model/ nor gpu/, and is shared by layers that may not depend on each other
// (tools/io uses common/ only). Running ops is each runner's business (the lockstep harness,
// the behaviour dump, cachet conform); this header only says what they are.
//
// Addressing: an op that names an allocation (free, record) names it by a handle. A list uses
// one of two addressings, never both:
//   Handles  allocations carry no name; handle k is the k-th allocation that returned memory
//            (a non-null pointer), counted from 0 in list order. What generators make (props,
//            fuzz): a shrunk or edited list needs no renumbering of the allocations.
//   Ids      every Allocate names its allocation (Allocate::id); frees and records name those
//            ids. The recordings' addressing (["a", id, size, stream] / ["f", id]): an id is
//            bound only when its allocation returns memory, so OOMs leave no gaps to count.
// Free/record of a name never bound is not applied ("skipped"); of a name whose block was
// freed, the runner passes the old address again (a usage error, or the block now there).
//
// Text form (show / parse_op), one op per line ([..] are recording keys, io::read_ops):
//   alloc <bytes> s<stream> [t<k>]     Allocate, handle-addressed           ["a", id, size, s(, t)]
//   alloc h<id> <bytes> s<stream> [t<k>]  Allocate, id-addressed
//                                      t<k>: made by thread k (absent: 0, the main thread;
//                                      docs/pytorch-allocator.md §14.10.2)
//   free h<handle>                     Free                                 ["f", id]
//   record h<handle> s<stream>         RecordStream (Tensor.record_stream)
//   complete s<stream>                 CompleteEvents: every event recorded so far on the
//                                      stream has completed (simulated devices)
//   complete_all                       CompleteAllEvents: the same for every stream
//   empty_cache                        EmptyCache                           ["e"]
//   fraction <double>                  SetMemoryFraction (%.17g: round-trips exactly)
//   use_pool p<k> [t<j>]               UseMemPoolBegin: use_mem_pool(pool k) entered  ["pb", k(, j)]
//                                      by thread j (absent: 0): the pool takes that thread's
//                                      allocations only
//   end_pool p<k>                      UseMemPoolEnd: that context left               ["pe", k]
//   release_pool p<k>                  ReleasePool: pool k's MemPool dropped          ["pr", k]
//   capture_begin g<k> s<stream> pool new|g<j>                                        ["gb", k, s, j]
//                                      CaptureBegin: graph k captures on the stream, into
//                                      a new private pool or the pool of graph j (j = -1: new)
//   capture_end g<k>                   CaptureEnd                                     ["ge", k]
//   graph_reset g<k>                   GraphReset: graph k's reset()                  ["gx", k]
//   wait_stream s<a> s<b>              WaitStream: streams[a].wait_stream(streams[b])  ["w", a, b]
//                                      while b captures, a joins b's capture
//                                      (docs/pytorch-allocator.md §14.10.1)
//   kernel s<a>                        Kernel: one kernel on the stream; a node of the ["k", a]
//                                      capture graph while the stream captures
//   cfg <text>                         SetAllocatorSettings: torch.cuda.memory.       ["cfg", text]
//                                      _set_allocator_settings(text), e.g.
//                                      graph_capture_record_stream_reuse:True (the rest
//                                      of the line; no spaces in it)
//   tag <name>                         SetTag: the current tag of later allocations (issue 24,
//                                      docs/sleep-wake.md; "default" until a list sets one)
//   sleep tags all|<t>,<t>.. backup none|<t>,<t>..
//                                      Sleep: sleep(tags, backup_tags); "all": every tag
//   wake tags all|<t>,<t>..            Wake: wake(tags)
// Streams are raw stream ids, except in io::read_ops lists: there a stream is the recording's
// stream index (io::Recording::streams maps it). What the pool and capture ops call on an
// allocator is tools/front_end's (cachet/front_end/pool_front_end.h, docs/pytorch-allocator.md
// §14.9), shared by every runner; a runner without private pools refuses them.
//
// Case file (.ops; show_case / parse_case):
//   # config: <CACHET_ALLOC_CONF string>     (absent: the defaults; "policy:cachet" picks it)
//   # capacity: <bytes>                      (absent: 8 GiB)
//   # events: when-recorded                  (absent: events complete only at complete ops)
//                                            every event completes as soon as it is recorded,
//                                            as on a real device running no kernels
//                                            (props_gpu_test's cases; docs/pytorch-allocator.md §6)
//   # device total: <bytes>                  (absent: the device holds exactly the capacity)
//                                            the device has this much memory (cudaMemGetInfo's
//                                            total) and the capacity is a cap that
//                                            set_memory_fraction puts on both sides before the
//                                            first op (props_gpu_test's cases: a real device
//                                            larger than the capacity; cachet/lockstep.h
//                                            Options::device_total)
//   <one op per line>                        blank lines and other '#' lines are comments
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "cachet/tags.h"
#include "cachet/types.h"

namespace cachet::ops {

using Handle = std::uint64_t;  // a handle (Handles addressing) or an id (Ids addressing)
using PoolIndex = std::uint64_t;   // pool k of a list (MemPool objects, in the list's numbering)
using GraphIndex = std::uint64_t;  // graph k of a list (CUDAGraph objects)

struct Allocate {
  Bytes size = 0;
  StreamId stream = 0;
  std::optional<Handle> id;  // Ids addressing: the name this allocation binds; Handles: none
  ThreadIndex thread = 0;    // the thread that allocates (0: the main thread)
  friend bool operator==(const Allocate&, const Allocate&) = default;
};
struct Free {
  Handle handle = 0;
  friend bool operator==(const Free&, const Free&) = default;
};
struct RecordStream {
  Handle handle = 0;
  StreamId stream = 0;
  friend bool operator==(const RecordStream&, const RecordStream&) = default;
};
struct CompleteEvents {  // every event recorded so far on `stream` completes
  StreamId stream = 0;
  friend bool operator==(const CompleteEvents&, const CompleteEvents&) = default;
};
struct CompleteAllEvents {
  friend bool operator==(const CompleteAllEvents&, const CompleteAllEvents&) = default;
};
struct EmptyCache {
  friend bool operator==(const EmptyCache&, const EmptyCache&) = default;
};
struct SetMemoryFraction {
  double fraction = 1.0;
  friend bool operator==(const SetMemoryFraction&, const SetMemoryFraction&) = default;
};
// Private pools and graph capture (issue 16): the ops of PyTorch 2.11 recordings that use
// torch.cuda.MemPool with use_mem_pool, and CUDAGraph capture_begin / capture_end / reset.
struct UseMemPoolBegin {
  PoolIndex pool = 0;
  ThreadIndex thread = 0;  // the thread that enters use_mem_pool (its filter: that thread)
  friend bool operator==(const UseMemPoolBegin&, const UseMemPoolBegin&) = default;
};
struct UseMemPoolEnd {
  PoolIndex pool = 0;
  friend bool operator==(const UseMemPoolEnd&, const UseMemPoolEnd&) = default;
};
struct ReleasePool {
  PoolIndex pool = 0;
  friend bool operator==(const ReleasePool&, const ReleasePool&) = default;
};
struct CaptureBegin {
  GraphIndex graph = 0;
  StreamId stream = 0;
  std::optional<GraphIndex> share;  // the graph whose pool this capture uses; none: a new pool
  friend bool operator==(const CaptureBegin&, const CaptureBegin&) = default;
};
struct CaptureEnd {
  GraphIndex graph = 0;
  friend bool operator==(const CaptureEnd&, const CaptureEnd&) = default;
};
struct GraphReset {
  GraphIndex graph = 0;
  friend bool operator==(const GraphReset&, const GraphReset&) = default;
};

// The device's side of a capture graph (issue 23, docs/pytorch-allocator.md §14.10.1): what
// graph_capture_record_stream_reuse reads through cudaStreamGetCaptureInfo.
struct WaitStream {  // streams[waiter].wait_stream(streams[waited])
  StreamId waiter = 0;
  StreamId waited = 0;
  friend bool operator==(const WaitStream&, const WaitStream&) = default;
};
struct Kernel {  // one kernel on the stream (a captured node while it captures)
  StreamId stream = 0;
  friend bool operator==(const Kernel&, const Kernel&) = default;
};
// torch.cuda.memory._set_allocator_settings(text): parsed over the current settings (§4.1).
struct SetAllocatorSettings {
  std::string text;  // CACHET_ALLOC_CONF syntax, no whitespace
  friend bool operator==(const SetAllocatorSettings&, const SetAllocatorSettings&) = default;
};

// Tags, sleep and wake (issue 24, docs/sleep-wake.md). Tag lists hold valid tags (cachet/tags.h)
// without repeats; an empty list names every tag (Sleep::tags, Wake::tags) or none
// (Sleep::backup_tags).
struct SetTag {
  Tag tag{kDefaultTag};
  friend bool operator==(const SetTag&, const SetTag&) = default;
};
struct Sleep {
  TagList tags;         // empty: every tag
  TagList backup_tags;  // empty: no backups
  friend bool operator==(const Sleep&, const Sleep&) = default;
};
struct Wake {
  TagList tags;  // empty: every tag
  friend bool operator==(const Wake&, const Wake&) = default;
};

using Op = std::variant<Allocate, Free, RecordStream, CompleteEvents, CompleteAllEvents, EmptyCache,
                        SetMemoryFraction, UseMemPoolBegin, UseMemPoolEnd, ReleasePool, CaptureBegin, CaptureEnd,
                        GraphReset, SetTag, Sleep, Wake, WaitStream, Kernel, SetAllocatorSettings>;

// The pool and capture ops (issue 16): runners without private pools refuse them.
bool is_pool_op(const Op& op);
// The tag, sleep and wake ops (issue 24): runners without sleep refuse them.
bool is_sleep_op(const Op& op);
// wait_stream and kernel (issue 23): runners without a capture graph refuse them.
bool is_stream_op(const Op& op);

enum class Addressing : std::uint8_t { Handles, Ids };
// The list's addressing: Ids when any Allocate carries an id, else Handles.
Addressing addressing(const std::vector<Op>& ops);

// One op as a replayable line (no newline).
std::string show(const Op& op);
// The inverse of show(); nullopt when `line` is not one op.
std::optional<Op> parse_op(std::string_view line);
// Ops one per line.
std::string show(const std::vector<Op>& ops);
// Lines of show() output (blank and '#' lines skipped); throws std::invalid_argument naming the
// first bad line (1-based) and what it should look like, or a list that mixes the addressings.
std::vector<Op> parse_ops(std::string_view text);

// A replayable case: the configuration string, the device capacity and the ops.
struct Case {
  std::string config;  // CACHET_ALLOC_CONF form ("" = the defaults)
  Bytes capacity = 8 * GiB;
  std::vector<Op> ops;
  // Every event completes as soon as it is recorded (a real device running no kernels: what
  // cudaEventQuery then reports, even within the call that recorded it); false: events complete
  // only at CompleteEvents / CompleteAllEvents (the host simulation).
  bool events_when_recorded = false;
  // The device's total memory when it is larger than the capacity, which is then a cap (the
  // fraction of this total whose cap is exactly `capacity` bytes); nullopt: a device of exactly
  // `capacity` bytes, no cap.
  std::optional<Bytes> device_total = std::nullopt;
};
// "# config: ...\n# capacity: ...\n" ("# events: when-recorded\n", "# device total: ...\n" when
// set) then show(ops).
std::string show_case(const Case& c);
// The inverse of show_case(); throws std::invalid_argument on a bad op line or capacity.
Case parse_case(std::string_view text);

}  // namespace cachet::ops

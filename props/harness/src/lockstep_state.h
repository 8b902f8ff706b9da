// props/harness/src/lockstep_state.h (internal to the lockstep runner): the state of one pair,
// Lockstep<Model, Impl>::State: both sides, the device log between them, the handles bound, the
// pool front end, and its members, defined by concern in three files:
//   lockstep.cpp         building the pair and applying each op to both sides (the plain ops, the
//                        pool and capture ops through the front end, wait_stream and kernel), and
//                        Lockstep's public members;
//   lockstep_sleep.cpp   tag, sleep and wake, and the backed-up contents (docs/sleep-wake.md
//                        section 8);
//   lockstep_checks.cpp  the checks after each op (compare: result, device calls, trace, stats,
//                        invariants, snapshot, use counts) and the §14.8 refusal (end_case).
// Each file instantiates the members it defines for both pairs; lockstep.cpp instantiates
// Lockstep itself.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "cachet/lockstep.h"
#include "cachet/model/memory_cap.h"
#include "cachet/op_threads.h"
#include "cachet/tags.h"
#include "device_log.h"
#include "pool_calls.h"

namespace cachet::lockstep {

using namespace detail;

// Both sides have sleep and wake (docs/sleep-wake.md section 8): model::Allocator (policy:pytorch,
// cudaMalloc segments), model::CachetPolicy (policy:cachet) and gpu/'s CachingAllocator.
template <class A>
concept HasSleep = requires(A& a, const A& c, const TagList& t) {
  a.sleep(t, t);
  a.wake(t);
  c.sleeping();
};

template <class Model, class Impl>
struct Lockstep<Model, Impl>::State {
  struct Bound {  // one allocation a handle names
    std::uint64_t addr;
    Bytes size;
    StreamId stream;
    bool live;
    Tag tag{kDefaultTag};  // the runner's current tag when it was allocated
  };

  Options opts;
  DeviceLog log;
  std::shared_ptr<gpu::HostSim> sim;
  std::unique_ptr<MirrorSource> source;
  std::unique_ptr<Impl> sut;
  std::unique_ptr<Model> model;
  Outcome last_model, last_sut;
  std::map<Handle, Bound> bound;              // handle (or id) -> its allocation
  std::map<std::uint64_t, Handle> live_by_addr;
  std::uint32_t bindings = 0;                 // allocations bound so far
  double fraction = 1.0;                      // the fraction both sides accepted last
  Bytes total = 0;                            // the model's total memory
  Bytes over_cap_ceiling = 0;  // reserved when the cap was last lowered below it (0: none)
  std::size_t model_trace_mark = 0;  // the model's trace events before the current op
  // The pool and capture ops: one front end, its calls made on both sides.
  OpThreads threads;  // the op list's threads (t<k>): declared before the calls that use it
  BothSides<Model, Impl> calls{model, sut, threads, sim};
  front_end::PoolFrontEnd pools{calls};
  bool ended = false;  // a PyTorch failure (§14.8) ended the case
  std::set<ThreadIndex> threads_used;  // the op threads other than the runner's
  // The runner's thread starts each case, and ends it, at the tag "default" (cachet/tags.h).
  struct DefaultTag {
    DefaultTag() { set_current_tag(kDefaultTag); }
    ~DefaultTag() { set_current_tag(kDefaultTag); }
  } default_tag;
  SutState sut_before;  // the sut's state after the previous op (the §14.8 check of one-call ops)

  void build(std::unique_ptr<gpu::DeviceMemory> memory, bool host);

  std::optional<Bytes> cap() const { return model::memory_cap(fraction, total); }

  // Marks whatever handle lives at `addr` as freed.
  void freed(std::uint64_t addr) {
    auto it = live_by_addr.find(addr);
    if (it == live_by_addr.end()) return;
    bound[it->second].live = false;
    live_by_addr.erase(it);
  }

  std::optional<std::string> apply(const Op& op);

  // Where wait_stream and kernel run: the host backend's simulated capture graph beside the
  // model's (policy:pytorch with private pools).
  bool stream_ops_run() const {
    if constexpr (kPools && HasCaptureGraph<Model>) return sim != nullptr;
    return false;
  }

  // wait_stream and kernel (docs/pytorch-allocator.md §14.10.1): the simulated device's graph and
  // the model's. A wait the device refuses (a capturing stream waiting on one outside its capture,
  // two captures joined) is the user's error on both sides.
  std::optional<std::string> apply_stream_op(const Op& op);

  // Where tag, sleep and wake ops run: both sides sleep, under cachet_sleep:True (docs/sleep-wake.md
  // section 8).
  bool sleep_runs() const {
    if constexpr (HasSleep<Model> && HasSleep<Impl>)
      return opts.config.sleep;
    else
      return false;
  }

  // tag, sleep, wake (docs/sleep-wake.md): the tag is every op thread's current tag (the model
  // allocates on the runner's thread); sleep's outcome carries the bytes given back; both sides'
  // out-of-memory texts are cachet's own (not PyTorch's), so only their kind is compared.
  std::optional<std::string> apply_sleep_op(const Op& op);

  // The backed-up contents survive (docs/sleep-wake.md section 8; the host backend keeps
  // contents): before each sleep every awake live allocation gets a pattern of its own in its
  // first and last 4 KiB; those of a backed-up tag must read the same after every wake that woke
  // them. (One that slept without backup has undefined contents: its pattern is forgotten.)
  std::map<Handle, unsigned char> patterns;
  static constexpr Bytes kPatternBytes = 4096;
  void mark_contents(const TagList& backup_tags);
  std::optional<std::string> check_contents();

  // A pool or capture op through the front end; the first call that did not succeed alike on
  // both sides is the op's outcome on each side.
  std::optional<std::string> apply_pool_op(const Op& op);

  // The model says PyTorch 2.11 fails here (§14.8): the sut must have refused naming the rule,
  // changing nothing, and the case ends.
  std::optional<std::string> end_case(const SutState& before);

  // The sut's invariants() violations. Lowering the fraction below what is reserved leaves
  // reserved over the cap (PyTorch frees nothing then); [INV-CAP-1] (and [INV-SLEEP-5]) is then
  // tolerated while reserved does not grow.
  std::vector<std::string> sut_violations();

  // Every pool the front end named: the same use count on both sides, or unknown to both.
  std::optional<std::string> compare_use_counts();

  // The op's trace events, in order (trace.h: alloc, free_requested, free_completed,
  // segment_alloc/free/map/unmap, oom): the first that differs, with both sides' lists.
  std::optional<std::string> compare_trace();

  // The snapshots after an op: by digest, or in full on the full-check ops (compare() makes
  // every kFullCheckEvery-th op one, the first included) and where the digests differ.
  static constexpr std::uint64_t kFullCheckEvery = 16;
  std::uint64_t checks = 0;  // compare() calls so far
  bool full_check = true;    // this op's checks are the full ones
  std::optional<std::string> compare_snapshots();
  // The sut's snapshot compare_snapshots() took, and the apply() it was taken in (ops_applied).
  std::optional<Snapshot> checked_snapshot;
  std::uint64_t checked_snapshot_op = 0;
  std::uint64_t ops_applied = 0;  // apply() calls so far

  std::optional<std::string> compare();
};

}  // namespace cachet::lockstep

// props/tests/props.h: what the property binary's parts share (props_main.cpp: the properties
// and main; props_checks.cpp: one step and the named checks; props_commands.cpp and
// props_pools.cpp: the RapidCheck commands and generators). See props/README.md.
#pragma once

#include <rapidcheck.h>
#include <rapidcheck/state.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "cachet/config.h"
#include "cachet/lockstep.h"
#include "cachet/model/memory_cap.h"
#include "cachet/model/sizes.h"
#include "cachet/snapshot.h"
#include "cachet/stats.h"

#ifdef CACHET_PROPS_CUDA
#include <cuda_runtime.h>

#include "cachet/gpu/cuda_backend.h"
#endif

namespace cachet {
// RapidCheck prints a case's Config as its canonical one-line form.
inline void showValue(const Config& c, std::ostream& os) { os << "'" << to_string(c) << "'"; }
}  // namespace cachet

namespace cachet::props {

// Ops of threads 1-2 (docs/pytorch-allocator.md §14.10.2) on the host backend; props_gpu_test
// keeps to the main thread until gpu/'s CUDA backends are tried from fresh OS threads.
#ifdef CACHET_PROPS_CUDA
inline constexpr bool kDrawThreads = false;
#else
inline constexpr bool kDrawThreads = true;
#endif
// wait_stream and kernel (docs/pytorch-allocator.md §14.10.1): the lockstep runs them on the host
// backend's simulated capture graph only (props_pools.cpp StreamCmd).
#ifdef CACHET_PROPS_CUDA
inline constexpr bool kDrawStreamOps = false;
#else
inline constexpr bool kDrawStreamOps = true;
#endif

using lockstep::Handle;
using lockstep::Op;

// The pair the configuration's policy picks (cachet/lockstep.h): PytorchLockstep
// (model::Allocator) or CachetLockstep (model::CachetPolicy), with the same CachingAllocator.
class Lockstep {
 public:
  template <class... A>
  explicit Lockstep(Policy policy, A&&... a) {
    if (policy == Policy::Cachet) ls_ = std::make_unique<lockstep::CachetLockstep>(std::forward<A>(a)...);
    else ls_ = std::make_unique<lockstep::PytorchLockstep>(std::forward<A>(a)...);
  }
  template <class F>
  decltype(auto) with(F&& f) const {
    return std::visit([&](const auto& p) -> decltype(auto) { return f(*p); }, ls_);
  }
  std::optional<std::string> apply(const Op& op) { return with([&](auto& l) { return l.apply(op); }); }
  const lockstep::Outcome& last_sut() const { return with([](auto& l) -> const lockstep::Outcome& { return l.last_sut(); }); }
  CachingAllocator& sut() const { return with([](auto& l) -> CachingAllocator& { return l.sut(); }); }
  const lockstep::DeviceCounters& device_counters() const {
    return with([](auto& l) -> const lockstep::DeviceCounters& { return l.device_counters(); });
  }
  std::uint32_t handle_count() const { return with([](auto& l) { return l.handle_count(); }); }
  std::uint64_t address(Handle h) const { return with([&](auto& l) { return l.address(h); }); }
  Bytes requested(Handle h) const { return with([&](auto& l) { return l.requested(h); }); }
  StreamId stream(Handle h) const { return with([&](auto& l) { return l.stream(h); }); }
  std::vector<Handle> live_handles() const { return with([](auto& l) { return l.live_handles(); }); }
  std::optional<Bytes> cap() const { return with([](auto& l) { return l.cap(); }); }
  Bytes total_memory() const { return with([](auto& l) { return l.total_memory(); }); }
  bool ended() const { return with([](auto& l) { return l.ended(); }); }
  const front_end::PoolFrontEnd& pools() const {
    return with([](auto& l) -> const front_end::PoolFrontEnd& { return l.pools(); });
  }
  // policy:pytorch's pair only (model::CachetPolicy keeps its peaks).
  model::Allocator* pytorch_model() const {
    auto* p = std::get_if<std::unique_ptr<lockstep::PytorchLockstep>>(&ls_);
    return p ? &(*p)->model() : nullptr;
  }

 private:
  std::variant<std::unique_ptr<lockstep::PytorchLockstep>, std::unique_ptr<lockstep::CachetLockstep>> ls_;
};

// ------------------------------------------------------------------------------- the checks

// Every named check (props_checks.cpp); CACHET_PROPS_CHECKS selects a subset.
extern const std::vector<std::string> kChecks;
std::set<std::string> split_list(const char* env);
const std::set<std::string>& enabled_checks();
bool on(const char* check);

// --replay: a failed check throws this instead of RC_FAIL (no RapidCheck run is in progress).
struct ReplayFailure {
  std::string message;
};
inline bool g_replaying = false;
// CACHET_PROPS_CASE_OUT: written at every failure (shrinking ends on the smallest failing
// case, so the last write is the shrunk one); frozen once a property has failed.
inline bool g_case_frozen = false;

// ------------------------------------------------------------------------------- coverage

struct Coverage {
  bool oversize = false, gc = false, retry = false, oom = false, deferred_free = false, exp_map = false,
       exp_unmap = false;
  // Private pools (cases that generate pool ops): a block handed out from a private pool's
  // segment; a capture begun; a PyTorch failure (docs/pytorch-allocator.md §14.8) that ended the case.
  bool pool_alloc = false, capture = false, pytorch_failure = false;
  // graph_capture_record_stream_reuse:True: an allocation during a capture that first completed
  // the free of a block freed during it (docs/pytorch-allocator.md §14.10.1).
  bool capture_reuse = false;
  // Sleep and wake (cases under cachet_sleep:True, docs/sleep-wake.md): sleeps and wakes that
  // returned, frees of sleeping blocks, wakes that ran out of memory (the sleep.* counts).
  std::size_t sleeps = 0, wakes = 0, frees_while_asleep = 0, wake_ooms = 0;
};
struct CoverageTotals {
  std::size_t cases = 0, oversize = 0, gc = 0, retry = 0, oom = 0, deferred_free = 0, exp_map = 0, exp_unmap = 0;
  std::size_t pool_cases = 0, pool_alloc = 0, capture = 0, pytorch_failure = 0, capture_reuse = 0;
  // Over the cases that drew sleep ops: the cases with at least one of each, and the totals.
  std::size_t sleep_cases = 0, slept = 0, woke = 0, freed_asleep = 0, wake_oomed = 0;
  std::size_t sleeps = 0, wakes = 0, frees_while_asleep = 0, wake_ooms = 0;
  void add(const Coverage& c, bool pools, bool sleep = false) {
    if (sleep) {
      ++sleep_cases;
      slept += c.sleeps > 0;
      woke += c.wakes > 0;
      freed_asleep += c.frees_while_asleep > 0;
      wake_oomed += c.wake_ooms > 0;
      sleeps += c.sleeps;
      wakes += c.wakes;
      frees_while_asleep += c.frees_while_asleep;
      wake_ooms += c.wake_ooms;
    }
    if (pools) {
      ++pool_cases;
      pool_alloc += c.pool_alloc;
      capture += c.capture;
      pytorch_failure += c.pytorch_failure;
      capture_reuse += c.capture_reuse;
    }
    ++cases;
    oversize += c.oversize;
    gc += c.gc;
    retry += c.retry;
    oom += c.oom;
    deferred_free += c.deferred_free;
    exp_map += c.exp_map;
    exp_unmap += c.exp_unmap;
  }
};
inline CoverageTotals g_totals;

// ------------------------------------------------------------------------------- state

struct Slot {
  Bytes size = 0;
  int stream = 0;
  bool freed = false;
};

// RapidCheck's model: what the commands may name. A slot is one Allocate command; the
// allocation it made (if any) is the lockstep handle the Sut keeps for it.
// The pool and capture ops' view of the model (props_pools.cpp): the MemPools the commands made
// and entered, the graphs they began and ended (k as the ops name them; streams as indices).
struct PoolsModel {
  bool enabled = false;  // this case generates pool and capture ops
  std::set<int> mempools, in_use;
  struct Graph {
    int stream = 0;
    bool ended = false;
    int pool = 0;  // the graph whose capture made the pool it captures into
  };
  std::map<int, Graph> graphs;
  int next_mempool = 0, next_graph = 0;
  // Streams that joined a capture by wait_stream (stream -> graph), as far as the generator can
  // tell (a wait the device refuses is not undone here): the record_stream commands during a
  // capture lean on them. Only generation reads it, never a check.
  std::map<int, int> joined;
};

// RapidCheck's model: what the commands may name. A slot is one Allocate command; the
// allocation it made (if any) is the lockstep handle the Sut keeps for it.
// The sleep ops' view (cases under cachet_sleep:True where the pair runs them): the tag the
// next allocations get (SetTag; the names of kTagNames).
struct SleepModel {
  bool enabled = false;
  std::string tag{kDefaultTag};
};
inline const std::vector<std::string> kTagNames{"default", "weights", "kv_cache"};

struct PModel {
  Config config;
  SleepModel sleep;
  std::vector<Slot> slots;
  PoolsModel pools;
  bool has_live() const {
    return std::any_of(slots.begin(), slots.end(), [](const Slot& s) { return !s.freed; });
  }
};

constexpr int kStreams = 4;

// Whether the lockstep runs tag, sleep and wake for `c` (props/harness/src/lockstep.cpp: both
// sides have them there; elsewhere it answers Unsupported).
inline bool sleep_supported(const Config& c) {
  return c.sleep;
}

// Whether the pair of `policy` has private pools (both its model and gpu/ side).
inline bool pools_supported(Policy policy) {
  return policy == Policy::Cachet ? lockstep::CachetLockstep::kPools : lockstep::PytorchLockstep::kPools;
}

struct PendingBlock {
  std::uint64_t addr = 0;
  Bytes size = 0;
  std::set<StreamId> streams;  // streams whose events have not completed
};

class PSut {
 public:
  // events_when_recorded: every event completes when recorded (a case file's "# events:
  // when-recorded", what a real device does; always so in props_gpu_test).
  // device_total: a device of that many bytes with `capacity` as a cap on both sides (a case
  // file's "# device total:", lockstep::Options::device_total); nullopt: a device of `capacity`
  // bytes. props_gpu_test always runs so, with the device's own total: the real device (80 GiB
  // or more) runs out, collects garbage and frees-and-retries at the same 8 GiB as the host.
  explicit PSut(const Config& c, Bytes capacity = 8 * GiB, bool events_when_recorded = false,
                std::optional<Bytes> device_total = std::nullopt)
      : config_(c), capacity_(capacity), events_when_recorded_(events_when_recorded), device_total_(device_total) {
#ifdef CACHET_PROPS_CUDA
    events_when_recorded_ = true;
#endif
    reset();
  }

  void reset() {
    lockstep::Options o;
    o.config = config_;
    o.capacity = capacity_;
    o.events_complete_immediately = events_when_recorded_;
#ifdef CACHET_PROPS_CUDA
    // The backend CachingAllocator::for_cuda_device picks: the VMM calls for expandable segments,
    // policy:cachet and cachet_sleep (docs/sleep-wake.md section 6), cudaMalloc otherwise.
    const bool vmm = config_.expandable_segments || config_.policy == Policy::Cachet || config_.sleep;
    std::unique_ptr<gpu::DeviceMemory> mem = vmm ? gpu::make_device_memory<gpu::CudaVmmBackend>(0)
                                                 : gpu::make_device_memory<gpu::CudaRuntimeBackend>(0);
    // The device's total: the capacity becomes a cap of the device (lockstep::Options::device_total).
    const auto info = mem->mem_get_info();
    if (!info.is_ok()) {
      std::fprintf(stderr, "props_gpu_test: cudaMemGetInfo failed on device 0: cannot cap the device at %llu bytes\n",
                   static_cast<unsigned long long>(capacity_));
      std::exit(1);
    }
    device_total_ = info.value.total;
    o.device_total = device_total_;
    ls_ = std::make_unique<Lockstep>(config_.policy, o, std::move(mem));
    if (streams_.empty()) {
      streams_.push_back(0);
      for (int i = 1; i < kStreams; ++i) {
        cudaStream_t s{};
        cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
        streams_.push_back(reinterpret_cast<StreamId>(s));
      }
    }
#else
    o.device_total = device_total_;
    ls_ = std::make_unique<Lockstep>(config_.policy, o);
    streams_.clear();
    for (int i = 0; i < kStreams; ++i) streams_.push_back(static_cast<StreamId>(i));
#endif
    slot_handle_.clear();
    applied_.clear();
    pending_.clear();
    recorded_.clear();
    recorded_in_capture_.clear();
    pools_inexact = false;
    ceiling_ = 0;
  }
  // Starts the commands again on the same allocator: slots renumber from 0.
  void restart_slots() { slot_handle_.clear(); }

  StreamId stream(int i) const { return streams_.at(static_cast<std::size_t>(i)); }
  const Config& config() const { return config_; }
  bool cachet() const { return config_.policy == Policy::Cachet; }
  // A check that speaks of policy:pytorch's rules only (segments per stream, splitting and
  // coalescing, round_size) is not run under policy:cachet, whose rules are R1-R9
  // (gpu/include/cachet/gpu/policy_cachet.h): adjacent free blocks of two streams stay apart,
  // one reservation serves every stream, blocks are rounded to 512 B.
  bool applies(const char* check) const {
    if (!on(check)) return false;
    if (!cachet()) return true;
    const std::string c = check;
    return c != "coalescing" && c != "split-limit" && c != "stream" && c != "replay";
  }
  // The block size a request gets: round_size (policy:pytorch), 512-byte multiples (R1).
  Bytes rounded(Bytes request) const {
    return cachet() ? (request + kMinBlockSize - 1) / kMinBlockSize * kMinBlockSize
                    : model::round_size(config_, request);
  }
  Lockstep& ls() { return *ls_; }
  Coverage& coverage() { return cov_; }
  const std::vector<Op>& applied() const { return applied_; }

  std::optional<Handle> handle(std::size_t slot) const {
    return slot < slot_handle_.size() ? slot_handle_[slot] : std::nullopt;
  }

  // A pool op the model thought valid failed (props_pools.cpp): the model's pool state is no
  // longer the front end's.
  bool pools_inexact = false;

  // Applies one op and every enabled check; RC_FAILs naming the check.
  void step(const Op& op, std::optional<std::size_t> new_slot = std::nullopt);

  // The fraction of the device that a FractionCmd's fraction of the capacity means: the same
  // fraction on a device of `capacity` bytes (the host props, unchanged); with a device_total,
  // the fraction of that total whose cap is the same bytes as the fraction of the capacity
  // (model::memory_cap: truncated), and 1.0 the capacity itself (the cap is never lifted: the
  // device beyond the capacity does not run out).
  double device_fraction(double of_capacity) const {
    if (!device_total_) return of_capacity;
    const Bytes cap = model::memory_cap(of_capacity, capacity_).value_or(capacity_);
    return lockstep::fraction_for_cap(cap, ls_->total_memory());
  }

  // Frees every live allocation, completes every event, empties the cache.
  void drain() {
    for (Handle h : ls_->live_handles()) step(lockstep::Free{h});
    for (int i = 0; i < kStreams; ++i) step(lockstep::CompleteEvents{stream(i)});
    step(lockstep::SetMemoryFraction{device_fraction(1.0)});
    step(lockstep::EmptyCache{});
  }

  // The ops applied so far as a case file (props/regressions/*.ops).
  std::string case_file() const {
    return lockstep::show_case({to_string(config_), capacity_, applied_, events_when_recorded_, device_total_});
  }

  [[noreturn]] void fail(const std::string& check, const std::string& detail) const {
    std::ostringstream m;
    m << "property failed: " << check << "\n" << detail << "\nconfig: '" << to_string(config_)
      << "'\nlockstep replay (" << applied_.size()
      << " ops; a case file: save it as props/regressions/<name>.ops):\n" << case_file();
    if (g_replaying) throw ReplayFailure{m.str()};
    if (const char* out = std::getenv("CACHET_PROPS_CASE_OUT"); out && *out && !g_case_frozen)
      std::ofstream(out) << "# props: property failed: " << check << "\n" << case_file();
    RC_FAIL(m.str());
  }

 private:
  void structural_checks(const Snapshot& snap, const DeviceStats& st);
  void sleep_checks(const lockstep::Outcome& out, const SleepStats& ss, const DeviceStats& st);
  void alloc_checks(const lockstep::Allocate& a, std::uint64_t ptr, const Snapshot& snap, bool new_device_memory,
                    bool synced);

  Config config_;
  Bytes capacity_;
  bool events_when_recorded_;
  std::optional<Bytes> device_total_;
  std::unique_ptr<Lockstep> ls_;
  std::vector<StreamId> streams_;
  std::vector<std::optional<Handle>> slot_handle_;
  std::vector<Op> applied_;
  std::vector<PendingBlock> pending_;
  std::map<Handle, std::set<StreamId>> recorded_;  // handle -> streams used on
  // handle -> streams used on while a capture or use_mem_pool was under way: a free during one
  // drops them from the events it waits for (§14.7)
  std::map<Handle, std::set<StreamId>> recorded_in_capture_;
  Bytes ceiling_ = 0;  // reserved when the cap was last lowered below it
  Coverage cov_;
};

std::string hex(std::uint64_t v);

// ------------------------------------------------------------------------------- commands

using Cmd = rc::state::Command<PModel, PSut>;

// The policy the properties run (props_test --policy pytorch|cachet).
inline Policy g_policy = Policy::PyTorch;
// The device the properties' cases run on (props_test --device-total, --events-when-recorded):
// nullopt, the host backend of 8 GiB; else a host backend of that many bytes with the 8 GiB as a
// cap (PSut's device_total: what props_gpu_test does on the real device).
inline std::optional<Bytes> g_device_total;
inline bool g_events_when_recorded = false;

// props_commands.cpp: a valid configuration; the next command for a model state.
rc::Gen<Config> gen_config();
rc::Gen<std::shared_ptr<const Cmd>> gen_command(const PModel& m);
// props_commands.cpp: a tag, sleep or wake command (m.sleep.enabled); run inside gen_command's
// rc::gen::exec.
std::shared_ptr<const Cmd> gen_sleep_command(const PModel& m);
// props_pools.cpp: a pool or capture command, valid for the model or (now and then) one both
// sides must refuse; run inside gen_command's rc::gen::exec.
std::shared_ptr<const Cmd> gen_pool_command(const PModel& m);

}  // namespace cachet::props

// The fuzz_cachet_policy interpreter (cachet_interp.h; format in fuzz/README.md).
// § numbers refer to docs/pytorch-allocator.md.
#include "cachet_interp.h"

#include CACHET_FDP_HEADER

#include <algorithm>
#include <cstdio>
#include <exception>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <type_traits>
#include <vector>

#include "cachet/config.h"
#include "cachet/errors.h"
#include "cachet/gpu/allocator.h"
#include "cachet/gpu/host_backend.h"
#include "cachet/gpu/policy_cachet.h"
#include "cachet/lockstep.h"
#include "pool_ops.h"

namespace cachet::fuzz {
namespace {

constexpr Bytes kPage = gpu::kCachetPageSize;
constexpr int kMaxOps = 600;

struct Mix {
  std::uint64_t cases = 0, ops = 0, allocs = 0, ooms = 0, frees = 0, recorded_frees = 0, completes = 0,
                empty_caches = 0, fractions = 0, fractions_below_live = 0, capped_cases = 0, pool_cases = 0,
                pool_ops = 0, pool_refused = 0, generator_seeds_dropped = 0;
};
Mix g_mix;

Bytes align_up(Bytes n, Bytes a) { return (n + a - 1) / a * a; }

// Sizes near the boundaries that matter to the policy: 512 B rounding, the 1 MiB small limit,
// 2 MiB pages, PyTorch's 10 MiB / 20 MiB segment sizes.
const Bytes kBoundaries[] = {1,
                             511,
                             512,
                             513,
                             4096,
                             kSmallSize - 512,
                             kSmallSize - 1,
                             kSmallSize,
                             kSmallSize + 1,
                             kSmallSize + 512,
                             kPage - 512,
                             kPage - 1,
                             kPage,
                             kPage + 1,
                             kPage + 512,
                             2 * kPage - 512,
                             2 * kPage,
                             3 * kPage + 1,
                             10 * MiB,
                             10 * MiB + 1,
                             20 * MiB,
                             64 * MiB,
                             128 * MiB - 512,
                             256 * MiB};

Bytes pick_size(FuzzedDataProvider& in, unsigned cls) {
  switch (cls) {
    case 0: return kBoundaries[in.ConsumeIntegralInRange<std::size_t>(0, std::size(kBoundaries) - 1)];
    case 1: return in.ConsumeIntegralInRange<Bytes>(1, 512);
    case 2:
    case 3: return in.ConsumeIntegralInRange<Bytes>(513, kSmallSize);
    case 4: return in.ConsumeIntegralInRange<Bytes>(kSmallSize + 1, 16 * MiB);
    case 5: return in.ConsumeIntegralInRange<Bytes>(16 * MiB, 256 * MiB);
    case 6: {  // k pages, +- up to 512 B
      const Bytes k = in.ConsumeIntegralInRange<Bytes>(1, 32);
      const int d = in.ConsumeIntegralInRange<int>(-512, 512);
      return static_cast<Bytes>(static_cast<std::int64_t>(k * kPage) + d);
    }
    default: return in.ConsumeIntegralInRange<Bytes>(1, 4 * kPage);
  }
}

const double kFractions[] = {0.0, 0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0};
const Bytes kCapacities[] = {256 * MiB, 1 * GiB, 4 * GiB, 64 * MiB};
// Pool mode (configuration byte bits 2-3 = 3): three streams, and selectors [88, 120) are the pool
// and capture ops (decode_pool_op, src/pool_ops.h) instead of allocations.
constexpr unsigned kPoolModeStreams = 3;
constexpr std::uint8_t kPoolFirst = 88, kPoolEnd = 120;
// The default generator's seed and offset (8 bytes each, 512 rounded) that graph captures
// allocate through the front end (cachet/front_end/pool_front_end.h), and a seed it may still
// hold from a registration that failed: blocks the op sequence never sees as handles.
constexpr int kGeneratorBlocks = 3;

struct Failure {
  std::string what;
};

class Run {
 public:
  std::string ops() const { return ops::show_case(case_); }

  std::string go(const std::uint8_t* data, std::size_t size) {
    FuzzedDataProvider in(data, size);
    const std::uint8_t c = in.ConsumeIntegral<std::uint8_t>();
    capacity_ = kCapacities[c & 3];
    pool_mode_ = ((c >> 2) & 3) == 3;
    nstreams_ = pool_mode_ ? kPoolModeStreams : 1 + ((c >> 2) & 3) % 3;
    const bool capped = (c & 0x80) != 0;
    const double fraction = kFractions[1 + ((c >> 4) & 7) % 7];  // never 0 at the start
    gpu::HostOptions o;
    o.capacity = capacity_;
    res_lo_ = o.first_address + (Bytes{1} << 44);  // HostSim's first reservation
    res_hi_ = res_lo_ + align_up(std::max(capacity_, kPage) * gpu::kCachetReserveFactor, kPage);
    Config cfg;
    cfg.policy = Policy::Cachet;
    cfg.validate = true;
    case_.config = to_string(cfg);
    case_.capacity = capacity_;
    ++g_mix.cases;
    if (pool_mode_) ++g_mix.pool_cases;
    try {
      lockstep::Options lo;
      lo.config = cfg;
      lo.capacity = capacity_;
      ls_ = std::make_unique<lockstep::CachetLockstep>(lo);
      sim_ = ls_->shared_sim();
      stats_ = sut().stats();
      if (capped) {
        ++g_mix.capped_cases;
        apply(ops::SetMemoryFraction{fraction});
        cap_ = static_cast<Bytes>(fraction * static_cast<double>(capacity_));
      }
      for (int n = 0; n < kMaxOps && in.remaining_bytes() > 0 && !ls_->ended(); ++n) {
        ++g_mix.ops;
        step(in);
        check();
      }
      // A case both sides ended where PyTorch 2.11 itself fails (§14.8): nothing more applies.
      if (ls_->ended()) return {};
      // Teardown: captures and use_mem_pool ended, everything freed, every event completed, the
      // graphs reset and the MemPools released, and empty_cache gives every page back.
      using GS = front_end::PoolFrontEnd::GraphState;
      for (const auto k : ls_->pools().graphs(GS::Capturing)) apply(ops::CaptureEnd{k});
      for (const auto k : ls_->pools().mempools_in_use()) apply(ops::UseMemPoolEnd{k});
      for (auto& [p, l] : live_) apply(ops::Free{l.handle});
      live_.clear();
      live_bytes_ = live_req_ = 0;
      apply(ops::CompleteAllEvents{});
      for (const auto k : ls_->pools().graphs(GS::Captured)) apply(ops::GraphReset{k});
      for (const auto k : ls_->pools().mempools_alive()) apply(ops::ReleasePool{k});
      drop_generator_seed();
      apply(ops::EmptyCache{});
      if (sut().stats().reserved_bytes[0].current != 0 || sim_->used() != 0)
        throw Failure{"teardown: reserved " + std::to_string(sut().stats().reserved_bytes[0].current) +
                      " B, device used " + std::to_string(sim_->used()) + " B after freeing all and empty_cache"};
      ls_.reset();
      if (sim_->used() != 0) throw Failure{"destructor left device memory mapped"};
    } catch (const Failure& f) {
      return report(f.what);
    } catch (const InvariantViolation& e) {
      return report(std::string("invariant: ") + e.what());
    } catch (const std::exception& e) {
      return report(std::string("unexpected exception: ") + e.what());
    }
    return {};
  }

 private:
  struct Live {
    Bytes size = 0;  // requested
    StreamId stream = 0;
    ops::Handle handle = 0;  // the lockstep handle (cachet/ops.h: Handles addressing)
  };
  struct Pending {
    Bytes size = 0;  // rounded
    std::set<StreamId> left;
  };

  CachingAllocator& sut() { return ls_->sut(); }

  // Teardown, after every graph was reset: the default generator may still hold a seed from a
  // registration whose offset allocation failed (out of memory; cachet/front_end/pool_front_end.h),
  // a live 512 B block no handle names, in the pool that was active then (a released MemPool's
  // live block stays allocated, R11). PyTorch drops it only at the generator's next
  // registration, which allocates its own seed first: so capture a fresh graph (seed and offset
  // in the default pool, no pool is active now, every byte is free), end it and reset it, which
  // frees the old seed, then the new seed and offset.
  void drop_generator_seed() {
    if (!pool_mode_ || sut().stats().allocation[0].current == 0) return;
    ++g_mix.generator_seeds_dropped;
    if (cap_) {  // the cap may be 0 (kFractions): two 512 B blocks need one page under it
      apply(ops::SetMemoryFraction{1.0});
      cap_.reset();
    }
    using GS = front_end::PoolFrontEnd::GraphState;
    std::optional<std::uint64_t> fresh;
    for (std::uint64_t k = 0; k < kPoolKs && !fresh; ++k)
      if (ls_->pools().graph(k) == GS::None) fresh = k;
    if (!fresh) throw Failure{"teardown: no graph left to register with the generator"};
    using K = lockstep::Outcome::Kind;
    if (apply(ops::CaptureBegin{*fresh, 1, std::nullopt}).kind != K::Ok ||
        apply(ops::CaptureEnd{*fresh}).kind != K::Ok || apply(ops::GraphReset{*fresh}).kind != K::Ok)
      throw Failure{"teardown: capturing graph " + std::to_string(*fresh) +
                    " to drop the generator's seed failed: " + lockstep::show(ls_->last_sut())};
  }

  // One op on both sides (policy:cachet and model::CachetPolicy, cachet/lockstep.h): any
  // divergence, failed check or exception other than OutOfMemory is a failure.
  const lockstep::Outcome& apply(const ops::Op& op) {
    case_.ops.push_back(op);
    const auto syncs = stats_.num_sync_all_streams;
    if (auto d = ls_->apply(op)) throw Failure{"lockstep with model::CachetPolicy: " + *d};
    stats_ = sut().stats();
    // A wait for every event (empty_cache, an allocation's retry, a MemPool's deletion) frees
    // every pending block (R7, R9).
    if (stats_.num_sync_all_streams != syncs) pending_.clear();
    const lockstep::Outcome& o = ls_->last_sut();
    using K = lockstep::Outcome::Kind;
    if (ops::is_pool_op(op)) {
      // Pool and capture ops may be refused (an argument byte >= 0x80 names any MemPool or
      // graph) or end the case (§14.8); both sides did the same (the lockstep compared them).
      ++(o.kind == K::Ok ? g_mix.pool_ops : g_mix.pool_refused);
      if (o.kind == K::OutOfMemory) ++g_mix.ooms, ++ooms_;  // the generator's seed or offset
      if (o.kind == K::Ok || o.kind == K::UsageError || o.kind == K::OutOfMemory || o.kind == K::PyTorchFailure)
        return o;
      throw Failure{ops::show(op) + ": " + lockstep::show(o)};
    }
    if (o.kind != K::Ok && o.kind != K::Pointer && o.kind != K::OutOfMemory &&
        !(o.kind == K::PyTorchFailure && pool_mode_))
      throw Failure{ops::show(op) + ": " + lockstep::show(o)};
    return o;
  }

  std::string report(const std::string& what) const {
    return "fuzz_cachet_policy: " + what + "\n--- the case (replay: props_test --replay FILE.ops) ---\n" +
           ops::show_case(case_) + "--- end of case ---\n";
  }

  void erase_live(std::map<std::uint64_t, Live>::iterator it) {
    live_bytes_ -= static_cast<std::int64_t>(align_up(it->second.size, gpu::kCachetAlign));
    live_req_ -= static_cast<std::int64_t>(it->second.size);
    live_.erase(it);
  }

  // The live handle at index i of the address-ordered live blocks.
  std::map<std::uint64_t, Live>::iterator nth_live(FuzzedDataProvider& in) {
    auto it = live_.begin();
    std::advance(it, in.ConsumeIntegralInRange<std::size_t>(0, live_.size() - 1));
    return it;
  }

  void step(FuzzedDataProvider& in) {
    const std::uint8_t sel = in.ConsumeIntegral<std::uint8_t>();
    if (pool_mode_ && sel >= kPoolFirst && sel < kPoolEnd) {
      apply(decode_pool_op(in, ls_->pools(), sel - kPoolFirst));
      return;
    }
    if (sel < 120 || live_.empty()) {
      const StreamId s = 1 + sel % nstreams_;
      const Bytes size = pick_size(in, (sel >> 2) & 7);
      alloc(size, s);
    } else if (sel < 190) {
      auto it = nth_live(in);
      const ops::Handle h = it->second.handle;
      erase_live(it);
      ++g_mix.frees;
      apply(ops::Free{h});
    } else if (sel < 205) {
      // record_stream on one or two use streams, then free: pending until their events complete.
      auto it = nth_live(in);
      const auto p = it->first;
      const Live l = it->second;
      Pending pd{align_up(l.size, gpu::kCachetAlign), {}};
      const int uses = 1 + (sel & 1);
      for (int i = 0; i < uses; ++i) {
        const StreamId u = in.ConsumeIntegralInRange<StreamId>(1, 5);
        apply(ops::RecordStream{l.handle, u});
        if (u != l.stream) pd.left.insert(u);
      }
      erase_live(it);
      ++g_mix.recorded_frees;
      apply(ops::Free{l.handle});
      if (!pd.left.empty()) pending_[p] = pd;
    } else if (sel < 228) {
      const StreamId u = 1 + sel % 5;
      ++g_mix.completes;
      apply(ops::CompleteEvents{u});
      for (auto& [p, pd] : pending_) pd.left.erase(u);
      std::erase_if(pending_, [](const auto& kv) { return kv.second.left.empty(); });
    } else if (sel < 240) {
      ++g_mix.empty_caches;
      apply(ops::EmptyCache{});
      pending_.clear();  // R9 waits for every pending event
    } else {
      const double f = kFractions[sel % 8];
      ++g_mix.fractions;
      apply(ops::SetMemoryFraction{f});
      cap_ = f < 1.0 ? std::optional<Bytes>(static_cast<Bytes>(f * static_cast<double>(capacity_))) : std::nullopt;
      // R7: a cap set below what is mapped unmaps whole free pages down to it; live pages stay
      // mapped, so reserved may stay above the cap, but never grows while it is (checked).
      cap_floor_ = static_cast<Bytes>(stats_.reserved_bytes[0].current);
      if (cap_ && cap_floor_ > *cap_) ++g_mix.fractions_below_live;
    }
  }

  void alloc(Bytes size, StreamId s) {
    const auto syncs = stats_.num_sync_all_streams;
    const auto maps = stats_.num_device_alloc;
    const auto unmaps = stats_.num_device_free;
    // The sut's blocks before the allocation: the snapshot the lockstep's checks took after the
    // previous op (nothing changed the sut since), else a new one.
    std::optional<Snapshot> before = ls_->take_checked_snapshot();
    if (!before) before = sut().snapshot();
    const std::uint32_t handles = ls_->handle_count();
    const lockstep::Outcome& o = apply(ops::Allocate{size, s, {}});
    if (o.kind == lockstep::Outcome::Kind::OutOfMemory) {
      ++g_mix.ooms;
      ++ooms_;
    }
    if (stats_.num_sync_all_streams != syncs) pending_.clear();  // R7 waited for every event
    if (o.kind != lockstep::Outcome::Kind::Pointer || o.ptr == 0) return;
    ++g_mix.allocs;
    const std::uint64_t p = o.ptr;
    const Bytes n = align_up(size, gpu::kCachetAlign);
    if (p % 512 != 0) throw Failure{"pointer not 512-aligned"};
    if (p < res_lo_ || p + n > res_hi_) throw Failure{"block outside the reservation"};
    auto overlaps = [p, n](const auto& m) {
      auto it = m.upper_bound(p);
      if (it != m.end() && it->first < p + n) return true;
      if (it != m.begin()) {
        --it;
        const Bytes sz = [&] {
          if constexpr (std::is_same_v<std::decay_t<decltype(it->second)>, Live>)
            return align_up(it->second.size, gpu::kCachetAlign);
          else
            return it->second.size;
        }();
        if (it->first + sz > p) return true;
      }
      return false;
    };
    if (overlaps(live_)) throw Failure{"new block overlaps a live block"};
    if (overlaps(pending_)) throw Failure{"new block overlaps a block whose stream-use events have not completed"};
    live_[p] = Live{size, s, handles};
    live_bytes_ += static_cast<std::int64_t>(n);
    live_req_ += static_cast<std::int64_t>(size);
    // R2: a hot-path allocation (no map or unmap call: R7's trim after an event completion can
    // unmap pages before R2 runs) is carved from one free block: at its high end when small
    // (<= 1 MiB), at its low end when large.
    if (stats_.num_device_alloc == maps && stats_.num_device_free == unmaps) {
      for (const auto& seg : *before)
        for (const auto& b : seg.blocks)
          if (b.state == BlockState::Inactive && b.address <= p && p + n <= b.address + b.size &&
              (n <= kSmallSize ? p + n != b.address + b.size : p != b.address))
            throw Failure{"R2: hot-path block at " + std::to_string(p - b.address) + " B into its free block of " +
                          std::to_string(b.size) + " B, not at its " + (n <= kSmallSize ? "high" : "low") + " end"};
    }
  }

  // The stream-reuse promise (cachet/gpu/policy_cachet.h), from the trace: no allocation gets
  // memory another stream freed, unless unmapped since.
  void check_trace() {
    for (const TraceEvent& e : sut().trace()) {
      const Bytes n = align_up(e.size, gpu::kCachetAlign);
      if (e.action == TraceAction::Alloc) {
        for (auto& [s, rg] : dirty_)
          if (s != e.stream && overlaps_range(rg, e.addr, e.addr + n))
            throw Failure{"stream-reuse: stream " + std::to_string(e.stream) +
                          " got memory stream " + std::to_string(s) + " freed, not unmapped since"};
        remove_range(dirty_[e.stream], e.addr, e.addr + n);
      } else if (e.action == TraceAction::FreeCompleted) {
        remove_range(dirty_[e.stream], e.addr, e.addr + n);
        dirty_[e.stream][e.addr] = e.addr + n;
      } else if (e.action == TraceAction::SegmentUnmap) {
        for (auto& [s, rg] : dirty_) remove_range(rg, e.addr, e.addr + e.size);
      }
    }
    sut().clear_trace();
  }

  using RangeMap = std::map<std::uint64_t, std::uint64_t>;  // disjoint [lo, hi)
  static bool overlaps_range(const RangeMap& m, std::uint64_t lo, std::uint64_t hi) {
    auto it = m.lower_bound(lo);
    if (it != m.begin()) --it;
    for (; it != m.end() && it->first < hi; ++it)
      if (it->second > lo) return true;
    return false;
  }
  static void remove_range(RangeMap& m, std::uint64_t lo, std::uint64_t hi) {
    auto it = m.lower_bound(lo);
    if (it != m.begin()) --it;
    while (it != m.end() && it->first < hi) {
      const auto [a, b] = *it;
      if (b <= lo) {
        ++it;
        continue;
      }
      it = m.erase(it);
      if (a < lo) m[a] = lo;
      if (b > hi) m[hi] = b;
    }
  }

  void check() {
    check_trace();
    const DeviceStats& st = stats_;
    const auto reserved = st.reserved_bytes[0].current;
    const auto allocated = st.allocated_bytes[0].current;
    const std::int64_t live_bytes = live_bytes_, live_req = live_req_;
    // In pool mode the generator's blocks (kGeneratorBlocks) come on top of the handles.
    const std::int64_t extra_blocks = st.allocation[0].current - static_cast<std::int64_t>(live_.size());
    const std::int64_t max_extra = pool_mode_ ? kGeneratorBlocks : 0;
    if (allocated < live_bytes || allocated - live_bytes != extra_blocks * static_cast<std::int64_t>(gpu::kCachetAlign))
      throw Failure{"allocated_bytes " + std::to_string(allocated) + " != live blocks " + std::to_string(live_bytes) +
                    (pool_mode_ ? " + the generator's 512 B blocks" : "")};
    if (allocated > reserved || st.active_bytes[0].current < allocated ||
        st.requested_bytes[0].current < live_req || extra_blocks < 0 || extra_blocks > max_extra)
      throw Failure{"stats inconsistent: allocated " + std::to_string(allocated) + ", reserved " + std::to_string(reserved) +
                    ", active " + std::to_string(st.active_bytes[0].current) + ", allocations " +
                    std::to_string(st.allocation[0].current) + " (live " + std::to_string(live_.size()) + ")"};
    if (reserved < 0 || reserved % static_cast<std::int64_t>(kPage) != 0 ||
        static_cast<Bytes>(reserved) != sim_->used())
      throw Failure{"reserved " + std::to_string(reserved) + " != device used " + std::to_string(sim_->used())};
    if (cap_ && static_cast<Bytes>(reserved) > std::max(*cap_, cap_floor_))
      throw Failure{"reserved " + std::to_string(reserved) + " above the cap " + std::to_string(*cap_) +
                    " and above what it was when the cap was set (" + std::to_string(cap_floor_) + ")"};
    cap_floor_ = std::min(cap_floor_, static_cast<Bytes>(reserved));  // above the cap, reserved only shrinks
    if (st.num_ooms != ooms_) throw Failure{"num_ooms " + std::to_string(st.num_ooms) + ", seen " + std::to_string(ooms_)};
  }

  Bytes capacity_ = 0;
  bool pool_mode_ = false;
  StreamId nstreams_ = 1;
  std::optional<Bytes> cap_;
  Bytes cap_floor_ = 0;  // reserved when the cap was last set
  gpu::DevicePtr res_lo_ = 0, res_hi_ = 0;
  std::shared_ptr<gpu::HostSim> sim_;
  std::unique_ptr<lockstep::CachetLockstep> ls_;
  std::map<std::uint64_t, Live> live_;
  std::int64_t live_bytes_ = 0, live_req_ = 0;  // live_'s sizes summed: rounded (kCachetAlign), requested
  std::map<std::uint64_t, Pending> pending_;
  std::map<StreamId, RangeMap> dirty_;  // memory each stream freed, not unmapped since
  std::int64_t ooms_ = 0;
  DeviceStats stats_;  // the sut's stats after the last apply() (nothing else changes the sut)
  ops::Case case_;  // the ops applied so far, replayable
};

}  // namespace

std::string run_cachet_bytes(const std::uint8_t* data, std::size_t size, std::string* ops) {
  Run r;
  std::string out = r.go(data, size);
  if (ops != nullptr) *ops = r.ops();
  return out;
}

std::string show_cachet_mix() {
  const Mix& m = g_mix;
  char buf[896];
  std::snprintf(buf, sizeof buf,
                "fuzz_cachet_policy mix: %llu cases (%llu capped), %llu ops: %llu allocs returned memory, %llu OOMs, "
                "%llu frees, %llu record+free, %llu event completions, %llu empty_cache, %llu fraction changes (%llu below the live pages); "
                "%llu cases in pool mode: %llu pool and capture ops applied, %llu refused; %llu teardowns dropped "
                "the generator's seed",
                static_cast<unsigned long long>(m.cases), static_cast<unsigned long long>(m.capped_cases),
                static_cast<unsigned long long>(m.ops), static_cast<unsigned long long>(m.allocs),
                static_cast<unsigned long long>(m.ooms), static_cast<unsigned long long>(m.frees),
                static_cast<unsigned long long>(m.recorded_frees), static_cast<unsigned long long>(m.completes),
                static_cast<unsigned long long>(m.empty_caches), static_cast<unsigned long long>(m.fractions),
                static_cast<unsigned long long>(m.fractions_below_live), static_cast<unsigned long long>(m.pool_cases),
                static_cast<unsigned long long>(m.pool_ops), static_cast<unsigned long long>(m.pool_refused),
                static_cast<unsigned long long>(m.generator_seeds_dropped));
  return buf;
}

}  // namespace cachet::fuzz

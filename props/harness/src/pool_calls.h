// props/harness/src/pool_calls.h (internal to the lockstep runner): the pool and capture ops'
// allocator calls, made on both sides. The shared front end (cachet/front_end/pool_front_end.h)
// decides what an op calls; BothSides applies each call to the sut, then to the model, and lets
// the front end go on only while both succeeded alike.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "cachet/errors.h"
#include "cachet/front_end/pool_front_end.h"
#include "cachet/gpu/host_backend.h"
#include "cachet/lockstep.h"
#include "cachet/op_threads.h"
#include "cachet/snapshot.h"
#include "cachet/stats.h"
#include "device_log.h"

namespace cachet::lockstep::detail {

// What a refusal where PyTorch fails (docs/pytorch-allocator.md §14.8) must leave as it was: the
// sut's stats (the record of the 122 keys) and its snapshot.
struct SutState {
  DeviceStats stats;
  std::uint64_t snapshot_digest = 0;  // digest(snapshot()) (cachet/snapshot_digest.h)
  friend bool operator==(const SutState&, const SutState&) = default;
};
template <class Impl>
SutState sut_state(Impl& sut) {
  return SutState{sut.stats(), sut.snapshot_digest()};
}

// Thrown to the front end when a call did not succeed alike on both sides; the lockstep runner
// catches it and reads failure().
struct CallStopped {};

// One call's outcomes: the first call of an op that did not succeed alike on both sides.
struct CallFailure {
  std::string call;  // e.g. "release_pool({1, 0})"
  Outcome sut, model;
  SutState sut_before;  // the sut's state before that call (the §14.8 check)
};

// The model keeps a capture graph (wait_stream, kernel; docs/pytorch-allocator.md §14.10.1):
// model::Allocator does, model::CachetPolicy does not.
template <class A>
concept HasCaptureGraph = requires(A& a, StreamId s) {
  a.wait_stream(s, s);
  a.kernel(s);
};

template <class Model, class Impl>
class BothSides final : public front_end::AllocatorCalls {
 public:
  // A pair without private pools never reaches the pool calls (the runner answers Unsupported).
  static constexpr bool kPools = HasPrivatePools<Model> && HasPrivatePools<Impl>;

  // `sim`: the host backend's simulation when the pair runs on it (else null): a capture begins
  // and ends on its simulated device too, as on a GPU, so that gpu/ reads the same capture graph
  // the model keeps (docs/pytorch-allocator.md §14.10.1).
  BothSides(std::unique_ptr<Model>& model, std::unique_ptr<Impl>& sut, OpThreads& threads,
            std::shared_ptr<gpu::HostSim>& sim)
      : model_(model), sut_(sut), threads_(threads), sim_(sim) {}

  void begin_op() {
    failure_.reset();
    stopped_ = false;
  }
  const std::optional<CallFailure>& failure() const { return failure_; }

  std::uint64_t malloc(Bytes size, StreamId stream) override {
    return call(
               "malloc(" + std::to_string(size) + ", stream " + std::to_string(stream) + ")",
               [&](Outcome& r) {
                 r.kind = Outcome::Kind::Pointer;
                 r.ptr = reinterpret_cast<std::uint64_t>(sut_->allocate(size, stream));
               },
               [&](Outcome& r) {
                 r.kind = Outcome::Kind::Pointer;
                 r.ptr = model_->malloc(size, stream);
               })
        .ptr;
  }
  void free(std::uint64_t ptr) override {
    call(
        "free(" + hex(ptr) + ")", [&](Outcome&) { sut_->free(reinterpret_cast<void*>(ptr)); },
        [&](Outcome&) { model_->free(ptr); });
  }
  void create_or_incref_pool(PoolId id) override {
    if constexpr (kPools)
      call(
          "create_or_incref_pool(" + show_pool(id) + ")", [&](Outcome&) { sut_->create_or_incref_pool(id); },
          [&](Outcome&) { model_->create_or_incref_pool(id); });
  }
  // A capture on the simulated device: a stream that captures already (it joined another
  // capture) is refused first, nothing changed; then beginAllocateToPool, then the device begins
  // capturing (as tools/engine_gpu.cpp replays a recording).
  void begin_allocate_to_pool(PoolId id, PoolRoute route) override {
    if constexpr (kPools)
      call(
          "begin_allocate_to_pool(" + show_pool(id) + ")",
          [&](Outcome&) {
            const bool device = sim_ && route.is_capture();
            if (device && sim_->capture_info(route.stream).value.capturing)
              throw UsageError("capture_begin on stream " + std::to_string(route.stream) +
                               ": the stream captures already (it joined another capture)");
            sut_->begin_allocate_to_pool(id, route);
            if (device) {
              if (gpu::Status st = sim_->capture_begin(route.stream); !st.is_ok()) throw UsageError(st.message);
              capture_origin_[id] = route.stream;
            }
          },
          [&](Outcome&) { model_->begin_allocate_to_pool(id, route); },
          route.is_capture() ? 0 : route.thread);  // gpu/'s use_mem_pool filter: the calling thread
  }
  // cudaStreamEndCapture first (refused, nothing changed, while a stream that joined the capture
  // is not joined back), then endAllocateToPool.
  void end_allocate_to_pool(PoolId id) override {
    if constexpr (kPools)
      call(
          "end_allocate_to_pool(" + show_pool(id) + ")",
          [&](Outcome&) {
            if (auto it = capture_origin_.find(id); it != capture_origin_.end()) {
              if (gpu::Status st = sim_->capture_end(it->second); !st.is_ok()) throw UsageError(st.message);
              capture_origin_.erase(it);
            }
            sut_->end_allocate_to_pool(id);
          },
          [&](Outcome&) { model_->end_allocate_to_pool(id); });
  }
  void release_pool(PoolId id) override {
    if constexpr (kPools)
      call(
          "release_pool(" + show_pool(id) + ")", [&](Outcome&) { sut_->release_pool(id); },
          [&](Outcome&) { model_->release_pool(id); });
  }
  void empty_cache_of(PoolId id) override {
    if constexpr (kPools)
      call(
          "empty_cache(" + show_pool(id) + ")", [&](Outcome&) { sut_->empty_cache(id); },
          [&](Outcome&) { model_->empty_cache(id); });
  }
  // The capture prologue's kernels (seed and offset, docs/pytorch-allocator.md §14.10.1): on the
  // simulated device and in the model's graph, where the pair runs on the host backend (on a GPU
  // the lockstep begins no capture on the device, so neither side gets them).
  void kernel(StreamId stream) override {
    if constexpr (HasCaptureGraph<Model>) {
      if (sim_) {
        sim_->kernel(stream);
        model_->kernel(stream);
      }
    }
  }
  // Only live_pools() asks, which the runner does not use: the sut's count (the runner compares
  // both sides' counts after every op).
  int pool_use_count(PoolId id) const override {
    if constexpr (kPools) return sut_->pool_use_count(id);
    return 0;
  }

 private:
  // Sut first (the model's device takes the sut's addresses), then the model. Both succeeded
  // alike: the result. Else the first such call is kept and the front end stopped; after a
  // failure both sides share (the same error kind; out of memory: the same text) the front end
  // may still make the calls that undo its own step (§14.9); after any other, no call is made.
  template <class S, class M>
  Outcome call(std::string what, S&& on_sut, M&& on_model, ThreadIndex sut_thread = 0) {
    if (stopped_) throw CallStopped{};
    SutState before = sut_state(*sut_);
    Outcome s;
    threads_.run(sut_thread, [&] { s = capture(on_sut); });
    const Outcome m = capture(on_model);
    if (s == m && (s.kind == Outcome::Kind::Ok || s.kind == Outcome::Kind::Pointer)) return s;
    if (!failure_) failure_ = CallFailure{std::move(what), s, m, std::move(before)};
    const bool alike = s.kind == m.kind && (s.kind == Outcome::Kind::UsageError || same_text(s, m)) &&
                       s.kind != Outcome::Kind::Ok && s.kind != Outcome::Kind::Pointer;
    if (!alike) stopped_ = true;
    throw CallStopped{};
  }

  std::unique_ptr<Model>& model_;
  std::unique_ptr<Impl>& sut_;
  OpThreads& threads_;
  std::shared_ptr<gpu::HostSim>& sim_;
  std::map<PoolId, StreamId> capture_origin_;  // the captures begun on the simulated device
  std::optional<CallFailure> failure_;
  bool stopped_ = false;
};

}  // namespace cachet::lockstep::detail

// The API layer: the only place that locks (style note 11), runs validate mode, and turns
// parsed configuration into the policy's Config. Every call reaches the policy through
// PolicyCore::with_policy (api/policy_core.h), the one place that dispatches.
#include "cachet/gpu/allocator.h"

#include <algorithm>
#include <cstdint>
#include <thread>
#include <type_traits>

#include "cachet/errors.h"
#include "cachet/gpu/cuda_backend.h"
#include "cachet/summary.h"
#include "check.h"
#include "api/policy_core.h"

namespace cachet {

namespace {
gpu::DevicePtr to_dev(void* p) { return static_cast<gpu::DevicePtr>(reinterpret_cast<std::uintptr_t>(p)); }
void* to_host(gpu::DevicePtr p) { return reinterpret_cast<void*>(static_cast<std::uintptr_t>(p)); }

// The calls that replay PyTorch's own orders (docs/pytorch-allocator.md §14.10.3) are
// policy:pytorch's alone: f runs on it; under policy:cachet, `cachet_refusal` (when given) is
// raised as a UsageError, else nothing happens.
template <class Core, class F>
void on_pytorch_policy(Core& core, const char* cachet_refusal, F&& f) {
  core.with_policy([&](auto& p) {
    if constexpr (std::is_same_v<std::remove_cvref_t<decltype(p)>, gpu::detail::PytorchPolicy>) {
      f(p);
    } else if (cachet_refusal != nullptr) {
      throw UsageError(cachet_refusal);
    }
  });
}
}  // namespace

CachingAllocator::CachingAllocator(std::unique_ptr<gpu::DeviceMemory> memory, Config config)
    : core_(std::make_unique<gpu::detail::PolicyCore>(std::move(memory), config)), validate_(config.validate) {}

CachingAllocator::~CachingAllocator() = default;

std::unique_ptr<CachingAllocator> CachingAllocator::for_cuda_device(DeviceIndex device, Config config) {
  return std::make_unique<CachingAllocator>(
      gpu::make_cuda_memory(device, config.expandable_segments || config.policy == Policy::Cachet || config.sleep),
      config);
}

Config CachingAllocator::config_from_environment() { return cachet::config_from_environment().parsed.config; }

void CachingAllocator::validate(const char* op) const {
  // Props and fuzz builds (CACHET_EXPENSIVE_CHECKS) check after every mutator, validate mode or not.
  CACHET_ASSERT_EXPENSIVE(core_->with_policy([](const auto& p) { return p.invariants(); }).empty());
  if (!validate_) return;
  auto v = core_->with_policy([](const auto& p) { return p.invariants(); });
  if (v.empty()) return;
  std::string m = std::string("cachet: invariants violated after ") + op + ":";
  for (const auto& s : v) m += "\n  " + s;
  throw InvariantViolation(m);
}

[[gnu::hot]] void* CachingAllocator::allocate(Bytes size, StreamId stream) {
  std::lock_guard lock(mu_);
  return core_->with_policy([&](auto& p) -> void* {
    if (!validate_) {
      void* ptr = to_host(p.malloc(size, stream));
      CACHET_ASSERT_EXPENSIVE(p.invariants().empty());
      return ptr;
    }
    try {
      void* ptr = to_host(p.malloc(size, stream));
      validate("allocate");
      return ptr;
    } catch (const OutOfMemory&) {
      validate("allocate (out of memory)");
      throw;
    }
  });
}

[[gnu::hot]] void CachingAllocator::free(void* ptr) {
  std::lock_guard lock(mu_);
  core_->with_policy([&](auto& p) {
    p.free(to_dev(ptr));
    if (!validate_) {
      CACHET_ASSERT_EXPENSIVE(p.invariants().empty());
      return;
    }
    validate("free");
  });
}

void CachingAllocator::record_stream(void* ptr, StreamId stream) {
  std::lock_guard lock(mu_);
  core_->with_policy([&](auto& p) { p.record_stream(to_dev(ptr), stream); });
  validate("record_stream");
}

void CachingAllocator::empty_cache() {
  std::lock_guard lock(mu_);
  core_->with_policy([](auto& p) { p.empty_cache(); });
  validate("empty_cache");
}

void CachingAllocator::empty_cache(PoolId id) {
  std::lock_guard lock(mu_);
  core_->with_policy([id](auto& p) { p.empty_cache(id); });
  validate("empty_cache(pool)");
}

// Private pools (docs/pytorch-allocator.md §14).
void CachingAllocator::create_or_incref_pool(PoolId id) {
  std::lock_guard lock(mu_);
  core_->with_policy([id](auto& p) { p.create_or_incref_pool(id); });
  validate("create_or_incref_pool");
}

gpu::SegmentSource::~SegmentSource() = default;

// PyTorch's CUDAAllocator calls beyond the pools (docs/pytorch-allocator.md §15).
void CachingAllocator::create_or_incref_pool(PoolId id, std::shared_ptr<gpu::SegmentSource> source) {
  std::lock_guard lock(mu_);
  core_->with_policy([&](auto& p) { p.create_or_incref_pool(id, std::move(source)); });
  validate("create_or_incref_pool(source)");
}

void CachingAllocator::set_use_on_oom(PoolId id, bool on) {
  std::lock_guard lock(mu_);
  core_->with_policy([&](auto& p) { p.set_use_on_oom(id, on); });
  validate("set_use_on_oom");
}

void CachingAllocator::set_no_split(PoolId id) {
  std::lock_guard lock(mu_);
  core_->with_policy([&](auto& p) { p.set_no_split(id); });
  validate("set_no_split");
}

Bytes CachingAllocator::largest_free_block() const {
  std::lock_guard lock(mu_);
  return core_->with_policy([](const auto& p) { return std::max(p.device_free_memory(), p.largest_cached_block()); });
}

Bytes CachingAllocator::largest_cached_block() const {
  std::lock_guard lock(mu_);
  return core_->with_policy([](const auto& p) { return p.largest_cached_block(); });
}

void* CachingAllocator::base_allocation(void* ptr, Bytes* size) const {
  std::lock_guard lock(mu_);
  return to_host(core_->with_policy([&](const auto& p) { return p.base_allocation(to_dev(ptr), size); }));
}

std::shared_ptr<const PoolCheckpoint> CachingAllocator::checkpoint_pool(PoolId id) {
  std::lock_guard lock(mu_);
  auto cp = core_->with_policy([id](auto& p) { return p.checkpoint_pool(id); });
  validate("checkpoint_pool");
  return cp;
}

CheckpointDelta CachingAllocator::restore_pool(const PoolCheckpoint& cp, const std::vector<void*>& stale_live) {
  std::vector<gpu::DevicePtr> stale;
  stale.reserve(stale_live.size());
  for (void* p : stale_live) stale.push_back(to_dev(p));
  std::lock_guard lock(mu_);
  auto delta = core_->with_policy([&](auto& p) { return p.restore_pool(cp, stale); });
  validate("restore_pool");
  return delta;
}

bool CachingAllocator::pool_live_allocations_are(PoolId id, const std::vector<void*>& expected) const {
  std::vector<gpu::DevicePtr> want;
  want.reserve(expected.size());
  for (void* p : expected) want.push_back(to_dev(p));
  std::lock_guard lock(mu_);
  return core_->with_policy([&](const auto& p) { return p.pool_live_allocations_are(id, want); });
}

void CachingAllocator::begin_allocate_to_pool(PoolId id, PoolFilter filter, bool capture) {
  if (!filter) throw UsageError("begin_allocate_to_pool: the filter is empty; pass a function that takes a stream");
  std::lock_guard lock(mu_);
  core_->with_policy([&](auto& p) { p.begin_allocate_to_pool(id, filter, capture); });
  validate("begin_allocate_to_pool");
}

// A use_mem_pool route takes the allocations of the OS thread that calls this (PyTorch's filter
// compares std::this_thread::get_id(), docs/pytorch-allocator.md §14.10.2): runners make each op
// thread's calls on an OS thread of its own. A capture route takes its stream, whatever the thread,
// and, where the backend reads captures (caps().capture_graph), every stream capturing into the
// same capture as it (CUDAGraph's filter: the stream's capture id, §14.10.1).
void CachingAllocator::begin_allocate_to_pool(PoolId id, PoolRoute route) {
  if (route.is_capture()) {
    gpu::DeviceMemory* mem = &device_memory();
    if (!mem->caps().capture_graph) {
      begin_allocate_to_pool(id, [route](StreamId s) { return route.takes(s); }, true);
      return;
    }
    begin_allocate_to_pool(
        id,
        [route, mem](StreamId s) {
          if (s == route.stream) return true;
          const auto own = mem->capture_info(route.stream);
          if (!own.is_ok() || !own.value.capturing) return false;
          const auto other = mem->capture_info(s);
          return other.is_ok() && other.value.capturing && other.value.capture_id == own.value.capture_id;
        },
        true);
    return;
  }
  begin_allocate_to_pool(id, [tid = std::this_thread::get_id()](StreamId) { return std::this_thread::get_id() == tid; },
                         false);
}

void CachingAllocator::end_allocate_to_pool(PoolId id) {
  std::lock_guard lock(mu_);
  core_->with_policy([id](auto& p) { p.end_allocate_to_pool(id); });
  validate("end_allocate_to_pool");
}

void CachingAllocator::release_pool(PoolId id) {
  std::lock_guard lock(mu_);
  core_->with_policy([id](auto& p) { p.release_pool(id); });
  validate("release_pool");
}

bool CachingAllocator::has_pool(PoolId id) const {
  std::lock_guard lock(mu_);
  return core_->with_policy([id](const auto& p) { return p.has_pool(id); });
}

int CachingAllocator::pool_use_count(PoolId id) const {
  std::lock_guard lock(mu_);
  return core_->with_policy([id](const auto& p) { return p.pool_use_count(id); });
}

std::vector<void*> CachingAllocator::deferred_frees() const {
  std::lock_guard lock(mu_);
  std::vector<gpu::DevicePtr> ptrs = core_->with_policy([](const auto& p) { return p.deferred_frees(); });
  std::vector<void*> out;
  out.reserve(ptrs.size());
  for (gpu::DevicePtr d : ptrs) out.push_back(to_host(d));
  return out;
}

void CachingAllocator::set_deferred_free_order(const std::vector<void*>& order) {
  std::vector<gpu::DevicePtr> ptrs;
  ptrs.reserve(order.size());
  for (void* p : order) ptrs.push_back(to_dev(p));
  std::lock_guard lock(mu_);
  on_pytorch_policy(*core_,
                    "set_deferred_free_order: policy:cachet takes deferred frees in the order they were made (R12); "
                    "only policy:pytorch replays PyTorch's order (docs/pytorch-allocator.md §14.10.3)",
                    [&](auto& p) { p.set_deferred_free_order(ptrs); });
  validate("set_deferred_free_order");
}

std::vector<std::pair<StreamId, std::vector<void*>>> CachingAllocator::event_queues() const {
  std::lock_guard lock(mu_);
  std::vector<std::pair<StreamId, std::vector<void*>>> out;
  on_pytorch_policy(*core_, nullptr, [&](const auto& p) {
    for (const auto& [s, blocks] : p.event_queues()) {
      std::vector<void*> ptrs;
      ptrs.reserve(blocks.size());
      for (gpu::DevicePtr d : blocks) ptrs.push_back(to_host(d));
      out.emplace_back(s, std::move(ptrs));
    }
  });
  return out;
}

void CachingAllocator::set_event_stream_order(const std::vector<StreamId>& order) {
  std::lock_guard lock(mu_);
  on_pytorch_policy(*core_,
                    "set_event_stream_order: policy:cachet walks its streams' events in its own order; only "
                    "policy:pytorch replays PyTorch's order (docs/pytorch-allocator.md §14.10.3)",
                    [&](auto& p) { p.set_event_stream_order(order); });
  validate("set_event_stream_order");
}

void CachingAllocator::set_memory_fraction(double fraction) {
  std::lock_guard lock(mu_);
  core_->with_policy([fraction](auto& p) { p.set_memory_fraction(fraction); });
}

double CachingAllocator::memory_fraction() const {
  std::lock_guard lock(mu_);
  return core_->with_policy([](const auto& p) { return p.memory_fraction(); });
}

DeviceStats CachingAllocator::stats() const {
  std::lock_guard lock(mu_);
  return core_->with_policy([](const auto& p) -> const DeviceStats& { return p.stats(); });
}

void CachingAllocator::reset_accumulated_stats() {
  std::lock_guard lock(mu_);
  core_->with_policy([](auto& p) { p.reset_accumulated_stats(); });
}

void CachingAllocator::reset_peak_stats() {
  std::lock_guard lock(mu_);
  core_->with_policy([](auto& p) { p.reset_peak_stats(); });
}

std::string CachingAllocator::summary(bool abbreviated) const {
  DeviceStats s;
  DeviceIndex d;
  {
    std::lock_guard lock(mu_);
    core_->with_policy([&](const auto& p) {
      s = p.stats();
      d = p.device();
    });
  }
  return memory_summary(s, d, abbreviated);
}

// Sleep and wake (docs/sleep-wake.md).
Bytes CachingAllocator::sleep(const TagList& tags, const TagList& backup_tags) {
  std::lock_guard lock(mu_);
  const Bytes given = core_->with_policy([&](auto& p) { return p.sleep(tags, backup_tags); });
  validate("sleep");
  return given;
}

void CachingAllocator::wake(const TagList& tags) {
  std::lock_guard lock(mu_);
  try {
    core_->with_policy([&](auto& p) { p.wake(tags); });
  } catch (const OutOfMemory&) {
    validate("wake (out of memory)");
    throw;
  }
  validate("wake");
}

TagList CachingAllocator::sleeping() const {
  std::lock_guard lock(mu_);
  return core_->with_policy([](const auto& p) { return p.sleeping(); });
}

SleepStats CachingAllocator::sleep_stats() const {
  std::lock_guard lock(mu_);
  return core_->with_policy([](const auto& p) { return p.sleep_stats(); });
}

Bytes CachingAllocator::prepare_backup_buffers(const TagList& backup_tags) {
  std::lock_guard lock(mu_);
  return core_->with_policy([&](auto& p) -> Bytes {
    p.check_sleep_call("prepare_backup_buffers()", backup_tags, nullptr);
    return p.pin_backup_buffers(p.backup_need(backup_tags));
  });
}

Bytes CachingAllocator::release_backup_buffers() {
  std::lock_guard lock(mu_);
  return core_->with_policy([](auto& p) { return p.memory().host_trim(); });
}

Snapshot CachingAllocator::snapshot() {
  std::lock_guard lock(mu_);
  return core_->with_policy([](auto& p) { return p.snapshot(); });
}

std::uint64_t CachingAllocator::snapshot_digest() const {
  std::lock_guard lock(mu_);
  return core_->with_policy([](const auto& p) { return p.snapshot_digest(); });
}

Snapshot CachingAllocator::block_table() const {
  std::lock_guard lock(mu_);
  return core_->with_policy([](const auto& p) { return p.block_table(); });
}

void CachingAllocator::set_trace(bool on) {
  std::lock_guard lock(mu_);
  core_->with_policy([on](auto& p) { p.set_trace(on); });
}

void CachingAllocator::set_trace_listener(TraceListener l) {
  std::lock_guard lock(mu_);
  core_->with_policy([&](auto& p) { p.set_trace_listener(std::move(l)); });
}

std::vector<TraceEvent> CachingAllocator::trace() const {
  std::lock_guard lock(mu_);
  return core_->with_policy([](const auto& p) -> const std::vector<TraceEvent>& { return p.trace(); });
}

void CachingAllocator::clear_trace() {
  std::lock_guard lock(mu_);
  core_->with_policy([](auto& p) { p.clear_trace(); });
}

std::vector<ConfigWarning> CachingAllocator::configure(std::string_view text) {
  std::lock_guard lock(mu_);
  return core_->with_policy([&](auto& p) {
    ParseResult r = parse_config(text, ConfigSource::Cachet, p.config());
    if (r.config.sleep != p.config().sleep)
      throw UsageError("cachet_sleep is fixed when the allocator is built (docs/sleep-wake.md section 6); set it in "
                       "CACHET_ALLOC_CONF before the first allocation");
    p.apply_config(r.config);  // the policy stays the one chosen at construction
    validate_ = r.config.validate;
    return std::move(r.warnings);
  });
}

void CachingAllocator::configure_from_environment() {
  EnvConfig env = cachet::config_from_environment();
  std::lock_guard lock(mu_);
  core_->with_policy([&](auto& p) {
    if (env.parsed.config.sleep != p.config().sleep)
      throw UsageError("cachet_sleep is fixed when the allocator is built (docs/sleep-wake.md section 6); set it in "
                       "CACHET_ALLOC_CONF before the first allocation");
    p.apply_config(env.parsed.config);
  });
  validate_ = env.parsed.config.validate;
}

Config CachingAllocator::config() const {
  std::lock_guard lock(mu_);
  return core_->with_policy([](const auto& p) -> const Config& { return p.config(); });
}

std::vector<std::string> CachingAllocator::invariants() const {
  std::lock_guard lock(mu_);
  return core_->with_policy([](const auto& p) { return p.invariants(); });
}

DeviceIndex CachingAllocator::device() const {
  return core_->with_policy([](const auto& p) { return p.device(); });
}
Bytes CachingAllocator::total_memory() const {
  return core_->with_policy([](const auto& p) { return p.total_memory(); });
}
gpu::DeviceMemory& CachingAllocator::device_memory() {
  return core_->with_policy([](auto& p) -> gpu::DeviceMemory& { return p.memory(); });
}

}  // namespace cachet

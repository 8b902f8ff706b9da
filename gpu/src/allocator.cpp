// The API layer: the only place that locks (style note 11), runs validate mode, and turns
// parsed configuration into the core's Config.
#include "cachet/gpu/allocator.h"

#include <cstdint>

#include "cachet/errors.h"
#include "cachet/gpu/cuda_backend.h"
#include "cachet/summary.h"
#include "check.h"
#include "core.h"
#include "policy_cachet.h"

namespace cachet {

namespace {
gpu::DevicePtr to_dev(void* p) { return static_cast<gpu::DevicePtr>(reinterpret_cast<std::uintptr_t>(p)); }
void* to_host(gpu::DevicePtr p) { return reinterpret_cast<void*>(static_cast<std::uintptr_t>(p)); }
}  // namespace

CachingAllocator::CachingAllocator(std::unique_ptr<gpu::DeviceMemory> memory, Config config)
    : validate_(config.validate) {
  if (config.policy == Policy::Cachet) cachet_ = std::make_unique<gpu::detail::CachetPolicy>(std::move(memory), config);
  else impl_ = std::make_unique<gpu::detail::DeviceAllocator>(std::move(memory), config);
}

CachingAllocator::~CachingAllocator() = default;

std::unique_ptr<CachingAllocator> CachingAllocator::for_cuda_device(DeviceIndex device, Config config) {
  return std::make_unique<CachingAllocator>(
      gpu::make_cuda_memory(device, config.expandable_segments || config.policy == Policy::Cachet), config);
}

Config CachingAllocator::config_from_environment() { return cachet::config_from_environment().parsed.config; }

void CachingAllocator::validate(const char* op) const {
  // Props and fuzz builds (CACHET_EXPENSIVE_CHECKS) check after every mutator, validate mode or not.
  if (cachet_) [[unlikely]] {
    CACHET_ASSERT_EXPENSIVE(cachet_->invariants().empty());
  } else {
    CACHET_ASSERT_EXPENSIVE(impl_->invariants().empty());
  }
  if (!validate_) return;
  auto v = cachet_ ? cachet_->invariants() : impl_->invariants();
  if (v.empty()) return;
  std::string m = std::string("cachet: invariants violated after ") + op + ":";
  for (const auto& s : v) m += "\n  " + s;
  throw InvariantViolation(m);
}

void* CachingAllocator::allocate(Bytes size, StreamId stream) {
  std::lock_guard lock(mu_);
  if (!validate_) {
    void* p = to_host(cachet_ ? cachet_->malloc(size, stream) : impl_->malloc(size, stream));
    CACHET_ASSERT_EXPENSIVE(cachet_ ? cachet_->invariants().empty() : impl_->invariants().empty());
    return p;
  }
  try {
    void* p = to_host(cachet_ ? cachet_->malloc(size, stream) : impl_->malloc(size, stream));
    validate("allocate");
    return p;
  } catch (const OutOfMemory&) {
    validate("allocate (out of memory)");
    throw;
  }
}

void CachingAllocator::free(void* ptr) {
  std::lock_guard lock(mu_);
  if (cachet_) cachet_->free(to_dev(ptr));
  else impl_->free(to_dev(ptr));
  if (!validate_) {
    CACHET_ASSERT_EXPENSIVE(cachet_ ? cachet_->invariants().empty() : impl_->invariants().empty());
    return;
  }
  validate("free");
}

void CachingAllocator::record_stream(void* ptr, StreamId stream) {
  std::lock_guard lock(mu_);
  if (cachet_) [[unlikely]] cachet_->record_stream(to_dev(ptr), stream);
  else impl_->record_stream(to_dev(ptr), stream);
  validate("record_stream");
}

void CachingAllocator::empty_cache() {
  std::lock_guard lock(mu_);
  if (cachet_) [[unlikely]] cachet_->empty_cache();
  else impl_->empty_cache();
  validate("empty_cache");
}

void CachingAllocator::set_memory_fraction(double fraction) {
  std::lock_guard lock(mu_);
  if (cachet_) [[unlikely]] cachet_->set_memory_fraction(fraction);
  else impl_->set_memory_fraction(fraction);
}

double CachingAllocator::memory_fraction() const {
  std::lock_guard lock(mu_);
  return cachet_ ? cachet_->memory_fraction() : impl_->memory_fraction();
}

DeviceStats CachingAllocator::stats() const {
  std::lock_guard lock(mu_);
  return cachet_ ? cachet_->stats() : impl_->stats();
}

void CachingAllocator::reset_accumulated_stats() {
  std::lock_guard lock(mu_);
  (cachet_ ? cachet_->mutable_stats() : impl_->mutable_stats()).reset_accumulated();
}

void CachingAllocator::reset_peak_stats() {
  std::lock_guard lock(mu_);
  (cachet_ ? cachet_->mutable_stats() : impl_->mutable_stats()).reset_peak();
}

std::string CachingAllocator::summary(bool abbreviated) const {
  DeviceStats s;
  DeviceIndex d;
  {
    std::lock_guard lock(mu_);
    s = cachet_ ? cachet_->stats() : impl_->stats();
    d = cachet_ ? cachet_->device() : impl_->device();
  }
  return memory_summary(s, d, abbreviated);
}

Snapshot CachingAllocator::snapshot() {
  std::lock_guard lock(mu_);
  return cachet_ ? cachet_->snapshot() : impl_->snapshot();
}

void CachingAllocator::set_trace(bool on) {
  std::lock_guard lock(mu_);
  if (cachet_) [[unlikely]] cachet_->set_trace(on);
  else impl_->set_trace(on);
}

std::vector<TraceEvent> CachingAllocator::trace() const {
  std::lock_guard lock(mu_);
  return cachet_ ? cachet_->trace() : impl_->trace();
}

void CachingAllocator::clear_trace() {
  std::lock_guard lock(mu_);
  if (cachet_) [[unlikely]] cachet_->clear_trace();
  else impl_->clear_trace();
}

std::vector<ConfigWarning> CachingAllocator::configure(std::string_view text) {
  std::lock_guard lock(mu_);
  ParseResult r = parse_config(text, ConfigSource::Cachet, cachet_ ? cachet_->config() : impl_->config());
  if (cachet_) [[unlikely]] cachet_->apply_config(r.config);  // the policy stays the one chosen at construction
  else impl_->apply_config(r.config);
  validate_ = r.config.validate;
  return r.warnings;
}

void CachingAllocator::configure_from_environment() {
  EnvConfig env = cachet::config_from_environment();
  std::lock_guard lock(mu_);
  if (cachet_) [[unlikely]] cachet_->apply_config(env.parsed.config);
  else impl_->apply_config(env.parsed.config);
  validate_ = env.parsed.config.validate;
}

Config CachingAllocator::config() const {
  std::lock_guard lock(mu_);
  return cachet_ ? cachet_->config() : impl_->config();
}

std::vector<std::string> CachingAllocator::invariants() const {
  std::lock_guard lock(mu_);
  return cachet_ ? cachet_->invariants() : impl_->invariants();
}

DeviceIndex CachingAllocator::device() const { return cachet_ ? cachet_->device() : impl_->device(); }
Bytes CachingAllocator::total_memory() const { return cachet_ ? cachet_->total_memory() : impl_->total_memory(); }
gpu::DeviceMemory& CachingAllocator::device_memory() { return cachet_ ? cachet_->memory() : impl_->memory(); }

}  // namespace cachet

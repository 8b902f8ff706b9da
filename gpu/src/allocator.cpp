// The API layer: the only place that locks (style note 11), runs validate mode, and turns
// parsed configuration into the core's Config.
#include "cachet/gpu/allocator.h"

#include <cstdint>

#include "cachet/errors.h"
#include "cachet/gpu/cuda_backend.h"
#include "cachet/summary.h"
#include "check.h"
#include "core.h"

namespace cachet {

namespace {
gpu::DevicePtr to_dev(void* p) { return static_cast<gpu::DevicePtr>(reinterpret_cast<std::uintptr_t>(p)); }
void* to_host(gpu::DevicePtr p) { return reinterpret_cast<void*>(static_cast<std::uintptr_t>(p)); }
}  // namespace

CachingAllocator::CachingAllocator(std::unique_ptr<gpu::DeviceMemory> memory, Config config)
    : impl_(std::make_unique<gpu::detail::DeviceAllocator>(std::move(memory), config)),
      validate_(config.validate) {}

CachingAllocator::~CachingAllocator() = default;

std::unique_ptr<CachingAllocator> CachingAllocator::for_cuda_device(DeviceIndex device, Config config) {
  return std::make_unique<CachingAllocator>(gpu::make_cuda_memory(device, config.expandable_segments), config);
}

Config CachingAllocator::config_from_environment() { return cachet::config_from_environment().parsed.config; }

void CachingAllocator::validate(const char* op) const {
  // Props and fuzz builds (CACHET_EXPENSIVE_CHECKS) check after every mutator, validate mode or not.
  CACHET_ASSERT_EXPENSIVE(impl_->invariants().empty());
  if (!validate_) return;
  auto v = impl_->invariants();
  if (v.empty()) return;
  std::string m = std::string("cachet: invariants violated after ") + op + ":";
  for (const auto& s : v) m += "\n  " + s;
  throw InvariantViolation(m);
}

void* CachingAllocator::allocate(Bytes size, StreamId stream) {
  std::lock_guard lock(mu_);
  if (!validate_) {
    void* p = to_host(impl_->malloc(size, stream));
    CACHET_ASSERT_EXPENSIVE(impl_->invariants().empty());
    return p;
  }
  try {
    void* p = to_host(impl_->malloc(size, stream));
    validate("allocate");
    return p;
  } catch (const OutOfMemory&) {
    validate("allocate (out of memory)");
    throw;
  }
}

void CachingAllocator::free(void* ptr) {
  std::lock_guard lock(mu_);
  impl_->free(to_dev(ptr));
  validate("free");
}

void CachingAllocator::record_stream(void* ptr, StreamId stream) {
  std::lock_guard lock(mu_);
  impl_->record_stream(to_dev(ptr), stream);
  validate("record_stream");
}

void CachingAllocator::empty_cache() {
  std::lock_guard lock(mu_);
  impl_->empty_cache();
  validate("empty_cache");
}

void CachingAllocator::set_memory_fraction(double fraction) {
  std::lock_guard lock(mu_);
  impl_->set_memory_fraction(fraction);
}

double CachingAllocator::memory_fraction() const {
  std::lock_guard lock(mu_);
  return impl_->memory_fraction();
}

DeviceStats CachingAllocator::stats() const {
  std::lock_guard lock(mu_);
  return impl_->stats();
}

void CachingAllocator::reset_accumulated_stats() {
  std::lock_guard lock(mu_);
  impl_->mutable_stats().reset_accumulated();
}

void CachingAllocator::reset_peak_stats() {
  std::lock_guard lock(mu_);
  impl_->mutable_stats().reset_peak();
}

std::string CachingAllocator::summary(bool abbreviated) const {
  DeviceStats s;
  DeviceIndex d;
  {
    std::lock_guard lock(mu_);
    s = impl_->stats();
    d = impl_->device();
  }
  return memory_summary(s, d, abbreviated);
}

Snapshot CachingAllocator::snapshot() {
  std::lock_guard lock(mu_);
  return impl_->snapshot();
}

void CachingAllocator::set_trace(bool on) {
  std::lock_guard lock(mu_);
  impl_->set_trace(on);
}

std::vector<TraceEvent> CachingAllocator::trace() const {
  std::lock_guard lock(mu_);
  return impl_->trace();
}

void CachingAllocator::clear_trace() {
  std::lock_guard lock(mu_);
  impl_->clear_trace();
}

std::vector<ConfigWarning> CachingAllocator::configure(std::string_view text) {
  std::lock_guard lock(mu_);
  ParseResult r = parse_config(text, ConfigSource::Cachet, impl_->config());  // throws ConfigError
  impl_->apply_config(r.config);
  validate_ = r.config.validate;
  return r.warnings;
}

void CachingAllocator::configure_from_environment() {
  EnvConfig env = cachet::config_from_environment();
  std::lock_guard lock(mu_);
  impl_->apply_config(env.parsed.config);
  validate_ = env.parsed.config.validate;
}

Config CachingAllocator::config() const {
  std::lock_guard lock(mu_);
  return impl_->config();
}

std::vector<std::string> CachingAllocator::invariants() const {
  std::lock_guard lock(mu_);
  return impl_->invariants();
}

DeviceIndex CachingAllocator::device() const { return impl_->device(); }
Bytes CachingAllocator::total_memory() const { return impl_->total_memory(); }
gpu::DeviceMemory& CachingAllocator::device_memory() { return impl_->memory(); }

}  // namespace cachet

// Construction, the memory fraction, block ownership.
#include "cachet/model/allocator.h"

#include <string>

#include "cachet/errors.h"
#include "cachet/model/memory_cap.h"

namespace cachet::model {

Allocator::Allocator(const Config& config, SegmentSource& source, DeviceIndex device)
    : config_(config), source_(source), device_(device) {
  // memory_stats()["max_split_size"] is fixed at construction (docs/pytorch-allocator.md §4.1).
  stats_.max_split_size = config_.max_split_size_stat();
  // The per_process_memory_fraction key applies here only (§3.6).
  if (config_.per_process_memory_fraction)
    set_memory_fraction(*config_.per_process_memory_fraction);
}

Allocator::~Allocator() = default;

void Allocator::set_memory_fraction(double fraction) {
  allowed_max_ = memory_cap(fraction, source_.total_memory());
}

void Allocator::set_allocator_settings(const Config& config) {
  const bool no_caching = config_.no_caching;
  config_ = config;
  config_.no_caching = no_caching;
}

double Allocator::memory_fraction() const {
  if (!allowed_max_) return 1.0;
  return static_cast<double>(*allowed_max_) / static_cast<double>(source_.total_memory());
}

Block* Allocator::new_block(BlockState born) {
  auto owned = std::make_unique<Block>(born);
  Block* b = owned.get();
  owned_.emplace(b, std::move(owned));
  return b;
}

void Allocator::delete_block(Block* b) {
  check_born_or_deleted(b->state(), "deleted", b->ptr);
  owned_.erase(b);
}

}  // namespace cachet::model

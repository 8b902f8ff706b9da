// policy:cachet (CachetPolicy, policy_cachet/policy.h; design and promises: cachet/gpu/policy_cachet.h):
// construction, destruction, block storage and the reservation.
#include <algorithm>
#include <iterator>
#include <stdexcept>
#include <string>

#include "cachet/errors.h"
#include "cachet/summary.h"
#include "messages.h"
#include "policy_cachet/policy.h"

namespace cachet::gpu::detail {

using namespace cachet_pages;  // policy_cachet/policy.h

CachetPolicy::CachetPolicy(std::unique_ptr<DeviceMemory> memory, const Config& config)
    : Shell(std::move(memory), config) {
  if (!caps_.reserve_va)
    throw UsageError(
        "policy:cachet needs a backend that can reserve and map address space (CUDA VMM or "
        "the host simulation); this backend cannot. Use policy:pytorch or another backend.");
  if (caps_.granularity == 0 || kPage % caps_.granularity != 0)
    throw UsageError(
        "policy:cachet maps 2 MiB pages; this backend's granularity does not divide 2 MiB");
  read_total_memory();
  if (config_.per_process_memory_fraction)
    set_memory_fraction(*config_.per_process_memory_fraction);
}

CachetPolicy::~CachetPolicy() {
  for (auto& [e, b] : events_) mem_->event_destroy(e);
  event_pool_.destroy_all(*mem_);
  // Unmap every run of mapped pages, then give the reservation back; errors cannot be reported.
  DevicePtr run = 0;
  bool in_run = false;
  for (auto& [h, n] : backup_buffers_) mem_->host_free(h);
  // A sleeping page has no memory behind it: it ends a run as an unmapped one does.
  for (CBlock* b = head_; b != nullptr; b = b->next) {
    const bool mapped = b->is_mapped() && !b->asleep;
    if (mapped && !in_run) {
      run = b->ptr;
      in_run = true;
    } else if (!mapped && in_run) {
      (void)mem_->unmap(run, b->ptr - run);
      in_run = false;
    }
  }
  if (in_run) (void)mem_->unmap(run, base_ + va_size_ - run);
  if (base_ != 0) (void)mem_->unreserve(base_, va_size_);
  free_.clear();
  for (auto& [id, pool] : pools_) pool.free.clear();
  unmapped_.clear();
}

CBlock* CachetPolicy::make_block(BlockState born) {
  if (spare_.empty()) {
    storage_.push_back(std::make_unique<CBlock[]>(kChunk));
    CBlock* chunk = storage_.back().get();
    for (std::size_t i = kChunk; i-- > 1;) spare_.push_back(&chunk[i]);
    chunk[0].born(born);
    return &chunk[0];
  }
  CBlock* b = spare_.back();
  spare_.pop_back();
  // As a new CBlock, without rebuilding its hook and stream_uses (released blocks are unlinked).
  b->ptr = 0;
  b->size = 0;
  b->requested = 0;
  b->stream = 0;
  b->pool = PoolId{};
  b->prev = nullptr;
  b->next = nullptr;
  b->event_count = 0;
  b->tag = 0;
  b->asleep = false;
  b->born(born);
  b->stream_uses.clear();
  return b;
}

void CachetPolicy::release_block(CBlock* b) {
  check_born_or_gone("removed", b->state(), b->ptr);  // merged away: Free or Unmapped only
  spare_.push_back(b);
}

void CachetPolicy::ensure_reserved() {
  if (base_ != 0) return;
  const Bytes n = align_up(std::max<Bytes>(total_memory_, kPage) * kCachetReserveFactor, kPage);
  auto r = mem_->reserve(n);
  if (!r.is_ok()) throw DeviceError(device_error("cuMemAddressReserve", n, device_, r.status));
  base_ = r.value;
  va_size_ = n;
  page_live_.assign(n / kPage, 0);
  page_tag_.assign(n / kPage, 0);
  CBlock* u = make_block(BlockState::Unmapped);
  u->ptr = base_;
  u->size = n;
  head_ = u;
  unmapped_.insert(*u);
}

}  // namespace cachet::gpu::detail

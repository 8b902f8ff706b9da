// policy:cachet (CachetPolicy, policy_cachet/policy.h; design and promises: cachet/gpu/policy_cachet.h):
// private pools, rules R10-R12: routing of allocations to the active pool, use counts and
// PyTorch's refusals (docs/pytorch-allocator.md §14.2, §14.4), the release that gives a pool's
// free blocks to the default pool, empty_cache(id), the deferred frees' events and the trim when
// the last active pool ends.
#include <string>
#include <utility>
#include <vector>

#include "cachet/errors.h"
#include "messages.h"
#include "policy_cachet/policy.h"

namespace cachet::gpu::detail {

using namespace cachet_pages;  // policy_cachet/policy.h

namespace {
std::string describe(PoolId id) {
  return "{" + std::to_string(id.first) + ", " + std::to_string(id.second) + "}";
}
}  // namespace

void CachetPolicy::create_or_incref_pool(PoolId id) {
  if (id.is_default())
    throw UsageError("create_or_incref_pool: {0, 0} names the default pool, not a private pool");
  auto it = pools_.find(id);
  if (it == pools_.end()) {
    pools_.try_emplace(id);  // use_count 1 (§14.4)
    return;
  }
  // As PyTorch: a pool every user released is not reused while it is still known (R11).
  if (it->second.use_count <= 0)
    throw UsageError("create_or_incref_pool(" + describe(id) +
                     "): every user has released this pool; make a new pool (§14.4)");
  ++it->second.use_count;
}

// `capture` is not used: R12 treats every active pool as a possible capture (the plug-in cannot
// tell a capture from a use_mem_pool and passes false).
void CachetPolicy::begin_allocate_to_pool(PoolId id, const PoolFilter& takes, bool /*capture*/) {
  for (const ActivePool& a : active_pools_)
    if (a.id == id)
      throw UsageError("begin_allocate_to_pool(" + describe(id) +
                       "): already allocating to this pool (PyTorch: \"beginAllocateToPool: already "
                       "recording to mempool_id\"); end_allocate_to_pool first");
  if (!takes) throw UsageError("begin_allocate_to_pool(" + describe(id) + "): the stream filter is empty");
  create_or_incref_pool(id);
  active_pools_.push_back(ActivePool{id, takes});
}

void CachetPolicy::end_allocate_to_pool(PoolId id) {
  for (auto it = active_pools_.begin(); it != active_pools_.end(); ++it) {
    if (it->id != id) continue;
    active_pools_.erase(it);
    if (active_pools_.empty()) trim_to_budget();  // R12: the last active pool ended
    return;
  }
  throw UsageError("end_allocate_to_pool(" + describe(id) +
                   "): not allocating to this pool (PyTorch: \"endAllocatePool: not currently "
                   "recording to mempool_id\")");
}

void CachetPolicy::release_pool(PoolId id) {
  auto it = pools_.find(id);
  if (it == pools_.end()) throw UsageError("release_pool(" + describe(id) + "): no such private pool");
  if (it->second.use_count <= 0)
    throw UsageError("release_pool(" + describe(id) + "): every user has already released it");
  if (--it->second.use_count > 0) return;
  // R11: the free blocks join the default pool, merged with its free neighbours there.
  CFreeSet& fs = it->second.free;
  std::vector<CBlock*> blocks;
  blocks.reserve(fs.size());
  for (CBlock& b : fs) blocks.push_back(&b);
  fs.clear();
  // Its sleeping free blocks too (in no set; docs/sleep-wake.md): they join the default pool asleep.
  if (sleeping_bytes_ > 0)
    for (CBlock* b = head_; b != nullptr; b = b->next)
      if (b->asleep && b->is_mapped_free() && b->pool == id) blocks.push_back(b);
  for (CBlock* b : blocks) leave_released_pool(b);  // may forget the pool with the last one
  // No two of them can join each other (the pool merged its blocks of one stream already), so
  // each is still itself when its turn comes: merge_free may only join it to default blocks or
  // to one of them already merged.
  for (CBlock* b : blocks) merge_free(b);
  if (auto left = pools_.find(id); left != pools_.end() && left->second.bytes == 0) pools_.erase(left);
  // Pages the pool held beyond the budget are whole free pages now: down to budget(T) (R11).
  trim_to_budget();
}

int CachetPolicy::pool_use_count(PoolId id) const {
  auto it = pools_.find(id);
  if (it == pools_.end()) throw UsageError("pool_use_count(" + describe(id) + "): no such private pool");
  return it->second.use_count;
}

std::vector<DevicePtr> CachetPolicy::deferred_frees() const {
  std::vector<DevicePtr> out;
  out.reserve(deferred_.size());
  for (const CBlock* b : deferred_) out.push_back(b->ptr);
  return out;
}

void CachetPolicy::empty_cache(PoolId id) {
  if (!id.is_default() && live_pool(id)) return;  // R11: its memory is its users'
  empty_cache();
}

// R10: the newest active pool whose filter takes `stream`, if it still has a user.
PoolId CachetPolicy::route(StreamId stream) const {
  for (auto it = active_pools_.rbegin(); it != active_pools_.rend(); ++it)
    if (it->takes(stream)) return live_pool(it->id) ? it->id : PoolId{};
  return PoolId{};
}

bool CachetPolicy::live_pool(PoolId id) const {
  auto it = pools_.find(id);
  return it != pools_.end() && it->second.use_count > 0;
}

// R11: a free block of a released pool (at the release, or freed after it) joins the default
// pool; the pool is forgotten with its last block.
void CachetPolicy::leave_released_pool(CBlock* b) {
  if (b->pool.is_default() || live_pool(b->pool)) return;
  auto it = pools_.find(b->pool);
  it->second.bytes -= b->size;
  if (it->second.bytes == 0 && it->second.use_count == 0) pools_.erase(it);
  b->pool = PoolId{};
}

// R12: the last active pool ended: the unmapping R4 and R7 skipped meanwhile, in R6's order.
void CachetPolicy::trim_to_budget() {
  if (base_ == 0) return;
  const Bytes budget = budget_pages(peak_touched_pages_);
  if (mapped_ / kPage > budget) unmap_free_pages(mapped_ / kPage - budget, 0, 0);
  trim_to_cap();
}

// R12: no pool is active any more: each deferred free gets one event per stream it was used on,
// in the order they were freed. On a device error the blocks already done leave deferred_.
void CachetPolicy::record_deferred_events() {
  std::size_t done = 0;
  try {
    for (; done < deferred_.size(); ++done) {
      CBlock* b = deferred_[done];
      const std::size_t first = events_.size();
      event_pool_.record_on(*mem_, device_, b->stream_uses, events_,
                            [b](EventHandle e, StreamId) { return std::pair{e, b}; });
      b->event_count = static_cast<std::int32_t>(events_.size() - first);
      b->stream_uses.clear();
      b->set_state(BlockState::AwaitingEvents);  // Deferred -> AwaitingEvents
    }
  } catch (...) {
    deferred_.erase(deferred_.begin(), deferred_.begin() + static_cast<std::ptrdiff_t>(done));
    throw;
  }
  deferred_.clear();
}

}  // namespace cachet::gpu::detail

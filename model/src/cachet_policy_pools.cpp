// The cachet policy model: private pools (R10-R12 of cachet/model/cachet_policy.h's rules):
// routing of allocations to the active pool, use counts and their refusals (as PyTorch's,
// docs/pytorch-allocator.md §14.2, §14.4), the release that gives a pool's free blocks to the
// default pool, empty_cache(id), and the trim when the last active pool ends.
#include <algorithm>
#include <sstream>
#include <string>
#include <vector>

#include "cachet/errors.h"
#include "cachet/model/cachet_policy.h"

namespace cachet::model {

namespace {
// A pool id as the messages write it: {first, second}.
std::string describe(PoolId id) {
  std::ostringstream out;
  out << '{' << id.first << ", " << id.second << '}';
  return out.str();
}
}  // namespace

// §14.4: a new id makes a pool with one user; a known one gains a user, unless every user has
// released it: as PyTorch, such a pool is not reused while it is still known (R11).
void CachetPolicy::create_or_incref_pool(PoolId id) {
  if (id.is_default())
    throw UsageError("create_or_incref_pool: {0, 0} names the default pool, not a private pool");
  if (!pools_.contains(id)) {
    pools_.emplace(id, Pool{});  // use_count 1
  } else if (Pool& pool = pools_.at(id); pool.use_count > 0) {
    ++pool.use_count;
  } else {
    throw UsageError("create_or_incref_pool(" + describe(id) +
                     "): every user has released this pool; make a new pool (§14.4)");
  }
}

void CachetPolicy::begin_allocate_to_pool(PoolId id, PoolRoute route) {
  for (const auto& [active, r] : active_)
    if (active == id)
      throw UsageError("begin_allocate_to_pool(" + describe(id) +
                       "): already allocating to this pool (PyTorch: \"beginAllocateToPool: already "
                       "recording to mempool_id\")");
  create_or_incref_pool(id);
  active_.emplace_back(id, route);
}

void CachetPolicy::end_allocate_to_pool(PoolId id) {
  const auto it = std::ranges::find(active_, id, &std::pair<PoolId, PoolRoute>::first);
  if (it == active_.end())
    throw UsageError("end_allocate_to_pool(" + describe(id) +
                     "): not allocating to this pool (PyTorch: \"endAllocatePool: not currently "
                     "recording to mempool_id\")");
  active_.erase(it);
  if (!pool_active()) trim_to_budget();  // R12: the last active pool ended
}

void CachetPolicy::release_pool(PoolId id) {
  auto it = pools_.find(id);
  if (it == pools_.end())
    throw UsageError("release_pool(" + describe(id) + "): no such private pool");
  if (it->second.use_count <= 0)
    throw UsageError("release_pool(" + describe(id) + "): every user has already released it");
  if (--it->second.use_count > 0) return;
  // R11: the free blocks join the default pool, merged with its free neighbours there.
  std::vector<std::uint64_t> free_blocks;
  for (const auto& [ptr, b] : blocks_)
    if (b.mapped_free() && b.pool == id) free_blocks.push_back(ptr);
  for (std::uint64_t ptr : free_blocks) leave_released_pool(blocks_.at(ptr));
  for (std::uint64_t ptr : free_blocks)
    if (blocks_.count(ptr)) merge(ptr);  // (a merge may have absorbed it already)
  if (pools_.count(id) && pools_.at(id).bytes == 0) pools_.erase(id);
  // Pages the pool held beyond the budget are whole free pages now: down to budget(T) (R11).
  trim_to_budget();
}

int CachetPolicy::pool_use_count(PoolId id) const {
  auto it = pools_.find(id);
  if (it == pools_.end())
    throw UsageError("pool_use_count(" + describe(id) + "): no such private pool");
  return it->second.use_count;
}

void CachetPolicy::empty_cache(PoolId id) {
  if (!id.is_default() && live_pool(id)) return;  // R11: its memory is its users'
  empty_cache();
}

// R10: the newest active pool whose route takes `stream` (or `thread`), if it still has a user.
PoolId CachetPolicy::route(StreamId stream, ThreadIndex thread) const {
  for (auto it = active_.rbegin(); it != active_.rend(); ++it)
    if (it->second.takes(stream, thread)) return live_pool(it->first) ? it->first : PoolId{};
  return PoolId{};
}

bool CachetPolicy::live_pool(PoolId id) const {
  auto it = pools_.find(id);
  return it != pools_.end() && it->second.use_count > 0;
}

// R11: a Free block of a released pool (at the release, or when freed after it) joins the default
// pool; the pool is forgotten with its last block.
void CachetPolicy::leave_released_pool(Block& b) {
  if (b.pool.is_default() || live_pool(b.pool)) return;
  Pool& p = pools_.at(b.pool);
  p.bytes -= b.size;
  if (p.bytes == 0 && p.use_count == 0) pools_.erase(b.pool);
  b.pool = PoolId{};
}

// R12: the last active pool ended: the unmapping R4 and R7 skipped meanwhile (R6 order).
void CachetPolicy::trim_to_budget() {
  if (reservation_size_ == 0) return;
  const Bytes budget = peak_touched_ + peak_touched_ / kCachetSlack;
  if (awake_pages() > budget) unmap_whole_free_pages(awake_pages() - budget, 0, 0);
  trim_to_cap();
}

}  // namespace cachet::model

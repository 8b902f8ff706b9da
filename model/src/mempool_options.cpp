// A MemPool's two options (docs/pytorch-allocator.md §15.2): use_on_oom (PyTorch's setUseOnOOM
// and try_mempool_fallback) and no_split (setNoSplit, read by should_split).
#include <string>

#include "cachet/errors.h"
#include "cachet/model/allocator.h"
#include "cachet/model/sizes.h"

namespace cachet::model {

namespace {
std::string describe(PoolId id) {
  return "{" + std::to_string(id.first) + ", " + std::to_string(id.second) + "}";
}
}  // namespace

void Allocator::set_use_on_oom(PoolId id, bool on) {
  if (id.is_default())
    throw UsageError("set_use_on_oom: {0, 0} names the default pools, not a private pool");
  if (on)
    use_on_oom_pools_.insert(id);
  else
    use_on_oom_pools_.erase(id);
}

void Allocator::set_no_split(PoolId id) {
  if (id.is_default())
    throw UsageError("set_no_split: {0, 0} names the default pools, not a private pool");
  no_split_pools_.insert(id);
}

bool Allocator::never_splits(const BlockPool& pool) const {
  return pool.owner != nullptr && no_split_pools_.contains(pool.owner->id);
}

// try_mempool_fallback. Only for an allocation outside every private pool. For each marked pool in
// turn PyTorch does what use_mem_pool would do for one allocation on this thread:
// beginAllocateToPool (which creates the pool if there is none), one search of the pool's free
// blocks with expandable segments off, endAllocateToPool, releasePool. The first block found is
// taken; it stays its pool's block.
bool Allocator::try_mempool_fallback(AllocParams& p) {
  if (p.pool->owner != nullptr || use_on_oom_pools_.empty()) return false;
  for (PoolId id : use_on_oom_pools_.in_order()) {
    // beginAllocateToPool's two checks, where PyTorch fails (an assertion, a TORCH_CHECK).
    auto known = graph_pools_.find(id);
    if (known != graph_pools_.end() && known->second->use_count <= 0)
      throw PyTorchFailure("allocate: PyTorch 2.11 fails here: the out-of-memory fallback allocates to pool " +
                       describe(id) + ", marked use_on_oom, whose users all released it (§15.2)");
    for (const auto& [active, route] : captures_underway_)
      if (active == id)
        throw PyTorchFailure("allocate: PyTorch 2.11 fails here (\"beginAllocateToPool: already recording to "
                         "mempool_id\"): the out-of-memory fallback allocates to pool " + describe(id) +
                         ", marked use_on_oom and active already (§15.2)");
    // PyTorch's filter here takes the allocating thread (std::this_thread::get_id()).
    PoolRoute route;
    route.thread = p.thread;
    begin_allocate_to_pool(id, route);
    AllocParams borrowed = p;
    borrowed.pool = &get_pool(p.size, p.stream, p.thread);  // the pool just made active takes this thread
    borrowed.expandable = false;
    borrowed.block = nullptr;
    // Only a block its segment's tag allows (docs/sleep-wake.md, SLEEP-R1); PyTorch's search while
    // every allocation is "default".
    const bool found = get_free_block_for_tag(borrowed);
    end_allocate_to_pool(id);
    release_pool(id);
    if (found) {
      p = borrowed;
      return true;
    }
  }
  return false;
}

// ===================================================================== PoolIdOrder

void PoolIdOrder::insert(PoolId id) {
  for (const auto& p : stand_ins_)
    if (p->id == id) return;
  stand_ins_.push_back(std::make_unique<PrivatePool>(id));
  order_.insert(stand_ins_.back().get());
}

void PoolIdOrder::erase(PoolId id) {
  for (auto it = stand_ins_.begin(); it != stand_ins_.end(); ++it) {
    if ((*it)->id != id) continue;
    order_.erase(it->get());
    stand_ins_.erase(it);
    return;
  }
}

std::vector<PoolId> PoolIdOrder::in_order() const {
  std::vector<PoolId> ids;
  for (const PrivatePool* p : order_.in_order()) ids.push_back(p->id);
  return ids;
}

}  // namespace cachet::model

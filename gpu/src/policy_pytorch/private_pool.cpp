// policy:pytorch (PytorchPolicy, policy_pytorch/policy.h): private pools (docs/pytorch-allocator.md
// §14): use counts (§14.4), routing while a pool is active (§14.2), the device allocation count
// (§14.5), releasing freeable pools in PyTorch's order (§14.5, §14.6), the deferred frees of a
// capture (§14.7), and the refusals where PyTorch 2.11 itself fails (§14.8).
#include <algorithm>
#include <bit>
#include <cmath>
#include <string>

#include "cachet/errors.h"
#include "cachet/gpu/allocator.h"
#include "cachet/rule_flip.h"
#include "check.h"
#include "messages.h"
#include "policy_pytorch/policy.h"

namespace cachet::gpu::detail {

namespace {
std::string describe(PoolId id) { return "{" + std::to_string(id.first) + ", " + std::to_string(id.second) + "}"; }
}  // namespace

// ===================================================================== FreeableOrder (§14.5)

std::size_t FreeableOrder::desired(PoolId id) const {
  return static_cast<std::size_t>((11400714819323198485ull * hash(id)) >> (64 - log2_buckets_));
}

bool FreeableOrder::contains(PoolId id) const {
  return std::any_of(slots_.begin(), slots_.end(), [&](const Slot& s) { return s.distance >= 0 && s.id == id; });
}

void FreeableOrder::insert(PoolId id, PrivatePool* pool) {
  if (!contains(id)) emplace(Slot{0, id, pool});
}

void FreeableOrder::emplace(Slot entry) {
  if (buckets_ == 0) {  // ska's empty table has no bucket: the first insert grows it
    grow();
    emplace(entry);
    return;
  }
  std::size_t cur = desired(entry.id);
  std::int8_t dist = 0;
  while (cur < slots_.size() && slots_[cur].distance >= dist) ++cur, ++dist;
  if (dist == max_lookups_ || static_cast<double>(count_ + 1) > static_cast<double>(buckets_) * 0.5) {
    grow();
    emplace(entry);
    return;
  }
  CACHET_CHECK(cur < slots_.size());
  if (slots_[cur].distance < 0) {
    slots_[cur] = Slot{dist, entry.id, entry.pool};
    ++count_;
    return;
  }
  // Robin Hood: the new entry takes this slot, the one it displaces is carried on.
  const std::size_t taken = cur;
  Slot carried = slots_[cur];
  slots_[cur] = Slot{dist, entry.id, entry.pool};
  dist = static_cast<std::int8_t>(carried.distance + 1);
  for (++cur;; ++cur) {
    CACHET_CHECK(cur < slots_.size());
    if (slots_[cur].distance < 0) {
      slots_[cur] = Slot{dist, carried.id, carried.pool};
      ++count_;
      return;
    }
    if (slots_[cur].distance < dist) {
      std::swap(dist, slots_[cur].distance);
      std::swap(carried.id, slots_[cur].id);
      std::swap(carried.pool, slots_[cur].pool);
      ++dist;
    } else if (++dist == max_lookups_) {
      // ska puts the carried entry back where the new one went and inserts the new one again
      // after growing.
      std::swap(carried.id, slots_[taken].id);
      std::swap(carried.pool, slots_[taken].pool);
      grow();
      emplace(Slot{0, carried.id, carried.pool});
      return;
    }
  }
}

void FreeableOrder::grow() { rehash(std::max<std::size_t>(4, 2 * buckets_)); }

void FreeableOrder::rehash(std::size_t buckets) {
  buckets = std::max(buckets, static_cast<std::size_t>(std::ceil(static_cast<double>(count_) / 0.5)));
  buckets = std::max<std::size_t>(2, std::bit_ceil(buckets));
  if (buckets == buckets_) return;
  std::vector<Slot> old = std::move(slots_);
  buckets_ = buckets;
  log2_buckets_ = std::bit_width(buckets) - 1;
  max_lookups_ = std::max(4, log2_buckets_);
  slots_.assign(buckets_ + static_cast<std::size_t>(max_lookups_) - 1, Slot{});
  count_ = 0;
  for (const Slot& s : old)
    if (s.distance >= 0) emplace(Slot{0, s.id, s.pool});
}

void FreeableOrder::erase(PoolId id) {
  auto it = std::find_if(slots_.begin(), slots_.end(), [&](const Slot& s) { return s.distance >= 0 && s.id == id; });
  if (it == slots_.end()) return;
  std::size_t cur = static_cast<std::size_t>(it - slots_.begin());
  slots_[cur] = Slot{};
  --count_;
  // Backward shift: the following entries not at their desired slot move back by one.
  for (std::size_t next = cur + 1; next < slots_.size() && slots_[next].distance > 0; ++cur, ++next) {
    slots_[cur] = slots_[next];
    --slots_[cur].distance;
    slots_[next] = Slot{};
  }
}

std::vector<PrivatePool*> FreeableOrder::in_order() const {
  std::vector<PrivatePool*> out;
  for (const Slot& s : slots_)
    if (s.distance >= 0) out.push_back(s.pool);
  return out;
}

std::vector<PoolId> FreeableOrder::ids_in_order() const {
  std::vector<PoolId> out;
  for (const Slot& s : slots_)
    if (s.distance >= 0) out.push_back(s.id);
  return out;
}

// ===================================================================== Use counts and routing (§14.2, §14.4)

void PytorchPolicy::create_or_incref_pool(PoolId id) {
  if (id.is_default())
    throw UsageError("create_or_incref_pool: {0, 0} names the default pools, not a private pool; pass a MemPool's id");
  auto it = graph_pools_.find(id);
  if (it == graph_pools_.end()) {
    graph_pools_.emplace(id, std::make_unique<PrivatePool>(id));  // use count 1 (§14.4)
    return;
  }
  // PyTorch asserts the pool is live: a pool all of whose users released it is not reused.
  if (it->second->use_count <= 0)
    throw UsageError("create_or_incref_pool(" + describe(id) +
                     "): every user has released this pool; make a new pool (§14.4)");
  ++it->second->use_count;
}

// createOrIncrefPool(device, id, allocator) (§15.1): the source is taken only by a new pool.
void PytorchPolicy::create_or_incref_pool(PoolId id, std::shared_ptr<SegmentSource> source) {
  if (source == nullptr) return create_or_incref_pool(id);
  if (id.is_default())
    throw UsageError("create_or_incref_pool: {0, 0} names the default pools, not a private pool; pass a MemPool's id");
  if (graph_pools_.contains(id))
    throw PyTorchFailsHere("create_or_incref_pool(" + describe(id) +
                           ", allocator): PyTorch 2.11 fails here (\"!allocator INTERNAL ASSERT FAILED\"): the pool "
                           "exists already and only a new pool takes an allocator; cachet refuses and changes "
                           "nothing. Pass no allocator to add a user, or use a new pool id (docs/pytorch-allocator.md "
                           "§15.1)");
  auto pp = std::make_unique<PrivatePool>(id);  // use count 1 (§14.4)
  pp->source = std::move(source);
  graph_pools_.emplace(id, std::move(pp));
}

// setUseOnOOM, setNoSplit (§15.2): PyTorch keeps the ids, whether or not the pool exists.
void PytorchPolicy::set_use_on_oom(PoolId id, bool on) {
  if (id.is_default())
    throw UsageError("set_use_on_oom: {0, 0} names the default pools, not a private pool; pass a MemPool's id");
  if (on) use_on_oom_pools_.insert(id, nullptr);
  else use_on_oom_pools_.erase(id);
}

void PytorchPolicy::set_no_split(PoolId id) {
  if (id.is_default())
    throw UsageError("set_no_split: {0, 0} names the default pools, not a private pool; pass a MemPool's id");
  if (std::find(no_split_pools_.begin(), no_split_pools_.end(), id) == no_split_pools_.end()) no_split_pools_.push_back(id);
}

// try_mempool_fallback (§15.2): malloc outside every private pool found no cached block and no new
// segment; each use_on_oom pool in turn, as if allocated to for a moment on this thread
// (beginAllocateToPool, get_free_block with expandable segments off, endAllocateToPool,
// releasePool), lends its best free block. A pool PyTorch creates on the way (an id marked with no
// pool) is left freeable, as there.
bool PytorchPolicy::try_mempool_fallback(AllocParams& p) {
  for (PoolId id : use_on_oom_pools_.ids_in_order()) {
    auto it = graph_pools_.find(id);
    if (it != graph_pools_.end() && it->second->use_count <= 0)
      throw PyTorchFailsHere("allocate(" + std::to_string(p.size) + " B): PyTorch 2.11 fails here (\"use_count > 0 "
                             "INTERNAL ASSERT FAILED\"): the out-of-memory fallback would allocate to pool " +
                             describe(id) + ", marked use_on_oom, but every user has released it; cachet refuses. "
                             "Unmark it (set_use_on_oom(id, false)) when its MemPool goes (docs/pytorch-allocator.md "
                             "§15.2)");
    for (const Underway& u : captures_underway_)
      if (u.id == id)
        throw PyTorchFailsHere("allocate(" + std::to_string(p.size) + " B): PyTorch 2.11 fails here (\"beginAllocateToPool: "
                               "already recording to mempool_id\"): the out-of-memory fallback would allocate to pool " +
                               describe(id) + ", marked use_on_oom, which is active already (use_mem_pool or a capture); "
                               "cachet refuses. Leave that pool first (docs/pytorch-allocator.md §15.2)");
    PrivatePool* pp = nullptr;
    const bool created = it == graph_pools_.end();
    if (created) pp = graph_pools_.emplace(id, std::make_unique<PrivatePool>(id)).first->second.get();
    else pp = it->second.get();
    AllocParams q{p.stream, p.size, p.alloc_size, p.size <= kSmallSize ? &pp->small : &pp->large, nullptr};
    q.expandable_active = false;  // PyTorch's fallback searches with expandable segments off
    const bool found = get_free_block(q);
    if (created) {  // releasePool takes the new pool's one user: it is freeable (§14.4)
      pp->use_count = 0;
      graph_pools_freeable_.insert(id, pp);
    }
    if (found) {
      p = q;
      return true;
    }
  }
  return false;
}

void PytorchPolicy::begin_allocate_to_pool(PoolId id, const PoolFilter& filter, bool capture) {
  for (const Underway& u : captures_underway_)
    if (u.id == id)
      throw UsageError("begin_allocate_to_pool(" + describe(id) +
                       "): already allocating to this pool (PyTorch: \"beginAllocateToPool: already recording to "
                       "mempool_id\"); end it first");
  create_or_incref_pool(id);  // may refuse; nothing changed then
  captures_underway_.push_back(Underway{id, filter, capture});
}

void PytorchPolicy::end_allocate_to_pool(PoolId id) {
  for (auto it = captures_underway_.begin(); it != captures_underway_.end(); ++it) {
    if (it->id == id) {
      captures_underway_.erase(it);
      // PyTorch drops the capture's graph_reuse_context here (§14.10.1).
      if (auto c = mempool_to_capture_.find(id); c != mempool_to_capture_.end()) {
        reuse_visited_.erase(c->second);
        mempool_to_capture_.erase(c);
      }
      return;
    }
  }
  throw UsageError("end_allocate_to_pool(" + describe(id) +
                   "): not allocating to this pool (PyTorch: \"endAllocatePool: not currently recording to "
                   "mempool_id\")");
}

void PytorchPolicy::release_pool(PoolId id) {
  auto it = graph_pools_.find(id);
  if (it == graph_pools_.end()) throw UsageError("release_pool(" + describe(id) + "): no such private pool");
  PrivatePool& pp = *it->second;
  if (pp.use_count <= 0)
    throw UsageError("release_pool(" + describe(id) + "): every user has already released it (use count 0)");
  // At 0 the pool is freeable: release_cached_blocks may give its free segments back (§14.4).
  if (--pp.use_count == 0) graph_pools_freeable_.insert(id, &pp);
}

int PytorchPolicy::pool_use_count(PoolId id) const {
  auto it = graph_pools_.find(id);
  if (it == graph_pools_.end()) throw UsageError("pool_use_count(" + describe(id) + "): no such private pool");
  return it->second->use_count;
}

// get_pool: the newest active pool whose filter takes the stream, else the default pools (§14.2).
BlockPool& PytorchPolicy::get_pool(Bytes size, StreamId stream) {
  auto take = [&](const Underway& u) -> BlockPool& {
    PrivatePool& pp = *graph_pools_.at(u.id);
    return is_small_size(size) ? pp.small : pp.large;
  };
  if (flipped(RuleFlip::GetPoolOldest)) {  // rule flip: the oldest first
    for (auto it = captures_underway_.begin(); it != captures_underway_.end(); ++it)
      if (it->filter(stream)) return take(*it);
  } else {
    for (auto it = captures_underway_.rbegin(); it != captures_underway_.rend(); ++it)
      if (it->filter(stream)) return take(*it);
  }
  return is_small_size(size) ? small_blocks_ : large_blocks_;
}

bool PytorchPolicy::graph_capture_underway() const {
  return std::any_of(captures_underway_.begin(), captures_underway_.end(), [](const Underway& u) { return u.capture; });
}

// ===================================================================== Device allocation count (§14.5)

void PytorchPolicy::count_device_alloc(BlockPool& pool) {
  if (pool.owner != nullptr) ++pool.owner->device_allocs;
}

void PytorchPolicy::count_device_free(BlockPool& pool) {
  if (pool.owner == nullptr) return;
  // refuse_release_where_pytorch_fails made sure before anything changed (§14.8.1).
  CACHET_CHECK(pool.owner->device_allocs > 0);
  --pool.owner->device_allocs;
}

Bytes PytorchPolicy::private_pool_free_bytes() const {
  Bytes sum = 0;
  for (const auto& [id, pp] : graph_pools_) {
    for (const Block& b : pp->small.blocks) sum += b.size;
    for (const Block& b : pp->large.blocks) sum += b.size;
  }
  return sum;
}

// ===================================================================== Deferred frees (§14.7)

std::vector<DevicePtr> PytorchPolicy::deferred_frees() const {
  std::vector<DevicePtr> out;
  out.reserve(deferred_blocks_.size());
  for (const Block* b : deferred_blocks_) out.push_back(b->ptr);
  return out;
}

// §14.10.3: the blocks named first, in that order, then the others as they were; checked whole
// before the list changes.
void PytorchPolicy::set_deferred_free_order(const std::vector<DevicePtr>& order) {
  std::vector<Block*> first;
  first.reserve(deferred_blocks_.size());
  for (DevicePtr ptr : order) {
    const auto it = std::find_if(deferred_blocks_.begin(), deferred_blocks_.end(),
                                 [ptr](const Block* b) { return b->ptr == ptr; });
    if (it == deferred_blocks_.end())
      throw UsageError("set_deferred_free_order: " + hex(ptr) +
                       " is not a free deferred by a capture and still pending (deferred_frees() lists them; "
                       "docs/pytorch-allocator.md §14.10.3)");
    if (std::find(first.begin(), first.end(), *it) != first.end())
      throw UsageError("set_deferred_free_order: " + hex(ptr) + " is named twice; name each deferred free once");
    first.push_back(*it);
  }
  for (Block* b : deferred_blocks_)
    if (std::find(first.begin(), first.end(), b) == first.end()) first.push_back(b);
  deferred_blocks_ = std::move(first);
}

// The frees made with stream uses while a capture was under way get their events now, in the
// order they were freed or as set_deferred_free_order arranged them (PyTorch: its hash map's
// order, §14.10.3); the uses recorded during a capture need none (remove_cudagraph_stream_uses).
void PytorchPolicy::insert_events_deferred_until_no_capture() {
  free_markers_.clear();
  while (!deferred_blocks_.empty()) {
    Block* b = deferred_blocks_.front();
    for (StreamId s : b->capture_stream_uses)
      b->stream_uses.erase(std::remove(b->stream_uses.begin(), b->stream_uses.end(), s), b->stream_uses.end());
    b->capture_stream_uses.clear();
    if (b->stream_uses.empty()) {
      deferred_blocks_.erase(deferred_blocks_.begin());
      free_block(b);  // Deferred -> Free: every use was made during a capture
    } else {
      insert_events(b);  // Deferred -> AwaitingEvents; a failing event call leaves it deferred
      deferred_blocks_.erase(deferred_blocks_.begin());
    }
  }
}

// ===================================================================== Releasing pools (§14.5, §14.6)

void PytorchPolicy::empty_cache(PoolId id) {
  if (config_.no_caching) return;
  release_cached_blocks(id);
}

// The freeable private pools (all of them for the default id, else only that one), in PyTorch's
// order; each gives back its small half, then its large half, and is forgotten once no device
// allocation is left (§14.5, §14.6). One pool is found by its id, not by walking the list.
void PytorchPolicy::release_private_pools(PoolId id) {
  const bool large_first = flipped(RuleFlip::PrivateReleaseLargeFirst);  // rule flip
  auto release = [&](PrivatePool& pp) {
    release_blocks(large_first ? pp.large : pp.small);
    release_blocks(large_first ? pp.small : pp.large);
    if (pp.device_allocs == 0) forget_pool(&pp);  // may destroy pp
  };
  if (!id.is_default()) {
    if (!graph_pools_freeable_.contains(id)) return;
    PrivatePool& pp = *graph_pools_.at(id);
    synchronize_and_free_events(&pp);
    release(pp);
    return;
  }
  std::vector<PrivatePool*> pools = graph_pools_freeable_.in_order();
  if (flipped(RuleFlip::FreeableInIdOrder))  // rule flip: in id order
    std::ranges::sort(pools, {}, [](const PrivatePool* p) { return std::pair(p->id.first, p->id.second); });
  for (PrivatePool* pp : pools) release(*pp);
}

// PyTorch erases the pool at a device allocation count of 0 (§14.5). Its reservations without
// mapped memory go back to the device with it (unobservable: no stats, no trace). With expandable
// segments the count can reach 0 while pages are still mapped (§14.8.1): PyTorch then erases a
// pool that still holds blocks, which stay allocated or cached with nothing pointing to the pool
// any more. gpu/ keeps that pool object alive, orphaned: unknown by its id, never released again,
// its blocks still counted in the stats and, as in PyTorch's snapshot (which finds blocks through
// the known pools and the active blocks), its segments shown only from an active block on.
void PytorchPolicy::forget_pool(PrivatePool* pp) {
  std::vector<Block*> reservations;
  bool holds_memory = false;
  for (const auto& [base, seg] : segments_) {
    if (seg->pool->owner != pp) continue;
    if (seg->expandable && !seg->head->is_mapped() && seg->head->next == nullptr) reservations.push_back(seg->head);
    else holds_memory = true;
  }
  const PoolId id = pp->id;
  graph_pools_freeable_.erase(id);
  auto it = graph_pools_.find(id);
  if (holds_memory) {
    pp->orphaned = true;
    orphaned_pools_.push_back(std::move(it->second));
    graph_pools_.erase(it);
    return;
  }
  for (Block* b : reservations) release_expandable_segment(b);
  graph_pools_.erase(it);
}

// ===================================================================== Where PyTorch fails (§14.8)

// How many device frees (release_block, unmap_block) releasing `pp`'s free segments would make,
// counting every block waiting for events or for the end of a capture as free when `synced`
// (synchronize_and_free_events runs first): a cudaMalloc segment goes when all its blocks are
// free; an expandable segment unmaps each run of free blocks that covers a whole page.
int PytorchPolicy::device_frees_to_release(const PrivatePool& pp, bool synced) const {
  auto free_now = [&](const Block* b) {
    return b->is_free() || (synced && (b->state() == BlockState::AwaitingEvents || b->state() == BlockState::Deferred));
  };
  int n = 0;
  for (const auto& [base, seg] : segments_) {
    if (seg->pool->owner != &pp) continue;
    if (!seg->expandable) {
      bool all = true;
      for (const Block* b = seg->head; b != nullptr && all; b = b->next) all = free_now(b);
      n += all ? 1 : 0;
      continue;
    }
    for (const Block* b = seg->head; b != nullptr;) {
      if (!b->is_mapped() || !free_now(b)) {
        b = b->next;
        continue;
      }
      const DevicePtr begin = b->ptr;
      DevicePtr end = begin;
      for (; b != nullptr && b->is_mapped() && free_now(b); b = b->next) end = b->ptr + b->size;
      const Bytes first = (begin - seg->base + seg->page_size - 1) / seg->page_size;
      const Bytes last = (end - seg->base) / seg->page_size;
      n += first < last ? 1 : 0;
    }
  }
  return n;
}

// Before release_cached_blocks(id) changes anything: destroying a MemPool while another pool is
// active (§14.8.3); giving a freeable pool's memory back during a graph capture (§14.8.2); a
// release that would take a pool's device allocation count below 0 (§14.8.1).
void PytorchPolicy::refuse_release_where_pytorch_fails(PoolId id) const {
  const bool default_id = id.is_default();
  if (!default_id && graph_pools_freeable_.contains(id) && capture_underway())
    throw PyTorchFailsHere(
        "empty_cache(" + describe(id) + "): PyTorch 2.11 fails here (\"captures_underway.empty() INTERNAL ASSERT "
        "FAILED\"): a MemPool is being destroyed while pool " + describe(captures_underway_.back().id) +
        " is active (use_mem_pool or a capture); cachet refuses and changes nothing. Leave the other pool's "
        "use_mem_pool or end its capture first (docs/pytorch-allocator.md §14.8)");
  const bool synced = default_id ? !capture_underway() : true;
  for (const PrivatePool* pp : graph_pools_freeable_.in_order()) {
    if (!default_id && pp->id != id) continue;
    const int frees = device_frees_to_release(*pp, synced);
    if (frees > 0 && graph_capture_underway())
      throw PyTorchFailsHere(
          "empty_cache: PyTorch 2.11 fails here: releasing the free segments of private pool " + describe(pp->id) +
          " while a CUDA graph capture is under way needs cudaFree or an unmap, which the driver refuses "
          "(cudaErrorStreamCaptureUnsupported) and which invalidates the capture; cachet refuses and changes "
          "nothing. Call empty_cache after the capture ends (docs/pytorch-allocator.md §14.8)");
    if (frees > pp->device_allocs)
      throw PyTorchFailsHere(
          "releasing private pool " + describe(pp->id) + ": PyTorch 2.11 fails here (\"block->pool->"
          "owner_PrivatePool->cudaMalloc_count > 0 INTERNAL ASSERT FAILED\"): its expandable segments would unmap " +
          std::to_string(frees) + " ranges but its device allocation count (cudaMalloc_count) is " +
          std::to_string(pp->device_allocs) + "; cachet refuses and changes nothing. This memory of a private pool "
          "cannot be given back with expandable_segments:True (docs/pytorch-allocator.md §14.8)");
  }
}

// PyTorch's record_free_markers asks each of the block's streams (its own first, then its uses in a
// hash set's order) which capture it belongs to and asserts that they agree. Which capture a
// stream belongs to is the capture whose filter takes it (a capture's filter is its stream's
// capture id). Refused only where the assertion trips in every order: every use stream captures,
// one of them into another graph than the block's stream; a use stream outside any capture may
// end PyTorch's walk first, and then the free waits for the end of the capture (§14.10.1).
void PytorchPolicy::refuse_free_markers_across_graphs(const Block* b) const {
  auto capture_of = [&](StreamId s) -> const Underway* {
    for (auto it = captures_underway_.rbegin(); it != captures_underway_.rend(); ++it)
      if (it->capture && it->filter(s)) return &*it;
    return nullptr;
  };
  const Underway* own = capture_of(b->stream);
  if (own == nullptr) return;
  const Underway* other = nullptr;
  for (StreamId s : b->stream_uses) {
    const Underway* u = capture_of(s);
    if (u == nullptr) return;
    if (u->id != own->id) other = u;
  }
  if (other == nullptr) return;
  throw PyTorchFailsHere(
      "free(" + hex(b->ptr) + "): PyTorch 2.11 fails here (\"All streams in the same capture should agree on the "
      "graph\" INTERNAL ASSERT FAILED): with graph_capture_record_stream_reuse:True a free during a capture asks "
      "every stream the block was used on for its capture, and stream " + std::to_string(b->stream) +
      " captures into pool " + describe(own->id) + " while a stream it was used on captures into pool " +
      describe(other->id) + "; cachet refuses and changes nothing. Free the block after one of the captures "
      "ends, or turn graph_capture_record_stream_reuse off (docs/pytorch-allocator.md §14.8, §14.10.1)");
}

// malloc during a graph capture, before garbage collection (`gc`) or
// release_available_cached_blocks (`releasing`) would give memory back (§14.8.2). The only
// change malloc made so far, the free-block search's tick of the GC clock, is undone first.
void PytorchPolicy::refuse_giving_back_in_capture(const AllocParams& p, bool gc, bool releasing) {
  if (!graph_capture_underway()) return;
  const char* what = nullptr;
  if (gc && gc_would_release()) what = "garbage collection (garbage_collection_threshold)";
  else if (releasing && release_available_would_release(p)) what = "release_available_cached_blocks (max_split_size_mb)";
  if (what == nullptr) return;
  if (cap_.allowed() && config_.garbage_collection_threshold > 0.0) --p.pool->get_free_blocks_call_count;
  throw PyTorchFailsHere(
      "allocate(" + std::to_string(p.size) + " B, stream " + std::to_string(p.stream) +
      "): PyTorch 2.11 fails here: " + what + " would give a cached segment back with cudaFree while a CUDA "
      "graph capture is under way, which the driver refuses (cudaErrorStreamCaptureUnsupported) and which "
      "invalidates the capture; cachet refuses and changes nothing. Free cached memory (empty_cache) before "
      "the capture, or raise the cap (docs/pytorch-allocator.md §14.8)");
}

// garbage_collect_cached_blocks' first round (release.cpp) without releasing: whether any block goes.
bool PytorchPolicy::gc_would_release() const {
  const auto threshold =
      static_cast<Bytes>(config_.garbage_collection_threshold * static_cast<double>(*cap_.allowed()));
  if (total_allocated_memory_ <= threshold) return false;
  const std::int64_t clock = large_blocks_.get_free_blocks_call_count;
  Bytes total_age = 0;
  int freeable = 0;
  for (const Block& b : large_blocks_.blocks)
    if (!b.is_split()) total_age += static_cast<Bytes>(clock - b.gc_count_base), ++freeable;
  if (freeable == 0) return false;
  const double age_threshold = static_cast<double>(total_age) / freeable;
  return std::any_of(large_blocks_.blocks.begin(), large_blocks_.blocks.end(), [&](const Block& b) {
    return !b.is_split() && !b.expandable() && static_cast<double>(clock - b.gc_count_base) >= age_threshold;
  });
}

// release_available_cached_blocks (release.cpp) without releasing: whether any block goes.
bool PytorchPolicy::release_available_would_release(const AllocParams& p) const {
  const Bytes max_split = config_.max_split_size;
  if (max_split == kNoMaxSplit) return false;
  const BlockPool& pool = *p.pool;
  const Bytes key_size = std::max(p.size, max_split);
  auto it = pool.blocks.lower_bound(SizeKey{p.stream, key_size, 0}, SizeOrder{});
  if (it != pool.blocks.end() && it->stream == p.stream && !it->expandable()) return true;
  if (it == pool.blocks.begin()) return false;
  for (--it; it->size >= max_split && it->stream == p.stream; --it) {
    if (!it->expandable()) return true;
    if (it == pool.blocks.begin()) break;
  }
  return false;
}

}  // namespace cachet::gpu::detail

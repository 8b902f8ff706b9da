// Private pools (docs/pytorch-allocator.md §14): creation and use counts (§14.4), routing of
// allocations while a pool is active (§14.2), the device allocation count (§14.5), the deferred
// frees of a capture (§14.7), and the order PyTorch releases freeable pools in (§14.5).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>
#include <string>

#include "cachet/errors.h"
#include "cachet/model/allocator.h"
#include "cachet/model/sizes.h"
#include "cachet/rule_flip.h"

namespace cachet::model {

namespace {
std::string describe(PoolId id) {
  return "{" + std::to_string(id.first) + ", " + std::to_string(id.second) + "}";
}
std::string hex_address(std::uint64_t p) {
  char b[32];
  std::snprintf(b, sizeof b, "0x%llx", static_cast<unsigned long long>(p));
  return b;
}
int log2_floor(std::size_t n) {
  int r = 0;
  while (n >>= 1) ++r;
  return r;
}
}  // namespace

// ---- FreeableOrder: ska::flat_hash_map's slot order (private_pool.h) ----

void FreeableOrder::insert(PrivatePool* p) {
  if (contains(p)) return;
  emplace(p);
}

void FreeableOrder::emplace(PrivatePool* p) {
  if (buckets_ == 0) {
    grow();
    emplace(p);
    return;
  }
  std::size_t cur = index_for(hash(p));
  std::int8_t dist = 0;
  for (; cur < slots_.size() && slots_[cur].distance >= dist; ++cur, ++dist) {
  }
  // emplace_new_key
  if (dist == max_lookups_ || cur >= slots_.size() ||
      static_cast<double>(count_ + 1) > static_cast<double>(buckets_) * 0.5) {
    grow();
    emplace(p);
    return;
  }
  if (slots_[cur].distance < 0) {
    slots_[cur] = Slot{dist, p};
    ++count_;
    return;
  }
  // Robin Hood: the new key takes this slot, the one it displaces moves on.
  const std::size_t result = cur;
  PrivatePool* to_insert = p;
  std::swap(dist, slots_[cur].distance);
  std::swap(to_insert, slots_[cur].pool);
  for (++dist, ++cur;; ++cur) {
    if (cur >= slots_.size() || dist == max_lookups_) {
      std::swap(to_insert, slots_[result].pool);
      grow();
      emplace(to_insert);
      return;
    }
    if (slots_[cur].distance < 0) {
      slots_[cur] = Slot{dist, to_insert};
      ++count_;
      return;
    }
    if (slots_[cur].distance < dist) {
      std::swap(dist, slots_[cur].distance);
      std::swap(to_insert, slots_[cur].pool);
    }
    ++dist;
  }
}

void FreeableOrder::grow() { rehash(std::max<std::size_t>(4, 2 * buckets_)); }

void FreeableOrder::rehash(std::size_t buckets) {
  buckets = std::max(buckets, static_cast<std::size_t>(std::ceil(static_cast<double>(count_) / 0.5)));
  std::size_t pow2 = 2;
  while (pow2 < buckets) pow2 <<= 1;
  if (pow2 == buckets_) return;
  std::vector<Slot> old = std::move(slots_);
  buckets_ = pow2;
  max_lookups_ = std::max(4, log2_floor(pow2));
  shift_ = 64 - log2_floor(pow2);
  slots_.assign(buckets_ + static_cast<std::size_t>(max_lookups_) - 1, Slot{});
  count_ = 0;
  for (const Slot& s : old)
    if (s.distance >= 0) emplace(s.pool);
}

void FreeableOrder::erase(const PrivatePool* p) {
  std::size_t cur = 0;
  while (cur < slots_.size() && !(slots_[cur].distance >= 0 && slots_[cur].pool == p)) ++cur;
  if (cur == slots_.size()) return;
  slots_[cur] = Slot{};
  --count_;
  // Backward shift: later entries not at their desired slot move back by one.
  for (std::size_t next = cur + 1; next < slots_.size() && slots_[next].distance > 0; ++cur, ++next) {
    slots_[cur] = Slot{static_cast<std::int8_t>(slots_[next].distance - 1), slots_[next].pool};
    slots_[next] = Slot{};
  }
}

bool FreeableOrder::contains(const PrivatePool* p) const {
  for (const Slot& s : slots_)
    if (s.distance >= 0 && s.pool == p) return true;
  return false;
}

std::vector<PrivatePool*> FreeableOrder::in_order() const {
  std::vector<PrivatePool*> out;
  for (const Slot& s : slots_)
    if (s.distance >= 0) out.push_back(s.pool);
  return out;
}

// ---- the allocator's private pools ----

// §14.4: a new id makes a pool with one user; a known one gains a user. PyTorch asserts the pool
// is live: a pool all of whose users released it is not reused.
void Allocator::create_or_incref_pool(PoolId id) {
  if (id.is_default())
    throw UsageError("create_or_incref_pool: {0, 0} names the default pools, not a private pool");
  if (!graph_pools_.contains(id)) {
    graph_pools_.emplace(id, std::make_unique<PrivatePool>(id));  // use_count 1
  } else if (PrivatePool& pp = *graph_pools_.at(id); pp.use_count > 0) {
    ++pp.use_count;
  } else {
    throw UsageError("create_or_incref_pool(" + describe(id) +
                     "): every user has released this pool; make a new pool (§14.4)");
  }
}

void Allocator::begin_allocate_to_pool(PoolId id, PoolRoute route) {
  for (const auto& [active, r] : captures_underway_)
    if (active == id)
      throw UsageError("begin_allocate_to_pool(" + describe(id) +
                       "): already allocating to this pool (PyTorch: \"beginAllocateToPool: already "
                       "recording to mempool_id\")");
  // A capture's stream must not capture already (cudaStreamBeginCapture; §14.10.1).
  if (route.is_capture() && graphs_.capture_of(route.stream))
    throw UsageError("begin_allocate_to_pool(" + describe(id) + "): stream " + std::to_string(route.stream) +
                     " captures already (it joined another capture); a capture begins on a stream outside any "
                     "capture (docs/pytorch-allocator.md §14.10.1)");
  create_or_incref_pool(id);
  captures_underway_.emplace_back(id, route);
  if (route.is_capture()) graphs_.begin(route.stream);
}

void Allocator::end_allocate_to_pool(PoolId id) {
  const auto it = std::ranges::find(captures_underway_, id, &std::pair<PoolId, PoolRoute>::first);
  if (it == captures_underway_.end())
    throw UsageError("end_allocate_to_pool(" + describe(id) +
                     "): not allocating to this pool (PyTorch: \"endAllocatePool: not currently "
                     "recording to mempool_id\")");
  if (it->second.is_capture()) {
    // cudaStreamEndCapture first: refused, nothing changed, while a joined stream is not joined
    // back (§14.10.1); PyTorch forgets the capture's visited nodes (§14.10.1).
    const StreamId origin = it->second.stream;
    const CaptureId capture = graphs_.capture_of(origin).value_or(0);
    graphs_.end(origin);
    visited_.erase(capture);
  }
  captures_underway_.erase(it);
}

void Allocator::release_pool(PoolId id) {
  auto it = graph_pools_.find(id);
  if (it == graph_pools_.end())
    throw UsageError("release_pool(" + describe(id) + "): no such private pool");
  PrivatePool& pp = *it->second;
  if (pp.use_count <= 0)
    throw UsageError("release_pool(" + describe(id) + "): every user has already released it");
  // At 0 the pool is freeable: release_cached_blocks may give its free segments back (§14.4).
  if (--pp.use_count == 0) graph_pools_freeable_.insert(&pp);
}

int Allocator::pool_use_count(PoolId id) const {
  auto it = graph_pools_.find(id);
  if (it == graph_pools_.end())
    throw UsageError("pool_use_count(" + describe(id) + "): no such private pool");
  return it->second->use_count;
}

// get_pool: the newest active pool whose route takes the allocation (its stream, or the thread that
// makes it: §14.10.2), else the default pools (§14.2).
BlockPool& Allocator::get_pool(Bytes size, StreamId stream, ThreadIndex thread) {
  auto take = [&](const auto& underway) -> BlockPool& {
    PrivatePool& pp = *graph_pools_.at(underway.first);
    return is_small_size(size) ? pp.small : pp.large;
  };
  if (flipped(RuleFlip::GetPoolOldest)) {  // rule flip: the oldest first
    for (auto it = captures_underway_.begin(); it != captures_underway_.end(); ++it)
      if (route_takes(it->second, stream, thread)) return take(*it);
  } else {
    for (auto it = captures_underway_.rbegin(); it != captures_underway_.rend(); ++it)
      if (route_takes(it->second, stream, thread)) return take(*it);
  }
  return is_small_size(size) ? small_blocks_ : large_blocks_;
}

void Allocator::count_device_alloc(BlockPool& pool) {
  if (pool.owner != nullptr) ++pool.owner->device_allocs;
}

// release_block and unmap_block of a private pool's memory (§14.5). PyTorch asserts the count is
// positive first; expandable segments can break that (§14.8).
void Allocator::count_device_free(BlockPool& pool, const char* where) {
  if (pool.owner == nullptr) return;
  if (pool.owner->device_allocs <= 0)
    throw PyTorchFailure(
        std::string("PyTorch 2.11 fails here: ") + where + " of private pool " +
        describe(pool.owner->id) +
        " with its device allocation count at 0 (\"block->pool->owner_PrivatePool->cudaMalloc_count "
        "> 0 INTERNAL ASSERT FAILED\"): expandable segments unmapped more ranges than they grew by "
        "(docs/pytorch-allocator.md §14.8)");
  --pool.owner->device_allocs;
}

std::vector<std::uint64_t> Allocator::deferred_frees() const {
  std::vector<std::uint64_t> out;
  out.reserve(deferred_blocks_.size());
  for (const Block* b : deferred_blocks_) out.push_back(b->ptr);
  return out;
}

// §14.10.3: the frees named come first, in the order named, the others after them as they were.
// The order is checked whole before the list changes: every address named is a pending deferred
// free, named once.
void Allocator::set_deferred_free_order(const std::vector<std::uint64_t>& order) {
  std::set<std::uint64_t> named;
  for (std::uint64_t ptr : order) {
    if (std::ranges::none_of(deferred_blocks_, [ptr](const Block* b) { return b->ptr == ptr; }))
      throw UsageError("set_deferred_free_order: " + hex_address(ptr) +
                       " is not a free deferred by a capture and still pending (deferred_frees() lists them; "
                       "docs/pytorch-allocator.md §14.10.3)");
    if (!named.insert(ptr).second)
      throw UsageError("set_deferred_free_order: " + hex_address(ptr) + " is named twice; name each deferred free once");
  }
  // A block's place: where the order names its address (order.size(): not named, after them all).
  const auto place = [&order](const Block* b) { return std::ranges::find(order, b->ptr) - order.begin(); };
  std::ranges::stable_sort(deferred_blocks_, {}, place);
}

// The frees made with stream uses while a capture was under way get their events now; stream
// uses recorded during a capture need none (§14.7).
void Allocator::insert_events_deferred_until_no_capture() {
  // PyTorch walks a hash map keyed by block address (§14.10.3); the model takes the frees in the
  // order they were made, or in the order set_deferred_free_order gave (a replay's recording):
  // visible only in the order of free_completed rows and of events, and in the split peaks.
  std::vector<Block*> blocks = std::move(deferred_blocks_);
  deferred_blocks_.clear();
  free_markers_.clear();
  for (Block* b : blocks) {
    for (StreamId s : b->capture_stream_uses) b->stream_uses.erase(s);
    b->capture_stream_uses.clear();
    if (b->stream_uses.empty())
      free_block(b);  // Deferred -> Free: every use was inside the capture
    else
      insert_events(b);  // Deferred -> AwaitingEvents
  }
}

// cudaFree, cuMemUnmap: a CUDA graph capture (global capture mode) forbids them on every thread;
// the driver fails the call and invalidates the capture, and PyTorch raises (§14.8). A
// use_mem_pool is no capture: nothing is refused then.
void Allocator::refuse_device_free_in_capture(const char* what) const {
  for (const auto& [id, route] : captures_underway_)
    if (route.is_capture())
      throw PyTorchFailure(std::string("PyTorch 2.11 fails here: ") + what + " while CUDA graph capture " +
                           describe(id) +
                           " is under way: the driver refuses it (cudaErrorStreamCaptureUnsupported) and "
                           "invalidates the capture; garbage collection, release_available_cached_blocks "
                           "and empty_cache give memory back even during a capture "
                           "(docs/pytorch-allocator.md §14.8)");
}

// record_free_markers (graph_capture_record_stream_reuse:True): the block's allocation stream,
// then each stream it was used on, is asked which capture it belongs to; the first stream not
// capturing ends the walk (the free waits for the capture's end, §14.7), and two streams capturing
// into different graphs trip the assertion. The walk's order over the uses is a hash set's, so the
// model reports the failure only where every use stream captures: then one of them captures
// another graph than the allocation stream, whatever the order (§14.8 case 4, §14.10.1).
void Allocator::refuse_free_markers_across_graphs(const Block& block) const {
  // The graph a stream captures into, named by the pool of the capture whose route takes it.
  auto graph_of = [&](StreamId s) -> const PoolId* {
    for (auto it = captures_underway_.rbegin(); it != captures_underway_.rend(); ++it)
      if (it->second.is_capture() && route_takes(it->second, s, 0)) return &it->first;
    return nullptr;
  };
  const PoolId* own = graph_of(block.stream);
  if (own == nullptr) return;
  const PoolId* other = nullptr;
  for (StreamId s : block.stream_uses) {
    const PoolId* g = graph_of(s);
    if (g == nullptr) return;  // not capturing: the walk stops here or at another such stream
    if (*g != *own) other = g;
  }
  if (other == nullptr) return;
  throw PyTorchFailure(
      "PyTorch 2.11 fails here: free(" + hex_address(block.ptr) + ") during the capture into pool " + describe(*own) +
      " with graph_capture_record_stream_reuse:True: the block was used on a stream capturing into pool " +
      describe(*other) + ", and record_free_markers asserts that all its streams capture one graph "
      "(\"All streams in the same capture should agree on the graph\" INTERNAL ASSERT FAILED) "
      "(docs/pytorch-allocator.md §14.8, §14.10.1)");
}

Bytes Allocator::private_pool_free_bytes() const {
  Bytes sum = 0;
  for (const auto& [id, pp] : graph_pools_) {
    for (const Block* b : pp->large.blocks) sum += b->size;
    for (const Block* b : pp->small.blocks) sum += b->size;
  }
  return sum;
}

}  // namespace cachet::model

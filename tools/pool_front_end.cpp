// PyTorch's front end of private pools for recording replays (pool_front_end.h,
// docs/pytorch-allocator.md §14.9).
#include "pool_front_end.h"

#include <fmt/format.h>

#include "cachet/errors.h"

namespace cachet::cli {

namespace {
// at::empty({1}, kLong): 8 bytes (§14.9).
constexpr Bytes kGeneratorTensorBytes = 8;
}  // namespace

StreamId PoolFrontEnd::stream(std::uint32_t index) const {
  if (index >= streams_.size())
    throw std::invalid_argument(
        fmt::format("stream index {} but the recording has {} streams", index, streams_.size()));
  return streams_[index];
}

PoolId PoolFrontEnd::mempool(std::uint64_t k, const char* op) const {
  auto it = mempools_.find(k);
  if (it == mempools_.end())
    throw UsageError(fmt::format("[\"{}\", {}]: MemPool {} does not exist (it was never entered with "
                                 "\"pb\", or \"pr\" dropped it)",
                                 op, k, k));
  return it->second;
}

void PoolFrontEnd::apply(const ops::Op& any) {
  if (const auto* op = std::get_if<ops::UseMemPoolBegin>(&any)) {
    const std::uint64_t k = op->pool;
      if (in_use_.contains(k)) throw UsageError(fmt::format("[\"pb\", {}]: MemPool {} is already in use", k, k));
      if (!mempools_.contains(k)) {
        // torch.cuda.MemPool(): a user id {0, n}, createOrIncrefPool (use_count 1).
        const PoolId id{0, next_user_id_++};
        engine_.create_or_incref_pool(id);
        mempools_[k] = id;
        pool_ids_.push_back(io::RecordedPool{std::to_string(k), id});
      }
      // use_mem_pool: beginAllocateToPool with a filter for this thread (use_count + 1).
      engine_.begin_allocate_to_pool(mempools_[k], PoolRoute{PoolRoute::Kind::CurrentThread, 0});
      in_use_.insert(k);
      return;
  }
  if (const auto* op = std::get_if<ops::UseMemPoolEnd>(&any)) {
    const std::uint64_t k = op->pool;
      const PoolId id = mempool(k, "pe");
      if (!in_use_.contains(k)) throw UsageError(fmt::format("[\"pe\", {}]: MemPool {} is not in use", k, k));
      engine_.end_allocate_to_pool(id);
      engine_.release_pool(id);
      in_use_.erase(k);
      return;
  }
  if (const auto* op = std::get_if<ops::ReleasePool>(&any)) {
    const std::uint64_t k = op->pool;
      const PoolId id = mempool(k, "pr");
      if (in_use_.contains(k))
        throw UsageError(fmt::format("[\"pr\", {}]: MemPool {} is still in use (leave it with \"pe\" first)", k, k));
      // ~MemPool: releasePool, then emptyCache(id).
      mempools_.erase(k);
      engine_.release_pool(id);
      engine_.empty_cache_of(id);
      return;
  }
  if (const auto* op = std::get_if<ops::CaptureBegin>(&any)) {
    const std::uint64_t k = op->graph;
    const std::int64_t share = op->share ? static_cast<std::int64_t>(*op->share) : -1;
      if (graphs_.contains(k))
        throw UsageError(fmt::format("[\"gb\", {}, ...]: graph {} exists (reset it with \"gx\" first)", k, k));
      const StreamId s = stream(static_cast<std::uint32_t>(op->stream));
      PoolId id;
      if (share >= 0) {
        auto it = graphs_.find(static_cast<std::uint64_t>(share));
        if (it == graphs_.end() || !it->second.capture_ended)
          throw UsageError(fmt::format("[\"gb\", {}, {}, {}]: graph {} has no pool to share (no finished capture)",
                                       k, op->stream, share, share));
        id = it->second.pool;
      }
      // The default generator registers the graph before the pool is entered: its seed and
      // offset go to the default pool on the capture stream.
      if (registered_.empty()) {
        seed_ = engine_.malloc(kGeneratorTensorBytes, s);
        offset_ = engine_.malloc(kGeneratorTensorBytes, s);
      }
      registered_.insert(k);
      if (share < 0) id = PoolId{next_graph_id_++, 0};
      engine_.begin_allocate_to_pool(id, PoolRoute{PoolRoute::Kind::CaptureStream, s});
      graphs_[k] = Graph{id, false};
      return;
  }
  if (const auto* op = std::get_if<ops::CaptureEnd>(&any)) {
    const std::uint64_t k = op->graph;
      auto it = graphs_.find(k);
      if (it == graphs_.end() || it->second.capture_ended)
        throw UsageError(fmt::format("[\"ge\", {}]: graph {} is not capturing", k, k));
      engine_.end_allocate_to_pool(it->second.pool);
      it->second.capture_ended = true;
      pool_ids_.push_back(io::RecordedPool{"g" + std::to_string(k), it->second.pool});
      return;
  }
  if (const auto* op = std::get_if<ops::GraphReset>(&any)) {
    const std::uint64_t k = op->graph;
      auto it = graphs_.find(k);
      if (it == graphs_.end()) throw UsageError(fmt::format("[\"gx\", {}]: graph {} does not exist", k, k));
      if (!it->second.capture_ended)
        throw UsageError(fmt::format("[\"gx\", {}]: graph {} is still capturing (end it with \"ge\" first)", k, k));
      engine_.release_pool(it->second.pool);
      graphs_.erase(it);
      registered_.erase(k);
      if (registered_.empty()) {
        engine_.free(*seed_);
        engine_.free(*offset_);
        seed_.reset();
        offset_.reset();
      }
      return;
  }
  throw std::logic_error("PoolFrontEnd::apply: not a pool or capture op");
}

std::vector<io::LivePool> PoolFrontEnd::live_pools() const {
  std::vector<io::LivePool> out;
  for (const auto& [k, id] : mempools_) out.push_back(io::LivePool{k, id, engine_.pool_use_count(id)});
  return out;
}

}  // namespace cachet::cli

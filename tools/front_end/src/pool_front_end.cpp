// PyTorch's front end of private pools as allocator calls (cachet/front_end/pool_front_end.h,
// docs/pytorch-allocator.md §14.9).
#include "cachet/front_end/pool_front_end.h"

#include <fmt/format.h>

#include <stdexcept>

#include "cachet/errors.h"

namespace cachet::front_end {

StreamId PoolFrontEnd::stream(std::uint64_t index) const {
  if (streams_ == nullptr) return static_cast<StreamId>(index);
  if (index >= streams_->size())
    throw std::invalid_argument(
        fmt::format("stream index {} but the recording has {} streams", index, streams_->size()));
  return (*streams_)[index];
}

PoolId PoolFrontEnd::mempool(std::uint64_t k, const char* op) const {
  auto it = mempools_.find(k);
  if (it == mempools_.end())
    throw UsageError(fmt::format("{} p{}: MemPool {} does not exist (it was never entered with use_pool, or "
                                 "release_pool dropped it)",
                                 op, k, k));
  return it->second;
}

void PoolFrontEnd::apply(const ops::Op& any) {
  if (const auto* op = std::get_if<ops::UseMemPoolBegin>(&any)) return use_pool(op->pool, op->thread);
  if (const auto* op = std::get_if<ops::UseMemPoolEnd>(&any)) return end_pool(op->pool);
  if (const auto* op = std::get_if<ops::ReleasePool>(&any)) return release(op->pool);
  if (const auto* op = std::get_if<ops::CaptureBegin>(&any)) return capture_begin(*op);
  if (const auto* op = std::get_if<ops::CaptureEnd>(&any)) return capture_end(op->graph);
  if (const auto* op = std::get_if<ops::GraphReset>(&any)) return reset(op->graph);
  throw std::logic_error("PoolFrontEnd::apply: not a pool or capture op: " + ops::show(any));
}

void PoolFrontEnd::use_pool(std::uint64_t k, ThreadIndex thread) {
  if (in_use_.contains(k)) throw UsageError(fmt::format("use_pool p{}: MemPool {} is already in use", k, k));
  if (!mempools_.contains(k)) {
    // torch.cuda.MemPool(): a user id {0, n}, createOrIncrefPool (use_count 1).
    const PoolId id{0, next_user_id_++};
    ids_used_.insert(id);
    calls_.create_or_incref_pool(id);
    mempools_[k] = id;
    pool_ids_.push_back(MadePool{std::to_string(k), id});
  }
  // use_mem_pool: beginAllocateToPool with a filter for the entering thread (use_count + 1).
  calls_.begin_allocate_to_pool(mempools_[k], PoolRoute{PoolRoute::Kind::CurrentThread, 0, thread});
  in_use_.insert(k);
}

void PoolFrontEnd::end_pool(std::uint64_t k) {
  const PoolId id = mempool(k, "end_pool");
  if (!in_use_.contains(k)) throw UsageError(fmt::format("end_pool p{}: MemPool {} is not in use", k, k));
  in_use_.erase(k);
  calls_.end_allocate_to_pool(id);
  calls_.release_pool(id);
}

void PoolFrontEnd::release(std::uint64_t k) {
  const PoolId id = mempool(k, "release_pool");
  if (in_use_.contains(k))
    throw UsageError(fmt::format("release_pool p{}: MemPool {} is still in use (leave it with end_pool first)", k, k));
  // ~MemPool: releasePool, then emptyCache(id).
  mempools_.erase(k);
  calls_.release_pool(id);
  calls_.empty_cache_of(id);
}

void PoolFrontEnd::capture_begin(const ops::CaptureBegin& op) {
  const std::uint64_t k = op.graph;
  if (graphs_.contains(k))
    throw UsageError(fmt::format("{}: graph {} exists (reset it with graph_reset first)", ops::show(op), k));
  const StreamId s = stream(op.stream);
  // CUDAGraph::capture_begin: TORCH_CHECK(stream != getDefaultCUDAStream()).
  if (s == 0)
    throw UsageError(fmt::format("{}: CUDA graphs must be captured on a non-default stream", ops::show(op)));
  // CUDAGeneratorState::register_graph asserts the current stream is not capturing (and
  // cudaStreamBeginCapture would fail): one capture per stream at a time.
  for (const auto& [other, g] : graphs_)
    if (!g.capture_ended && g.stream == s)
      throw UsageError(fmt::format("{}: graph {} is capturing on that stream (end it with capture_end first)",
                                   ops::show(op), other));
  std::optional<PoolId> shared;
  if (op.share) {
    auto it = graphs_.find(*op.share);
    if (it == graphs_.end() || !it->second.capture_ended)
      throw UsageError(fmt::format("{}: graph {} has no pool to share (no finished capture)", ops::show(op), *op.share));
    shared = it->second.pool;
  }
  // The default generator registers the graph before the pool is entered: its seed and offset
  // go to the default pool on the capture stream (the current stream).
  register_graph(k, s);
  const PoolId id = shared ? *shared : PoolId{next_graph_id_++, 0};
  ids_used_.insert(id);
  try {
    calls_.begin_allocate_to_pool(id, PoolRoute{PoolRoute::Kind::CaptureStream, s});
  } catch (...) {
    unregister_graph(k);  // the graph object is gone with its failed capture
    throw;
  }
  // CUDAGraph::capture_begin, after cudaStreamBeginCapture: CUDAGeneratorState::capture_prologue
  // fills the seed and the offset (seed_extragraph_.fill_, offset_extragraph_.fill_), the graph's
  // first two nodes, on the capture stream. graph_capture_record_stream_reuse sees them as the
  // stream's dependencies (docs/pytorch-allocator.md §14.10.1).
  calls_.kernel(s);
  calls_.kernel(s);
  graphs_[k] = Graph{id, s, false};
}

void PoolFrontEnd::capture_end(std::uint64_t k) {
  auto it = graphs_.find(k);
  if (it == graphs_.end() || it->second.capture_ended)
    throw UsageError(fmt::format("capture_end g{}: graph {} is not capturing", k, k));
  calls_.end_allocate_to_pool(it->second.pool);
  it->second.capture_ended = true;
  pool_ids_.push_back(MadePool{"g" + std::to_string(k), it->second.pool});
}

void PoolFrontEnd::reset(std::uint64_t k) {
  auto it = graphs_.find(k);
  if (it == graphs_.end()) throw UsageError(fmt::format("graph_reset g{}: graph {} does not exist", k, k));
  if (!it->second.capture_ended)
    throw UsageError(fmt::format("graph_reset g{}: graph {} is still capturing (end it with capture_end first)", k, k));
  const PoolId id = it->second.pool;
  graphs_.erase(it);
  calls_.release_pool(id);
  unregister_graph(k);
}

// CUDAGeneratorState::register_graph: the first registered graph allocates seed and offset
// (at::empty, then the assignment drops a tensor held from an earlier failed registration).
void PoolFrontEnd::register_graph(std::uint64_t k, StreamId s) {
  if (registered_.empty()) {
    for (std::optional<std::uint64_t>* slot : {&seed_, &offset_}) {
      const std::uint64_t fresh = calls_.malloc(kGeneratorTensorBytes, s);
      const std::optional<std::uint64_t> old = *slot;
      *slot = fresh;
      if (old) calls_.free(*old);
    }
  }
  registered_.insert(k);
}

// CUDAGeneratorState::unregister_graph: the last one frees seed, then offset.
void PoolFrontEnd::unregister_graph(std::uint64_t k) {
  registered_.erase(k);
  if (!registered_.empty()) return;
  for (std::optional<std::uint64_t>* slot : {&seed_, &offset_}) {
    if (!*slot) continue;
    const std::uint64_t p = **slot;
    slot->reset();
    calls_.free(p);
  }
}

std::vector<AlivePool> PoolFrontEnd::live_pools() const {
  std::vector<AlivePool> out;
  for (const auto& [k, id] : mempools_) out.push_back(AlivePool{k, id, calls_.pool_use_count(id)});
  return out;
}

std::vector<std::uint64_t> PoolFrontEnd::mempools_alive() const {
  std::vector<std::uint64_t> out;
  for (const auto& [k, id] : mempools_) out.push_back(k);
  return out;
}

PoolFrontEnd::GraphState PoolFrontEnd::graph(std::uint64_t k) const {
  auto it = graphs_.find(k);
  if (it == graphs_.end()) return GraphState::None;
  return it->second.capture_ended ? GraphState::Captured : GraphState::Capturing;
}

std::vector<std::uint64_t> PoolFrontEnd::graphs(GraphState state) const {
  std::vector<std::uint64_t> out;
  for (const auto& [k, g] : graphs_)
    if (graph(k) == state) out.push_back(k);
  return out;
}

std::optional<StreamId> PoolFrontEnd::capture_stream(std::uint64_t k) const {
  auto it = graphs_.find(k);
  if (it == graphs_.end()) return std::nullopt;
  return it->second.stream;
}

bool PoolFrontEnd::underway() const {
  if (!in_use_.empty()) return true;
  for (const auto& [k, g] : graphs_)
    if (!g.capture_ended) return true;
  return false;
}

}  // namespace cachet::front_end

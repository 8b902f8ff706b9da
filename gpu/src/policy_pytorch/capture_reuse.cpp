// policy:pytorch, graph_capture_record_stream_reuse:True (docs/pytorch-allocator.md §14.10.1): a
// free during a capture keeps the terminals of its block's streams as free markers
// (record_free_markers), and a malloc during a capture frees the deferred blocks of its stream
// whose markers the stream's work is ordered after (free_safe_blocks_in_capture, update_visited).
// The graph is the backend's (capture_info, node_dependencies: cudaStreamGetCaptureInfo and
// cudaGraphNodeGetDependencies on CUDA, a simulation on the host backend).
#include <algorithm>
#include <string>

#include "cachet/errors.h"
#include "messages.h"
#include "policy_pytorch/policy.h"

namespace cachet::gpu::detail {

CaptureInfo PytorchPolicy::capture_info(StreamId stream) {
  auto r = mem_->capture_info(stream);
  if (!r.is_ok())
    throw DeviceError("cudaStreamGetCaptureInfo(stream " + std::to_string(stream) + ") failed on device " +
                      std::to_string(device_) + ": " + r.status.message);
  return std::move(r.value);
}

// The allocation stream first, then the use streams: the first one not capturing leaves no
// markers (the block waits for the end of the captures, §14.7). The assertion that they capture
// one graph is refuse_free_markers_across_graphs' (§14.8 case 4), checked before.
std::vector<GraphNode> PytorchPolicy::record_free_markers(const Block* b) {
  if (!caps_.capture_graph) return {};
  std::vector<GraphNode> markers;
  auto try_record = [&](StreamId s) {
    CaptureInfo info = capture_info(s);
    if (!info.capturing) return false;
    markers.insert(markers.end(), info.terminals.begin(), info.terminals.end());
    return true;
  };
  if (!try_record(b->stream)) return {};
  for (StreamId s : b->stream_uses)
    if (!try_record(s)) return {};
  std::sort(markers.begin(), markers.end());
  markers.erase(std::unique(markers.begin(), markers.end()), markers.end());
  return markers;
}

// Nothing when the stream does not capture or depends on nothing yet. Else the stream's
// terminals and every node reachable backwards from them join the visited set of (capture,
// stream), which only grows; then each deferred block allocated on this stream whose markers are
// all visited drops its stream uses and goes through free_block, no event. PyTorch walks its
// deferred map in hash order; cachet in the order of the frees (§14.10.3).
void PytorchPolicy::free_safe_blocks_in_capture(StreamId stream) {
  const CaptureInfo info = capture_info(stream);
  if (!info.capturing || info.terminals.empty()) return;
  if (!reuse_visited_.contains(info.capture_id)) {
    // The pool of the newest capture whose filter takes the stream (PyTorch asserts there is one).
    for (auto it = captures_underway_.rbegin(); it != captures_underway_.rend(); ++it) {
      if (it->filter(stream)) {
        mempool_to_capture_[it->id] = info.capture_id;
        break;
      }
    }
  }
  std::vector<GraphNode>& visited = reuse_visited_[info.capture_id][stream];  // sorted
  std::vector<GraphNode> todo = info.terminals;
  while (!todo.empty()) {
    const GraphNode v = todo.back();
    todo.pop_back();
    auto at = std::lower_bound(visited.begin(), visited.end(), v);
    if (at != visited.end() && *at == v) continue;
    visited.insert(at, v);
    auto parents = mem_->node_dependencies(v);
    if (!parents.is_ok())
      throw DeviceError("cudaGraphNodeGetDependencies failed on device " + std::to_string(device_) + ": " +
                        parents.status.message);
    todo.insert(todo.end(), parents.value.begin(), parents.value.end());
  }
  std::vector<Block*> safe;
  for (Block* b : deferred_blocks_) {
    if (b->stream != stream) continue;
    auto m = free_markers_.find(b);
    if (m == free_markers_.end()) continue;
    if (std::all_of(m->second.begin(), m->second.end(),
                    [&](GraphNode n) { return std::binary_search(visited.begin(), visited.end(), n); }))
      safe.push_back(b);
  }
  for (Block* b : safe) {
    free_markers_.erase(b);
    deferred_blocks_.erase(std::find(deferred_blocks_.begin(), deferred_blocks_.end(), b));
    b->stream_uses.clear();  // the graph orders every use before what follows
    free_block(b);           // Deferred -> Free
  }
}

}  // namespace cachet::gpu::detail

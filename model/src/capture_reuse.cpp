// graph_capture_record_stream_reuse:True (docs/pytorch-allocator.md §14.10.1): a free during a
// capture records free markers (record_free_markers), and a malloc during a capture frees the
// deferred blocks of its stream that the capture's graph orders before it
// (free_safe_blocks_in_capture, update_visited). The graph itself: cachet/model/capture_graph.h.
#include <algorithm>

#include "cachet/model/allocator.h"

namespace cachet::model {

// CUDAGraph's filter takes a stream whose capture id is its capture's; a use_mem_pool's takes the
// thread that entered it (§14.10.2).
bool Allocator::route_takes(const PoolRoute& route, StreamId s, ThreadIndex t) const {
  if (!route.is_capture()) return route.takes(s, t);
  const auto own = graphs_.capture_of(route.stream);
  if (!own) return s == route.stream;  // not begun on the graph side (no capture under way)
  return graphs_.capture_of(s) == own;
}

// The allocation stream, then each use stream: the first one not capturing leaves no markers (the
// block waits for the end, §14.7); else the markers are the union of their terminals. The
// assertion of two graphs is refuse_free_markers_across_graphs' (§14.8 case 4), checked before.
std::vector<NodeId> Allocator::record_free_markers(const Block& block) const {
  std::set<NodeId> markers;
  auto try_record = [&](StreamId s) {
    if (!graphs_.capture_of(s)) return false;
    const auto& t = graphs_.terminals(s);
    markers.insert(t.begin(), t.end());
    return true;
  };
  if (!try_record(block.stream)) return {};
  for (StreamId s : block.stream_uses)
    if (!try_record(s)) return {};
  return {markers.begin(), markers.end()};
}

// Nothing when the stream does not capture or depends on nothing yet. Else the nodes the stream
// depends on and their ancestors join visited[capture][stream] (it only grows), and every deferred
// block allocated on this stream whose markers are all visited drops its stream uses and goes
// through free_block, no event. PyTorch walks its deferred map in hash order; the model takes the
// frees in their order (as insert_events_deferred_until_no_capture does, §14.10.3).
void Allocator::free_safe_blocks_in_capture(StreamId stream) {
  const auto capture = graphs_.capture_of(stream);
  if (!capture) return;
  const auto& terminals = graphs_.terminals(stream);
  if (terminals.empty()) return;
  std::set<NodeId>& visited = visited_[*capture][stream];
  graphs_.add_ancestors(terminals, visited);
  std::vector<Block*> freed;
  for (Block* b : deferred_blocks_) {
    if (b->stream != stream) continue;
    auto m = free_markers_.find(b);
    if (m == free_markers_.end()) continue;  // no markers: it waits for the end of the capture
    if (!std::all_of(m->second.begin(), m->second.end(), [&](NodeId n) { return visited.contains(n); })) continue;
    free_markers_.erase(m);
    freed.push_back(b);
  }
  for (Block* b : freed) {
    std::erase(deferred_blocks_, b);
    b->stream_uses.clear();  // the graph orders every use before what follows: no event
    free_block(b);           // Deferred -> Free
  }
}

}  // namespace cachet::model

// The device's side of CUDA graph captures (cachet/model/capture_graph.h;
// docs/pytorch-allocator.md §14.10.1).
#include "cachet/model/capture_graph.h"

#include <string>

#include "cachet/errors.h"

namespace cachet::model {

namespace {
std::string s(StreamId stream) { return std::to_string(stream); }
}  // namespace

CaptureId CaptureGraphs::begin(StreamId origin) {
  if (const auto id = capture_of(origin))
    throw UsageError("capture_begin on stream " + s(origin) + ": the stream already captures (capture " +
                     std::to_string(*id) + "); a capture begins on a stream outside any capture "
                     "(docs/pytorch-allocator.md §14.10.1)");
  const CaptureId id = next_capture_++;
  captures_[id] = Capture{origin, {}};
  streams_[origin] = Capturing{id, {}};
  return id;
}

void CaptureGraphs::check_end(StreamId origin) const {
  const auto id = capture_of(origin);
  if (!id || captures_.at(*id).origin != origin)
    throw UsageError("capture_end on stream " + s(origin) + ": no capture began on this stream");
  std::set<NodeId> joined;
  add_ancestors(streams_.at(origin).deps, joined);
  for (const auto& [stream, c] : streams_) {
    if (c.capture != *id || stream == origin) continue;
    for (NodeId n : c.deps)
      if (!joined.contains(n))
        throw UsageError("capture_end on stream " + s(origin) + ": stream " + s(stream) +
                         " joined the capture and was not joined back (cudaErrorStreamCaptureUnjoined: its last "
                         "captured work is not ordered before the end); make the capture stream wait_stream on it "
                         "first (docs/pytorch-allocator.md §14.10.1)");
  }
}

void CaptureGraphs::end(StreamId origin) {
  check_end(origin);
  const CaptureId id = streams_.at(origin).capture;
  std::erase_if(streams_, [&](const auto& e) { return e.second.capture == id; });
  captures_.erase(id);
}

void CaptureGraphs::wait_stream(StreamId waiter, StreamId waited) {
  const auto from = capture_of(waited);
  const auto to = capture_of(waiter);
  if (!from) {
    if (to)
      throw UsageError("wait_stream(s" + s(waiter) + ", s" + s(waited) + "): stream " + s(waiter) +
                       " captures and stream " + s(waited) + " does not; a capture may not wait on work outside it "
                       "(cudaErrorStreamCaptureIsolation, docs/pytorch-allocator.md §14.10.1)");
    return;  // no capture involved: nothing the allocator sees
  }
  if (to && *to != *from)
    throw UsageError("wait_stream(s" + s(waiter) + ", s" + s(waited) + "): the two streams capture two different "
                     "graphs (cudaErrorStreamCaptureMerge, docs/pytorch-allocator.md §14.10.1)");
  if (waiter == waited) return;
  const std::set<NodeId> deps = streams_.at(waited).deps;
  Capturing& c = streams_[waiter];  // joins the capture when not in it yet
  c.capture = *from;
  c.deps.insert(deps.begin(), deps.end());
}

void CaptureGraphs::kernel(StreamId stream) {
  auto it = streams_.find(stream);
  if (it == streams_.end()) return;  // runs on the device; the allocator sees nothing of it
  const NodeId n = next_node_++;
  captures_.at(it->second.capture).parents[n] = {it->second.deps.begin(), it->second.deps.end()};
  it->second.deps = {n};
}

std::optional<CaptureId> CaptureGraphs::capture_of(StreamId stream) const {
  auto it = streams_.find(stream);
  if (it == streams_.end()) return std::nullopt;
  return it->second.capture;
}

const std::set<NodeId>& CaptureGraphs::terminals(StreamId stream) const {
  static const std::set<NodeId> none;
  auto it = streams_.find(stream);
  return it == streams_.end() ? none : it->second.deps;
}

void CaptureGraphs::add_ancestors(const std::set<NodeId>& from, std::set<NodeId>& visited) const {
  std::vector<NodeId> todo(from.begin(), from.end());
  while (!todo.empty()) {
    const NodeId v = todo.back();
    todo.pop_back();
    if (!visited.insert(v).second) continue;
    for (const auto& [id, c] : captures_) {
      if (auto p = c.parents.find(v); p != c.parents.end()) {
        todo.insert(todo.end(), p->second.begin(), p->second.end());
        break;
      }
    }
  }
}

}  // namespace cachet::model

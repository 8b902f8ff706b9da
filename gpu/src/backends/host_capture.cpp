// The host simulation of CUDA graph captures (cachet/gpu/host_backend.h, "Captures";
// docs/pytorch-allocator.md §14.10.1): what cudaStreamGetCaptureInfo and
// cudaGraphNodeGetDependencies report to graph_capture_record_stream_reuse.
#include <algorithm>
#include <string>
#include <vector>

#include "cachet/gpu/host_backend.h"

namespace cachet::gpu {

namespace {
std::string st(StreamId s) { return "stream " + std::to_string(s); }
// Sorted, without repeats.
void merge_into(std::vector<GraphNode>& into, const std::vector<GraphNode>& from) {
  std::vector<GraphNode> out;
  std::set_union(into.begin(), into.end(), from.begin(), from.end(), std::back_inserter(out));
  into = std::move(out);
}
}  // namespace

Status HostSim::capture_begin(StreamId origin) {
  std::lock_guard lock(mu_);
  if (capturing_.contains(origin))
    return Status::error("cudaStreamBeginCapture(" + st(origin) + "): the stream is capturing already "
                         "(cudaErrorIllegalState)");
  const std::uint64_t id = next_capture_++;
  capture_origin_[id] = origin;
  capturing_[origin] = StreamCapture{id, {}};
  return Status::ok();
}

Status HostSim::capture_end(StreamId origin) {
  std::lock_guard lock(mu_);
  auto o = capturing_.find(origin);
  if (o == capturing_.end() || capture_origin_.at(o->second.capture) != origin)
    return Status::error("cudaStreamEndCapture(" + st(origin) + "): no capture began on this stream "
                         "(cudaErrorIllegalState)");
  const std::uint64_t id = o->second.capture;
  // What the origin's next work is ordered after: its dependencies and all their ancestors.
  std::vector<GraphNode> ordered;
  std::vector<GraphNode> todo = o->second.deps;
  while (!todo.empty()) {
    const GraphNode n = todo.back();
    todo.pop_back();
    if (std::find(ordered.begin(), ordered.end(), n) != ordered.end()) continue;
    ordered.push_back(n);
    const auto& parents = node_parents_.at(n);
    todo.insert(todo.end(), parents.begin(), parents.end());
  }
  for (const auto& [s, c] : capturing_) {
    if (c.capture != id || s == origin) continue;
    for (GraphNode n : c.deps)
      if (std::find(ordered.begin(), ordered.end(), n) == ordered.end())
        return Status::error("cudaStreamEndCapture(" + st(origin) + "): " + st(s) +
                             " joined the capture and its work was not joined back into the origin "
                             "(cudaErrorStreamCaptureUnjoined); make the origin wait on it first");
  }
  for (auto it = capturing_.begin(); it != capturing_.end();)
    it = it->second.capture == id ? capturing_.erase(it) : std::next(it);
  capture_origin_.erase(id);
  return Status::ok();
}

Status HostSim::wait_stream(StreamId waiter, StreamId waited) {
  std::lock_guard lock(mu_);
  auto from = capturing_.find(waited);
  auto to = capturing_.find(waiter);
  if (from == capturing_.end()) {
    if (to != capturing_.end())
      return Status::error("cudaStreamWaitEvent(" + st(waiter) + "): it captures and waits on an event of " +
                           st(waited) + ", which does not (cudaErrorStreamCaptureIsolation)");
    return Status::ok();  // no capture: an ordinary wait, nothing the allocator reads
  }
  if (to != capturing_.end() && to->second.capture != from->second.capture)
    return Status::error("cudaStreamWaitEvent(" + st(waiter) + "): it captures another graph than " + st(waited) +
                         " (cudaErrorStreamCaptureMerge)");
  if (waiter == waited) return Status::ok();
  const StreamCapture joined = from->second;
  StreamCapture& c = capturing_[waiter];
  c.capture = joined.capture;
  merge_into(c.deps, joined.deps);
  return Status::ok();
}

void HostSim::kernel(StreamId stream) {
  std::lock_guard lock(mu_);
  auto it = capturing_.find(stream);
  if (it == capturing_.end()) return;  // runs; events complete as the options say
  const GraphNode n = next_node_++;
  node_parents_[n] = it->second.deps;
  it->second.deps = {n};
}

Result<CaptureInfo> HostSim::capture_info(StreamId s) {
  std::lock_guard lock(mu_);
  auto it = capturing_.find(s);
  if (it == capturing_.end()) return {Status::ok(), CaptureInfo{}};
  return {Status::ok(), CaptureInfo{true, it->second.capture, it->second.deps}};
}

Result<std::vector<GraphNode>> HostSim::node_dependencies(GraphNode n) {
  std::lock_guard lock(mu_);
  auto it = node_parents_.find(n);
  if (it == node_parents_.end())
    return {Status::error("cudaGraphNodeGetDependencies: no such node (cudaErrorInvalidValue)"), {}};
  return {Status::ok(), it->second};
}

}  // namespace cachet::gpu

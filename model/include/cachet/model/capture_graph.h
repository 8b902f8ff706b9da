// cachet/model/capture_graph.h: the device's side of CUDA graph captures, as far as
// graph_capture_record_stream_reuse reads it through cudaStreamGetCaptureInfo and
// cudaGraphNodeGetDependencies (docs/pytorch-allocator.md §14.10.1). A plain model: no device.
//
// A capture has captured nodes (kernels), each depending on earlier nodes, and the streams that
// capture into it, each with its current dependency set (the "terminals" PyTorch reads):
//   begin(origin)        cudaStreamBeginCapture: the origin captures, with no dependencies;
//   wait_stream(a, b)    streams[a].wait_stream(streams[b]) while b captures: a joins b's capture
//                        (a not capturing: a's dependencies become b's; a in the same capture: they
//                        grow by b's). b not capturing: nothing, unless a captures (waiting on
//                        work outside the capture, cudaErrorStreamCaptureIsolation); a and b in
//                        two captures: cudaErrorStreamCaptureMerge. Both refused (UsageError);
//   kernel(a)            a capturing stream gets a new node depending on its dependencies, which
//                        becomes its only dependency; on a stream that does not capture, nothing;
//   end(origin)          cudaStreamEndCapture: refused (cudaErrorStreamCaptureUnjoined) while
//                        another stream of the capture is not joined back, that is while one of
//                        its dependencies is no ancestor-or-self of a dependency of the origin;
//                        then every stream of the capture stops capturing.
// A refusal throws UsageError and changes nothing.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <vector>

#include "cachet/types.h"

namespace cachet::model {

using CaptureId = std::uint64_t;
using NodeId = std::uint64_t;  // unique over every capture

class CaptureGraphs {
 public:
  // UsageError when `origin` captures already (its own capture or one it joined).
  CaptureId begin(StreamId origin);
  // UsageError, nothing changed: `origin` is not the origin of a capture, or a stream is unjoined.
  void check_end(StreamId origin) const;
  // check_end, then the capture's streams stop capturing and its nodes are forgotten.
  void end(StreamId origin);
  void wait_stream(StreamId waiter, StreamId waited);
  void kernel(StreamId stream);

  // The capture `stream` captures into, if any (cudaStreamGetCaptureInfo's status and id).
  std::optional<CaptureId> capture_of(StreamId stream) const;
  // The stream's current dependencies (its terminals); empty when it does not capture.
  const std::set<NodeId>& terminals(StreamId stream) const;
  // update_visited: every node reachable backwards from `from` (them included) joins `visited`;
  // a node already in `visited` is not walked again (its ancestors are there already).
  void add_ancestors(const std::set<NodeId>& from, std::set<NodeId>& visited) const;
  bool any() const { return !streams_.empty(); }

 private:
  struct Capturing {
    CaptureId capture = 0;
    std::set<NodeId> deps;
  };
  struct Capture {
    StreamId origin = 0;
    std::map<NodeId, std::vector<NodeId>> parents;  // each node's dependencies
  };
  std::map<StreamId, Capturing> streams_;  // the streams capturing now
  std::map<CaptureId, Capture> captures_;
  CaptureId next_capture_ = 1;
  NodeId next_node_ = 1;
};

}  // namespace cachet::model

// The orders taken from a recording (conform_order.h, docs/pytorch-allocator.md §14.10.3).
#include "conform_order.h"

#include <algorithm>
#include <map>
#include <set>

namespace cachet::cli {

// docs/pytorch-allocator.md §14.10.3: PyTorch takes a batch of deferred frees in its hash map's
// order (heap addresses), which no rule of the engines can give. `pending` (the engine's deferred
// frees, in the order the frees were made) ordered as the recording completed them: by the first
// free_completed row of each address from row `from` of `recorded` on (the engine's trace so far;
// it is the recording's as long as the replay conforms). A deferred block holds its address until
// its free completes, so no other block's free_completed row at that address comes first. The
// blocks whose uses were all recorded during the capture complete in the walk's order; the others
// get their events in it, and those of one stream complete in it. Addresses the recording does not
// complete keep their order, after the others.
std::vector<std::uint64_t> recorded_deferred_order(const std::vector<std::uint64_t>& pending,
                                                   const std::vector<TraceEvent>& recorded, std::size_t from) {
  std::vector<std::pair<std::size_t, std::uint64_t>> at;  // (row, address); row = size(): not completed
  for (std::uint64_t p : pending) {
    std::size_t row = recorded.size();
    for (std::size_t k = from; k < recorded.size(); ++k)
      if (recorded[k].action == TraceAction::FreeCompleted && recorded[k].addr == p) {
        row = k;
        break;
      }
    at.emplace_back(row, p);
  }
  std::stable_sort(at.begin(), at.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<std::uint64_t> out;
  for (const auto& [row, p] : at) out.push_back(p);
  return out;
}

// docs/pytorch-allocator.md §14.10.3: PyTorch walks the streams of its cuda_events map in the hash
// order of their handles, which no rule of the engines can give. The streams of `queues` (the
// engine's, in the order it would walk them) ordered as the recording completed their blocks: a
// stream's place is the first free_completed row, from row `from` of `recorded` on, of a block
// whose pending events are all on that stream (that row comes in that stream's walk); a stream
// holding only blocks with events on other streams too is placed by the first row of any of its
// blocks. A block awaiting events holds its address until its free completes, so the first
// free_completed row at its address is its own. Streams the recording completes nothing of keep
// their order, after the others.
std::vector<StreamId> recorded_stream_order(const std::vector<std::pair<StreamId, std::vector<std::uint64_t>>>& queues,
                                            const std::vector<TraceEvent>& recorded, std::size_t from) {
  std::map<std::uint64_t, int> queues_of;  // address -> how many queues hold an event of its block
  for (const auto& [s, addrs] : queues)
    for (std::uint64_t p : std::set<std::uint64_t>(addrs.begin(), addrs.end())) ++queues_of[p];
  auto first_row = [&](std::uint64_t p) {
    for (std::size_t k = from; k < recorded.size(); ++k)
      if (recorded[k].action == TraceAction::FreeCompleted && recorded[k].addr == p) return k;
    return recorded.size();
  };
  std::vector<std::pair<std::size_t, StreamId>> at;  // (row, stream); row = size(): none
  for (const auto& [s, addrs] : queues) {
    std::size_t own = recorded.size(), any = recorded.size();
    for (std::uint64_t p : addrs) {
      const std::size_t row = first_row(p);
      any = std::min(any, row);
      if (queues_of[p] == 1) own = std::min(own, row);
    }
    at.emplace_back(own != recorded.size() ? own : any, s);
  }
  std::stable_sort(at.begin(), at.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<StreamId> out;
  for (const auto& [row, s] : at) out.push_back(s);
  return out;
}

}  // namespace cachet::cli

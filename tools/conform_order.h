// tools/conform_order.h: the orders `cachet conform` takes from a recording because no rule of
// the engines can give them (docs/pytorch-allocator.md §14.10.3): PyTorch processes a batch of
// deferred frees, and walks the streams with pending events, in the hash order of its maps
// (heap addresses, stream handles), which changes from run to run. Each order is read from the
// recording's free_completed rows and given to the engine (ReplayEngine::set_deferred_free_order,
// set_event_stream_order, engine.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "cachet/trace.h"
#include "cachet/types.h"

namespace cachet::cli {

// `pending` (the engine's deferred frees, in the order the frees were made) ordered as the
// recording completed them, from row `from` of `recorded` on.
std::vector<std::uint64_t> recorded_deferred_order(const std::vector<std::uint64_t>& pending,
                                                   const std::vector<TraceEvent>& recorded, std::size_t from);

// The streams of `queues` (the engine's, in the order it would walk them) ordered as the
// recording completed their blocks, from row `from` of `recorded` on.
std::vector<StreamId> recorded_stream_order(const std::vector<std::pair<StreamId, std::vector<std::uint64_t>>>& queues,
                                            const std::vector<TraceEvent>& recorded, std::size_t from);

}  // namespace cachet::cli

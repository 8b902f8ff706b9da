// tools/conform_pytorch.h: `cachet conform [OPS] RESULT` with --policy pytorch: a recording's ops
// replayed through one engine (engine.h: "model", "impl") with PyTorch's device addresses, every
// outcome compared with what PyTorch recorded: each returned pointer or OOM, the six stats after
// every op, the OOM messages (driver figures masked), every final memory_stats() key, the final
// segments and blocks, the private pools made and alive, the memory_summary() text and the trace.
// The orders no rule gives (docs/pytorch-allocator.md §14.10.3) are taken from the recording
// (conform_order.h). The other policy's replay, compared with nothing but itself, is
// conform_cachet.h.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "cachet/config.h"
#include "cachet/io/recording.h"
#include "cachet/ops.h"
#include "engine.h"

namespace cachet::cli {

// Mismatches counted across engines; the first max_printed printed in detail.
struct ConformReport {
  std::size_t mismatches = 0;
  std::size_t printed = 0;
  std::size_t max_printed = 20;
  std::string engine;
  bool verbose() { return printed++ < max_printed; }
};

// Replays `rec` with `ops` through one engine and reports every mismatch. Returns ops run.
// Throws std::invalid_argument for ops that do not fit the recording (a stream index too large).
std::size_t conform_one(const std::string& engine_name, const EngineFactory& factory,
                        const io::Recording& rec, const std::vector<ops::Op>& ops, const Config& config,
                        ConformReport& report);

}  // namespace cachet::cli

// tools/conform_cachet.h: `cachet conform RESULT --policy cachet`: a recording's ops (the pool and
// capture ops included, through PoolFrontEnd) replayed through policy:cachet instead of being
// compared with PyTorch: its reference model (model::CachetPolicy, engine "cachet-model") and,
// when built in, the production allocator with policy:cachet on the host backend (engine "impl",
// validate mode), side by side, each checking its invariants after every op and agreeing with
// the other on every outcome and the four current byte stats. What it reports is the waste:
// policy:cachet's peak reserved and reserved at the end against PyTorch's recorded figures.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cachet/config.h"
#include "cachet/io/recording.h"
#include "cachet/ops.h"
#include "cachet/types.h"

namespace cachet::cli {

struct CachetWaste {
  std::vector<std::string> engines;  // those that ran
  std::size_t ops = 0;
  std::int64_t peak_requested = 0;   // policy:cachet's requested_bytes peak (the ops' own)
  std::int64_t peak_reserved = 0;
  std::int64_t end_reserved = 0;
  std::int64_t ooms = 0;
  std::int64_t pytorch_peak_reserved = 0;  // the recording's final memory_stats()
  std::int64_t pytorch_end_reserved = 0;
  std::int64_t pytorch_peak_requested = 0;
  std::int64_t pytorch_ooms = 0;
  std::vector<std::string> problems;  // engines disagreeing, an invariant broken, an op refused
  std::size_t problem_count = 0;      // all of them (problems holds the first few)
};

// Throws std::invalid_argument for ops that do not fit the recording (a stream index too large).
// `engines`: "cachet-model" and/or "impl"; throws std::invalid_argument for one not built in.
CachetWaste conform_cachet(const io::Recording& rec, const std::vector<ops::Op>& ops,
                           const std::vector<std::string>& engines, std::size_t max_problems);

// The report, one figure per line (tests match them).
void print_cachet_waste(const std::string& name, const CachetWaste& w);

}  // namespace cachet::cli

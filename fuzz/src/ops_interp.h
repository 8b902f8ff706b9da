// fuzz/src/ops_interp.h: the fuzz_ops interpreter, shared by the libFuzzer target (fuzz_ops),
// the random-campaign driver (fuzz_ops_random, no libFuzzer, builds with g++) and the mutant
// check (fuzz_ops_mutant_<n>). Bytes become a configuration, a device capacity and an op
// sequence (the op vocabulary of cachet/ops.h), applied to the model and the production allocator
// in lockstep (cachet/lockstep.h; the configuration's policy picks the pair: a string saying
// policy:cachet runs model::CachetPolicy), with both sides' invariants checked after every op.
//
// Byte format (decoded with FuzzedDataProvider; fuzz/README.md has the details):
//   byte 0        configuration: < 0xC0 picks one of kPresetConfigs (the oracle's regimes);
//                 else a string follows (ConsumeRandomLengthString) parsed as CACHET_ALLOC_CONF
//                 (unparsable strings fall back to the default configuration);
//   byte 1        device capacity: one of kCapacities (low 7 bits); bit 7: pool mode, where
//                 selectors [96, 128) are the pool and capture ops (MemPools and graphs 0..7,
//                 mostly valid ones picked from the front end's state);
//   then ops      until the bytes run out (at most 600), each a selector byte and its arguments
//                 (sizes are biased towards the block classes of the allocator; frees and
//                 stream records pick one of the live handles, so most bytes are real work).
// A case ends early where both sides report that PyTorch 2.11 itself fails (docs/pytorch-allocator.md §14.8).
// The environment variable CACHET_FUZZ_CONFIG, when set, replaces the configuration (byte 0
// is still consumed, the string is not; a campaign runs one job per configuration this way); CACHET_FUZZ_OPS_OUT=<path> writes the
// case as a replayable .ops file (see fuzz/crash-to-test).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "cachet/lockstep.h"
#include "cachet/types.h"

namespace cachet::fuzz {

// One decoded and executed case, in replayable form.
struct Case {
  std::string config;  // CACHET_ALLOC_CONF string ("" = defaults)
  Bytes capacity = 0;
  std::vector<lockstep::Op> ops;  // the ops actually applied, in order
};

// What happened, summed over every case run in this process.
struct Mix {
  std::uint64_t cases = 0, skipped_cases = 0;  // skipped: the configuration is not runnable
  std::uint64_t ops = 0;
  std::uint64_t alloc_ptr = 0;      // allocations that returned memory
  std::uint64_t alloc_zero = 0;     // size-0 allocations (nullptr)
  std::uint64_t alloc_oom = 0;      // allocations that raised OutOfMemory
  std::uint64_t frees = 0;          // frees that freed
  std::uint64_t usage_errors = 0;   // e.g. a double free, on both sides
  std::uint64_t records = 0, completes = 0, empty_caches = 0, fractions = 0;
  std::uint64_t noops = 0;          // a free/record with no live handle, a skipped handle
  std::uint64_t pool_ops = 0;       // pool and capture ops both sides applied
  std::uint64_t pool_refused = 0;   // pool and capture ops refused (or failing) on both sides
  std::uint64_t ended_cases = 0;    // cases ended at a PyTorch failure (§14.8) both reported
  std::uint64_t tags = 0, sleeps = 0, wakes = 0;  // sleep mode's ops both sides applied
  std::uint64_t sleep_refused = 0;                // sleep mode's ops refused (or OOM) on both sides
  std::uint64_t waits = 0, kernels = 0;            // wait_stream and kernel both sides applied
  std::uint64_t stream_refused = 0;                // wait_stream refused on both sides
};

// Runs one case from bytes. Returns "" when both sides agreed after every op, else a readable
// report: the check that failed, the configuration and the ops as replayable lines. `out`
// receives the case when given.
std::string run_bytes(const std::uint8_t* data, std::size_t size, Case* out = nullptr);

// Replays a case (a .ops file's content): "" or the divergence report.
std::string run_case(const Case& c);

// The .ops text of a case: "# config: ...", "# capacity: ...", then one op per line.
std::string to_ops_file(const Case& c);
// Parses to_ops_file() output; throws std::invalid_argument on a bad line.
Case parse_ops_file(const std::string& text);

const Mix& mix();
// "fuzz_ops mix: N cases, M ops: ..." for the log.
std::string show_mix();

// The libFuzzer-style entry: runs a case; on divergence prints the report to stderr, writes
// CACHET_FUZZ_OPS_OUT when set and aborts. On success writes CACHET_FUZZ_OPS_OUT when set.
void run_or_abort(const std::uint8_t* data, std::size_t size);
// Registers an atexit handler that prints show_mix() to stderr (once).
void print_mix_at_exit();

}  // namespace cachet::fuzz

// cachet/io/recording.h: oracle recordings of PyTorch 2.11 (results/res_<regime>_<config>.json.gz)
// and the op lists they replayed (ops/ops_<regime>.json[.gz]). Field meanings:
// tests/data/oracle/ORACLE_README.md. Gzip or plain; malformed input throws io::ReadError naming
// the file and what was wrong.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "cachet/ops.h"
#include "cachet/snapshot.h"
#include "cachet/trace.h"
#include "cachet/types.h"

namespace cachet::io {

// An op list's ops are the project's op vocabulary (cachet/ops.h), id-addressed: each
// ["a", id, size, s] is ops::Allocate{size, s, id} (["a", id, size, s, t]: made by thread t,
// docs/pytorch-allocator.md §14.10.2), ["f", id] ops::Free{id}, ["r", id, s] ops::RecordStream{id, s}
// (Tensor.record_stream), ["e"] ops::EmptyCache; the pool and capture ops of the torch-2.11-h100 recordings: ["pb", k]
// UseMemPoolBegin, ["pe", k] UseMemPoolEnd, ["pr", k] ReleasePool, ["gb", k, s, share]
// CaptureBegin (share -1: a new pool), ["ge", k] CaptureEnd, ["gx", k] GraphReset; the issue-23 ones
// (docs/pytorch-allocator.md §14.10.1): ["w", a, b] WaitStream, ["k", s] Kernel, ["cfg", text]
// SetAllocatorSettings.
// Streams (Allocate::stream, RecordStream::stream, CaptureBegin::stream, WaitStream, Kernel) are stream INDICES: Recording::streams[s] is
// the cudaStream_t the recording ran on.

// A pool a recording made: ["<k>" or "g<k>", [first, second]] (pool_ids).
struct RecordedPool {
  std::string name;  // "3" for MemPool 3, "g1" for graph 1's pool
  PoolId id;
};
// A MemPool alive at the end: [k, id, use_count] (live_pools).
struct LivePool {
  std::uint64_t k = 0;
  PoolId id;
  int use_count = 0;
};

// steps[i]: the state after op i.
struct Step {
  bool oom = false;                     // the allocation raised OutOfMemoryError
  bool error = false;                   // PyTorch refused the op ("error"; see Recording::errors)
  std::optional<std::uint64_t> result;  // the returned pointer (allocations that succeeded)
  std::array<std::int64_t, 6> stats{};  // in stat_keys order
};

struct Recording {
  std::string path;
  std::string conf;         // PYTORCH_CUDA_ALLOC_CONF of the run
  Bytes cap = 0;            // bytes allowed by set_per_process_memory_fraction; 0 = none
  Bytes total_memory = 0;   // the device's total_memory
  std::vector<StreamId> streams;  // cudaStream_t of stream index 0..
  std::vector<std::string> stat_keys;
  std::vector<Step> steps;
  std::map<std::string, std::int64_t> final_stats;  // memory_stats() at the end
  // memory_snapshot() at the end. Block addresses follow from the segment address and the
  // block sizes; is_expandable is taken from the conf string's expandable_segments (the
  // recording does not store it).
  Snapshot segments;
  std::vector<TraceEvent> trace;  // oom rows: addr 0 (recorded as null)
  std::string summary;            // memory_summary() at the end
  std::vector<std::string> oom_messages;
  // Private-pool recordings only (absent elsewhere): every pool made, in order; the MemPools
  // alive at the end; the ops PyTorch refused ([op index, message]).
  std::vector<RecordedPool> pool_ids;
  std::vector<LivePool> live_pools;
  std::vector<std::pair<std::size_t, std::string>> errors;
};

Recording read_recording(const std::string& path);
std::vector<ops::Op> read_ops(const std::string& path);

// The op list that pairs with a recording: results/res_<regime>_<config>.json[.gz] ->
// ../ops/ops_<regime>.json[.gz] (whichever exists; the regime is the longest one whose ops file
// exists). Throws ReadError when none is found.
std::string ops_path_for(const std::string& recording_path);

}  // namespace cachet::io

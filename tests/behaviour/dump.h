// tests/behaviour: the per-op behaviour dump of gpu/'s CachingAllocator (project issue 15,
// "behaviour unchanged, shown by a diff"). tests/data/behaviour/README.md says what a dump
// holds, which commit made the baseline and how to regenerate and compare it.
//
// The dump drives cachet::CachingAllocator through its public API only, on the host simulation
// backend (deterministic addresses), with every device call logged by a DeviceMemory wrapper,
// so it survives a redesign of gpu/'s insides. Its ops are the project's op vocabulary
// (cachet/ops.h), id-addressed: each Allocate names its handle, and an op's dump line starts
// with ops::show(op).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "cachet/config.h"
#include "cachet/gpu/host_backend.h"
#include "cachet/ops.h"
#include "cachet/types.h"

namespace cachet::behaviour {

// The ops (cachet/ops.h), id-addressed: an Allocate binds its id to the pointer it returns (when
// it returns; a null pointer too); Free/RecordStream of an id never bound is skipped; of an id
// whose block was freed, the old pointer is passed again (a usage error, or the block now at
// that address). CompleteEvents is HostSim::complete_events. The pool and capture ops go through
// PyTorch's front end of private pools as the conformance replays do (tools/pool_front_end.h,
// docs/pytorch-allocator.md §14.9); only policy:pytorch's recordings have them.
using ops::Op;

// One run: an allocator made from `conf` (parsed as CACHET_ALLOC_CONF) over a HostSim with
// `host`, then `initial_fraction` (if any), then `ops`.
struct Input {
  std::string name;  // unique in its group
  std::string conf;  // the configuration string, policy included
  gpu::HostOptions host;
  std::optional<double> initial_fraction;
  std::vector<StreamId> other_device_streams;  // HostSim::set_stream_device(s, device + 1)
  std::vector<StreamId> streams;  // a recording's streams: the capture ops name them by index
  std::vector<Op> ops;
};

// The groups, one baseline file each (<group>.txt.gz): recordings_pytorch, recordings_cachet,
// random_pytorch, random_cachet.
std::vector<std::string> group_names();
// The inputs of one group, in a fixed order. `data_dir` is tests/data.
std::vector<Input> group_inputs(const std::string& group, const std::string& data_dir);

// The seeded random op sequence (a fixed generator: std::mt19937_64 bits only, no
// implementation-defined distributions, so every standard library gives the same ops).
std::vector<Op> random_ops(std::uint64_t seed, std::size_t n);

// The dump of one input: a header line "== <name> conf='<conf>' ...", an "init" line (the
// construction and the initial fraction) and one line per op (format: dump_run.cpp).
std::string dump(const Input& in);

}  // namespace cachet::behaviour

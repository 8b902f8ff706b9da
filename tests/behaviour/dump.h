// tests/behaviour: the per-op behaviour dump of gpu/'s CachingAllocator (project issue 15,
// "behaviour unchanged, shown by a diff"). tests/data/behaviour/README.md says what a dump
// holds, which commit made the baseline and how to regenerate and compare it.
//
// The dump drives cachet::CachingAllocator through its public API only, on the host simulation
// backend (deterministic addresses), with every device call logged by a DeviceMemory wrapper,
// so it survives a redesign of gpu/'s insides. Its own op vocabulary on purpose: the project's
// op vocabularies are being unified by the same issue.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "cachet/config.h"
#include "cachet/gpu/host_backend.h"
#include "cachet/types.h"

namespace cachet::behaviour {

// One op. Handles name allocations: an Alloc binds `handle` to the pointer it returns (when it
// returns one); Free/Record of a handle never bound is skipped; of a handle whose block was
// freed, the old pointer is passed again (a usage error, or the block now at that address).
struct Op {
  enum class Kind : std::uint8_t { Alloc, Free, Record, Complete, EmptyCache, Fraction };
  Kind kind = Kind::Alloc;
  Bytes size = 0;          // Alloc
  StreamId stream = 0;     // Alloc, Record, Complete (HostSim::complete_events)
  std::uint64_t handle = 0;  // Alloc, Free, Record
  double fraction = 1.0;   // Fraction (set_memory_fraction)
};

// "alloc h<handle> <size> s<stream>", "free h<handle>", "record h<handle> s<stream>",
// "complete s<stream>", "empty_cache", "fraction <f>".
std::string show(const Op& op);

// One run: an allocator made from `conf` (parsed as CACHET_ALLOC_CONF) over a HostSim with
// `host`, then `initial_fraction` (if any), then `ops`.
struct Input {
  std::string name;  // unique in its group
  std::string conf;  // the configuration string, policy included
  gpu::HostOptions host;
  std::optional<double> initial_fraction;
  std::vector<StreamId> other_device_streams;  // HostSim::set_stream_device(s, device + 1)
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

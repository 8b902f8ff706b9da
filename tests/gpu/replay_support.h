// Replaying an oracle recording (tests/data/oracle/results) through cachet::CachingAllocator
// on the host backend in recorded-address mode: the driver addresses PyTorch got (the
// trace's segment_alloc / segment_map rows, in order) are handed out again, so every pointer
// must match exactly.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "cachet/config.h"
#include "cachet/gpu/allocator.h"
#include "cachet/gpu/host_backend.h"
#include "cachet/io/recording.h"

namespace cachet::test {

inline std::vector<gpu::DevicePtr> recorded_addresses(const io::Recording& r) {
  std::vector<gpu::DevicePtr> out;
  for (const auto& e : r.trace)
    if (e.action == TraceAction::SegmentAlloc || e.action == TraceAction::SegmentMap) out.push_back(e.addr);
  return out;
}

// An allocator set up as the recording's run was: its conf, its device size, its cap.
inline std::unique_ptr<CachingAllocator> replay_allocator(const io::Recording& r,
                                                          std::shared_ptr<gpu::HostSim>* sim = nullptr,
                                                          Config base = {}) {
  gpu::HostOptions o;
  o.capacity = r.total_memory;
  o.total_memory = r.total_memory;
  o.recorded = recorded_addresses(r);
  Config c = parse_config(r.conf, ConfigSource::PyTorch, base).config;
  c.validate = base.validate;
  auto a = std::make_unique<CachingAllocator>(gpu::make_host_memory(o, sim), c);
  if (r.cap > 0) a->set_memory_fraction(static_cast<double>(r.cap) / static_cast<double>(r.total_memory));
  return a;
}

inline std::string recording_path(const std::string& name) {
  return std::string(CACHET_TEST_DATA) + "/oracle/results/" + name + ".json.gz";
}

inline std::vector<std::string> all_recordings() {
  std::vector<std::string> out;
  for (const char* regime : {"small", "mixed", "mixed_empty", "frag", "pressure"})
    for (const char* conf : {"default", "msplit128", "msplit256_r4", "gc", "rdivlist", "expandable"})
      out.push_back(std::string("res_") + regime + "_" + conf);
  return out;
}

}  // namespace cachet::test

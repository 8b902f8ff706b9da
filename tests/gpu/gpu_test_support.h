// Helpers for the host-backend unit tests of cachet::CachingAllocator.
#pragma once

#include <gtest/gtest.h>

#include <memory>

#include "cachet/config.h"
#include "cachet/gpu/allocator.h"
#include "cachet/gpu/host_backend.h"

namespace cachet::test {

// PyTorch's probe device (an H200): 150,109,880,320 bytes.
inline constexpr Bytes kH200 = 150109880320ULL;

struct HostAlloc {
  std::shared_ptr<gpu::HostSim> sim;
  std::unique_ptr<CachingAllocator> a;
};

inline HostAlloc host_alloc(const std::string& conf = "", Bytes capacity = kH200) {
  HostAlloc h;
  gpu::HostOptions o;
  o.capacity = capacity;
  Config c = parse_config(conf).config;
  c.validate = true;  // every operation ends with invariants()
  h.a = std::make_unique<CachingAllocator>(gpu::make_host_memory(o, &h.sim), c);
  return h;
}

inline std::int64_t cur(const StatArray& s) { return s[0].current; }

}  // namespace cachet::test

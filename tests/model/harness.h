// Test harness for the model: an H200-sized synthetic device and PyTorch's probe warm-up.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "cachet/config.h"
#include "cachet/model/allocator.h"
#include "cachet/model/segment_source.h"

namespace cachet::model::test {

// The probe device (env.json): total_memory of the H200.
inline constexpr Bytes kH200Total = 150'109'880'320;

// The subset of memory_stats() the probes record after every step (docs/pytorch-allocator.md §9).
struct Probe {
  std::int64_t allocated, reserved, active, inactive_split_bytes, inactive_split, segment,
      requested, retries, ooms, sync, device_alloc, device_free, oversize_alloc, oversize_seg;
};

inline Probe probe(const DeviceStats& s) {
  return {s.allocated_bytes[0].current, s.reserved_bytes[0].current, s.active_bytes[0].current,
          s.inactive_split_bytes[0].current, s.inactive_split[0].current, s.segment[0].current,
          s.requested_bytes[0].current, s.num_alloc_retries, s.num_ooms, s.num_sync_all_streams,
          s.num_device_alloc, s.num_device_free, s.oversize_allocations.current,
          s.oversize_segments.current};
}

#define EXPECT_PROBE(alloc, ...)                                                            \
  do {                                                                                      \
    const ::cachet::model::test::Probe want_{__VA_ARGS__};                                  \
    const ::cachet::model::test::Probe got_ = ::cachet::model::test::probe((alloc).stats()); \
    EXPECT_EQ(got_.allocated, want_.allocated) << "allocated_bytes";                        \
    EXPECT_EQ(got_.reserved, want_.reserved) << "reserved_bytes";                           \
    EXPECT_EQ(got_.active, want_.active) << "active_bytes";                                 \
    EXPECT_EQ(got_.inactive_split_bytes, want_.inactive_split_bytes) << "inactive_split_bytes"; \
    EXPECT_EQ(got_.inactive_split, want_.inactive_split) << "inactive_split";               \
    EXPECT_EQ(got_.segment, want_.segment) << "segment";                                    \
    EXPECT_EQ(got_.requested, want_.requested) << "requested_bytes";                        \
    EXPECT_EQ(got_.retries, want_.retries) << "num_alloc_retries";                          \
    EXPECT_EQ(got_.ooms, want_.ooms) << "num_ooms";                                         \
    EXPECT_EQ(got_.sync, want_.sync) << "num_sync_all_streams";                             \
    EXPECT_EQ(got_.device_alloc, want_.device_alloc) << "num_device_alloc";                 \
    EXPECT_EQ(got_.device_free, want_.device_free) << "num_device_free";                    \
    EXPECT_EQ(got_.oversize_alloc, want_.oversize_alloc) << "oversize_allocations";         \
    EXPECT_EQ(got_.oversize_seg, want_.oversize_seg) << "oversize_segments";                \
  } while (0)

inline Config conf(const std::string& text) { return parse_config(text).config; }

// An allocator on a synthetic H200, checked after every step by the test.
struct Device {
  explicit Device(const Config& c = Config{}, Bytes capacity = kH200Total)
      : source(capacity, kH200Total), alloc(c, source) {}
  // The probes' PyTorch start-up: torch.empty(1) (4 bytes), del, empty_cache. Leaves
  // num_device_alloc 1, num_device_free 1, num_sync_all_streams 1.
  void warm_up() {
    alloc.free(alloc.malloc(4));
    alloc.empty_cache();
  }
  std::uint64_t malloc(Bytes n, StreamId s = 0) {
    const auto p = alloc.malloc(n, s);
    alloc.check_invariants();
    return p;
  }
  void free(std::uint64_t p) {
    alloc.free(p);
    alloc.check_invariants();
  }
  // The block layout of segment i: (size, requested, state) in address order.
  std::vector<std::tuple<Bytes, Bytes, cachet::BlockState>> blocks(std::size_t i) const {
    std::vector<std::tuple<Bytes, Bytes, cachet::BlockState>> out;
    const Snapshot s = alloc.snapshot();
    if (i >= s.size()) return out;
    for (const auto& b : s[i].blocks) out.emplace_back(b.size, b.requested_size, b.state);
    return out;
  }
  SyntheticSegmentSource source;
  Allocator alloc;
};

// The snapshot's states (cachet::BlockState, not the model's cachet::model::BlockState).
inline constexpr cachet::BlockState A = cachet::BlockState::ActiveAllocated;
inline constexpr cachet::BlockState P = cachet::BlockState::ActivePendingFree;
inline constexpr cachet::BlockState I = cachet::BlockState::Inactive;
using Blocks = std::vector<std::tuple<Bytes, Bytes, cachet::BlockState>>;

}  // namespace cachet::model::test

// python/c10/snapshot.cpp: statistics and snapshots as PyTorch's types, the seam of PyTorch's
// getDeviceStats and NativeCachingAllocator::snapshot (docs/pytorch-allocator.md sections 5 and
// 8): cachet's 122 stats as c10's DeviceStats field for field, its resets, and cachet's snapshot
// as SnapshotInfo (segments, blocks with the stacks history.cpp kept, the device traces, the
// annotations, the allocator settings of settings.cpp).
#include <algorithm>
#include <mutex>
#include <vector>

#include "c10/backend.h"
#include "cachet/snapshot.h"
#include "cachet/stats.h"

namespace cachet::c10_backend {
namespace {

void copy_stat(c10::CachingAllocator::Stat& to, const cachet::Stat& from) {
  to.current = from.current;
  to.peak = from.peak;
  to.allocated = from.allocated;
  to.freed = from.freed;
}

void copy_array(c10::CachingAllocator::StatArray& to, const cachet::StatArray& from) {
  for (size_t i = 0; i < to.size() && i < from.size(); ++i) copy_stat(to[i], from[i]);
}

// cachet's 122 stats as c10's DeviceStats (the same record, field for field).
cda::DeviceStats to_c10(const cachet::DeviceStats& s) {
  cda::DeviceStats d;
  copy_array(d.allocation, s.allocation);
  copy_array(d.segment, s.segment);
  copy_array(d.active, s.active);
  copy_array(d.inactive_split, s.inactive_split);
  copy_array(d.allocated_bytes, s.allocated_bytes);
  copy_array(d.reserved_bytes, s.reserved_bytes);
  copy_array(d.active_bytes, s.active_bytes);
  copy_array(d.inactive_split_bytes, s.inactive_split_bytes);
  copy_array(d.requested_bytes, s.requested_bytes);
  d.num_alloc_retries = s.num_alloc_retries;
  d.num_ooms = s.num_ooms;
  copy_stat(d.oversize_allocations, s.oversize_allocations);
  copy_stat(d.oversize_segments, s.oversize_segments);
  d.num_sync_all_streams = s.num_sync_all_streams;
  d.num_device_alloc = s.num_device_alloc;
  d.num_device_free = s.num_device_free;
  d.max_split_size = s.max_split_size;
  return d;
}

}  // namespace

cda::DeviceStats CachetCUDAAllocator::getDeviceStats(c10::DeviceIndex device) {
  return to_c10(call("getDeviceStats", [&] { return allocator(device)->stats(); }));
}

void CachetCUDAAllocator::resetAccumulatedStats(c10::DeviceIndex device) {
  call("resetAccumulatedStats", [&] { allocator(device)->reset_accumulated_stats(); });
}

void CachetCUDAAllocator::resetPeakStats(c10::DeviceIndex device) {
  call("resetPeakStats", [&] { allocator(device)->reset_peak_stats(); });
}

// The expandable segments of `device`, as native lists them (stream, small pool, mapped size).
// From cachet's block table, the snapshot's segments without its trace event (native's
// getExpandableSegmentSizes records none; gpu/ has no call of its own for it; rarely asked).
std::vector<cc::StreamSegmentSize> CachetCUDAAllocator::getExpandableSegmentSizes(c10::DeviceIndex device) {
  std::vector<cc::StreamSegmentSize> out;
  const cachet::Snapshot snap = call("getExpandableSegmentSizes", [&] { return allocator(device)->block_table(); });
  for (const auto& seg : snap)
    if (seg.is_expandable)
      out.emplace_back(reinterpret_cast<cudaStream_t>(seg.stream), !seg.is_large, seg.total_size);
  return out;
}

cc::SnapshotInfo CachetCUDAAllocator::snapshot(MempoolId_t mempool_id, bool include_traces) {
  cc::SnapshotInfo result;
  const int n = std::max(device_count_.load(), tc::device_count_hint());
  const cachet::PoolId only = pool_id(mempool_id);
  std::vector<cda::TraceEntry::Action> skips;
  size_t max_n = 1;
  {
    std::lock_guard<std::mutex> lock(mu_);  // never under a History's mu (lock order)
    skips = skip_actions_;
    max_n = max_entries_;
  }
  for (int d = 0; d < n; ++d) {
    cachet::CachingAllocator* a = tc::existing_allocator(d);
    if (!a) {
      if (include_traces) result.device_traces.emplace_back();
      continue;
    }
    // The trace first, then the snapshot, whose own event it therefore does not hold: native's
    // NativeCachingAllocator::snapshot takes each device's trace() before its snapshot() records
    // the SNAPSHOT entry, which the next snapshot's trace shows (probe snapshot.json).
    std::vector<cachet::TraceEvent> events;
    if (include_traces) events = call("snapshot", [&] { return a->trace(); });
    const cachet::Snapshot snap = call("snapshot", [&] { return a->snapshot(); });
    History& h = history(d);
    std::lock_guard<std::mutex> lock(h.mu);
    for (const auto& seg : snap) {
      if (!only.is_default() && seg.pool_id != only) continue;
      cda::SegmentInfo si;
      si.device = static_cast<c10::DeviceIndex>(d);
      si.address = seg.address;
      si.total_size = seg.total_size;
      si.requested_size = seg.requested_size();
      si.allocated_size = seg.allocated_size();
      si.active_size = seg.active_size();
      si.stream = reinterpret_cast<void*>(seg.stream);
      si.is_large = seg.is_large;
      si.is_expandable = seg.is_expandable;
      si.owner_private_pool_id = {seg.pool_id.first, seg.pool_id.second};
      for (const auto& b : seg.blocks) {
        cda::BlockInfo bi;
        bi.size = b.size;
        bi.requested_size = b.requested_size;
        bi.allocated = b.state == cachet::BlockState::ActiveAllocated;
        bi.active = b.state != cachet::BlockState::Inactive;
        if (bi.active) {
          auto it = h.live.find(b.address);
          if (it != h.live.end()) bi.context_when_allocated = it->second;
        }
        si.blocks.push_back(std::move(bi));
      }
      result.segments.push_back(std::move(si));
    }
    if (include_traces) result.device_traces.push_back(trace_entries(d, events, h, skips, max_n));
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    result.external_annotations = annotations_;
  }
  load_settings(result.config_metadata);
  return result;
}

}  // namespace cachet::c10_backend

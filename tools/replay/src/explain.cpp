// explain: the allocator's state at one moment of a replay, taken apart (explain.h). The rules
// that decide whether a free block could serve the request are PyTorch's
// (docs/pytorch-allocator.md §2.1: a block is reused only by its segment's stream and pool;
// §2.2 step 4: the oversize rules of max_split_size_mb and max_non_split_rounding_mb; §2.5:
// a block freed with stream uses waits for its events, outside the pool), listed in
// docs/explain.md.
#include <algorithm>
#include <bit>
#include <map>

#include <fmt/format.h>

#include "cachet/replay/explain.h"
#include "cachet/replay/report.h"

namespace cachet::replay {

namespace {

// roundup_power2_next_division (docs/pytorch-allocator.md §1.2).
Bytes next_division(Bytes size, std::uint32_t divisions) {
  if (std::has_single_bit(size)) return size;
  const Bytes below = std::bit_floor(size);
  const Bytes div = std::bit_floor(static_cast<Bytes>(divisions));
  const Bytes step = below / div;
  if (step == 0) return below << 1;
  return (size + step - 1) / step * step;
}

std::size_t division_index(Bytes size) {
  const int lg = std::bit_width(size) - 1;  // floor(log2(size))
  return static_cast<std::size_t>(std::clamp(lg - 20, 0, kRoundUpPowerOfTwoIntervals - 1));
}

}  // namespace

Bytes pytorch_round_size(Bytes size, const Config& c) {
  if (size < kMinBlockSize) return kMinBlockSize;
  const std::uint32_t div = c.roundup_power2_divisions[division_index(size)];
  if (div > 1 && size > kMinBlockSize * div) return next_division(size, div);
  return (size + kMinBlockSize - 1) / kMinBlockSize * kMinBlockSize;
}

Bytes smallest_request_rounding_to(Bytes rounded, const Config& c) {
  Bytes lo = 1, hi = rounded;  // pytorch_round_size is monotone
  while (lo < hi) {
    const Bytes mid = lo + (hi - lo) / 2;
    if (pytorch_round_size(mid, c) >= rounded)
      hi = mid;
    else
      lo = mid + 1;
  }
  return lo;
}

std::vector<std::string> changed_keys(const Config& a, const Config& b) {
  std::vector<std::string> k;
  if (a.policy != b.policy) k.push_back("policy");
  if (a.max_split_size != b.max_split_size) k.push_back("max_split_size_mb");
  if (a.max_non_split_rounding != b.max_non_split_rounding && a.large_segment_size == b.large_segment_size)
    k.push_back("max_non_split_rounding_mb");
  if (a.large_segment_size != b.large_segment_size) k.push_back("large_segment_size_mb");
  if (a.roundup_power2_divisions != b.roundup_power2_divisions) k.push_back("roundup_power2_divisions");
  if (a.garbage_collection_threshold != b.garbage_collection_threshold) k.push_back("garbage_collection_threshold");
  if (a.expandable_segments != b.expandable_segments) k.push_back("expandable_segments");
  if (a.backend != b.backend) k.push_back("backend");
  if (a.release_lock_on_cudamalloc != b.release_lock_on_cudamalloc) k.push_back("release_lock_on_cudamalloc");
  if (a.per_process_memory_fraction != b.per_process_memory_fraction) k.push_back("per_process_memory_fraction");
  return k;
}

std::string clip_line(std::string s, std::size_t width) {
  if (s.size() > width) {
    s.resize(width - 3);
    s += "...";
  }
  return s;
}

void take_apart(const LoadedTrace& lt, const Config& config, const ReplayOptions& o, Moment& m) {
  ReplayOptions at = o;
  at.observer = nullptr;
  at.progress = nullptr;
  at.stop_after = m.op + 1;
  at.keep_allocator = true;
  ReplayResult r = replay(lt.trace, config, at);
  const DeviceStats s = r.allocator->stats();
  m.reserved = s.reserved_bytes[0].current;
  m.allocated = s.allocated_bytes[0].current;
  m.requested = s.requested_bytes[0].current;
  m.segments = r.allocator->snapshot();
  m.rounded = pytorch_round_size(m.size, config);
  m.small_pool = m.rounded <= kSmallSize;

  FreePart too_small{"too_small", "request's stream and pool, each block smaller than it", 0, 0};
  FreePart oversize{"oversize_rule", "", 0, 0};
  FreePart usable{"usable", "large enough and usable (none at an out-of-memory)", 0, 0};
  FreePart other_pool{"other_pool",
                      m.small_pool ? "in the large pool (this request uses the small pool)"
                                   : "in the small pool (this request uses the large pool)",
                      0, 0};
  FreePart other_streams{"other_streams", "in other streams' pools (reused only by their stream)",
                         0, 0};
  // The pool the request went to (a private one while the replay is inside a window of one,
  // cachet/replay/pools.h); free blocks of any other pool are out of its reach (§14.2).
  const std::optional<std::uint32_t> window = request_window(lt.trace, m.op, m.stream);
  const PoolId request_pool_id = window ? lt.trace.pools.pools[lt.trace.pools.windows[*window].pool].id : PoolId{};
  m.pool = request_pool_id;
  if (window) m.pool_entry = lt.trace.pools.windows[*window].entry;
  m.default_idle_segments = 0;
  m.default_idle_bytes = 0;
  if (!request_pool_id.is_default())
    for (const SegmentSnapshot& seg : m.segments)
      if (seg.pool_id.is_default() && std::all_of(seg.blocks.begin(), seg.blocks.end(), [](const BlockSnapshot& b) {
            return b.state == BlockState::Inactive;
          })) {
        ++m.default_idle_segments;
        m.default_idle_bytes += seg.total_size;
      }
  FreePart private_pools{"private_pools",
                         request_pool_id.is_default()
                             ? "in private pools (CUDA graphs, MemPool): a request outside them does not use them"
                             : fmt::format("in pools other than the private pool ({}, {}) the request went to",
                                           request_pool_id.first, request_pool_id.second),
                         0, 0};
  FreePart pending{"pending_free", "freed, waiting for other streams' events (record_stream)", 0, 0};
  const bool request_oversize = m.rounded >= config.max_split_size;
  oversize.what = request_oversize ? "refused: block >= request + max_non_split_rounding_mb"
                                   : "large enough, refused: block >= max_split_size_mb";
  auto add = [](FreePart& p, Bytes b) {
    p.bytes += b;
    ++p.blocks;
  };
  for (const SegmentSnapshot& seg : m.segments)
    for (const BlockSnapshot& b : seg.blocks) {
      if (b.state == BlockState::ActiveAllocated) continue;
      if (b.state == BlockState::ActivePendingFree) {
        add(pending, b.size);
      } else if (seg.pool_id != request_pool_id) {
        add(private_pools, b.size);
      } else if (seg.stream != m.stream) {
        add(other_streams, b.size);
      } else if (seg.is_large == m.small_pool) {
        add(other_pool, b.size);
      } else if (b.size < m.rounded) {
        add(too_small, b.size);
      } else if (!request_oversize && b.size >= config.max_split_size) {
        add(oversize, b.size);
      } else if (request_oversize && config.max_non_split_rounding <= b.size - m.rounded) {
        add(oversize, b.size);
      } else {
        add(usable, b.size);
      }
    }
  m.parts = {too_small, oversize, usable, other_pool, other_streams, private_pools, pending};
  Bytes sum = 0;
  for (const auto& p : m.parts) sum += p.bytes;
  const auto want = static_cast<Bytes>(m.reserved - m.allocated);
  if (sum != want)  // the snapshot and the stats disagree: an allocator bug; show it, never hide it
    m.parts.push_back({"unaccounted",
                       fmt::format("not found in the snapshot's blocks (snapshot free {} vs stats {}): please report",
                                   sum, want),
                       want - sum, 0});
}

std::vector<Site> sites_at(const Trace& t, std::size_t op, const std::vector<std::vector<io::Frame>>& frames,
                           std::size_t top) {
  // Live slots at `op` (its own effect included), by the ops: what the program asked for there.
  std::vector<std::uint32_t> alloc_op(t.slots, 0);
  std::vector<bool> live(t.slots, false);
  for (std::size_t k = 0; k <= op && k < t.ops.size(); ++k) {
    const Op& x = t.ops[k];
    if (x.kind == OpKind::Alloc) {
      live[x.slot] = true;
      alloc_op[x.slot] = static_cast<std::uint32_t>(k);
    } else if (x.kind == OpKind::Free || x.kind == OpKind::FreePending) {
      live[x.slot] = false;
    }
  }
  std::map<std::string, Site> by;
  static const std::vector<io::Frame> none;
  for (std::uint32_t s = 0; s < t.slots; ++s) {
    if (!live[s]) continue;
    const Op& x = t.ops[alloc_op[s]];
    const auto& fr = x.event < frames.size() ? frames[x.event] : none;
    const std::size_t at = io::site_frame(fr);
    std::string where = at < fr.size() ? clip_line(io::site_text(fr[at]), kMaxFrameLine)
                        : fr.empty()   ? std::string(kNoFramesSite)
                                       : std::string(kNoUsableFrameSite);
    Site& site = by[where];
    if (site.blocks == 0) {
      site.where = where;
      site.frames = fr;
    }
    site.bytes += x.size;
    ++site.blocks;
  }
  std::vector<Site> out;
  for (auto& [k, v] : by) out.push_back(std::move(v));
  std::stable_sort(out.begin(), out.end(), [](const Site& a, const Site& b) { return a.bytes > b.bytes; });
  if (out.size() > top) out.resize(top);
  return out;
}

}  // namespace cachet::replay

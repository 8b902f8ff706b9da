// Private pools in a replay: which allocations went to which pool, and when each pool was in use,
// inferred from the snapshot's segment pool ids (cachet/replay/pools.h).
#include "cachet/replay/pools.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <optional>

#include "cachet/replay/replay.h"
#include "cachet/replay/report.h"
#include "cachet/stats.h"

namespace cachet::replay {
namespace {

constexpr std::int32_t kDefault = -1;  // the default pools
constexpr std::uint32_t kNone = ~0u;

// The segment (or mapped range) each allocation lies in, following the trace's segment events.
// A range keeps its instance when part of it is unmapped, so an expandable segment's pieces
// share one pool.
struct SegmentWalk {
  struct Range {
    Bytes size;
    std::uint32_t instance;
  };
  std::map<std::uint64_t, Range> live;  // start -> range
  std::vector<Bytes> instance_bytes;    // size when made

  void grow(std::uint64_t a, Bytes n) {
    live[a] = Range{n, static_cast<std::uint32_t>(instance_bytes.size())};
    instance_bytes.push_back(n);
  }
  void release(std::uint64_t a, Bytes n) {
    const std::uint64_t end = a + n;
    auto it = live.upper_bound(a);
    if (it != live.begin()) --it;
    while (it != live.end() && it->first < end) {
      const std::uint64_t s = it->first, e = s + it->second.size;
      const std::uint32_t inst = it->second.instance;
      if (e <= a) {
        ++it;
        continue;
      }
      it = live.erase(it);
      if (s < a) live[s] = Range{a - s, inst};
      if (e > end) {
        live[end] = Range{e - end, inst};
        break;
      }
    }
  }
  std::uint32_t find(std::uint64_t a) const {
    auto it = live.upper_bound(a);
    if (it == live.begin()) return kNone;
    --it;
    return a < it->first + it->second.size ? it->second.instance : kNone;
  }
};

// The snapshot segment holding address `a`, or nullptr (segments are sorted by address).
const SegmentSnapshot* segment_at(const Snapshot& segs, std::uint64_t a) {
  auto it = std::upper_bound(segs.begin(), segs.end(), a,
                             [](std::uint64_t x, const SegmentSnapshot& s) { return x < s.address; });
  if (it == segs.begin()) return nullptr;
  --it;
  return a < it->address + it->total_size ? &*it : nullptr;
}

std::string id_text(PoolId id) { return fmt::format("({}, {})", id.first, id.second); }

}  // namespace

void route_to_pools(Trace& t, std::span<const TraceEvent> ev, const Snapshot& segs) {
  PoolInference inf;
  std::map<PoolId, std::int32_t> index;
  for (const auto& s : segs)
    if (!s.pool_id.is_default()) index.emplace(s.pool_id, 0);
  if (index.empty()) return;  // nothing private: the trace replays as before
  for (auto& [id, i] : index) {
    i = static_cast<std::int32_t>(inf.pools.size());
    ReplayPool p;
    p.id = id;
    inf.pools.push_back(p);
  }
  auto pool_of_id = [&](PoolId id) { return id.is_default() ? kDefault : index.at(id); };
  for (const auto& s : segs)
    if (!s.pool_id.is_default()) {
      ReplayPool& p = inf.pools[static_cast<std::size_t>(index.at(s.pool_id))];
      ++p.end_segments;
      p.end_reserved += s.total_size;
      p.end_allocated += s.allocated_size();
    }

  // 1. Each allocation's segment instance, then each instance's pool (known at the snapshot).
  SegmentWalk walk;
  std::vector<std::uint32_t> alloc_instance(ev.size(), kNone);
  std::vector<std::int32_t> pool_of(ev.size(), kDefault);
  std::vector<bool> unplaced(ev.size(), false);
  for (std::size_t i = 0; i < ev.size(); ++i) {
    const TraceEvent& e = ev[i];
    switch (e.action) {
      case TraceAction::SegmentAlloc:
      case TraceAction::SegmentMap:
        walk.grow(e.addr, e.size);
        break;
      case TraceAction::SegmentFree:
      case TraceAction::SegmentUnmap:
        walk.release(e.addr, e.size);
        break;
      case TraceAction::Alloc:
        alloc_instance[i] = walk.find(e.addr);
        if (alloc_instance[i] == kNone) {  // made before the trace starts: the snapshot may show it
          if (const SegmentSnapshot* s = segment_at(segs, e.addr)) pool_of[i] = pool_of_id(s->pool_id);
          else unplaced[i] = true;
        }
        break;
      default:
        break;
    }
  }
  constexpr std::int32_t kUnknown = -2;
  std::vector<std::int32_t> instance_pool(walk.instance_bytes.size(), kUnknown);
  for (const auto& [start, r] : walk.live)
    if (const SegmentSnapshot* s = segment_at(segs, start)) instance_pool[r.instance] = pool_of_id(s->pool_id);
  for (std::size_t k = 0; k < instance_pool.size(); ++k)
    if (instance_pool[k] == kUnknown) {
      ++inf.released_segments;
      inf.released_bytes += walk.instance_bytes[k];
    }
  for (std::size_t i = 0; i < ev.size(); ++i) {
    if (ev[i].action != TraceAction::Alloc) continue;
    if (unplaced[i]) ++inf.unplaced_allocations;
    if (alloc_instance[i] == kNone) continue;
    const std::int32_t p = instance_pool[alloc_instance[i]];
    if (p == kUnknown) {
      ++inf.released_allocations;
    } else {
      pool_of[i] = p;
    }
  }
  for (std::size_t i = 0; i < ev.size(); ++i)
    if (ev[i].action == TraceAction::Alloc && pool_of[i] >= 0) {
      ReplayPool& p = inf.pools[static_cast<std::size_t>(pool_of[i])];
      if (p.allocations++ == 0) p.first_event = static_cast<std::uint32_t>(i);
      p.last_event = static_cast<std::uint32_t>(i);
      if (std::find(p.streams.begin(), p.streams.end(), ev[i].stream) == p.streams.end())
        p.streams.push_back(ev[i].stream);
    }

  // 2. Windows: enter a pool before an allocation its segment says went there, leave it when an
  // allocation it would take goes elsewhere and before an empty_cache(); each window then ends
  // just after its last allocation (leaving earlier changes where no allocation goes). A window
  // starts as a capture of its first allocation's stream and becomes every stream's
  // (use_mem_pool) when the pool takes an allocation on another stream, unless that cannot be
  // (a capture's pool id; an allocation on another stream went elsewhere meanwhile): then the
  // window is left and a new one entered.
  struct Window {
    std::int32_t pool;
    PoolRoute route;
    std::size_t last = 0;  // position in `out` of its last request
    // The first allocation on another stream that went elsewhere while it was open, which
    // use_mem_pool would have taken: evidence of a capture once the pool takes another
    // allocation in this window.
    std::uint32_t foreign = kNone;
    std::uint32_t evidence = kNone;  // that allocation, once confirmed
  };
  std::vector<Window> windows;
  std::vector<std::size_t> active;  // open windows, oldest first
  std::vector<bool> left_for_empty_cache(inf.pools.size(), false);
  std::vector<Op> out;
  out.reserve(t.ops.size() + 16);
  struct End {
    std::size_t after;
    std::size_t window;
  };
  std::vector<End> ends;
  auto takes = [&](std::size_t w, StreamId s) { return windows[w].route.takes(s); };
  auto target = [&](StreamId s) -> std::ptrdiff_t {
    for (auto it = active.rbegin(); it != active.rend(); ++it)
      if (takes(*it, s)) return static_cast<std::ptrdiff_t>(*it);
    return -1;
  };
  auto leave = [&](std::size_t k) {  // active[k]
    ends.push_back(End{windows[active[k]].last, active[k]});
    active.erase(active.begin() + static_cast<std::ptrdiff_t>(k));
  };
  auto close_taking = [&](StreamId s, std::size_t newer_than) {
    for (std::size_t k = active.size(); k-- > 0;)
      if (active[k] >= newer_than && takes(active[k], s)) leave(k);
  };
  auto enter = [&](std::int32_t q, const Op& op) {
    const auto qi = static_cast<std::size_t>(q);
    windows.push_back(Window{.pool = q, .route = PoolRoute{.kind = PoolRoute::Kind::CaptureStream, .stream = op.stream}});
    active.push_back(windows.size() - 1);
    out.push_back(Op{.kind = OpKind::BeginPool, .aux = static_cast<std::uint32_t>(windows.size() - 1), .event = op.event});
    if (left_for_empty_cache[qi]) ++inf.split_by_empty_cache;
    left_for_empty_cache[qi] = false;
  };
  for (const Op& op : t.ops) {
    if (op.kind == OpKind::EmptyCache) {
      for (std::size_t a : active) left_for_empty_cache[static_cast<std::size_t>(windows[a].pool)] = true;
      while (!active.empty()) leave(active.size() - 1);
    }
    const bool request = op.kind == OpKind::Alloc || op.kind == OpKind::OomRequest;
    if (op.kind == OpKind::Alloc) {
      const std::int32_t q = pool_of[op.event];
      const std::ptrdiff_t w = target(op.stream);
      if ((w < 0 ? kDefault : windows[static_cast<std::size_t>(w)].pool) != q) {
        auto it = std::find_if(active.begin(), active.end(), [&](std::size_t a) { return windows[a].pool == q; });
        if (q == kDefault) {
          close_taking(op.stream, 0);
        } else if (it == active.end()) {
          enter(q, op);
        } else if (takes(*it, op.stream)) {  // shadowed by newer windows
          close_taking(op.stream, *it + 1);
        } else if (inf.pools[static_cast<std::size_t>(q)].id.first != 0 || windows[*it].foreign != kNone) {
          leave(static_cast<std::size_t>(it - active.begin()));
          enter(q, op);
        } else {  // the same window on another stream: use_mem_pool
          windows[*it].route = PoolRoute{.kind = PoolRoute::Kind::CurrentThread, .stream = 0};
          close_taking(op.stream, *it + 1);
        }
      }
    }
    out.push_back(op);
    if (request) {
      const std::ptrdiff_t w = target(op.stream);
      for (std::size_t a : active)
        if ((w < 0 || a > static_cast<std::size_t>(w)) && !takes(a, op.stream) && windows[a].foreign == kNone)
          windows[a].foreign = op.event;
      if (w >= 0) {
        Window& win = windows[static_cast<std::size_t>(w)];
        win.last = out.size() - 1;
        if (win.foreign != kNone && op.kind == OpKind::Alloc && win.evidence == kNone) win.evidence = win.foreign;
      }
    }
  }
  while (!active.empty()) leave(active.size() - 1);

  // 3. How each window was entered. One stream: a capture when the evidence says so (for the
  // window, or for its pool), else use_mem_pool (nothing tells); either route sends every
  // allocation where its segment says.
  for (std::size_t q = 0; q < inf.pools.size(); ++q) {
    ReplayPool& p = inf.pools[q];
    std::size_t prev[2] = {ev.size(), ev.size()};
    for (std::size_t i = p.first_event, n = 0; n < 2 && i-- > 0;)
      if (ev[i].action == TraceAction::Alloc) prev[n++] = i;
    auto seed_like = [&](std::size_t i) {
      return i < ev.size() && ev[i].size == 8 && ev[i].stream == ev[p.first_event].stream && pool_of[i] == kDefault;
    };
    if (p.id.first != 0) {
      p.capture_evidence = fmt::format("its id {} is one only a capture makes", id_text(p.id));
    } else if (p.allocations > 0 && seed_like(prev[0]) && seed_like(prev[1])) {
      p.capture_evidence = fmt::format(
          "the CUDA generator's graph seed and offset, two 8-byte allocations in the default pool on its stream at "
          "trace events {} and {}, come just before its first allocation, as at a process's first capture",
          prev[1], prev[0]);
    } else {
      for (const Window& w : windows)
        if (static_cast<std::size_t>(w.pool) == q && w.evidence != kNone) {
          p.capture_evidence = fmt::format(
              "an allocation on another stream at trace event {} went elsewhere while it was in use, where "
              "use_mem_pool would have taken it",
              w.evidence);
          break;
        }
    }
  }
  std::vector<bool> made(inf.pools.size(), false);  // a pool's first window makes it: one user to the end
  for (const Window& w : windows) {
    ReplayPool& p = inf.pools[static_cast<std::size_t>(w.pool)];
    PoolWindow pw{.pool = static_cast<std::uint32_t>(w.pool),
                  .route = w.route,
                  .entry = PoolEntry::UseMemPool,
                  .create = !made[static_cast<std::size_t>(w.pool)]};
    made[static_cast<std::size_t>(w.pool)] = true;
    if (w.route.kind == PoolRoute::Kind::CaptureStream) {
      pw.entry = p.capture_evidence.empty() ? PoolEntry::Unknown : PoolEntry::Capture;
      if (pw.entry == PoolEntry::Unknown) pw.route = PoolRoute{.kind = PoolRoute::Kind::CurrentThread, .stream = 0};
    }
    ++p.windows[static_cast<std::size_t>(pw.entry)];
    inf.windows.push_back(pw);
  }

  // 4. The ops with the windows' EndPool just after their last request, newest window first.
  std::sort(ends.begin(), ends.end(),
            [](const End& a, const End& b) { return a.after != b.after ? a.after < b.after : a.window > b.window; });
  std::vector<Op> ops;
  ops.reserve(out.size() + ends.size());
  const bool timed = !t.event_time_us.empty();
  std::vector<std::int64_t> times;
  if (timed) times.reserve(out.size() + ends.size());
  std::size_t e = 0;
  for (std::size_t k = 0; k < out.size(); ++k) {
    ops.push_back(out[k]);
    if (timed) times.push_back(out[k].event < ev.size() ? ev[out[k].event].time_us : 0);
    for (; e < ends.size() && ends[e].after == k; ++e) {
      ops.push_back(Op{.kind = OpKind::EndPool, .aux = static_cast<std::uint32_t>(ends[e].window), .event = out[k].event});
      if (timed) times.push_back(times.back());
    }
  }
  t.ops = std::move(ops);
  if (timed) t.event_time_us = std::move(times);
  t.pools = std::move(inf);
}

std::optional<std::uint32_t> request_window(const Trace& t, std::size_t op, StreamId stream) {
  std::vector<std::uint32_t> active;  // windows
  for (std::size_t k = 0; k < op && k < t.ops.size(); ++k) {
    const Op& o = t.ops[k];
    if (o.kind == OpKind::BeginPool) active.push_back(o.aux);
    if (o.kind == OpKind::EndPool) std::erase(active, o.aux);
  }
  for (auto it = active.rbegin(); it != active.rend(); ++it)
    if (t.pools.windows[*it].route.takes(stream)) return *it;
  return std::nullopt;
}

PoolId request_pool(const Trace& t, std::size_t op, StreamId stream) {
  const auto w = request_window(t, op, stream);
  return w ? t.pools.pools[t.pools.windows[*w].pool].id : PoolId{};
}

// pool_lines of a recording whose op list named the pools (route_recording_pools).
std::string op_list_pool_lines(const PoolInference& inf) {
  std::string o = fmt::format(
      "private pools: the op list {} enters {} private pool{} (its use_mem_pool and capture ops, as PyTorch's front "
      "end calls the allocator for them); the replay enters and leaves them where it does\n",
      inf.op_list, inf.pools.size(), inf.pools.size() == 1 ? "" : "s");
  for (const ReplayPool& p : inf.pools) {
    std::string streams;
    for (StreamId s : p.streams) streams += fmt::format("{}{}", streams.empty() ? "" : ", ", s);
    const std::uint64_t cap = p.windows[static_cast<int>(PoolEntry::Capture)];
    const std::uint64_t mem = p.windows[static_cast<int>(PoolEntry::UseMemPool)];
    std::string entered;
    if (mem) entered += fmt::format("use_mem_pool {} time{}", mem, mem == 1 ? "" : "s");
    if (cap) entered += fmt::format("{}captured {} time{}", entered.empty() ? "" : ", ", cap, cap == 1 ? "" : "s");
    o += fmt::format("  pool {}: {}; {}; at the end {} segment{}, {} reserved, {} allocated\n", id_text(p.id),
                     p.allocations == 0
                         ? std::string("no allocation went to it")
                         : fmt::format("{} allocation{} (trace events {}..{}) on stream{} {}", p.allocations,
                                       p.allocations == 1 ? "" : "s", p.first_event, p.last_event,
                                       p.streams.size() == 1 ? "" : "s", streams),
                     entered, p.end_segments, p.end_segments == 1 ? "" : "s", human_bytes_exact(p.end_reserved),
                     human_bytes_exact(p.end_allocated));
  }
  o += fmt::format("  pools released (a MemPool dropped, a graph reset): {}; the user's empty_cache() calls are the op "
                   "list's\n",
                   inf.releases);
  return o;
}

std::string pool_lines(const Trace& t) {
  const PoolInference& inf = t.pools;
  if (!inf.any()) return {};
  if (!inf.op_list.empty()) return op_list_pool_lines(inf);
  std::string o = fmt::format(
      "private pools: the snapshot's segments name {} private pool{}; the allocations in their segments are replayed "
      "into them\n",
      inf.pools.size(), inf.pools.size() == 1 ? "" : "s");
  for (const ReplayPool& p : inf.pools) {
    std::string streams;
    for (StreamId s : p.streams) streams += fmt::format("{}{}", streams.empty() ? "" : ", ", s);
    const std::uint64_t n = p.windows[0] + p.windows[1] + p.windows[2];
    o += fmt::format("  pool {}: {} allocation{} (trace events {}..{}) on stream{} {}; at the end {} segment{}, {} "
                     "reserved, {} allocated; entered {} time{}:",
                     id_text(p.id), p.allocations, p.allocations == 1 ? "" : "s", p.first_event, p.last_event,
                     p.streams.size() == 1 ? "" : "s", streams, p.end_segments, p.end_segments == 1 ? "" : "s",
                     human_bytes_exact(p.end_reserved), human_bytes_exact(p.end_allocated), n, n == 1 ? "" : "s");
    std::string parts;
    auto part = [&](std::string text) { parts += (parts.empty() ? " " : "; ") + text; };
    const std::uint64_t cap = p.windows[static_cast<int>(PoolEntry::Capture)];
    const std::uint64_t mem = p.windows[static_cast<int>(PoolEntry::UseMemPool)];
    const std::uint64_t unk = p.windows[static_cast<int>(PoolEntry::Unknown)];
    auto how_many = [&](std::uint64_t k) {
      return n == 1 ? std::string("as") : k == n ? std::string("each as") : fmt::format("{} as", k);
    };
    if (cap) part(fmt::format("{} a CUDA graph capture of its stream, since {}", how_many(cap), p.capture_evidence));
    if (mem) part(fmt::format("{} use_mem_pool (allocations on several streams in one window)", how_many(mem)));
    if (unk) part(fmt::format("{} use_mem_pool, though the trace cannot tell it from a capture of its one stream",
                              how_many(unk)));
    o += parts + "\n";
  }
  o += fmt::format(
      "note: what the trace cannot tell about private pools: (1) its entries carry no pool id; an allocation's pool "
      "is its segment's, and only segments alive at the snapshot carry one: {} segment{} ({}) released before the "
      "snapshot, with {} allocation{}, are taken to be the default pools'{}; (2) when each pool was entered and "
      "left (capture_begin/capture_end, use_mem_pool): taken as just before the first and just after the last "
      "allocation of each run of its allocations, and never across an empty_cache(){}; (3) use counts and releases "
      "(graph reset, MemPool destroyed): every pool is taken as alive to the end; (4) graph replays, which allocate "
      "nothing\n",
      inf.released_segments, inf.released_segments == 1 ? "" : "s", human_bytes_exact(inf.released_bytes),
      inf.released_allocations, inf.released_allocations == 1 ? "" : "s",
      inf.unplaced_allocations ? fmt::format(", and so are {} allocations in segments neither the trace nor the "
                                             "snapshot shows (a trace recorded mid-run)",
                                             inf.unplaced_allocations)
                               : std::string(),
      inf.split_by_empty_cache
          ? fmt::format(" (so a pool's allocations before and after an empty_cache() are two windows: {} here)",
                        inf.split_by_empty_cache)
          : std::string());
  return o;
}

std::string final_stats_line(const ReplayResult& r, const std::map<std::string, std::int64_t>& recorded) {
  if (recorded.empty()) return {};
  std::size_t compared = 0, equal = 0;
  std::string differ;
  for (const auto& [key, value] : flatten(r.stats)) {
    auto it = recorded.find(key);
    if (it == recorded.end()) continue;
    ++compared;
    if (it->second == value) {
      ++equal;
    } else {
      differ += fmt::format("{}{} (replay {}, recorded {})", differ.empty() ? "" : ", ", key, value, it->second);
    }
  }
  if (compared == 0)
    return fmt::format("final stats: nothing to compare: none of the {} recorded keys is a memory_stats() key the "
                       "replay has\n",
                       recorded.size());
  if (equal == compared) return fmt::format("final stats: all {} memory_stats() keys equal PyTorch's recorded ones\n", compared);
  return fmt::format("final stats: {} of {} memory_stats() keys equal PyTorch's recorded ones; {} differ: {}\n", equal,
                     compared, compared - equal, differ);
}

std::string pool_end_lines(const Trace& t, const ReplayResult& r) {
  std::string o;
  for (std::size_t q = 0; q < t.pools.pools.size() && q < r.pool_ends.size(); ++q) {
    const ReplayPool& p = t.pools.pools[q];
    const ReplayResult::PoolEnd& e = r.pool_ends[q];
    const bool same = e.segments == p.end_segments && e.reserved == p.end_reserved && e.allocated == p.end_allocated;
    o += fmt::format("pool {} at the end: {} segment{}, {} reserved, {} allocated{}\n", id_text(p.id), e.segments,
                     e.segments == 1 ? "" : "s", human_bytes_exact(e.reserved), human_bytes_exact(e.allocated),
                     same ? ", as in the snapshot" : "; the snapshot differs");
  }
  return o;
}

}  // namespace cachet::replay

// Private pools of an oracle recording, from its op list: the pool and capture ops go through
// PyTorch's front end (cachet/front_end/pool_front_end.h) and become the replay's BeginPool,
// EndPool and ReleasePool ops where the op list has them (cachet/replay/pools.h).
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <optional>
#include <stdexcept>
#include <unordered_map>

#include "cachet/errors.h"
#include "cachet/front_end/pool_front_end.h"
#include "cachet/replay/pools.h"
#include "cachet/replay/replay.h"

namespace cachet::replay {
namespace {

// The front end's allocator calls, kept in order (nothing is allocated: the trace's own events
// are the generator's tensors).
class CallLog final : public front_end::AllocatorCalls {
 public:
  enum class Kind : std::uint8_t { Malloc, Free, Create, Begin, End, Release, EmptyOf };
  struct Call {
    Kind kind;
    PoolId id;
    PoolRoute route;
  };
  std::vector<Call> calls;

  std::uint64_t malloc(Bytes, StreamId) override {
    calls.push_back({Kind::Malloc, {}, {}});
    return ++next_;
  }
  void free(std::uint64_t) override { calls.push_back({Kind::Free, {}, {}}); }
  void create_or_incref_pool(PoolId id) override { calls.push_back({Kind::Create, id, {}}); }
  void begin_allocate_to_pool(PoolId id, PoolRoute route) override { calls.push_back({Kind::Begin, id, route}); }
  void end_allocate_to_pool(PoolId id) override { calls.push_back({Kind::End, id, {}}); }
  void release_pool(PoolId id) override { calls.push_back({Kind::Release, id, {}}); }
  void empty_cache_of(PoolId id) override { calls.push_back({Kind::EmptyOf, id, {}}); }
  int pool_use_count(PoolId) const override { return 0; }

 private:
  std::uint64_t next_ = 0;
};

bool is_release(TraceAction a) {
  return a == TraceAction::FreeCompleted || a == TraceAction::SegmentFree || a == TraceAction::SegmentUnmap;
}

}  // namespace

bool route_recording_pools(Trace& t, std::span<const TraceEvent> ev, const Snapshot& segs, const io::Recording& rec,
                           const std::vector<ops::Op>& list, const std::string& op_list) {
  if (std::none_of(list.begin(), list.end(), [](const ops::Op& o) { return ops::is_pool_op(o); })) return false;
  // Ops PyTorch refused, or a list the recording does not match: inferred from the snapshot instead.
  if (list.size() != rec.steps.size() || !rec.errors.empty()) return false;

  PoolInference inf;
  inf.op_list = std::filesystem::path(op_list).filename().string();
  std::map<PoolId, std::uint32_t> index;  // pool id -> inf.pools
  std::map<PoolId, std::uint32_t> open;   // pool id -> its open window
  std::map<PoolId, bool> to_create;       // createOrIncrefPool called, its window not begun yet
  struct Mark {
    std::size_t at;  // before trace event `at`
    Op op;
  };
  std::vector<Mark> marks;
  std::unordered_map<ops::Handle, std::uint64_t> addr_of;  // op list id -> its block's address

  CallLog log;
  front_end::PoolFrontEnd fe(log, &rec.streams);
  std::size_t c = 0;  // the trace events of the ops before the current one end here
  auto find = [&](auto&& pred) -> std::optional<std::size_t> {
    for (std::size_t j = c; j < ev.size(); ++j)
      if (pred(ev[j])) return j;
    return std::nullopt;
  };
  auto consume_releases = [&] {
    while (c < ev.size() && is_release(ev[c].action)) ++c;
  };
  auto pool_index = [&](PoolId id) {
    auto [it, fresh] = index.emplace(id, static_cast<std::uint32_t>(inf.pools.size()));
    if (fresh) {
      ReplayPool p;
      p.id = id;
      inf.pools.push_back(p);
    }
    return it->second;
  };

  for (std::size_t i = 0; i < list.size(); ++i) {
    const io::Step& step = rec.steps[i];
    const ops::Op& any = list[i];
    if (const auto* a = std::get_if<ops::Allocate>(&any)) {
      if (a->thread != 0) return false;  // the replay allocates on one thread
      if (step.oom) {
        const auto j = find([](const TraceEvent& e) { return e.action == TraceAction::Oom; });
        if (!j) return false;
        c = *j + 1;
      } else if (step.result) {
        const std::uint64_t r = *step.result;
        const auto j = find([&](const TraceEvent& e) { return e.action == TraceAction::Alloc && e.addr == r; });
        if (!j) return false;
        c = *j + 1;
        if (a->id) addr_of[*a->id] = r;
      }
    } else if (const auto* f = std::get_if<ops::Free>(&any)) {
      auto it = addr_of.find(f->handle);
      if (it == addr_of.end()) continue;
      const std::uint64_t p = it->second;
      addr_of.erase(it);
      const auto j = find([&](const TraceEvent& e) { return e.action == TraceAction::FreeRequested && e.addr == p; });
      if (!j) return false;
      c = *j + 1;
      if (c < ev.size() && ev[c].action == TraceAction::FreeCompleted && ev[c].addr == p) ++c;
    } else if (std::holds_alternative<ops::EmptyCache>(any)) {
      marks.push_back({c, Op{.kind = OpKind::EmptyCache}});
      consume_releases();
    } else if (ops::is_pool_op(any)) {
      if (const auto* u = std::get_if<ops::UseMemPoolBegin>(&any); u && u->thread != 0) return false;
      if (step.oom || step.error) return false;
      const std::size_t first = log.calls.size();
      try {
        fe.apply(any);
      } catch (const UsageError&) {
        return false;
      } catch (const std::invalid_argument&) {  // a stream index beyond the recording's
        return false;
      }
      const auto& calls = log.calls;
      for (std::size_t k = first; k < calls.size(); ++k) {
        const CallLog::Call& x = calls[k];
        switch (x.kind) {
          case CallLog::Kind::Malloc: {  // the generator's seed or offset: its alloc event
            const auto j = find([](const TraceEvent& e) {
              return e.action == TraceAction::Alloc && e.size == front_end::kGeneratorTensorBytes;
            });
            if (!j) return false;
            c = *j + 1;
            break;
          }
          case CallLog::Kind::Free: {
            const auto j = find([](const TraceEvent& e) {
              return e.action == TraceAction::FreeRequested && e.size == front_end::kGeneratorTensorBytes;
            });
            if (!j) return false;
            c = *j + 1;
            if (c < ev.size() && ev[c].action == TraceAction::FreeCompleted && ev[c].addr == ev[*j].addr) ++c;
            break;
          }
          case CallLog::Kind::Create:
            to_create[x.id] = true;
            break;
          case CallLog::Kind::Begin: {
            const std::uint32_t q = pool_index(x.id);
            PoolWindow w{.pool = q,
                         .route = x.route,
                         .entry = x.route.is_capture() ? PoolEntry::Capture : PoolEntry::UseMemPool,
                         .create = to_create[x.id],
                         .release_at_end = !x.route.is_capture()};
            to_create[x.id] = false;
            ReplayPool& p = inf.pools[q];
            ++p.windows[static_cast<std::size_t>(w.entry)];
            if (w.entry == PoolEntry::Capture) p.capture_evidence = fmt::format("{} says so", inf.op_list);
            open[x.id] = static_cast<std::uint32_t>(inf.windows.size());
            marks.push_back({c, Op{.kind = OpKind::BeginPool, .aux = static_cast<std::uint32_t>(inf.windows.size())}});
            inf.windows.push_back(w);
            break;
          }
          case CallLog::Kind::End: {
            auto it = open.find(x.id);
            if (it == open.end()) return false;
            marks.push_back({c, Op{.kind = OpKind::EndPool, .aux = it->second}});
            // use_mem_pool's exit: endAllocateToPool, then releasePool, which the EndPool makes.
            if (inf.windows[it->second].release_at_end) {
              if (k + 1 >= calls.size() || calls[k + 1].kind != CallLog::Kind::Release) return false;
              ++k;
            }
            open.erase(it);
            break;
          }
          case CallLog::Kind::Release: {
            // A MemPool dropped (releasePool, emptyCache(id): its segment releases follow) or a
            // graph reset (releasePool only).
            const bool empty_of = k + 1 < calls.size() && calls[k + 1].kind == CallLog::Kind::EmptyOf;
            marks.push_back({c, Op{.kind = OpKind::ReleasePool, .slot = empty_of ? 1u : 0u, .aux = pool_index(x.id)}});
            ++inf.releases;
            if (empty_of) {
              ++k;
              consume_releases();
            }
            break;
          }
          case CallLog::Kind::EmptyOf:
            return false;  // only after a releasePool
        }
      }
    }
  }
  if (inf.windows.empty()) return false;

  // The ops with the marks in place. The user's empty_cache() calls are the op list's (the
  // segment releases the trace shows for them, and for a MemPool's emptyCache(id), follow the
  // marks); EmptyCache ops read from the trace are dropped.
  std::vector<Op> out;
  out.reserve(t.ops.size() + marks.size());
  const bool timed = !t.event_time_us.empty();
  std::vector<std::int64_t> times;
  if (timed) times.reserve(t.ops.size() + marks.size());
  const auto last_event = static_cast<std::uint32_t>(ev.empty() ? 0 : ev.size() - 1);
  std::size_t m = 0;
  std::uint64_t empty_caches = 0;
  auto emit = [&](Op op, std::uint32_t event) {
    op.event = event;
    if (op.kind == OpKind::EmptyCache) ++empty_caches;
    out.push_back(op);
    if (timed) times.push_back(event < ev.size() ? ev[event].time_us : 0);
  };
  for (const Op& op : t.ops) {
    for (; m < marks.size() && marks[m].at <= op.event; ++m) emit(marks[m].op, op.event);
    if (op.kind == OpKind::EmptyCache) continue;
    emit(op, op.event);
  }
  for (; m < marks.size(); ++m) emit(marks[m].op, last_event);
  t.ops = std::move(out);
  if (timed) t.event_time_us = std::move(times);
  t.empty_cache_calls = empty_caches;

  // Which allocations went to which pool: the newest open window whose route takes them.
  std::vector<std::uint32_t> active;
  for (const Op& op : t.ops) {
    if (op.kind == OpKind::BeginPool) active.push_back(op.aux);
    if (op.kind == OpKind::EndPool) std::erase(active, op.aux);
    if (op.kind != OpKind::Alloc) continue;
    for (auto it = active.rbegin(); it != active.rend(); ++it)
      if (inf.windows[*it].route.takes(op.stream)) {
        ReplayPool& p = inf.pools[inf.windows[*it].pool];
        if (p.allocations++ == 0) p.first_event = op.event;
        p.last_event = op.event;
        if (std::find(p.streams.begin(), p.streams.end(), op.stream) == p.streams.end()) p.streams.push_back(op.stream);
        break;
      }
  }
  for (const auto& s : segs)
    if (auto it = index.find(s.pool_id); it != index.end()) {
      ReplayPool& p = inf.pools[it->second];
      ++p.end_segments;
      p.end_reserved += s.total_size;
      p.end_allocated += s.allocated_size();
    }
  t.pools = std::move(inf);
  return true;
}

}  // namespace cachet::replay

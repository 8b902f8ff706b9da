// The pool and capture commands of the lockstep machine (props.h): MemPools entered, left and
// dropped, graphs captured on a stream into a new or a shared pool, reset in any order; and now
// and then an op both sides must refuse. The lockstep applies them through the one front end
// (cachet/front_end/pool_front_end.h, docs/pytorch-allocator.md §14.9). Allocations, frees
// (also of a pool's blocks after its release), record_stream (also during a capture), empty_cache
// and caps are the machine's other commands.
#include <fmt/format.h>

#include "props.h"

namespace cachet::props {
namespace {

// A pool or capture op in the model's terms (a capture's stream is an index into the sut's
// streams). `refused`: the op makes no sense in the model's state, or PyTorch's allocator
// refuses it; both sides must answer UsageError, and the model does not change.
struct PoolCmd : Cmd {
  Op op;
  bool refused;
  PoolCmd(Op o, bool r) : op(std::move(o)), refused(r) {}

  // Whether `op` is valid in `m` (the front end and the allocator accept it).
  static bool valid(const PoolsModel& m, const Op& op) {
    if (const auto* o = std::get_if<ops::UseMemPoolBegin>(&op)) return !m.in_use.contains(int(o->pool));
    if (const auto* o = std::get_if<ops::UseMemPoolEnd>(&op)) return m.in_use.contains(int(o->pool));
    if (const auto* o = std::get_if<ops::ReleasePool>(&op))
      return m.mempools.contains(int(o->pool)) && !m.in_use.contains(int(o->pool));
    if (const auto* o = std::get_if<ops::CaptureBegin>(&op)) {
      if (m.graphs.contains(int(o->graph)) || o->stream == 0) return false;
      for (const auto& [k, g] : m.graphs)
        if (!g.ended && g.stream == int(o->stream)) return false;
      if (!o->share) return true;
      auto it = m.graphs.find(int(*o->share));
      if (it == m.graphs.end() || !it->second.ended) return false;
      for (const auto& [k, g] : m.graphs)  // beginAllocateToPool: that pool is not active already
        if (!g.ended && g.pool == it->second.pool) return false;
      return true;
    }
    if (const auto* o = std::get_if<ops::CaptureEnd>(&op)) {
      auto it = m.graphs.find(int(o->graph));
      return it != m.graphs.end() && !it->second.ended;
    }
    if (const auto* o = std::get_if<ops::GraphReset>(&op)) {
      auto it = m.graphs.find(int(o->graph));
      return it != m.graphs.end() && it->second.ended;
    }
    return false;
  }

  void checkPreconditions(const PModel& m) const override {
    const bool ok = m.pools.enabled && valid(m.pools, op) != refused;
    RC_PRE(ok);
  }
  void apply(PModel& m) const override {
    if (refused) return;
    PoolsModel& p = m.pools;
    if (const auto* o = std::get_if<ops::UseMemPoolBegin>(&op)) {
      p.mempools.insert(int(o->pool));
      p.in_use.insert(int(o->pool));
      p.next_mempool = std::max(p.next_mempool, int(o->pool) + 1);
    } else if (const auto* o = std::get_if<ops::UseMemPoolEnd>(&op)) {
      p.in_use.erase(int(o->pool));
    } else if (const auto* o = std::get_if<ops::ReleasePool>(&op)) {
      p.mempools.erase(int(o->pool));
    } else if (const auto* o = std::get_if<ops::CaptureBegin>(&op)) {
      const int pool = o->share ? p.graphs.at(int(*o->share)).pool : int(o->graph);
      p.graphs[int(o->graph)] = PoolsModel::Graph{int(o->stream), false, pool};
      p.next_graph = std::max(p.next_graph, int(o->graph) + 1);
    } else if (const auto* o = std::get_if<ops::CaptureEnd>(&op)) {
      p.graphs.at(int(o->graph)).ended = true;
      std::erase_if(p.joined, [&](const auto& j) { return j.second == int(o->graph); });
    } else if (const auto* o = std::get_if<ops::GraphReset>(&op)) {
      p.graphs.erase(int(o->graph));
    }
  }
  void run(const PModel&, PSut& sut) const override {
    Op real = op;
    if (auto* o = std::get_if<ops::CaptureBegin>(&real)) o->stream = sut.stream(int(o->stream));
    sut.step(real);
    const auto& out = sut.ls().last_sut();
    // A valid op that failed (out of memory for the generator's tensors at a capture_begin):
    // the front end did not do what the model's state says, so from here on the model cannot
    // tell which ops are invalid.
    if (!refused && out.kind != lockstep::Outcome::Kind::Ok) sut.pools_inexact = true;
    // An op the model's state makes invalid must be refused by both (the lockstep compared them).
    if (refused && !sut.pools_inexact && on("lockstep") && out.kind != lockstep::Outcome::Kind::UsageError &&
        out.kind != lockstep::Outcome::Kind::Ended)
      sut.fail("lockstep", "an invalid pool op was not refused: " + lockstep::show(real) +
                               "\n  sut: " + lockstep::show(out) + "\n  model: " +
                               lockstep::show(sut.ls().with([](auto& l) { return l.last_model(); })));
  }
  void show(std::ostream& os) const override { os << (refused ? "refused: " : "") << lockstep::show(op); }
};

// wait_stream and kernel (docs/pytorch-allocator.md §14.10.1): streams join a capture, do work
// in it and are joined back, which is when graph_capture_record_stream_reuse:True lets a block
// freed during the capture go back to its pool before the capture ends. The lockstep runs them on
// the host backend only (Lockstep::runs_stream_ops); the PoolsModel does not follow joins, so a
// capture_begin on a joined stream, or a capture_end before the joins are undone, is refused on
// both sides and makes the pools inexact (PoolCmd::run).
struct StreamCmd : Cmd {
  Op op;  // streams as indices into the sut's streams
  explicit StreamCmd(Op o) : op(std::move(o)) {}
  void checkPreconditions(const PModel& m) const override { RC_PRE(m.pools.enabled); }
  void apply(PModel& m) const override {
    const auto* w = std::get_if<ops::WaitStream>(&op);
    if (w == nullptr) return;
    PoolsModel& p = m.pools;
    auto graph_of = [&](int s) -> std::optional<int> {
      for (const auto& [k, g] : p.graphs)
        if (!g.ended && g.stream == s) return k;
      if (auto j = p.joined.find(s); j != p.joined.end()) return j->second;
      return std::nullopt;
    };
    if (auto g = graph_of(int(w->waited)); g && !graph_of(int(w->waiter))) p.joined[int(w->waiter)] = *g;
  }
  void run(const PModel&, PSut& sut) const override {
    if (!sut.ls().with([](auto& l) { return l.runs_stream_ops(); })) return;
    Op real = op;
    if (auto* w = std::get_if<ops::WaitStream>(&real)) {
      w->waiter = sut.stream(int(w->waiter));
      w->waited = sut.stream(int(w->waited));
    } else if (auto* k = std::get_if<ops::Kernel>(&real)) {
      k->stream = sut.stream(int(k->stream));
    }
    sut.step(real);
  }
  void show(std::ostream& os) const override { os << lockstep::show(op); }
};

template <class T>
std::optional<T> any_of(const std::vector<T>& v) {
  if (v.empty()) return std::nullopt;
  return *rc::gen::elementOf(v);
}

}  // namespace

std::shared_ptr<const Cmd> gen_pool_command(const PModel& m) {
  const PoolsModel& p = m.pools;
  std::vector<int> in_use(p.in_use.begin(), p.in_use.end()), idle, capturing, ended, free_streams;
  for (int k : p.mempools)
    if (!p.in_use.contains(k)) idle.push_back(k);
  for (const auto& [k, g] : p.graphs) (g.ended ? ended : capturing).push_back(k);
  for (int s = 1; s < kStreams; ++s) {
    bool busy = false;
    for (const auto& [k, g] : p.graphs) busy = busy || (!g.ended && g.stream == s);
    if (!busy) free_streams.push_back(s);
  }
  // Ended graphs whose pool no capture is using now: their pool may be shared.
  std::vector<int> shareable, busy_pool;
  for (int k : ended) {
    bool busy = false;
    for (int c : capturing) busy = busy || p.graphs.at(c).pool == p.graphs.at(k).pool;
    (busy ? busy_pool : shareable).push_back(k);
  }
  auto make = [](Op op, bool refused) { return std::make_shared<PoolCmd>(std::move(op), refused); };
  // Where the lockstep runs them, a wait_stream or a kernel: one pool command in three, one in two
  // while a graph captures. Then most name the capture's stream: a kernel there (the node a
  // free's markers are), a stream joining it, the capture's stream waiting on another (a join
  // back), so that reuse during a capture happens.
  if (kDrawStreamOps && g_policy == Policy::PyTorch && *rc::gen::inRange(0, capturing.empty() ? 3 : 2) == 0) {
    auto any_stream = [] { return StreamId(*rc::gen::inRange(0, kStreams)); };
    const auto c = any_of(capturing);
    const bool at_origin = c && *rc::gen::inRange(0, 4) != 0;
    const StreamId origin = c ? StreamId(p.graphs.at(*c).stream) : 0;
    if (*rc::gen::inRange(0, 3) == 0) return std::make_shared<StreamCmd>(ops::Kernel{at_origin ? origin : any_stream()});
    StreamId waiter = any_stream(), waited = any_stream();
    if (at_origin) {
      if (*rc::gen::inRange(0, 2) == 0)
        waited = origin;  // a stream joins the capture
      else
        waiter = origin;  // the capture's stream waits on another: a join back
    }
    return std::make_shared<StreamCmd>(ops::WaitStream{waiter, waited});
  }
  // use_mem_pool is entered by the main thread, or one time in four by thread 1 or 2
  // (docs/pytorch-allocator.md §14.10.2).
  auto enter_thread = [] {
    return kDrawThreads && *rc::gen::inRange(0, 4) == 0 ? ThreadIndex(*rc::gen::inRange(1, 3)) : ThreadIndex{0};
  };
  // The kinds possible in this state, weighted by repetition; one is drawn (no retry loop:
  // RapidCheck scales inRange by the size, which is 0 at first).
  enum Kind { Enter, Leave, Drop, Capture, EndCapture, Reset, Meaningless, SharedBusy };
  std::vector<Kind> kinds{Meaningless};
  if (!idle.empty() || p.next_mempool < 6) kinds.insert(kinds.end(), {Enter, Enter});
  if (!in_use.empty()) kinds.insert(kinds.end(), {Leave, Leave});
  if (!idle.empty()) kinds.push_back(Drop);
  if (!free_streams.empty() && p.next_graph < 8) kinds.insert(kinds.end(), {Capture, Capture});
  if (!capturing.empty()) kinds.insert(kinds.end(), {EndCapture, EndCapture});
  if (!ended.empty()) kinds.insert(kinds.end(), {Reset, Reset});
  if (!busy_pool.empty() && !free_streams.empty() && p.next_graph < 8) kinds.push_back(SharedBusy);
  switch (kinds[*rc::gen::inRange<std::size_t>(0, kinds.size())]) {
    case Enter:  // torch.cuda.MemPool() and use_mem_pool, or an idle MemPool entered again
      if (!idle.empty() && (p.next_mempool >= 6 || *rc::gen::inRange(0, 2) == 0))
        return make(ops::UseMemPoolBegin{std::uint64_t(*any_of(idle)), enter_thread()}, false);
      return make(ops::UseMemPoolBegin{std::uint64_t(p.next_mempool), enter_thread()}, false);
    case Leave:
      return make(ops::UseMemPoolEnd{std::uint64_t(*any_of(in_use))}, false);
    case Drop:  // del MemPool
      return make(ops::ReleasePool{std::uint64_t(*any_of(idle))}, false);
    case Capture: {  // a capture into a new pool, or into an ended graph's pool
      std::optional<std::uint64_t> share;
      if (auto e = any_of(shareable); e && *rc::gen::inRange(0, 3) == 0) share = std::uint64_t(*e);
      return make(ops::CaptureBegin{std::uint64_t(p.next_graph), StreamId(*any_of(free_streams)), share}, false);
    }
    case EndCapture:
      return make(ops::CaptureEnd{std::uint64_t(*any_of(capturing))}, false);
    case Reset:
      return make(ops::GraphReset{std::uint64_t(*any_of(ended))}, false);
    case SharedBusy:  // refused by the allocator: a pool shared while another capture allocates to it
      return make(ops::CaptureBegin{std::uint64_t(p.next_graph), StreamId(*any_of(free_streams)),
                                    std::uint64_t(*any_of(busy_pool))},
                  true);
    case Meaningless:
      break;
  }
  // Refused by the front end: what the model's state makes meaningless.
  const int k = *rc::gen::inRange(0, 8);
  const auto kk = std::uint64_t(k);
  std::vector<Op> bad;
  if (!p.in_use.contains(k)) bad.push_back(ops::UseMemPoolEnd{kk});
  if (p.in_use.contains(k) || !p.mempools.contains(k)) bad.push_back(ops::ReleasePool{kk});
  if (p.in_use.contains(k)) bad.push_back(ops::UseMemPoolBegin{kk});
  if (!p.graphs.contains(k) || p.graphs.at(k).ended) bad.push_back(ops::CaptureEnd{kk});
  if (!p.graphs.contains(k) || !p.graphs.at(k).ended) bad.push_back(ops::GraphReset{kk});
  if (!p.graphs.contains(k)) bad.push_back(ops::CaptureBegin{kk, 0, std::nullopt});  // the default stream
  if (auto c = any_of(capturing); c && !p.graphs.contains(k))
    bad.push_back(ops::CaptureBegin{kk, StreamId(p.graphs.at(*c).stream), std::nullopt});
  if (auto e = any_of(capturing); e && !p.graphs.contains(k) && !free_streams.empty())
    bad.push_back(ops::CaptureBegin{kk, StreamId(free_streams[0]), std::uint64_t(*e)});
  return make(*any_of(bad), true);
}

}  // namespace cachet::props

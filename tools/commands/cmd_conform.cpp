// `cachet conform [OPS] RESULT`: replays an oracle recording's ops through an engine (the model,
// the production allocator, or both) with PyTorch's device addresses, and compares every
// returned pointer, the six stats after every op, every final memory_stats() key, the final
// segments and blocks, the memory_summary() text, the trace, and OOMs (same ops, same message
// with the driver figures masked). Exit 0: no mismatch; 1: mismatches; 2: bad input.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "cachet/config.h"
#include "cachet/errors.h"
#include "cachet/rule_flip.h"
#include "cachet/io/file.h"
#include "cachet/io/recording.h"
#include "cachet/model/allocator.h"
#include "cachet/model/segment_source.h"
#include "cachet/summary.h"
#include "command.h"
#include "conform_cachet.h"
#include "engine.h"
#include "pool_front_end.h"

namespace cachet::cli {

// ---- the engine registry (engine.h) ----

static std::map<std::string, EngineFactory>& engines() {
  static std::map<std::string, EngineFactory> registry;
  return registry;
}

bool register_engine(const std::string& name, EngineFactory factory) {
  engines()[name] = std::move(factory);
  return true;
}

const EngineFactory* find_engine(const std::string& name) {
  auto it = engines().find(name);
  return it == engines().end() ? nullptr : &it->second;
}

namespace {

// ---- the model engine ----

class ModelEngine final : public ReplayEngine {
 public:
  explicit ModelEngine(const EngineSetup& s)
      : source_(s.device_events, s.total_memory), alloc_(s.config, source_) {
    alloc_.set_events_complete_when_recorded(true);  // engine.h
    // fraction = cap / total, applied before the first op; truncation gives back cap
    // (docs/pytorch-allocator.md §13.4).
    if (s.cap > 0)
      alloc_.set_memory_fraction(static_cast<double>(s.cap) / static_cast<double>(s.total_memory));
  }
  std::uint64_t malloc(Bytes size, StreamId stream, ThreadIndex thread) override {
    return guard([&] { return alloc_.malloc(size, stream, thread); });
  }
  void record_stream(std::uint64_t ptr, StreamId stream) override { alloc_.record_stream(ptr, stream); }
  void free(std::uint64_t ptr) override {
    guard([&] {
      alloc_.free(ptr);
      return 0;
    });
  }
  void empty_cache() override {
    guard([&] {
      alloc_.empty_cache();
      return 0;
    });
  }
  DeviceStats stats() const override { return alloc_.stats(); }
  Snapshot snapshot() const override { return alloc_.snapshot(); }
  std::vector<TraceEvent> trace() const override { return alloc_.trace(); }
  void create_or_incref_pool(PoolId id) override { alloc_.create_or_incref_pool(id); }
  void begin_allocate_to_pool(PoolId id, PoolRoute route) override { alloc_.begin_allocate_to_pool(id, route); }
  void end_allocate_to_pool(PoolId id) override { alloc_.end_allocate_to_pool(id); }
  void release_pool(PoolId id) override { alloc_.release_pool(id); }
  void empty_cache_of(PoolId id) override {
    guard([&] {
      alloc_.empty_cache(id);
      return 0;
    });
  }
  int pool_use_count(PoolId id) const override { return alloc_.pool_use_count(id); }
  std::vector<std::uint64_t> deferred_frees() const override { return alloc_.deferred_frees(); }
  void set_deferred_free_order(const std::vector<std::uint64_t>& order) override {
    alloc_.set_deferred_free_order(order);
  }
  std::vector<std::pair<StreamId, std::vector<std::uint64_t>>> event_queues() const override {
    return alloc_.event_queues();
  }
  void set_event_stream_order(const std::vector<StreamId>& order) override { alloc_.set_event_stream_order(order); }
  // The capture graph (docs/pytorch-allocator.md §14.10.1): the model's own.
  bool has_capture_graph() const override { return true; }
  void wait_stream(StreamId waiter, StreamId waited) override { alloc_.wait_stream(waiter, waited); }
  void kernel(StreamId stream) override { alloc_.kernel(stream); }
  void configure(const std::string& text) override {
    alloc_.set_allocator_settings(parse_config(text, ConfigSource::PyTorch, alloc_.config()).config);
  }

 private:
  template <class F>
  static auto guard(F&& f) -> decltype(f()) {
    try {
      return f();
    } catch (const model::Divergence& d) {
      throw ReplayDivergence(d.what());
    }
  }
  model::RecordedSegmentSource source_;
  model::Allocator alloc_;
};

const bool model_registered = register_engine(
    "model", [](const EngineSetup& s) { return std::make_unique<ModelEngine>(s); });

// ---- comparison ----

std::string hex(std::uint64_t v) { return fmt::format("{:#x}", v); }

// The driver's figures differ between machines and runs; mask them (and nothing else).
std::string mask_driver_figures(const std::string& m) {
  static const std::regex free_re(R"(of which [0-9.]+ (bytes|KiB|MiB|GiB) is free)");
  static const std::regex proc_re(R"(this process has [0-9.]+ (bytes|KiB|MiB|GiB) memory in use)");
  static const std::regex pid_re(R"(Process [0-9]+ has [0-9.]+ (bytes|KiB|MiB|GiB) memory in use)");
  std::string out = std::regex_replace(m, free_re, "of which <free> is free");
  out = std::regex_replace(out, proc_re, "this process has <in use> memory in use");
  return std::regex_replace(out, pid_re, "Process <pid> has <in use> memory in use");
}

struct Report {
  std::size_t mismatches = 0;
  std::size_t printed = 0;
  std::size_t max_printed = 20;
  std::string engine;
  bool verbose() { return printed++ < max_printed; }
};

void print_segment_around(const Snapshot& snap, std::uint64_t addr, const char* label) {
  for (const SegmentSnapshot& s : snap) {
    if (addr < s.address || addr >= s.address + s.total_size) continue;
    std::printf("    %s: segment %s size %llu stream %llu %s%s\n", label, hex(s.address).c_str(),
                static_cast<unsigned long long>(s.total_size),
                static_cast<unsigned long long>(s.stream), s.is_large ? "large" : "small",
                s.is_expandable ? " expandable" : "");
    std::size_t at = 0;
    for (std::size_t i = 0; i < s.blocks.size(); ++i)
      if (s.blocks[i].address <= addr) at = i;
    const std::size_t from = at >= 3 ? at - 3 : 0;
    const std::size_t to = std::min(s.blocks.size(), at + 4);
    for (std::size_t i = from; i < to; ++i) {
      const BlockSnapshot& b = s.blocks[i];
      std::printf("      %s %s size %llu requested %llu %s\n", i == at ? "->" : "  ",
                  hex(b.address).c_str(), static_cast<unsigned long long>(b.size),
                  static_cast<unsigned long long>(b.requested_size), std::string(to_string(b.state)).c_str());
    }
    return;
  }
  std::printf("    %s: %s is in no segment of the engine\n", label, hex(addr).c_str());
}

std::string describe_pool(PoolId id) { return fmt::format("[{}, {}]", id.first, id.second); }

std::string describe_segment(const SegmentSnapshot& s) {
  std::string out = fmt::format("{} size {} stream {} {}{} pool {} [", hex(s.address), s.total_size, s.stream,
                                s.is_large ? "large" : "small", s.is_expandable ? " expandable" : "",
                                describe_pool(s.pool_id));
  for (std::size_t i = 0; i < s.blocks.size(); ++i) {
    if (i == 8) {
      out += fmt::format(" ... {} blocks", s.blocks.size());
      break;
    }
    const BlockSnapshot& b = s.blocks[i];
    out += fmt::format("{}{}/{}/{}", i ? ", " : "", b.size, b.requested_size, to_string(b.state));
  }
  return out + "]";
}

// docs/pytorch-allocator.md §14.10.3: PyTorch takes a batch of deferred frees in its hash map's
// order (heap addresses), which no rule of the engines can give. `pending` (the engine's deferred
// frees, in the order the frees were made) ordered as the recording completed them: by the first
// free_completed row of each address from row `from` of `recorded` on (the engine's trace so far;
// it is the recording's as long as the replay conforms). A deferred block holds its address until
// its free completes, so no other block's free_completed row at that address comes first. The
// blocks whose uses were all recorded during the capture complete in the walk's order; the others
// get their events in it, and those of one stream complete in it. Addresses the recording does not
// complete keep their order, after the others.
std::vector<std::uint64_t> recorded_deferred_order(const std::vector<std::uint64_t>& pending,
                                                   const std::vector<TraceEvent>& recorded, std::size_t from) {
  std::vector<std::pair<std::size_t, std::uint64_t>> at;  // (row, address); row = size(): not completed
  for (std::uint64_t p : pending) {
    std::size_t row = recorded.size();
    for (std::size_t k = from; k < recorded.size(); ++k)
      if (recorded[k].action == TraceAction::FreeCompleted && recorded[k].addr == p) {
        row = k;
        break;
      }
    at.emplace_back(row, p);
  }
  std::stable_sort(at.begin(), at.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<std::uint64_t> out;
  for (const auto& [row, p] : at) out.push_back(p);
  return out;
}

// docs/pytorch-allocator.md §14.10.3: PyTorch walks the streams of its cuda_events map in the hash
// order of their handles, which no rule of the engines can give. The streams of `queues` (the
// engine's, in the order it would walk them) ordered as the recording completed their blocks: a
// stream's place is the first free_completed row, from row `from` of `recorded` on, of a block
// whose pending events are all on that stream (that row comes in that stream's walk); a stream
// holding only blocks with events on other streams too is placed by the first row of any of its
// blocks. A block awaiting events holds its address until its free completes, so the first
// free_completed row at its address is its own. Streams the recording completes nothing of keep
// their order, after the others.
std::vector<StreamId> recorded_stream_order(const std::vector<std::pair<StreamId, std::vector<std::uint64_t>>>& queues,
                                            const std::vector<TraceEvent>& recorded, std::size_t from) {
  std::map<std::uint64_t, int> queues_of;  // address -> how many queues hold an event of its block
  for (const auto& [s, addrs] : queues)
    for (std::uint64_t p : std::set<std::uint64_t>(addrs.begin(), addrs.end())) ++queues_of[p];
  auto first_row = [&](std::uint64_t p) {
    for (std::size_t k = from; k < recorded.size(); ++k)
      if (recorded[k].action == TraceAction::FreeCompleted && recorded[k].addr == p) return k;
    return recorded.size();
  };
  std::vector<std::pair<std::size_t, StreamId>> at;  // (row, stream); row = size(): none
  for (const auto& [s, addrs] : queues) {
    std::size_t own = recorded.size(), any = recorded.size();
    for (std::uint64_t p : addrs) {
      const std::size_t row = first_row(p);
      any = std::min(any, row);
      if (queues_of[p] == 1) own = std::min(own, row);
    }
    at.emplace_back(own != recorded.size() ? own : any, s);
  }
  std::stable_sort(at.begin(), at.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<StreamId> out;
  for (const auto& [row, s] : at) out.push_back(s);
  return out;
}

std::string hex_list(const std::vector<std::uint64_t>& v) {
  std::string out;
  for (std::uint64_t p : v) out += (out.empty() ? "" : " ") + hex(p);
  return out;
}

// The stream of index `s` of op `i`; invalid_argument when the recording has no such stream.
StreamId stream_at(const io::Recording& rec, std::size_t i, StreamId s) {
  if (s >= rec.streams.size())
    throw std::invalid_argument(
        fmt::format("op {}: stream index {} but the recording has {} streams", i, s, rec.streams.size()));
  return rec.streams[s];
}

// Replays `rec` with `ops` through one engine and reports every mismatch. Returns ops run.
std::size_t conform_one(const std::string& engine_name, const EngineFactory& factory,
                        const io::Recording& rec, const std::vector<ops::Op>& ops, const Config& config,
                        Report& report) {
  EngineSetup setup;
  setup.config = config;
  setup.total_memory = rec.total_memory;
  setup.cap = rec.cap;
  setup.device_events = rec.trace;
  std::unique_ptr<ReplayEngine> engine = factory(setup);
  auto mismatch = [&](const std::string& what) {
    ++report.mismatches;
    if (report.verbose()) std::printf("[%s] %s\n", engine_name.c_str(), what.c_str());
  };

  std::map<std::uint64_t, std::uint64_t> pointers;  // op id -> engine pointer
  PoolFrontEnd pools(*engine, rec.streams);          // the pool and capture ops (§14.9)
  std::vector<std::string> oom_messages;
  std::size_t done = 0;
  // "snapshot" rows record memory_snapshot() calls, not allocator actions: not compared.
  auto without_snapshots = [](std::vector<TraceEvent> t) {
    std::erase_if(t, [](const TraceEvent& e) { return e.action == TraceAction::Snapshot; });
    return t;
  };
  const std::vector<TraceEvent> recorded = without_snapshots(rec.trace);
  // §14.10.3: the engine's pending deferred frees as last ordered (from the recording), and, when
  // that order is not the order the frees were made, that order and the one it replaced.
  std::vector<std::uint64_t> deferred_seen, deferred_given, deferred_made;
  for (std::size_t i = 0; i < ops.size(); ++i) {
    const io::Step& want = rec.steps[i];
    try {
      // The op may process the pending batch: give the engine the recording's order first.
      std::vector<std::uint64_t> pending = engine->deferred_frees();
      if (pending.size() < 2) deferred_seen.clear();  // a later batch is ordered afresh
      if (pending.size() >= 2 && pending != deferred_seen) {
        std::vector<std::uint64_t> order =
            recorded_deferred_order(pending, recorded, without_snapshots(engine->trace()).size());
        bool taken = true;
        if (order != pending) {
          engine->set_deferred_free_order(order);
          if (const std::vector<std::uint64_t> now = engine->deferred_frees(); now != order) {
            mismatch(fmt::format("op {}: the engine was given the recording's order of its deferred frees {} but lists "
                                 "{}",
                                 i, hex_list(order), hex_list(now)));
            taken = false;
          }
        }
        if (taken && (order != pending || !deferred_given.empty())) {  // this batch was (or is now) reordered
          deferred_given = order;
          // The frees' own order: an earlier order given, then the frees deferred since.
          for (std::uint64_t p : pending)
            if (std::find(deferred_made.begin(), deferred_made.end(), p) == deferred_made.end())
              deferred_made.push_back(p);
        }
        deferred_seen = std::move(order);
      }
      // The op may walk the streams' pending events: give the engine the recording's order of streams.
      if (const auto queues = engine->event_queues(); queues.size() >= 2) {
        std::vector<StreamId> walk;
        for (const auto& [s, addrs] : queues) walk.push_back(s);
        const std::vector<StreamId> order =
            recorded_stream_order(queues, recorded, without_snapshots(engine->trace()).size());
        if (order != walk) {
          engine->set_event_stream_order(order);
          std::vector<StreamId> now;
          for (const auto& [s, addrs] : engine->event_queues()) now.push_back(s);
          if (now != order)
            mismatch(fmt::format("op {}: the engine was given the recording's order of streams with pending events {} "
                                 "but lists {}",
                                 i, fmt::join(order, " "), fmt::join(now, " ")));
          else
            fmt::print("[{}] op {}: the events of {} streams walked in the recording's order (its free_completed "
                       "rows: PyTorch's hash-map order of streams, docs/pytorch-allocator.md §14.10.3) {}, not {}\n",
                       engine_name, i, order.size(), fmt::join(order, " "), fmt::join(walk, " "));
        }
      }
      if (const auto* a = std::get_if<ops::Allocate>(&ops[i])) {
        const ops::Allocate& op = *a;
        if (op.stream >= rec.streams.size())
          throw std::invalid_argument(fmt::format("op {}: stream index {} but the recording has {} streams",
                                                  i, op.stream, rec.streams.size()));
        const StreamId stream = rec.streams[op.stream];
        std::optional<std::uint64_t> got;
        std::string oom;
        try {
          got = engine->malloc(op.size, stream, op.thread);
        } catch (const OutOfMemory& e) {
          oom = e.what();
        }
        if (got) pointers[op.id.value()] = *got;
        if (want.oom && !got) {
          oom_messages.push_back(oom);
        } else if (want.oom) {
          mismatch(fmt::format("op {}: alloc {} B on stream {}: expected OOM, got pointer {}", i, op.size,
                               stream, hex(*got)));
        } else if (!got) {
          mismatch(fmt::format("op {}: alloc {} B on stream {}: expected pointer {}, got OOM: {}", i,
                               op.size, stream, want.result ? hex(*want.result) : "null", oom));
        } else if (!want.result || *want.result != *got) {
          mismatch(fmt::format("op {}: alloc {} B on stream {}: expected pointer {}, got {}", i, op.size,
                               stream, want.result ? hex(*want.result) : "null", hex(*got)));
          if (report.printed <= report.max_printed) {
            const Snapshot snap = engine->snapshot();
            print_segment_around(snap, *got, "actual");
            if (want.result) print_segment_around(snap, *want.result, "expected");
          }
        }
      } else if (const auto* f = std::get_if<ops::Free>(&ops[i])) {
        auto it = pointers.find(f->handle);
        // Frees of allocations that hit OOM are not in the op list (ORACLE_README); an id the
        // engine never returned means the engine OOMed where PyTorch did not: already reported.
        if (it != pointers.end()) {
          engine->free(it->second);
          pointers.erase(it);
        }
      } else if (const auto* r = std::get_if<ops::RecordStream>(&ops[i])) {
        if (r->stream >= rec.streams.size())
          throw std::invalid_argument(fmt::format("op {}: stream index {} but the recording has {} streams", i,
                                                  r->stream, rec.streams.size()));
        // As for a free: an allocation that ran out of memory has nothing to record.
        if (auto it = pointers.find(r->handle); it != pointers.end()) engine->record_stream(it->second, rec.streams[r->stream]);
      } else if (std::holds_alternative<ops::EmptyCache>(ops[i])) {
        engine->empty_cache();
      } else if (const auto* w = std::get_if<ops::WaitStream>(&ops[i])) {  // §14.10.1
        engine->wait_stream(stream_at(rec, i, w->waiter), stream_at(rec, i, w->waited));
      } else if (const auto* k = std::get_if<ops::Kernel>(&ops[i])) {
        engine->kernel(stream_at(rec, i, k->stream));
      } else if (const auto* c = std::get_if<ops::SetAllocatorSettings>(&ops[i])) {
        engine->configure(c->text);
      } else {  // the pool and capture ops (docs/pytorch-allocator.md §14.9)
        pools.apply(ops[i]);
      }
      if (want.error) mismatch(fmt::format("op {}: PyTorch refused this op, the engine did not", i));
      // The batch the recording's order was given for went through this op: say so.
      if (!deferred_given.empty()) {
        const std::vector<std::uint64_t> left = engine->deferred_frees();
        if (std::none_of(deferred_given.begin(), deferred_given.end(), [&](std::uint64_t p) {
              return std::find(left.begin(), left.end(), p) != left.end();
            })) {
          std::printf("[%s] op %zu: %zu deferred frees processed in the recording's order (its free_completed rows: "
                      "PyTorch's hash-map order, docs/pytorch-allocator.md §14.10.3) %s, not in the order they "
                      "were made %s\n",
                      engine_name.c_str(), i, deferred_given.size(), hex_list(deferred_given).c_str(),
                      hex_list(deferred_made).c_str());
          deferred_given.clear();
          deferred_made.clear();
        }
      }
    } catch (const PyTorchFailure& e) {
      // The engine says PyTorch 2.11 fails here; the recording must say so too. Either way the
      // replay cannot go on (PyTorch's process ends at such a failure).
      if (!want.error)
        mismatch(fmt::format("op {}: the engine reports a PyTorch failure PyTorch did not have: {}", i, e.what()));
      std::printf("[%s] replay stopped at op %zu: %s\n", engine_name.c_str(), i, e.what());
      return i + 1;
    } catch (const ReplayDivergence& d) {
      mismatch(fmt::format("op {}: divergence from the recorded device calls: {}", i, d.what()));
      std::printf("[%s] replay stopped at op %zu\n", engine_name.c_str(), i);
      return i + 1;
    } catch (const UsageError& e) {
      mismatch(fmt::format("op {}: the engine refused the op: {}", i, e.what()));
    }
    done = i + 1;
    const auto got = step_stats(engine->stats());
    for (std::size_t k = 0; k < 6; ++k) {
      if (got[k] != want.stats[k]) {
        mismatch(fmt::format("op {}: {} expected {}, got {}", i, rec.stat_keys[k], want.stats[k], got[k]));
        break;  // one mismatch per op: the first stat that differs
      }
    }
  }

  // OOM messages: the recording keeps the first three.
  for (std::size_t k = 0; k < rec.oom_messages.size(); ++k) {
    if (k >= oom_messages.size()) {
      mismatch(fmt::format("OOM message {}: expected \"{}\", the engine raised only {} OOMs", k,
                           rec.oom_messages[k], oom_messages.size()));
      continue;
    }
    const std::string want = mask_driver_figures(rec.oom_messages[k]);
    const std::string got = mask_driver_figures(oom_messages[k]);
    if (want != got) mismatch(fmt::format("OOM message {}:\n  expected: {}\n  actual:   {}", k, want, got));
  }

  // Final memory_stats(): all keys.
  const auto flat = flatten(engine->stats());
  std::map<std::string, std::int64_t> got_stats(flat.begin(), flat.end());
  for (const auto& [key, value] : rec.final_stats) {
    auto it = got_stats.find(key);
    if (it == got_stats.end())
      mismatch(fmt::format("final stats: key {} missing from the engine", key));
    else if (it->second != value)
      mismatch(fmt::format("final stats: {} expected {}, got {}", key, value, it->second));
  }
  for (const auto& [key, value] : got_stats)
    if (!rec.final_stats.contains(key)) mismatch(fmt::format("final stats: unexpected key {}", key));

  // Final snapshot.
  const Snapshot snap = engine->snapshot();
  if (snap.size() != rec.segments.size())
    mismatch(fmt::format("final snapshot: expected {} segments, got {}", rec.segments.size(), snap.size()));
  for (std::size_t k = 0; k < std::min(snap.size(), rec.segments.size()); ++k) {
    const SegmentSnapshot& w = rec.segments[k];
    const SegmentSnapshot& g = snap[k];
    if (w.address != g.address || w.total_size != g.total_size || w.stream != g.stream ||
        w.is_large != g.is_large || w.pool_id != g.pool_id || w.blocks != g.blocks)
      mismatch(fmt::format("final snapshot: segment {}:\n  expected {}\n  actual   {}", k,
                           describe_segment(w), describe_segment(g)));
  }

  // Private pools: every pool made (ids in order) and the MemPools alive at the end with their use
  // counts (PyTorch lists them in its dict's order; compared by k).
  if (!rec.pool_ids.empty() || !rec.live_pools.empty()) {
    const auto& got_ids = pools.pool_ids();
    if (got_ids.size() != rec.pool_ids.size())
      mismatch(fmt::format("pool_ids: expected {} pools, the replay made {}", rec.pool_ids.size(), got_ids.size()));
    for (std::size_t k = 0; k < std::min(got_ids.size(), rec.pool_ids.size()); ++k)
      if (got_ids[k].name != rec.pool_ids[k].name || got_ids[k].id != rec.pool_ids[k].id)
        mismatch(fmt::format("pool_ids[{}]: expected {} {}, got {} {}", k, rec.pool_ids[k].name,
                             describe_pool(rec.pool_ids[k].id), got_ids[k].name, describe_pool(got_ids[k].id)));
    if (done == ops.size()) {
      std::map<std::uint64_t, io::LivePool> want_live, got_live;
      for (const auto& p : rec.live_pools) want_live[p.k] = p;
      for (const auto& p : pools.live_pools()) got_live[p.k] = p;
      for (const auto& [k, w] : want_live) {
        auto it = got_live.find(k);
        if (it == got_live.end() || it->second.id != w.id || it->second.use_count != w.use_count)
          mismatch(fmt::format("live_pools: MemPool {} expected {} use_count {}, got {}", k, describe_pool(w.id),
                               w.use_count,
                               it == got_live.end() ? std::string("none")
                                                    : fmt::format("{} use_count {}", describe_pool(it->second.id),
                                                                  it->second.use_count)));
      }
      if (got_live.size() != want_live.size())
        mismatch(fmt::format("live_pools: expected {} MemPools alive, got {}", want_live.size(), got_live.size()));
    }
  }

  // memory_summary().
  const std::string summary = memory_summary(engine->stats());
  if (!rec.summary.empty() && summary != rec.summary)
    mismatch(fmt::format("memory_summary differs:\n--- expected\n{}--- actual\n{}", rec.summary, summary));

  // Trace: every event in order (oom rows: the recording has no address; snapshot rows left out).
  const std::vector<TraceEvent> trace = without_snapshots(engine->trace());
  if (done == ops.size()) {
    const std::size_t n = std::min(trace.size(), recorded.size());
    for (std::size_t k = 0; k < n; ++k) {
      TraceEvent w = recorded[k];
      TraceEvent g = trace[k];
      if (w.action == TraceAction::Oom) w.addr = g.addr = 0;
      if (w.action != g.action || w.addr != g.addr || w.size != g.size || w.stream != g.stream) {
        mismatch(fmt::format("trace event {}: expected {} {} {} stream {}, got {} {} {} stream {}", k,
                             to_string(w.action), hex(w.addr), w.size, w.stream, to_string(g.action),
                             hex(g.addr), g.size, g.stream));
        break;
      }
    }
    if (trace.size() != recorded.size())
      mismatch(fmt::format("trace: expected {} events, got {}", recorded.size(), trace.size()));
  }
  return done;
}

// An op list and a recording belong together when every allocation's step returned a pointer
// or ran out of memory, every free's and empty_cache's step neither, and (requested_bytes being
// exact) each allocation that succeeded grew requested_bytes.all.current by its size. (In a list
// with record_stream, frees whose events complete, or that a capture deferred, are processed by
// the next allocation, docs/pytorch-allocator.md §6, §14.7: there it grows by its size at most.)
// The first op that breaks this, with how many do; "" when none does.
std::string pairing_problem(const std::vector<ops::Op>& ops, const io::Recording& rec, const std::string& ops_path,
                            const std::string& rec_path) {
  const auto req = std::find(rec.stat_keys.begin(), rec.stat_keys.end(), "requested_bytes.all.current");
  const std::size_t k = static_cast<std::size_t>(req - rec.stat_keys.begin());
  auto op_text = [](const ops::Op& op) {
    if (const auto* a = std::get_if<ops::Allocate>(&op)) return fmt::format("an allocation of {} bytes", a->size);
    if (std::holds_alternative<ops::Free>(op)) return std::string("a free");
    if (std::holds_alternative<ops::RecordStream>(op)) return std::string("a record_stream");
    if (std::holds_alternative<ops::EmptyCache>(op)) return std::string("empty_cache()");
    return ops::show(op);  // a pool or capture op
  };
  const bool stream_uses = std::any_of(ops.begin(), ops.end(), [](const ops::Op& op) {
    return std::holds_alternative<ops::RecordStream>(op);
  });
  std::string first;
  std::size_t bad = 0;
  std::int64_t requested = 0;
  for (std::size_t i = 0; i < ops.size(); ++i) {
    const io::Step& st = rec.steps[i];
    const auto* a = std::get_if<ops::Allocate>(&ops[i]);
    const bool alloc = a != nullptr;
    std::string why;
    if (alloc != (st.oom || st.result.has_value())) {
      why = fmt::format("op {} of {} is {}, but step {} of {} {}", i, ops_path, op_text(ops[i]), i, rec_path,
                        st.oom ? "ran out of memory" : st.result ? "returned a pointer" : "returned no pointer");
    } else if (alloc && st.result && k < 6 &&
               (stream_uses ? st.stats[k] - requested > static_cast<std::int64_t>(a->size)
                            : st.stats[k] - requested != static_cast<std::int64_t>(a->size))) {
      why = fmt::format("op {} of {} allocates {} bytes, but at step {} of {} requested_bytes.all.current grew by {}",
                        i, ops_path, a->size, i, rec_path, st.stats[k] - requested);
    }
    if (k < 6) requested = st.stats[k];
    if (why.empty()) continue;
    if (bad++ == 0) first = why;
  }
  if (bad == 0) return "";
  return fmt::format("the op list and the recording do not belong together: {} ({} of {} ops disagree with their "
                     "steps); pass the op list the recording was made from (results/res_<regime>_<config> pairs "
                     "with ops/ops_<regime>)",
                     first, bad, ops.size());
}

struct Options {
  std::vector<std::string> files;
  std::string ops;
  std::string engine;  // "": model (--policy pytorch), both (--policy cachet)
  std::string policy = "pytorch";
  std::size_t max_printed = 20;
};

// --policy cachet (conform_cachet.h): policy:cachet's waste on the recording; exit 1 when its two
// implementations disagree or an invariant breaks.
int run_cachet(const io::Recording& rec, const std::vector<ops::Op>& ops, const std::string& ops_path,
               const std::string& result_path, const std::string& engine, std::size_t max_printed) {
  std::vector<std::string> engines;  // policy:cachet's engines: its model, the production allocator
  if (engine == "model" || engine == "both" || engine.empty()) engines.push_back("cachet-model");
  if (engine == "impl" || engine == "both" || engine.empty()) engines.push_back("impl");
  if (engines.empty()) {
    std::fprintf(stderr, "cachet conform: --engine must be model, impl or both (got \"%s\")\n", engine.c_str());
    return kExitBadInput;
  }
  if (ops.size() != rec.steps.size()) {
    std::fprintf(stderr, "cachet conform: %s has %zu ops but %s has %zu steps; pass the right --ops FILE\n",
                 ops_path.c_str(), ops.size(), result_path.c_str(), rec.steps.size());
    return kExitBadInput;
  }
  if (const std::string why = pairing_problem(ops, rec, ops_path, result_path); !why.empty()) {
    std::fprintf(stderr, "cachet conform: %s\n", why.c_str());
    return kExitBadInput;
  }
  try {
    const CachetWaste w = conform_cachet(rec, ops, engines, max_printed);
    if (!rec.conf.empty())
      std::printf("(the recording's conf \"%s\" is PyTorch's; policy:cachet has none of its knobs, only the cap)\n",
                  rec.conf.c_str());
    print_cachet_waste(result_path, w);
    return w.problem_count == 0 ? kExitOk : kExitCheckFailed;
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "cachet conform: %s\n", e.what());
    return kExitBadInput;
  }
}

int run(const Options& o) {
#if defined(CACHET_RULE_FLIPS) && CACHET_RULE_FLIPS
  // cachet-flips (tools/CMakeLists.txt): say which rule flip applies, refuse an unknown one.
  try {
    if (const RuleFlip flip = active_rule_flip(); flip != RuleFlip::None)
      for (const RuleFlipInfo& f : rule_flips())
        if (f.flip == flip)
          std::printf("rule flip %s (docs/pytorch-allocator.md §%s): %s\n", std::string(f.name).c_str(),
                      std::string(f.section).c_str(), std::string(f.what).c_str());
  } catch (const UsageError& e) {
    std::fprintf(stderr, "cachet conform: %s\n", e.what());
    return kExitBadInput;
  }
#endif
  std::string ops_path;
  std::string result_path;
  if (o.files.size() == 2) {
    ops_path = o.files[0];
    result_path = o.files[1];
  } else if (o.files.size() == 1) {
    result_path = o.files[0];
  } else {
    std::fprintf(stderr, "cachet conform: %zu files given; expected OPS RESULT, or RESULT alone\n", o.files.size());
    return kExitBadInput;
  }
  if (!o.ops.empty() && !ops_path.empty() && o.ops != ops_path) {
    std::fprintf(stderr, "cachet conform: the op list is given twice, as OPS (%s) and as --ops (%s): give it once\n",
                 ops_path.c_str(), o.ops.c_str());
    return kExitBadInput;
  }
  if (!o.ops.empty()) ops_path = o.ops;
  if (o.policy != "pytorch" && o.policy != "cachet") {
    std::fprintf(stderr, "cachet conform: --policy must be pytorch or cachet (got \"%s\")\n", o.policy.c_str());
    return kExitBadInput;
  }

  std::vector<std::string> names;
  if (o.engine.empty() || o.engine == "model" || o.engine == "impl") {
    names.push_back(o.engine.empty() ? "model" : o.engine);
  } else if (o.engine == "both") {
    names = {"model", "impl"};
  } else {
    std::fprintf(stderr, "cachet conform: --engine must be model, impl or both (got \"%s\")\n", o.engine.c_str());
    return kExitBadInput;
  }
  std::vector<const EngineFactory*> factories;
  for (const std::string& n : names) {
    const EngineFactory* f = find_engine(n);
    if (f == nullptr) {
      std::fprintf(stderr,
                   "cachet conform: engine \"%s\" is not built into this cachet (the production "
                   "allocator's replay adapter, tools/engine_gpu.cpp, was not part of the build); "
                   "use --engine model\n",
                   n.c_str());
      return kExitBadInput;
    }
    factories.push_back(f);
  }

  io::Recording rec;
  std::vector<ops::Op> ops;
  Config config;
  try {
    rec = io::read_recording(result_path);
    if (ops_path.empty()) ops_path = io::ops_path_for(result_path);
    ops = io::read_ops(ops_path);
  } catch (const io::ReadError& e) {
    std::fprintf(stderr, "cachet conform: %s\n", e.what());
    return kExitBadInput;
  }
  if (o.policy == "cachet") return run_cachet(rec, ops, ops_path, result_path, o.engine, o.max_printed);
  if (ops.size() != rec.steps.size()) {
    std::fprintf(stderr,
                 "cachet conform: %s has %zu ops but %s has %zu steps; they do not belong together "
                 "(pass the right --ops FILE)\n",
                 ops_path.c_str(), ops.size(), result_path.c_str(), rec.steps.size());
    return kExitBadInput;
  }
  if (const std::string why = pairing_problem(ops, rec, ops_path, result_path); !why.empty()) {
    std::fprintf(stderr, "cachet conform: %s\n", why.c_str());
    return kExitBadInput;
  }
  try {
    config = parse_config(rec.conf, ConfigSource::PyTorch).config;
  } catch (const ConfigError& e) {
    std::fprintf(stderr, "cachet conform: %s: conf \"%s\": %s\n", result_path.c_str(), rec.conf.c_str(), e.what());
    return kExitBadInput;
  }
  if (config.backend != Backend::Native) {
    std::fprintf(stderr,
                 "cachet conform: %s: conf \"%s\" selects backend:cudaMallocAsync; only the native "
                 "caching allocator is modelled\n",
                 result_path.c_str(), rec.conf.c_str());
    return kExitBadInput;
  }
  if (rec.cap > rec.total_memory) {
    std::fprintf(stderr, "cachet conform: %s: cap %llu exceeds total_memory %llu\n", result_path.c_str(),
                 static_cast<unsigned long long>(rec.cap), static_cast<unsigned long long>(rec.total_memory));
    return kExitBadInput;
  }

  Report report;
  report.max_printed = o.max_printed;
  std::size_t ran = 0;
  for (std::size_t k = 0; k < names.size(); ++k) {
    try {
      ran = std::max(ran, conform_one(names[k], *factories[k], rec, ops, config, report));
    } catch (const std::invalid_argument& e) {
      std::fprintf(stderr, "cachet conform: %s\n", e.what());
      return kExitBadInput;
    }
  }
  std::printf("conform: %zu ops, %zu mismatches\n", ops.size(), report.mismatches);
  return report.mismatches == 0 ? kExitOk : kExitCheckFailed;
}

Runner setup(CLI::App& sub) {
  auto o = std::make_shared<Options>();
  // Named FILE with no upper count (CLI11 2.1 writes a 1-to-2 positional as "files(1x)" in the
  // usage line); more than two is refused in run_conform.
  sub.add_option("FILE", o->files, "OPS RESULT, or RESULT alone (ops found in ../ops/ beside it)")
      ->type_name("[OPS] RESULT")
      ->required()
      ->expected(1, CLI::detail::expected_max_vector_size);
  sub.add_option("--ops", o->ops, "the op list (ops_<regime>.json[.gz]) to replay");
  sub.add_option("--engine", o->engine,
                 "model (default), impl (the production allocator) or both; with --policy cachet: policy:cachet's "
                 "model, the production allocator, or both (default)");
  sub.add_option("--policy", o->policy,
                 "pytorch (default: compare with the recording) or cachet (policy:cachet's model and production "
                 "allocator side by side, invariants after every op; prints its waste against PyTorch's figures)");
  sub.add_option("--max-report", o->max_printed, "mismatches printed in detail (default 20)")
      ->check(CLI::Validator(
          [](std::string& v) { return v.starts_with('-') ? "a count, 0 or more, not " + v : std::string(); }, "COUNT"));
  return [o] { return run(*o); };
}

const bool registered = register_command(
    {"conform", "Replay an oracle recording and compare with what PyTorch did", setup});

}  // namespace
}  // namespace cachet::cli

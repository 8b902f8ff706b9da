// `cachet conform` against PyTorch's recording (conform_pytorch.h): one engine's replay, every
// outcome compared with the recorded one.
#include "conform_pytorch.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <regex>
#include <stdexcept>
#include <string>
#include <vector>

#include "cachet/errors.h"
#include "cachet/summary.h"
#include "conform_order.h"
#include "pool_front_end.h"

namespace cachet::cli {
namespace {

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

}  // namespace

std::size_t conform_one(const std::string& engine_name, const EngineFactory& factory,
                        const io::Recording& rec, const std::vector<ops::Op>& ops, const Config& config,
                        ConformReport& report) {
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

}  // namespace cachet::cli

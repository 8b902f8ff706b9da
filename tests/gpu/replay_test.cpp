// Conformance: each of the 30 oracle recordings (tests/data/oracle/results, layout in
// tests/data/oracle/ORACLE_README.md) replayed through cachet::CachingAllocator on the host
// backend with the recorded driver addresses. Compared with what PyTorch 2.11 did: every
// returned pointer (or OOM), the six stats after every op, all 122 final stats, the final
// memory_snapshot(), memory_summary(), the trace events and the OOM messages' allocator part.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "cachet/errors.h"
#include "cachet/io/recording.h"
#include "cachet/stats.h"
#include "replay_support.h"

namespace cachet::test {
namespace {

class Replay : public ::testing::TestWithParam<std::string> {};

std::string block_state(BlockState s) { return std::string(to_string(s)); }

TEST_P(Replay, MatchesPyTorch) {
  const io::Recording rec = io::read_recording(recording_path(GetParam()));
  const std::vector<ops::Op> ops = io::read_ops(io::ops_path_for(rec.path));
  ASSERT_EQ(ops.size(), rec.steps.size());
  std::shared_ptr<gpu::HostSim> sim;
  auto alloc = replay_allocator(rec, &sim);
  alloc->set_trace(true);

  std::map<std::uint64_t, void*> live;
  std::vector<std::string> oom_messages;
  int mismatches = 0;
  for (std::size_t i = 0; i < ops.size() && mismatches < 5; ++i) {
    const io::Step& want = rec.steps[i];
    if (const auto* a = std::get_if<ops::Allocate>(&ops[i])) {
      const StreamId stream = rec.streams.at(a->stream);
      try {
        void* p = alloc->allocate(a->size, stream);
        if (want.oom || !want.result || reinterpret_cast<std::uintptr_t>(p) != *want.result) {
          ADD_FAILURE() << "op " << i << ": alloc " << a->size << " returned " << p << ", PyTorch "
                        << (want.oom ? std::string("oom") : std::to_string(want.result.value_or(0)));
          ++mismatches;
        }
        live[a->id.value()] = p;
      } catch (const OutOfMemory& e) {
        if (!want.oom) {
          ADD_FAILURE() << "op " << i << ": alloc " << a->size << " OOM but PyTorch returned a pointer: " << e.what();
          ++mismatches;
        }
        oom_messages.emplace_back(e.what());
      }
    } else if (const auto* f = std::get_if<ops::Free>(&ops[i])) {
      if (auto it = live.find(f->handle); it != live.end()) {  // else that allocation OOMed
        alloc->free(it->second);
        live.erase(it);
      }
    } else if (std::holds_alternative<ops::EmptyCache>(ops[i])) {
      alloc->empty_cache();
    } else {
      FAIL() << "op " << i << " (" << ops::show(ops[i]) << "): not supported yet (issue 16)";
    }
    const auto got = step_stats(alloc->stats());
    if (got != want.stats) {
      std::string g, w;
      for (int k = 0; k < 6; ++k) g += std::to_string(got[k]) + " ", w += std::to_string(want.stats[k]) + " ";
      ADD_FAILURE() << "op " << i << ": stats " << g << "!= PyTorch " << w;
      ++mismatches;
    }
  }
  ASSERT_EQ(mismatches, 0);
  EXPECT_EQ(alloc->invariants(), std::vector<std::string>{});

  // All final stats.
  for (const auto& [key, value] : flatten(alloc->stats())) {
    auto it = rec.final_stats.find(key);
    ASSERT_NE(it, rec.final_stats.end()) << key;
    EXPECT_EQ(value, it->second) << key;
  }
  EXPECT_EQ(flatten(alloc->stats()).size(), rec.final_stats.size());

  // The trace, up to here (the snapshot below adds a snapshot event).
  const auto trace = alloc->trace();
  ASSERT_EQ(trace.size(), rec.trace.size());
  for (std::size_t i = 0; i < trace.size(); ++i) {
    const auto& g = trace[i];
    const auto& w = rec.trace[i];
    ASSERT_EQ(to_string(g.action), to_string(w.action)) << "trace event " << i;
    if (g.action != TraceAction::Oom) {
      ASSERT_EQ(g.addr, w.addr) << "trace event " << i;
    }
    ASSERT_EQ(g.size, w.size) << "trace event " << i;
    ASSERT_EQ(g.stream, w.stream) << "trace event " << i;
  }

  // The final snapshot.
  const Snapshot snap = alloc->snapshot();
  ASSERT_EQ(snap.size(), rec.segments.size());
  for (std::size_t s = 0; s < snap.size(); ++s) {
    const auto& g = snap[s];
    const auto& w = rec.segments[s];
    EXPECT_EQ(g.address, w.address) << "segment " << s;
    EXPECT_EQ(g.total_size, w.total_size) << "segment " << s;
    EXPECT_EQ(g.stream, w.stream) << "segment " << s;
    EXPECT_EQ(g.is_large, w.is_large) << "segment " << s;
    EXPECT_EQ(g.is_expandable, w.is_expandable) << "segment " << s;
    ASSERT_EQ(g.blocks.size(), w.blocks.size()) << "segment " << s;
    for (std::size_t b = 0; b < g.blocks.size(); ++b) {
      EXPECT_EQ(g.blocks[b].address, w.blocks[b].address) << "segment " << s << " block " << b;
      EXPECT_EQ(g.blocks[b].size, w.blocks[b].size) << "segment " << s << " block " << b;
      EXPECT_EQ(g.blocks[b].requested_size, w.blocks[b].requested_size) << "segment " << s << " block " << b;
      EXPECT_EQ(block_state(g.blocks[b].state), block_state(w.blocks[b].state)) << "segment " << s << " block " << b;
    }
  }
  const auto after = alloc->trace();
  ASSERT_EQ(after.size(), trace.size() + 1);
  EXPECT_EQ(after.back().action, TraceAction::Snapshot);

  // memory_summary() byte for byte.
  EXPECT_EQ(alloc->summary(), rec.summary);

  // OOM messages: the driver's figures (free memory, the process's use) differ on the host;
  // the allocator's part (what was asked, the cap, allocated and reserved) must match.
  ASSERT_GE(oom_messages.size(), rec.oom_messages.size());
  for (std::size_t i = 0; i < rec.oom_messages.size(); ++i) {
    const std::string& w = rec.oom_messages[i];
    const std::string& g = oom_messages[i];
    const auto head = w.substr(0, w.find(" GPU 0 has"));
    EXPECT_EQ(g.substr(0, g.find(" GPU 0 has")), head);
    const auto tail_w = w.substr(w.find("allowed; "));
    const auto tail_g = g.find("allowed; ") == std::string::npos ? g : g.substr(g.find("allowed; "));
    EXPECT_EQ(tail_g, tail_w);
  }
}


// The same replays in validate mode: invariants() after every op (docs/invariants.md).
TEST_P(Replay, InvariantsHoldAfterEveryOp) {
  const io::Recording rec = io::read_recording(recording_path(GetParam()));
  const std::vector<ops::Op> ops = io::read_ops(io::ops_path_for(rec.path));
  Config base;
  base.validate = true;
  auto alloc = replay_allocator(rec, nullptr, base);
  std::map<std::uint64_t, void*> live;
  for (std::size_t i = 0; i < ops.size(); ++i) {
    try {
      if (const auto* a = std::get_if<ops::Allocate>(&ops[i])) {
        live[a->id.value()] = alloc->allocate(a->size, rec.streams.at(a->stream));
      } else if (const auto* f = std::get_if<ops::Free>(&ops[i])) {
        if (auto it = live.find(f->handle); it != live.end()) {
          alloc->free(it->second);
          live.erase(it);
        }
      } else if (std::holds_alternative<ops::EmptyCache>(ops[i])) {
        alloc->empty_cache();
      } else {
        FAIL() << "op " << i << " (" << ops::show(ops[i]) << "): not supported yet (issue 16)";
      }
    } catch (const OutOfMemory&) {
    } catch (const InvariantViolation& e) {
      FAIL() << "op " << i << ": " << e.what();
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Oracle, Replay, ::testing::ValuesIn(all_recordings()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace cachet::test

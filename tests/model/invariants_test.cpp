// Random op sequences (fixed seeds) through the model under several configurations, with the
// structural invariants and the stats/snapshot consistency of docs/pytorch-allocator.md §5.3
// checked after every op (Allocator::check_invariants), plus the stats that must return to zero at the end.
#include <random>
#include <set>
#include <stdexcept>
#include <utility>

#include "cachet/errors.h"
#include "harness.h"

namespace cachet::model::test {
namespace {

void run_random(const Config& c, std::uint64_t seed, Bytes capacity) {
  Device d(c, capacity);
  d.alloc.set_memory_fraction(0.9 * static_cast<double>(capacity) / static_cast<double>(kH200Total));
  std::mt19937_64 rng(seed);
  std::vector<std::uint64_t> live;
  const StreamId streams[] = {0, 11, 12};
  for (int i = 0; i < 3000; ++i) {
    const auto r = rng() % 100;
    if (r < 50 || live.empty()) {
      // Log-uniform 1 B .. 256 MiB.
      const double e = std::uniform_real_distribution<double>(0.0, 28.0)(rng);
      const auto size = static_cast<Bytes>(std::exp2(e));
      try {
        live.push_back(d.alloc.malloc(size, streams[rng() % 3]));
      } catch (const OutOfMemory&) {
      }
    } else if (r < 85) {
      const auto k = rng() % live.size();
      d.alloc.free(live[k]);
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(k));
    } else if (r < 93) {
      d.alloc.record_stream(live[rng() % live.size()], streams[rng() % 3]);
    } else if (r < 98) {
      d.alloc.complete_events(streams[rng() % 3]);
    } else {
      d.alloc.empty_cache();
    }
    ASSERT_NO_THROW(d.alloc.check_invariants()) << "op " << i;
  }
  for (auto p : live) d.alloc.free(p);
  d.alloc.empty_cache();
  d.alloc.check_invariants();
  const DeviceStats& s = d.alloc.stats();
  EXPECT_EQ(s.allocated_bytes[0].current, 0);
  EXPECT_EQ(s.active_bytes[0].current, 0);
  EXPECT_EQ(s.requested_bytes[0].current, 0);
  EXPECT_EQ(s.reserved_bytes[0].current, 0);
  EXPECT_EQ(s.inactive_split_bytes[0].current, 0);
  EXPECT_EQ(d.source.in_use(), 0u);  // every device byte went back
  EXPECT_TRUE(d.alloc.snapshot().empty());
}

TEST(Invariants, RandomSequences) {
  const char* confs[] = {"",
                         "max_split_size_mb:128",
                         "max_split_size_mb:256,roundup_power2_divisions:4",
                         "garbage_collection_threshold:0.6,max_split_size_mb:64",
                         "roundup_power2_divisions:[256:1,512:2,1024:4,>:8]",
                         "expandable_segments:True"};
  for (const char* text : confs) {
    for (std::uint64_t seed : {1u, 2u}) {
      SCOPED_TRACE(std::string(text) + " seed " + std::to_string(seed));
      run_random(conf(text), seed, 4 * GiB);
    }
  }
}

// [INV-STATE-1]: the transitions block.h allows, and nothing else (docs/pytorch-allocator.md
// §2.5, §6, §7).
TEST(Invariants, BlockStateTransitions) {
  using S = BlockState;
  const S all[] = {S::Allocated, S::AwaitingEvents, S::Free, S::Unmapped};
  const std::set<std::pair<S, S>> legal = {
      {S::Free, S::Allocated},     {S::Allocated, S::Free},  {S::Allocated, S::AwaitingEvents},
      {S::AwaitingEvents, S::Free}, {S::Free, S::Unmapped}, {S::Unmapped, S::Free}};
  for (S from : all)
    for (S to : all)
      EXPECT_EQ(legal_transition(from, to), legal.contains({from, to}))
          << state_name(from) << " -> " << state_name(to);

  Block b;  // born Free
  EXPECT_THROW(b.set_state(S::AwaitingEvents), std::logic_error);  // not from Free
  b.set_state(S::Allocated);
  EXPECT_THROW(b.set_state(S::AwaitingEvents), std::logic_error);  // no events outstanding
  b.event_count = 1;
  b.set_state(S::AwaitingEvents);
  EXPECT_THROW(b.set_state(S::Allocated), std::logic_error);
  EXPECT_THROW(b.set_state(S::Free), std::logic_error);  // an event is still outstanding
  b.event_count = 0;
  b.set_state(S::Free);
  b.set_state(S::Unmapped);
  EXPECT_THROW(b.set_state(S::Allocated), std::logic_error);
  EXPECT_THROW(Block{S::Allocated}, std::logic_error);  // blocks are born Free or Unmapped
  // The message starts with the rule's ID (docs/invariants.md).
  try {
    Block{S::Allocated};
    ADD_FAILURE() << "no throw";
  } catch (const std::logic_error& e) {
    EXPECT_EQ(
        std::string(e.what()).rfind("[INV-STATE-1] model: block at 0x0: created in state ", 0), 0u)
        << e.what();
  }
}

}  // namespace
}  // namespace cachet::model::test

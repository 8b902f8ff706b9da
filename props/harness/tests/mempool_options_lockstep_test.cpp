// The lockstep (cachet/lockstep.h) over a MemPool's options (docs/pytorch-allocator.md §15.2):
// the model (model/src/mempool_options.cpp) and gpu/ policy:pytorch side by side, every op
// compared (pointers, errors, device calls, trace, the 122 stats, snapshots, invariants). The op
// vocabulary has no op for the options yet, so the test sets them on both sides directly after
// the ops that made the pools, then runs ops: a scenario with hand-checked values, and a fixed-seed
// random sequence.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "cachet/lockstep.h"

namespace cachet::lockstep {
namespace {

constexpr PoolId kPool0{0, 1};  // MemPool p0
constexpr PoolId kPool1{0, 2};  // MemPool p1
constexpr PoolId kPool2{0, 3};  // MemPool p2

void set_use_on_oom(PytorchLockstep& ls, PoolId id, bool on) {
  ls.sut().set_use_on_oom(id, on);
  ls.model().set_use_on_oom(id, on);
}
void set_no_split(PytorchLockstep& ls, PoolId id) {
  ls.sut().set_no_split(id);
  ls.model().set_no_split(id);
}

TEST(MemPoolOptionsLockstep, FallbackAndNoSplitAgree) {
  Options o;
  o.capacity = 40 * MiB;
  PytorchLockstep ls(o);
  ASSERT_EQ(ls.run(parse_ops("use_pool p0\nend_pool p0\n")), std::nullopt);
  set_use_on_oom(ls, kPool0, true);
  set_no_split(ls, kPool0);
  // In p0: 1 MiB takes a 2 MiB small segment whole (no_split); 18 MiB an 18 MiB segment.
  ASSERT_EQ(ls.run(parse_ops("use_pool p0\nalloc 1048576 s0\nalloc 18874368 s0\nend_pool p0\nfree h1\n")),
            std::nullopt);
  EXPECT_EQ(ls.sut().stats().allocated_bytes[0].current, static_cast<std::int64_t>(2 * MiB));
  // The default pool: 12 MiB takes a 12 MiB segment; 6 MiB more needs a 20 MiB segment, which
  // does not fit (32 MiB used): p0 lends its free 18 MiB block, whole (no_split).
  ASSERT_EQ(ls.run(parse_ops("alloc 12582912 s0\nalloc 6291456 s0\n")), std::nullopt);
  EXPECT_EQ(ls.last_sut().ptr, ls.address(1));
  EXPECT_EQ(ls.sut().stats().num_alloc_retries, 0);
  EXPECT_EQ(ls.sut().stats().allocated_bytes[0].current, static_cast<std::int64_t>(32 * MiB));
  ASSERT_EQ(ls.run(parse_ops("free h3\nfree h0\nfree h2\nrelease_pool p0\nempty_cache\n")), std::nullopt);
  EXPECT_EQ(ls.sut().stats().reserved_bytes[0].current, 0);
}

// A fixed-seed random walk over allocations in the default pool and in three MemPools (p0:
// use_on_oom and no_split, p1: use_on_oom, p2: no_split) under a small capacity, so that the
// fallback, the out-of-memory path and the no-split rule all come up.
TEST(MemPoolOptionsLockstep, RandomOpsAgree) {
  int fallbacks = 0;
  for (std::uint64_t seed : {1u, 2u, 3u, 4u, 5u, 6u}) {
    Options o;
    o.capacity = 64 * MiB;
    PytorchLockstep ls(o);
    std::vector<std::string> lines{"use_pool p0", "end_pool p0", "use_pool p1", "end_pool p1", "use_pool p2",
                                   "end_pool p2"};
    std::string done;
    for (const auto& l : lines) {
      ASSERT_EQ(ls.apply(*parse_op(l)), std::nullopt) << l;
      done += l + "\n";
    }
    set_use_on_oom(ls, kPool0, true);
    set_no_split(ls, kPool0);
    set_use_on_oom(ls, kPool1, true);
    set_no_split(ls, kPool2);
    std::uint64_t x = seed * 0x9E3779B97F4A7C15ull;
    auto next = [&](std::uint64_t n) {
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      return x % n;
    };
    const Bytes sizes[] = {512, 4096, 600 * KiB, 1 * MiB, 3 * MiB / 2, 3 * MiB, 7 * MiB, 12 * MiB, 20 * MiB};
    int in_use = -1;  // the MemPool entered, if any
    for (int step = 0; step < 400 && !ls.ended(); ++step) {
      const std::uint64_t r = next(100);
      std::string line;
      if (r < 50) {
        line = "alloc " + std::to_string(sizes[next(std::size(sizes))]) + " s0";
      } else if (r < 80) {
        const auto live = ls.live_handles();
        if (live.empty()) continue;
        line = "free h" + std::to_string(live[next(live.size())]);
      } else if (r < 95) {
        if (in_use >= 0) {
          line = "end_pool p" + std::to_string(in_use);
          in_use = -1;
        } else {
          in_use = static_cast<int>(next(3));
          line = "use_pool p" + std::to_string(in_use);
        }
      } else {
        line = "empty_cache";
      }
      const auto reserved = ls.sut().stats().reserved_bytes[0].current;
      const auto report = ls.apply(*parse_op(line));
      done += line + "\n";
      ASSERT_EQ(report, std::nullopt) << "seed " << seed << ", ops:\n" << done;
      // A default-pool allocation that took a block of a private pool: the fallback.
      if (in_use < 0 && ls.last_sut().kind == Outcome::Kind::Pointer && line.rfind("alloc", 0) == 0 &&
          ls.sut().stats().reserved_bytes[0].current == reserved) {
        for (const auto& seg : ls.sut().snapshot())
          for (std::uint64_t a = seg.address; const auto& b : seg.blocks) {
            if (a == ls.last_sut().ptr && !seg.pool_id.is_default()) ++fallbacks;
            a += b.size;
          }
      }
    }
  }
  EXPECT_GT(fallbacks, 0) << "no use_on_oom fallback came up";
}

}  // namespace
}  // namespace cachet::lockstep

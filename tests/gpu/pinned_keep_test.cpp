// PinnedKeep (cachet/gpu/pinned_keep.h): the pinned host buffers the CUDA VMM backend keeps between
// sleeps. What is held, in use and kept, never exceeds the most that was in use at once; a
// repeated backup set is served from kept buffers with no new pin; release_kept gives back the
// kept ones only. Buffers are fake addresses: PinnedKeep never touches them.
#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <random>
#include <vector>

#include "cachet/gpu/pinned_keep.h"

namespace cachet::test {
namespace {

using gpu::PinnedKeep;

// What a backend does with PinnedKeep (cuda_vmm_backend.cpp's host_alloc), pins counted.
struct Backend {
  PinnedKeep keep;
  std::map<void*, Bytes> pinned;  // what is pinned now
  std::uintptr_t next = 0x1000;
  int pins = 0;

  void* alloc(Bytes n) {
    if (void* h = keep.take(n)) return h;
    for (void* h : keep.make_room(n)) pinned.erase(h);
    void* h = reinterpret_cast<void*>(next);
    next += 0x1000;
    pinned[h] = n;
    keep.pinned(h, n);
    ++pins;
    return h;
  }
  Bytes pinned_bytes() const {
    Bytes t = 0;
    for (const auto& [h, n] : pinned) t += n;
    return t;
  }
};

TEST(PinnedKeep, ARepeatedBackupSetPinsOnce) {
  Backend b;
  for (int cycle = 0; cycle < 5; ++cycle) {
    std::vector<void*> in_use;
    for (Bytes n : {3 * GiB, 1 * GiB, 2 * GiB, 1 * GiB}) in_use.push_back(b.alloc(n));
    EXPECT_EQ(b.keep.in_use_bytes(), 7 * GiB);
    for (void* h : in_use) EXPECT_TRUE(b.keep.give(h));
    EXPECT_EQ(b.keep.kept_bytes(), 7 * GiB);
    EXPECT_EQ(b.pins, 4);  // the first cycle's
    EXPECT_EQ(b.pinned_bytes(), 7 * GiB);
  }
}

// Several tags backed up at once count together; a larger backup afterwards replaces kept buffers
// instead of adding to them.
TEST(PinnedKeep, SeveralTagsThenALargerBackupStayWithinTheLargestSet) {
  Backend b;
  void* x = b.alloc(1 * GiB);
  void* y = b.alloc(1 * GiB);
  b.keep.give(x);
  b.keep.give(y);
  EXPECT_EQ(b.keep.peak_bytes(), 2 * GiB);
  void* z = b.alloc(3 * GiB);  // no kept buffer is large enough: both go first
  EXPECT_EQ(b.pinned_bytes(), 3 * GiB);
  EXPECT_EQ(b.keep.kept_bytes(), 0u);
  b.keep.give(z);
  // The two tags again: the 3 GiB buffer serves one, a new 1 GiB buffer the other (4 GiB were in
  // use at once then).
  x = b.alloc(1 * GiB);
  y = b.alloc(1 * GiB);
  EXPECT_EQ(b.pinned_bytes(), 4 * GiB);
  EXPECT_EQ(b.keep.peak_bytes(), 4 * GiB);
  b.keep.give(x);
  b.keep.give(y);
  EXPECT_EQ(b.keep.held_bytes(), 4 * GiB);
}

// A backup that grows a little every cycle replaces its buffer: one buffer held, never a pile.
TEST(PinnedKeep, AGrowingBackupKeepsOneBuffer) {
  Backend b;
  for (int cycle = 0; cycle < 50; ++cycle) {
    const Bytes n = 1 * GiB + static_cast<Bytes>(cycle) * 4096;
    void* h = b.alloc(n);
    EXPECT_EQ(b.pinned_bytes(), n);
    b.keep.give(h);
    EXPECT_EQ(b.keep.kept_bytes(), n);
  }
  EXPECT_EQ(b.pins, 50);
}

TEST(PinnedKeep, ReleaseKeptGivesBackOnlyKeptOnesAndRestartsThePeak) {
  Backend b;
  void* x = b.alloc(2 * GiB);
  void* y = b.alloc(1 * GiB);
  b.keep.give(x);
  auto out = b.keep.release_kept();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].first, x);
  EXPECT_EQ(out[0].second, 2 * GiB);
  EXPECT_EQ(b.keep.in_use_bytes(), 1 * GiB);
  EXPECT_EQ(b.keep.peak_bytes(), 1 * GiB);
  EXPECT_FALSE(b.keep.give(x));  // no longer a buffer of the keep
  EXPECT_TRUE(b.keep.give(y));
  EXPECT_FALSE(b.keep.give(y));  // already kept
  EXPECT_EQ(b.keep.all(), std::vector<void*>{y});
  EXPECT_TRUE(b.keep.release_kept().size() == 1 && b.keep.held_bytes() == 0);
}

// Random backup sets (1 to 4 tags of 1 to 64 units, as several sleeps and wakes would ask): after
// every step what is held (and so what is kept) is at most the most ever in use at once, and the
// pinned memory is exactly what the keep holds.
TEST(PinnedKeep, RandomSetsNeverHoldMoreThanTheMostInUseAtOnce) {
  for (std::uint64_t seed = 1; seed <= 20; ++seed) {
    std::mt19937_64 rng(seed);
    Backend b;
    Bytes most_in_use = 0;
    std::vector<void*> in_use;
    for (int step = 0; step < 200; ++step) {
      if (in_use.empty() || rng() % 3 != 0) {
        const int tags = 1 + static_cast<int>(rng() % 4);
        for (int t = 0; t < tags; ++t) in_use.push_back(b.alloc((1 + rng() % 64) * MiB));
      } else {
        for (void* h : in_use) ASSERT_TRUE(b.keep.give(h));
        in_use.clear();
      }
      most_in_use = std::max(most_in_use, b.keep.in_use_bytes());
      ASSERT_EQ(b.keep.peak_bytes(), most_in_use);
      ASSERT_LE(b.keep.held_bytes(), most_in_use) << "seed " << seed << " step " << step;
      ASSERT_EQ(b.pinned_bytes(), b.keep.held_bytes());
    }
  }
}

}  // namespace
}  // namespace cachet::test

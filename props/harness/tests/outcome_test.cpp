// The lockstep's out-of-memory outcomes (cachet/lockstep.h): an OutOfMemory made from facts is
// caught as its facts, its text formatted only by text(); same_text() says two outcomes read the
// same exactly when their texts are equal.
#include <gtest/gtest.h>

#include <string>

#include "cachet/lockstep.h"
#include "cachet/summary.h"

namespace {

using cachet::GiB;
using cachet::MiB;
using cachet::OomFacts;
using cachet::lockstep::Outcome;

OomFacts facts() {
  OomFacts f;
  f.alloc_size = 20 * MiB;
  f.device_total = 80 * GiB;
  f.device_free = 10 * MiB;
  f.reserved = 2 * MiB;
  return f;
}

const std::string kText =
    "CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of 80.00 GiB of which 10.00 "
    "MiB is free. Of the allocated memory 0 bytes is allocated by PyTorch, and 2.00 MiB is reserved by PyTorch "
    "but unallocated. If reserved but unallocated memory is large try setting "
    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory "
    "Management  (https://docs.pytorch.org/docs/stable/notes/cuda.html"
    "#optimizing-memory-usage-with-pytorch-cuda-alloc-conf)";

TEST(LockstepOutcome, OutOfMemoryFactsReadAsTheirText) {
  const Outcome a{Outcome::Kind::OutOfMemory, 0, {}, facts()};
  EXPECT_EQ(cachet::lockstep::text(a), kText);
  EXPECT_EQ(cachet::lockstep::show(a), "OutOfMemory: " + kText);
  const Outcome t{Outcome::Kind::OutOfMemory, 0, kText, std::nullopt};
  EXPECT_EQ(cachet::lockstep::text(t), kText);
}

TEST(LockstepOutcome, SameTextComparesTheTexts) {
  const Outcome a{Outcome::Kind::OutOfMemory, 0, {}, facts()};
  EXPECT_TRUE(cachet::lockstep::same_text(a, a));
  // Facts that differ but read the same (10 MiB + 1 byte free prints "10.00 MiB").
  OomFacts g = facts();
  g.device_free = 10 * MiB + 1;
  EXPECT_TRUE(cachet::lockstep::same_text(a, Outcome{Outcome::Kind::OutOfMemory, 0, {}, g}));
  // Facts that read otherwise.
  g.alloc_size = 22 * MiB;
  EXPECT_FALSE(cachet::lockstep::same_text(a, Outcome{Outcome::Kind::OutOfMemory, 0, {}, g}));
  // A text beside facts: compared as texts.
  EXPECT_TRUE(cachet::lockstep::same_text(a, Outcome{Outcome::Kind::OutOfMemory, 0, kText, std::nullopt}));
  EXPECT_FALSE(cachet::lockstep::same_text(a, Outcome{Outcome::Kind::OutOfMemory, 0, "CUDA error: out of memory",
                                                      std::nullopt}));
  EXPECT_TRUE(cachet::lockstep::same_text(Outcome{Outcome::Kind::UsageError, 0, "x", std::nullopt},
                                          Outcome{Outcome::Kind::UsageError, 0, "x", std::nullopt}));
}

}  // namespace

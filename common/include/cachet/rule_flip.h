// cachet/rule_flip.h: rule flips (project issue 23, docs/verification.md). A rule flip is one rule
// of docs/pytorch-allocator.md changed the SAME way in model/ and gpu/ (policy:pytorch), so that
// the two still agree with each other and only a recording of PyTorch can tell: the conformance
// recordings (tests/data) must kill every flip (ctest label `flips`, tests/flips/).
//
// Unlike the one-sided mutants (gpu/src/mutant.h: one build per mutant), every flip is in one
// build: the variant libraries cachet_model_flips and cachet_gpu_flips (and the `cachet-flips`
// command over them) are compiled with CACHET_RULE_FLIPS=1 and read the flip to apply from the
// environment, `CACHET_RULE_FLIP=<name>` (unset or empty: none, the real allocator). Everything
// else (cachet_model, cachet_gpu, the `cachet` command) is compiled without it: there flipped() is
// a constant false and the production hot path pays nothing.
//
// This header names the flips (vocabulary); what each flip changes is written at its one place
// in model/ and its one place in gpu/, each at a line that reads `flipped(RuleFlip::X)`. Include it
// only from model/ and gpu/ (gpu/src/policy_pytorch/policy.h too): a library is compiled all one
// way, and no binary links a flip build with a production one (flipped() is defined by
// CACHET_RULE_FLIPS: one definition per binary).
#pragma once

#include <span>
#include <string_view>

namespace cachet {

// X(enumerator, name, section of docs/pytorch-allocator.md, what the flip does instead of the rule).
#define CACHET_RULE_FLIP_LIST(X)                                                                        \
  X(Round1024, "round_1024", "1.2", "requests are rounded up to a multiple of 1,024 B, not 512 B")       \
  X(DivisionsOneRounds, "divisions_one_rounds", "1.2",                                                  \
    "a roundup_power2_divisions value of 1 rounds to the next power of two (not plain rounding)")       \
  X(DivisionsInclusive, "divisions_inclusive", "13.7",                                                  \
    "power-of-two rounding applies from size >= 512 x divisions, not >")                                \
  X(DivisionsEntryShifted, "divisions_entry_shifted", "1.2",                                            \
    "the divisions entry of a size is log2(size) - 21 (one entry lower), not log2(size) - 20")          \
  X(SmallBelow1MiB, "small_below_1mib", "1.3",                                                          \
    "a rounded size of exactly 1 MiB goes to the large pool (small pool: below 1 MiB)")                 \
  X(MidSegmentTo10MiB, "mid_segment_to_10mib", "1.3",                                                   \
    "a rounded size of exactly 10 MiB gets the large buffer (20 MiB), not a 10 MiB segment")            \
  X(SegmentRound1MiB, "segment_round_1mib", "1.3",                                                      \
    "segments for requests of 10 MiB or more are rounded to 1 MiB, not 2 MiB")                          \
  X(SmallSegment4MiB, "small_segment_4mib", "1.3", "small-pool segments are 4 MiB, not 2 MiB")          \
  X(BestFitHighestAddress, "best_fit_highest_address", "2.2",                                           \
    "among free blocks of equal size the highest address is taken, not the lowest")                     \
  X(BestFitAnyStream, "best_fit_any_stream", "2.1",                                                     \
    "a free block is reused by any stream (best fit over all streams), not only by its own")            \
  X(OversizeForAll, "oversize_for_all", "2.2",                                                          \
    "a request below max_split_size may take a cached oversize block")                                  \
  X(NonSplitRounding1MiB, "non_split_rounding_1mib", "2.2",                                             \
    "an oversize request takes a cached block only below request + 1 MiB (the source's comment), "      \
    "not request + max_non_split_rounding")                                                             \
  X(NonSplitRoundingInclusive, "non_split_rounding_inclusive", "13.7",                                  \
    "an oversize request takes a cached block up to request + max_non_split_rounding inclusive")        \
  X(ExpandableFirstFit, "expandable_first_fit", "2.2",                                                  \
    "best fit takes the first expandable block as it is, without looking for one that leaves less "     \
    "to map")                                                                                           \
  X(LargeSplitRestAtLeast1MiB, "large_split_rest_at_least_1mib", "2.3",                                 \
    "a large-pool block is split when the rest is 1 MiB or more, not more than 1 MiB")                  \
  X(SmallSplitRestAbove512, "small_split_rest_above_512", "2.3",                                        \
    "a small-pool block is split when the rest is more than 512 B, not 512 B or more")                  \
  X(OversizeSplits, "oversize_splits", "2.3",                                                           \
    "a large-pool block is split for a request of max_split_size or more too")                          \
  X(ExpandableSplitsLikeLarge, "expandable_splits_like_large", "2.3",                                   \
    "blocks of large expandable segments split like the large pool (rest more than 1 MiB)")             \
  X(SplitRestForgetsRequested, "split_rest_forgets_requested", "13.1",                                  \
    "the rest of a split starts with requested_size 0 instead of keeping the stale value")              \
  X(MergeKeepsNeighbourRequested, "merge_keeps_neighbour_requested", "13.1",                            \
    "a block merged with its free previous neighbour keeps the neighbour's requested_size, not the "    \
    "freed block's")                                                                                    \
  X(InactiveSplitTwoSteps, "inactive_split_two_steps", "13.2",                                          \
    "a free lowers inactive_split for the merged neighbours and raises it for the result in two "       \
    "steps, not once by the net amount")                                                                \
  X(InactiveSplitCountsExpandable, "inactive_split_counts_expandable", "7",                             \
    "inactive_split and inactive_split_bytes count blocks of expandable segments too")                  \
  X(RequestedBytesRounded, "requested_bytes_rounded", "5.3",                                            \
    "requested_bytes counts the rounded block size, not the request")                                   \
  X(OversizeAboveMaxSplit, "oversize_above_max_split", "5.3",                                           \
    "oversize_allocations and oversize_segments count sizes above max_split_size, not from it")         \
  X(AllocBeforeGc, "alloc_before_gc", "3.1",                                                            \
    "malloc tries a new segment before garbage collection, not after")                                  \
  X(NoReleaseAvailable, "no_release_available", "3.1",                                                  \
    "malloc skips release_available_cached_blocks and goes straight to the last retry")                 \
  X(RetryCountedIfAllowed, "retry_counted_if_allowed", "13.6",                                          \
    "the last retry is counted only when the cap lets it reach the device")                             \
  X(CapExclusive, "cap_exclusive", "13.4",                                                              \
    "a new segment that brings reserved memory to exactly the cap is refused")                          \
  X(ReleaseAvailableSearchesRequest, "release_available_searches_request", "13.7",                      \
    "release_available_cached_blocks searches for a block of the request's size, not of "               \
    "max(request, max_split_size)")                                                                     \
  X(ReleaseAvailableSmallestFirst, "release_available_smallest_first", "3.3",                           \
    "release_available_cached_blocks releases oversize blocks smallest first, not largest first")       \
  X(EmptyCacheSmallFirst, "empty_cache_small_first", "3.4",                                             \
    "release_cached_blocks releases the default small pool before the large pool")                      \
  X(EmptyCacheSyncOnlyWithEvents, "empty_cache_sync_only_with_events", "3.4",                           \
    "num_sync_all_streams counts only a synchronization that had events to wait for")                   \
  X(GcThresholdStrict, "gc_threshold_strict", "13.7",                                                   \
    "garbage collection runs when reserved reaches the limit (returns only below it), not above it")    \
  X(GcStopsAtGoal, "gc_stops_at_goal", "3.5",                                                         \
    "garbage collection stops in the middle of a round once it has released enough")                    \
  X(GcOlderThanAverage, "gc_older_than_average", "3.5",                                                 \
    "garbage collection releases blocks strictly older than the average age, not at least as old")      \
  X(GcAgeKeptOnSplit, "gc_age_kept_on_split", "13.7",                                                   \
    "the rest of a split keeps its GC age base instead of restarting it")                               \
  X(ExpandableSmallPageLarge, "expandable_small_page_large", "7",                                      \
    "expandable segments of the small pool map pages of the large buffer (20 MiB), not 2 MiB")         \
  X(OomTraceSegmentSize, "oom_trace_segment_size", "3.7",                                               \
    "the trace's oom row stores the segment size, not the rounded request")                             \
  X(GetPoolOldest, "get_pool_oldest", "14.2",                                                           \
    "get_pool takes the oldest active private pool whose filter takes the stream, not the newest")      \
  X(PrivateReleaseLargeFirst, "private_release_large_first", "14.5",                                    \
    "a freeable private pool releases its large pool before its small pool")                            \
  X(FreeableInIdOrder, "freeable_in_id_order", "14.5",                                                  \
    "freeable private pools are released in the order of their ids, not the hash map's slot order")     \
  X(EmptyCacheIgnoresActivePools, "empty_cache_ignores_active_pools", "14.6",                           \
    "empty_cache releases the default pools even while a capture or use_mem_pool is under way")         \
  X(RetryInsidePool, "retry_inside_pool", "14.6",                                                       \
    "the last retry (release_cached_blocks, then a new segment) runs while a use_mem_pool is active")

enum class RuleFlip {
  None,
#define CACHET_RULE_FLIP_ENUM(e, name, section, what) e,
  CACHET_RULE_FLIP_LIST(CACHET_RULE_FLIP_ENUM)
#undef CACHET_RULE_FLIP_ENUM
};

struct RuleFlipInfo {
  RuleFlip flip;
  std::string_view name;     // CACHET_RULE_FLIP=<name>
  std::string_view section;  // of docs/pytorch-allocator.md
  std::string_view what;     // what the flip does instead of PyTorch's rule
};

// Every flip, in the list's order.
std::span<const RuleFlipInfo> rule_flips();

// The flip CACHET_RULE_FLIP names, read once; RuleFlip::None when unset or empty. An unknown name
// throws UsageError listing the known ones.
RuleFlip active_rule_flip();

// (common/src/rule_flip.cpp, built once for both kinds of build, defines no flipped().)
#if defined(CACHET_RULE_FLIP_NAMES_ONLY)
#elif defined(CACHET_RULE_FLIPS) && CACHET_RULE_FLIPS
inline bool flipped(RuleFlip f) { return active_rule_flip() == f; }
#else
constexpr bool flipped(RuleFlip) { return false; }
#endif

}  // namespace cachet

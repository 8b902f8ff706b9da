// Planted bugs for mutation testing (project issue 5). Each mutant is one decision of the
// allocator, made at one line that reads `if (mutant(N))` or `mutant(N) ? a : b`. The list, with
// what each breaks, is in gpu/README.md.
//
// Two ways to select one:
//   - cachet_gpu (and the fuzz tree's planted-bug library) is compiled with CACHET_MUTANT=N, a
//     constant: 0 (the default) is the real allocator, and every mutant() is false at compile
//     time, so the real library pays nothing for the mutants;
//   - cachet_gpu_mutants, the one library every mutant test links, is compiled with
//     CACHET_MUTANT_RUNTIME: the environment variable CACHET_MUTANT=N picks the mutant when the
//     program first asks (unset or 0: none). One build serves every mutant.
//
// Only the policies' mutated sources include this header: src/policy_pytorch/ (malloc.cpp,
// free.cpp, release.cpp: mutants 1-16, 24-26; sleep.cpp: 29, 30) and src/policy_cachet/ (malloc.cpp,
// pages.cpp, free.cpp, sleep.cpp: 17-23, 27, 28, 30). Only those translation units are compiled per
// selection (gpu/CMakeLists.txt: CACHET_GPU_MUTATED_SOURCES; the other sources are built once and
// shared by both libraries). Never include it from a header or from a checker
// (src/policy_pytorch/invariants.cpp, src/policy_cachet/check.cpp: built once, so the checker stays
// the real one), and an inline function that calls mutant() in two TUs built with different
// selections would break the one-definition rule.
#pragma once

#ifndef CACHET_MUTANT
#define CACHET_MUTANT 0
#endif

#ifdef CACHET_MUTANT_RUNTIME
#include <cstdio>
#include <cstdlib>
#include <cstring>
#endif

namespace cachet::gpu::detail {

inline constexpr int kLastMutant = 30;  // the highest mutant number (the list below)

#ifdef CACHET_MUTANT_RUNTIME
// The mutant CACHET_MUTANT names, read once. A value that is not a mutant's number is refused
// with a message (exit 2): a typo must not run the real allocator where a planted bug was meant.
inline int active_mutant() {
  static const int m = [] {
    const char* v = std::getenv("CACHET_MUTANT");
    if (v == nullptr || *v == '\0') return 0;
    char* end = nullptr;
    const long n = std::strtol(v, &end, 10);
    if (*end != '\0' || n < 0 || n > kLastMutant) {
      std::fprintf(stderr, "CACHET_MUTANT=%s: expected a mutant number from 1 to %d (gpu/src/mutant.h), or 0 for none\n",
                   v, kLastMutant);
      std::exit(2);
    }
    return static_cast<int>(n);
  }();
  return m;
}
inline bool mutant(int n) { return active_mutant() == n; }
#else
constexpr bool mutant(int n) { return CACHET_MUTANT == n; }
#endif

// The mutants (numbers are stable; README lists them).
inline constexpr int kMutantSkipMergeNext = 1;       // free_block never merges with the next block
inline constexpr int kMutantSplitBelowLimit = 2;     // large pool splits with remaining >= 512
inline constexpr int kMutantRound256 = 3;            // sizes rounded to 256 B instead of 512 B
inline constexpr int kMutantForgetRequested = 4;     // requested_bytes not decreased at free
inline constexpr int kMutantCrossStreamReuse = 5;    // a free block is reused by another stream
inline constexpr int kMutantIgnorePendingEvent = 6;  // free ignores recorded stream uses
inline constexpr int kMutantOversizeToSmall = 7;     // normal request may take an oversize block
inline constexpr int kMutantSplitRemainderGap = 8;   // split remainder starts 512 B past the block
inline constexpr int kMutantIgnoreCap = 9;           // alloc_block ignores the memory cap
inline constexpr int kMutantFractionOneKeepsCap = 10;  // set_memory_fraction(1.0) keeps the old cap
inline constexpr int kMutantLinkAfterNoBackLink = 11;  // link_after forgets next->prev
inline constexpr int kMutantDoubleCountEvent = 12;   // free counts each stream-use event twice
inline constexpr int kMutantRequestedIsSegment = 13;  // requested_size records the segment size
inline constexpr int kMutantReleaseKeepsReserved = 14;  // release_block keeps the bytes in reserved
inline constexpr int kMutantMergeKeepsTreePlace = 15;  // a block grown by a merge keeps its tree place
inline constexpr int kMutantSegmentSizeShort = 16;   // a cudaMalloc segment records 512 B too few
// The cachet policy (src/policy_cachet/; never at invariants() or what it calls).
inline constexpr int kMutantCachetLowEndSmall = 17;   // R2: the hot path takes the low end for small requests
inline constexpr int kMutantCachetMergeAcrossStreams = 18;  // merge_free joins free blocks of different streams
inline constexpr int kMutantCachetSlackEighth = 19;   // R4: alloc_slow's budget is T + T/8, not T + T/64
inline constexpr int kMutantCachetUnmapKeepsReserved = 20;  // unmap_range does not lower reserved_bytes
inline constexpr int kMutantCachetIgnoreCap = 21;     // alloc_slow ignores the memory cap
inline constexpr int kMutantCachetPendingIgnoresEvents = 22;  // process_events frees pending blocks at once
inline constexpr int kMutantCachetRetrySkipsBestFit = 23;  // R7: the retry goes to the windows without R2
// The pytorch policy again (src/policy_pytorch/release.cpp).
inline constexpr int kMutantGcLargestFirst = 24;      // GC releases each round's blocks largest first
// policy:pytorch's private pools (issue 16; malloc.cpp, release.cpp).
inline constexpr int kMutantPrivateBlockToDefault = 25;  // a default-pool request takes a private pool's free block
inline constexpr int kMutantReleaseFreesLiveBlock = 26;  // releasing a pool frees its blocks still allocated
// policy:cachet's private pools (src/policy_cachet/malloc.cpp, free.cpp; R10, R11).
inline constexpr int kMutantCachetPoolBlockToDefault = 27;  // R2: a default request with no fit takes a private pool's free block
inline constexpr int kMutantCachetFreeStaysInReleasedPool = 28;  // a block freed after its pool's release stays in that pool
// Sleep and wake (issue 24, docs/sleep-wake.md section 8; src/policy_pytorch/sleep.cpp).
inline constexpr int kMutantSleepingBlockFound = 29;  // an allocation placed in a sleeping range (its free blocks stay findable)
inline constexpr int kMutantBackupNotRestored = 30;   // a backup not restored (wake maps but skips the copy back)
static_assert(kMutantBackupNotRestored == kLastMutant, "a new mutant raises kLastMutant");

}  // namespace cachet::gpu::detail

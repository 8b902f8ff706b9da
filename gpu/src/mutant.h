// Planted bugs for mutation testing (project issue 5). Each mutant is one decision of the
// allocator, made at one line that reads `if constexpr (mutant(N))` or `mutant(N) ? a : b`.
// A build selects one with the compile definition CACHET_MUTANT=N (0 = none, the real
// allocator). The list, with what each breaks, is in gpu/README.md.
#pragma once

#ifndef CACHET_MUTANT
#define CACHET_MUTANT 0
#endif

namespace cachet::gpu::detail {

constexpr bool mutant(int n) { return CACHET_MUTANT == n; }

// The mutants (numbers are stable; README lists them).
inline constexpr int kMutantSkipMergeNext = 1;       // free_block never merges with the next block
inline constexpr int kMutantSplitBelowLimit = 2;     // large pool splits with remaining >= 512
inline constexpr int kMutantRound256 = 3;            // sizes rounded to 256 B instead of 512 B
inline constexpr int kMutantForgetRequested = 4;     // requested_bytes not decreased at free
inline constexpr int kMutantCrossStreamReuse = 5;    // a free block is reused by another stream
inline constexpr int kMutantIgnorePendingEvent = 6;  // free ignores recorded stream uses
inline constexpr int kMutantOversizeToSmall = 7;     // normal request may take an oversize block

}  // namespace cachet::gpu::detail

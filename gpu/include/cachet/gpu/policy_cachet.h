// cachet/gpu/policy_cachet.h: the `cachet` policy (policy:cachet in CACHET_ALLOC_CONF, issue 9):
// a caching allocator that reserves almost nothing beyond what the program holds.
//
// ---------------------------------------------------------------------------------------------
// Why (measured on the oracle traces, bench/RESULTS.md "cachet policy"):
//   * Rounding is not the waste. Rounding every request up to 512 B changes the peak of live
//     bytes by < 0.001% on gpt2_train and resnet50_train (13,594,206,920 -> 13,594,220,032 B;
//     5,830,299,792 -> 5,830,342,656 B), yet PyTorch reserves 1.124x / 1.206x the peak
//     requested bytes there.
//   * The waste is segment granularity and where free bytes sit: whole cudaMalloc segments
//     (2 MiB small, 20 MiB for 1..10 MiB requests, exact for larger ones) that cannot give
//     their free tails to another size class, blocks of >= max_split_size that are never split,
//     and per-stream pools (a free block is only ever reused by its own stream). Expandable
//     segments fix the granularity (1.017-1.214) but still keep one segment per stream and pool
//     and never give back a page in the middle of a segment while the program runs.
//
// Design, as exact rules (R1-R12). The reference model (model/include/cachet/model/
// cachet_policy.h) implements the same rules with plain structures; the two must hand out the
// same pointers and stats for every operation sequence.
//   R1 Space. One address-space reservation per device, made at the first allocation that does
//      not fit a mapped free block: kCachetReserveFactor x the device's total memory, rounded up
//      to 2 MiB. It is tiled by blocks in address order. A block is live (allocated, or pending:
//      freed with stream uses whose events have not completed), mapped free (every page it
//      touches is mapped; it belongs to one stream), or unmapped (free, page aligned, no stream).
//      Adjacent mapped free blocks of the same stream are always merged, as are adjacent
//      unmapped blocks. Sizes: the request rounded up to 512 B (kCachetAlign), no other rounding.
//   R2 Hot path. allocate(n, s): among the mapped free blocks of stream s, the best fit (the
//      smallest size >= the rounded size; ties: the lowest address). A small request (rounded
//      size <= 1 MiB, PyTorch's small-pool limit) takes the high end of that block, a large one
//      its low end; the rest stays free with stream s. No device call.
//   R3 Windows. Otherwise (slow path), each unmapped block u, in address order, forms a window:
//      u extended by its left neighbour l and right neighbour r when those are mapped free
//      blocks of stream s. A window smaller than the request is skipped. Candidates: left
//      aligned at the window's start, costing the pages of [u.start, min(u.end,
//      page_ceil(start + size))); and, when r exists, right aligned at the window's end,
//      costing the pages of [max(u.start, page_floor(end - size)), u.end). The first candidate
//      (in that order) with the fewest new pages wins; the scan stops at a 1-page candidate.
//   R4 Budget. Let touched = pages touched by live blocks, T = the high-water mark of touched
//      counting the new block, budget(T) = T + floor(T / kCachetSlackDivisor). If mapped pages
//      + new pages > budget(T), whole free pages elsewhere are unmapped first (R6), as many as
//      the excess (as many as there are, if fewer). Below the budget pages are mapped without
//      unmapping others, so that a training step finds the pages the previous step moved.
//   R5 Map. The new pages [max(u.start, page_floor(at)), min(u.end, page_ceil(at + size))) are
//      mapped in one call as a free block of stream s, merged with s's free neighbours, and the
//      block is carved at `at` from the merged block (the parts before and after stay free).
//   R6 Unmapping. Whole free pages are the pages lying inside one mapped free block, outside
//      the new block's pages [page_floor(at), page_ceil(at + size)). Blocks are taken by their
//      number of whole free pages, largest first (ties: lowest address); from each, the highest
//      pages, one unmap call per block; the unmapped range becomes an unmapped block.
//   R7 Cap (set_memory_fraction, per_process_memory_fraction) and retry. An allocation maps
//      pages over the cap only after unmapping as many whole free pages (R6); if there are not
//      enough, or no window fits, or the device refuses: once per allocation, count
//      num_alloc_retries, wait for pending events (num_sync_all_streams), run R2 again (a block
//      the wait freed may hold the request: served with no device call), else unmap every whole
//      free page and retry R3; then OutOfMemory (num_ooms). Lowering the cap below the mapped
//      bytes unmaps whole free pages (R6 order) down to the cap, as many as there are; while
//      mapped bytes stay above the cap, every free(), event completion and empty_cache() ends
//      the same way (trim to the cap).
//   R8 Free. free(p) without stream uses: the block becomes mapped free of its allocation
//      stream and merges with that stream's free neighbours. With stream uses, it is pending
//      until an event recorded on each use stream at free() has completed (checked at the next
//      allocation, as PyTorch's process_events). Another stream gets a freed block's memory only
//      after its pages were unmapped (R6) and mapped again (R5).
//   R9 empty_cache(): wait for pending events, then unmap every whole free page (R6 order). The
//      reservation is kept until the allocator is destroyed.
//   R10 Private pools (docs/pytorch-allocator.md §14). Every block belongs to a pool: the
//      default pool or a private pool, named by its PoolId; an unmapped block to none. An
//      allocation goes to the newest active pool whose route takes its stream (§14.2) if that
//      pool still has a user, else to the default pool. A free block belongs to a stream and a
//      pool: R2's best fit, R3's window neighbours and R1's merging take only blocks of the
//      request's (or the block's) stream and pool, and R5's new pages belong to the allocating
//      pool. A private pool with a user (use count > 0) keeps every byte it was given: its free
//      blocks hold no whole free page for R4, R6, R7 or R9 (they are never unmapped), so a block
//      allocated in a private pool is never handed to another pool before that pool is released.
//   R11 Use counts and release. create_or_incref_pool, begin_allocate_to_pool,
//      end_allocate_to_pool, release_pool and pool_use_count count users and refuse bad use
//      (UsageError, nothing changed) as PyTorch does (§14.2, §14.4). When release_pool takes the
//      count to 0, the pool's free blocks join the default pool at once (same stream, merged
//      with its free neighbours there), whole free pages are unmapped (R6 order) down to
//      budget(T) (the pool's pages may have stood beyond it; not while a pool is active: R12), and
//      each of its live blocks joins the default pool when it is freed (when its events
//      completed). A pool with no user and no live block is forgotten; until then it cannot
//      be made again (UsageError, as PyTorch's freeable pool). empty_cache(id): the default id is
//      empty_cache(); a pool with a user keeps its memory (nothing happens); a released or
//      unknown pool's free memory is in the default pool, so it is empty_cache() (R9).
//   R12 While a pool is active (a use_mem_pool or a CUDA graph capture, §14.7) no event is
//      recorded, queried or waited for: an allocation does not process events (R8), a free with
//      stream uses waits, deferred without events, until no pool is active (its events are then
//      recorded at the next allocation or synchronizing call, on every stream it was used on),
//      and R7's retry and R9 wait for nothing. No page is unmapped then either: a capture's
//      driver forbids it (§14.8), and the plug-in cannot tell a capture from a use_mem_pool, so
//      every active pool counts as one. R4 maps without unmapping, and R7's retry, the trims to
//      the cap and R9 unmap nothing; when the last active pool ends, whole free pages are
//      unmapped (R6 order) down to budget(T) (R4) and to the cap (R7).
//
// Why these choices (measured with bench/policy_waste.py, bench/RESULTS.md):
//   * Best fit over exact 512 B sizes in one address range with 2 MiB pages removes the three
//     sources of PyTorch's waste: segment granularity, blocks never split, per-stream segments.
//   * R2's small-high / large-low split keeps small blocks from scattering over the pages large
//     blocks free (the random 1 B..1 MiB `small` sequence: 10 pages -> 9 pages).
//   * R4's slack (1/64 of the touched peak) is what makes training steady: with none, each step
//     moved ~40 pages (gpt2_train: 28 calls in the second half, resnet50_train: 31); with 1/64,
//     none.
//
// Promises. Two are invariants of the state (docs/invariants.md), checked by
// CachetPolicy::invariants() after every operation in validate mode and in tests, and by the
// reference model in lockstep; the stream-reuse and hot-path promises are about the sequence of
// operations and are checked from outside (tests/policy_cachet, fuzz_cachet_policy).
//   [INV-BUDGET-1] mapped pages <= budget(T) (R4), plus pages that are free but split between free blocks
//        of different streams (which R6 cannot unmap). Hence peak reserved <= (1 + 1/64) x the
//        peak of pages touched by live blocks.
//   Stream reuse: a block freed on stream s without stream uses is handed to stream s only, until the
//        page holding it is unmapped; a block with stream uses is handed to nobody until the
//        events recorded at its free() have completed.
//   [INV-CAP-1] reserved <= the memory cap after every operation, except after the cap was lowered
//        below the pages live blocks touch: then no whole free page stays mapped while
//        reserved is above the cap. An allocation fails only when, after waiting for pending
//        events, no mapped free block of its stream holds it and no window fits with its new
//        pages under the cap once every whole free page was unmapped.
//   Hot path: a request that fits a mapped free block of its stream is served from it with no device
//        call.
//   [INV-PRIV-3], [INV-PRIV-4] private pools (R10, R11): a free block belongs to the default pool
//        or to a pool with a user; each private pool's bytes are the blocks carrying its id.
//        [INV-BUDGET-1] and [INV-CAP-1] are suspended while a pool is active (R12).
//
// Stats, snapshot and trace keep PyTorch's names: reserved_bytes = mapped bytes (large_pool),
// segment = maximal runs of mapped pages (each an expandable "large" segment in the snapshot),
// num_device_alloc / num_device_free = map / unmap calls, allocation / active / allocated /
// requested bytes per pool by size (<= 1 MiB: small_pool), inactive_split = 0 (as expandable
// segments report it), trace events segment_map / segment_unmap for page mappings.
#pragma once

#include "cachet/types.h"

namespace cachet::gpu {

inline constexpr Bytes kCachetPageSize = 2 * MiB;  // the mapping granularity
inline constexpr Bytes kCachetAlign = 512;         // block sizes and addresses
// [INV-BUDGET-1] slack: mapped pages may exceed the touched high-water mark by 1/kCachetSlackDivisor.
inline constexpr Bytes kCachetSlackDivisor = 64;
// The address-space reservation, in multiples of the device's total memory.
inline constexpr Bytes kCachetReserveFactor = 2;

}  // namespace cachet::gpu

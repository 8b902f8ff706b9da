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
// Design:
//   * One address-space reservation per device (2x the device memory, 2 MiB aligned), tiled by
//     blocks in address order. Every block size is a multiple of 512 B (kCachetAlign; PyTorch's
//     alignment), with no other rounding and no size classes: a free block is always split to
//     the exact rounded size.
//   * Physical memory is mapped in 2 MiB pages (kCachetPageSize) through the backend's
//     reserve/map/unmap. A page is mapped exactly when it is not covered by an unmapped free
//     block; unmapped free blocks are page aligned and belong to no stream.
//   * allocate(n, s), hot path: best fit (smallest, then lowest address) among the mapped free
//     blocks of stream s. No device call.
//   * Slow path: the placement that needs the fewest new pages, over every unmapped free block
//     extended by the mapped free blocks of stream s right beside it (address-ordered best fit
//     over the whole reserved range). Before mapping k new pages, up to k whole free pages
//     elsewhere (any stream; pages the new block does not touch) are unmapped when reserved
//     would otherwise rise above its high-water mark, so a page moves
//     to where it is needed instead of reserved growing (GMLake's stitching, done with the page
//     table instead of a second virtual range).
//   * Streams: a freed block goes back, mapped, to its allocation stream's free blocks; other
//     streams get its memory only after its page is unmapped (unmapping waits for the device:
//     CudaVmmBackend::unmap synchronizes) and mapped again. Stream uses (record_stream) hold the
//     block as pending until an event recorded on each use stream at free() completes, as in
//     PyTorch.
//   * Memory cap (set_memory_fraction): mapping never takes reserved above the cap; when the
//     cap or the device refuses, every whole free page is unmapped and the placement retried
//     once (counted in num_alloc_retries) before OutOfMemory.
//   * empty_cache(): waits for pending stream-use events, then unmaps every whole free page.
//     The reservation itself is kept until the allocator is destroyed.
//
// Promises (checked by CachetPolicy::invariants() after every operation in validate mode, and
// by tests/policy_cachet/ on scenarios computed by hand):
//   [P1] reserved = mapped pages x 2 MiB, and reserved rises above its high-water mark only
//        when, once the allocation is placed, every mapped page holds at least one byte of a
//        live (allocated or pending) block (below the mark, pages are mapped without moving
//        others, which saves unmap calls). Hence peak reserved = the peak over time of the pages
//        touched by live blocks: at most the live bytes rounded to 512 B, rounded to pages, plus
//        one partial page at each end of every run of live blocks.
//   [P2] a block freed on stream s without stream uses is handed to stream s only, until the
//        page holding it is unmapped; a block with stream uses is handed to nobody until the
//        events recorded at its free() have completed.
//   [P3] reserved <= the memory cap at all times; an allocation fails only when no placement
//        fits in the reserved range with its new pages under the cap after every whole free
//        page was unmapped.
//   [P4] a request that fits a mapped free block of its stream is served from it (best fit)
//        with no device call. (Not yet a promise about whole training steps: a later step that
//        sets a new peak moves pages; bench/RESULTS.md counts those calls.)
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
// The address-space reservation, in multiples of the device's total memory.
inline constexpr Bytes kCachetReserveFactor = 2;

}  // namespace cachet::gpu

// cachet/types.h: the glossary. Every other header speaks these words, in PyTorch's terms.
//
//   device    one GPU, by index. Each allocator instance serves exactly one device.
//   stream    a CUDA stream, carried as its raw cudaStream_t value (StreamId); 0 is the legacy
//             default stream. Snapshots and traces print this value as an integer.
//   segment   one device allocation (cudaMalloc, or one contiguous mapped run of an expandable
//             segment). Blocks are never coalesced across segments.
//   block     a piece of a segment: allocated, pending free (waiting for stream-use events), or
//             free ("inactive"). The blocks of a segment tile it exactly, in address order.
//   pool      the free blocks of one size class: the small pool (blocks <= 1 MiB, carved from
//             2 MiB segments) and the large pool (everything else).
//   stream use  a record_stream(): the block was used on another stream, so freeing it must
//             wait for an event recorded on that stream.
//   inactive split  a free block inside a segment that has more than one block.
//   oversize  a block or segment of max_split_size bytes or more: never split.
//   private pool  a pool of its own (small and large) that allocations are routed to while a
//             torch.cuda.MemPool is in use (use_mem_pool) or a CUDA graph is being captured;
//             named by a PoolId (PyTorch's MempoolId_t). The default pools have id {0, 0}.
//
// This header holds only names and PyTorch's constants. Algorithms live in model/ (the
// specification) and gpu/ (the allocator people run), separately, on purpose.
#pragma once

#include <compare>
#include <cstddef>
#include <cstdint>

namespace cachet {

using StreamId = std::uint64_t;  // raw cudaStream_t value; 0 = legacy default stream
using DeviceIndex = int;
using Bytes = std::uint64_t;

// PyTorch's MempoolId_t (docs/pytorch-allocator.md §14.1): {0, 0} the default pools; {0, n} a
// torch.cuda.MemPool or graph_pool_handle(); {n, 0} a pool a CUDA graph capture made.
struct PoolId {
  std::uint64_t first = 0;
  std::uint64_t second = 0;
  bool is_default() const { return first == 0 && second == 0; }
  friend auto operator<=>(const PoolId&, const PoolId&) = default;
};

// A thread of an op list (cachet/ops.h `t<k>`): 0 is the main thread; the runners make each
// thread's calls on an OS thread of its own.
using ThreadIndex = std::uint32_t;

// Which allocations a private pool takes while it is active (PyTorch's filter of
// beginAllocateToPool, §14.2, §14.10.2): every allocation of the thread that entered use_mem_pool
// (`thread`; PyTorch compares std::this_thread::get_id()), or those on the stream a CUDA graph is
// capturing, whatever the thread.
struct PoolRoute {
  enum class Kind : std::uint8_t { CurrentThread, CaptureStream };
  Kind kind = Kind::CurrentThread;
  StreamId stream = 0;     // CaptureStream: the capturing stream
  ThreadIndex thread = 0;  // CurrentThread: the thread that entered use_mem_pool
  // Whether an allocation on stream `s`, made by thread `t`, goes to this pool.
  bool takes(StreamId s, ThreadIndex t = 0) const { return kind == Kind::CurrentThread ? t == thread : s == stream; }
  bool is_capture() const { return kind == Kind::CaptureStream; }
};

inline constexpr Bytes KiB = 1024;
inline constexpr Bytes MiB = 1024 * KiB;
inline constexpr Bytes GiB = 1024 * MiB;

// PyTorch 2.11 c10/core/AllocatorConfig.h (docs/pytorch-allocator.md §1.1).
inline constexpr Bytes kMinBlockSize = 512;       // every size is rounded to at least 512 B
inline constexpr Bytes kSmallSize = 1 * MiB;      // largest "small" allocation
inline constexpr Bytes kSmallBuffer = 2 * MiB;    // small allocations are packed in 2 MiB segments
inline constexpr Bytes kMinLargeAlloc = 10 * MiB; // 1..10 MiB requests use large_segment_size
inline constexpr Bytes kRoundLarge = 2 * MiB;     // larger requests round their segment to 2 MiB
inline constexpr Bytes kDefaultLargeSegmentSize = 20 * MiB;
inline constexpr int kRoundUpPowerOfTwoIntervals = 16;  // 1 MiB .. 32 GiB and above
// Requests of this size or more fail before anything else ("more than 1EB memory").
inline constexpr Bytes kMaxRequest = Bytes{1} << 60;

}  // namespace cachet

// gpu/src/shell/pointer_errors.h: the UsageError both policies throw for a pointer that is not an
// active block (free, record_stream): unknown, interior, or a free block (double free).
#pragma once

#include <optional>

#include "cachet/gpu/backend.h"

namespace cachet::gpu::detail {

// The block of this allocator that holds a pointer which is not an active block's address.
struct BlockAt {
  DevicePtr ptr = 0;
  Bytes size = 0;
  bool free = false;  // the block is free (not allocated, not waiting for events)
};

// "op(0x..): double free or never allocated: ..." when `ptr` is the address of a free block,
// "op(0x..): interior pointer: ..." when it lies inside (or starts a non-free) `holder`,
// "op(0x..): unknown pointer: ..." when no block of this allocator holds it.
[[noreturn]] void throw_bad_pointer(const char* op, DevicePtr ptr, DeviceIndex device,
                                    const std::optional<BlockAt>& holder);

}  // namespace cachet::gpu::detail

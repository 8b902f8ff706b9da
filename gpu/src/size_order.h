// gpu/src/size_order.h: the size order of free blocks both policies keep (PyTorch's
// BlockComparatorSize, docs/pytorch-allocator.md §2.1): stream, then size, then address. Any type with the
// fields stream, size and ptr takes part (a policy's block type, SizeKey for lookups).
#pragma once

#include "cachet/types.h"

namespace cachet::gpu::detail {

struct SizeKey {
  StreamId stream;
  Bytes size;
  DevicePtr ptr;
};

struct SizeOrder {
  template <class A, class B>
  bool operator()(const A& a, const B& b) const {
    if (a.stream != b.stream) return a.stream < b.stream;
    if (a.size != b.size) return a.size < b.size;
    return a.ptr < b.ptr;
  }
};

}  // namespace cachet::gpu::detail

// python/tests/torch_common_test.cpp: the per-device allocators both PyTorch libraries share
// (python/torch_common.h), over host-simulated devices: the sole allocator the c10 backend's
// allocate and free read without a call or a lock is the first one created, and none once a
// second device has one.
#include <gtest/gtest.h>

#include <memory>

#include "cachet/gpu/allocator.h"
#include "cachet/gpu/host_backend.h"
#include "torch_common.h"

namespace tc = cachet::torch_common;

namespace {
cachet::CachingAllocator* host_allocator() {
  return std::make_unique<cachet::CachingAllocator>(cachet::gpu::make_host_memory()).release();  // kept, as the libraries keep theirs
}
}  // namespace

TEST(SoleAllocator, IsTheFirstUntilASecondDeviceHasOne) {
  EXPECT_EQ(tc::sole_allocator().allocator, nullptr);
  EXPECT_EQ(tc::sole_allocator().device, -1);

  cachet::CachingAllocator* first = host_allocator();
  tc::register_allocator(2, first);
  EXPECT_EQ(tc::sole_allocator().allocator, first);
  EXPECT_EQ(tc::sole_allocator().device, 2);
  EXPECT_EQ(tc::existing_allocator(2), first);
  EXPECT_EQ(tc::state().created.load(), 1);

  cachet::CachingAllocator* second = host_allocator();
  tc::register_allocator(5, second);
  EXPECT_EQ(tc::sole_allocator().allocator, nullptr);  // owner() must then ask the pointer's device
  EXPECT_EQ(tc::sole_allocator().device, -1);
  EXPECT_EQ(tc::existing_allocator(2), first);
  EXPECT_EQ(tc::existing_allocator(5), second);
  EXPECT_EQ(tc::state().created.load(), 2);
  EXPECT_EQ(tc::device_count_hint(), 6);
}

// Sleep and wake on a real GPU through the CUDA VMM backend (docs/sleep-wake.md; the host-backend
// rules are tests/gpu/sleep_test.cpp). Skips (GTEST_SKIP) without a CUDA device or driver. Under
// policy:pytorch, expandable segments off and on, and policy:cachet:
//   - the memory a sleep reports comes back to the driver (cudaMemGetInfo's free memory rises by at
//     least 99% of it), pointers are unchanged after wake, backed-up bytes are bitwise equal;
//   - a segment over 512 MiB wakes in two pieces and keeps its contents;
//   - a wake the cap refuses raises OutOfMemory, stays asleep, and a later wake succeeds;
//   - 20 sleep/wake cycles leak no device memory (to within 2 MiB);
//   - giving back part of a woken piece keeps the contents of its other parts (the backend alone).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "cachet/errors.h"
#include "cachet/gpu/allocator.h"
#include "cachet/gpu/cuda_backend.h"
#include "cachet/tags.h"

namespace cachet::test {
namespace {

bool have_device() { return gpu::cuda_device_count() > 0; }  // throws on unexpected errors

Bytes device_free() {
  std::size_t free = 0, total = 0;
  EXPECT_EQ(cudaMemGetInfo(&free, &total), cudaSuccess);
  return free;
}

void fill(void* p, int byte, Bytes n) {
  ASSERT_EQ(cudaMemset(p, byte, n), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

// Every byte of [p, p+n) on the device is `byte`.
bool holds(const void* p, unsigned char byte, Bytes n) {
  std::vector<unsigned char> host(n);
  if (cudaMemcpy(host.data(), p, n, cudaMemcpyDeviceToHost) != cudaSuccess) return false;
  for (unsigned char c : host)
    if (c != byte) return false;
  return true;
}

// 0: policy:pytorch, expandable segments off; 1: on; 2: policy:cachet.
class SleepDevice : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    if (!have_device()) GTEST_SKIP() << "no CUDA device or driver";
  }
  std::unique_ptr<CachingAllocator> make() const {
    Config c;
    c.sleep = true;
    c.expandable_segments = GetParam() == 1;
    c.policy = GetParam() == 2 ? Policy::Cachet : Policy::PyTorch;
    c.validate = true;
    return CachingAllocator::for_cuda_device(0, c);
  }
};

TEST_P(SleepDevice, MemoryGoesBackAndComesBackWithItsContents) {
  auto a = make();
  void* w = nullptr;
  void* big = nullptr;
  void* kv = nullptr;
  {
    TagScope t("weights");
    w = a->allocate(64 * MiB, 0);
    big = a->allocate(600 * MiB, 0);  // a segment over 512 MiB: two pieces at wake
  }
  {
    TagScope t("kv_cache");
    kv = a->allocate(32 * MiB, 0);
  }
  fill(w, 0x5A, 64 * MiB);
  fill(big, 0x6B, 600 * MiB);
  fill(kv, 0x11, 32 * MiB);
  const Bytes free_before = device_free();
  const Bytes given = a->sleep({}, {"weights"});
  const auto reserved = static_cast<Bytes>(a->stats().reserved_bytes[0].current);
  EXPECT_GE(given, reserved * 99 / 100);
  EXPECT_GE(device_free() - free_before, given * 99 / 100);
  EXPECT_EQ(a->sleep_stats().backup_bytes.current, static_cast<std::int64_t>(664 * MiB));
  EXPECT_EQ(a->sleeping(), (TagList{"kv_cache", "weights"}));
  a->wake({});
  EXPECT_LE(device_free(), free_before + 2 * MiB);
  EXPECT_TRUE(holds(w, 0x5A, 64 * MiB));
  EXPECT_TRUE(holds(big, 0x6B, 600 * MiB));
  fill(kv, 0x22, 32 * MiB);  // not backed up: undefined contents, but the memory is there
  EXPECT_TRUE(holds(kv, 0x22, 32 * MiB));
  a->free(w);
  a->free(big);
  a->free(kv);
  a->empty_cache();
  EXPECT_EQ(a->stats().reserved_bytes[0].current, 0);
}

TEST_P(SleepDevice, AWakeTheCapRefusesStaysAsleep) {
  auto a = make();
  std::size_t free = 0, total = 0;
  ASSERT_EQ(cudaMemGetInfo(&free, &total), cudaSuccess);
  a->set_memory_fraction(static_cast<double>(256 * MiB) / static_cast<double>(total));
  void* w = nullptr;
  {
    TagScope t("weights");
    w = a->allocate(100 * MiB, 0);
  }
  fill(w, 0x3C, 100 * MiB);
  a->sleep({"weights"}, {"weights"});
  void* other = a->allocate(200 * MiB, 0);  // the room the sleep made, under the same cap
  EXPECT_THROW(a->wake({}), OutOfMemory);
  EXPECT_EQ(a->sleeping(), TagList{"weights"});
  EXPECT_EQ(a->sleep_stats().num_wake_ooms, 1);
  a->free(other);
  a->empty_cache();
  a->wake({});
  EXPECT_TRUE(holds(w, 0x3C, 100 * MiB));
  a->free(w);
}

TEST_P(SleepDevice, CyclesLeakNothing) {
  auto a = make();
  void* w = nullptr;
  {
    TagScope t("weights");
    w = a->allocate(256 * MiB, 0);
  }
  fill(w, 0x7E, 256 * MiB);
  Bytes free_after_first = 0;
  for (int i = 0; i < 20; ++i) {
    a->sleep({}, {"weights"});
    a->wake({});
    if (i == 0) free_after_first = device_free();
  }
  const Bytes now = device_free();
  EXPECT_LE(now > free_after_first ? now - free_after_first : free_after_first - now, 2 * MiB);
  EXPECT_TRUE(holds(w, 0x7E, 256 * MiB));
  a->free(w);
}

// The pinned buffer of a backup is kept after the wake for the next sleep, survives
// empty_cache() (device memory only: a program calling torch.cuda.empty_cache() between cycles
// must not pay cudaHostAlloc at every sleep), and goes back at release_backup_buffers(), which
// returns its bytes (docs/sleep-wake.md section 6).
TEST_P(SleepDevice, KeptPinnedBuffersSurviveEmptyCacheAndGoAtRelease) {
  auto a = make();
  void* w = nullptr;
  {
    TagScope t("weights");
    w = a->allocate(256 * MiB, 0);
  }
  fill(w, 0x4D, 256 * MiB);
  a->sleep({}, {"weights"});
  EXPECT_EQ(a->release_backup_buffers(), 0u);  // in use: it holds the backup
  a->wake({});
  a->empty_cache();
  a->sleep({}, {"weights"});  // the kept buffer, no cudaHostAlloc
  a->wake({});
  EXPECT_TRUE(holds(w, 0x4D, 256 * MiB));
  a->empty_cache();
  EXPECT_EQ(a->release_backup_buffers(), 256 * MiB);
  EXPECT_EQ(a->release_backup_buffers(), 0u);
  a->sleep({}, {"weights"});  // pins again
  a->wake({});
  EXPECT_TRUE(holds(w, 0x4D, 256 * MiB));
  a->free(w);
}

// The backend's own rule (PinnedKeep): a buffer given back is the one taken next; host_trim
// unpins it and says how much.
TEST(SleepDeviceBackend, AKeptBufferIsTakenAgainAndTrimmed) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device or driver";
  auto mem = gpu::make_device_memory<gpu::CudaVmmBackend>(0);
  auto h = mem->host_alloc(64 * MiB);
  ASSERT_TRUE(h.status.is_ok()) << h.status.message;
  mem->host_free(h.value);
  auto again = mem->host_alloc(32 * MiB);  // the smallest kept one that is large enough
  ASSERT_TRUE(again.status.is_ok());
  EXPECT_EQ(again.value, h.value);
  EXPECT_EQ(mem->host_trim(), 0u);  // in use
  mem->host_free(again.value);
  EXPECT_EQ(mem->host_trim(), 64 * MiB);
  EXPECT_EQ(mem->host_trim(), 0u);
}

// The props case that found it (an H200, 2026-11-28): sleep, wake (map_pieces: one 64 MiB piece),
// then a sleep of some tags or a release gives back part of the piece. The other parts keep their
// contents and their pages, and every page comes back to the driver at the end.
TEST(SleepDeviceBackend, UnmappingPartOfAPieceKeepsTheRest) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device or driver";
  auto mem = gpu::make_device_memory<gpu::CudaVmmBackend>(0);
  const Bytes n = 64 * MiB;
  auto r = mem->reserve(n);
  ASSERT_TRUE(r.status.is_ok()) << r.status.message;
  const gpu::DevicePtr p = r.value;
  auto at = [&](Bytes off) { return reinterpret_cast<void*>(static_cast<std::uintptr_t>(p + off)); };
  const Bytes free_before = device_free();
  ASSERT_TRUE(mem->map_pieces(p, n).is_ok());
  for (Bytes off = 0; off < n; off += 2 * MiB) fill(at(off), static_cast<int>(off / (2 * MiB)) + 1, 2 * MiB);
  // The middle (a part before and after it), then the end (a part before), then the start.
  const gpu::Status mid = mem->unmap(p + 20 * MiB, 4 * MiB);
  ASSERT_TRUE(mid.is_ok()) << mid.message;
  const gpu::Status tail = mem->unmap(p + 60 * MiB, 4 * MiB);
  ASSERT_TRUE(tail.is_ok()) << tail.message;
  const gpu::Status head = mem->unmap(p, 2 * MiB);
  ASSERT_TRUE(head.is_ok()) << head.message;
  for (Bytes off = 2 * MiB; off < 60 * MiB; off += 2 * MiB) {
    if (off >= 20 * MiB && off < 24 * MiB) continue;
    EXPECT_TRUE(holds(at(off), static_cast<unsigned char>(off / (2 * MiB) + 1), 2 * MiB)) << "page at " << off;
  }
  EXPECT_FALSE(mem->unmap(p + 20 * MiB, 2 * MiB).is_ok());  // not mapped any more
  ASSERT_TRUE(mem->unmap(p + 2 * MiB, 18 * MiB).is_ok());
  ASSERT_TRUE(mem->unmap(p + 24 * MiB, 36 * MiB).is_ok());
  const Bytes now = device_free();
  EXPECT_LE(now > free_before ? now - free_before : free_before - now, 2 * MiB);
  EXPECT_TRUE(mem->unreserve(p, n).is_ok());
}

INSTANTIATE_TEST_SUITE_P(Policies, SleepDevice, ::testing::Values(0, 1, 2), [](const auto& info) {
  return info.param == 2 ? std::string("cachet") : info.param == 1 ? std::string("pytorch_on") : std::string("pytorch_off");
});

}  // namespace
}  // namespace cachet::test

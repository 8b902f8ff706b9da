// bench/hot_path.h: cachet_bench's single-thread hot-path patterns as a reusable run, for the
// tools that compare two builds of the allocator (hot_path_count.cpp under callgrind,
// ab_plugin.cpp + ab_driver.cpp in one process). Uses only the public API
// (cachet/gpu/allocator.h, cachet/gpu/host_backend.h), so it
// compiles against older trees too.
//
// A pattern is named as in cachet_bench: <Peer>/pair/512B | /pair/1MiB | /pair/64MiB |
// /window/1B-1MiB/64live | /window/512B-256MiB/128live, Peer = Host (host backend,
// policy:pytorch, default Config), HostCachetPolicy (host backend, policy:cachet) or Cachet
// (CUDA runtime backend, device 0, default Config; needs a CUDA build and a device).
// The window sequence (make_window_seq: splitmix64, seed 0x5eed, 2^16 entries) is the one
// bench_main.cpp uses too (it includes this header); the sizes and the warm-up (a pair: one
// allocate + free before the loop; a window: its live blocks allocated before the loop) are
// bench_main.cpp's. One iteration = one allocate + one free (pair) or one free + one allocate
// (window), on stream 0.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "cachet/gpu/allocator.h"
#include "cachet/gpu/host_backend.h"

namespace cachet::bench::hot_path {

inline std::uint64_t splitmix64(std::uint64_t& s) {
  std::uint64_t z = (s += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

inline constexpr std::size_t kSeqLen = std::size_t{1} << 16;

// A random window's sequence: what each step allocates and which live block it frees first.
struct WindowSeq {
  std::vector<std::size_t> sizes;      // kSeqLen sizes
  std::vector<std::uint32_t> victims;  // kSeqLen slot indices < live
};

// Log-uniform sizes in [lo, hi] and uniform victims in [0, live), from splitmix64 seeded 0x5eed:
// the same for every peer and every build.
inline WindowSeq make_window_seq(std::size_t lo, std::size_t hi, std::uint32_t live) {
  WindowSeq w;
  w.sizes.reserve(kSeqLen);
  w.victims.reserve(kSeqLen);
  std::uint64_t s = 0x5eed;
  const double llo = std::log(static_cast<double>(lo));
  const double lhi = std::log(static_cast<double>(hi) + 1.0);
  for (std::size_t i = 0; i < kSeqLen; ++i) {
    const double u = static_cast<double>(splitmix64(s) >> 11) * 0x1.0p-53;  // [0, 1)
    auto n = static_cast<std::size_t>(std::exp(llo + u * (lhi - llo)));
    if (n < lo) n = lo;
    if (n > hi) n = hi;
    w.sizes.push_back(n);
    w.victims.push_back(static_cast<std::uint32_t>(splitmix64(s) % live));
  }
  return w;
}

inline const char* kUsage =
    "PATTERN: Host/, HostCachetPolicy/ or Cachet/ followed by pair/512B, pair/1MiB, pair/64MiB, "
    "window/1B-1MiB/64live or window/512B-256MiB/128live";

// One pattern's allocator and state; iterate(n) continues where the last call stopped.
class Run {
 public:
  // Throws std::invalid_argument on an unknown pattern (the message names it and the choices),
  // std::exception from the allocator (no CUDA device for Cachet/...).
  explicit Run(const std::string& pattern) {
    const auto slash = pattern.find('/');
    const std::string peer = pattern.substr(0, slash);
    const std::string rest = slash == std::string::npos ? "" : pattern.substr(slash + 1);
    if (rest == "pair/512B") pair_ = 512;
    if (rest == "pair/1MiB") pair_ = std::size_t{1} << 20;
    if (rest == "pair/64MiB") pair_ = std::size_t{64} << 20;
    std::size_t lo = 0, hi = 0;
    if (rest == "window/1B-1MiB/64live") lo = 1, hi = std::size_t{1} << 20, live_ = 64;
    if (rest == "window/512B-256MiB/128live") lo = 512, hi = std::size_t{256} << 20, live_ = 128;
    if (pair_ == 0 && live_ == 0) {
      throw std::invalid_argument("unknown pattern '" + pattern + "' (" + kUsage + ")");
    }
    Config config;
    if (peer == "Host" || peer == "HostCachetPolicy") {
      if (peer == "HostCachetPolicy") config.policy = Policy::Cachet;
      a_ = std::make_unique<CachingAllocator>(gpu::make_host_memory(gpu::HostOptions{}), config);
    } else if (peer == "Cachet") {
      a_ = CachingAllocator::for_cuda_device(0, config);
    } else {
      throw std::invalid_argument("unknown peer '" + peer + "' in '" + pattern + "' (" + kUsage + ")");
    }
    if (pair_ != 0) {
      a_->free(a_->allocate(pair_, 0));  // warm: the segment exists before the loop
      return;
    }
    seq_ = make_window_seq(lo, hi, live_);
    slots_.assign(live_, nullptr);
    for (std::uint32_t i = 0; i < live_; ++i) slots_[i] = a_->allocate(seq_.sizes[k_++], 0);
  }
  Run(const Run&) = delete;
  Run& operator=(const Run&) = delete;
  ~Run() {
    for (void* p : slots_) a_->free(p);
    a_->empty_cache();
  }

  void iterate(long n) {
    CachingAllocator& a = *a_;
    if (pair_ != 0) {
      for (long i = 0; i < n; ++i) {
        void* p = a.allocate(pair_, 0);
        asm volatile("" : : "g"(p) : "memory");  // benchmark::DoNotOptimize
        a.free(p);
      }
      return;
    }
    for (long i = 0; i < n; ++i, ++k_) {
      const std::size_t j = k_ & (kSeqLen - 1);
      void*& slot = slots_[seq_.victims[j]];
      a.free(slot);
      slot = a.allocate(seq_.sizes[j], 0);
    }
  }

 private:
  std::unique_ptr<CachingAllocator> a_;
  std::size_t pair_ = 0;
  std::uint32_t live_ = 0;
  WindowSeq seq_;
  std::vector<void*> slots_;
  std::size_t k_ = 0;
};

}  // namespace cachet::bench::hot_path

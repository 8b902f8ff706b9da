// cachet/gpu/spin_mutex.h: the allocator's lock. A test-and-test-and-set spin lock that backs
// off to yielding: the critical sections of the cached path are tens of nanoseconds, where a
// futex-based std::mutex puts contending threads to sleep and pays microseconds to wake them
// (PyTorch's per-device std::recursive_mutex slows from ~0.5 us per pair on one thread to
// ~3.3 us aggregate on eight). A holder that waits on the device (cudaMalloc, an event
// synchronize) lets spinners fall back to sched_yield after a short burst, so they do not
// steal its core. Satisfies Lockable (std::lock_guard works).
#pragma once

#include <atomic>
#include <thread>

namespace cachet::gpu {

class SpinMutex {
 public:
  void lock() noexcept {
    while (locked_.exchange(true, std::memory_order_acquire)) {
      // Spin on a plain load (no cache-line ping-pong) until the lock looks free.
      for (int spins = 0; locked_.load(std::memory_order_relaxed); ++spins) {
        if (spins < kSpinsBeforeYield)
          relax();
        else
          std::this_thread::yield();
      }
    }
  }
  bool try_lock() noexcept {
    return !locked_.load(std::memory_order_relaxed) &&
           !locked_.exchange(true, std::memory_order_acquire);
  }
  void unlock() noexcept { locked_.store(false, std::memory_order_release); }

 private:
  static constexpr int kSpinsBeforeYield = 128;
  static void relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    asm volatile("yield");
#endif
  }
  alignas(64) std::atomic<bool> locked_{false};
};

}  // namespace cachet::gpu

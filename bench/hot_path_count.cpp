// bench/hot_path_count.cpp: one hot-path pattern (bench/hot_path.h: cachet_bench's Host/... and
// HostCachetPolicy/... patterns) run a fixed number of iterations, for counting instructions
// under callgrind. Instruction counts repeat exactly from run to run and from machine to
// machine, where time does not (a shared 2-core VM, a GPU host with other tenants), so two
// builds of the allocator can be compared to well under 1% (bench/callgrind_builds.py builds
// this file against each build and runs it).
//
//   hot_path_count PATTERN ITERATIONS [cold]
//
// Only the loop runs inside the extern "C" function cachet_count_loop, so
// `valgrind --tool=callgrind --toggle-collect=cachet_count_*` counts the loop alone (the
// allocator's construction, the warm-up and the process start are outside it). Exit 0, or 2 on
// bad input.
//
// cold: before every iteration, 128 KiB of other data is written (outside the counted function,
// cachet_count_one), as the Python interpreter and ATen do between two allocations inside
// PyTorch; under `--cache-sim=yes` the first-level data-cache misses per iteration are then the
// cache lines one allocate + free touches, which is what makes it slower inside PyTorch than in a
// tight loop (bench/RESULTS.md, "The c10 backend").
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <stdexcept>

#include "hot_path.h"

using cachet::bench::hot_path::Run;

extern "C" __attribute__((noinline)) void cachet_count_loop(Run& run, long n) { run.iterate(n); }
extern "C" __attribute__((noinline)) void cachet_count_one(Run& run) { run.iterate(1); }

namespace {
// Evicts the first-level data cache (and part of the second): one write per 64-byte line.
char other_data[128 << 10];
__attribute__((noinline)) void touch_other_data() {
  for (std::size_t i = 0; i < sizeof(other_data); i += 64) other_data[i] = static_cast<char>(other_data[i] + 1);
  asm volatile("" : : "g"(other_data) : "memory");
}
}  // namespace

int main(int argc, char** argv) {
  const bool cold = argc == 4 && std::strcmp(argv[3], "cold") == 0;
  if (argc != 3 && !cold) {
    std::fprintf(stderr, "usage: hot_path_count PATTERN ITERATIONS [cold]\n%s\n", cachet::bench::hot_path::kUsage);
    return 2;
  }
  char* end = nullptr;
  const long n = std::strtol(argv[2], &end, 10);
  if (end == argv[2] || *end != '\0' || n < 0) {
    std::fprintf(stderr, "hot_path_count: ITERATIONS must be a count >= 0, got '%s'\n", argv[2]);
    return 2;
  }
  try {
    Run run(argv[1]);
    if (cold) {
      for (long i = 0; i < n; ++i) {
        touch_other_data();
        cachet_count_one(run);
      }
    } else {
      cachet_count_loop(run, n);
    }
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "hot_path_count: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hot_path_count: %s: %s\n", argv[1], e.what());
    return 1;
  }
  return 0;
}

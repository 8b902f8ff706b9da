// bench/hot_path_count.cpp: one hot-path pattern (bench/hot_path.h: cachet_bench's Host/... and
// HostCachetPolicy/... patterns) run a fixed number of iterations, for counting instructions
// under callgrind. Instruction counts repeat exactly from run to run and from machine to
// machine, where time does not (a shared 2-core VM, a GPU host with other tenants), so two
// builds of the allocator can be compared to well under 1% (bench/callgrind_builds.py builds
// this file against each build and runs it).
//
//   hot_path_count PATTERN ITERATIONS
//
// Only the loop runs inside the extern "C" function cachet_count_loop, so
// `valgrind --tool=callgrind --toggle-collect=cachet_count_*` counts the loop alone (the
// allocator's construction, the warm-up and the process start are outside it). Exit 0, or 2 on
// bad input.
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <stdexcept>

#include "hot_path.h"

using cachet::bench::hot_path::Run;

extern "C" __attribute__((noinline)) void cachet_count_loop(Run& run, long n) { run.iterate(n); }

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: hot_path_count PATTERN ITERATIONS\n%s\n", cachet::bench::hot_path::kUsage);
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
    cachet_count_loop(run, n);
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "hot_path_count: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hot_path_count: %s: %s\n", argv[1], e.what());
    return 1;
  }
  return 0;
}

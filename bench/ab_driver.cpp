// bench/ab_driver.cpp: two builds of the allocator in one process, timed in alternating slices.
//
//   ab_driver OLD.so NEW.so PATTERN [SLICES [SLICE_US]]
//
// OLD.so and NEW.so are ab_plugin.cpp linked against two builds (bench/ab_builds.py makes
// them). Both run PATTERN (bench/hot_path.h) side by side: the iteration count of a slice is
// calibrated once on OLD to take about SLICE_US microseconds (default 5000), both get 8
// untimed slices of warm-up, then SLICES (default 200) timed pairs of slices, the order within
// a pair flipping every pair (old-new, new-old, ...). The two samples of a pair are taken
// within milliseconds of each other on the same CPU, so a change of the machine's speed (a
// busy neighbour on a shared host, a frequency step) falls on both; timing whole processes
// alternately cannot promise that. Prints one JSON object: pattern, iterations per slice, and
// each build's ns per iteration for every slice, in pair order. Exit 0, 1 if a build fails to
// load or run, 2 on bad input.
#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

using OpenFn = void* (*)(const char*, char*, unsigned long);
using IterateFn = int (*)(void*, long, char*, unsigned long);
using CloseFn = void (*)(void*);

struct Build {
  const char* path = nullptr;
  void* run = nullptr;
  IterateFn iterate = nullptr;
  CloseFn close = nullptr;
};

char g_err[512];

[[noreturn]] void fail(int code, const std::string& msg) {
  std::fprintf(stderr, "ab_driver: %s\n", msg.c_str());
  std::exit(code);
}

Build load(const char* path, const char* pattern) {
  Build b;
  b.path = path;
  void* h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (h == nullptr) fail(1, std::string("cannot load ") + path + ": " + dlerror());
  auto open = reinterpret_cast<OpenFn>(dlsym(h, "cachet_ab_open"));
  b.iterate = reinterpret_cast<IterateFn>(dlsym(h, "cachet_ab_iterate"));
  b.close = reinterpret_cast<CloseFn>(dlsym(h, "cachet_ab_close"));
  if (open == nullptr || b.iterate == nullptr || b.close == nullptr) {
    fail(1, std::string(path) + " is not an ab_plugin (no cachet_ab_open/iterate/close)");
  }
  b.run = open(pattern, g_err, sizeof g_err);
  if (b.run == nullptr) fail(1, std::string(path) + ": " + g_err);
  return b;
}

double time_ns(Build& b, long n) {
  const auto t0 = std::chrono::steady_clock::now();
  if (b.iterate(b.run, n, g_err, sizeof g_err) != 0) fail(1, std::string(b.path) + ": " + g_err);
  const auto t1 = std::chrono::steady_clock::now();
  return static_cast<double>(std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0).count());
}

long arg(const char* s, const char* what, long lo) {
  char* end = nullptr;
  const long v = std::strtol(s, &end, 10);
  if (end == s || *end != '\0' || v < lo) fail(2, std::string(what) + " must be a number >= " + std::to_string(lo) + ", got '" + s + "'");
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4 || argc > 6) fail(2, "usage: ab_driver OLD.so NEW.so PATTERN [SLICES [SLICE_US]]");
  const char* pattern = argv[3];
  const long slices = argc > 4 ? arg(argv[4], "SLICES", 1) : 200;
  const long slice_us = argc > 5 ? arg(argv[5], "SLICE_US", 10) : 5000;
  Build old_b = load(argv[1], pattern);
  Build new_b = load(argv[2], pattern);

  long n = 1;  // iterations per slice: about slice_us on OLD
  while (time_ns(old_b, n) < 1e3 * static_cast<double>(slice_us) && n < (1L << 40)) n *= 2;
  const double t = time_ns(old_b, n);
  n = std::max(1L, static_cast<long>(static_cast<double>(n) * 1e3 * static_cast<double>(slice_us) / t));
  for (int i = 0; i < 8; ++i) {
    time_ns(old_b, n);
    time_ns(new_b, n);
  }
  std::vector<double> o, w;
  o.reserve(static_cast<std::size_t>(slices));
  w.reserve(static_cast<std::size_t>(slices));
  for (long i = 0; i < slices; ++i) {
    if (i % 2 == 0) {
      o.push_back(time_ns(old_b, n) / static_cast<double>(n));
      w.push_back(time_ns(new_b, n) / static_cast<double>(n));
    } else {
      w.push_back(time_ns(new_b, n) / static_cast<double>(n));
      o.push_back(time_ns(old_b, n) / static_cast<double>(n));
    }
  }
  std::printf("{\"pattern\": \"%s\", \"iterations_per_slice\": %ld, \"old\": [", pattern, n);
  for (std::size_t i = 0; i < o.size(); ++i) std::printf("%s%.3f", i ? ", " : "", o[i]);
  std::printf("], \"new\": [");
  for (std::size_t i = 0; i < w.size(); ++i) std::printf("%s%.3f", i ? ", " : "", w[i]);
  std::printf("]}\n");
  old_b.close(old_b.run);
  new_b.close(new_b.run);
  return 0;
}

// bench/ab_plugin.cpp: one build of the allocator as a shared object for ab_driver, which loads
// two of them (say, before and after a refactor) into one process and alternates between them
// every few milliseconds. bench/ab_builds.py links this file with a build's libcachet_gpu.a and
// libcachet_common.a into a shared object that exports only the three functions below (a
// version script makes every other symbol local, so the two builds' cachet:: symbols never
// meet, and calls inside each object bind directly).
#include <cstdio>
#include <exception>
#include <new>

#include "hot_path.h"

extern "C" {

// A new run of PATTERN (bench/hot_path.h), or nullptr with the reason in err[0..n).
void* cachet_ab_open(const char* pattern, char* err, unsigned long n) {
  try {
    return new cachet::bench::hot_path::Run(pattern);
  } catch (const std::exception& e) {
    std::snprintf(err, n, "%s", e.what());
    return nullptr;
  }
}

// Runs `iterations` iterations; 0, or -1 with the reason in err (an allocator error).
int cachet_ab_iterate(void* run, long iterations, char* err, unsigned long n) {
  try {
    static_cast<cachet::bench::hot_path::Run*>(run)->iterate(iterations);
    return 0;
  } catch (const std::exception& e) {
    std::snprintf(err, n, "%s", e.what());
    return -1;
  }
}

void cachet_ab_close(void* run) { delete static_cast<cachet::bench::hot_path::Run*>(run); }

}  // extern "C"

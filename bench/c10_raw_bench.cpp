// cachet_c10_raw_bench: PyTorch's raw allocator entry points as PyTorch's C++ calls them
// (c10::cuda::CUDACachingAllocator::raw_alloc / raw_delete, through the atomic `allocator`), with
// PyTorch 2.11's native CUDACachingAllocator and with cachet's c10 backend, in one process, one
// run (issue 22, bench/RESULTS.md "The c10 backend").
//
//   cachet_c10_raw_bench LIBCACHET_C10 [--json FILE]
//
// Order: cachet first (installed with cachet_c10_install, as cachet_torch.install() does, while the
// native allocator is not yet initialised), then the native allocator, stored back into the atomic
// and initialised. Each pattern: 9 repeats of N alloc/free pairs after a warm-up; the median time
// per pair is reported, and cachet / native as a ratio.
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAFunctions.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "cachet/gpu/allocator.h"

namespace CCA = c10::cuda::CUDACachingAllocator;

namespace {

struct Pattern {
  const char* name;
  std::vector<size_t> sizes;  // one pair per size, cycled
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// ns per alloc/free pair through the current CUDAAllocator.
double measure(const Pattern& p, int pairs) {
  std::vector<double> reps;
  for (int r = 0; r < 10; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < pairs; ++i) {
      void* ptr = CCA::raw_alloc(p.sizes[static_cast<size_t>(i) % p.sizes.size()]);
      CCA::raw_delete(ptr);
    }
    auto t1 = std::chrono::steady_clock::now();
    if (r > 0)  // the first repeat warms the cache
      reps.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count() / pairs);
  }
  return median(reps);
}

// ns per op of a window of 64 live blocks of mixed sizes (alloc a new one, free the oldest).
double measure_window(int ops) {
  std::vector<double> reps;
  const size_t sizes[] = {512, 4096, 65536, 1 << 20, 3 << 20, 512 << 10, 8 << 20, 1500};
  for (int r = 0; r < 10; ++r) {
    std::vector<void*> live(64, nullptr);
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < ops; ++i) {
      void*& slot = live[static_cast<size_t>(i) % live.size()];
      if (slot != nullptr) CCA::raw_delete(slot);
      slot = CCA::raw_alloc(sizes[static_cast<size_t>(i * 7) % 8]);
    }
    for (void* q : live)
      if (q != nullptr) CCA::raw_delete(q);
    auto t1 = std::chrono::steady_clock::now();
    if (r > 0) reps.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count() / ops);
  }
  return median(reps);
}

// The same pairs straight on a cachet::CachingAllocator of this process (no c10 adapter): what
// the adapter adds is the difference between this column and the c10 one.
double measure_core(cachet::CachingAllocator& a, const Pattern& p, int pairs) {
  const auto stream = reinterpret_cast<cachet::StreamId>(c10::cuda::getCurrentCUDAStream(0).stream());
  std::vector<double> reps;
  for (int r = 0; r < 10; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < pairs; ++i) a.free(a.allocate(p.sizes[static_cast<size_t>(i) % p.sizes.size()], stream));
    auto t1 = std::chrono::steady_clock::now();
    if (r > 0) reps.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count() / pairs);
  }
  return median(reps);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s LIBCACHET_C10 [--json FILE]\n", argv[0]);
    return 2;
  }
  const char* json = (argc >= 4 && std::strcmp(argv[2], "--json") == 0) ? argv[3] : nullptr;
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("skipped: no CUDA device\n");
    return 77;
  }
  void* lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    std::fprintf(stderr, "cannot load %s: %s\n", argv[1], dlerror());
    return 1;
  }
  using InstallFn = int (*)(const char*);
  using VersionFn = const char* (*)();
  using ErrFn = char* (*)();
  auto install = reinterpret_cast<InstallFn>(dlsym(lib, "cachet_c10_install"));
  auto version = reinterpret_cast<VersionFn>(dlsym(lib, "cachet_c10_torch_version"));
  auto last_error = reinterpret_cast<ErrFn>(dlsym(lib, "cachet_torch_last_error"));
  if (install == nullptr || version == nullptr) {
    std::fprintf(stderr, "%s lacks cachet_c10_install / cachet_c10_torch_version\n", argv[1]);
    return 1;
  }
  CCA::CUDAAllocator* native = CCA::allocator.load();
  if (install(version()) != 0) {
    std::fprintf(stderr, "cachet_c10_install failed: %s\n", last_error ? last_error() : "?");
    return 1;
  }
  CCA::CUDAAllocator* cachet = CCA::allocator.load();
  std::printf("allocators: native %s, cachet %s\n", native->name().c_str(), cachet->name().c_str());

  const std::vector<Pattern> patterns = {
      {"same-size pair, 512 B", {512}},
      {"same-size pair, 1 MiB", {1 << 20}},
      {"same-size pair, 64 MiB", {64 << 20}},
      {"mixed sizes 512 B..8 MiB, pairs", {512, 4096, 65536, 1 << 20, 3 << 20, 8 << 20}},
  };
  const int pairs = 200000;
  std::vector<double> c_ns, n_ns, core_ns;
  {
    auto core = cachet::CachingAllocator::for_cuda_device(0);
    for (const Pattern& p : patterns) core_ns.push_back(measure_core(*core, p, pairs));
  }
  for (const Pattern& p : patterns) c_ns.push_back(measure(p, pairs));
  c_ns.push_back(measure_window(pairs));
  CCA::allocator.store(native);
  native->init(devices);
  for (const Pattern& p : patterns) n_ns.push_back(measure(p, pairs));
  n_ns.push_back(measure_window(pairs));

  std::vector<std::string> names;
  for (const Pattern& p : patterns) names.emplace_back(p.name);
  names.emplace_back("64 live, mixed sizes, per op");
  std::printf("| raw_alloc + raw_delete | cachet ns | native ns | cachet/native | cachet core ns (no adapter) |\n"
              "|---|---|---|---|---|\n");
  for (size_t i = 0; i < names.size(); ++i) {
    char core[32] = "—";
    if (i < core_ns.size()) std::snprintf(core, sizeof(core), "%.1f", core_ns[i]);
    std::printf("| %s | %.1f | %.1f | %.2f | %s |\n", names[i].c_str(), c_ns[i], n_ns[i], c_ns[i] / n_ns[i], core);
  }
  if (json != nullptr) {
    FILE* f = std::fopen(json, "w");
    if (f != nullptr) {
      std::fprintf(f, "[");
      for (size_t i = 0; i < names.size(); ++i)
        std::fprintf(f, "%s{\"pattern\": \"%s\", \"cachet_ns\": %.2f, \"native_ns\": %.2f, \"ratio\": %.4f}",
                     i ? ", " : "", names[i].c_str(), c_ns[i], n_ns[i], c_ns[i] / n_ns[i]);
      std::fprintf(f, "]\n");
      std::fclose(f);
    }
  }
  return 0;
}

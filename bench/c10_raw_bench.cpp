// cachet_c10_raw_bench: PyTorch's raw allocator entry points as PyTorch's C++ calls them
// (c10::cuda::CUDACachingAllocator::raw_alloc / raw_delete, through the atomic `allocator`), with
// PyTorch 2.11's native CUDACachingAllocator and with cachet's c10 backend, in one process, one
// run (issue 22, bench/RESULTS.md "The c10 backend").
//
//   cachet_c10_raw_bench LIBCACHET_C10 [--json FILE] [--pollute]
//
// --pollute: instead, the allocate() + DataPtr drop pairs after evicting one kind of CPU cache
// (see pollute_table).
//
// Order: cachet first (installed with cachet_c10_install, as cachet_torch.install() does, while the
// native allocator is not yet initialised), then the native allocator, stored back into the atomic
// and initialised; then rounds that switch the atomic between the two (see main). Each figure is a
// median over the rounds; the ratio is the median of each round's cachet / native.
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAFunctions.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <sys/mman.h>
#include <x86intrin.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
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

constexpr int kRounds = 15;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// One repeat: ns per alloc/free pair through the current CUDAAllocator.
double one_pairs(const Pattern& p, int pairs) {
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < pairs; ++i) {
    void* ptr = CCA::raw_alloc(p.sizes[static_cast<size_t>(i) % p.sizes.size()]);
    CCA::raw_delete(ptr);
  }
  auto t1 = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::nano>(t1 - t0).count() / pairs;
}

// One repeat: ns per op of a window of 64 live blocks of mixed sizes (alloc a new one, free the
// oldest).
double one_window(int ops) {
  const size_t sizes[] = {512, 4096, 65536, 1 << 20, 3 << 20, 512 << 10, 8 << 20, 1500};
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
  return std::chrono::duration<double, std::nano>(t1 - t0).count() / ops;
}

// One repeat: ns per allocate() + drop of the DataPtr it returns, through the current
// CUDAAllocator: the allocator's part of torch.empty + free (at::empty_cuda asks the same atomic
// for its allocator, and the tensor's storage drops the DataPtr, whose deleter frees).
double one_dataptr(const Pattern& p, int pairs) {
  CCA::CUDAAllocator* a = CCA::allocator.load();
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < pairs; ++i) {
    c10::DataPtr d = a->allocate(p.sizes[static_cast<size_t>(i) % p.sizes.size()]);
  }
  auto t1 = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::nano>(t1 - t0).count() / pairs;
}

// One repeat of the same pairs straight on a cachet::CachingAllocator of this process (no c10
// adapter): what the adapter adds is the difference between this column and the c10 one.
double one_core(cachet::CachingAllocator& a, const Pattern& p, int pairs) {
  const auto stream = reinterpret_cast<cachet::StreamId>(c10::cuda::getCurrentCUDAStream(0).stream());
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < pairs; ++i) a.free(a.allocate(p.sizes[static_cast<size_t>(i) % p.sizes.size()], stream));
  auto t1 = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::nano>(t1 - t0).count() / pairs;
}

// ns per call of `f`, the median of 9 repeats of n calls.
template <class F>
double per_call(F&& f, int n = 1000000) {
  std::vector<double> reps;
  for (int r = 0; r < 10; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < n; ++i) f();
    auto t1 = std::chrono::steady_clock::now();
    if (r > 0) reps.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count() / n);
  }
  return median(reps);
}

// ---- --pollute: what evicting each kind of CPU cache between two pairs costs each allocator --------
//
// PyTorch runs about 1.7 us of its own code between two allocator calls of torch.empty + free; the
// allocator then finds its code and data evicted from some of the CPU's caches. Which ones: each
// mode below evicts one kind before every pair (L1 data lines, data TLB entries, L1 instruction
// lines, instruction TLB entries), and the pair (allocate() + DataPtr drop, as torch.empty +
// free calls them) is timed alone with the TSC, the timing's own cost subtracted.
struct Polluter {
  std::vector<unsigned char> lines = std::vector<unsigned char>(96 << 10);  // 1536 lines, 24 pages
  unsigned char* pages = nullptr;      // 4096 pages: one line touched in each
  unsigned char* code_lines = nullptr;  // 512 `ret`s, one per line, 8 pages
  unsigned char* code_pages = nullptr;  // 4096 `ret`s, one per page
  static constexpr size_t kPages = 4096;
  Polluter() {
    pages = static_cast<unsigned char*>(mmap(nullptr, kPages * 4096 + 4096, PROT_READ | PROT_WRITE,
                                             MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    for (size_t i = 0; i < kPages; ++i) pages[i * 4096 + (i % 64) * 64] = 1;
    code_lines = static_cast<unsigned char*>(mmap(nullptr, 512 * 64, PROT_READ | PROT_WRITE | PROT_EXEC,
                                                  MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    for (size_t i = 0; i < 512; ++i) code_lines[i * 64] = 0xC3;
    code_pages = static_cast<unsigned char*>(mmap(nullptr, kPages * 4096 + 4096, PROT_READ | PROT_WRITE | PROT_EXEC,
                                                  MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    for (size_t i = 0; i < kPages; ++i) code_pages[i * 4096 + (i % 64) * 64] = 0xC3;
  }
  void run(int mode) {
    using Fn = void (*)();
    switch (mode) {
      case 1:
        for (size_t i = 0; i < lines.size(); i += 64) lines[i] = static_cast<unsigned char>(lines[i] + 1);
        break;
      case 2:
        for (size_t i = 0; i < kPages; ++i) pages[i * 4096 + (i % 64) * 64] += 1;
        break;
      case 3:
        for (size_t i = 0; i < 512; ++i) reinterpret_cast<Fn>(code_lines + i * 64)();
        break;
      case 4:
        for (size_t i = 0; i < kPages; ++i) reinterpret_cast<Fn>(code_pages + i * 4096 + (i % 64) * 64)();
        break;
      case 5:
        run(1);
        run(3);
        break;
      case 6:
        run(2);
        run(4);
        break;
      default:
        break;
    }
  }
};

inline std::uint64_t tsc() {
  _mm_lfence();
  const std::uint64_t t = __rdtsc();
  _mm_lfence();
  return t;
}

// TSC ticks per ns, against steady_clock over 200 ms.
double tsc_per_ns() {
  const auto c0 = std::chrono::steady_clock::now();
  const std::uint64_t t0 = __rdtsc();
  while (std::chrono::steady_clock::now() - c0 < std::chrono::milliseconds(200)) {
  }
  const auto c1 = std::chrono::steady_clock::now();
  const std::uint64_t t1 = __rdtsc();
  return static_cast<double>(t1 - t0) / std::chrono::duration<double, std::nano>(c1 - c0).count();
}

// Median ticks of one pair of `a` (nullptr: nothing, the timing's own cost) after pollution `mode`.
double polluted_ticks(Polluter& pol, int mode, CCA::CUDAAllocator* a, size_t size, int n) {
  std::vector<std::uint64_t> t(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    pol.run(mode);
    const std::uint64_t t0 = tsc();
    if (a != nullptr) {
      c10::DataPtr d = a->allocate(size);
    }
    t[static_cast<size_t>(i)] = tsc() - t0;
  }
  std::sort(t.begin(), t.end());
  return static_cast<double>(t[t.size() / 2]);
}

int pollute_table(CCA::CUDAAllocator* native, CCA::CUDAAllocator* cachet) {
  Polluter pol;
  const double per_ns = tsc_per_ns();
  const char* modes[] = {"none",     "L1 data (96 KiB of lines)", "data TLB (4096 pages)", "L1 code (512 lines)",
                         "code TLB (4096 pages)", "L1 data + L1 code", "data TLB + code TLB"};
  const size_t sizes[] = {512, 64 << 20};
  std::printf("\n--pollute: ns of one allocate() + DataPtr drop after evicting one kind of cache, median of "
              "7 rounds of the median of 2000 pairs (TSC %.3f ticks/ns; the timing's own cost subtracted)\n",
              per_ns);
  std::printf("| evicted before each pair | 512 B cachet | native | cachet/native | 64 MiB cachet | native | cachet/native |\n"
              "|---|---|---|---|---|---|---|\n");
  for (int mode = 0; mode < 7; ++mode) {
    double c_ns[2], n_ns[2], r[2];
    for (int si = 0; si < 2; ++si) {
      std::vector<double> cs, ns, rs;
      for (int round = 0; round < 8; ++round) {
        const double base = polluted_ticks(pol, mode, nullptr, 0, 2000);
        CCA::allocator.store(cachet);
        const double c = polluted_ticks(pol, mode, cachet, sizes[si], 2000) - base;
        CCA::allocator.store(native);
        const double n = polluted_ticks(pol, mode, native, sizes[si], 2000) - base;
        if (round == 0) continue;
        cs.push_back(c / per_ns);
        ns.push_back(n / per_ns);
        rs.push_back(c / n);
      }
      c_ns[si] = median(cs);
      n_ns[si] = median(ns);
      r[si] = median(rs);
    }
    std::printf("| %s | %.0f | %.0f | %.2f | %.0f | %.0f | %.2f |\n", modes[mode], c_ns[0], n_ns[0], r[0], c_ns[1],
                n_ns[1], r[1]);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s LIBCACHET_C10 [--json FILE] [--pollute]\n", argv[0]);
    return 2;
  }
  const char* json = nullptr;
  bool pollute = false;
  for (int i = 2; i < argc; ++i) {
    if (std::strcmp(argv[i], "--json") == 0 && i + 1 < argc) {
      json = argv[++i];
    } else if (std::strcmp(argv[i], "--pollute") == 0) {
      pollute = true;
    } else {
      std::fprintf(stderr, "%s: unknown argument %s (usage: %s LIBCACHET_C10 [--json FILE] [--pollute])\n", argv[0],
                   argv[i], argv[0]);
      return 2;
    }
  }
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
  // The allocator's part of torch.empty + free (bench/c10_empty.py measures the whole).
  const std::vector<Pattern> dataptr_patterns = {
      {"allocate() + DataPtr drop, 512 B", {512}},
      {"allocate() + DataPtr drop, 1 MiB", {1 << 20}},
      {"allocate() + DataPtr drop, 64 MiB", {64 << 20}},
  };
  // Interleaved rounds: in each round every pattern runs once through cachet, once through native
  // (both initialised; the atomic is switched between them) and once on cachet's core, so drift of
  // the machine (frequency, neighbours) falls on both sides alike. Round 0 warms up and is
  // dropped; the figures are medians over the other rounds, and the ratio is the median of the
  // per-round ratios.
  const int pairs = 200000;
  const int rounds = 1 + kRounds;
  CCA::allocator.store(native);
  native->init(devices);
  if (pollute) return pollute_table(native, cachet);
  auto core = cachet::CachingAllocator::for_cuda_device(0);
  // Rows: the raw patterns, the 64-live window, the DataPtr patterns.
  const size_t n_rows = patterns.size() + 1 + dataptr_patterns.size();
  auto measure = [&](size_t i) {
    if (i < patterns.size()) return one_pairs(patterns[i], pairs);
    if (i == patterns.size()) return one_window(pairs);
    return one_dataptr(dataptr_patterns[i - patterns.size() - 1], pairs);
  };
  std::vector<std::vector<double>> c_reps(n_rows), n_reps(n_rows), core_reps(n_rows), ratio_reps(n_rows);
  for (int r = 0; r < rounds; ++r) {
    for (size_t i = 0; i < n_rows; ++i) {
      CCA::allocator.store(cachet);
      const double c = measure(i);
      CCA::allocator.store(native);
      const double n = measure(i);
      const double k = i < patterns.size() ? one_core(*core, patterns[i], pairs) : 0.0;
      if (r == 0) continue;
      c_reps[i].push_back(c);
      n_reps[i].push_back(n);
      core_reps[i].push_back(k);
      ratio_reps[i].push_back(c / n);
    }
  }
  std::vector<double> c_ns, n_ns, core_ns, ratio, ratio_lo, ratio_hi;
  for (size_t i = 0; i < n_rows; ++i) {
    c_ns.push_back(median(c_reps[i]));
    n_ns.push_back(median(n_reps[i]));
    if (i < patterns.size()) core_ns.push_back(median(core_reps[i]));
    ratio.push_back(median(ratio_reps[i]));
    ratio_lo.push_back(*std::min_element(ratio_reps[i].begin(), ratio_reps[i].end()));
    ratio_hi.push_back(*std::max_element(ratio_reps[i].begin(), ratio_reps[i].end()));
  }

  std::vector<std::string> names;
  for (const Pattern& p : patterns) names.emplace_back(p.name);
  names.emplace_back("64 live, mixed sizes, per op");
  for (const Pattern& p : dataptr_patterns) names.emplace_back(p.name);
  std::printf("%d interleaved rounds of %d pairs (ops) each\n", kRounds, pairs);
  std::printf("| raw_alloc + raw_delete (unless named) | cachet ns | native ns | cachet/native (median of rounds) | range over rounds | cachet core ns (no adapter) |\n"
              "|---|---|---|---|---|---|\n");
  for (size_t i = 0; i < names.size(); ++i) {
    char core[32] = "—";
    if (i < core_ns.size()) std::snprintf(core, sizeof(core), "%.1f", core_ns[i]);
    std::printf("| %s | %.1f | %.1f | %.2f | %.2f-%.2f | %s |\n", names[i].c_str(), c_ns[i], n_ns[i], ratio[i],
                ratio_lo[i], ratio_hi[i], core);
  }
  // What both sides pay before their own work: raw_alloc asks the current device and its current
  // stream, as native's does.
  {
    volatile int sink = 0;
    const double get_device = per_call([&] {
      c10::DeviceIndex d = 0;
      (void)c10::cuda::GetDevice(&d);
      sink = sink + d;
    });
    const double stream = per_call([&] {
      sink = sink + static_cast<int>(reinterpret_cast<uintptr_t>(c10::cuda::getCurrentCUDAStream(0).stream()) & 1);
    });
    using CtxFn = int (*)(void**);
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult q{};
    double ctx_ns = -1;
    if (cudaGetDriverEntryPointByVersion("cuCtxGetCurrent", &fn, 12000, cudaEnableDefault, &q) == cudaSuccess &&
        q == cudaDriverEntryPointSuccess) {
      auto get = reinterpret_cast<CtxFn>(fn);
      ctx_ns = per_call([&] {
        void* c = nullptr;
        (void)get(&c);
        sink = sink + static_cast<int>(reinterpret_cast<uintptr_t>(c) & 1);
      });
    }
    const double direct = per_call([&] { cachet->raw_delete(cachet->raw_alloc_with_stream(512, nullptr)); }, 200000);
    std::printf("\nper call, both sides alike: c10::cuda::GetDevice %.1f ns, getCurrentCUDAStream(0).stream() %.1f ns;"
                " cuCtxGetCurrent (what cachet's adapter asks instead of GetDevice) %.1f ns;"
                " cachet raw_alloc_with_stream + raw_delete of 512 B (virtual, no lookups but GetDevice) %.1f ns\n",
                get_device, stream, ctx_ns, direct);
  }
  if (json != nullptr) {
    FILE* f = std::fopen(json, "w");
    if (f != nullptr) {
      std::fprintf(f, "[");
      for (size_t i = 0; i < names.size(); ++i)
        std::fprintf(f, "%s{\"pattern\": \"%s\", \"cachet_ns\": %.2f, \"native_ns\": %.2f, \"ratio\": %.4f, \"ratio_min\": %.4f, \"ratio_max\": %.4f}",
                     i ? ", " : "", names[i].c_str(), c_ns[i], n_ns[i], ratio[i], ratio_lo[i], ratio_hi[i]);
      std::fprintf(f, "]\n");
      std::fclose(f);
    }
  }
  return 0;
}

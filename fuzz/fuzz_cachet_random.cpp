// fuzz_cachet_random: a random campaign over the fuzz_cachet_policy interpreter without
// libFuzzer (builds with g++ in the default tree).
//
//   fuzz_cachet_random [--seconds N] [--seed S] [--max-len L] [--cases N] [--artifacts DIR]
//       random inputs for N seconds (default 10); on a failed check writes the input to
//       DIR/crash-cachet-<seed>-<case> (default: .), prints the report and exits 1.
//   fuzz_cachet_random --replay FILE   runs one input (a crash, a seed); exit 0 when it passes;
//       CACHET_FUZZ_SHOW_OPS=1 prints the case file (cachet/ops.h) of the operations it decoded
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "src/cachet_interp.h"

int main(int argc, char** argv) {
  double seconds = 10;
  std::uint64_t seed = 1;
  std::size_t max_len = 4096;
  std::uint64_t max_cases = 0;  // --cases: stop after this many cases (0: none; the time still bounds)
  std::string artifacts = ".";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--seconds") seconds = std::stod(v);
    else if (a == "--seed") seed = std::stoull(v);
    else if (a == "--max-len") max_len = std::stoull(v);
    else if (a == "--cases") max_cases = std::stoull(v);
    else if (a == "--artifacts") artifacts = v;
    else if (a == "--replay") {
      std::ifstream in(v, std::ios::binary);
      if (!in) {
        std::cerr << "fuzz_cachet_random: cannot read " << v << "\n";
        return 2;
      }
      const std::string bytes{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
      std::string ops;
      const std::string r =
          cachet::fuzz::run_cachet_bytes(reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size(), &ops);
      if (r.empty() && std::getenv("CACHET_FUZZ_SHOW_OPS")) std::cerr << ops;
      std::cerr << r;
      std::cout << v << ": " << (r.empty() ? "passes" : "FAILS") << "\n";
      return r.empty() ? 0 : 1;
    } else {
      std::cerr << "usage: fuzz_cachet_random [--seconds N] [--seed S] [--max-len L] [--cases N] [--artifacts DIR] | --replay FILE\n";
      return 2;
    }
  }
  std::mt19937_64 rng(seed);
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + std::chrono::duration<double>(seconds);
  std::uint64_t cases = 0;
  std::vector<std::uint8_t> buf;
  while (std::chrono::steady_clock::now() < deadline && (max_cases == 0 || cases < max_cases)) {
    buf.resize(1 + rng() % max_len);
    for (auto& b : buf) b = static_cast<std::uint8_t>(rng());
    const std::string r = cachet::fuzz::run_cachet_bytes(buf.data(), buf.size());
    ++cases;
    if (!r.empty()) {
      const std::string path = artifacts + "/crash-cachet-" + std::to_string(seed) + "-" + std::to_string(cases);
      std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(buf.data()),
                                                  static_cast<std::streamsize>(buf.size()));
      std::cerr << r << "input written to " << path << "\n";
      return 1;
    }
  }
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("fuzz_cachet_random: seed %llu, %llu cases (%.0f cases/s) in %.1f s, no failed check\n%s\n",
              static_cast<unsigned long long>(seed), static_cast<unsigned long long>(cases),
              static_cast<double>(cases) / took, took, cachet::fuzz::show_cachet_mix().c_str());
  return 0;
}

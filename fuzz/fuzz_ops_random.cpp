// fuzz_ops_random: a random campaign over the fuzz_ops interpreter without libFuzzer (builds
// with g++ in the default tree). Random byte strings go through the same entry as fuzz_ops.
//
//   fuzz_ops_random [--seconds N] [--seed S] [--max-len L] [--cases N] [--artifacts DIR]
//       runs random cases for N seconds (default 10); on a divergence writes the input to
//       DIR/crash-random-<seed>-<case> (default: .), prints the report and exits 1.
//   fuzz_ops_random --decode FILE     prints FILE (any fuzz_ops input) as a replayable .ops case
//   fuzz_ops_random --replay FILE.ops replays a .ops case; exit 0 when both sides agree
// CACHET_FUZZ_CONFIG fixes the configuration as in fuzz_ops.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <iterator>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "src/ops_interp.h"

namespace {

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::cerr << "fuzz_ops_random: cannot read " << path << "\n";
    std::exit(2);
  }
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

int usage() {
  std::cerr << "usage: fuzz_ops_random [--seconds N] [--seed S] [--max-len L] [--cases N] [--artifacts DIR]\n"
               "       fuzz_ops_random --decode FILE | --replay FILE.ops\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  double seconds = 10;
  std::uint64_t seed = 1;
  std::size_t max_len = 4096;
  std::uint64_t max_cases = 0;  // --cases: stop after this many cases (0: none; the time still bounds)
  std::string artifacts = ".";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) return usage();
    const std::string v = argv[++i];
    if (a == "--seconds") seconds = std::stod(v);
    else if (a == "--seed") seed = std::stoull(v);
    else if (a == "--max-len") max_len = std::stoull(v);
    else if (a == "--cases") max_cases = std::stoull(v);
    else if (a == "--artifacts") artifacts = v;
    else if (a == "--decode") {
      const std::string bytes = slurp(v);
      cachet::fuzz::Case c;
      const std::string r = cachet::fuzz::run_bytes(reinterpret_cast<const std::uint8_t*>(bytes.data()),
                                                    bytes.size(), &c);
      std::cout << cachet::fuzz::to_ops_file(c);
      if (const char* out = std::getenv("CACHET_FUZZ_OPS_OUT")) std::ofstream(out) << cachet::fuzz::to_ops_file(c);
      if (!r.empty()) std::cerr << r;
      return r.empty() ? 0 : 1;
    } else if (a == "--replay") {
      const std::string r = cachet::fuzz::run_case(cachet::fuzz::parse_ops_file(slurp(v)));
      if (!r.empty()) std::cerr << r << "\n";
      std::cout << v << ": " << (r.empty() ? "both sides agree" : "DIVERGES") << "\n";
      return r.empty() ? 0 : 1;
    } else {
      return usage();
    }
  }
  std::mt19937_64 rng(seed);
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + std::chrono::duration<double>(seconds);
  std::uint64_t cases = 0, bytes_total = 0;
  std::vector<std::uint8_t> buf;
  while (std::chrono::steady_clock::now() < deadline && (max_cases == 0 || cases < max_cases)) {
    buf.resize(1 + rng() % max_len);
    for (auto& b : buf) b = static_cast<std::uint8_t>(rng());
    bytes_total += buf.size();
    const std::string r = cachet::fuzz::run_bytes(buf.data(), buf.size());
    ++cases;
    if (!r.empty()) {
      const std::string path = artifacts + "/crash-random-" + std::to_string(seed) + "-" + std::to_string(cases);
      std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(buf.data()),
                                                  static_cast<std::streamsize>(buf.size()));
      std::cerr << r << "input written to " << path << "\n" << cachet::fuzz::show_mix() << "\n";
      return 1;
    }
  }
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("fuzz_ops_random: seed %llu, %llu cases (%.0f cases/s, %llu bytes) in %.1f s, no divergence\n%s\n",
              static_cast<unsigned long long>(seed), static_cast<unsigned long long>(cases),
              static_cast<double>(cases) / took, static_cast<unsigned long long>(bytes_total), took,
              cachet::fuzz::show_mix().c_str());
  return 0;
}

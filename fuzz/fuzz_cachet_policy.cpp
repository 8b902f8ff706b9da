// fuzz_cachet_policy: bytes become a configuration (capacity, cap or not, 1-3 streams) and up to
// 600 operations on policy:cachet in validate mode (invariants after every operation), in
// lockstep with model::CachetPolicy and checked from outside (fuzz/src/cachet_interp.h). Any
// failed check aborts with the case file of the operations executed. The mix of operations is
// printed at exit.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "src/cachet_interp.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  std::atexit([] { std::fprintf(stderr, "%s\n", cachet::fuzz::show_cachet_mix().c_str()); });
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string r = cachet::fuzz::run_cachet_bytes(data, size);
  if (!r.empty()) {
    std::fprintf(stderr, "%s", r.c_str());
    std::abort();
  }
  return 0;
}

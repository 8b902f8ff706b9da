// fuzz_ops: bytes become a configuration and an op sequence run through the model and the
// production allocator in lockstep (fuzz/src/ops_interp.h); any divergence or broken invariant
// aborts with the configuration and the ops as replayable lines. The mix of ops executed is
// printed at exit.
#include <cstddef>
#include <cstdint>

#include "src/ops_interp.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  cachet::fuzz::print_mix_at_exit();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  cachet::fuzz::run_or_abort(data, size);
  return 0;
}

// The fuzz_cachet_policy interpreter (fuzz/README.md, "The fuzz_cachet_policy byte format"):
// bytes become a configuration and up to 600 operations on policy:cachet (host backend,
// validate mode: CachetPolicy::invariants() after every operation), with checks from outside
// (no model: the cachet policy's reference model is not used here). Shared by the libFuzzer
// target fuzz_cachet_policy and the g++-buildable fuzz_cachet_random.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace cachet::fuzz {

// Runs one input; returns "" when every check held, else a report: the failed check, the
// configuration and the operations executed, one per line (also in *ops when given).
std::string run_cachet_bytes(const std::uint8_t* data, std::size_t size, std::string* ops = nullptr);

// The mix of operations executed so far (all inputs), one line.
std::string show_cachet_mix();

}  // namespace cachet::fuzz

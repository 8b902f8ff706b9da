// The fuzz_cachet_policy interpreter (fuzz/README.md, "The fuzz_cachet_policy byte format"):
// bytes become a configuration and up to 600 operations on policy:cachet (host backend,
// validate mode: CachetPolicy::invariants() after every operation), run against the policy's
// reference model model::CachetPolicy through the lockstep harness (cachet/lockstep.h
// CachetLockstep: the same checks as fuzz_ops), with checks from outside on top. Shared by the
// libFuzzer target fuzz_cachet_policy and the g++-buildable fuzz_cachet_random.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace cachet::fuzz {

// Runs one input; returns "" when every check held, else a report: the failed check and the
// case file of the operations executed (cachet/ops.h show_case; also in *ops when given), which
// props_test --replay and fuzz_ops_random --replay replay.
std::string run_cachet_bytes(const std::uint8_t* data, std::size_t size, std::string* ops = nullptr);

// The mix of operations executed so far (all inputs), one line.
std::string show_cachet_mix();

}  // namespace cachet::fuzz

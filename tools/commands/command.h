// tools/command.h: how a `cachet` subcommand plugs into the command line. Each subcommand lives
// in its own cmd_<name>.cpp, compiled into the `cachet` executable, and registers itself:
//
//   static const bool registered = cachet::cli::register_command(
//       {"conform", "Replay an oracle recording and compare with what PyTorch did", setup});
//
// setup(sub) declares the subcommand's options on `sub` and returns the function that runs it
// (called only when that subcommand was given); its return value is the exit code.
// Exit codes across cachet: 0 success, 1 a check failed (mismatch, divergence), 2 bad input
// (usage, unreadable file, invalid configuration).
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <string>
#include <vector>

namespace cachet::cli {

using Runner = std::function<int()>;

struct Command {
  std::string name;
  std::string help;
  std::function<Runner(CLI::App& sub)> setup;
};

bool register_command(Command c);

// The arguments after the command line's first `--`, with that `--` first (empty when there is
// none): a program the subcommand runs (`cachet predict ... -- train.py --batch-size 8`).
const std::vector<std::string>& trailing_args();
std::vector<std::string>& trailing_args_storage();

inline constexpr int kExitOk = 0;
inline constexpr int kExitCheckFailed = 1;
inline constexpr int kExitBadInput = 2;

// The help of --device-memory, one text for every command that replays (where the value comes
// from when the option is absent: tools/replay/src/load.cpp load_trace).
inline constexpr const char* kDeviceMemoryHelp =
    "the device's memory (bytes, or with a suffix K/M/G/T). Default: recorded beside the trace, "
    "else from its out-of-memory entry, else no device limit (said)";

// The help of --fraction, one text for every command that takes --cap (fraction_to_cap turns it
// into the cap).
inline constexpr const char* kFractionHelp =
    "the cap as set_per_process_memory_fraction(F) sets it: F x the device memory (--device-memory, or "
    "from the trace); not with --cap";

// The help of --conf on tune, explain and report (trace_input.h, start_from_conf).
inline constexpr const char* kStartConfHelp =
    "start from this configuration in place of the recorded one (PYTORCH_CUDA_ALLOC_CONF syntax, or "
    "policy:cachet): the verdict is for it, changes are counted from it. These commands have no --policy: "
    "--conf policy:cachet starts from cachet's policy";

}  // namespace cachet::cli

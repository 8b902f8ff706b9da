// The `cachet` command: subcommands register themselves (see command.h).
#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "command.h"

namespace cachet::cli {

static std::vector<Command>& registry() {
  static std::vector<Command> commands;
  return commands;
}

std::vector<std::string>& trailing_args_storage() {
  static std::vector<std::string> args;
  return args;
}
const std::vector<std::string>& trailing_args() { return trailing_args_storage(); }

bool register_command(Command c) {
  registry().push_back(std::move(c));
  return true;
}

// Edit distance, for "did you mean".
static std::size_t distance(const std::string& a, const std::string& b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diag = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

// The message for a missing or unknown command (nullopt: argv names a command, or a flag that
// CLI11 handles). The commands are listed, and the nearest one suggested when it is near.
static std::optional<std::string> command_problem(int argc, char** argv, const std::vector<Command>& commands) {
  std::string list;
  for (const auto& c : commands) list += (list.empty() ? "" : ", ") + c.name;
  const std::string tail = "commands: " + list + " (cachet --help says what each does)";
  if (argc < 2) return "cachet: a command is required; " + tail;
  const std::string given = argv[1];
  if (given.empty() || given[0] == '-') return std::nullopt;
  const Command* nearest = nullptr;
  std::size_t best = SIZE_MAX;
  for (const auto& c : commands) {
    if (c.name == given) return std::nullopt;
    std::size_t d = distance(given, c.name);
    if (given.size() >= 3 && c.name.find(given) != std::string::npos) d = std::min<std::size_t>(d, 1);
    if (d < best) best = d, nearest = &c;
  }
  std::string msg = "cachet: unknown command '" + given + "'";
  if (nearest && best <= std::max<std::size_t>(2, given.size() / 3))
    msg += "; did you mean '" + nearest->name + "'?";
  else
    msg += ".";
  return msg + " The " + tail;
}

}  // namespace cachet::cli

int main(int argc, char** argv) {
  using namespace cachet::cli;
  CLI::App app{
      "cachet: PyTorch 2.11's CUDA caching allocator, modelled, verified and replayable.\n"
      "Replay memory traces, check configurations, conform against recordings."};
  app.require_subcommand(1);
  app.footer(
      "Exit codes: 0 success; 1 a check failed (conform: a mismatch, an engine disagreement); 2 bad input "
      "(usage, an unreadable file, an invalid configuration or size).\n"
      "Sizes (--cap, --device-memory) are bytes or take K, M, G, T (or KiB, MiB, GiB, TiB), powers of 1024; "
      "KB, MB, GB, TB and sizes under 1 MiB are refused.");
  app.set_version_flag("--version", "cachet 0.1.0");
  auto& commands = registry();
  std::sort(commands.begin(), commands.end(),
            [](const Command& a, const Command& b) { return a.name < b.name; });
  // `cachet help [COMMAND]` is `cachet [COMMAND] --help`.
  std::vector<char*> args(argv, argv + argc);
  static char help_flag[] = "--help";
  if (argc >= 2 && std::string_view(argv[1]) == "help") {
    args.erase(args.begin() + 1);
    args.push_back(help_flag);
    argc = static_cast<int>(args.size());
    argv = args.data();
  }
  if (auto problem = command_problem(argc, argv, commands)) {
    std::fprintf(stderr, "%s\n", problem->c_str());
    return kExitBadInput;
  }
  std::vector<std::pair<CLI::App*, Runner>> subs;
  for (auto& c : commands) {
    CLI::App* sub = app.add_subcommand(c.name, c.help);
    subs.emplace_back(sub, c.setup(*sub));
  }
  // Arguments after the first `--` belong to the subcommand's program (`cachet predict ... --
  // train.py --batch-size 8`): they are kept from CLI11, which would read them as cachet's.
  // Only `predict` runs a program; every other command reads `--` as CLI11 does.
  for (int i = 2; argc > 1 && std::string_view(argv[1]) == "predict" && i < argc; ++i) {
    if (std::string_view(argv[i]) != "--") continue;
    for (int j = i + 1; j < argc; ++j) trailing_args_storage().emplace_back(argv[j]);
    trailing_args_storage().insert(trailing_args_storage().begin(), "--");
    argc = i;
    break;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return kExitBadInput;
  }
  for (auto& [sub, run] : subs) {
    if (sub->parsed()) {
      int rc = kExitBadInput;
      try {
        rc = run();
      } catch (const std::exception& e) {
        std::fprintf(stderr, "cachet %s: %s\n", sub->get_name().c_str(), e.what());
        return kExitBadInput;
      }
      // Output that could not be written (a full disk, a closed pipe) is not a success.
      errno = 0;
      const bool flush_failed = std::fflush(stdout) != 0;
      if (flush_failed || std::ferror(stdout)) {
        std::fprintf(stderr, "cachet %s: cannot write the output: %s\n", sub->get_name().c_str(),
                     flush_failed && errno ? std::strerror(errno)
                                           : "a write to stdout failed (a full disk, or a closed pipe?)");
        return kExitBadInput;
      }
      return rc;
    }
  }
  return kExitBadInput;
}

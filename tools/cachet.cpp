// The `cachet` command: subcommands register themselves (see command.h).
#include <algorithm>
#include <cstdio>
#include <exception>
#include <vector>

#include "command.h"

namespace cachet::cli {

static std::vector<Command>& registry() {
  static std::vector<Command> commands;
  return commands;
}

bool register_command(Command c) {
  registry().push_back(std::move(c));
  return true;
}

}  // namespace cachet::cli

int main(int argc, char** argv) {
  using namespace cachet::cli;
  CLI::App app{
      "cachet: PyTorch 2.11's CUDA caching allocator, modelled, verified and replayable.\n"
      "Replay memory traces, check configurations, conform against recordings."};
  app.require_subcommand(1);
  app.set_version_flag("--version", "cachet 0.1.0");
  auto& commands = registry();
  std::sort(commands.begin(), commands.end(),
            [](const Command& a, const Command& b) { return a.name < b.name; });
  std::vector<std::pair<CLI::App*, Runner>> subs;
  for (auto& c : commands) {
    CLI::App* sub = app.add_subcommand(c.name, c.help);
    subs.emplace_back(sub, c.setup(*sub));
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
      try {
        return run();
      } catch (const std::exception& e) {
        std::fprintf(stderr, "cachet %s: %s\n", sub->get_name().c_str(), e.what());
        return kExitBadInput;
      }
    }
  }
  return kExitBadInput;
}

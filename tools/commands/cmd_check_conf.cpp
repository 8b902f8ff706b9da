// cachet check-conf STRING (one string) | --list: validates an allocator configuration string the way PyTorch 2.11
// reads it, with cachet's clearer errors (docs/configuration.md).
//
//   exit 0  stdout: exactly one line, the normalized configuration in canonical PyTorch syntax
//           (it parses back to the same configuration); stderr: one "warning:" line per warning.
//   exit 2  stderr: the error, then the string with a caret under the offending column.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "cachet/config.h"
#include "cachet/errors.h"
#include "command.h"

#if __has_include("cachet/replay/tune.h")
#include "cachet/replay/tune.h"
#endif

namespace {

// The input with a caret under 1-based `column` (tabs kept so the caret lines up).
void print_caret(const std::string& text, std::size_t column) {
  std::fprintf(stderr, "  %s\n  ", text.c_str());
  for (std::size_t i = 0; i + 1 < column && i < text.size(); ++i) {
    std::fputc(text[i] == '\t' ? '\t' : ' ', stderr);
  }
  std::fputs("^\n", stderr);
}

// `cachet check-conf --list`: every key, the values it takes and what it does.
void print_keys() {
  for (const auto& k : cachet::config_keys()) {
    std::printf("%.*s%s\n    values: %.*s\n    %.*s\n", static_cast<int>(k.name.size()), k.name.data(),
                k.cachet_only ? "  (CACHET_ALLOC_CONF only: cachet's plug-in; PyTorch rejects it)" : "",
                static_cast<int>(k.values.size()), k.values.data(), static_cast<int>(k.meaning.size()),
                k.meaning.data());
  }
}

cachet::cli::Runner setup(CLI::App& sub) {
  struct Options {
    std::string text;
    bool given = false;
    bool list = false;
    std::string source = "pytorch";
  };
  auto opts = std::make_shared<Options>();
  // One string; more arguments (a string split by the shell) are caught below, not by CLI11.
  sub.add_option("STRING", opts->text,
                 "The configuration, one string: the value of PYTORCH_CUDA_ALLOC_CONF (quote it)");
  sub.allow_extras();
  sub.add_flag("--list", opts->list, "List every key, the values it takes and what it does");
  sub.add_option("--source", opts->source,
                 "Where the string comes from: pytorch (PYTORCH_CUDA_ALLOC_CONF / "
                 "PYTORCH_ALLOC_CONF: PyTorch's keys only) or cachet (CACHET_ALLOC_CONF: also "
                 "policy, cachet_validate and cachet_sleep)")
      ->check(CLI::IsMember({"pytorch", "cachet"}))
      ->capture_default_str();
  sub.footer(
      "Exit status: 0 valid (the normalized string on stdout), 2 invalid (the error on stderr).");
  CLI::App* app = &sub;
  return [opts, app]() -> int {
    if (opts->list) {
      print_keys();
      return cachet::cli::kExitOk;
    }
    std::vector<std::string> texts;
    if (app->count("STRING") > 0) texts.push_back(opts->text);
    for (const auto& x : app->remaining()) texts.push_back(x);  // a string split by the shell
    if (texts.empty()) {
      std::fprintf(stderr, "error: check-conf takes one string, the configuration (quote it): cachet check-conf "
                           "'max_split_size_mb:128'; cachet check-conf --list lists the keys\n");
      return cachet::cli::kExitBadInput;
    }
    // Options split by the shell (unquoted spaces, or ',' written as ' '): one string is checked.
    if (texts.size() > 1) {
      std::string joined;
      for (std::string t : texts) {  // "a:1," "b:2": one ',' between, none doubled
        while (!t.empty() && t.back() == ',') t.pop_back();
        while (!t.empty() && t.front() == ',') t.erase(t.begin());
        if (!t.empty()) joined += (joined.empty() ? "" : ",") + t;
      }
      std::fprintf(stderr,
                   "error: check-conf takes one string, got %zu arguments; quote the string, with its options "
                   "separated by ',': cachet check-conf '%s'\n",
                   texts.size(), joined.c_str());
      return cachet::cli::kExitBadInput;
    }
    opts->text = texts.front();
    const auto source =
        opts->source == "cachet" ? cachet::ConfigSource::Cachet : cachet::ConfigSource::PyTorch;
    try {
      const cachet::ParseResult r = cachet::parse_config(opts->text, source);
      for (const auto& w : r.warnings) {
        if (w.column > 0) {
          std::fprintf(stderr, "warning: column %zu: %s\n", w.column, w.message.c_str());
        } else {
          std::fprintf(stderr, "warning: %s\n", w.message.c_str());
        }
      }
#if __has_include("cachet/replay/tune.h")
      // policy:cachet leaves the PyTorch policy's keys unused (cachet replay says it too).
      if (r.config.policy == cachet::Policy::Cachet)
        if (const auto ignored = cachet::replay::keys_policy_cachet_ignores(r.config); !ignored.empty()) {
          std::string list;
          for (const auto& k : ignored) list += (list.empty() ? "" : ", ") + k;
          std::fprintf(stderr, "warning: policy:cachet does not use %s: %s no effect under it\n", list.c_str(),
                       ignored.size() == 1 ? "it has" : "they have");
        }
#endif
      const std::string canonical = cachet::to_string(r.config);
      std::printf("%s\n", canonical.c_str());
      // The canonical form of PyTorch's defaults is empty: stdout stays that (an empty line), and
      // stderr says what it means.
      if (canonical.empty()) std::fprintf(stderr, "(default: PyTorch's defaults)\n");
      return cachet::cli::kExitOk;
    } catch (const cachet::ConfigError& e) {
      std::fprintf(stderr, "error: %s\n", e.what());
      if (e.column() > 0) print_caret(opts->text, e.column());
      return cachet::cli::kExitBadInput;
    }
  };
}

const bool registered = cachet::cli::register_command(
    {"check-conf",
     "Check an allocator configuration string (PYTORCH_CUDA_ALLOC_CONF syntax) and print it "
     "normalized",
     setup});

}  // namespace

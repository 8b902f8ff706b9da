// cachet check-conf STRING: validates an allocator configuration string the way PyTorch 2.11
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

cachet::cli::Runner setup(CLI::App& sub) {
  struct Options {
    std::vector<std::string> texts;
    std::string text;
    std::string source = "pytorch";
  };
  auto opts = std::make_shared<Options>();
  sub.add_option("STRING", opts->texts,
                 "The configuration, e.g. the value of PYTORCH_CUDA_ALLOC_CONF (quote it)")
      ->required();
  sub.add_option("--source", opts->source,
                 "Where the string comes from: pytorch (PYTORCH_CUDA_ALLOC_CONF / "
                 "PYTORCH_ALLOC_CONF: PyTorch's keys only) or cachet (CACHET_ALLOC_CONF: also "
                 "policy, cachet_validate and cachet_sleep)")
      ->check(CLI::IsMember({"pytorch", "cachet"}))
      ->capture_default_str();
  sub.footer(
      "Exit status: 0 valid (the normalized string on stdout), 2 invalid (the error on stderr).");
  return [opts]() -> int {
    // Options split by the shell (unquoted spaces, or ',' written as ' '): one string is checked.
    if (opts->texts.size() > 1) {
      std::string joined;
      for (std::string t : opts->texts) {  // "a:1," "b:2": one ',' between, none doubled
        while (!t.empty() && t.back() == ',') t.pop_back();
        while (!t.empty() && t.front() == ',') t.erase(t.begin());
        if (!t.empty()) joined += (joined.empty() ? "" : ",") + t;
      }
      std::fprintf(stderr,
                   "error: check-conf takes one string, got %zu arguments; quote the string, with its options "
                   "separated by ',': cachet check-conf '%s'\n",
                   opts->texts.size(), joined.c_str());
      return cachet::cli::kExitBadInput;
    }
    opts->text = opts->texts.front();
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
      std::printf("%s\n", cachet::to_string(r.config).c_str());
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

// fuzz_config: any string is given to the configuration parser, as CACHET_ALLOC_CONF and as
// PYTORCH_CUDA_ALLOC_CONF. Parsing never crashes; an error is a ConfigError whose message names
// what was wrong and whose column lies inside the input; every accepted string round-trips
// through to_string() and parse_config() to the same configuration.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "cachet/config.h"
#include "cachet/errors.h"

namespace {

[[noreturn]] void fail(std::string_view input, const std::string& what) {
  std::fprintf(stderr, "fuzz_config: %s\n  input: \"%.*s\"\n", what.c_str(),
               static_cast<int>(input.size()), input.data());
  std::abort();
}

void check(std::string_view input, cachet::ConfigSource source) {
  cachet::ParseResult r;
  try {
    r = cachet::parse_config(input, source);
  } catch (const cachet::ConfigError& e) {
    if (std::string_view(e.what()).empty()) fail(input, "ConfigError with an empty message");
    if (e.column() > input.size() + 1)
      fail(input, "ConfigError column " + std::to_string(e.column()) + " beyond the input");
    return;
  }
  const std::string canonical = cachet::to_string(r.config);
  cachet::ParseResult again;
  try {
    again = cachet::parse_config(canonical, source);
  } catch (const cachet::ConfigError& e) {
    fail(input, "canonical form \"" + canonical + "\" does not parse back: " + e.what());
  }
  if (!(again.config == r.config))
    fail(input, "canonical form \"" + canonical + "\" parses to a different configuration");
  if (cachet::to_string(again.config) != canonical)
    fail(input, "canonical form is not stable: \"" + canonical + "\" -> \"" +
                    cachet::to_string(again.config) + "\"");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::string_view input(reinterpret_cast<const char*>(data), size);
  check(input, cachet::ConfigSource::Cachet);
  check(input, cachet::ConfigSource::PyTorch);
  return 0;
}

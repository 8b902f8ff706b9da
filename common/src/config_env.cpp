// config_env.cpp: config_from_environment, the configuration from CACHET_ALLOC_CONF, else
// PYTORCH_CUDA_ALLOC_CONF, else PYTORCH_ALLOC_CONF (PyTorch 2.11's precedence,
// docs/pytorch-allocator.md §4.1), and PYTORCH_NO_CUDA_MEMORY_CACHING; errors name the variable.
#include <cstdlib>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "cachet/config.h"
#include "cachet/errors.h"

namespace cachet {

EnvConfig config_from_environment() {
  EnvConfig env;
  struct Variable {
    const char* name;
    ConfigSource source;
  };
  // 2.11's precedence: the CUDA variable wins over the generic one (§4.1).
  constexpr Variable kVariables[] = {{"CACHET_ALLOC_CONF", ConfigSource::Cachet},
                                     {"PYTORCH_CUDA_ALLOC_CONF", ConfigSource::PyTorch},
                                     {"PYTORCH_ALLOC_CONF", ConfigSource::PyTorch}};
  for (const Variable& v : kVariables) {
    const char* value = std::getenv(v.name);
    if (value == nullptr) continue;  // set but empty counts as set, as in PyTorch
    env.variable = v.name;
    env.text = value;
    try {
      env.parsed = parse_config(env.text, v.source);
    } catch (const ConfigError& e) {
      throw ConfigError(fmt::format("{}={}: {}", v.name, env.text, e.what()), e.key(), e.text(),
                        e.column());
    }
    break;
  }
  if (const char* nc = std::getenv("PYTORCH_NO_CUDA_MEMORY_CACHING")) {
    const std::string_view s = nc;
    if (s == "1") {
      env.parsed.config.no_caching = true;
    } else if (s != "0") {
      throw ConfigError(
          fmt::format("PYTORCH_NO_CUDA_MEMORY_CACHING={}: expected 1 (no caching) or 0 (caching); "
                      "PyTorch ignores other values with a warning",
                      s),
          "PYTORCH_NO_CUDA_MEMORY_CACHING", std::string(s), 1);
    }
  }
  return env;
}

}  // namespace cachet

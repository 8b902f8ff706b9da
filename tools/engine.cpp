// The engine registry (engine.h): engines by name, each registered by its own file at
// static-initialisation time (engine_model.cpp, engine_gpu.cpp, conform_cachet.cpp). The map is a
// function-local static, so a registration never runs before the map exists.
#include <map>
#include <string>
#include <utility>

#include "engine.h"

namespace cachet::cli {

static std::map<std::string, EngineFactory>& engines() {
  static std::map<std::string, EngineFactory> registry;
  return registry;
}

bool register_engine(const std::string& name, EngineFactory factory) {
  engines()[name] = std::move(factory);
  return true;
}

const EngineFactory* find_engine(const std::string& name) {
  auto it = engines().find(name);
  return it == engines().end() ? nullptr : &it->second;
}

}  // namespace cachet::cli

// tools/trace_input.h: what `cachet summary` and `cachet plot` share: read TRACE, take
// --device-memory and --conf, and decide whether the recorded addresses apply (only when the
// configuration is the recorded one). Errors are printed as "cachet <cmd>: ..." and give nullopt
// (the caller exits 2).
#pragma once

#include <cstdio>
#include <optional>
#include <string>

#include "cachet/config.h"
#include "cachet/errors.h"
#include "cachet/io/file.h"
#include "cachet/replay/replay.h"

namespace cachet::cli {

struct TraceInput {
  replay::LoadedTrace loaded;
  Config config;          // --conf, or the recorded configuration
  bool recorded = true;   // config is the recorded one: replay with the recorded addresses
};

inline std::optional<TraceInput> load_trace_input(const char* cmd, const std::string& path,
                                                  const std::optional<std::string>& conf,
                                                  const std::string& device_memory) {
  std::optional<Bytes> mem;
  if (!device_memory.empty() && (!(mem = replay::parse_bytes(device_memory)) || *mem == 0)) {
    std::fprintf(stderr, "cachet %s: --device-memory: not a size: '%s'\n", cmd, device_memory.c_str());
    return std::nullopt;
  }
  TraceInput in;
  try {
    in.loaded = replay::load_trace(path, mem);
  } catch (const io::ReadError& e) {
    std::fprintf(stderr, "cachet %s: %s\n", cmd, e.what());
    return std::nullopt;
  }
  if (!in.loaded.device_note.empty()) std::fprintf(stderr, "cachet %s: %s\n", cmd, in.loaded.device_note.c_str());
  if (!conf && !in.loaded.config_note.empty()) std::fprintf(stderr, "cachet %s: %s\n", cmd, in.loaded.config_note.c_str());
  in.config = in.loaded.run.config;
  if (conf) {
    try {
      in.config = parse_config(*conf, ConfigSource::Cachet).config;
    } catch (const ConfigError& e) {
      std::fprintf(stderr, "cachet %s: --conf '%s': %s\n", cmd, conf->c_str(), e.what());
      return std::nullopt;
    }
    in.recorded = in.config == in.loaded.run.config;
  }
  return in;
}

}  // namespace cachet::cli

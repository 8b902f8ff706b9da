// tools/explain_input.h: what `cachet explain` and `cachet report` share: TRACE read with
// --cap and --device-memory (load_trace: the cap decides which segment releases were the
// allocator's own; a trace that shows a cap but was given none is refused), and the stack frames
// of its events. Errors are
// printed as "cachet <cmd>: ..." and give nullopt (the caller exits 2).
#pragma once

#include "trace_input.h"

#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "cachet/io/file.h"
#include "cachet/io/frames.h"
#include "cachet/replay/replay.h"
#include "cachet/replay/report.h"

namespace cachet::cli {

struct ExplainInput {
  replay::LoadedTrace loaded;
  std::vector<std::vector<io::Frame>> frames;
  replay::ReplayOptions options;  // the recorded run: device memory, cap, recorded addresses
};

// `conf` (--conf): the configuration to start from in place of the recorded one (start_from_conf).
inline std::optional<ExplainInput> load_explain_input(const char* cmd, const std::string& path, const std::string& cap_text,
                                                      const std::string& device_memory, unsigned threads,
                                                      const std::optional<std::string>& conf = std::nullopt) {
  using namespace cachet::replay;
  std::optional<Bytes> mem, cap;
  if (!size_option(cmd, "--device-memory", device_memory, mem) || !size_option(cmd, "--cap", cap_text, cap))
    return std::nullopt;
  if (threads == 0) {
    std::fprintf(stderr, "cachet %s: --threads 0: give at least 1 worker thread\n", cmd);
    return std::nullopt;
  }
  ExplainInput in;
  try {
    LoadOptions lo;
    lo.device_memory = mem;
    lo.cap = cap;
    in.loaded = load_trace(path, lo);
    const LoadedTrace& lt = in.loaded;
    in.frames = io::read_event_frames(path, lt.device);
  } catch (const io::ReadError& e) {
    std::fprintf(stderr, "cachet %s: %s\n", cmd, e.what());
    return std::nullopt;
  }
  if (!in.loaded.device_note.empty()) std::fprintf(stderr, "cachet %s: %s\n", cmd, in.loaded.device_note.c_str());
  if (!in.loaded.config_note.empty()) std::fprintf(stderr, "cachet %s: %s\n", cmd, in.loaded.config_note.c_str());
  if (const std::string err = missing_cap_error(in.loaded); !err.empty()) {
    std::fprintf(stderr, "cachet %s: %s\n", cmd, err.c_str());
    return std::nullopt;
  }
  if (!cap_fits(cmd, in.loaded, cap_text, cap)) return std::nullopt;
  in.options = recorded_options(in.loaded, AddressMode::Recorded);
  if (!start_from_conf(cmd, conf, in.loaded, &in.options)) return std::nullopt;
  if (in.options.cap && in.options.cap >= in.options.device_memory) {
    std::fprintf(stderr, "cachet %s: --cap %s is not below the device memory (%s): give a smaller cap or --device-memory\n",
                 cmd, human_bytes(static_cast<std::int64_t>(in.options.cap)).c_str(),
                 human_bytes(static_cast<std::int64_t>(in.options.device_memory)).c_str());
    return std::nullopt;
  }
  return in;
}

}  // namespace cachet::cli

// tools/trace_input.h: what `cachet summary` and `cachet plot` share: read TRACE, take
// --device-memory, --cap and --conf, and decide whether the recorded addresses apply (only when the
// configuration is the recorded one). Errors are printed as "cachet <cmd>: ..." and give nullopt
// (the caller exits 2).
#pragma once

#include <cstdio>
#include <cstdlib>
#include <limits>
#include <optional>
#include <string>
#include <string_view>

#include "cachet/config.h"
#include "cachet/errors.h"
#include "cachet/io/file.h"
#include "cachet/replay/replay.h"
#include "cachet/replay/report.h"

namespace cachet::cli {

struct TraceInput {
  replay::LoadedTrace loaded;
  Config config;          // --conf, or the recorded configuration
  bool recorded = true;   // config is the recorded one: replay with the recorded addresses
};

// --cap / --device-memory: a positive size in bytes ("13.5G", "12GiB", "512M": K/M/G/T and
// KiB/MiB/GiB/TiB are powers of 1024; KB/MB/GB/TB are refused as ambiguous, and so is a size under
// 1 MiB: "8" is 8 bytes, "did you mean 8G?", replay::parse_size). "" leaves `out` empty. Prints
// the error and gives false on bad input.
inline bool size_option(const char* cmd, const char* option, const std::string& text, std::optional<Bytes>& out) {
  if (text.empty()) return true;
  const replay::SizeParse p = replay::parse_size(text);
  out = p.bytes;
  if (!p.error.empty()) {
    std::fprintf(stderr, "cachet %s: %s: %s\n", cmd, option, p.error.c_str());
    return false;
  }
  if (out && *out == 0 && std::string_view(option) == "--cap") {
    std::fprintf(stderr, "cachet %s: --cap %s: a cap of 0 bytes; leave --cap out for no cap\n", cmd, text.c_str());
    return false;
  }
  if (out && *out > static_cast<Bytes>(std::numeric_limits<std::int64_t>::max())) {
    std::fprintf(stderr, "cachet %s: %s %s: too large (more than 8 EiB); give the size in bytes or with K/M/G/T\n", cmd,
                 option, text.c_str());
    return false;
  }
  if (!out || *out == 0) {
    std::fprintf(stderr,
                 "cachet %s: %s: not a positive size: '%s' (bytes, or with a suffix K, M, G or T, powers of 1024: "
                 "'13.5G', '80GiB')\n",
                 cmd, option, text.c_str());
    return false;
  }
  return true;
}

// A cap over a known device memory is refused (set_per_process_memory_fraction takes a fraction
// in (0, 1]), and so is one over what the trace's out-of-memory entry shows the process could get
// (its reserved bytes + the device's free bytes): the device refuses before such a cap would.
// Where the device memory is unknown, it is at least the cap (load_trace).
inline bool cap_fits(const char* cmd, const replay::LoadedTrace& lt, const std::string& text, std::optional<Bytes> cap) {
  using Source = replay::DeviceMemoryFacts::Source;
  if (!cap) return true;
  const replay::DeviceMemoryFacts& m = lt.memory;
  if (lt.memory.source == Source::OomEntry && *cap > m.oom_reserved + m.oom_free) {
    std::fprintf(stderr,
                 "cachet %s: --cap %s: more than this process could get on the device (%s: reserved %s + %s free at "
                 "the trace's out-of-memory entry); a cap above it changes nothing. Give a smaller cap, or the device's "
                 "memory with --device-memory if the device had more\n",
                 cmd, text.c_str(), replay::human_bytes(static_cast<std::int64_t>(m.oom_reserved + m.oom_free)).c_str(),
                 replay::human_bytes(static_cast<std::int64_t>(m.oom_reserved)).c_str(),
                 replay::human_bytes(static_cast<std::int64_t>(m.oom_free)).c_str());
    return false;
  }
  if (*cap <= lt.run.total_memory || (lt.memory.source != Source::Option && lt.memory.source != Source::Recorded))
    return true;
  std::fprintf(stderr,
               "cachet %s: --cap %s: more than the device's memory (%s, %s); give a smaller cap, or the device's "
               "memory with --device-memory\n",
               cmd, text.c_str(), replay::human_bytes(static_cast<std::int64_t>(lt.run.total_memory)).c_str(),
               lt.memory.source == Source::Option ? "--device-memory" : "recorded beside the trace");
  return false;
}

// --fraction F beside --cap: the cap set_per_process_memory_fraction(F) sets, PyTorch's
// truncation included: size_t(F x the device's total memory). The total is --device-memory, the
// one recorded beside the trace, or what the trace's out-of-memory entry shows the process could
// get (its reserved bytes + the device's free ones). Writes the cap in bytes into cap_text; ""
// leaves it. Prints the error and gives false on bad input (both given, F outside (0, 1], no
// device memory known).
inline bool fraction_to_cap(const char* cmd, const std::string& path, const std::string& fraction,
                            const std::string& device_memory, std::string& cap_text) {
  if (fraction.empty()) return true;
  if (!cap_text.empty()) {
    std::fprintf(stderr, "cachet %s: --cap %s and --fraction %s both given: give one (--fraction F is a cap of F x "
                 "the device's memory)\n", cmd, cap_text.c_str(), fraction.c_str());
    return false;
  }
  char* end = nullptr;
  const double f = std::strtod(fraction.c_str(), &end);
  if (end == fraction.c_str() || *end != '\0' || !(f > 0 && f <= 1)) {
    std::fprintf(stderr, "cachet %s: --fraction %s: not a fraction in (0, 1] (set_per_process_memory_fraction's "
                 "argument, e.g. 0.15); leave it out for no cap\n", cmd, fraction.c_str());
    return false;
  }
  std::optional<Bytes> mem;
  if (!size_option(cmd, "--device-memory", device_memory, mem)) return false;
  Bytes total = 0;
  if (mem) {
    total = *mem;
  } else {
    replay::LoadedTrace lt;
    try {
      lt = replay::load_trace(path, replay::LoadOptions{});
    } catch (const io::ReadError& e) {
      std::fprintf(stderr, "cachet %s: %s\n", cmd, e.what());
      return false;
    }
    using Source = replay::DeviceMemoryFacts::Source;
    if (lt.memory.source != Source::Recorded && lt.memory.source != Source::OomEntry) {
      std::fprintf(stderr, "cachet %s: --fraction %s: the device's memory is not known (not recorded beside the trace, "
                   "and the trace has no out-of-memory entry): give it with --device-memory (e.g. --device-memory "
                   "80G), or give the cap in bytes with --cap\n", cmd, fraction.c_str());
      return false;
    }
    total = lt.run.total_memory;
  }
  // CUDACachingAllocator::setMemoryFraction: allowed_memory_maximum = size_t(fraction * total).
  const auto cap = static_cast<std::size_t>(f * static_cast<double>(total));
  if (cap == 0) {
    std::fprintf(stderr, "cachet %s: --fraction %s: a cap of 0 bytes; give a larger fraction\n", cmd, fraction.c_str());
    return false;
  }
  cap_text = std::to_string(cap);
  return true;
}

// `draw_without_cap` (plot, summary): a trace that shows a cap but was given none is drawn
// without one, and a note on stderr says what cannot be judged (replay, tune, explain and report
// refuse it: their verdicts need the cap).
inline std::optional<TraceInput> load_trace_input(const char* cmd, const std::string& path,
                                                  const std::optional<std::string>& conf,
                                                  const std::string& device_memory,
                                                  const std::string& cap_text = "",
                                                  bool draw_without_cap = false) {
  std::optional<Bytes> mem, cap;
  if (!size_option(cmd, "--device-memory", device_memory, mem) || !size_option(cmd, "--cap", cap_text, cap))
    return std::nullopt;
  TraceInput in;
  try {
    in.loaded = replay::load_trace(path, replay::LoadOptions{.device_memory = mem, .cap = cap});
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
  // A cap the trace shows but does not record is asked for, not guessed.
  if (auto e = replay::missing_cap_error(in.loaded); !e.empty()) {
    if (!draw_without_cap) {
      std::fprintf(stderr, "cachet %s: %s\n", cmd, e.c_str());
      return std::nullopt;
    }
    const replay::DeviceMemoryFacts& m = in.loaded.memory;
    std::fprintf(stderr,
                 "cachet %s: note: a memory cap was in force (the request at trace event %zu found %s free on the "
                 "device) and no --cap was given: replayed without a cap, so the recorded out-of-memory is marked "
                 "where it happened but does not happen in the replay, and no cap is drawn; what the cap would have "
                 "done (the out-of-memory, the headroom) is not judged here: give --cap (PyTorch's \"... GiB "
                 "allowed\") for it\n",
                 cmd, m.oom_event, replay::human_bytes(static_cast<std::int64_t>(m.oom_free)).c_str());
  }
  if (!cap_fits(cmd, in.loaded, cap_text, cap)) return std::nullopt;
  return in;
}

// --conf STR on tune, explain and report: one starting configuration in place of the recorded one
// (lt.run.config). The verdict is then for it, and the changes are counted from it; it replays with
// synthetic addresses unless it equals the recorded one (as `cachet replay --conf` does), which
// `o` says (baseline_recorded_addresses, addresses). Prints the error and gives false when it
// does not parse.
inline bool start_from_conf(const char* cmd, const std::optional<std::string>& conf, replay::LoadedTrace& lt,
                            replay::ReplayOptions* o = nullptr) {
  if (!conf) return true;
  Config c;
  try {
    c = parse_config(*conf, ConfigSource::Cachet).config;
  } catch (const ConfigError& e) {
    std::fprintf(stderr, "cachet %s: --conf '%s': %s\n", cmd, conf->c_str(), e.what());
    return false;
  }
  if (c == lt.run.config) return true;
  lt.run.config = c;
  if (o) {
    o->baseline_recorded_addresses = false;
    o->addresses = replay::AddressMode::Synthetic;
  }
  return true;
}

}  // namespace cachet::cli

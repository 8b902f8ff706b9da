// cachet/config.h: the allocator configuration, PyTorch 2.11's keys with PyTorch's meaning, plus
// the keys only cachet knows. Parsing never aborts: a bad string gets a ConfigError naming the
// key, the offending text, its column and the accepted form, and no Config is produced.
//
// Sources, in order (docs/pytorch-allocator.md §4.1): CACHET_ALLOC_CONF, else PYTORCH_CUDA_ALLOC_CONF,
// else PYTORCH_ALLOC_CONF. cachet-only keys (policy, cachet_validate, cachet_sleep) are accepted only from
// CACHET_ALLOC_CONF, because PyTorch itself parses the PYTORCH_* variables and rejects keys it
// does not know.
//
// docs/configuration.md lists every key, PyTorch's validation and where cachet is stricter
// (negative sizes, text after numbers, ';' separators, overflow, unclosed lists are errors).
#pragma once

#include <array>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cachet/types.h"

namespace cachet {

enum class Policy : std::uint8_t {
  PyTorch,  // exactly PyTorch 2.11's native caching allocator
  Cachet,   // cachet's low-waste policy (issue 9)
};

enum class Backend : std::uint8_t { Native, CudaMallocAsync };

// Where a configuration string came from: decides which keys are allowed.
enum class ConfigSource : std::uint8_t {
  Cachet,   // CACHET_ALLOC_CONF or cachet's own API: every key
  PyTorch,  // PYTORCH_CUDA_ALLOC_CONF / PYTORCH_ALLOC_CONF: PyTorch's keys only
};

inline constexpr Bytes kNoMaxSplit = std::numeric_limits<Bytes>::max();  // PyTorch's SIZE_MAX

struct Config {
  // --- generic keys (c10::CachingAllocator::AcceleratorAllocatorConfig) ---
  // max_split_size_mb: blocks of this size or more are never split. kNoMaxSplit = unlimited.
  Bytes max_split_size = kNoMaxSplit;
  // max_non_split_rounding_mb: an oversize request may take a cached block smaller than
  // request + this. Defaults to large_segment_size.
  Bytes max_non_split_rounding = kDefaultLargeSegmentSize;
  // large_segment_size_mb: segment size for 1..10 MiB requests, and the page of expandable
  // large-pool segments. Must be > 10 MiB.
  Bytes large_segment_size = kDefaultLargeSegmentSize;
  // roundup_power2_divisions: per power-of-two interval (index 0: < 2 MiB, ... 15: >= 32 GiB),
  // 0 or 1 = plain 512-byte rounding.
  std::array<std::uint32_t, kRoundUpPowerOfTwoIntervals> roundup_power2_divisions{};
  // garbage_collection_threshold: fraction of the memory cap; 0 = off. In (0, 1) when set.
  double garbage_collection_threshold = 0.0;
  bool expandable_segments = false;
  bool pinned_use_background_threads = false;

  // --- CUDA keys (c10::cuda::CUDAAllocatorConfig) ---
  Backend backend = Backend::Native;
  bool release_lock_on_cudamalloc = false;
  bool pinned_use_cuda_host_register = false;
  std::uint64_t pinned_num_register_threads = 1;
  std::uint64_t pinned_reserve_segment_size_mb = 0;  // 0 = unset
  bool graph_capture_record_stream_reuse = false;
  std::optional<double> per_process_memory_fraction;  // [0, 1]; applied at construction

  // --- cachet-only keys (CACHET_ALLOC_CONF only) ---
  Policy policy = Policy::PyTorch;
  bool validate = false;  // cachet_validate: run invariants() after every operation
  // cachet_sleep: sleep()/wake() may be used (docs/sleep-wake.md section 6); fixed at construction: every
  // segment is then mapped through the CUDA VMM calls, so its addresses can outlive its memory.
  bool sleep = false;

  // --- from the environment, not the string ---
  bool no_caching = false;  // PYTORCH_NO_CUDA_MEMORY_CACHING=1: every call goes to the device

  // -1 when unlimited, as memory_stats()["max_split_size"] reports it.
  std::int64_t max_split_size_stat() const {
    return max_split_size == kNoMaxSplit ? -1 : static_cast<std::int64_t>(max_split_size);
  }

  friend bool operator==(const Config&, const Config&) = default;
};

// A warning about input that was accepted but is probably not what was meant.
struct ConfigWarning {
  std::string message;
  std::size_t column = 0;  // 1-based; 0 = whole string
};

struct ParseResult {
  Config config;
  std::vector<ConfigWarning> warnings;
};

// Parses `text` over `base` (PyTorch resets max_split_size, roundup_power2_divisions and
// garbage_collection_threshold on every parse, and max_non_split_rounding to large_segment_size
// unless the string sets it; other keys keep their previous values).
// Throws ConfigError (key: the option or the unknown name, "" for a stray separator; text: the
// offending token; column: 1-based in `text`); on error nothing is returned, so nothing is
// half-applied.
ParseResult parse_config(std::string_view text, ConfigSource source = ConfigSource::Cachet,
                         const Config& base = Config{});

// The canonical one-line form: PyTorch syntax, keys in a fixed order, only keys whose value
// differs from the default. parse_config(to_string(c)) == c for every valid c.
std::string to_string(const Config& c);

// Reads CACHET_ALLOC_CONF, else PYTORCH_CUDA_ALLOC_CONF, else PYTORCH_ALLOC_CONF, and
// PYTORCH_NO_CUDA_MEMORY_CACHING. Throws ConfigError naming the variable.
struct EnvConfig {
  ParseResult parsed;
  std::string variable;  // which variable was used ("" if none was set)
  std::string text;      // its value
};
EnvConfig config_from_environment();

// Every key of the configuration string, for `cachet check-conf --list`: its name, the values it
// takes (as error messages state them), what it does, and whether only CACHET_ALLOC_CONF takes it
// (PyTorch rejects it). PyTorch 2.11's keys (with their HIP aliases) first, then cachet's.
struct ConfigKeyDoc {
  std::string_view name;
  std::string_view values;
  std::string_view meaning;
  bool cachet_only = false;
};
std::vector<ConfigKeyDoc> config_keys();

}  // namespace cachet

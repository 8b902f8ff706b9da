// config.cpp: the allocator configuration string, PyTorch 2.11's syntax and meaning
// (docs/pytorch-allocator.md §1.5, §4.1, §4.2), with clear errors instead of PyTorch's aborts.
// docs/configuration.md describes every key and every decision where cachet is stricter than
// PyTorch.
//
// Parsing runs in three steps, so that nothing is half-applied:
//   tokenize  split on ',' ':' '[' ']' and drop all whitespace, as c10's ConfigTokenizer does,
//             remembering each character's 1-based column in the input;
//   syntax    options = key ':' (value | '[' item (',' item)* ']'), separated by ',', an
//             optional trailing ','; unknown keys are rejected here, with a suggestion;
//   meaning   large_segment_size_mb first (PyTorch's pre-pass), then every option in order,
//             validated as PyTorch validates it, over a copy of `base`.
//
// This file holds the third step, parse_config itself; the key table and the suggestions are in
// config_keys.cpp, the tokenizer, the syntax and the error messages in config_syntax.cpp, the
// values in config_values.cpp, roundup_power2_divisions lists in config_divisions.cpp, to_string
// in config_print.cpp and config_from_environment in config_env.cpp (shared helpers:
// config_internal.h).
#include "cachet/config.h"

#include <fmt/format.h>

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "config_internal.h"

namespace cachet {

using namespace config_internal;

ParseResult parse_config(std::string_view text, ConfigSource source, const Config& base) {
  const std::vector<Token> toks = tokenize(text);
  const std::vector<Option> options = parse_syntax(toks, source);

  ParseResult result;
  Config& c = result.config;
  c = base;
  // Reset on every parse (§4.1).
  c.max_split_size = kNoMaxSplit;
  c.roundup_power2_divisions.fill(0);
  c.garbage_collection_threshold = 0.0;

  // Pre-pass: large_segment_size_mb decides the minimum of the sizes below and the default of
  // max_non_split_rounding, wherever it appears.
  for (const Option& o : options) {
    if (o.key->key != Key::LargeSegmentSize) continue;
    const Bytes v = parse_mib(o.key->name, o.value, o.key->form, source);
    if (v <= kMinLargeAlloc) {
      fail(o.key->name, o.value.text, o.value.column(), "must be > 10 MiB", o.key->form);
    }
    c.large_segment_size = v;
  }
  c.max_non_split_rounding = c.large_segment_size;
  const std::uint64_t min_mb = c.large_segment_size / MiB;

  std::map<Key, const Option*> seen;
  std::vector<int> gaps;
  std::optional<ConfigWarning> divisions_order;  // the last list's order warning
  bool divisions_scalar_one = false;
  for (const Option& o : options) {
    const std::string_view key = o.key->name;
    const std::string_view form = o.key->form;
    if (auto it = seen.find(o.key->key); it != seen.end()) {
      result.warnings.push_back(
          {fmt::format("{} is given more than once (columns {} and {}): the last value wins", key,
                       it->second->name.column(), o.name.column()),
           o.name.column()});
    }
    seen[o.key->key] = &o;
    auto too_small = [&](Bytes v) {
      if (v / MiB < min_mb) {
        fail(key, o.value.text, o.value.column(),
             fmt::format("too small, must be >= {} (large_segment_size_mb)", min_mb), form);
      }
    };
    switch (o.key->key) {
      case Key::MaxSplitSize: {
        const Bytes v = parse_mib(key, o.value, form, source);
        too_small(v);
        c.max_split_size = v;
        break;
      }
      case Key::MaxNonSplitRounding: {
        const Bytes v = parse_mib(key, o.value, form, source);
        too_small(v);
        c.max_non_split_rounding = v;
        break;
      }
      case Key::LargeSegmentSize:
        break;  // pre-pass
      case Key::GarbageCollectionThreshold: {
        const double v = parse_double(key, o.value, form, source);
        if (!(v > 0.0 && v < 1.0)) {
          fail(key, o.value.text, o.value.column(),
               "must be strictly between 0 and 1 (PyTorch: set it in (0.0, 1.0))", form);
        }
        c.garbage_collection_threshold = v;
        break;
      }
      case Key::RoundupPower2Divisions:
        if (o.open) {
          gaps.clear();
          divisions_order.reset();
          c.roundup_power2_divisions = parse_division_list(o, source, &gaps, &divisions_order);
          divisions_scalar_one = false;
        } else {
          const std::uint32_t v = parse_divisions(key, o.value, false, form, source);
          c.roundup_power2_divisions.fill(v);
          gaps.clear();
          divisions_order.reset();
          divisions_scalar_one = v == 1;
        }
        break;
      case Key::ExpandableSegments:
        c.expandable_segments = parse_bool(key, o.value, source);
        break;
      case Key::PinnedUseBackgroundThreads:
        c.pinned_use_background_threads = parse_bool(key, o.value, source);
        break;
      case Key::Backend:
        if (o.value.text == "native") {
          c.backend = Backend::Native;
        } else if (o.value.text == "cudaMallocAsync") {
          c.backend = Backend::CudaMallocAsync;
        } else {
          if (o.value.text.find(';') != std::string::npos) fail_semicolon(key, o.value, source);
          fail(key, o.value.text, o.value.column(), "unknown allocator backend", form);
        }
        break;
      case Key::ReleaseLockOnCudaMalloc:
        c.release_lock_on_cudamalloc = parse_bool(key, o.value, source);
        break;
      case Key::PinnedUseCudaHostRegister:
        c.pinned_use_cuda_host_register = parse_bool(key, o.value, source);
        break;
      case Key::PinnedNumRegisterThreads: {
        const std::uint64_t v = parse_uint(key, o.value, form, source);
        if (!is_power_of_two(v)) {
          fail(key, o.value.text, o.value.column(), "the number of threads must be a power of two",
               form);
        }
        if (v > 128) {
          fail(key, o.value.text, o.value.column(), "the number of threads must be at most 128",
               form);
        }
        c.pinned_num_register_threads = v;
        break;
      }
      case Key::PinnedReserveSegmentSize: {
        const Bytes v = parse_mib(key, o.value, form, source);
        if (v == 0) fail(key, o.value.text, o.value.column(), "must be greater than 0", form);
        c.pinned_reserve_segment_size_mb = v / MiB;
        break;
      }
      case Key::GraphCaptureRecordStreamReuse:
        c.graph_capture_record_stream_reuse = parse_bool(key, o.value, source);
        break;
      case Key::PerProcessMemoryFraction: {
        const double v = parse_double(key, o.value, form, source);
        if (!(v >= 0.0 && v <= 1.0)) {
          fail(key, o.value.text, o.value.column(), "must be from 0 to 1 (PyTorch: [0.0, 1.0])",
               form);
        }
        c.per_process_memory_fraction = v;
        break;
      }
      case Key::Policy:
        if (o.value.text == "pytorch") {
          c.policy = Policy::PyTorch;
        } else if (o.value.text == "cachet") {
          c.policy = Policy::Cachet;
        } else {
          if (o.value.text.find(';') != std::string::npos) fail_semicolon(key, o.value, source);
          fail(key, o.value.text, o.value.column(), "unknown policy", form);
        }
        break;
      case Key::CachetValidate:
        c.validate = parse_bool(key, o.value, source);
        break;
      case Key::CachetSleep:
        c.sleep = parse_bool(key, o.value, source);
        break;
    }
  }

  // Warnings: accepted, but probably not what was meant.
  auto column_of = [&](Key k) -> std::size_t {
    auto it = seen.find(k);
    return it == seen.end() ? 0 : it->second->name.column();
  };
  if (divisions_scalar_one) {
    result.warnings.push_back({"roundup_power2_divisions:1 has no effect: one division per "
                               "power-of-two interval is plain 512-byte rounding",
                               column_of(Key::RoundupPower2Divisions)});
  }
  if (divisions_order) result.warnings.push_back(*divisions_order);
  if (!gaps.empty()) {
    std::string list;
    for (std::size_t a = 0; a < gaps.size();) {
      std::size_t b = a;
      while (b + 1 < gaps.size() && gaps[b + 1] == gaps[b] + 1) ++b;
      list += (list.empty() ? "" : ", ") + interval_range(gaps[a], gaps[b]);
      a = b + 1;
    }
    result.warnings.push_back(
        {fmt::format("roundup_power2_divisions: the list leaves sizes {} uncovered; PyTorch 2.11 "
                     "leaves gaps unrounded (older releases filled them from the entry below): "
                     "add entries for them",
                     list),
         column_of(Key::RoundupPower2Divisions)});
  }
  if (c.garbage_collection_threshold > 0.0 && !c.per_process_memory_fraction) {
    result.warnings.push_back(
        {"garbage_collection_threshold has no effect without a memory cap: set "
         "per_process_memory_fraction (or call set_per_process_memory_fraction); see PyTorch issue "
         "#106660",
         column_of(Key::GarbageCollectionThreshold)});
  }
  if (c.max_split_size != kNoMaxSplit && c.expandable_segments) {
    result.warnings.push_back(
        {"max_split_size_mb together with expandable_segments:True: expandable segments already "
         "avoid the fragmentation max_split_size_mb works around, and oversize blocks are never "
         "split",
         column_of(Key::MaxSplitSize)});
  }
  if (c.backend == Backend::CudaMallocAsync) {
    std::string ignored;
    for (Key k : {Key::MaxSplitSize, Key::MaxNonSplitRounding, Key::LargeSegmentSize,
                  Key::RoundupPower2Divisions, Key::GarbageCollectionThreshold,
                  Key::ExpandableSegments, Key::ReleaseLockOnCudaMalloc}) {
      if (seen.count(k) != 0) ignored += (ignored.empty() ? "" : ", ") + std::string(info(k).name);
    }
    if (!ignored.empty()) {
      result.warnings.push_back(
          {fmt::format("backend:cudaMallocAsync ignores {}: they apply to the native allocator only",
                       ignored),
           column_of(Key::Backend)});
    }
  }
  return result;
}

}  // namespace cachet

// config_keys.cpp: the configuration keys, PyTorch 2.11's (with their HIP aliases) and cachet's
// own, each with the form an error message shows as accepted; the keys of later PyTorch releases,
// which 2.11 rejects; and the suggestion for an unknown key (the same key in lower case, the
// nearest by edit distance, or the one sharing the most words). docs/configuration.md describes
// every key.
#include <algorithm>
#include <cctype>
#include <iterator>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "config_internal.h"

namespace cachet::config_internal {
namespace {

// Every key 2.11 accepts (with its HIP aliases), then cachet's own.
constexpr KeyInfo kKeys[] = {
    {"max_split_size_mb", Key::MaxSplitSize, false,
     "a whole number of MiB >= large_segment_size_mb (20 by default), e.g. max_split_size_mb:128", "blocks of this size or more are never split; a request below it never takes one (limits fragmentation of large blocks)"},
    {"max_non_split_rounding_mb", Key::MaxNonSplitRounding, false,
     "a whole number of MiB >= large_segment_size_mb (20 by default), e.g. "
     "max_non_split_rounding_mb:64", "a request of max_split_size_mb or more takes a whole cached block at most this much larger"},
    {"large_segment_size_mb", Key::LargeSegmentSize, false,
     "a whole number of MiB > 10, e.g. large_segment_size_mb:32", "the segment cudaMalloc'd for requests between 1 MiB and 10 MiB (20 MiB by default)"},
    {"garbage_collection_threshold", Key::GarbageCollectionThreshold, false,
     "a fraction strictly between 0 and 1, e.g. garbage_collection_threshold:0.6", "under a cap, when reserved memory passes this fraction of it, cached blocks unused the longest are given back before cudaMalloc"},
    {"roundup_power2_divisions", Key::RoundupPower2Divisions, false,
     "a power of two (roundup_power2_divisions:4) or a list of size_mb:divisions with power-of-two "
     "sizes and divisions a power of two or 0, optionally ending in >:divisions "
     "(roundup_power2_divisions:[256:1,512:2,>:8])", "rounds requests up to one of this many steps between powers of two (fewer distinct sizes, more rounding)"},
    {"expandable_segments", Key::ExpandableSegments, false, kBoolForm, "one segment per stream grown by mapping pages, instead of one cudaMalloc per segment (less fragmentation)"},
    {"pinned_use_background_threads", Key::PinnedUseBackgroundThreads, false, kBoolForm, "the pinned (host) allocator processes its events on a background thread"},
    {"backend", Key::Backend, false, "native or cudaMallocAsync", "native: PyTorch's caching allocator; cudaMallocAsync: CUDA's stream-ordered allocator instead"},
    {"release_lock_on_cudamalloc", Key::ReleaseLockOnCudaMalloc, false, kBoolForm, "the allocator's lock is released around cudaMalloc"},
    {"release_lock_on_hipmalloc", Key::ReleaseLockOnCudaMalloc, false, kBoolForm, "HIP's name for release_lock_on_cudamalloc"},
    {"pinned_use_cuda_host_register", Key::PinnedUseCudaHostRegister, false, kBoolForm, "pinned host memory is malloc'd and registered with cudaHostRegister instead of cudaHostAlloc"},
    {"pinned_use_hip_host_register", Key::PinnedUseCudaHostRegister, false, kBoolForm, "HIP's name for pinned_use_cuda_host_register"},
    {"pinned_num_register_threads", Key::PinnedNumRegisterThreads, false,
     "a power of two from 1 to 128, e.g. pinned_num_register_threads:8", "threads that register pinned host memory (with pinned_use_cuda_host_register)"},
    {"pinned_reserve_segment_size_mb", Key::PinnedReserveSegmentSize, false,
     "a whole number of MiB > 0, e.g. pinned_reserve_segment_size_mb:1024", "pinned host memory reserved up front for small pinned allocations"},
    {"graph_capture_record_stream_reuse", Key::GraphCaptureRecordStreamReuse, false, kBoolForm, "blocks freed during a CUDA graph capture with stream uses may be reused within the capture"},
    {"per_process_memory_fraction", Key::PerProcessMemoryFraction, false,
     "a fraction from 0 to 1, e.g. per_process_memory_fraction:0.5", "caps the process at this fraction of the device's memory, as set_per_process_memory_fraction"},
    {"policy", Key::Policy, true, "pytorch or cachet", "pytorch: PyTorch 2.11's rules; cachet: cachet's own policy, no segments to fragment (cachet's plug-in only)"},
    {"cachet_validate", Key::CachetValidate, true, kBoolForm, "cachet checks its invariants after every call (slow; for debugging)"},
    {"cachet_sleep", Key::CachetSleep, true, kBoolForm, "cachet's sleep and wake of idle memory (cachet's plug-in only)"},
};

// Keys of PyTorch releases after 2.11: 2.11 rejects them.
constexpr std::string_view kNewerKeys[] = {"throw_on_cudamalloc_oom", "expandable_segments_reserve",
                                           "expandable_segments_reserve_by_class",
                                           "pinned_free_catch_all"};

}  // namespace

const KeyInfo* find_key(std::string_view name) {
  for (const KeyInfo& k : kKeys) {
    if (k.name == name) return &k;
  }
  return nullptr;
}

const KeyInfo& info(Key key) {
  for (const KeyInfo& k : kKeys) {
    if (k.key == key) return k;
  }
  return kKeys[0];  // unreachable: every Key has an entry
}

namespace {

// Levenshtein distance of a and b, or any value above `limit` once the distance is known to
// exceed it (every entry of a row is above the limit).
std::size_t edit_distance(std::string_view a, std::string_view b, std::size_t limit) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diagonal = row[0];
    row[0] = i;
    std::size_t row_min = row[0];
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t up = row[j];
      std::size_t d = diagonal + (a[i - 1] != b[j - 1] ? 1 : 0);
      if (up + 1 < d) d = up + 1;
      if (row[j - 1] + 1 < d) d = row[j - 1] + 1;
      row[j] = d;
      if (d < row_min) row_min = d;
      diagonal = up;
    }
    if (row_min > limit) return row_min;
  }
  return row[b.size()];
}

std::vector<std::string_view> words(std::string_view s) {
  std::vector<std::string_view> out;
  std::size_t start = 0;
  while (start <= s.size()) {
    std::size_t end = s.find('_', start);
    if (end == std::string_view::npos) end = s.size();
    if (end - start >= 3) out.push_back(s.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

}  // namespace

std::string lowercase(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

namespace {

// The known key nearest to `name`: the same key in lower case; else the nearest by edit distance
// when it is close (at most a third of the name, at least 2); else the key sharing the most
// words when they are at least half the name's words of 3 letters or more ("garbage_interval" ->
// garbage_collection_threshold). nullopt when nothing is close.
std::optional<std::string_view> nearest_key(std::string_view name, ConfigSource source) {
  auto allowed = [&](const KeyInfo& k) { return !k.cachet_only || source == ConfigSource::Cachet; };
  const std::string lower = lowercase(name);
  for (const KeyInfo& k : kKeys) {
    if (allowed(k) && k.name == lower) return k.name;
  }
  // The edit distance is at least the difference in length, so a key whose length differs by
  // more than the limit can never be accepted: skipping it keeps the answer and keeps a long
  // unknown name from costing |name| x |key| work per key (fuzz_config ran ~500 execs/s).
  const std::size_t limit = std::max<std::size_t>(2, lower.size() / 3);
  const KeyInfo* best = nullptr;
  std::size_t best_distance = 0;
  for (const KeyInfo& k : kKeys) {
    if (!allowed(k)) continue;
    const std::size_t longer = std::max(lower.size(), k.name.size());
    const std::size_t shorter = std::min(lower.size(), k.name.size());
    if (longer - shorter > limit) continue;
    const std::size_t d = edit_distance(lower, k.name, limit);
    if (best == nullptr || d < best_distance) {
      best = &k;
      best_distance = d;
    }
  }
  if (best != nullptr && best_distance <= limit) return best->name;
  const auto name_words = words(lower);
  best = nullptr;
  std::size_t best_shared = 0;
  for (const KeyInfo& k : kKeys) {
    if (!allowed(k)) continue;
    std::size_t shared = 0;
    for (auto w : words(k.name)) {
      if (std::find(name_words.begin(), name_words.end(), w) != name_words.end()) ++shared;
    }
    if (shared > best_shared) {
      best = &k;
      best_shared = shared;
    }
  }
  // Only a close match is suggested: at least half of the name's words (of 3 letters or more) are
  // the key's ("garbage_interval": 1 of 2; "PYTORCH_NO_CUDA_MEMORY_CACHING" shares 1 of 4 with
  // pinned_use_cuda_host_register: no suggestion).
  if (best != nullptr && 2 * best_shared >= name_words.size()) return best->name;
  return std::nullopt;
}

}  // namespace

std::string describe_unknown(std::string_view name, ConfigSource source) {
  if (std::find(std::begin(kNewerKeys), std::end(kNewerKeys), name) != std::end(kNewerKeys)) {
    return fmt::format("'{}' is an option of PyTorch releases after 2.11; 2.11 rejects it", name);
  }
  std::string out = fmt::format("'{}' is no option", name);
  if (auto near = nearest_key(name, source)) {
    out += lowercase(name) == *near && name != *near
               ? fmt::format(" (options are lower case: did you mean '{}'?)", *near)
               : fmt::format(" (did you mean '{}'?)", *near);
  }
  return out;
}

}  // namespace cachet::config_internal

namespace cachet {

std::vector<ConfigKeyDoc> config_keys() {
  std::vector<ConfigKeyDoc> out;
  for (const auto& k : config_internal::kKeys) out.push_back({k.name, k.form, k.meaning, k.cachet_only});
  return out;
}

}  // namespace cachet

// config_print.cpp: to_string, the canonical one-line form of a Config (PyTorch syntax, keys in a
// fixed order, only values that differ from the defaults), and divisions_text, the
// roundup_power2_divisions value that PyTorch 2.11's list parser turns back into the same table
// (also quoted by the list-order warning of config_divisions.cpp).
#include <algorithm>
#include <cstddef>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "cachet/config.h"
#include "config_internal.h"

namespace cachet {
namespace config_internal {
namespace {

std::string bool_text(bool b) { return b ? "True" : "False"; }

}  // namespace

// A list that 2.11's list parser turns back into exactly `d` (see parse_division_list).
std::string divisions_text(const Divisions& d) {
  if (std::all_of(d.begin(), d.end(), [&](std::uint32_t v) { return v == d[0]; })) {
    return std::to_string(d[0]);
  }
  std::vector<std::string> items;
  std::size_t first = 0;  // the first entry covers 0..first
  while (first + 1 < d.size() && d[first + 1] == d[0]) ++first;
  items.push_back(fmt::format("{}:{}", std::uint64_t{1} << first, d[0]));
  std::size_t last = first;
  for (std::size_t i = first + 1; i < d.size(); ++i) {
    const bool rest_equal =
        std::all_of(d.begin() + static_cast<std::ptrdiff_t>(i), d.end(), [&](std::uint32_t v) { return v == d[i]; });
    if (rest_equal && d[i] != 0 && i == last + 1) {
      items.push_back(fmt::format(">:{}", d[i]));
      break;
    }
    if (d[i] != 0) {
      items.push_back(fmt::format("{}:{}", std::uint64_t{1} << i, d[i]));
      last = i;
    }
  }
  std::string out = "[";
  for (std::size_t i = 0; i < items.size(); ++i) out += (i ? "," : "") + items[i];
  return out + "]";
}

}  // namespace config_internal

using namespace config_internal;

std::string to_string(const Config& c) {
  const Config d;
  std::vector<std::string> parts;
  auto add = [&](std::string_view key, const std::string& value) {
    parts.push_back(fmt::format("{}:{}", key, value));
  };
  if (c.backend != d.backend) add("backend", c.backend == Backend::CudaMallocAsync ? "cudaMallocAsync" : "native");
  if (c.expandable_segments != d.expandable_segments) add("expandable_segments", bool_text(c.expandable_segments));
  if (c.max_split_size != kNoMaxSplit) add("max_split_size_mb", std::to_string(c.max_split_size / MiB));
  if (c.large_segment_size != d.large_segment_size) {
    add("large_segment_size_mb", std::to_string(c.large_segment_size / MiB));
  }
  if (c.max_non_split_rounding != c.large_segment_size) {
    add("max_non_split_rounding_mb", std::to_string(c.max_non_split_rounding / MiB));
  }
  if (c.roundup_power2_divisions != d.roundup_power2_divisions) {
    add("roundup_power2_divisions", divisions_text(c.roundup_power2_divisions));
  }
  if (c.garbage_collection_threshold != d.garbage_collection_threshold) {
    add("garbage_collection_threshold", fmt::format("{}", c.garbage_collection_threshold));
  }
  if (c.per_process_memory_fraction) {
    add("per_process_memory_fraction", fmt::format("{}", *c.per_process_memory_fraction));
  }
  if (c.release_lock_on_cudamalloc != d.release_lock_on_cudamalloc) {
    add("release_lock_on_cudamalloc", bool_text(c.release_lock_on_cudamalloc));
  }
  if (c.pinned_use_cuda_host_register != d.pinned_use_cuda_host_register) {
    add("pinned_use_cuda_host_register", bool_text(c.pinned_use_cuda_host_register));
  }
  if (c.pinned_num_register_threads != d.pinned_num_register_threads) {
    add("pinned_num_register_threads", std::to_string(c.pinned_num_register_threads));
  }
  if (c.pinned_reserve_segment_size_mb != d.pinned_reserve_segment_size_mb) {
    add("pinned_reserve_segment_size_mb", std::to_string(c.pinned_reserve_segment_size_mb));
  }
  if (c.pinned_use_background_threads != d.pinned_use_background_threads) {
    add("pinned_use_background_threads", bool_text(c.pinned_use_background_threads));
  }
  if (c.graph_capture_record_stream_reuse != d.graph_capture_record_stream_reuse) {
    add("graph_capture_record_stream_reuse", bool_text(c.graph_capture_record_stream_reuse));
  }
  if (c.policy != d.policy) add("policy", c.policy == Policy::Cachet ? "cachet" : "pytorch");
  if (c.validate != d.validate) add("cachet_validate", bool_text(c.validate));
  if (c.sleep != d.sleep) add("cachet_sleep", bool_text(c.sleep));
  std::string out;
  for (std::size_t i = 0; i < parts.size(); ++i) out += (i ? "," : "") + parts[i];
  return out;
}

}  // namespace cachet

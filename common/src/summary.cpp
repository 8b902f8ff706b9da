// summary.cpp: PyTorch's human-readable texts, byte for byte.
//
//   memory_summary  torch.cuda.memory_summary() (torch/cuda/memory.py,
//                   docs/pytorch-allocator.md §5.4), verified against the `summary` field of
//                   every oracle recording.
//   format_size     c10's format_size (docs/pytorch-allocator.md §3.7).
//   oom_message     the OutOfMemoryError text of DeviceCachingAllocator::malloc (§3.7).
#include "cachet/summary.h"

#include <fmt/format.h>

#include <array>
#include <string_view>
#include <vector>

namespace cachet {
namespace {

// Python's `a // b` for b > 0 (floors toward minus infinity, unlike C++'s `/`).
std::int64_t floor_div(std::int64_t a, std::int64_t b) {
  std::int64_t q = a / b;
  if ((a % b != 0) && (a < 0)) --q;
  return q;
}

// memory.py's _format_size(sz, pref_sz): the unit is chosen from `pref` (the "all" row of the
// same column), stepping up while pref >= 768 KiB of the current unit. `sz //= 1024` floors and
// `pref_sz /= 1024` is a float division, as in Python.
std::string format_summary_size(std::int64_t sz, std::int64_t pref) {
  static constexpr std::array<std::string_view, 6> kUnits{"B  ", "KiB", "MiB", "GiB", "TiB", "PiB"};
  std::string_view unit = kUnits[0];
  double pref_d = static_cast<double>(pref);
  for (std::size_t i = 1; i < kUnits.size(); ++i) {
    if (pref_d < 768.0 * 1024.0) break;
    unit = kUnits[i];
    sz = floor_div(sz, 1024);
    pref_d /= 1024.0;
  }
  return fmt::format("{:6d} {}", sz, unit);
}

// memory.py's _format_count(cnt, pref_cnt): units " ", "K", "M" with threshold 750,000.
std::string format_summary_count(std::int64_t cnt, std::int64_t pref) {
  static constexpr std::array<std::string_view, 3> kUnits{" ", "K", "M"};
  std::string_view unit = kUnits[0];
  double pref_d = static_cast<double>(pref);
  for (std::size_t i = 1; i < kUnits.size(); ++i) {
    if (pref_d < 750.0 * 1000.0) break;
    unit = kUnits[i];
    cnt = floor_div(cnt, 1000);
    pref_d /= 1000.0;
  }
  return fmt::format("{:7d} {} ", cnt, unit);
}

using Formatter = std::string (*)(std::int64_t, std::int64_t);

struct Metric {
  const StatArray DeviceStats::*array;
  std::string_view name;
  Formatter format;
};

}  // namespace

std::string memory_summary(const DeviceStats& s, DeviceIndex device, bool abbreviated) {
  // The metrics in memory.py's order.
  static constexpr std::array<Metric, 9> kMetrics{{
      {&DeviceStats::allocated_bytes, "Allocated memory", format_summary_size},
      {&DeviceStats::active_bytes, "Active memory", format_summary_size},
      {&DeviceStats::requested_bytes, "Requested memory", format_summary_size},
      {&DeviceStats::reserved_bytes, "GPU reserved memory", format_summary_size},
      {&DeviceStats::inactive_split_bytes, "Non-releasable memory", format_summary_size},
      {&DeviceStats::allocation, "Allocations", format_summary_count},
      {&DeviceStats::active, "Active allocs", format_summary_count},
      {&DeviceStats::segment, "GPU reserved segments", format_summary_count},
      {&DeviceStats::inactive_split, "Non-releasable allocs", format_summary_count},
  }};
  const std::string rule(75, '-');
  const std::string double_rule(75, '=');

  std::vector<std::string> lines;
  lines.push_back(double_rule);
  lines.push_back(fmt::format(" {:16} PyTorch CUDA memory summary, device ID {:<17d} ", "", device));
  lines.push_back(rule);
  lines.push_back(fmt::format("  {:9} CUDA OOMs: {:<12d} | {:6} cudaMalloc retries: {:<8d}  ", "",
                              s.num_ooms, "", s.num_alloc_retries));
  lines.push_back(double_rule);
  lines.push_back("        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  ");

  auto row = [&](std::string_view name, const Stat& v, const Stat& pref, Formatter f) {
    lines.push_back(fmt::format(" {:<21} | {} | {} | {} | {} ", name, f(v.current, pref.current),
                                f(v.peak, pref.peak), f(v.allocated, pref.allocated),
                                f(v.freed, pref.freed)));
  };

  for (const Metric& m : kMetrics) {
    lines.push_back(rule);
    const StatArray& a = s.*(m.array);
    const Stat& all = a[static_cast<int>(StatType::Aggregate)];
    row(m.name, all, all, m.format);
    if (!abbreviated) {
      // Sub-rows take their unit from the "all" row of the same column.
      row("      from large pool", a[static_cast<int>(StatType::LargePool)], all, m.format);
      row("      from small pool", a[static_cast<int>(StatType::SmallPool)], all, m.format);
    }
  }
  lines.push_back(rule);
  row("Oversize allocations", s.oversize_allocations, s.oversize_allocations, format_summary_count);
  lines.push_back(rule);
  row("Oversize GPU segments", s.oversize_segments, s.oversize_segments, format_summary_count);
  lines.push_back(double_rule);

  // "|" + "|\n|".join(lines) + "|\n"
  std::string out = "|";
  for (std::size_t i = 0; i < lines.size(); ++i) {
    if (i > 0) out += "|\n|";
    out += lines[i];
  }
  out += "|\n";
  return out;
}

std::string format_size(Bytes bytes) {
  // std::ostringstream with precision(2) and std::fixed: the same digits as printf's %.2f.
  if (bytes <= 1024) return fmt::format("{} bytes", bytes);
  if (bytes <= MiB) return fmt::format("{:.2f} KiB", static_cast<double>(bytes) / 1024.0);
  if (bytes <= GiB) return fmt::format("{:.2f} MiB", static_cast<double>(bytes) / 1048576.0);
  return fmt::format("{:.2f} GiB", static_cast<double>(bytes) / 1073741824.0);
}

std::string oom_message(const OomFacts& f) {
  if (f.alloc_size >= kMaxRequest) return "CUDA out of memory. Tried to allocate more than 1EB memory.";
  std::string proc_info;
  if (f.process_in_use) {
    proc_info = fmt::format("Including non-PyTorch memory, this process has {} memory in use. ",
                            format_size(*f.process_in_use));
  }
  std::string allowed_info;
  if (f.allowed) allowed_info = format_size(*f.allowed) + " allowed; ";
  std::string private_msg;
  if (f.private_pool_free > 0) {
    private_msg = fmt::format("with {} allocated in private pools (e.g., CUDA Graphs), ",
                              format_size(f.private_pool_free));
  }
  // Unsigned arithmetic, as PyTorch's size_t (wraps the same way if the facts disagree).
  const Bytes by_pytorch = f.allocated + f.private_pool_free;
  const Bytes unallocated = f.reserved - f.allocated - f.private_pool_free;
  return fmt::format(
      "CUDA out of memory. Tried to allocate {}. GPU {} has a total capacity of {} of which {} is "
      "free. {}{}Of the allocated memory {} is allocated by PyTorch, {}and {} is reserved by "
      "PyTorch but unallocated. If reserved but unallocated memory is large try setting "
      "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See "
      "documentation for Memory Management  "
      "(https://docs.pytorch.org/docs/stable/notes/cuda.html"
      "#optimizing-memory-usage-with-pytorch-cuda-alloc-conf)",
      format_size(f.alloc_size), f.device, format_size(f.device_total), format_size(f.device_free),
      proc_info, allowed_info, format_size(by_pytorch), private_msg, format_size(unallocated));
}

}  // namespace cachet

namespace cachet {

std::string sleep_summary(const SleepStats& s) {
  if (s.num_sleeps == 0) return "";
  const auto sz = [](std::int64_t v) { return format_size(static_cast<Bytes>(v)); };
  return fmt::format("Sleeping: {} segments, {} ({} of it allocated); host backups: {}\n",
                     s.sleeping_segments.current, sz(s.sleeping_bytes.current),
                     sz(s.sleeping_allocated_bytes.current), sz(s.backup_bytes.current)) +
         fmt::format("Sleeps: {}, wakes: {}, wakes out of memory: {}\n", s.num_sleeps, s.num_wakes, s.num_wake_ooms);
}

}  // namespace cachet

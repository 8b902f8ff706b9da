// config_divisions.cpp: the list form of roundup_power2_divisions ([256:1,512:2,>:8]), applied
// entry by entry in the order written as PyTorch 2.11's parseRoundUpPower2Divisions does, with
// the intervals it leaves uncovered and the warning for a list that is not ascending with '>'
// last; and interval_range, which names intervals in those warnings.
#include <algorithm>
#include <bit>
#include <string>

#include <fmt/format.h>

#include "config_internal.h"

namespace cachet::config_internal {

// PyTorch 2.11 c10/core/AllocatorConfig.cpp, AcceleratorAllocatorConfig::parseRoundUpPower2Divisions,
// list form. The entries are applied one after another, in the order written, to a table that
// starts all 0:
// - `b:v` (b MiB, a power of two): index = log2(b), clamped to 15; the first such entry (the
//   first `b:v`, even after a '>') also fills every index below it with v; then table[index] = v
//   and last_index = index (the index of the latest `b:v`, not the highest one);
// - `>:v`: fills last_index + 1 .. 15 with v (last_index starts at 0, so a leading '>' leaves
//   index 0 alone); it changes neither last_index nor "first".
// Nothing is sorted: a later entry overwrites an earlier one wherever they meet, so an entry
// written out of order can be lost ([256:1,128:2,>:4]: '>' starts after 128, 256:1 is gone).
// Indices between two sizes that no entry reaches stay 0 (not rounded).
// `gaps` receives the intervals the list left uncovered; `order` a warning when the entries are
// not ascending with '>' last (what PyTorch makes of such a list surprises).
Divisions parse_division_list(const Option& opt, ConfigSource source, std::vector<int>* gaps,
                              std::optional<ConfigWarning>* order) {
  const std::string_view key = opt.key->name;
  const std::string_view form = opt.key->form;
  Divisions d{};
  std::array<bool, kRoundUpPowerOfTwoIntervals> covered{};
  std::size_t last_index = 0;
  bool first = true;
  int highest_set = -1;
  // For the order warning: what each entry set (a '>' its range), and whether the entries are
  // strictly ascending with at most one '>', written last.
  struct Applied {
    const ListItem* item;
    std::size_t from, to;  // indices from..to-1
    std::uint32_t value;
  };
  std::vector<Applied> applied;
  bool ordered = true;
  bool after_gt = false;
  int previous_index = -1;
  const ListItem* first_out_of_order = nullptr;
  for (const ListItem& item : opt.items) {
    const std::uint32_t v = parse_divisions(key, item.value, true, form, source);
    if (after_gt && ordered) {
      ordered = false;
      first_out_of_order = &item;
    }
    if (item.boundary.text == ">") {
      for (std::size_t i = last_index + 1; i < d.size(); ++i) {
        d[i] = v;
        covered[i] = true;
      }
      applied.push_back({&item, last_index + 1, d.size(), v});
      highest_set = kRoundUpPowerOfTwoIntervals - 1;
      after_gt = true;
      continue;
    }
    const std::uint64_t mb = parse_uint(key, item.boundary, form, source);
    if (!is_power_of_two(mb)) {
      fail(key, item.boundary.text, item.boundary.column(),
           "the interval sizes must be powers of two (in MiB)", form);
    }
    std::size_t index = static_cast<std::size_t>(std::bit_width(mb) - 1);
    index = std::min<std::size_t>(index, d.size() - 1);
    if (first) {
      for (std::size_t i = 0; i < index; ++i) {
        d[i] = v;
        covered[i] = true;
      }
    }
    d[index] = v;
    covered[index] = true;
    applied.push_back({&item, index, index + 1, v});
    if (static_cast<int>(index) <= previous_index && ordered) {
      ordered = false;
      first_out_of_order = &item;
    }
    previous_index = static_cast<int>(index);
    last_index = index;
    highest_set = std::max(highest_set, static_cast<int>(index));
    first = false;
  }
  if (gaps != nullptr) {
    for (int i = 0; i < highest_set; ++i) {
      if (!covered[static_cast<std::size_t>(i)]) gaps->push_back(i);
    }
  }
  if (order != nullptr && !ordered) {
    // Entries of which nothing is left in the table.
    std::string lost;
    for (const Applied& a : applied) {
      bool kept = false;
      for (std::size_t i = a.from; i < a.to; ++i) kept = kept || d[i] == a.value;
      if (!kept) {
        lost += fmt::format("{}'{}:{}'", lost.empty() ? "" : ", ", a.item->boundary.text,
                            a.item->value.text);
      }
    }
    // The table, by runs of equal divisions.
    std::string table;
    for (std::size_t a = 0; a < d.size();) {
      std::size_t b = a;
      while (b + 1 < d.size() && d[b + 1] == d[a]) ++b;
      table += fmt::format("{}{} {}{}", table.empty() ? "" : ", ",
                           interval_range(static_cast<int>(a), static_cast<int>(b)), d[a],
                           d[a] == 0 ? " (not rounded)" : "");
      a = b + 1;
    }
    *order = ConfigWarning{
        fmt::format("roundup_power2_divisions: the list is not in ascending order with '>' last "
                    "(from '{}:{}'); PyTorch 2.11 applies the entries in the order written (the "
                    "first size also fills the intervals below it, '>' fills those after the "
                    "size written just before it), {}so the divisions are: {} (the same as {})",
                    first_out_of_order->boundary.text, first_out_of_order->value.text,
                    lost.empty() ? std::string()
                                 : fmt::format("and {} {} overwritten, ", lost,
                                               lost.find(',') == std::string::npos ? "is" : "are"),
                    table, divisions_text(d)),
        first_out_of_order->boundary.column()};
  }
  return d;
}

// The sizes covered by intervals first..last (interval i covers [2^i MiB, 2^(i+1) MiB); the
// first one everything below 2 MiB, the last everything from 32 GiB).
std::string interval_range(int first, int last) {
  auto mib = [](std::uint64_t m) {
    return m >= 1024 ? fmt::format("{} GiB", m / 1024) : fmt::format("{} MiB", m);
  };
  const std::uint64_t hi = std::uint64_t{2} << last;
  if (last == kRoundUpPowerOfTwoIntervals - 1) {
    return first == 0 ? "all sizes" : fmt::format("from {}", mib(std::uint64_t{1} << first));
  }
  if (first == 0) return fmt::format("below {}", mib(hi));
  return fmt::format("[{}, {})", mib(std::uint64_t{1} << first), mib(hi));
}

}  // namespace cachet::config_internal

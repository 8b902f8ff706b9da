// tests/policy_cachet/outside.h: what the policy tests compute from outside the allocator: byte
// ranges (which stream freed which bytes, which bytes are live) and page counts of a snapshot.
#pragma once

#include <cstdint>
#include <iterator>
#include <map>
#include <set>

#include "cachet/snapshot.h"
#include "cachet/types.h"

namespace cachet::test {

inline constexpr Bytes kPage = 2 * MiB;  // the cachet policy's mapping granularity

// Byte ranges, kept as disjoint [lo, hi) intervals.
class Ranges {
 public:
  void add(std::uint64_t lo, std::uint64_t hi) {  // joins touching ranges
    remove(lo, hi);
    if (auto it = m_.find(hi); it != m_.end()) {
      hi = it->second;
      m_.erase(it);
    }
    if (auto it = m_.lower_bound(lo); it != m_.begin() && std::prev(it)->second == lo) {
      lo = std::prev(it)->first;
      m_.erase(std::prev(it));
    }
    m_[lo] = hi;
  }
  void remove(std::uint64_t lo, std::uint64_t hi) {
    auto it = m_.lower_bound(lo);
    if (it != m_.begin()) --it;
    while (it != m_.end() && it->first < hi) {
      auto [a, b] = *it;
      if (b <= lo) {
        ++it;
        continue;
      }
      it = m_.erase(it);
      if (a < lo) m_[a] = lo;
      if (b > hi) m_[hi] = b;
    }
  }
  // [lo, hi) lies inside one range.
  bool covers(std::uint64_t lo, std::uint64_t hi) const {
    auto it = m_.upper_bound(lo);
    if (it == m_.begin()) return false;
    --it;
    return it->first <= lo && it->second >= hi;
  }
  bool intersects(std::uint64_t lo, std::uint64_t hi) const {
    auto it = m_.lower_bound(lo);
    if (it != m_.begin()) --it;
    for (; it != m_.end() && it->first < hi; ++it)
      if (it->second > lo) return true;
    return false;
  }

 private:
  std::map<std::uint64_t, std::uint64_t> m_;
};

// Page counts of a snapshot, computed from its blocks alone: mapped pages (the segments are the
// runs of mapped pages), pages touched by live (allocated or pending) blocks, and "split" pages:
// mapped, touched by no live block, yet not lying inside one free block (free, but shared by
// free blocks of different streams, which R6 cannot unmap).
struct Pages {
  Bytes mapped = 0, touched = 0, split = 0;
};
inline Pages pages_of(const Snapshot& snap) {
  std::set<std::uint64_t> mapped, touched, whole;
  for (const auto& seg : snap) {
    for (std::uint64_t p = seg.address / kPage; p * kPage < seg.address + seg.total_size; ++p)
      mapped.insert(p);
    for (const auto& b : seg.blocks) {
      if (b.state != BlockState::Inactive) {
        for (std::uint64_t p = b.address / kPage; p * kPage < b.address + b.size; ++p)
          touched.insert(p);
      } else {
        for (std::uint64_t p = (b.address + kPage - 1) / kPage;
             (p + 1) * kPage <= b.address + b.size; ++p)
          whole.insert(p);
      }
    }
  }
  Pages r;
  r.mapped = mapped.size();
  r.touched = touched.size();
  for (std::uint64_t p : mapped)
    if (!touched.count(p) && !whole.count(p)) ++r.split;
  return r;
}

}  // namespace cachet::test

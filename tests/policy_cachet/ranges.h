// tests/policy_cachet/ranges.h: byte ranges for the policy tests' outside checks (which stream
// freed which bytes, which bytes are live).
#pragma once

#include <cstdint>
#include <iterator>
#include <map>

namespace cachet::test {

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

}  // namespace cachet::test

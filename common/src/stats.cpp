#include "cachet/stats.h"

#include <algorithm>

namespace cachet {
namespace {

struct NamedArray {
  const char* name;
  StatArray DeviceStats::*member;
};

constexpr NamedArray kArrays[] = {
    {"active", &DeviceStats::active},
    {"active_bytes", &DeviceStats::active_bytes},
    {"allocated_bytes", &DeviceStats::allocated_bytes},
    {"allocation", &DeviceStats::allocation},
    {"inactive_split", &DeviceStats::inactive_split},
    {"inactive_split_bytes", &DeviceStats::inactive_split_bytes},
    {"requested_bytes", &DeviceStats::requested_bytes},
    {"reserved_bytes", &DeviceStats::reserved_bytes},
    {"segment", &DeviceStats::segment},
};

constexpr const char* kTypeNames[kNumStatTypes] = {"all", "small_pool", "large_pool"};

struct NamedCounter {
  const char* name;
  std::int64_t DeviceStats::*member;
};

constexpr NamedCounter kCounters[] = {
    {"max_split_size", &DeviceStats::max_split_size},
    {"num_alloc_retries", &DeviceStats::num_alloc_retries},
    {"num_device_alloc", &DeviceStats::num_device_alloc},
    {"num_device_free", &DeviceStats::num_device_free},
    {"num_ooms", &DeviceStats::num_ooms},
    {"num_sync_all_streams", &DeviceStats::num_sync_all_streams},
};

struct NamedStat {
  const char* name;
  Stat DeviceStats::*member;
};

constexpr NamedStat kStats[] = {
    {"oversize_allocations", &DeviceStats::oversize_allocations},
    {"oversize_segments", &DeviceStats::oversize_segments},
};

template <class F>
void for_each_stat_field(F&& f) {  // f(prefix, Stat accessor)
  for (const auto& a : kArrays)
    for (int t = 0; t < kNumStatTypes; ++t)
      f(std::string(a.name) + "." + kTypeNames[t],
        [m = a.member, t](DeviceStats& s) -> Stat& { return (s.*m)[t]; });
  for (const auto& st : kStats)
    f(std::string(st.name), [m = st.member](DeviceStats& s) -> Stat& { return s.*m; });
}

}  // namespace

void DeviceStats::reset_accumulated() {
  for_each_stat_field([this](const std::string&, auto get) { get(*this).reset_accumulated(); });
  num_alloc_retries = num_ooms = num_sync_all_streams = num_device_alloc = num_device_free = 0;
}

void DeviceStats::reset_peak() {
  for_each_stat_field([this](const std::string&, auto get) { get(*this).reset_peak(); });
}

std::vector<std::pair<std::string, std::int64_t>> flatten(const DeviceStats& cs) {
  DeviceStats s = cs;
  std::vector<std::pair<std::string, std::int64_t>> out;
  out.reserve(122);
  for_each_stat_field([&](const std::string& prefix, auto get) {
    const Stat& st = get(s);
    out.emplace_back(prefix + ".allocated", st.allocated);
    out.emplace_back(prefix + ".current", st.current);
    out.emplace_back(prefix + ".freed", st.freed);
    out.emplace_back(prefix + ".peak", st.peak);
  });
  for (const auto& c : kCounters) out.emplace_back(c.name, s.*c.member);
  std::sort(out.begin(), out.end());
  return out;
}

DeviceStats unflatten(const std::map<std::string, std::int64_t>& kv,
                      std::vector<std::string>* unknown) {
  DeviceStats s;
  std::map<std::string, std::int64_t*> slots;
  for_each_stat_field([&](const std::string& prefix, auto get) {
    Stat& st = get(s);
    slots[prefix + ".allocated"] = &st.allocated;
    slots[prefix + ".current"] = &st.current;
    slots[prefix + ".freed"] = &st.freed;
    slots[prefix + ".peak"] = &st.peak;
  });
  for (const auto& c : kCounters) slots[c.name] = &(s.*c.member);
  for (const auto& [k, v] : kv) {
    auto it = slots.find(k);
    if (it != slots.end())
      *it->second = v;
    else if (unknown)
      unknown->push_back(k);
  }
  return s;
}

std::array<std::int64_t, 6> step_stats(const DeviceStats& s) {
  constexpr int all = static_cast<int>(StatType::Aggregate);
  return {s.allocated_bytes[all].current,      s.reserved_bytes[all].current,
          s.active_bytes[all].current,         s.inactive_split_bytes[all].current,
          s.segment[all].current,              s.requested_bytes[all].current};
}

}  // namespace cachet

// The sleep stats (cachet/stats.h SleepStats, docs/sleep-wake.md, section 5).
namespace cachet {
namespace {
struct SleepStatField {
  const char* name;
  Stat SleepStats::*member;
};
constexpr SleepStatField kSleepStats[] = {
    {"sleep.backup_bytes", &SleepStats::backup_bytes},
    {"sleep.sleeping_allocated_bytes", &SleepStats::sleeping_allocated_bytes},
    {"sleep.sleeping_bytes", &SleepStats::sleeping_bytes},
    {"sleep.sleeping_segments", &SleepStats::sleeping_segments},
};
struct SleepCounter {
  const char* name;
  std::int64_t SleepStats::*member;
};
constexpr SleepCounter kSleepCounters[] = {
    {"sleep.num_backup_failures", &SleepStats::num_backup_failures},
    {"sleep.num_frees_while_asleep", &SleepStats::num_frees_while_asleep},
    {"sleep.num_sleeps", &SleepStats::num_sleeps},
    {"sleep.num_wake_ooms", &SleepStats::num_wake_ooms},
    {"sleep.num_wakes", &SleepStats::num_wakes},
};
}  // namespace

void SleepStats::reset_accumulated() {
  for (const auto& f : kSleepStats) (this->*f.member).reset_accumulated();
  for (const auto& c : kSleepCounters) this->*c.member = 0;
}

void SleepStats::reset_peak() {
  for (const auto& f : kSleepStats) (this->*f.member).reset_peak();
}

std::vector<std::pair<std::string, std::int64_t>> flatten(const SleepStats& s) {
  std::vector<std::pair<std::string, std::int64_t>> out;
  for (const auto& f : kSleepStats) {
    const Stat& st = s.*f.member;
    const std::string p = f.name;
    out.emplace_back(p + ".allocated", st.allocated);
    out.emplace_back(p + ".current", st.current);
    out.emplace_back(p + ".freed", st.freed);
    out.emplace_back(p + ".peak", st.peak);
  }
  for (const auto& c : kSleepCounters) out.emplace_back(c.name, s.*c.member);
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace cachet

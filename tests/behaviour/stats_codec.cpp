// The "s" field of a dump line: how the 122 memory_stats() values changed during one op, in a
// compact, lossless form.
//
// The keys of flatten() that end in .current/.peak/.allocated/.freed form one counter (a Stat)
// per prefix; every other key is a scalar. A token per counter that changed:
//   <code><+-dc>[p<+-dp>][A<+-da>][F<+-df>]
// dc is the change of current; p, A and F appear only when the change of peak, allocated or
// freed is not the one a single increase or decrease by dc implies (dp = max(0, current after -
// peak before), da = max(dc, 0), df = max(-dc, 0)): an op that went up and down shows them. A
// scalar that changed: <code><+-d>. A counter "<x>.all" has no token when its change is the sum
// of its two pools' changes (current, allocated, freed; peak by the rule above): "allocB.s+512"
// alone also says that allocated_bytes.all grew by 512. Codes abbreviate the key (allocB.s =
// allocated_bytes.small_pool, allocB = allocated_bytes.all, dev_alloc = num_device_alloc); a key
// the table below does not know is its own code. decode_stats() is the inverse; the dump checks
// after every op that the field decodes to the stats it encodes.
#include <array>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cachet/stats.h"
#include "stats_codec.h"

namespace cachet::behaviour {
namespace {

const std::map<std::string, std::string, std::less<>>& abbreviations() {
  static const std::map<std::string, std::string, std::less<>> m = {
      {"active", "act"},
      {"active_bytes", "actB"},
      {"allocated_bytes", "allocB"},
      {"allocation", "alloc"},
      {"inactive_split", "isplit"},
      {"inactive_split_bytes", "isplitB"},
      {"requested_bytes", "reqB"},
      {"reserved_bytes", "resB"},
      {"segment", "seg"},
      {"oversize_allocations", "ovA"},
      {"oversize_segments", "ovS"},
      {"num_alloc_retries", "retries"},
      {"num_device_alloc", "dev_alloc"},
      {"num_device_free", "dev_free"},
      {"num_ooms", "ooms"},
      {"num_sync_all_streams", "syncs"},
      {"max_split_size", "max_split"},
      {"all", ""},
      {"small_pool", "s"},
      {"large_pool", "l"},
  };
  return m;
}

std::string code_of(const std::string& prefix) {
  std::string out;
  std::size_t at = 0;
  while (at <= prefix.size()) {
    const auto dot = prefix.find('.', at);
    const std::string part = prefix.substr(at, dot == std::string::npos ? std::string::npos : dot - at);
    const auto it = abbreviations().find(part);
    const std::string code = it == abbreviations().end() ? part : it->second;
    if (!code.empty()) out += (out.empty() ? "" : ".") + code;
    if (dot == std::string::npos) break;
    at = dot + 1;
  }
  return out;
}

constexpr std::string_view kFields[] = {"current", "peak", "allocated", "freed"};
constexpr char kLetter[4] = {'c', 'p', 'A', 'F'};
using Change = std::array<std::int64_t, 4>;  // of current, peak, allocated, freed

// flatten()'s keys as counters (a prefix with the four fields) and scalars.
struct Counter {
  std::string code;
  std::array<int, 4> keys{-1, -1, -1, -1};  // flatten() indices of current, peak, allocated, freed
  std::array<int, 2> pools{-1, -1};         // for "<x>.all": the counters of <x>.small_pool, <x>.large_pool
};
struct Layout {
  std::vector<std::string> keys;
  std::vector<Counter> counters;
  std::vector<std::pair<std::string, int>> scalars;  // code, flatten() index
  std::map<std::string, std::size_t, std::less<>> counter_by_code, scalar_by_code;
};

const Layout& layout() {
  static const Layout l = [] {
    Layout out;
    for (const auto& kv : flatten(DeviceStats{})) out.keys.push_back(kv.first);
    std::map<std::string, std::array<int, 4>> by_prefix;
    for (std::size_t k = 0; k < out.keys.size(); ++k) {
      const auto dot = out.keys[k].rfind('.');
      if (dot == std::string::npos) continue;
      for (int f = 0; f < 4; ++f)
        if (out.keys[k].substr(dot + 1) == kFields[f])
          by_prefix.try_emplace(out.keys[k].substr(0, dot), std::array<int, 4>{-1, -1, -1, -1})
              .first->second[f] = static_cast<int>(k);
    }
    std::vector<bool> used(out.keys.size(), false);
    std::map<std::string, std::size_t> index;
    for (const auto& [prefix, idx] : by_prefix) {
      if (idx[0] < 0 || idx[1] < 0 || idx[2] < 0 || idx[3] < 0) continue;  // not a whole counter
      for (int i : idx) used[i] = true;
      index[prefix] = out.counters.size();
      out.counter_by_code[code_of(prefix)] = out.counters.size();
      out.counters.push_back(Counter{code_of(prefix), idx, {-1, -1}});
    }
    for (const auto& [prefix, c] : index)
      if (prefix.ends_with(".all")) {
        const std::string base = prefix.substr(0, prefix.size() - 4);
        const auto s = index.find(base + ".small_pool"), g = index.find(base + ".large_pool");
        if (s != index.end() && g != index.end())
          out.counters[c].pools = {static_cast<int>(s->second), static_cast<int>(g->second)};
      }
    for (std::size_t k = 0; k < out.keys.size(); ++k)
      if (!used[k]) {
        out.scalar_by_code[code_of(out.keys[k])] = out.scalars.size();
        out.scalars.emplace_back(code_of(out.keys[k]), static_cast<int>(k));
      }
    if (out.counter_by_code.size() != out.counters.size() || out.scalar_by_code.size() != out.scalars.size())
      throw std::logic_error("behaviour dump: two stat keys share a code");
    return out;
  }();
  return l;
}

// One increase or decrease of current by dc, from the values `v`.
Change plain(const Counter& c, const std::vector<std::int64_t>& v, std::int64_t dc) {
  const std::int64_t c1 = v[c.keys[0]] + dc, p0 = v[c.keys[1]];
  return {dc, c1 > p0 ? c1 - p0 : 0, dc > 0 ? dc : 0, dc < 0 ? -dc : 0};
}

// What a counter's change is when its token is left out: an "all" counter moves by the sum of its
// pools' changes (current, allocated, freed; peak by the plain rule); any other does not move.
Change implied(const Counter& c, const std::vector<std::int64_t>& v, const Change* pools) {
  if (c.pools[0] < 0) return {0, 0, 0, 0};
  Change d = plain(c, v, pools[0][0] + pools[1][0]);
  d[2] = pools[0][2] + pools[1][2];
  d[3] = pools[0][3] + pools[1][3];
  return d;
}

void signed_num(std::string& out, std::int64_t v) {
  if (v >= 0) out += '+';
  out += std::to_string(v);
}

}  // namespace

std::vector<std::int64_t> stat_values(const DeviceStats& s) {
  std::vector<std::int64_t> out;
  for (const auto& kv : flatten(s)) out.push_back(kv.second);
  return out;
}

std::string encode_stats(const std::vector<std::int64_t>& before, const std::vector<std::int64_t>& after) {
  const Layout& l = layout();
  std::vector<Change> d(l.counters.size());
  for (std::size_t i = 0; i < l.counters.size(); ++i)
    for (int f = 0; f < 4; ++f) d[i][f] = after[l.counters[i].keys[f]] - before[l.counters[i].keys[f]];
  std::string out;
  for (std::size_t i = 0; i < l.counters.size(); ++i) {
    const Counter& c = l.counters[i];
    const Change pools[2] = {c.pools[0] < 0 ? Change{} : d[c.pools[0]], c.pools[1] < 0 ? Change{} : d[c.pools[1]]};
    if (d[i] == implied(c, before, pools)) continue;
    out += ' ';
    out += c.code;
    signed_num(out, d[i][0]);
    const Change p = plain(c, before, d[i][0]);
    for (int f = 1; f < 4; ++f)
      if (d[i][f] != p[f]) out += kLetter[f], signed_num(out, d[i][f]);
  }
  for (const auto& [code, k] : l.scalars)
    if (after[k] != before[k]) {
      out += ' ';
      out += code;
      signed_num(out, after[k] - before[k]);
    }
  return out;
}

void decode_stats(std::string_view field, std::vector<std::int64_t>& v) {
  const Layout& l = layout();
  if (v.size() != l.keys.size()) v.assign(l.keys.size(), 0);
  std::vector<std::optional<Change>> given(l.counters.size());
  const std::vector<std::int64_t> before = v;
  while (!field.empty()) {
    const auto sp = field.find(' ');
    std::string_view tok = field.substr(0, sp);
    field = sp == std::string_view::npos ? std::string_view{} : field.substr(sp + 1);
    if (tok.empty()) continue;
    const auto sign = tok.find_first_of("+-");
    if (sign == std::string_view::npos || sign == 0) throw std::invalid_argument("bad stats token " + std::string(tok));
    const std::string_view code = tok.substr(0, sign);
    tok = tok.substr(sign);
    std::map<char, std::int64_t> parts;  // <+-n>, then <letter><+-n> ...
    char letter = 'c';
    while (!tok.empty()) {
      std::size_t end = 1;
      while (end < tok.size() && tok[end] >= '0' && tok[end] <= '9') ++end;
      parts[letter] = std::stoll(std::string(tok.substr(0, end)));
      tok = tok.substr(end);
      if (tok.empty()) break;
      letter = tok[0];
      tok = tok.substr(1);
    }
    if (const auto it = l.counter_by_code.find(code); it != l.counter_by_code.end()) {
      Change d = plain(l.counters[it->second], before, parts['c']);
      for (int f = 1; f < 4; ++f)
        if (parts.count(kLetter[f])) d[f] = parts[kLetter[f]];
      given[it->second] = d;
    } else if (const auto is = l.scalar_by_code.find(code); is != l.scalar_by_code.end()) {
      v[l.scalars[is->second].second] += parts['c'];
    } else {
      throw std::invalid_argument("unknown stats code " + std::string(code));
    }
  }
  // Counters without pools first, then "all" counters, whose implied change needs their pools'.
  std::vector<Change> d(l.counters.size());
  for (int pass = 0; pass < 2; ++pass)
    for (std::size_t i = 0; i < l.counters.size(); ++i) {
      const Counter& c = l.counters[i];
      if ((c.pools[0] >= 0) != (pass == 1)) continue;
      const Change pools[2] = {c.pools[0] < 0 ? Change{} : d[c.pools[0]], c.pools[1] < 0 ? Change{} : d[c.pools[1]]};
      d[i] = given[i] ? *given[i] : implied(c, before, pools);
      for (int f = 0; f < 4; ++f) v[c.keys[f]] = before[c.keys[f]] + d[i][f];
    }
}

const std::vector<std::string>& stat_key_names() { return layout().keys; }

}  // namespace cachet::behaviour

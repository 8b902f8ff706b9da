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
#include "cachet/config.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cctype>
#include <charconv>
#include <cstdlib>
#include <map>
#include <optional>
#include <utility>

#include "cachet/errors.h"

namespace cachet {
namespace {

// ---------------------------------------------------------------------------------------------
// Keys

enum class Key : std::uint8_t {
  MaxSplitSize,
  MaxNonSplitRounding,
  LargeSegmentSize,
  GarbageCollectionThreshold,
  RoundupPower2Divisions,
  ExpandableSegments,
  PinnedUseBackgroundThreads,
  Backend,
  ReleaseLockOnCudaMalloc,
  PinnedUseCudaHostRegister,
  PinnedNumRegisterThreads,
  PinnedReserveSegmentSize,
  GraphCaptureRecordStreamReuse,
  PerProcessMemoryFraction,
  Policy,
  CachetValidate,
};

struct KeyInfo {
  std::string_view name;
  Key key;
  bool cachet_only;
  std::string_view form;  // the accepted form, for error messages
};

constexpr std::string_view kBoolForm = "True or False";

// Every key 2.11 accepts (with its HIP aliases), then cachet's own.
constexpr KeyInfo kKeys[] = {
    {"max_split_size_mb", Key::MaxSplitSize, false,
     "a whole number of MiB >= large_segment_size_mb (20 by default), e.g. max_split_size_mb:128"},
    {"max_non_split_rounding_mb", Key::MaxNonSplitRounding, false,
     "a whole number of MiB >= large_segment_size_mb (20 by default), e.g. "
     "max_non_split_rounding_mb:64"},
    {"large_segment_size_mb", Key::LargeSegmentSize, false,
     "a whole number of MiB > 10, e.g. large_segment_size_mb:32"},
    {"garbage_collection_threshold", Key::GarbageCollectionThreshold, false,
     "a fraction strictly between 0 and 1, e.g. garbage_collection_threshold:0.6"},
    {"roundup_power2_divisions", Key::RoundupPower2Divisions, false,
     "a power of two (roundup_power2_divisions:4) or a list of size_mb:divisions with power-of-two "
     "sizes and divisions a power of two or 0, optionally ending in >:divisions "
     "(roundup_power2_divisions:[256:1,512:2,>:8])"},
    {"expandable_segments", Key::ExpandableSegments, false, kBoolForm},
    {"pinned_use_background_threads", Key::PinnedUseBackgroundThreads, false, kBoolForm},
    {"backend", Key::Backend, false, "native or cudaMallocAsync"},
    {"release_lock_on_cudamalloc", Key::ReleaseLockOnCudaMalloc, false, kBoolForm},
    {"release_lock_on_hipmalloc", Key::ReleaseLockOnCudaMalloc, false, kBoolForm},
    {"pinned_use_cuda_host_register", Key::PinnedUseCudaHostRegister, false, kBoolForm},
    {"pinned_use_hip_host_register", Key::PinnedUseCudaHostRegister, false, kBoolForm},
    {"pinned_num_register_threads", Key::PinnedNumRegisterThreads, false,
     "a power of two from 1 to 128, e.g. pinned_num_register_threads:8"},
    {"pinned_reserve_segment_size_mb", Key::PinnedReserveSegmentSize, false,
     "a whole number of MiB > 0, e.g. pinned_reserve_segment_size_mb:1024"},
    {"graph_capture_record_stream_reuse", Key::GraphCaptureRecordStreamReuse, false, kBoolForm},
    {"per_process_memory_fraction", Key::PerProcessMemoryFraction, false,
     "a fraction from 0 to 1, e.g. per_process_memory_fraction:0.5"},
    {"policy", Key::Policy, true, "pytorch or cachet"},
    {"cachet_validate", Key::CachetValidate, true, kBoolForm},
};

// Keys of PyTorch releases after 2.11: 2.11 rejects them.
constexpr std::string_view kNewerKeys[] = {"throw_on_cudamalloc_oom", "expandable_segments_reserve",
                                           "expandable_segments_reserve_by_class",
                                           "pinned_free_catch_all"};

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

std::string lowercase(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// The known key nearest to `name`: the same key in lower case; else the nearest by edit distance
// when it is close (at most a third of the name, at least 2); else the key sharing the most
// words ("garbage_interval" -> garbage_collection_threshold). nullopt when nothing is close.
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
  if (best != nullptr) return best->name;
  return std::nullopt;
}

// ---------------------------------------------------------------------------------------------
// Tokens

struct Token {
  std::string text;                // whitespace removed
  std::vector<std::size_t> cols;   // 1-based input column of each character of text
  bool is(char sep) const { return text.size() == 1 && text[0] == sep && separator; }
  bool separator = false;          // one of , : [ ]
  std::size_t column() const { return cols.empty() ? 0 : cols.front(); }
};

std::vector<Token> tokenize(std::string_view text) {
  std::vector<Token> out;
  Token word;
  auto flush = [&] {
    if (!word.text.empty()) out.push_back(std::move(word));
    word = Token{};
  };
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == ',' || c == ':' || c == '[' || c == ']') {
      flush();
      out.push_back(Token{std::string(1, c), {i + 1}, true});
    } else if (!std::isspace(static_cast<unsigned char>(c))) {
      word.text += c;
      word.cols.push_back(i + 1);
    }
  }
  flush();
  return out;
}

[[noreturn]] void fail(std::string_view key, std::string_view text, std::size_t column,
                       std::string_view problem, std::string_view accepted = {}) {
  std::string message;
  if (!key.empty()) message = fmt::format("{}: ", key);
  message += problem;
  if (column > 0 && text.empty()) message += fmt::format(" (at column {}, the end)", column);
  if (column > 0 && !text.empty()) message += fmt::format(" ('{}' at column {})", text, column);
  if (!accepted.empty()) message += fmt::format(". Accepted: {}", accepted);
  throw ConfigError(std::move(message), std::string(key), std::string(text), column);
}

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

// A ';' inside a token: the options were separated by ';'. Reports it at the ';'.
[[noreturn]] void fail_semicolon(std::string_view key, const Token& tok, ConfigSource source) {
  const std::size_t at = tok.text.find(';');
  std::string problem = "options are separated by ',' not ';'";
  const std::string_view after = std::string_view(tok.text).substr(at + 1);
  const std::string_view next = after.substr(0, after.find(';'));
  if (!next.empty()) {
    if (find_key(next) == nullptr) {
      problem += fmt::format(", and {}", describe_unknown(next, source));
    } else {
      problem += fmt::format(": write ',{}'", next);
    }
  }
  fail(key, tok.text, tok.cols[at], problem);
}

// ---------------------------------------------------------------------------------------------
// Syntax

struct ListItem {
  Token boundary;  // a number of MiB, or ">"
  Token value;
};

struct Option {
  const KeyInfo* key = nullptr;
  Token name;
  Token value;                    // empty text when the value is a list
  std::optional<Token> open;      // the '[' of a list
  std::vector<ListItem> items;
};

std::vector<Option> parse_syntax(const std::vector<Token>& toks, ConfigSource source) {
  std::vector<Option> out;
  std::size_t i = 0;
  const std::size_t n = toks.size();
  while (i < n) {
    const Token& name = toks[i];
    if (name.separator) {
      if (name.is(',')) {
        fail("", name.text, name.column(),
             i == 0 ? "the string starts with ',': an empty option"
                    : "two ',' in a row: an empty option",
             "key:value options separated by single ','");
      }
      fail("", name.text, name.column(), fmt::format("expected an option name, found '{}'", name.text),
           "key:value options separated by ','");
    }
    if (name.text.find(';') != std::string::npos) fail_semicolon("", name, source);
    const KeyInfo* key = find_key(name.text);
    if (key == nullptr) {
      const auto eq = name.text.find('=');
      if (eq != std::string::npos && find_key(std::string_view(name.text).substr(0, eq)) != nullptr) {
        fail(name.text.substr(0, eq), name.text, name.column(),
             "options are written key:value, not key=value");
      }
      throw ConfigError(
          fmt::format("{} (at column {}). Accepted: the options listed in docs/configuration.md",
                      describe_unknown(name.text, source), name.column()),
          name.text, name.text, name.column());
    }
    if (key->cachet_only && source != ConfigSource::Cachet) {
      fail(key->name, name.text, name.column(),
           "is a cachet option, and PyTorch would reject it (\"Unrecognized key\"): move it to "
           "CACHET_ALLOC_CONF");
    }
    Option opt;
    opt.key = key;
    opt.name = name;
    ++i;
    if (i >= n || !toks[i].is(':')) {
      const std::size_t col = i < n ? toks[i].column() : name.cols.back() + 1;
      fail(key->name, i < n ? toks[i].text : std::string(), col,
           fmt::format("expected ':' and a value after {}", key->name), key->form);
    }
    const Token& colon = toks[i];
    ++i;
    if (i >= n || toks[i].is(',')) {
      fail(key->name, colon.text, colon.column(), "the value is empty", key->form);
    }
    if (toks[i].is('[')) {
      if (key->key != Key::RoundupPower2Divisions) {
        fail(key->name, toks[i].text, toks[i].column(), "takes a single value, not a list",
             key->form);
      }
      opt.open = toks[i];
      ++i;
      auto unclosed = [&] {
        fail(key->name, "[", opt.open->column(), "the '[' is never closed: add ']'", key->form);
      };
      while (true) {
        if (i >= n) unclosed();
        if (toks[i].is(']')) {
          ++i;
          break;
        }
        if (toks[i].separator) {
          fail(key->name, toks[i].text, toks[i].column(),
               fmt::format("expected a size in MiB or '>' in the list, found '{}'", toks[i].text),
               key->form);
        }
        ListItem item;
        item.boundary = toks[i++];
        if (i >= n) unclosed();
        if (!toks[i].is(':')) {
          fail(key->name, toks[i].text, toks[i].column(),
               fmt::format("expected ':' and divisions after '{}'", item.boundary.text), key->form);
        }
        ++i;
        if (i >= n) unclosed();
        if (toks[i].separator) {
          fail(key->name, toks[i].text, toks[i].column(),
               fmt::format("expected the divisions after '{}:'", item.boundary.text), key->form);
        }
        item.value = toks[i++];
        opt.items.push_back(std::move(item));
        if (i >= n) unclosed();
        if (toks[i].is(',')) {
          ++i;
        } else if (!toks[i].is(']')) {
          fail(key->name, toks[i].text, toks[i].column(), "expected ',' or ']' after a list entry",
               key->form);
        }
      }
    } else if (toks[i].separator) {
      fail(key->name, toks[i].text, toks[i].column(),
           fmt::format("expected a value, found '{}'", toks[i].text), key->form);
    } else {
      opt.value = toks[i++];
      if (opt.value.text.find(';') != std::string::npos) fail_semicolon(key->name, opt.value, source);
    }
    out.push_back(std::move(opt));
    if (i < n) {
      if (!toks[i].is(',')) {
        fail(key->name, toks[i].text, toks[i].column(),
             fmt::format("expected ',' before '{}': options are separated by ','", toks[i].text));
      }
      ++i;  // a trailing ',' ends the loop: accepted, as PyTorch does
    }
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Values

std::uint64_t parse_uint(std::string_view key, const Token& tok, std::string_view form,
                         ConfigSource source) {
  const std::string& s = tok.text;
  if (s.find(';') != std::string::npos) fail_semicolon(key, tok, source);
  if (s[0] == '-') fail(key, s, tok.column(), "negative values are not allowed", form);
  std::uint64_t v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (end == s.data()) fail(key, s, tok.column(), "not a whole number", form);
  if (ec == std::errc::result_out_of_range) {
    fail(key, s, tok.column(), "the number is too large (more than 64 bits)", form);
  }
  if (end != s.data() + s.size()) {
    const std::size_t at = static_cast<std::size_t>(end - s.data());
    fail(key, s, tok.cols[at], fmt::format("unexpected text '{}' after the number", s.substr(at)),
         form);
  }
  return v;
}

Bytes parse_mib(std::string_view key, const Token& tok, std::string_view form, ConfigSource source) {
  const std::uint64_t mb = parse_uint(key, tok, form, source);
  if (mb > std::numeric_limits<Bytes>::max() / MiB) {
    fail(key, tok.text, tok.column(),
         "the size is too large: its bytes do not fit in 64 bits (at most 17592186044415 MiB)",
         form);
  }
  return mb * MiB;
}

double parse_double(std::string_view key, const Token& tok, std::string_view form,
                    ConfigSource source) {
  const std::string& s = tok.text;
  if (s.find(';') != std::string::npos) fail_semicolon(key, tok, source);
  double v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (end == s.data() || ec != std::errc{}) fail(key, s, tok.column(), "not a number", form);
  if (end != s.data() + s.size()) {
    const std::size_t at = static_cast<std::size_t>(end - s.data());
    fail(key, s, tok.cols[at], fmt::format("unexpected text '{}' after the number", s.substr(at)),
         form);
  }
  return v;
}

bool parse_bool(std::string_view key, const Token& tok, ConfigSource source) {
  if (tok.text == "True") return true;
  if (tok.text == "False") return false;
  if (tok.text.find(';') != std::string::npos) fail_semicolon(key, tok, source);
  const std::string lower = lowercase(tok.text);
  std::string_view hint;
  if (lower == "true" || lower == "1" || lower == "yes" || lower == "on") hint = ": did you mean True?";
  if (lower == "false" || lower == "0" || lower == "no" || lower == "off") hint = ": did you mean False?";
  fail(key, tok.text, tok.column(),
       fmt::format("expected True or False, capitalized as Python writes them{}", hint),
       kBoolForm);
}

bool is_power_of_two(std::uint64_t v) { return std::has_single_bit(v); }

constexpr std::uint64_t kMaxDivisions = std::uint64_t{1} << 31;  // fits Config's uint32 entries

std::uint32_t parse_divisions(std::string_view key, const Token& tok, bool zero_ok,
                              std::string_view form, ConfigSource source) {
  const std::uint64_t v = parse_uint(key, tok, form, source);
  if (!(is_power_of_two(v) || (zero_ok && v == 0))) {
    fail(key, tok.text, tok.column(),
         zero_ok ? "the divisions must be a power of two, or 0 to disable rounding"
                 : "the divisions must be a power of two (0 is only accepted inside a list)",
         form);
  }
  if (v > kMaxDivisions) {
    fail(key, tok.text, tok.column(), "the divisions are too large (at most 2147483648)", form);
  }
  return static_cast<std::uint32_t>(v);
}

using Divisions = std::array<std::uint32_t, kRoundUpPowerOfTwoIntervals>;

std::string divisions_text(const Divisions& d);  // the canonical list, below
std::string interval_range(int first, int last);

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

}  // namespace

// ---------------------------------------------------------------------------------------------

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

namespace {

std::string bool_text(bool b) { return b ? "True" : "False"; }

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

}  // namespace

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
  std::string out;
  for (std::size_t i = 0; i < parts.size(); ++i) out += (i ? "," : "") + parts[i];
  return out;
}

EnvConfig config_from_environment() {
  EnvConfig env;
  struct Variable {
    const char* name;
    ConfigSource source;
  };
  // 2.11's precedence: the CUDA variable wins over the generic one (§4.1).
  constexpr Variable kVariables[] = {{"CACHET_ALLOC_CONF", ConfigSource::Cachet},
                                     {"PYTORCH_CUDA_ALLOC_CONF", ConfigSource::PyTorch},
                                     {"PYTORCH_ALLOC_CONF", ConfigSource::PyTorch}};
  for (const Variable& v : kVariables) {
    const char* value = std::getenv(v.name);
    if (value == nullptr) continue;  // set but empty counts as set, as in PyTorch
    env.variable = v.name;
    env.text = value;
    try {
      env.parsed = parse_config(env.text, v.source);
    } catch (const ConfigError& e) {
      throw ConfigError(fmt::format("{}={}: {}", v.name, env.text, e.what()), e.key(), e.text(),
                        e.column());
    }
    break;
  }
  if (const char* nc = std::getenv("PYTORCH_NO_CUDA_MEMORY_CACHING")) {
    const std::string_view s = nc;
    if (s == "1") {
      env.parsed.config.no_caching = true;
    } else if (s != "0") {
      throw ConfigError(
          fmt::format("PYTORCH_NO_CUDA_MEMORY_CACHING={}: expected 1 (no caching) or 0 (caching); "
                      "PyTorch ignores other values with a warning",
                      s),
          "PYTORCH_NO_CUDA_MEMORY_CACHING", std::string(s), 1);
    }
  }
  return env;
}

}  // namespace cachet

// config_internal.h: private to common/src, shared by the files that parse and print the
// configuration string (config.cpp: parse_config; config_keys.cpp: the key table and the
// suggestions for unknown keys; config_syntax.cpp: the tokenizer, the syntax and the error
// messages; config_values.cpp: numbers, sizes and booleans; config_divisions.cpp:
// roundup_power2_divisions lists and their warning; config_print.cpp: to_string). It holds the
// keys, the tokens and options the syntax step produces, and the helpers one step calls in
// another. Nothing here is part of the installed API (cachet/config.h is); the names live in
// cachet::config_internal so that they cannot meet other libraries' helpers.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cachet/config.h"

namespace cachet::config_internal {

// ---------------------------------------------------------------------------------------------
// Keys (config_keys.cpp)

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
  CachetSleep,
};

struct KeyInfo {
  std::string_view name;
  Key key;
  bool cachet_only;
  std::string_view form;  // the accepted form, for error messages
  std::string_view meaning = {};  // what it does (cachet check-conf --list)
};

inline constexpr std::string_view kBoolForm = "True or False";

// The entry of the key table named `name`, or nullptr.
const KeyInfo* find_key(std::string_view name);
// The entry of `key` (the first, for keys with HIP aliases).
const KeyInfo& info(Key key);

std::string lowercase(std::string_view s);

// "'x' is no option (did you mean 'y'?)", or that x is an option of a later PyTorch release.
std::string describe_unknown(std::string_view name, ConfigSource source);

// ---------------------------------------------------------------------------------------------
// Tokens and syntax (config_syntax.cpp)

struct Token {
  std::string text;                // whitespace removed
  std::vector<std::size_t> cols;   // 1-based input column of each character of text
  bool is(char sep) const { return text.size() == 1 && text[0] == sep && separator; }
  bool separator = false;          // one of , : [ ]
  std::size_t column() const { return cols.empty() ? 0 : cols.front(); }
};

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

std::vector<Token> tokenize(std::string_view text);

// Throws the ConfigError "key: problem ('text' at column N). Accepted: accepted".
[[noreturn]] void fail(std::string_view key, std::string_view text, std::size_t column,
                       std::string_view problem, std::string_view accepted = {});

// A ';' inside a token: the options were separated by ';'. Reports it at the ';'.
[[noreturn]] void fail_semicolon(std::string_view key, const Token& tok, ConfigSource source);

std::vector<Option> parse_syntax(const std::vector<Token>& toks, ConfigSource source);

// ---------------------------------------------------------------------------------------------
// Values (config_values.cpp)

std::uint64_t parse_uint(std::string_view key, const Token& tok, std::string_view form,
                         ConfigSource source);
Bytes parse_mib(std::string_view key, const Token& tok, std::string_view form, ConfigSource source);
double parse_double(std::string_view key, const Token& tok, std::string_view form,
                    ConfigSource source);
bool parse_bool(std::string_view key, const Token& tok, ConfigSource source);
bool is_power_of_two(std::uint64_t v);
std::uint32_t parse_divisions(std::string_view key, const Token& tok, bool zero_ok,
                              std::string_view form, ConfigSource source);

// ---------------------------------------------------------------------------------------------
// roundup_power2_divisions (config_divisions.cpp; divisions_text in config_print.cpp)

using Divisions = std::array<std::uint32_t, kRoundUpPowerOfTwoIntervals>;

Divisions parse_division_list(const Option& opt, ConfigSource source, std::vector<int>* gaps,
                              std::optional<ConfigWarning>* order);

// The sizes covered by intervals first..last, e.g. "[2 MiB, 8 MiB)".
std::string interval_range(int first, int last);

// A list that 2.11's list parser turns back into exactly `d` (the canonical form).
std::string divisions_text(const Divisions& d);

}  // namespace cachet::config_internal

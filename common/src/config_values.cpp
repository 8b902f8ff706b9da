// config_values.cpp: the values of single options, validated as PyTorch 2.11 validates them and
// stricter where docs/configuration.md says so: whole numbers (no sign, no text after the number,
// no overflow), sizes in MiB whose bytes fit in 64 bits, fractions, True/False with a hint for
// true/1/yes/on, and the divisions of roundup_power2_divisions (a power of two, or 0 in a list).
#include <bit>
#include <charconv>
#include <limits>
#include <string>

#include <fmt/format.h>

#include "config_internal.h"

namespace cachet::config_internal {
namespace {

constexpr std::uint64_t kMaxDivisions = std::uint64_t{1} << 31;  // fits Config's uint32 entries

}  // namespace

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

}  // namespace cachet::config_internal

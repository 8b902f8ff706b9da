// tools/io/src/json_damage.h (private to cachet_io): where a JSON text that a parser refused is
// broken, said in the user's terms. simdjson reports a truncated document at the root (byte
// offset 0) or with no position at all; this scan finds where the text really ends or where a
// bracket does not match, and the field path there (device_traces[0][33].size).
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace cachet::io::detail {

struct JsonDamage {
  std::string where;    // the field path at the damage ("<root>" at the top level)
  std::string problem;  // e.g. "truncated JSON: the text ends at byte 5000 with 4 objects or
                        // arrays open (it was cut short: copy or save the file again)"
};

// One pass over `text` (strings and escapes honoured). nullopt when the brackets balance and
// every string closes: the damage is elsewhere (a missing comma, a bad literal) and the
// parser's own position stands.
std::optional<JsonDamage> find_json_damage(std::string_view text);

}  // namespace cachet::io::detail

// The names of the rule flips and the one selected by CACHET_RULE_FLIP (cachet/rule_flip.h).
#define CACHET_RULE_FLIP_NAMES_ONLY
#include "cachet/rule_flip.h"

#include <array>
#include <cstdlib>
#include <string>

#include "cachet/errors.h"

namespace cachet {

namespace {
constexpr std::array kFlips = {
#define CACHET_RULE_FLIP_INFO(e, name, section, what) RuleFlipInfo{RuleFlip::e, name, section, what},
    CACHET_RULE_FLIP_LIST(CACHET_RULE_FLIP_INFO)
#undef CACHET_RULE_FLIP_INFO
};

RuleFlip read_rule_flip() {
  const char* env = std::getenv("CACHET_RULE_FLIP");
  if (env == nullptr || *env == '\0') return RuleFlip::None;
  const std::string_view name(env);
  for (const RuleFlipInfo& f : kFlips)
    if (f.name == name) return f.flip;
  std::string known;
  for (const RuleFlipInfo& f : kFlips) known += (known.empty() ? "" : ", ") + std::string(f.name);
  throw UsageError("CACHET_RULE_FLIP=" + std::string(name) +
                   ": no such rule flip; unset it for the real rules or name one of: " + known +
                   " (docs/verification.md)");
}
}  // namespace

std::span<const RuleFlipInfo> rule_flips() { return kFlips; }

RuleFlip active_rule_flip() {
  static const RuleFlip flip = read_rule_flip();
  return flip;
}

}  // namespace cachet

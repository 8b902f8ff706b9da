// find_json_damage: a bracket stack with, per open object, its current key and, per open array,
// its current element index; enough to name the field where a JSON text breaks.
#include "json_damage.h"

#include <fmt/format.h>

#include <vector>

namespace cachet::io::detail {
namespace {

struct Frame {
  char open;             // '{' or '['
  std::size_t at;        // byte offset of the bracket
  std::size_t index = 0;  // '[': the element being read
  std::string key;        // '{': the member being read
  bool expect_key = true;  // '{': the next string is a key
};

std::string path_of(const std::vector<Frame>& stack) {
  std::string p;
  for (const Frame& f : stack) {
    if (f.open == '[') {
      p += fmt::format("[{}]", f.index);
    } else if (!f.key.empty()) {
      if (!p.empty()) p += '.';
      p += f.key;
    }
  }
  if (p.size() > 160) p = "..." + p.substr(p.size() - 157);  // hostile nesting: the innermost part
  return p.empty() ? "<root>" : p;
}

}  // namespace

std::optional<JsonDamage> find_json_damage(std::string_view text) {
  std::vector<Frame> stack;
  bool in_string = false, escape = false, key_string = false;
  std::size_t string_start = 0;
  bool closed = false;  // the top-level value has ended
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (closed && c != ' ' && c != '\n' && c != '\r' && c != '\t')
      return JsonDamage{"<root>", fmt::format("malformed JSON: text after the end of the top-level value, at byte {}", i)};
    if (in_string) {
      if (escape) {
        escape = false;
      } else if (c == '\\') {
        escape = true;
      } else if (c == '"') {
        in_string = false;
        if (key_string) stack.back().key = std::string(text.substr(string_start, std::min<std::size_t>(i - string_start, 64)));
      }
      continue;
    }
    switch (c) {
      case '"':
        in_string = true;
        string_start = i + 1;
        key_string = !stack.empty() && stack.back().open == '{' && stack.back().expect_key;
        break;
      case '{':
      case '[':
        stack.push_back(Frame{c, i, 0, {}, true});
        break;
      case '}':
      case ']': {
        const char want = c == '}' ? '{' : '[';
        if (stack.empty())
          return JsonDamage{"<root>", fmt::format("malformed JSON: the '{}' at byte {} closes nothing", c, i)};
        if (stack.back().open != want)
          return JsonDamage{path_of(stack), fmt::format("malformed JSON: the '{}' at byte {} does not close the '{}' "
                                                        "opened at byte {}",
                                                        c, i, stack.back().open, stack.back().at)};
        stack.pop_back();
        closed = stack.empty();
        break;
      }
      case ',':
        if (!stack.empty()) {
          if (stack.back().open == '[') ++stack.back().index;
          else stack.back().expect_key = true;
        }
        break;
      case ':':
        if (!stack.empty() && stack.back().open == '{') stack.back().expect_key = false;
        break;
      default: break;
    }
  }
  if (!in_string && stack.empty()) return std::nullopt;
  return JsonDamage{
      path_of(stack),
      fmt::format("truncated JSON: the text ends at byte {}{}, with {} object{} or array{} left open; the file "
                  "was cut short (an interrupted write or copy?): save or copy it again",
                  text.size(), in_string ? " inside a string" : "", stack.size(), stack.size() == 1 ? "" : "s",
                  stack.size() == 1 ? "" : "s")};
}

}  // namespace cachet::io::detail

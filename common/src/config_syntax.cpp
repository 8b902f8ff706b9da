// config_syntax.cpp: the first two of parse_config's three steps, and the error messages.
//   tokenize  split on ',' ':' '[' ']' and drop all whitespace, as c10's ConfigTokenizer does,
//             remembering each character's 1-based column in the input;
//   syntax    options = key ':' (value | '[' item (',' item)* ']'), separated by ',', an
//             optional trailing ','; unknown keys are rejected here, with a suggestion.
// fail() builds every ConfigError of the parser (key, offending text, column, accepted form);
// fail_semicolon() explains a ';' used as a separator.
#include <cctype>
#include <string>
#include <utility>

#include <fmt/format.h>

#include "cachet/errors.h"
#include "config_internal.h"

namespace cachet::config_internal {

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
                       std::string_view problem, std::string_view accepted) {
  std::string message;
  if (!key.empty()) message = fmt::format("{}: ", key);
  message += problem;
  if (column > 0 && text.empty()) message += fmt::format(" (at column {}, the end)", column);
  if (column > 0 && !text.empty()) message += fmt::format(" ('{}' at column {})", text, column);
  if (!accepted.empty()) message += fmt::format(". Accepted: {}", accepted);
  throw ConfigError(std::move(message), std::string(key), std::string(text), column);
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
      // The whole assignment pasted (VAR=value), or the shell's quotes kept in the value.
      const std::string_view var = std::string_view(name.text).substr(0, eq);
      const bool conf_var = var == "PYTORCH_CUDA_ALLOC_CONF" || var == "PYTORCH_ALLOC_CONF" ||
                            var == "PYTORCH_HIP_ALLOC_CONF" || var == "CACHET_ALLOC_CONF";
      if (eq != std::string::npos && conf_var) {
        fail("", name.text.substr(0, eq + 1), name.column(),
             fmt::format("the string starts with the variable's name: give only its value, what follows '{}='",
                         var));
      }
      if (conf_var) {  // the variable's name alone
        fail("", name.text, name.column(),
             fmt::format("{} is the environment variable's name, not a configuration: give its value, e.g. cachet "
                         "check-conf{} \"${}\"",
                         var, var == "CACHET_ALLOC_CONF" ? " --source cachet" : "", var));
      }
      // Another of PyTorch's memory variables, not a key of the string.
      if (var == "PYTORCH_NO_CUDA_MEMORY_CACHING") {
        fail("", name.text, name.column(),
             "PYTORCH_NO_CUDA_MEMORY_CACHING is an environment variable of its own, not an option of the "
             "configuration string: set it in the environment (PYTORCH_NO_CUDA_MEMORY_CACHING=1 python train.py) to "
             "turn PyTorch's caching allocator off, every allocation then a cudaMalloc and every free a cudaFree; "
             "PYTORCH_CUDA_ALLOC_CONF takes the options cachet check-conf --list prints");
      }
      if (name.text[0] == '"' || name.text[0] == '\'') {
        fail("", name.text.substr(0, 1), name.column(),
             "the value has quotes in it: remove them (quotes around the value belong to the shell, not to it)");
      }
      throw ConfigError(
          fmt::format("{} (at column {}). Accepted: the options cachet check-conf --list prints",
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


}  // namespace cachet::config_internal

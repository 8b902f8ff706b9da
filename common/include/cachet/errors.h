// cachet/errors.h: the errors cachet reports. Nothing in cachet aborts on bad input: it throws
// one of these (C++) or returns its message (C ABI), and changes nothing.
#pragma once

#include <cstddef>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>

#include "cachet/types.h"

namespace cachet {

struct OomFacts;  // cachet/summary.h

// PyTorch's OutOfMemoryError. what() is PyTorch's exact message: the text it was made from, or
// for one made from the facts an allocator ran out of memory with, oom_message(facts)
// (cachet/summary.h), formatted once at the first what() (a caller that reads no text formats
// none). Copies share the text.
class OutOfMemory : public std::bad_alloc {
 public:
  explicit OutOfMemory(std::string message);
  explicit OutOfMemory(const OomFacts& facts);
  const char* what() const noexcept override;
  // The facts what() states; nullptr for an exception made from a text.
  const OomFacts* facts() const noexcept;

 private:
  struct Text;
  std::shared_ptr<const Text> text_;
};

// Misuse: free of an unknown or interior pointer, double free, record_stream on a freed block,
// a stream of another device, an invalid memory fraction, ...
class UsageError : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

// A device call failed for a reason other than running out of memory.
class DeviceError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// PyTorch 2.11 itself fails at this point (an internal assertion that ends the process); the
// model says so instead of guessing what would follow. what() names the rule
// (docs/pytorch-allocator.md §N). After it the model's state is PyTorch's at its assertion.
class PyTorchFailure : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

// A configuration string could not be accepted. what() is the full human message; the fields
// say where and what.
class ConfigError : public std::invalid_argument {
 public:
  ConfigError(std::string message, std::string key, std::string text, std::size_t column)
      : std::invalid_argument(std::move(message)),
        key_(std::move(key)),
        text_(std::move(text)),
        column_(column) {}
  const std::string& key() const { return key_; }    // the option involved ("" if none)
  const std::string& text() const { return text_; }  // the offending text
  std::size_t column() const { return column_; }     // 1-based column in the input string

 private:
  std::string key_;
  std::string text_;
  std::size_t column_;
};

}  // namespace cachet

// cachet/errors.h: OutOfMemory's text, given or formatted from its facts at the first what().
#include "cachet/errors.h"

#include <mutex>
#include <optional>

#include "cachet/summary.h"

namespace cachet {

struct OutOfMemory::Text {
  std::optional<OomFacts> facts;  // set: `message` is oom_message(*facts) once `once` has run
  mutable std::once_flag once;
  mutable std::string message;
};

OutOfMemory::OutOfMemory(std::string message) {
  auto t = std::make_shared<Text>();
  t->message = std::move(message);
  text_ = std::move(t);
}

OutOfMemory::OutOfMemory(const OomFacts& facts) {
  auto t = std::make_shared<Text>();
  t->facts = facts;
  text_ = std::move(t);
}

const char* OutOfMemory::what() const noexcept {
  if (text_->facts) std::call_once(text_->once, [this] { text_->message = oom_message(*text_->facts); });
  return text_->message.c_str();
}

const OomFacts* OutOfMemory::facts() const noexcept { return text_->facts ? &*text_->facts : nullptr; }

}  // namespace cachet

// Tags and the calling thread's current tag (cachet/tags.h).
#include "cachet/tags.h"

#include <algorithm>
#include <atomic>

#include "cachet/errors.h"

namespace cachet {

namespace detail {
std::atomic<bool> g_tag_ever_set{false};
}  // namespace detail

namespace {
Tag& thread_tag() {
  thread_local Tag tag{kDefaultTag};
  return tag;
}
}  // namespace

bool valid_tag(std::string_view tag) {
  if (tag.empty() || tag.size() > 64 || tag == "all" || tag == "none") return false;
  return std::all_of(tag.begin(), tag.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '.' ||
           c == '-';
  });
}

void check_tag(std::string_view tag) {
  if (!valid_tag(tag))
    throw UsageError("tag '" + std::string(tag) +
                     "' is not a tag: a tag is 1 to 64 characters of letters, digits, '_', '.' and '-', and "
                     "not 'all' or 'none' (the op text form's words for every tag and no tag)");
}

const Tag& current_tag() { return thread_tag(); }

void set_current_tag(std::string_view tag) {
  check_tag(tag);
  if (tag != kDefaultTag) detail::g_tag_ever_set.store(true, std::memory_order_relaxed);
  thread_tag() = Tag(tag);
}

TagScope::TagScope(std::string_view tag) : previous_(current_tag()) { set_current_tag(tag); }
TagScope::~TagScope() { thread_tag() = previous_; }

bool names_tag(const TagList& tags, std::string_view tag) {
  return tags.empty() || std::find(tags.begin(), tags.end(), tag) != tags.end();
}
bool lists_tag(const TagList& tags, std::string_view tag) {
  return std::find(tags.begin(), tags.end(), tag) != tags.end();
}

}  // namespace cachet

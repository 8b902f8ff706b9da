// cachet/tags.h: allocation tags and the sleep vocabulary (docs/sleep-wake.md).
//
//   tag        a name an allocation carries, from the thread's current tag when it was made
//              ("default" unless the thread set one). A block keeps its tag until it is freed;
//              sleep and wake name tags, never blocks.
//   asleep     a segment whose physical memory went back to the driver while its virtual
//              addresses stay reserved (by the allocator, for it alone); its blocks keep their
//              addresses, boundaries, states and tags.
//   backup     a host copy of the contents of a block whose tag was named in sleep's
//              backup_tags, restored at wake.
//
// Only names and the thread-local current tag live here; what sleep and wake do is model/'s and
// gpu/'s, separately.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace cachet {

using Tag = std::string;
inline constexpr std::string_view kDefaultTag = "default";

// A tag is 1..64 characters of [A-Za-z0-9_.-] (so that it fits the op text form and a
// memory_stats key). "all" and "none" are refused: the op text form uses them for "every tag"
// and "no tag".
bool valid_tag(std::string_view tag);
// Throws cachet::UsageError naming the tag and the rule when !valid_tag(tag).
void check_tag(std::string_view tag);

// The calling thread's current tag: every allocation it makes carries it.
const Tag& current_tag();
// Sets the calling thread's current tag (check_tag first; nothing changes on a bad tag).
void set_current_tag(std::string_view tag);

namespace detail {
extern std::atomic<bool> g_tag_ever_set;
}  // namespace detail
// Whether any thread of the process ever set a tag other than "default". While false, every
// current_tag() is "default": the allocators' hot path reads this one flag instead of the
// thread-local tag (a __tls_get_addr call in a shared library) and a string comparison.
inline bool tag_ever_set() noexcept { return detail::g_tag_ever_set.load(std::memory_order_relaxed); }

// Sets the current tag for its lifetime and restores the previous one (cachet_torch.tag()).
class TagScope {
 public:
  explicit TagScope(std::string_view tag);
  ~TagScope();
  TagScope(const TagScope&) = delete;
  TagScope& operator=(const TagScope&) = delete;

 private:
  Tag previous_;
};

// A set of tags as sleep and wake take it: empty means every tag.
using TagList = std::vector<Tag>;
// Whether `tag` is in `tags`, an empty list naming every tag.
bool names_tag(const TagList& tags, std::string_view tag);
// Whether `tag` is in `tags`, an empty list naming none (sleep's backup_tags).
bool lists_tag(const TagList& tags, std::string_view tag);

}  // namespace cachet

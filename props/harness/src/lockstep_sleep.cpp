// The lockstep runner's tag, sleep and wake ops (lockstep_state.h; docs/sleep-wake.md section 8):
// applied to both sides, then the checks of any op, the backed-up contents and the sleeping tags.
#include <algorithm>
#include <sstream>
#include <vector>

#include "lockstep_state.h"

namespace cachet::lockstep {

template <class Model, class Impl>
std::optional<std::string> Lockstep<Model, Impl>::State::apply_sleep_op(const Op& op) {
  if constexpr (!HasSleep<Model> || !HasSleep<Impl>) {
    return std::nullopt;  // apply() answers Unsupported for this pair first
  } else {
  Outcome s{Outcome::Kind::Ok, 0, {}}, m = s;
  if (const auto* t = std::get_if<ops::SetTag>(&op)) {
    set_current_tag(t->tag);
    for (ThreadIndex k : threads_used) threads.run(k, [&] { set_current_tag(t->tag); });
  } else if (const auto* sl = std::get_if<ops::Sleep>(&op)) {
    mark_contents(sl->backup_tags);
    s = capture([&](Outcome& r) { r.ptr = sut->sleep(sl->tags, sl->backup_tags); });
    m = capture([&](Outcome& r) { r.ptr = model->sleep(sl->tags, sl->backup_tags); });
  } else if (const auto* w = std::get_if<ops::Wake>(&op)) {
    s = capture([&](Outcome&) { sut->wake(w->tags); });
    m = capture([&](Outcome&) { model->wake(w->tags); });
  }
  if (s.kind == Outcome::Kind::OutOfMemory && m.kind == Outcome::Kind::OutOfMemory) s.message = m.message, s.oom = m.oom;
  last_sut = s;
  last_model = m;
  if (auto d = compare()) return d;
  if (std::holds_alternative<ops::Wake>(op) && s.kind == Outcome::Kind::Ok)
    if (auto d = check_contents()) return d;
  if (s.kind == Outcome::Kind::Ok) {
    const auto st = sut->sleeping();
    const auto mt = model->sleeping();
    if (st != mt) {
      auto list = [](const TagList& l) {
        std::string r;
        for (const auto& t : l) r += (r.empty() ? "" : ",") + t;
        return r.empty() ? std::string("(none)") : r;
      };
      return "sleeping tags differ\n  model: " + list(mt) + "\n  sut:   " + list(st) + "\n";
    }
  }
  return std::nullopt;
  }
}

template <class Model, class Impl>
void Lockstep<Model, Impl>::State::mark_contents(const TagList& backup_tags) {
  if (!sim) return;
  for (auto& [h, b] : bound) {
    if (!b.live || b.size == 0) continue;
    const auto byte = static_cast<unsigned char>(0x10 + (h * 37) % 0xe0);
    const Bytes head = std::min(b.size, kPatternBytes);
    if (!sim->fill(b.addr, byte, head).is_ok() || !sim->fill(b.addr + b.size - head, byte, head).is_ok())
      continue;  // asleep already: its memory (and pattern) is where the last sleep left it
    if (lists_tag(backup_tags, b.tag)) patterns[h] = byte;
    else patterns.erase(h);
  }
}

template <class Model, class Impl>
std::optional<std::string> Lockstep<Model, Impl>::State::check_contents() {
  for (auto it = patterns.begin(); it != patterns.end();) {
    const Bound& b = bound.at(it->first);
    if (!b.live) {
      it = patterns.erase(it);
      continue;
    }
    const Bytes head = std::min(b.size, kPatternBytes);
    std::vector<unsigned char> got(2 * head);
    if (sim->read(b.addr, got.data(), head).is_ok() && sim->read(b.addr + b.size - head, got.data() + head, head).is_ok())
      for (std::size_t i = 0; i < got.size(); ++i)
        if (got[i] != it->second) {
          std::ostringstream r;
          r << "backup contents differ\n  h" << it->first << " (" << hex(b.addr) << ", " << b.size << " B, tag '"
            << b.tag << "') holds 0x" << std::hex << int(got[i]) << " at byte " << std::dec
            << (i < head ? i : b.size - head + (i - head)) << " after the wake; 0x" << std::hex << int(it->second)
            << " was written before its sleep\n";
          return r.str();
        }
    ++it;
  }
  return std::nullopt;
}

template std::optional<std::string> Lockstep<model::Allocator, CachingAllocator>::State::apply_sleep_op(const Op& op);
template void Lockstep<model::Allocator, CachingAllocator>::State::mark_contents(const TagList& backup_tags);
template std::optional<std::string> Lockstep<model::Allocator, CachingAllocator>::State::check_contents();
template std::optional<std::string> Lockstep<model::CachetPolicy, CachingAllocator>::State::apply_sleep_op(const Op& op);
template void Lockstep<model::CachetPolicy, CachingAllocator>::State::mark_contents(const TagList& backup_tags);
template std::optional<std::string> Lockstep<model::CachetPolicy, CachingAllocator>::State::check_contents();

}  // namespace cachet::lockstep

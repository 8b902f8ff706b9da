// The op vocabulary's text form (cachet/ops.h).
#include "cachet/ops.h"

#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <type_traits>

namespace cachet::ops {

namespace {

template <class... F>
struct Overloaded : F... {
  using F::operator()...;
};
template <class... F>
Overloaded(F...) -> Overloaded<F...>;

bool parse_u64(std::string_view s, std::uint64_t& v) {
  if (s.empty()) return false;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  return ec == std::errc{} && p == s.data() + s.size();
}

std::vector<std::string_view> words(std::string_view line) {
  std::vector<std::string_view> w;
  std::size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && (line[i] == ' ' || line[i] == '\t' || line[i] == '\r')) ++i;
    std::size_t j = i;
    while (j < line.size() && line[j] != ' ' && line[j] != '\t' && line[j] != '\r') ++j;
    if (j > i) w.push_back(line.substr(i, j - i));
    i = j;
  }
  return w;
}

// "<c><digits>": h3, s0, p1, g2.
bool prefixed(std::string_view w, char c, std::uint64_t& v) {
  return w.size() >= 2 && w[0] == c && parse_u64(w.substr(1), v);
}

std::string n(std::uint64_t v) { return std::to_string(v); }

// "all" / "none" for an empty list, else the tags joined by ','.
std::string tag_list(const TagList& tags, const char* empty) {
  if (tags.empty()) return empty;
  std::string r;
  for (const Tag& t : tags) r += (r.empty() ? "" : ",") + t;
  return r;
}

// The inverse of tag_list; false on a bad tag, a repeated tag or an empty item.
bool parse_tag_list(std::string_view w, std::string_view empty, TagList& out) {
  out.clear();
  if (w == empty) return true;
  while (true) {
    const std::size_t comma = w.find(',');
    const std::string_view t = w.substr(0, comma);
    if (!valid_tag(t)) return false;
    if (lists_tag(out, t)) return false;
    out.emplace_back(t);
    if (comma == std::string_view::npos) return true;
    w.remove_prefix(comma + 1);
  }
}

}  // namespace

bool is_pool_op(const Op& op) {
  return std::holds_alternative<UseMemPoolBegin>(op) || std::holds_alternative<UseMemPoolEnd>(op) ||
         std::holds_alternative<ReleasePool>(op) || std::holds_alternative<CaptureBegin>(op) ||
         std::holds_alternative<CaptureEnd>(op) || std::holds_alternative<GraphReset>(op);
}

bool is_sleep_op(const Op& op) {
  return std::holds_alternative<SetTag>(op) || std::holds_alternative<Sleep>(op) || std::holds_alternative<Wake>(op);
}

bool is_stream_op(const Op& op) {
  return std::holds_alternative<WaitStream>(op) || std::holds_alternative<Kernel>(op);
}

Addressing addressing(const std::vector<Op>& ops) {
  for (const Op& op : ops)
    if (const auto* a = std::get_if<Allocate>(&op); a && a->id) return Addressing::Ids;
  return Addressing::Handles;
}

std::string show(const Op& op) {
  return std::visit(
      Overloaded{
          [](const Allocate& o) {
            return "alloc " + (o.id ? "h" + n(*o.id) + " " : std::string()) + n(o.size) + " s" + n(o.stream) +
                   (o.thread != 0 ? " t" + n(o.thread) : std::string());
          },
          [](const Free& o) { return "free h" + n(o.handle); },
          [](const RecordStream& o) { return "record h" + n(o.handle) + " s" + n(o.stream); },
          [](const CompleteEvents& o) { return "complete s" + n(o.stream); },
          [](const CompleteAllEvents&) { return std::string("complete_all"); },
          [](const EmptyCache&) { return std::string("empty_cache"); },
          [](const SetMemoryFraction& o) {
            char buf[64];
            std::snprintf(buf, sizeof buf, "fraction %.17g", o.fraction);
            return std::string(buf);
          },
          [](const UseMemPoolBegin& o) {
            return "use_pool p" + n(o.pool) + (o.thread != 0 ? " t" + n(o.thread) : std::string());
          },
          [](const UseMemPoolEnd& o) { return "end_pool p" + n(o.pool); },
          [](const ReleasePool& o) { return "release_pool p" + n(o.pool); },
          [](const CaptureBegin& o) {
            return "capture_begin g" + n(o.graph) + " s" + n(o.stream) + " pool " +
                   (o.share ? "g" + n(*o.share) : std::string("new"));
          },
          [](const CaptureEnd& o) { return "capture_end g" + n(o.graph); },
          [](const GraphReset& o) { return "graph_reset g" + n(o.graph); },
          [](const SetTag& o) { return "tag " + o.tag; },
          [](const Sleep& o) {
            return "sleep tags " + tag_list(o.tags, "all") + " backup " + tag_list(o.backup_tags, "none");
          },
          [](const Wake& o) { return "wake tags " + tag_list(o.tags, "all"); },
          [](const WaitStream& o) { return "wait_stream s" + n(o.waiter) + " s" + n(o.waited); },
          [](const Kernel& o) { return "kernel s" + n(o.stream); },
          [](const SetAllocatorSettings& o) { return "cfg " + o.text; },
      },
      op);
}

std::optional<Op> parse_op(std::string_view line) {
  auto w = words(line);
  if (w.empty()) return std::nullopt;
  const std::string_view k = w[0];
  std::uint64_t a = 0, b = 0, c = 0;
  // A trailing t<k> (alloc, use_pool): the thread; absent: 0.
  std::uint64_t t = 0;
  if ((k == "alloc" || k == "use_pool") && w.size() >= 3 && w.back().starts_with("t")) {
    if (!prefixed(w.back(), 't', t) || t > 0xffffffffu) return std::nullopt;
    w.pop_back();
  }
  const auto thread = static_cast<ThreadIndex>(t);
  if (k == "alloc" && w.size() == 3 && parse_u64(w[1], a) && prefixed(w[2], 's', b))
    return Allocate{a, b, {}, thread};
  if (k == "alloc" && w.size() == 4 && prefixed(w[1], 'h', c) && parse_u64(w[2], a) && prefixed(w[3], 's', b))
    return Allocate{a, b, c, thread};
  if (k == "free" && w.size() == 2 && prefixed(w[1], 'h', a)) return Free{a};
  if (k == "record" && w.size() == 3 && prefixed(w[1], 'h', a) && prefixed(w[2], 's', b)) return RecordStream{a, b};
  if (k == "complete" && w.size() == 2 && prefixed(w[1], 's', a)) return CompleteEvents{a};
  if (k == "complete_all" && w.size() == 1) return CompleteAllEvents{};
  if (k == "empty_cache" && w.size() == 1) return EmptyCache{};
  if (k == "fraction" && w.size() == 2) {
    const std::string s(w[1]);
    char* end = nullptr;
    const double f = std::strtod(s.c_str(), &end);
    if (end == s.c_str() || *end != '\0') return std::nullopt;
    return SetMemoryFraction{f};
  }
  if (w.size() == 2 && prefixed(w[1], 'p', a)) {
    if (k == "use_pool") return UseMemPoolBegin{a, thread};
    if (k == "end_pool") return UseMemPoolEnd{a};
    if (k == "release_pool") return ReleasePool{a};
  }
  if (w.size() == 2 && prefixed(w[1], 'g', a)) {
    if (k == "capture_end") return CaptureEnd{a};
    if (k == "graph_reset") return GraphReset{a};
  }
  if (k == "capture_begin" && w.size() == 5 && prefixed(w[1], 'g', a) && prefixed(w[2], 's', b) && w[3] == "pool") {
    if (w[4] == "new") return CaptureBegin{a, b, std::nullopt};
    if (prefixed(w[4], 'g', c)) return CaptureBegin{a, b, c};
  }
  if (k == "tag" && w.size() == 2 && valid_tag(w[1])) return SetTag{Tag(w[1])};
  if (k == "wait_stream" && w.size() == 3 && prefixed(w[1], 's', a) && prefixed(w[2], 's', b)) return WaitStream{a, b};
  if (k == "kernel" && w.size() == 2 && prefixed(w[1], 's', a)) return Kernel{a};
  if (k == "cfg" && w.size() == 2) return SetAllocatorSettings{std::string(w[1])};
  if (k == "sleep" && w.size() == 5 && w[1] == "tags" && w[3] == "backup") {
    Sleep op;
    if (parse_tag_list(w[2], "all", op.tags) && parse_tag_list(w[4], "none", op.backup_tags)) return op;
  }
  if (k == "wake" && w.size() == 3 && w[1] == "tags") {
    Wake op;
    if (parse_tag_list(w[2], "all", op.tags)) return op;
  }
  return std::nullopt;
}

std::string show(const std::vector<Op>& ops) {
  std::string r;
  for (const Op& op : ops) r += show(op) + "\n";
  return r;
}

std::vector<Op> parse_ops(std::string_view text) {
  std::vector<Op> ops;
  std::size_t line_no = 0, handle_allocs = 0, id_allocs = 0;
  while (!text.empty()) {
    ++line_no;
    const std::size_t nl = text.find('\n');
    const std::string_view line = text.substr(0, nl);
    text = nl == std::string_view::npos ? std::string_view{} : text.substr(nl + 1);
    const auto w = words(line);
    if (w.empty() || w[0].front() == '#') continue;
    auto op = parse_op(line);
    if (!op)
      throw std::invalid_argument(
          "line " + std::to_string(line_no) + ": not an op: '" + std::string(line) +
          "' (expected one of: alloc <bytes> s<stream> [t<thread>] | alloc h<id> <bytes> s<stream> [t<thread>] | "
          "free h<handle> | "
          "record h<handle> s<stream> | complete s<stream> | complete_all | empty_cache | fraction <double> | "
          "use_pool p<k> [t<thread>] | end_pool p<k> | release_pool p<k> | capture_begin g<k> s<stream> pool new|g<j> | "
          "capture_end g<k> | graph_reset g<k> | tag <name> | sleep tags all|<t>,.. backup none|<t>,.. | "
          "wake tags all|<t>,.. | wait_stream s<a> s<b> | kernel s<a> | cfg <settings>; a tag is 1 to 64 of [A-Za-z0-9_.-], not 'all' or 'none')");
    if (const auto* a = std::get_if<Allocate>(&*op)) ++(a->id ? id_allocs : handle_allocs);
    if (handle_allocs > 0 && id_allocs > 0)
      throw std::invalid_argument("line " + std::to_string(line_no) +
                                  ": the list mixes 'alloc <bytes> s<stream>' (handles counted in order) and "
                                  "'alloc h<id> <bytes> s<stream>' (named ids); use one form throughout");
    ops.push_back(*op);
  }
  return ops;
}

std::string show_case(const Case& c) {
  return "# config: " + c.config + "\n# capacity: " + std::to_string(c.capacity) + "\n" +
         (c.events_when_recorded ? "# events: when-recorded\n" : "") +
         (c.device_total ? "# device total: " + std::to_string(*c.device_total) + "\n" : "") + show(c.ops);
}

Case parse_case(std::string_view text) {
  Case c;
  constexpr std::string_view kConfig = "# config:", kCapacity = "# capacity:", kEvents = "# events:",
                             kTotal = "# device total:";
  for (std::string_view rest = text; !rest.empty();) {
    const std::size_t nl = rest.find('\n');
    std::string_view line = rest.substr(0, nl);
    rest = nl == std::string_view::npos ? std::string_view{} : rest.substr(nl + 1);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.starts_with(kConfig)) {
      line.remove_prefix(kConfig.size());
      if (!line.empty() && line.front() == ' ') line.remove_prefix(1);
      c.config = std::string(line);
    } else if (line.starts_with(kCapacity)) {
      const auto w = words(line.substr(kCapacity.size()));
      std::uint64_t v = 0;
      if (w.size() != 1 || !parse_u64(w[0], v))
        throw std::invalid_argument("bad capacity line: '" + std::string(line) +
                                    "' (expected '# capacity: <bytes>', a whole number)");
      c.capacity = v;
    } else if (line.starts_with(kEvents)) {
      const auto w = words(line.substr(kEvents.size()));
      if (w.size() != 1 || w[0] != "when-recorded")
        throw std::invalid_argument("bad events line: '" + std::string(line) +
                                    "' (expected '# events: when-recorded', or no events line: events then "
                                    "complete only at complete ops)");
      c.events_when_recorded = true;
    } else if (line.starts_with(kTotal)) {
      const auto w = words(line.substr(kTotal.size()));
      std::uint64_t v = 0;
      if (w.size() != 1 || !parse_u64(w[0], v) || v == 0)
        throw std::invalid_argument("bad device total line: '" + std::string(line) +
                                    "' (expected '# device total: <bytes>', a whole number above 0, or no such "
                                    "line: the device then holds exactly the capacity)");
      c.device_total = v;
    }
  }
  c.ops = parse_ops(text);
  return c;
}

}  // namespace cachet::ops

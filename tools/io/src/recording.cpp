// Readers for oracle recordings and op lists (simdjson DOM).
#include "cachet/io/recording.h"

#include <simdjson.h>

#include <filesystem>
#include <string_view>

#include "cachet/io/file.h"
#include "json_damage.h"

namespace cachet::io {

namespace {

constexpr std::string_view kRecording = "an oracle recording (results/res_<regime>_<config>.json.gz)";
constexpr std::string_view kOpList = "an op list (ops/ops_<regime>.json.gz)";
constexpr std::string_view kSnapshotReaders =
    "`cachet conform` compares an oracle recording with its op list; a snapshot is read by `cachet replay` "
    "(and summary, plot, trace-info, tune)";

using simdjson::dom::array;
using simdjson::dom::element;
using simdjson::dom::object;

class Reader {
 public:
  explicit Reader(std::string path) : path_(std::move(path)) {}

  [[noreturn]] void fail(const std::string& where, const std::string& problem) const {
    throw ReadError(path_ + ": " + where + ": " + problem);
  }

  // `wanted` names the file kind expected, for the message when the file is another kind.
  element parse(simdjson::dom::parser& parser, const std::string& text, std::string_view wanted) const {
    if (text.empty()) fail("<document>", "empty file; expected " + std::string(wanted));
    if (static_cast<unsigned char>(text[0]) == 0x80)
      throw ReadError(path_ + ": a PyTorch memory snapshot (pickle from torch.cuda.memory._dump_snapshot()), not " +
                      std::string(wanted) + "; " + std::string(kSnapshotReaders));
    element root;
    if (auto err = parser.parse(text).get(root)) {
      if (auto d = detail::find_json_damage(text)) fail(d->where, d->problem);
      throw ReadError(path_ + ": not valid JSON (" + simdjson::error_message(err) + ")");
    }
    return root;
  }

  // What a JSON file that is not the wanted kind is: a snapshot, a recording or an op list.
  void check_kind(element root, std::string_view wanted) const {
    object o;
    array a;
    if (!root.get(o)) {
      element e;
      if (wanted != kRecording && !o.at_key("steps").get(e))
        throw ReadError(path_ + ": an oracle recording, not " + std::string(wanted) +
                        "; pass the op list first: cachet conform OPS RESULT");
      if (wanted == kRecording && o.at_key("conf").get(e) &&
          (!o.at_key("device_traces").get(e) || !o.at_key("segments").get(e)))
        throw ReadError(path_ + ": a PyTorch memory snapshot as JSON (its dict has \"device_traces\" or "
                        "\"segments\"), not " + std::string(wanted) + "; " + std::string(kSnapshotReaders));
      if (wanted != kRecording && (!o.at_key("device_traces").get(e) || !o.at_key("segments").get(e)))
        throw ReadError(path_ + ": a PyTorch memory snapshot as JSON, not " + std::string(wanted) + "; " +
                        std::string(kSnapshotReaders));
    } else if (!root.get(a) && wanted == kRecording) {
      array first;
      std::string_view kind;
      if (a.size() > 0 && !a.at(0).get(first) && first.size() > 0 && !first.at(0).get(kind) && kind.size() == 1)
        throw ReadError(path_ + ": an op list (ops_*.json), not " + std::string(wanted) +
                        "; pass the op list first: cachet conform OPS RESULT");
    }
  }

  element field(object o, std::string_view key, const std::string& where) const {
    element e;
    if (o.at_key(key).get(e)) fail(where, "missing field \"" + std::string(key) + "\"");
    return e;
  }
  std::optional<element> optional_field(object o, std::string_view key) const {
    element e;
    if (o.at_key(key).get(e)) return std::nullopt;
    return e;
  }
  object as_object(element e, const std::string& where) const {
    object o;
    if (e.get(o)) fail(where, "expected an object");
    return o;
  }
  array as_array(element e, const std::string& where) const {
    array a;
    if (e.get(a)) fail(where, "expected a list");
    return a;
  }
  std::string as_string(element e, const std::string& where) const {
    std::string_view s;
    if (e.get(s)) fail(where, "expected a string");
    return std::string(s);
  }
  // Integers may be written as JSON integers or (rarely) as floats with no fraction.
  std::int64_t as_int(element e, const std::string& where) const {
    std::int64_t i;
    if (!e.get(i)) return i;
    std::uint64_t u;
    if (!e.get(u)) return static_cast<std::int64_t>(u);
    double d;
    if (!e.get(d) && d == static_cast<double>(static_cast<std::int64_t>(d)))
      return static_cast<std::int64_t>(d);
    fail(where, "expected an integer");
  }
  std::uint64_t as_uint(element e, const std::string& where) const {
    std::uint64_t u;
    if (!e.get(u)) return u;
    const std::int64_t i = as_int(e, where);
    if (i < 0) fail(where, "expected a non-negative integer, got " + std::to_string(i));
    return static_cast<std::uint64_t>(i);
  }

  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

PoolId read_pool_id(const Reader& r, element e, const std::string& where) {
  array a = r.as_array(e, where);
  if (a.size() != 2) r.fail(where, "expected a pool id [first, second]");
  return PoolId{r.as_uint(a.at(0), where + "[0]"), r.as_uint(a.at(1), where + "[1]")};
}

Snapshot read_segments(const Reader& r, array segs, bool expandable) {
  Snapshot out;
  std::size_t i = 0;
  for (element se : segs) {
    const std::string where = "segments[" + std::to_string(i++) + "]";
    object so = r.as_object(se, where);
    SegmentSnapshot s;
    s.address = r.as_uint(r.field(so, "address", where), where + ".address");
    s.total_size = r.as_uint(r.field(so, "total_size", where), where + ".total_size");
    s.stream = r.as_uint(r.field(so, "stream", where), where + ".stream");
    const std::string type = r.as_string(r.field(so, "segment_type", where), where + ".segment_type");
    if (type != "large" && type != "small")
      r.fail(where + ".segment_type", "expected \"large\" or \"small\", got \"" + type + "\"");
    s.is_large = type == "large";
    s.is_expandable = expandable;
    if (auto e = r.optional_field(so, "segment_pool_id")) s.pool_id = read_pool_id(r, *e, where + ".segment_pool_id");
    if (auto e = r.optional_field(so, "is_expandable")) {
      bool b;
      if (e->get(b)) r.fail(where + ".is_expandable", "expected true or false");
      s.is_expandable = b;
    }
    std::uint64_t addr = s.address;
    std::size_t j = 0;
    for (element be : r.as_array(r.field(so, "blocks", where), where + ".blocks")) {
      const std::string bw = where + ".blocks[" + std::to_string(j++) + "]";
      array ba = r.as_array(be, bw);
      if (ba.size() != 3) r.fail(bw, "expected [size, requested_size, state]");
      BlockSnapshot b;
      b.address = addr;
      b.size = r.as_uint(ba.at(0), bw + "[0]");
      b.requested_size = r.as_uint(ba.at(1), bw + "[1]");
      const std::string st = r.as_string(ba.at(2), bw + "[2]");
      const auto state = block_state_from_string(st);
      if (!state) r.fail(bw + "[2]", "unknown block state \"" + st + "\"");
      b.state = *state;
      addr += b.size;
      s.blocks.push_back(b);
    }
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace

Recording read_recording(const std::string& path) {
  Reader r(path);
  const std::string text = read_file(path);
  simdjson::dom::parser parser;
  const element doc = r.parse(parser, text, kRecording);
  r.check_kind(doc, kRecording);
  object root = r.as_object(doc, "top level");
  Recording rec;
  rec.path = path;
  rec.conf = r.as_string(r.field(root, "conf", "top level"), "conf");
  rec.cap = r.as_uint(r.field(root, "cap", "top level"), "cap");
  rec.total_memory = r.as_uint(r.field(root, "total_memory", "top level"), "total_memory");
  if (rec.total_memory == 0) r.fail("total_memory", "must be positive");
  std::size_t i = 0;
  for (element e : r.as_array(r.field(root, "streams", "top level"), "streams"))
    rec.streams.push_back(r.as_uint(e, "streams[" + std::to_string(i++) + "]"));
  i = 0;
  for (element e : r.as_array(r.field(root, "stat_keys", "top level"), "stat_keys"))
    rec.stat_keys.push_back(r.as_string(e, "stat_keys[" + std::to_string(i++) + "]"));
  if (rec.stat_keys.size() != 6)
    r.fail("stat_keys", "expected 6 keys, got " + std::to_string(rec.stat_keys.size()));
  i = 0;
  for (element e : r.as_array(r.field(root, "steps", "top level"), "steps")) {
    const std::string where = "steps[" + std::to_string(i++) + "]";
    array a = r.as_array(e, where);
    if (a.size() != 7) r.fail(where, "expected [result, 6 stats], got " + std::to_string(a.size()) + " items");
    Step s;
    element res = a.at(0);
    std::string_view sv;
    if (res.is_null()) {
    } else if (!res.get(sv)) {
      if (sv != "oom" && sv != "error") r.fail(where + "[0]", "expected a pointer, \"oom\", \"error\" or null");
      s.oom = sv == "oom";
      s.error = sv == "error";
    } else {
      s.result = r.as_uint(res, where + "[0]");
    }
    for (std::size_t k = 0; k < 6; ++k) s.stats[k] = r.as_int(a.at(k + 1), where + "[" + std::to_string(k + 1) + "]");
    rec.steps.push_back(s);
  }
  for (auto [key, value] : r.as_object(r.field(root, "final_stats", "top level"), "final_stats"))
    rec.final_stats[std::string(key)] = r.as_int(value, "final_stats." + std::string(key));
  const bool expandable = rec.conf.find("expandable_segments:True") != std::string::npos;
  rec.segments = read_segments(r, r.as_array(r.field(root, "segments", "top level"), "segments"), expandable);
  i = 0;
  for (element e : r.as_array(r.field(root, "trace", "top level"), "trace")) {
    const std::string where = "trace[" + std::to_string(i++) + "]";
    array a = r.as_array(e, where);
    if (a.size() != 4) r.fail(where, "expected [action, addr, size, stream]");
    TraceEvent t;
    const std::string action = r.as_string(a.at(0), where + "[0]");
    const auto act = trace_action_from_string(action);
    if (!act) r.fail(where + "[0]", "unknown trace action \"" + action + "\"");
    t.action = *act;
    element addr = a.at(1);
    t.addr = addr.is_null() ? 0 : r.as_uint(addr, where + "[1]");
    t.size = r.as_uint(a.at(2), where + "[2]");
    t.stream = r.as_uint(a.at(3), where + "[3]");
    rec.trace.push_back(t);
  }
  if (auto e = r.optional_field(root, "summary"); e && !e->is_null()) rec.summary = r.as_string(*e, "summary");
  if (auto e = r.optional_field(root, "oom_messages"); e && !e->is_null()) {
    i = 0;
    for (element m : r.as_array(*e, "oom_messages"))
      rec.oom_messages.push_back(r.as_string(m, "oom_messages[" + std::to_string(i++) + "]"));
  }
  if (auto e = r.optional_field(root, "pool_ids"); e && !e->is_null()) {
    i = 0;
    for (element m : r.as_array(*e, "pool_ids")) {
      const std::string where = "pool_ids[" + std::to_string(i++) + "]";
      array a = r.as_array(m, where);
      if (a.size() != 2) r.fail(where, "expected [name, [first, second]]");
      RecordedPool p;
      std::string_view sv;
      if (!a.at(0).get(sv))
        p.name = std::string(sv);
      else
        p.name = std::to_string(r.as_uint(a.at(0), where + "[0]"));
      p.id = read_pool_id(r, a.at(1), where + "[1]");
      rec.pool_ids.push_back(p);
    }
  }
  if (auto e = r.optional_field(root, "live_pools"); e && !e->is_null()) {
    i = 0;
    for (element m : r.as_array(*e, "live_pools")) {
      const std::string where = "live_pools[" + std::to_string(i++) + "]";
      array a = r.as_array(m, where);
      if (a.size() != 3) r.fail(where, "expected [k, [first, second], use_count]");
      rec.live_pools.push_back(LivePool{r.as_uint(a.at(0), where + "[0]"), read_pool_id(r, a.at(1), where + "[1]"),
                                        static_cast<int>(r.as_int(a.at(2), where + "[2]"))});
    }
  }
  if (auto e = r.optional_field(root, "errors"); e && !e->is_null()) {
    i = 0;
    for (element m : r.as_array(*e, "errors")) {
      const std::string where = "errors[" + std::to_string(i++) + "]";
      array a = r.as_array(m, where);
      if (a.size() != 2) r.fail(where, "expected [op index, message]");
      rec.errors.emplace_back(r.as_uint(a.at(0), where + "[0]"), r.as_string(a.at(1), where + "[1]"));
    }
  }
  return rec;
}

std::vector<ops::Op> read_ops(const std::string& path) {
  Reader r(path);
  const std::string text = read_file(path);
  simdjson::dom::parser parser;
  const element doc = r.parse(parser, text, kOpList);
  r.check_kind(doc, kOpList);
  array list = r.as_array(doc, "top level");
  std::vector<ops::Op> out;
  out.reserve(list.size());
  std::size_t i = 0;
  for (element e : list) {
    const std::string where = "op " + std::to_string(i++);
    array a = r.as_array(e, where);
    if (a.size() == 0) r.fail(where, "empty op");
    const std::string kind = r.as_string(a.at(0), where + "[0]");
    const auto arity = [&](std::size_t n, const char* form) {
      if (a.size() != n) r.fail(where, std::string("expected ") + form);
    };
    const auto uint_at = [&](std::size_t k, const char* what) { return r.as_uint(a.at(k), where + " " + what); };
    // A last element t: the op's thread (docs/pytorch-allocator.md §14.10.2; absent: 0).
    const auto thread_at = [&](std::size_t k) -> ThreadIndex {
      if (a.size() <= k) return 0;
      const std::uint64_t t = uint_at(k, "thread");
      if (t > 0xffffffffu) r.fail(where + " thread", "expected a thread index below 2^32");
      return static_cast<ThreadIndex>(t);
    };
    if (kind == "a") {
      if (a.size() != 4 && a.size() != 5)
        r.fail(where, "expected [\"a\", id, size, stream] or [\"a\", id, size, stream, thread]");
      out.push_back(ops::Allocate{uint_at(2, "size"), uint_at(3, "stream"), uint_at(1, "id"), thread_at(4)});
    } else if (kind == "f") {
      if (a.size() != 2 && a.size() != 3) r.fail(where, "expected [\"f\", id] or [\"f\", id, thread]");
      (void)thread_at(2);  // a free goes to no pool's filter: its thread changes nothing
      out.push_back(ops::Free{uint_at(1, "id")});
    } else if (kind == "r") {
      arity(3, "[\"r\", id, stream] (Tensor.record_stream)");
      out.push_back(ops::RecordStream{uint_at(1, "id"), uint_at(2, "stream")});
    } else if (kind == "e") {
      out.push_back(ops::EmptyCache{});
    } else if (kind == "pb" || kind == "pe" || kind == "pr") {
      if (a.size() != 2 && !(kind != "pr" && a.size() == 3))
        r.fail(where, "expected [\"pb\"|\"pe\", pool(, thread)] or [\"pr\", pool]");
      const std::uint64_t k = uint_at(1, "pool");
      if (kind == "pb") {
        out.push_back(ops::UseMemPoolBegin{k, thread_at(2)});
      } else if (kind == "pe") {
        (void)thread_at(2);  // endAllocateToPool names the pool, not the thread
        out.push_back(ops::UseMemPoolEnd{k});
      } else {
        out.push_back(ops::ReleasePool{k});
      }
    } else if (kind == "gb") {
      arity(4, "[\"gb\", graph, stream, share] (share: a graph index or -1)");
      const std::int64_t share = r.as_int(a.at(3), where + " share");
      if (share < -1) r.fail(where + " share", "expected a graph index or -1 (a new pool)");
      out.push_back(ops::CaptureBegin{uint_at(1, "graph"), uint_at(2, "stream"),
                                      share < 0 ? std::nullopt : std::optional<std::uint64_t>(share)});
    } else if (kind == "ge" || kind == "gx") {
      arity(2, "[\"ge\"|\"gx\", graph]");
      const std::uint64_t k = uint_at(1, "graph");
      if (kind == "ge") out.push_back(ops::CaptureEnd{k});
      else out.push_back(ops::GraphReset{k});
    } else if (kind == "w") {
      arity(3, "[\"w\", a, b] (streams[a].wait_stream(streams[b]))");
      out.push_back(ops::WaitStream{uint_at(1, "stream"), uint_at(2, "stream")});
    } else if (kind == "k") {
      arity(2, "[\"k\", stream] (a kernel on the stream)");
      out.push_back(ops::Kernel{uint_at(1, "stream")});
    } else if (kind == "cfg") {
      arity(2, "[\"cfg\", text] (_set_allocator_settings)");
      const std::string text = r.as_string(a.at(1), where + " text");
      if (text.empty() || text.find_first_of(" \t\r\n") != std::string::npos)
        r.fail(where + " text", "expected allocator settings without whitespace, e.g. "
                                "\"graph_capture_record_stream_reuse:True\"");
      out.push_back(ops::SetAllocatorSettings{text});
    } else {
      r.fail(where, "unknown op \"" + kind +
                        "\" (expected \"a\", \"f\", \"r\", \"e\", \"pb\", \"pe\", \"pr\", \"gb\", \"ge\", \"gx\", \"w\", \"k\" or \"cfg\")");
    }
  }
  return out;
}

std::string ops_path_for(const std::string& recording_path) {
  namespace fs = std::filesystem;
  const fs::path rec(recording_path);
  std::string name = rec.filename().string();
  for (const char* ext : {".gz", ".json"})
    if (name.size() > std::string_view(ext).size() && name.ends_with(ext)) name.resize(name.size() - std::string_view(ext).size());
  if (!name.starts_with("res_"))
    throw ReadError(recording_path + ": cannot tell the ops file from the name (expected "
                    "res_<regime>_<config>.json.gz); pass --ops FILE");
  const std::string stem = name.substr(4);
  const fs::path ops_dir = rec.parent_path().parent_path() / "ops";
  // The regime is a prefix of the stem ending at an underscore; prefer the longest that exists
  // (mixed_empty before mixed).
  for (std::size_t cut = stem.size(); cut > 0; --cut) {
    if (cut != stem.size() && stem[cut] != '_') continue;
    const std::string regime = stem.substr(0, cut);
    for (const char* ext : {".json", ".json.gz"}) {
      const fs::path p = ops_dir / ("ops_" + regime + ext);
      if (fs::exists(p)) return p.string();
    }
  }
  throw ReadError(recording_path + ": no ops_<regime>.json[.gz] for it in " + ops_dir.string() +
                  "; pass --ops FILE");
}

}  // namespace cachet::io

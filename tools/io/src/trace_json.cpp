// JSON traces with simdjson's On-Demand API (one forward pass, no DOM): the _snapshot()
// dictionary as JSON, the oracle recordings' trace rows, and the .stats.json sidecar.
// Keys are matched in any order; unknown keys are skipped unparsed.
#include "cachet/io/trace_json.h"

#include <fmt/format.h>

#include <simdjson.h>

#include "cachet/io/file.h"
#include "json_damage.h"
#include "trace_build.h"

namespace cachet::io {
namespace {

namespace od = simdjson::ondemand;
using simdjson::error_code;

class JsonReader {
 public:
  JsonReader(std::string_view bytes, std::string_view name) : name_(name), buf_(bytes) {
    if (auto e = parser_.iterate(buf_).get(doc_)) fail("<document>", e);
    started_ = true;
  }

  TraceFile read_trace() {
    TraceFile out;
    out.name = std::string(name_);
    bool saw_steps = false, saw_trace = false, saw_snapshot = false;
    od::object root = object(doc_, [] { return std::string("<root>"); });
    for (auto fr : root) {
      od::field f;
      if (auto e = std::move(fr).get(f)) fail("<root>", e);
      std::string_view key;
      if (auto e = f.unescaped_key().get(key)) fail("<root>", e);
      od::value v = std::move(f).value();
      if (key == "device_traces") {
        saw_snapshot = true;
        read_device_traces(v);
      } else if (key == "segments") {
        saw_snapshot = true;
        read_segments(v);
      } else if (key == "allocator_settings") {
        read_settings(v, out);
      } else if (key == "trace") {
        saw_trace = true;
        read_recording_trace(v);
      } else if (key == "steps") {
        saw_steps = true;  // read by the recording reader, not here
      } else {
        read_common(key, v, out, "");
      }
    }
    check_end();
    if (!saw_steps && !saw_trace && !saw_snapshot && !out.final_stats.empty())
      detail::fail(name_, "<root>",
                   "a stats file (\"final_stats\": memory_stats() at the end), not a trace; cachet reads it "
                   "beside its trace (<base>.stats.json beside <base>.trace.json.gz): pass the trace");
    if (!saw_steps && !saw_trace && !saw_snapshot)
      detail::fail(name_, "<root>",
                   "not a PyTorch memory snapshot or oracle recording: no 'device_traces', "
                   "'segments' or 'trace' key");
    out.format = (saw_steps || saw_trace) ? TraceFormat::OracleRecording : TraceFormat::SnapshotJson;
    out.devices = devices_.take();
    return out;
  }

  // A .stats.json sidecar: total_memory, final_stats, device, conf.
  void read_sidecar(TraceFile& t) {
    od::object root = object(doc_, [] { return std::string("<root>"); });
    for (auto fr : root) {
      od::field f;
      if (auto e = std::move(fr).get(f)) fail("<root>", e);
      std::string_view key;
      if (auto e = f.unescaped_key().get(key)) fail("<root>", e);
      od::value v = std::move(f).value();
      read_common(key, v, t, "sidecar");
    }
    check_end();
  }

 private:
  // After the top-level object: anything but whitespace left is an error.
  void check_end() {
    const char* p = nullptr;
    if (doc_.current_location().get(p) == simdjson::SUCCESS && p >= buf_.data() &&
        p < buf_.data() + buf_.size())
      fail_offset("trailing content after the top-level object");
  }

  // ---- errors ----
  std::string offset_text() {
    if (!started_) return "";  // the document was refused while indexing: no position
    const char* p = nullptr;
    if (doc_.current_location().get(p) == simdjson::SUCCESS && p >= buf_.data() &&
        p <= buf_.data() + buf_.size())
      return fmt::format(" (byte offset {})", p - buf_.data());
    return " (at end of input)";
  }
  [[noreturn]] void fail(std::string_view where, error_code e) {
    std::string what;
    switch (e) {
      case simdjson::INCORRECT_TYPE: what = "wrong JSON type"; break;
      case simdjson::NUMBER_OUT_OF_RANGE: what = "number out of range"; break;
      case simdjson::TAPE_ERROR:
      case simdjson::INCOMPLETE_ARRAY_OR_OBJECT:
        what = "malformed or truncated JSON";
        break;
      default: what = simdjson::error_message(e);
    }
    // A structural error is reported where simdjson noticed it (often the root, offset 0):
    // name where the text really ends or the brackets stop matching.
    if (e != simdjson::INCORRECT_TYPE && e != simdjson::NUMBER_OUT_OF_RANGE && e != simdjson::DEPTH_ERROR) {
      if (auto d = detail::find_json_damage(std::string_view(buf_.data(), buf_.size())))
        detail::fail(name_, d->where, d->problem);
      if (what == "malformed or truncated JSON") what = "malformed JSON";  // the brackets balance
    }
    detail::fail(name_, where, what + offset_text());
  }
  [[noreturn]] void fail_offset(std::string_view what) {
    detail::fail(name_, "<document>", std::string(what) + offset_text());
  }

  // ---- typed access; `where` makes the field path, only on error ----
  template <class R, class Where>
  od::object object(R&& r, Where&& where) {
    od::object o;
    if (auto e = std::forward<R>(r).get_object().get(o)) fail(where(), e);
    return o;
  }
  template <class Where>
  od::array array(od::value& v, Where&& where) {
    od::array a;
    if (auto e = v.get_array().get(a)) fail(where(), e);
    return a;
  }
  template <class Where>
  std::int64_t int64(od::value& v, Where&& where) {
    std::int64_t x = 0;
    if (auto e = v.get_int64().get(x)) fail(where(), e);
    return x;
  }
  template <class Where>
  std::uint64_t uint64(od::value& v, Where&& where) {
    std::uint64_t x = 0;
    if (auto e = v.get_uint64().get(x)) fail(where(), e);
    return x;
  }
  template <class Where>
  Bytes size(od::value& v, Where&& where) {
    return detail::checked_size(int64(v, where), name_, where);
  }
  template <class Where>
  std::string_view string(od::value& v, Where&& where) {
    std::string_view s;
    if (auto e = v.get_string().get(s)) fail(where(), e);
    return s;
  }
  template <class Where>
  bool is_null(od::value& v, Where&& where) {
    bool n = false;
    if (auto e = v.is_null().get(n)) fail(where(), e);
    return n;
  }
  template <class Where>
  bool boolean(od::value& v, Where&& where) {
    bool b = false;
    if (auto e = v.get_bool().get(b)) fail(where(), e);
    return b;
  }
  // Any value as text: strings unquoted, everything else as written.
  template <class Where>
  std::string text(od::value& v, Where&& where) {
    od::json_type type;
    if (auto e = v.type().get(type)) fail(where(), e);
    std::string_view s;
    error_code e = simdjson::SUCCESS;
    switch (type) {
      case od::json_type::string: e = v.get_string().get(s); break;
      case od::json_type::object: {
        od::object o;
        e = v.get_object().get(o);
        if (!e) e = o.raw_json().get(s);
        break;
      }
      case od::json_type::array: {
        od::array a;
        e = v.get_array().get(a);
        if (!e) e = a.raw_json().get(s);
        break;
      }
      default: s = v.raw_json_token(); break;
    }
    if (e) fail(where(), e);
    while (!s.empty() && (s.back() == ' ' || s.back() == '\n' || s.back() == '\r' || s.back() == '\t'))
      s.remove_suffix(1);
    return std::string(s);
  }

  // ---- keys any file may carry (recordings, sidecars) ----
  void read_common(std::string_view key, od::value& v, TraceFile& out, std::string_view prefix) {
    auto where = [&] {
      return prefix.empty() ? std::string(key) : fmt::format("{}.{}", prefix, key);
    };
    if (key == "total_memory") {
      const std::uint64_t m = uint64(v, where);
      if (m >= kMaxRequest || m == 0) detail::fail(name_, where(), fmt::format("absurd total_memory {}", m));
      if (!out.total_memory) out.total_memory = m;
    } else if (key == "cap") {
      const std::uint64_t m = uint64(v, where);
      if (m >= kMaxRequest) detail::fail(name_, where(), fmt::format("absurd cap {}", m));
      out.cap = m;
    } else if (key == "conf") {
      if (is_null(v, where)) return;
      const std::string_view conf = string(v, where);
      if (!out.settings.conf) {
        out.settings.conf = std::string(conf);
        out.settings.fields.emplace_back("PYTORCH_CUDA_ALLOC_CONF", std::string(conf));
      }
    } else if (key == "device") {
      od::json_type type;
      if (auto e = v.type().get(type)) fail(where(), e);
      if (type == od::json_type::string && out.device_name.empty())
        out.device_name = std::string(string(v, where));
    } else if (key == "final_stats") {
      od::object o = object(v, where);
      std::map<std::string, std::int64_t> stats;
      for (auto fr : o) {
        od::field f;
        if (auto e = std::move(fr).get(f)) fail(where(), e);
        std::string_view k;
        if (auto e = f.unescaped_key().get(k)) fail(where(), e);
        od::value sv = std::move(f).value();
        auto swhere = [&] { return fmt::format("{}.{}", where(), k); };
        stats[std::string(k)] = int64(sv, swhere);
      }
      if (out.final_stats.empty()) out.final_stats = std::move(stats);
    }
  }

  // ---- snapshot dictionary ----
  void read_device_traces(od::value& v) {
    od::array devices = array(v, [] { return std::string("device_traces"); });
    std::size_t d = 0;
    for (auto dr : devices) {
      auto dwhere = [&] { return fmt::format("device_traces[{}]", d); };
      if (d >= kMaxDevices)
        detail::fail(name_, dwhere(), fmt::format("more than {} devices", kMaxDevices));
      od::value dv;
      if (auto e = std::move(dr).get(dv)) fail(dwhere(), e);
      od::array entries = array(dv, dwhere);
      std::vector<TraceEvent>* events = nullptr;
      std::size_t i = 0;
      for (auto er : entries) {
        auto ewhere = [&] { return fmt::format("device_traces[{}][{}]", d, i); };
        od::value ev;
        if (auto e = std::move(er).get(ev)) fail(ewhere(), e);
        if (!events) {
          events = &devices_.at(static_cast<DeviceIndex>(d)).events;
          if (events->empty()) events->reserve(std::min<std::size_t>(buf_.size() / 100, 1 << 24));
        }
        events->push_back(read_event(ev, d, i));
        ++i;
      }
      ++d;
    }
  }

  TraceEvent read_event(od::value& v, std::size_t d, std::size_t i) {
    auto ewhere = [&] { return fmt::format("device_traces[{}][{}]", d, i); };
    od::object o = object(v, ewhere);
    TraceEvent ev;
    bool have_action = false, have_addr = false, have_size = false, have_stream = false;
    std::uint64_t device_free = 0;
    bool have_device_free = false;
    for (auto fr : o) {
      od::field f;
      if (auto e = std::move(fr).get(f)) fail(ewhere(), e);
      const simdjson::ondemand::raw_json_string k = f.key();
      od::value fv = std::move(f).value();
      auto at = [&](const char* key) {
        return [&, key] { return fmt::format("device_traces[{}][{}].{}", d, i, key); };
      };
      if (k.unsafe_is_equal("action")) {
        ev.action = detail::checked_action(string(fv, at("action")), name_, at("action"));
        have_action = true;
      } else if (k.unsafe_is_equal("addr")) {
        if (!is_null(fv, at("addr"))) ev.addr = size(fv, at("addr"));
        have_addr = true;
      } else if (k.unsafe_is_equal("size")) {
        ev.size = size(fv, at("size"));
        have_size = true;
      } else if (k.unsafe_is_equal("stream")) {
        ev.stream = static_cast<StreamId>(int64(fv, at("stream")));
        have_stream = true;
      } else if (k.unsafe_is_equal("time_us")) {
        ev.time_us = int64(fv, at("time_us"));
      } else if (k.unsafe_is_equal("device_free")) {
        device_free = size(fv, at("device_free"));
        have_device_free = true;
      }
    }
    auto missing = [&](const char* key) {
      detail::fail(name_, ewhere(), fmt::format("missing key '{}'", key));
    };
    if (!have_action) missing("action");
    if (ev.action == TraceAction::Oom && have_device_free) {
      ev.addr = device_free;
    } else if (!have_addr) {
      missing(ev.action == TraceAction::Oom ? "device_free" : "addr");
    }
    if (!have_size) missing("size");
    if (!have_stream) missing("stream");
    return ev;
  }

  void read_segments(od::value& v) {
    od::array segs = array(v, [] { return std::string("segments"); });
    std::size_t i = 0;
    for (auto sr : segs) {
      auto swhere = [&] { return fmt::format("segments[{}]", i); };
      od::value sv;
      if (auto e = std::move(sr).get(sv)) fail(swhere(), e);
      od::object o = object(sv, swhere);
      SegmentSnapshot seg;
      DeviceIndex device = 0;
      bool have_address = false, have_total = false, have_stream = false, have_type = false,
           have_blocks = false, relative_blocks = false;
      for (auto fr : o) {
        od::field f;
        if (auto e = std::move(fr).get(f)) fail(swhere(), e);
        std::string_view key;
        if (auto e = f.unescaped_key().get(key)) fail(swhere(), e);
        od::value fv = std::move(f).value();
        auto at = [&] { return fmt::format("segments[{}].{}", i, key); };
        if (key == "device") {
          device = detail::checked_device(int64(fv, at), name_, at);
        } else if (key == "address") {
          seg.address = size(fv, at);
          have_address = true;
        } else if (key == "total_size") {
          seg.total_size = size(fv, at);
          have_total = true;
        } else if (key == "stream") {
          seg.stream = static_cast<StreamId>(int64(fv, at));
          have_stream = true;
        } else if (key == "segment_type") {
          const std::string_view type = string(fv, at);
          if (type != "small" && type != "large")
            detail::fail(name_, at(), fmt::format("expected 'small' or 'large', got '{}'",
                                                  type.substr(0, 64)));
          seg.is_large = type == "large";
          have_type = true;
        } else if (key == "is_expandable") {
          seg.is_expandable = boolean(fv, at);
        } else if (key == "segment_pool_id") {
          seg.pool_id = pool_id(fv, at);
        } else if (key == "blocks") {
          relative_blocks = read_blocks(fv, i, seg);
          have_blocks = true;
        }
      }
      auto missing = [&](const char* key) {
        detail::fail(name_, swhere(), fmt::format("missing key '{}'", key));
      };
      if (!have_address) missing("address");
      if (!have_total) missing("total_size");
      if (!have_stream) missing("stream");
      if (!have_type) missing("segment_type");
      if (!have_blocks) missing("blocks");
      if (relative_blocks)
        for (auto& b : seg.blocks) b.address += seg.address;
      devices_.at(device).segments.push_back(std::move(seg));
      ++i;
    }
  }

  // segment_pool_id: [first, second] (PyTorch's MempoolId_t, docs/pytorch-allocator.md §14.1).
  template <class Where>
  PoolId pool_id(od::value& v, Where&& where) {
    od::array a = array(v, where);
    PoolId id;
    std::size_t n = 0;
    for (auto r : a) {
      auto w = [&] { return fmt::format("{}[{}]", where(), n); };
      od::value x;
      if (auto e = std::move(r).get(x)) fail(w(), e);
      if (n == 0) id.first = uint64(x, w);
      else if (n == 1) id.second = uint64(x, w);
      ++n;
    }
    if (n != 2) detail::fail(name_, where(), fmt::format("expected [first, second] (a pool id), got {} items", n));
    return id;
  }

  // Blocks as objects (snapshot) or as [size, requested_size, state] rows (oracle recording,
  // addresses implied by the running offset). Returns true when addresses are relative.
  bool read_blocks(od::value& v, std::size_t si, SegmentSnapshot& seg) {
    od::array blocks = array(v, [&] { return fmt::format("segments[{}].blocks", si); });
    std::size_t j = 0;
    bool relative = false;
    Bytes offset = 0;
    for (auto br : blocks) {
      auto bwhere = [&] { return fmt::format("segments[{}].blocks[{}]", si, j); };
      od::value bv;
      if (auto e = std::move(br).get(bv)) fail(bwhere(), e);
      od::json_type type;
      if (auto e = bv.type().get(type)) fail(bwhere(), e);
      BlockSnapshot blk;
      if (type == od::json_type::array) {
        relative = true;
        od::array row = array(bv, bwhere);
        std::size_t col = 0;
        for (auto cr : row) {
          auto cwhere = [&] { return fmt::format("segments[{}].blocks[{}][{}]", si, j, col); };
          od::value cv;
          if (auto e = std::move(cr).get(cv)) fail(cwhere(), e);
          if (col == 0) blk.size = size(cv, cwhere);
          else if (col == 1) blk.requested_size = size(cv, cwhere);
          else if (col == 2) blk.state = detail::checked_state(string(cv, cwhere), name_, cwhere);
          ++col;
        }
        if (col != 3)
          detail::fail(name_, bwhere(),
                       fmt::format("expected [size, requested_size, state], got {} items", col));
        blk.address = offset;
        offset += blk.size;
        if (offset >= kMaxRequest) detail::fail(name_, bwhere(), "absurd segment size");
      } else {
        od::object o = object(bv, bwhere);
        bool have_address = false, have_size = false, have_state = false;
        for (auto fr : o) {
          od::field f;
          if (auto e = std::move(fr).get(f)) fail(bwhere(), e);
          std::string_view key;
          if (auto e = f.unescaped_key().get(key)) fail(bwhere(), e);
          od::value fv = std::move(f).value();
          auto at = [&] { return fmt::format("segments[{}].blocks[{}].{}", si, j, key); };
          if (key == "address") {
            blk.address = size(fv, at);
            have_address = true;
          } else if (key == "size") {
            blk.size = size(fv, at);
            have_size = true;
          } else if (key == "requested_size") {
            blk.requested_size = size(fv, at);
          } else if (key == "state") {
            blk.state = detail::checked_state(string(fv, at), name_, at);
            have_state = true;
          }
        }
        const char* miss = !have_address ? "address" : !have_size ? "size" : !have_state ? "state" : nullptr;
        if (miss) detail::fail(name_, bwhere(), fmt::format("missing key '{}'", miss));
      }
      seg.blocks.push_back(blk);
      ++j;
    }
    return relative;
  }

  void read_settings(od::value& v, TraceFile& out) {
    auto where = [] { return std::string("allocator_settings"); };
    od::object o = object(v, where);
    for (auto fr : o) {
      od::field f;
      if (auto e = std::move(fr).get(f)) fail(where(), e);
      std::string_view key;
      if (auto e = f.unescaped_key().get(key)) fail(where(), e);
      std::string k(key);
      od::value fv = std::move(f).value();
      auto at = [&] { return "allocator_settings." + k; };
      if (k == "PYTORCH_CUDA_ALLOC_CONF") {
        if (is_null(fv, at)) {
          out.settings.fields.emplace_back(k, "None");
          continue;
        }
        out.settings.conf = std::string(string(fv, at));
        out.settings.fields.emplace_back(k, *out.settings.conf);
        continue;
      }
      out.settings.fields.emplace_back(k, text(fv, at));
    }
  }

  // ---- oracle recording: "trace": [[action, addr, size, stream], ...] ----
  void read_recording_trace(od::value& v) {
    od::array rows = array(v, [] { return std::string("trace"); });
    auto& events = devices_.at(0).events;
    std::size_t i = 0;
    for (auto rr : rows) {
      auto rwhere = [&] { return fmt::format("trace[{}]", i); };
      od::value rv;
      if (auto e = std::move(rr).get(rv)) fail(rwhere(), e);
      od::array row = array(rv, rwhere);
      TraceEvent ev;
      std::size_t col = 0;
      for (auto cr : row) {
        auto cwhere = [&] { return fmt::format("trace[{}][{}]", i, col); };
        od::value cv;
        if (auto e = std::move(cr).get(cv)) fail(cwhere(), e);
        switch (col) {
          case 0: ev.action = detail::checked_action(string(cv, cwhere), name_, cwhere); break;
          case 1:
            if (!is_null(cv, cwhere)) ev.addr = size(cv, cwhere);
            break;
          case 2: ev.size = size(cv, cwhere); break;
          case 3: ev.stream = static_cast<StreamId>(int64(cv, cwhere)); break;
          default: break;  // later columns (if any) are not ours
        }
        ++col;
      }
      if (col < 4)
        detail::fail(name_, rwhere(),
                     fmt::format("expected [action, addr, size, stream], got {} items", col));
      events.push_back(ev);
      ++i;
    }
  }

  std::string_view name_;
  simdjson::padded_string buf_;
  od::parser parser_;
  od::document doc_;
  bool started_ = false;
  detail::DeviceSet devices_;
};

}  // namespace

TraceFile parse_trace_json(std::string_view bytes, std::string_view name) {
  JsonReader r(bytes, name);
  return r.read_trace();
}

void apply_stats_sidecar(TraceFile& t, std::string_view json, std::string_view name) {
  if (is_gzip(json)) {
    const std::string plain = gunzip(json, name);
    JsonReader(plain, name).read_sidecar(t);
    return;
  }
  JsonReader(json, name).read_sidecar(t);
}

}  // namespace cachet::io

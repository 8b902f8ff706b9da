// The pickled snapshot's mapping (cachet/io/trace_pickle.h): the value tree parse_pickle builds,
// walked into a TraceFile. The JSON side lives in trace_json.cpp, the front door that tells them
// apart in trace_reader.cpp.
#include "cachet/io/trace_pickle.h"

#include <fmt/format.h>

#include "cachet/io/file.h"
#include "cachet/io/pickle.h"
#include "trace_build.h"

namespace cachet::io {
namespace {

using detail::fail;

// Walks the pickle value tree of a _snapshot() dictionary. Error paths are built only when an
// error is thrown.
class PickleMapper {
 public:
  PickleMapper(const PickleTree& t, std::string_view name) : t_(t), name_(name) {}

  TraceFile run() {
    TraceFile out;
    out.format = TraceFormat::SnapshotPickle;
    out.name = std::string(name_);
    const PickleValue& root = t_.root();
    if (root.kind == PickleKind::List) {  // a pickled memory_snapshot(): segments only
      read_segments(root, "<root>");
      out.devices = devices_.take();
      return out;
    }
    if (root.kind != PickleKind::Dict)
      fail(name_, "<root>",
           fmt::format("expected a dict (torch.cuda.memory._snapshot()), got {}",
                       to_string(root.kind)));
    const PickleValue* segs = t_.find(root, "segments");
    const PickleValue* traces = t_.find(root, "device_traces");
    if (!segs && !traces)
      fail(name_, "<root>",
           fmt::format("not a PyTorch memory snapshot: no 'segments' or 'device_traces' key "
                       "(keys: {})",
                       keys_of(root)));
    if (segs) read_segments(*segs, "segments");
    if (traces) read_traces(*traces);
    if (const PickleValue* s = t_.find(root, "allocator_settings")) read_settings(*s, out);
    out.devices = devices_.take();
    return out;
  }

 private:
  std::string keys_of(const PickleValue& dict) const {
    std::string keys;
    for (std::size_t i = 0; i + 1 < dict.items.size() && keys.size() < 200; i += 2) {
      if (!keys.empty()) keys += ", ";
      keys += t_.to_text(t_.at(dict.items[i]), 1, 60);
    }
    return keys.empty() ? "none" : keys;
  }

  template <class Where>
  [[noreturn]] void wrong(const PickleValue& v, std::string_view want, Where&& where) const {
    fail(name_, where(),
         fmt::format("expected {}, got {} (pickle offset {})", want, to_string(v.kind),
                     v.offset));
  }

  template <class Where>
  const PickleValue& dict(const PickleValue& v, Where&& where) const {
    if (v.kind != PickleKind::Dict) wrong(v, "a dict", where);
    return v;
  }
  template <class Where>
  const std::vector<PickleId>& list(const PickleValue& v, Where&& where) const {
    if (v.kind != PickleKind::List && v.kind != PickleKind::Tuple) wrong(v, "a list", where);
    return v.items;
  }
  template <class Where>
  std::int64_t integer(const PickleValue& v, Where&& where) const {
    if (v.kind == PickleKind::BigInt)
      fail(name_, where(), fmt::format("integer out of range (pickle offset {})", v.offset));
    if (v.kind != PickleKind::Int) wrong(v, "an int", where);
    return v.integer;
  }
  template <class Where>
  std::string_view str(const PickleValue& v, Where&& where) const {
    if (v.kind != PickleKind::String) wrong(v, "a str", where);
    return v.text;
  }
  template <class Where>
  bool boolean(const PickleValue& v, Where&& where) const {
    if (v.kind != PickleKind::Bool && v.kind != PickleKind::Int) wrong(v, "a bool", where);
    return v.integer != 0;
  }
  template <class Where>
  const PickleValue& field(const PickleValue& d, std::string_view key, Where&& where) const {
    if (const PickleValue* v = t_.find(d, key)) return *v;
    fail(name_, where(), fmt::format("missing key '{}'", key));
  }

  void read_segments(const PickleValue& segs, std::string_view path) {
    const auto& items = list(segs, [&] { return std::string(path); });
    for (std::size_t i = 0; i < items.size(); ++i) {
      auto where = [&] { return fmt::format("{}[{}]", path, i); };
      const PickleValue& s = dict(t_.at(items[i]), where);
      auto at = [&](std::string_view key) {
        return [&, key] { return fmt::format("{}[{}].{}", path, i, key); };
      };
      SegmentSnapshot seg;
      DeviceIndex device = 0;
      if (const PickleValue* d = t_.find(s, "device")) device = detail::checked_device(integer(*d, at("device")), name_, at("device"));
      seg.address = static_cast<std::uint64_t>(
          detail::checked_size(integer(field(s, "address", where), at("address")), name_,
                               at("address")));
      seg.total_size = detail::checked_size(
          integer(field(s, "total_size", where), at("total_size")), name_, at("total_size"));
      seg.stream = static_cast<StreamId>(integer(field(s, "stream", where), at("stream")));
      const std::string_view type = str(field(s, "segment_type", where), at("segment_type"));
      if (type != "small" && type != "large")
        fail(name_, at("segment_type")(),
             fmt::format("expected 'small' or 'large', got '{}'", type.substr(0, 64)));
      seg.is_large = type == "large";
      if (const PickleValue* e = t_.find(s, "is_expandable"))
        seg.is_expandable = boolean(*e, at("is_expandable"));
      // (first, second): docs/pytorch-allocator.md §14.1
      if (const PickleValue* e = t_.find(s, "segment_pool_id")) {
        const auto& id = list(*e, at("segment_pool_id"));
        if (id.size() != 2)
          fail(name_, at("segment_pool_id")(),
               fmt::format("expected (first, second) (a pool id), got {} items", id.size()));
        auto half = [&](std::size_t k) {
          const std::int64_t v = integer(t_.at(id[k]), at("segment_pool_id"));
          if (v < 0) fail(name_, at("segment_pool_id")(), fmt::format("negative pool id half {}", v));
          return static_cast<std::uint64_t>(v);
        };
        seg.pool_id = PoolId{half(0), half(1)};
      }
      const auto& blocks = list(field(s, "blocks", where), at("blocks"));
      seg.blocks.reserve(blocks.size());
      for (std::size_t j = 0; j < blocks.size(); ++j) {
        auto bwhere = [&] { return fmt::format("{}[{}].blocks[{}]", path, i, j); };
        auto bat = [&](std::string_view key) {
          return [&, key] { return fmt::format("{}[{}].blocks[{}].{}", path, i, j, key); };
        };
        const PickleValue& b = dict(t_.at(blocks[j]), bwhere);
        BlockSnapshot blk;
        blk.address = detail::checked_size(integer(field(b, "address", bwhere), bat("address")),
                                           name_, bat("address"));
        blk.size = detail::checked_size(integer(field(b, "size", bwhere), bat("size")), name_,
                                        bat("size"));
        if (const PickleValue* r = t_.find(b, "requested_size"))
          blk.requested_size =
              detail::checked_size(integer(*r, bat("requested_size")), name_,
                                   bat("requested_size"));
        blk.state = detail::checked_state(str(field(b, "state", bwhere), bat("state")), name_,
                                          bat("state"));
        seg.blocks.push_back(blk);
      }
      devices_.at(device).segments.push_back(std::move(seg));
    }
  }

  void read_traces(const PickleValue& traces) {
    const auto& per_device = list(traces, [] { return std::string("device_traces"); });
    if (per_device.size() > kMaxDevices)
      fail(name_, "device_traces",
           fmt::format("{} devices (at most {})", per_device.size(), kMaxDevices));
    for (std::size_t d = 0; d < per_device.size(); ++d) {
      const auto& entries =
          list(t_.at(per_device[d]), [&] { return fmt::format("device_traces[{}]", d); });
      if (entries.empty()) continue;
      auto& events = devices_.at(static_cast<DeviceIndex>(d)).events;
      events.reserve(entries.size());
      for (std::size_t i = 0; i < entries.size(); ++i) {
        auto where = [&] { return fmt::format("device_traces[{}][{}]", d, i); };
        auto at = [&](std::string_view key) {
          return [&, key] { return fmt::format("device_traces[{}][{}].{}", d, i, key); };
        };
        const PickleValue& e = dict(t_.at(entries[i]), where);
        TraceEvent ev;
        ev.action = detail::checked_action(str(field(e, "action", where), at("action")), name_,
                                           at("action"));
        const char* addr_key = ev.action == TraceAction::Oom ? "device_free" : "addr";
        ev.addr = static_cast<std::uint64_t>(detail::checked_size(
            integer(field(e, addr_key, where), at(addr_key)), name_, at(addr_key)));
        ev.size =
            detail::checked_size(integer(field(e, "size", where), at("size")), name_, at("size"));
        ev.stream = static_cast<StreamId>(integer(field(e, "stream", where), at("stream")));
        if (const PickleValue* tu = t_.find(e, "time_us")) ev.time_us = integer(*tu, at("time_us"));
        events.push_back(ev);
      }
    }
  }

  void read_settings(const PickleValue& s, TraceFile& out) {
    const PickleValue& d = dict(s, [] { return std::string("allocator_settings"); });
    for (std::size_t i = 0; i + 1 < d.items.size(); i += 2) {
      const PickleValue& k = t_.at(d.items[i]);
      const PickleValue& v = t_.at(d.items[i + 1]);
      const std::string key = k.kind == PickleKind::String ? std::string(k.text) : t_.to_text(k);
      std::string value =
          v.kind == PickleKind::String ? std::string(v.text) : t_.to_text(v, 3, 1000);
      if (key == "PYTORCH_CUDA_ALLOC_CONF") {
        if (v.kind == PickleKind::String) {
          out.settings.conf = std::string(v.text);
        } else if (v.kind != PickleKind::None) {
          wrong(v, "a str", [] { return std::string("allocator_settings.PYTORCH_CUDA_ALLOC_CONF"); });
        }
      }
      out.settings.fields.emplace_back(key, std::move(value));
    }
  }

  const PickleTree& t_;
  std::string_view name_;
  detail::DeviceSet devices_;
};

}  // namespace

TraceFile parse_snapshot_pickle(std::string_view bytes, std::string_view name) {
  const PickleTree tree = parse_pickle(bytes, name);
  return PickleMapper(tree, name).run();
}

}  // namespace cachet::io

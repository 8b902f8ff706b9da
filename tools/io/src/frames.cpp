// Stack frames of trace events from a pickled snapshot (frames.h). The pickle is parsed again
// here (PickleTree): the trace reader keeps only the events.
#include "cachet/io/frames.h"

#include <cctype>

#include <fmt/format.h>

#include "cachet/io/file.h"
#include "cachet/io/pickle.h"

namespace cachet::io {

namespace {

// The frames list of one event dict; an entry that is not a {name, filename, line} dict is
// skipped (frames are for people to read, not replayed).
std::vector<Frame> frames_of(const PickleTree& t, const PickleValue& event) {
  std::vector<Frame> out;
  if (event.kind != PickleKind::Dict) return out;
  const PickleValue* fr = t.find(event, "frames");
  if (fr == nullptr || (fr->kind != PickleKind::List && fr->kind != PickleKind::Tuple)) return out;
  out.reserve(fr->items.size());
  for (PickleId id : fr->items) {
    const PickleValue& f = t.at(id);
    if (f.kind != PickleKind::Dict) continue;
    Frame x;
    if (const PickleValue* n = t.find(f, "name"); n && n->kind == PickleKind::String) x.name = std::string(n->text);
    if (const PickleValue* n = t.find(f, "filename"); n && n->kind == PickleKind::String)
      x.filename = std::string(n->text);
    if (const PickleValue* n = t.find(f, "line"); n && n->kind == PickleKind::Int) x.line = n->integer;
    out.push_back(std::move(x));
  }
  return out;
}

}  // namespace

std::vector<std::vector<Frame>> parse_event_frames(std::string_view bytes, std::string_view name,
                                                   DeviceIndex device) {
  std::string plain;
  if (is_gzip(bytes)) {
    plain = gunzip(bytes, name);
    bytes = plain;
  }
  std::vector<std::vector<Frame>> out;
  if (bytes.empty() || static_cast<unsigned char>(bytes[0]) != 0x80) return out;  // not a pickle
  const PickleTree t = parse_pickle(bytes, name);
  const PickleValue& root = t.root();
  if (root.kind != PickleKind::Dict) return out;
  const PickleValue* traces = t.find(root, "device_traces");
  if (traces == nullptr || (traces->kind != PickleKind::List && traces->kind != PickleKind::Tuple)) return out;
  if (device < 0 || static_cast<std::size_t>(device) >= traces->items.size()) return out;
  const PickleValue& events = t.at(traces->items[static_cast<std::size_t>(device)]);
  if (events.kind != PickleKind::List && events.kind != PickleKind::Tuple) return out;
  out.reserve(events.items.size());
  bool any = false;
  for (PickleId id : events.items) {
    out.push_back(frames_of(t, t.at(id)));
    any = any || !out.back().empty();
  }
  if (!any) out.clear();
  return out;
}

std::vector<std::vector<Frame>> read_event_frames(const std::string& path, DeviceIndex device) {
  return parse_event_frames(read_file(path), path, device);
}

std::string to_string(const Frame& f) {
  const auto slash = f.filename.find_last_of('/');
  const std::string file = slash == std::string::npos ? f.filename : f.filename.substr(slash + 1);
  if (file.empty() || file == "??") return f.name;  // a C++ frame without its source file
  return fmt::format("{} ({}:{})", f.name, file, f.line);
}

bool is_pytorch_frame(const Frame& f) {
  return f.filename.find("site-packages/torch/") != std::string::npos ||
         f.filename.find("dist-packages/torch/") != std::string::npos;
}

bool is_python_frame(const Frame& f) {
  const std::string& n = f.filename;
  return n.size() >= 3 && n.compare(n.size() - 3, 3, ".py") == 0;
}

bool is_internal_cpp_frame(const Frame& f) {
  if (is_python_frame(f)) return false;
  const std::string& n = f.name;
  if (n.empty() || n.starts_with("??") || n.starts_with("0x")) return true;  // unsymbolised
  // The qualified name, without its arguments and template arguments: "void at::native::foo<...>(...)"
  // -> "void at::native::foo".
  std::string q = n.substr(0, std::min(n.find('('), n.find('<')));
  if (const auto sp = q.find_last_of(' '); sp != std::string::npos) q = q.substr(sp + 1);
  for (const char* ns : {"torch::", "c10::", "at::", "caffe2::", "c10d::", "std::", "pthread_", "__", "start_thread",
                         "clone"})
    if (q.starts_with(ns)) return true;
  return q.starts_with("_Py") || (q.size() > 2 && q.starts_with("Py") && std::isupper(static_cast<unsigned char>(q[2])));
}

std::size_t site_frame(const std::vector<Frame>& frames) {
  for (std::size_t i = 0; i < frames.size(); ++i)
    if (is_python_frame(frames[i]) && !is_pytorch_frame(frames[i])) return i;
  for (std::size_t i = 0; i < frames.size(); ++i)
    if (is_python_frame(frames[i])) return i;
  for (std::size_t i = 0; i < frames.size(); ++i)
    if (!is_internal_cpp_frame(frames[i])) return i;
  // Only PyTorch's own C++ frames: autograd's backward node, when the stack names one (the
  // backward thread records no Python frame), says which operation's gradient it was.
  for (std::size_t i = 0; i < frames.size(); ++i)
    if (!autograd_node(frames[i]).empty()) return i;
  return frames.size();
}

std::string autograd_node(const Frame& f) {
  static constexpr std::string_view kGenerated = "torch::autograd::generated::";
  const std::string& n = f.name;
  const auto at = n.find(kGenerated);
  if (at == std::string::npos) return {};
  const auto from = at + kGenerated.size();
  const auto end = n.find("::apply(", from);
  if (end == std::string::npos) return {};
  const std::string node = n.substr(from, end - from);
  if (node.find("Backward") == std::string::npos || node.find_first_of(":<( ") != std::string::npos) return {};
  return node;
}

std::string site_text(const Frame& f) {
  if (const std::string node = autograd_node(f); !node.empty())
    return node + " (autograd's backward; the stack has only PyTorch's C++ frames)";
  if (is_python_frame(f)) return to_string(f);
  // A C++ frame: its name without the arguments.
  Frame g = f;
  if (const auto paren = g.name.find('('); paren != std::string::npos && paren > 0) g.name = g.name.substr(0, paren);
  return to_string(g);
}

}  // namespace cachet::io

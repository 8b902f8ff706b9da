// cachet/io/frames.h: the stack frames PyTorch records with each trace event
// (_record_memory_history(stacks="python" or "all")): device_traces[d][i]["frames"], a list of
// {name, filename, line}, innermost first. Read apart from the events (trace_reader.h), only by
// the commands that show them (`cachet explain`, `cachet report`): most traces have none, and a
// million-event trace's frames cost far more memory than its events.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "cachet/types.h"

namespace cachet::io {

struct Frame {
  std::string name;      // function
  std::string filename;  // as recorded
  std::int64_t line = 0;
  friend bool operator==(const Frame&, const Frame&) = default;
};

// The frames of each event of device `device`, indexed as TraceFile::devices[...].events (empty
// lists where an event has none). Empty when the file records no frames at all (JSON snapshots
// and oracle recordings are read as having none). Throws ReadError on unreadable input.
std::vector<std::vector<Frame>> read_event_frames(const std::string& path, DeviceIndex device);

// The same from bytes already read (gzip or plain).
std::vector<std::vector<Frame>> parse_event_frames(std::string_view bytes, std::string_view name,
                                                   DeviceIndex device);

// "name (file.py:12)": the file's last path component.
std::string to_string(const Frame& f);

// PyTorch's own Python code (site-packages/torch/, dist-packages/torch/): the innermost frame
// outside it is where the user's code (or a library such as transformers) asked for memory.
bool is_pytorch_frame(const Frame& f);

// A Python frame (its file ends in .py): with _record_memory_history(stacks="all") PyTorch puts
// C++ frames first (torch::unwind::unwind(), c10, ATen; file "??", line 0, or a .cpp/.h/.so).
bool is_python_frame(const Frame& f);

// A C++ frame of PyTorch's own or of the interpreter, which says nothing of where the program
// asked for memory: a function of torch::, c10::, at:: or caffe2:: (torch::unwind::unwind() first
// of all), an unsymbolised one ("??"), or CPython's (_Py..., Py...).
bool is_internal_cpp_frame(const Frame& f);

// Where memory was asked for: the innermost Python frame outside PyTorch's own code; else the
// innermost Python frame; else the innermost C++ frame that is not PyTorch's own
// (is_internal_cpp_frame); else the autograd node the stack runs (autograd_node);
// frames.size() when there is none (no frame, or only PyTorch's own).
std::size_t site_frame(const std::vector<Frame>& frames);

// The autograd node a C++ frame runs ("PowBackward0" for
// torch::autograd::generated::PowBackward0::apply(...)), or "" when it runs none.
std::string autograd_node(const Frame& f);

// A site frame as explain lists it: to_string for a Python frame; a C++ frame's name without its
// arguments; an autograd node as "PowBackward0 (autograd's backward; ...)".
std::string site_text(const Frame& f);

}  // namespace cachet::io

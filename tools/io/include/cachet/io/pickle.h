// cachet/io/pickle.h: a reader for the plain-data subset of Python's pickle format, the subset
// torch.cuda.memory._dump_snapshot() writes (protocols 2 to 5): dicts, lists, tuples, sets,
// str, bytes, int (any width; LONG1/LONG4), float, bool, None, the memo, MARK/APPENDS/SETITEMS
// and FRAME. No Python and no code execution: GLOBAL, STACK_GLOBAL, REDUCE, BUILD, NEWOBJ,
// persistent ids, out-of-band buffers and every unknown opcode are errors naming the opcode and
// its offset.
//
// The result is a small generic value tree (PickleTree) over the input bytes: strings are views
// into them, so the bytes must outlive the tree. Memory is linear in the input: every opcode
// pushes at most one value, so a tree never holds more values or container entries than the
// input has bytes. Containers may be shared or even cyclic (the memo allows it); walkers must
// bound their depth (see to_text).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace cachet::io {

enum class PickleKind : std::uint8_t {
  None,
  Bool,
  Int,     // fits std::int64_t
  BigInt,  // an int that does not fit std::int64_t (value not kept)
  Float,
  String,  // str (UTF-8 bytes as written)
  Bytes,   // bytes, bytearray, Python 2 str
  List,
  Tuple,
  Set,     // set or frozenset
  Dict,    // items: key, value, key, value, ... in insertion order
};

std::string_view to_string(PickleKind k);

using PickleId = std::uint32_t;

namespace detail {
class PickleParser;
}

struct PickleValue {
  PickleKind kind = PickleKind::None;
  std::int64_t integer = 0;         // Int and Bool
  double real = 0.0;                // Float
  std::string_view text;            // String and Bytes: a view into the input
  std::vector<PickleId> items;      // List, Tuple, Set; Dict: key, value pairs flattened
  std::uint64_t offset = 0;         // offset of the opcode that made it (for error messages)
};

class PickleTree {
 public:
  const PickleValue& root() const { return values_[root_]; }
  PickleId root_id() const { return root_; }
  const PickleValue& at(PickleId id) const { return values_[id]; }
  std::size_t size() const { return values_.size(); }

  // The value stored under the string key `key` in dict `dict` (the last one, as Python keeps
  // it), or nullptr. `dict` must be a Dict.
  const PickleValue* find(const PickleValue& dict, std::string_view key) const;

  // A short Python-like rendering (depth and length bounded; cycles print as "...").
  std::string to_text(const PickleValue& v, int max_depth = 6, std::size_t max_len = 400) const;

 private:
  friend class detail::PickleParser;
  std::vector<PickleValue> values_;
  PickleId root_ = 0;
};

// Parses one pickle from `bytes` (the whole input must be one pickle, ending in STOP; trailing
// bytes after STOP are ignored, as pickle.load does). `name` names the source in errors.
// Throws ReadError("<name>: pickle offset N: ...").
PickleTree parse_pickle(std::string_view bytes, std::string_view name);

}  // namespace cachet::io

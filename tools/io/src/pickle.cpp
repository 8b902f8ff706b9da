// The plain-data pickle reader (see cachet/io/pickle.h). A stack machine over the opcodes of
// Lib/pickletools.py; no recursion, so nesting depth cannot exhaust the C++ stack.
#include "cachet/io/pickle.h"

#include <fmt/format.h>

#include <bit>
#include <cstring>
#include <limits>

#include "cachet/io/file.h"

namespace cachet::io {

std::string_view to_string(PickleKind k) {
  switch (k) {
    case PickleKind::None: return "None";
    case PickleKind::Bool: return "bool";
    case PickleKind::Int: return "int";
    case PickleKind::BigInt: return "int (too large)";
    case PickleKind::Float: return "float";
    case PickleKind::String: return "str";
    case PickleKind::Bytes: return "bytes";
    case PickleKind::List: return "list";
    case PickleKind::Tuple: return "tuple";
    case PickleKind::Set: return "set";
    case PickleKind::Dict: return "dict";
  }
  return "?";
}

const PickleValue* PickleTree::find(const PickleValue& dict, std::string_view key) const {
  const auto& it = dict.items;
  for (std::size_t i = it.size(); i >= 2; i -= 2) {
    const PickleValue& k = values_[it[i - 2]];
    if (k.kind == PickleKind::String && k.text == key) return &values_[it[i - 1]];
  }
  return nullptr;
}

namespace {

void render(const PickleTree& t, const PickleValue& v, int depth, std::size_t max_len,
            std::string& out) {
  if (out.size() > max_len) return;
  switch (v.kind) {
    case PickleKind::None: out += "None"; return;
    case PickleKind::Bool: out += v.integer ? "True" : "False"; return;
    case PickleKind::Int: out += std::to_string(v.integer); return;
    case PickleKind::BigInt: out += "<big int>"; return;
    case PickleKind::Float: {  // Python's repr: 0.0, not 0
      std::string f = fmt::format("{}", v.real);
      if (f.find_first_of(".eEn") == std::string::npos) f += ".0";
      out += f;
      return;
    }
    case PickleKind::String:
      out += '\'';
      out.append(v.text.substr(0, max_len));
      out += '\'';
      return;
    case PickleKind::Bytes: out += fmt::format("<{} bytes>", v.text.size()); return;
    default: break;
  }
  const char* open = v.kind == PickleKind::List ? "[" : v.kind == PickleKind::Tuple ? "(" : "{";
  const char* close = v.kind == PickleKind::List ? "]" : v.kind == PickleKind::Tuple ? ")" : "}";
  out += open;
  if (depth <= 0) {
    if (!v.items.empty()) out += "...";
  } else if (v.kind == PickleKind::Dict) {
    for (std::size_t i = 0; i + 1 < v.items.size() && out.size() <= max_len; i += 2) {
      if (i) out += ", ";
      render(t, t.at(v.items[i]), depth - 1, max_len, out);
      out += ": ";
      render(t, t.at(v.items[i + 1]), depth - 1, max_len, out);
    }
  } else {
    for (std::size_t i = 0; i < v.items.size() && out.size() <= max_len; ++i) {
      if (i) out += ", ";
      render(t, t.at(v.items[i]), depth - 1, max_len, out);
    }
  }
  if (out.size() > max_len) {
    out += "...";
    return;
  }
  out += close;
}

constexpr PickleId kNoMemo = std::numeric_limits<PickleId>::max();

struct OpName {
  unsigned char code;
  const char* name;
};
// Names of opcodes cachet refuses, for the error message (Lib/pickletools.py).
constexpr OpName kRefused[] = {
    {'c', "GLOBAL"},      {0x93, "STACK_GLOBAL"}, {'R', "REDUCE"},       {'b', "BUILD"},
    {0x81, "NEWOBJ"},     {0x92, "NEWOBJ_EX"},    {'i', "INST"},         {'o', "OBJ"},
    {0x82, "EXT1"},       {0x83, "EXT2"},         {0x84, "EXT4"},        {'P', "PERSID"},
    {'Q', "BINPERSID"},   {0x97, "NEXT_BUFFER"},  {0x98, "READONLY_BUFFER"},
    {'I', "INT"},         {'L', "LONG"},          {'F', "FLOAT"},        {'S', "STRING"},
    {'V', "UNICODE"},     {'p', "PUT"},           {'g', "GET"},
};

}  // namespace

namespace detail {

class PickleParser {
 public:
  PickleParser(std::string_view bytes, std::string_view name) : in_(bytes), name_(name) {}

  PickleTree run() {
    while (true) {
      if (pos_ >= in_.size()) fail(pos_, "truncated pickle: input ended before STOP");
      op_at_ = pos_;
      const auto op = static_cast<unsigned char>(in_[pos_++]);
      switch (op) {
        case 0x80: {  // PROTO
          const auto proto = u8();
          if (proto > 5) fail(op_at_, fmt::format("unsupported pickle protocol {}", proto));
          break;
        }
        case 0x95:  // FRAME: an 8-byte length; frames are only a buffering hint
          (void)take(8);
          break;
        case '.': {  // STOP
          if (stack_.size() != 1 || !marks_.empty())
            fail(op_at_, fmt::format("STOP with {} values and {} marks on the stack (expected 1 "
                                     "and 0)", stack_.size(), marks_.size()));
          tree_.root_ = stack_.back();
          return std::move(tree_);
        }
        case '(': marks_.push_back(stack_.size()); break;  // MARK
        case '0': pop(); break;                             // POP
        case '1': (void)pop_mark(); break;                  // POP_MARK
        case '2': push_existing(top()); break;              // DUP
        case 'N': make(PickleKind::None); break;
        case 0x88: make(PickleKind::Bool).integer = 1; break;  // NEWTRUE
        case 0x89: make(PickleKind::Bool).integer = 0; break;  // NEWFALSE
        case 'J': {  // BININT: 4-byte signed
          const auto raw = le(4);
          make(PickleKind::Int).integer = static_cast<std::int32_t>(static_cast<std::uint32_t>(raw));
          break;
        }
        case 'K': make(PickleKind::Int).integer = static_cast<std::int64_t>(le(1)); break;
        case 'M': make(PickleKind::Int).integer = static_cast<std::int64_t>(le(2)); break;
        case 0x8a: long_int(le(1)); break;  // LONG1
        case 0x8b: long_int(le(4)); break;  // LONG4
        case 'G': {  // BINFLOAT: big-endian double
          const std::string_view b = take(8);
          std::uint64_t bits = 0;
          for (char c : b) bits = (bits << 8) | static_cast<unsigned char>(c);
          make(PickleKind::Float).real = std::bit_cast<double>(bits);
          break;
        }
        case 0x8c: text(PickleKind::String, le(1)); break;  // SHORT_BINUNICODE
        case 'X': text(PickleKind::String, le(4)); break;   // BINUNICODE
        case 0x8d: text(PickleKind::String, le(8)); break;  // BINUNICODE8
        case 'C': text(PickleKind::Bytes, le(1)); break;    // SHORT_BINBYTES
        case 'B': text(PickleKind::Bytes, le(4)); break;    // BINBYTES
        case 0x8e: text(PickleKind::Bytes, le(8)); break;   // BINBYTES8
        case 0x96: text(PickleKind::Bytes, le(8)); break;   // BYTEARRAY8
        case 'U': text(PickleKind::Bytes, le(1)); break;    // SHORT_BINSTRING
        case 'T': {                                         // BINSTRING: 4-byte signed length
          const auto n = le(4);
          if (n > 0x7fffffffu) fail(op_at_, "BINSTRING with a negative length");
          text(PickleKind::Bytes, n);
          break;
        }
        case '}': make(PickleKind::Dict); break;   // EMPTY_DICT
        case ']': make(PickleKind::List); break;   // EMPTY_LIST
        case ')': make(PickleKind::Tuple); break;  // EMPTY_TUPLE
        case 0x8f: make(PickleKind::Set); break;   // EMPTY_SET
        case 0x85: tuple_of(1); break;             // TUPLE1
        case 0x86: tuple_of(2); break;             // TUPLE2
        case 0x87: tuple_of(3); break;             // TUPLE3
        case 't': container_from_mark(PickleKind::Tuple); break;      // TUPLE
        case 'l': container_from_mark(PickleKind::List); break;       // LIST
        case 0x91: container_from_mark(PickleKind::Set); break;       // FROZENSET
        case 'd': {                                                   // DICT
          const std::size_t base = pop_mark();
          if ((stack_.size() - base) % 2) fail(op_at_, "DICT with an odd number of items");
          container_from(PickleKind::Dict, base);
          break;
        }
        case 'a': {  // APPEND
          const PickleId item = pop();
          append_to(top(), PickleKind::List, &item, 1, "APPEND");
          break;
        }
        case 'e': extend_from_mark(PickleKind::List, "APPENDS"); break;
        case 0x90: extend_from_mark(PickleKind::Set, "ADDITEMS"); break;
        case 's': {  // SETITEM
          PickleId kv[2];
          kv[1] = pop();
          kv[0] = pop();
          append_to(top(), PickleKind::Dict, kv, 2, "SETITEM");
          break;
        }
        case 'u': {  // SETITEMS
          const std::size_t base = pop_mark();
          if ((stack_.size() - base) % 2) fail(op_at_, "SETITEMS with an odd number of items");
          if (base <= floor()) fail(op_at_, "SETITEMS with no dict below the mark");
          append_to(stack_[base - 1], PickleKind::Dict, stack_.data() + base,
                    stack_.size() - base, "SETITEMS");
          stack_.resize(base);
          break;
        }
        case 'q': memo_put(le(1)); break;      // BINPUT
        case 'r': memo_put(le(4)); break;      // LONG_BINPUT
        case 0x94: memo_put(memo_count_); break;  // MEMOIZE
        case 'h': memo_get(le(1)); break;      // BINGET
        case 'j': memo_get(le(4)); break;      // LONG_BINGET
        default: refuse(op);
      }
    }
  }

 private:
  [[noreturn]] void fail(std::uint64_t at, const std::string& what) const {
    throw ReadError(fmt::format("{}: pickle offset {}: {}", name_, at, what));
  }

  [[noreturn]] void refuse(unsigned char op) const {
    for (const auto& r : kRefused)
      if (r.code == op)
        fail(op_at_, fmt::format("unsupported pickle opcode {} (0x{:02x}): cachet reads plain "
                                 "data (dict, list, tuple, str, bytes, int, float, bool, None) "
                                 "and never loads Python objects or runs code",
                                 r.name, op));
    fail(op_at_, fmt::format("unknown pickle opcode 0x{:02x}", op));
  }

  std::string_view take(std::uint64_t n) {
    if (n > in_.size() - pos_)
      fail(op_at_, fmt::format("truncated pickle: opcode needs {} more bytes, {} left", n,
                               in_.size() - pos_));
    std::string_view s = in_.substr(pos_, n);
    pos_ += n;
    return s;
  }
  std::uint64_t le(int n) {
    const std::string_view b = take(static_cast<std::uint64_t>(n));
    std::uint64_t v = 0;
    for (int i = n - 1; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(b[i]);
    return v;
  }
  std::uint64_t u8() { return le(1); }

  PickleValue& make(PickleKind k) {
    auto& v = tree_.values_.emplace_back();
    v.kind = k;
    v.offset = op_at_;
    stack_.push_back(static_cast<PickleId>(tree_.values_.size() - 1));
    return v;
  }
  void push_existing(PickleId id) { stack_.push_back(id); }

  PickleId top() const {
    if (stack_.size() <= floor()) fail(op_at_, "stack underflow (no value above the mark)");
    return stack_.back();
  }
  PickleId pop() {
    const PickleId id = top();
    stack_.pop_back();
    return id;
  }
  std::size_t floor() const { return marks_.empty() ? 0 : marks_.back(); }
  std::size_t pop_mark() {
    if (marks_.empty()) fail(op_at_, "no MARK on the stack");
    const std::size_t base = marks_.back();
    marks_.pop_back();
    return base;
  }

  void long_int(std::uint64_t n) {
    const std::string_view b = take(n);
    PickleValue& v = make(PickleKind::Int);
    if (n == 0) return;  // LONG1 0 encodes 0
    if (n > 8) {
      // Fits int64 only if the extra high bytes are pure sign extension.
      const auto sign = static_cast<unsigned char>(b[n - 1]) & 0x80 ? 0xff : 0x00;
      bool fits = (static_cast<unsigned char>(b[7]) & 0x80) == (sign & 0x80);
      for (std::uint64_t i = 8; i < n && fits; ++i)
        fits = static_cast<unsigned char>(b[i]) == sign;
      if (!fits) {
        v.kind = PickleKind::BigInt;
        return;
      }
      n = 8;
    }
    std::uint64_t u = 0;
    for (std::uint64_t i = n; i-- > 0;) u = (u << 8) | static_cast<unsigned char>(b[i]);
    if (n < 8 && (static_cast<unsigned char>(b[n - 1]) & 0x80)) u |= ~std::uint64_t{0} << (8 * n);
    v.integer = static_cast<std::int64_t>(u);
  }

  void text(PickleKind k, std::uint64_t n) {
    const std::string_view s = take(n);
    make(k).text = s;
  }

  void tuple_of(std::size_t n) {
    if (stack_.size() < floor() + n) fail(op_at_, fmt::format("TUPLE{} needs {} values", n, n));
    container_from(PickleKind::Tuple, stack_.size() - n);
  }
  void container_from_mark(PickleKind k) { container_from(k, pop_mark()); }
  void container_from(PickleKind k, std::size_t base) {
    std::vector<PickleId> items(stack_.begin() + static_cast<std::ptrdiff_t>(base), stack_.end());
    stack_.resize(base);
    make(k).items = std::move(items);
  }

  void append_to(PickleId target, PickleKind want, const PickleId* items, std::size_t n,
                 const char* op) {
    PickleValue& t = tree_.values_[target];
    if (t.kind != want)
      fail(op_at_, fmt::format("{} on a {} (expected a {})", op, to_string(t.kind),
                               to_string(want)));
    t.items.insert(t.items.end(), items, items + n);
  }
  void extend_from_mark(PickleKind want, const char* op) {
    const std::size_t base = pop_mark();
    if (base <= floor()) fail(op_at_, fmt::format("{} with no container below the mark", op));
    append_to(stack_[base - 1], want, stack_.data() + base, stack_.size() - base, op);
    stack_.resize(base);
  }

  void memo_put(std::uint64_t index) {
    const PickleId id = top();
    // A pickle cannot hold more memo entries than it has bytes; refuse indices that would
    // make the memo table larger than the input (absurd, and a memory bomb).
    if (index > in_.size() + 16) fail(op_at_, fmt::format("memo index {} out of range", index));
    if (index >= memo_.size()) memo_.resize(index + 1, kNoMemo);
    if (memo_[index] == kNoMemo) ++memo_count_;  // MEMOIZE uses len(memo), distinct keys
    memo_[index] = id;
  }
  void memo_get(std::uint64_t index) {
    if (index >= memo_.size() || memo_[index] == kNoMemo)
      fail(op_at_, fmt::format("memo index {} read before it was written", index));
    push_existing(memo_[index]);
  }

  std::string_view in_;
  std::string_view name_;
  std::uint64_t pos_ = 0;
  std::uint64_t op_at_ = 0;
  PickleTree tree_;
  std::vector<PickleId> stack_;
  std::vector<std::size_t> marks_;
  std::vector<PickleId> memo_;
  std::uint64_t memo_count_ = 0;
};

}  // namespace detail

std::string PickleTree::to_text(const PickleValue& v, int max_depth, std::size_t max_len) const {
  std::string out;
  render(*this, v, max_depth, max_len, out);
  return out;
}

PickleTree parse_pickle(std::string_view bytes, std::string_view name) {
  if (bytes.size() >= std::numeric_limits<PickleId>::max())
    throw ReadError(fmt::format("{}: pickle of {} bytes is too large (limit 4 GiB)", name,
                                bytes.size()));
  return detail::PickleParser(bytes, name).run();
}

}  // namespace cachet::io

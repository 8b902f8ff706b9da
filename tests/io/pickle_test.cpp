// The plain-data pickle reader: values from pickles Python wrote, and refusals.
// Every byte string below was produced by CPython 3 `pickle.dumps(obj, protocol=p).hex()`.
#include <gtest/gtest.h>

#include <string>

#include "cachet/io/file.h"
#include "cachet/io/pickle.h"

namespace cachet::io {
namespace {

std::string unhex(std::string_view h) {
  std::string out;
  for (std::size_t i = 0; i + 1 < h.size(); i += 2)
    out += static_cast<char>(std::stoi(std::string(h.substr(i, 2)), nullptr, 16));
  return out;
}

// {'a': [1, -2, 2**40, -2**63, 2**64, 255, 65535, -1], 'b': (1.5, None, True, False),
//  'c': b'xy', 's': 'hé'}
constexpr std::string_view kP3 =
    "80037d71002858010000006171015d7102284b014afeffffff8a060000000000018a0800000000000000808a09"
    "0000000000000000014bff4dffff4affffffff65580100000062710328473ff80000000000004e888974710458"
    "010000006371054302787971065801000000737107580300000068c3a97108752e";
constexpr std::string_view kP4 =
    "80049561000000000000007d94288c0161945d94284b014afeffffff8a060000000000018a0800000000000000"
    "808a090000000000000000014bff4dffff4affffffff658c01629428473ff80000000000004e888974948c0163"
    "9443027879948c0173948c0368c3a994752e";
constexpr std::string_view kP5 =
    "80059561000000000000007d94288c0161945d94284b014afeffffff8a060000000000018a0800000000000000"
    "808a090000000000000000014bff4dffff4affffffff658c01629428473ff80000000000004e888974948c0163"
    "9443027879948c0173948c0368c3a994752e";

void expect_sample(const PickleTree& t) {
  const PickleValue& root = t.root();
  ASSERT_EQ(root.kind, PickleKind::Dict);
  ASSERT_EQ(root.items.size(), 8u);  // 4 keys
  const PickleValue* a = t.find(root, "a");
  ASSERT_NE(a, nullptr);
  ASSERT_EQ(a->kind, PickleKind::List);
  ASSERT_EQ(a->items.size(), 8u);
  EXPECT_EQ(t.at(a->items[0]).integer, 1);
  EXPECT_EQ(t.at(a->items[1]).integer, -2);
  EXPECT_EQ(t.at(a->items[2]).integer, 1099511627776);  // 2**40 (LONG1, 6 bytes)
  EXPECT_EQ(t.at(a->items[3]).kind, PickleKind::Int);
  EXPECT_EQ(t.at(a->items[3]).integer, INT64_MIN);       // -2**63 (LONG1, 8 bytes)
  EXPECT_EQ(t.at(a->items[4]).kind, PickleKind::BigInt);  // 2**64 (LONG1, 9 bytes)
  EXPECT_EQ(t.at(a->items[5]).integer, 255);
  EXPECT_EQ(t.at(a->items[6]).integer, 65535);
  EXPECT_EQ(t.at(a->items[7]).integer, -1);
  const PickleValue* b = t.find(root, "b");
  ASSERT_NE(b, nullptr);
  ASSERT_EQ(b->kind, PickleKind::Tuple);
  ASSERT_EQ(b->items.size(), 4u);
  EXPECT_EQ(t.at(b->items[0]).kind, PickleKind::Float);
  EXPECT_EQ(t.at(b->items[0]).real, 1.5);
  EXPECT_EQ(t.at(b->items[1]).kind, PickleKind::None);
  EXPECT_EQ(t.at(b->items[2]).kind, PickleKind::Bool);
  EXPECT_EQ(t.at(b->items[2]).integer, 1);
  EXPECT_EQ(t.at(b->items[3]).integer, 0);
  const PickleValue* c = t.find(root, "c");
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->kind, PickleKind::Bytes);
  EXPECT_EQ(c->text, "xy");
  const PickleValue* s = t.find(root, "s");
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->kind, PickleKind::String);
  EXPECT_EQ(s->text, "h\xc3\xa9");
  EXPECT_EQ(t.find(root, "missing"), nullptr);
}

TEST(Pickle, Protocol3) {
  const std::string b = unhex(kP3);
  expect_sample(parse_pickle(b, "p3"));
}
TEST(Pickle, Protocol4) {
  const std::string b = unhex(kP4);
  expect_sample(parse_pickle(b, "p4"));
}
TEST(Pickle, Protocol5) {
  const std::string b = unhex(kP5);
  expect_sample(parse_pickle(b, "p5"));
}

TEST(Pickle, Protocol2TupleAndList) {
  // {'a': [1, -2, 2**40], 't': (1, 2, 3)}, protocol 2 (BINPUT memo, TUPLE3)
  const std::string b = unhex(
      "80027d71002858010000006171015d7102284b014afeffffff8a0600000000000165580100000074710"
      "34b014b024b03877104752e");
  const PickleTree t = parse_pickle(b, "p2");
  EXPECT_EQ(t.to_text(t.root()), "{'a': [1, -2, 1099511627776], 't': (1, 2, 3)}");
}

TEST(Pickle, MemoSharesValues) {
  // x = ['shared']; {'x': x, 'y': x}, protocol 4: 'y' is a BINGET of the same list
  const std::string b =
      unhex("8004951b000000000000007d94288c0178945d948c0673686172656494618c0179946802752e");
  const PickleTree t = parse_pickle(b, "memo");
  const PickleValue* x = t.find(t.root(), "x");
  const PickleValue* y = t.find(t.root(), "y");
  ASSERT_NE(x, nullptr);
  EXPECT_EQ(x, y);
  EXPECT_EQ(t.to_text(t.root()), "{'x': ['shared'], 'y': ['shared']}");
}

void expect_error(const std::string& bytes, std::string_view needle) {
  try {
    (void)parse_pickle(bytes, "in.pickle");
    ADD_FAILURE() << "no error; expected one containing " << needle;
  } catch (const ReadError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("in.pickle"), std::string::npos) << e.what();
  }
}

TEST(Pickle, RefusesGlobalWithOffset) {
  // The protocol 2 sample with b'xy': protocol 2 pickles bytes as _codecs.encode(...), a
  // GLOBAL at offset 97 (pickletools.genops).
  std::string b = unhex(
      "80027d71002858010000006171015d7102284b014afeffffff8a060000000000018a08000000000000008"
      "08a090000000000000000014bff4dffff4affffffff65580100000062710328473ff80000000000004e8889"
      "7471045801000000637105635f636f646563730a656e636f64650a710658020000007879710758060000006c"
      "6174696e31710886710952710a580100000073710b580300000068c3a9710c752e");
  expect_error(b, "pickle offset 97: unsupported pickle opcode GLOBAL (0x63)");
  // collections.OrderedDict() at protocol 4: STACK_GLOBAL at offset 39
  b = unhex("80049522000000000000008c0b636f6c6c656374696f6e73948c0b4f72646572656444696374949"
            "3942952942e");
  expect_error(b, "pickle offset 39: unsupported pickle opcode STACK_GLOBAL (0x93)");
}

TEST(Pickle, Malformed) {
  expect_error("", "input ended before STOP");
  expect_error(unhex("8004"), "input ended before STOP");
  expect_error(unhex("8006"), "unsupported pickle protocol 6");
  expect_error(unhex("80045d"), "input ended before STOP");               // EMPTY_LIST, no STOP
  expect_error(unhex("80048c05616263"), "opcode needs 5 more bytes, 3 left");  // short string
  expect_error(unhex("8004680a"), "memo index 10 read before it was written");
  expect_error(unhex("800461"), "stack underflow");                       // APPEND on nothing
  expect_error(unhex("80044b014b0261"), "APPEND on a int");               // APPEND to an int
  expect_error(unhex("80044b014b022e"), "STOP with 2 values");
  expect_error(unhex("800465"), "no MARK");
  expect_error(unhex("8004ff"), "unknown pickle opcode 0xff");
  expect_error(unhex("80047dff"), "pickle offset 3");
  // LONG_BINPUT with a huge memo index: refused, not allocated
  expect_error(unhex("80044b0172ffffff7f2e"), "memo index 2147483647 out of range");
}

TEST(Pickle, DeepNestingIsIterative) {
  // 200,000 nested lists: "]" then APPEND repeatedly would need a deep recursion in a
  // recursive parser; here it is a loop, and to_text is depth-bounded.
  std::string b = "\x80\x04";
  const int n = 200000;
  b += "]";
  for (int i = 1; i < n; ++i) b += "(]";
  for (int i = 1; i < n; ++i) b += "e";
  b += ".";
  // Each "(]" pushes a mark and a list; each "e" appends the innermost list to its outer one.
  const PickleTree t = parse_pickle(b, "deep");
  EXPECT_EQ(t.size(), static_cast<std::size_t>(n));
  EXPECT_EQ(t.to_text(t.root(), 3), "[[[[...]]]]");
}

}  // namespace
}  // namespace cachet::io

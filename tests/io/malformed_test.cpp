// Malformed input: every truncation and bit flip of real files must give ReadError or a valid
// parse; never a crash, another exception type, or unbounded memory. Run under ASan+UBSan too.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>

#include "cachet/io/file.h"
#include "cachet/io/trace_reader.h"
#include "cachet/io/trace_stats.h"

namespace cachet::io {
namespace {

const std::string kData = std::string(CACHET_TEST_DATA) + "/oracle/";

std::string raw_bytes(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  std::string s;
  char buf[65536];
  std::size_t n;
  while (f && (n = std::fread(buf, 1, sizeof buf, f)) > 0) s.append(buf, n);
  if (f) std::fclose(f);
  return s;
}

struct Outcome {
  std::size_t ok = 0, errors = 0;
};

// Parses `bytes`; only ReadError may escape parse_trace, and its message names the input.
void probe(std::string_view bytes, Outcome& o) {
  try {
    const TraceFile t = parse_trace(bytes, "fuzzed");
    for (const auto& d : t.devices) (void)analyze_trace(d.events);
    ++o.ok;
  } catch (const ReadError& e) {
    ++o.errors;
    ASSERT_EQ(std::string(e.what()).rfind("fuzzed: ", 0), 0u) << e.what();
  }
}

// Truncations: every offset in the first 256 bytes and the last 64, and 400 spread between.
Outcome truncations(const std::string& bytes) {
  Outcome o;
  const std::size_t n = bytes.size();
  auto cut = [&](std::size_t len) { probe(std::string_view(bytes).substr(0, len), o); };
  for (std::size_t len = 0; len < std::min<std::size_t>(n, 256); ++len) cut(len);
  for (std::size_t k = 1; k <= 400; ++k) cut(n * k / 401);
  for (std::size_t len = n > 64 ? n - 64 : 0; len < n; ++len) cut(len);
  return o;
}

// `count` single-bit flips and `count` random byte overwrites at seeded-random offsets.
Outcome flips(const std::string& bytes, int count, std::uint32_t seed) {
  Outcome o;
  std::mt19937 rng(seed);
  std::uniform_int_distribution<std::size_t> at(0, bytes.size() - 1);
  std::string b = bytes;
  for (int i = 0; i < count; ++i) {
    const std::size_t p = at(rng);
    const char saved = b[p];
    b[p] = static_cast<char>(b[p] ^ (1 << (rng() % 8)));
    probe(b, o);
    b[p] = static_cast<char>(rng());
    probe(b, o);
    b[p] = saved;
  }
  return o;
}

struct Input {
  const char* path;
  bool gunzip_first;
};

class Malformed : public ::testing::TestWithParam<Input> {};

TEST_P(Malformed, TruncationsAndBitFlips) {
  std::string bytes = raw_bytes(kData + GetParam().path);
  ASSERT_GT(bytes.size(), 1000u);
  if (GetParam().gunzip_first) bytes = gunzip(bytes, GetParam().path);
  const Outcome whole = [&] {
    Outcome o;
    probe(bytes, o);
    return o;
  }();
  EXPECT_EQ(whole.ok, 1u);  // the file itself parses
  const Outcome t = truncations(bytes);
  // Every strict prefix of a pickle, gzip stream or JSON object is an error, except a JSON
  // prefix ending inside trailing whitespace (none here: the files end with '}').
  EXPECT_EQ(t.ok, 0u);
  EXPECT_GT(t.errors, 700u);
  const Outcome f = flips(bytes, 300, 7);
  EXPECT_EQ(f.ok + f.errors, 600u);
  std::printf("%s%s: %zu truncations all rejected; flips: %zu parsed, %zu rejected\n",
              GetParam().path, GetParam().gunzip_first ? " (gunzipped)" : "", t.errors, f.ok,
              f.errors);
}

INSTANTIATE_TEST_SUITE_P(
    Oracle, Malformed,
    ::testing::Values(Input{"snapshots/mlp_train.pickle.gz", true},
                      Input{"snapshots/mlp_train.pickle.gz", false},
                      Input{"workloads/resnet50_train.trace.json.gz", true},
                      Input{"workloads/resnet50_train.trace.json.gz", false},
                      Input{"results/res_pressure_default.json.gz", true},
                      Input{"results/res_small_expandable.json.gz", false}));

TEST(Malformed, AbsurdContainerAndLengthClaims) {
  // A BINUNICODE8 claiming 2^62 bytes, a FRAME claiming 2^63: refused without allocating.
  std::string p = std::string("\x80\x04\x8d", 3) + std::string("\x00\x00\x00\x00\x00\x00\x00\x40", 8);
  EXPECT_THROW((void)parse_trace(p, "big"), ReadError);
  p = std::string("\x80\x04\x95", 3) + std::string("\x00\x00\x00\x00\x00\x00\x00\x80", 8);
  EXPECT_THROW((void)parse_trace(p, "frame"), ReadError);
  // JSON nesting far beyond any snapshot: simdjson's depth limit answers, no stack overflow.
  std::string deep = "{\"segments\": " + std::string(100000, '[') + std::string(100000, ']') + "}";
  EXPECT_THROW((void)parse_trace(deep, "deep"), ReadError);
  // A pickle whose root is a dict but not a snapshot.
  EXPECT_THROW((void)parse_trace(std::string("\x80\x04}.", 4), "empty"), ReadError);
}

}  // namespace
}  // namespace cachet::io

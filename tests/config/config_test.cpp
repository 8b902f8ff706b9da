// config_test: parse_config, to_string and config_from_environment against what PyTorch 2.11
// did. Sources of the expected values:
//   tests/data/oracle/bad_configs.json   26 strings given to PyTorch 2.11 and its verdict;
//   docs/pytorch-allocator.md §4.2       the validation table (probed on 2.11);
//   docs/pytorch-allocator.md §1.5       roundup_power2_divisions syntax and its probe table;
//   probe env_*.json (§4.1)              which variable wins and the max_split_size it gave.
// § numbers refer to docs/pytorch-allocator.md; the probe files are in
// tests/data/probe/probe-torch-2.11-h200.tar.gz.
#include <gtest/gtest.h>

#include <cstdlib>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "cachet/config.h"
#include "cachet/errors.h"
#include "cachet/io/file.h"
#include "cachet/model/sizes.h"

namespace {

using cachet::Config;
using cachet::ConfigError;
using cachet::ConfigSource;
using cachet::MiB;
using cachet::parse_config;
using Divisions = std::array<std::uint32_t, 16>;

Config parse_ok(const std::string& s, ConfigSource src = ConfigSource::PyTorch) {
  try {
    return parse_config(s, src).config;
  } catch (const ConfigError& e) {
    ADD_FAILURE() << "'" << s << "' rejected: " << e.what();
    return Config{};
  }
}

// The error cachet gives for `s`; fails the test when `s` is accepted.
std::optional<ConfigError> parse_error(const std::string& s,
                                       ConfigSource src = ConfigSource::PyTorch) {
  try {
    const auto r = parse_config(s, src);
    ADD_FAILURE() << "'" << s << "' accepted as '" << cachet::to_string(r.config) << "'";
  } catch (const ConfigError& e) {
    return e;
  }
  return std::nullopt;
}

bool contains(const std::string& hay, const std::string& needle) {
  return hay.find(needle) != std::string::npos;
}

// ---------------------------------------------------------------------------------------------
// bad_configs.json: all 26 cases

struct Verdict {
  bool accept = false;
  // accepted: the resulting configuration must satisfy this
  std::function<void(const Config&)> check;
  // rejected: the key named, the 1-based column, and words the message must contain
  std::string key;
  std::size_t column = 0;
  std::vector<std::string> words;
};

Verdict ok(std::function<void(const Config&)> f) { return {true, std::move(f), "", 0, {}}; }
Verdict err(std::string key, std::size_t column, std::vector<std::string> words) {
  return {false, nullptr, std::move(key), column, std::move(words)};
}

const std::map<std::string, Verdict>& verdicts() {
  static const std::map<std::string, Verdict> v = {
      // PyTorch: "Unrecognized key '5'" after stoull read "128" (tutorial string, aborts import).
      {"max_split_size_mb:128;garbage_interval:5",
       err("max_split_size_mb", 22, {"not ';'", "garbage_interval", "garbage_collection_threshold"})},
      {"garbage_interval:5", err("garbage_interval", 1, {"garbage_collection_threshold"})},
      {"max_split_size_mb:10", err("max_split_size_mb", 19, {"must be >= 20"})},
      // PyTorch accepts -1 by accident (stoull wraps): cachet rejects it.
      {"max_split_size_mb:-1", err("max_split_size_mb", 19, {"negative"})},
      {"max_split_size_mb:abc", err("max_split_size_mb", 19, {"'abc'", "whole number"})},
      // PyTorch: internal assert "Index out of bounds in ConfigTokenizer".
      {"max_split_size_mb", err("max_split_size_mb", 18, {"expected ':'"})},
      {"max_split_size_mb:", err("max_split_size_mb", 18, {"empty"})},
      {"garbage_collection_threshold:1.5", err("garbage_collection_threshold", 30, {"between 0 and 1"})},
      {"garbage_collection_threshold:0", err("garbage_collection_threshold", 30, {"between 0 and 1"})},
      {"garbage_collection_threshold:1", err("garbage_collection_threshold", 30, {"between 0 and 1"})},
      {"roundup_power2_divisions:3", err("roundup_power2_divisions", 26, {"power of two"})},
      {"roundup_power2_divisions:[256:3]",
       err("roundup_power2_divisions", 31, {"power of two, or 0"})},
      {"roundup_power2_divisions:[>:8", err("roundup_power2_divisions", 26, {"never closed", "]"})},
      {"roundup_power2_divisions:[100:2,>:4]",
       err("roundup_power2_divisions", 27, {"'100'", "powers of two"})},
      {"roundup_power2_divisions:128", ok([](const Config& c) {
         Divisions want;
         want.fill(128);
         EXPECT_EQ(c.roundup_power2_divisions, want);
       })},
      {"expandable_segments:yes", err("expandable_segments", 21, {"True or False", "'yes'"})},
      {"expandable_segments:1", err("expandable_segments", 21, {"did you mean True?"})},
      {"backend:foo", err("backend", 9, {"'foo'", "native or cudaMallocAsync"})},
      {"max_split_size_mb:128,,garbage_collection_threshold:0.5", err("", 23, {"empty option"})},
      {" max_split_size_mb : 128 ",
       ok([](const Config& c) { EXPECT_EQ(c.max_split_size, 134217728u); })},
      {"MAX_SPLIT_SIZE_MB:128", err("MAX_SPLIT_SIZE_MB", 1, {"lower case", "'max_split_size_mb'"})},
      // PyTorch: IndexError "stoull" (out of range).
      {"max_split_size_mb:99999999999999999999", err("max_split_size_mb", 19, {"too large"})},
      {"max_split_size_mb:20", ok([](const Config& c) { EXPECT_EQ(c.max_split_size, 20971520u); })},
      {"max_split_size_mb:21", ok([](const Config& c) { EXPECT_EQ(c.max_split_size, 22020096u); })},
      {"max_split_size_mb:128,max_split_size_mb:256",
       ok([](const Config& c) { EXPECT_EQ(c.max_split_size, 268435456u); })},
      {"", ok([](const Config& c) { EXPECT_EQ(c, Config{}); })},
  };
  return v;
}

TEST(BadConfigs, AllTwentySixCases) {
  const auto cases =
      nlohmann::json::parse(cachet::io::read_file(CACHET_TEST_DATA "/oracle/bad_configs.json"));
  ASSERT_EQ(cases.size(), 26u);
  std::size_t pytorch_ok = 0;
  for (const auto& c : cases) {
    const std::string s = c.at(0).get<std::string>();
    const std::string pytorch = c.at(1).get<std::string>();
    SCOPED_TRACE("'" + s + "' (PyTorch: " + pytorch + ")");
    const auto it = verdicts().find(s);
    ASSERT_NE(it, verdicts().end()) << "no verdict for this case";
    const Verdict& v = it->second;
    if (pytorch == "ok") ++pytorch_ok;
    // cachet accepts exactly what PyTorch accepts, except the accidental -1.
    EXPECT_EQ(v.accept, pytorch == "ok" && s != "max_split_size_mb:-1");
    if (v.accept) {
      v.check(parse_ok(s));
      continue;
    }
    const auto e = parse_error(s);
    if (!e) continue;
    EXPECT_EQ(e->key(), v.key);
    EXPECT_EQ(e->column(), v.column);
    for (const auto& w : v.words) EXPECT_TRUE(contains(e->what(), w)) << e->what() << "\nlacks: " << w;
    if (!v.key.empty()) {
      EXPECT_TRUE(contains(e->what(), v.key)) << e->what();
    }
    EXPECT_TRUE(contains(e->what(), "column")) << e->what();
  }
  EXPECT_EQ(pytorch_ok, 7u);
  EXPECT_EQ(verdicts().size(), 26u);
}

// ---------------------------------------------------------------------------------------------
// §4.2: the validation table

TEST(ValidationTable, RejectedLikePyTorch) {
  struct Row {
    std::string input;
    std::string key;
    std::string words;
  };
  const Row rows[] = {
      {"foo:1", "foo", "no option"},
      {"foo:1,bar:2", "foo", "no option"},
      {",", "", "empty option"},
      {"max_split_size_mb:2", "max_split_size_mb", "must be >= 20"},
      {"max_split_size_mb:19", "max_split_size_mb", "must be >= 20"},
      {"pinned_num_register_threads:none", "pinned_num_register_threads", "whole number"},
      {"garbage_collection_threshold:1.2", "garbage_collection_threshold", "between 0 and 1"},
      {"roundup_power2_divisions:0", "roundup_power2_divisions", "power of two"},
      {"roundup_power2_divisions:[300:2]", "roundup_power2_divisions", "powers of two"},
      {"expandable_segments:true", "expandable_segments", "did you mean True?"},
      {"release_lock_on_cudamalloc:none", "release_lock_on_cudamalloc", "True or False"},
      {"pinned_use_cuda_host_register:none", "pinned_use_cuda_host_register", "True or False"},
      {"pinned_num_register_threads:3", "pinned_num_register_threads", "power of two"},
      {"pinned_num_register_threads:1024", "pinned_num_register_threads", "at most 128"},
      {"pinned_reserve_segment_size_mb:0", "pinned_reserve_segment_size_mb", "greater than 0"},
      {"per_process_memory_fraction:1.5", "per_process_memory_fraction", "from 0 to 1"},
      {"max_non_split_rounding_mb:10", "max_non_split_rounding_mb", "must be >= 20"},
      {"large_segment_size_mb:10", "large_segment_size_mb", "> 10"},
      {"backend:foo", "backend", "unknown allocator backend"},
      {"max_split_size_mb=40", "max_split_size_mb", "key:value, not key=value"},
      {"max_split_size_mb:40;expandable_segments:True", "max_split_size_mb", "not ';'"},
      {"max_split_size_mb:128;garbage_collection_threshold:0.5", "max_split_size_mb", "not ';'"},
      // keys 2.11 does not know (only newer main has them)
      {"throw_on_cudamalloc_oom:True", "throw_on_cudamalloc_oom", "after 2.11"},
      {"pinned_free_catch_all:True", "pinned_free_catch_all", "after 2.11"},
  };
  for (const Row& r : rows) {
    SCOPED_TRACE(r.input);
    const auto e = parse_error(r.input);
    if (!e) continue;
    EXPECT_EQ(e->key(), r.key);
    EXPECT_TRUE(contains(e->what(), r.words)) << e->what();
  }
}

TEST(ValidationTable, AcceptedLikePyTorch) {
  EXPECT_EQ(parse_ok(""), Config{});
  EXPECT_EQ(parse_ok("max_split_size_mb:40,").max_split_size, 41943040u);
  EXPECT_EQ(parse_ok(" max_split_size_mb : 40 ").max_split_size, 41943040u);
  EXPECT_EQ(parse_ok("max_split_size_mb:20").max_split_size, 20971520u);
  EXPECT_EQ(parse_ok("roundup_power2_divisions:[256:0]").roundup_power2_divisions, Divisions{});
  // whitespace is dropped anywhere, even inside a key (c10's ConfigTokenizer)
  EXPECT_EQ(parse_ok("max_split _size_mb:4 0").max_split_size, 41943040u);
}

TEST(Keys, EveryKeyWithPyTorchsMeaning) {
  const Config c = parse_ok(
      "max_split_size_mb:64,max_non_split_rounding_mb:30,large_segment_size_mb:24,"
      "garbage_collection_threshold:0.6,expandable_segments:True,"
      "pinned_use_background_threads:True,backend:native,release_lock_on_cudamalloc:True,"
      "pinned_use_cuda_host_register:True,pinned_num_register_threads:8,"
      "pinned_reserve_segment_size_mb:1024,graph_capture_record_stream_reuse:True,"
      "per_process_memory_fraction:0.5");
  EXPECT_EQ(c.max_split_size, 67108864u);
  EXPECT_EQ(c.max_non_split_rounding, 31457280u);
  EXPECT_EQ(c.large_segment_size, 25165824u);
  EXPECT_EQ(c.garbage_collection_threshold, 0.6);
  EXPECT_TRUE(c.expandable_segments);
  EXPECT_TRUE(c.pinned_use_background_threads);
  EXPECT_EQ(c.backend, cachet::Backend::Native);
  EXPECT_TRUE(c.release_lock_on_cudamalloc);
  EXPECT_TRUE(c.pinned_use_cuda_host_register);
  EXPECT_EQ(c.pinned_num_register_threads, 8u);
  EXPECT_EQ(c.pinned_reserve_segment_size_mb, 1024u);
  EXPECT_TRUE(c.graph_capture_record_stream_reuse);
  EXPECT_EQ(c.per_process_memory_fraction, 0.5);
  // HIP aliases
  EXPECT_TRUE(parse_ok("release_lock_on_hipmalloc:True").release_lock_on_cudamalloc);
  EXPECT_TRUE(parse_ok("pinned_use_hip_host_register:True").pinned_use_cuda_host_register);
  EXPECT_EQ(parse_ok("backend:cudaMallocAsync").backend, cachet::Backend::CudaMallocAsync);
  EXPECT_EQ(parse_ok("pinned_num_register_threads:128").pinned_num_register_threads, 128u);
  EXPECT_EQ(parse_ok("per_process_memory_fraction:0").per_process_memory_fraction, 0.0);
  EXPECT_EQ(parse_ok("per_process_memory_fraction:1").per_process_memory_fraction, 1.0);
}

TEST(Keys, LargeSegmentSizePrePass) {
  // env_large_seg probe: large_segment_size_mb:40 -> a 1 MiB+1 request reserves 41,943,040.
  const Config c = parse_ok("large_segment_size_mb:40");
  EXPECT_EQ(c.large_segment_size, 41943040u);
  EXPECT_EQ(c.max_non_split_rounding, 41943040u);  // defaults to large_segment_size
  // The minimum of max_split_size_mb follows large_segment_size_mb wherever it is written.
  EXPECT_EQ(parse_error("max_split_size_mb:30,large_segment_size_mb:40")->key(), "max_split_size_mb");
  EXPECT_EQ(parse_ok("max_split_size_mb:40,large_segment_size_mb:40").max_split_size, 41943040u);
  EXPECT_EQ(parse_ok("large_segment_size_mb:11").large_segment_size, 11534336u);
}

TEST(Keys, EveryParseResetsThreeKeys) {
  // §4.1: max_split_size, roundup_power2_divisions and garbage_collection_threshold are
  // reset by every parse (probe: a later garbage_collection_threshold:0.5 resets divisions);
  // other keys keep their previous values.
  const Config base = parse_ok(
      "max_split_size_mb:128,roundup_power2_divisions:4,garbage_collection_threshold:0.7,"
      "expandable_segments:True,per_process_memory_fraction:0.5,large_segment_size_mb:32");
  const Config c = parse_config("garbage_collection_threshold:0.5", ConfigSource::PyTorch, base).config;
  EXPECT_EQ(c.max_split_size, cachet::kNoMaxSplit);
  EXPECT_EQ(c.roundup_power2_divisions, Divisions{});
  EXPECT_EQ(c.garbage_collection_threshold, 0.5);
  EXPECT_TRUE(c.expandable_segments);
  EXPECT_EQ(c.per_process_memory_fraction, 0.5);
  EXPECT_EQ(c.large_segment_size, 33554432u);
  const Config d = parse_config("expandable_segments:False", ConfigSource::PyTorch, base).config;
  EXPECT_EQ(d.garbage_collection_threshold, 0.0);
  EXPECT_EQ(d.max_split_size, cachet::kNoMaxSplit);
  EXPECT_EQ(d.roundup_power2_divisions, Divisions{});
  EXPECT_FALSE(d.expandable_segments);
  EXPECT_EQ(d.per_process_memory_fraction, 0.5);
}

TEST(Keys, CachetKeysOnlyFromCachetAllocConf) {
  const Config c = parse_ok("policy:cachet,cachet_validate:True", ConfigSource::Cachet);
  EXPECT_EQ(c.policy, cachet::Policy::Cachet);
  EXPECT_TRUE(c.validate);
  EXPECT_EQ(parse_ok("policy:pytorch", ConfigSource::Cachet).policy, cachet::Policy::PyTorch);
  for (const std::string s : {"policy:cachet", "cachet_validate:True"}) {
    const auto e = parse_error(s, ConfigSource::PyTorch);
    ASSERT_TRUE(e);
    EXPECT_TRUE(contains(e->what(), "PyTorch would reject")) << e->what();
    EXPECT_TRUE(contains(e->what(), "CACHET_ALLOC_CONF")) << e->what();
  }
  EXPECT_EQ(parse_error("policy:fast", ConfigSource::Cachet)->key(), "policy");
}

TEST(Errors, StricterThanPyTorch) {
  // Overflow of the MiB -> bytes product: 2^44 MiB is 2^64 bytes.
  EXPECT_TRUE(contains(parse_error("max_split_size_mb:17592186044416")->what(), "too large"));
  EXPECT_EQ(parse_ok("max_split_size_mb:17592186044415").max_split_size, 17592186044415u * MiB);
  // Trailing text after a number ("40abc"): stoull would read 40.
  const auto e = parse_error("max_split_size_mb:40abc");
  EXPECT_EQ(e->column(), 21u);
  EXPECT_EQ(e->text(), "40abc");
  EXPECT_TRUE(contains(parse_error("garbage_collection_threshold:0.5x")->what(), "'x'"));
  // Brackets where no list is allowed, and a stray ']'.
  EXPECT_EQ(parse_error("max_split_size_mb:[128]")->key(), "max_split_size_mb");
  EXPECT_EQ(parse_error("max_split_size_mb:128]")->column(), 22u);
  // A key without value in the middle, ':' without key.
  EXPECT_EQ(parse_error("max_split_size_mb:,expandable_segments:True")->column(), 18u);
  EXPECT_EQ(parse_error(":5")->column(), 1u);
  // cachet never aborts on malformed lists.
  for (const std::string s : {"roundup_power2_divisions:[", "roundup_power2_divisions:[1",
                              "roundup_power2_divisions:[1:", "roundup_power2_divisions:[1:2",
                              "roundup_power2_divisions:[1:2,", "roundup_power2_divisions:[:2]",
                              "roundup_power2_divisions:[1:2:3]", "roundup_power2_divisions:[[1:2]]",
                              "roundup_power2_divisions:[0:2]", "roundup_power2_divisions:[>:3]"}) {
    SCOPED_TRACE(s);
    const auto err = parse_error(s);
    ASSERT_TRUE(err);
    EXPECT_EQ(err->key(), "roundup_power2_divisions");
    EXPECT_GE(err->column(), 25u);
  }
}

TEST(Errors, NeverAbortsOnRandomInput) {
  // Random strings over the tokenizer's alphabet and pieces of real keys: every outcome is a
  // Config or a ConfigError with a column inside the string (or just past its end).
  const std::string pieces[] = {"max_split_size_mb", "roundup_power2_divisions", "expandable_segments",
                                "garbage_collection_threshold", "large_segment_size_mb", "backend",
                                "True", "128", "0.5", "-1", ">", ":", ",", "[", "]", ";", " ", "=",
                                "4", "1e400", "cudaMallocAsync", "per_process_memory_fraction"};
  std::mt19937_64 rng(7);
  std::size_t accepted = 0;
  for (int iter = 0; iter < 20000; ++iter) {
    std::string s;
    const auto n = rng() % 8;
    for (std::uint64_t k = 0; k < n; ++k) s += pieces[rng() % std::size(pieces)];
    try {
      const Config c = parse_config(s, ConfigSource::Cachet).config;
      EXPECT_EQ(parse_config(cachet::to_string(c), ConfigSource::Cachet).config, c) << s;
      ++accepted;
    } catch (const ConfigError& e) {
      EXPECT_LE(e.column(), s.size() + 1) << s;
      EXPECT_GE(e.column(), 1u) << s;
    }
  }
  EXPECT_GT(accepted, 0u);
}

// ---------------------------------------------------------------------------------------------
// §1.5: roundup_power2_divisions, index i covers [2^i MiB, 2^(i+1) MiB)

TEST(Roundup, DivisionsPerConfig) {
  auto filled = [](std::uint32_t v) {
    Divisions d;
    d.fill(v);
    return d;
  };
  EXPECT_EQ(parse_ok("roundup_power2_divisions:4").roundup_power2_divisions, filled(4));
  EXPECT_EQ(parse_ok("roundup_power2_divisions:8").roundup_power2_divisions, filled(8));
  EXPECT_EQ(parse_ok("roundup_power2_divisions:1").roundup_power2_divisions, filled(1));
  // [256:1,512:2,>:8]: 600 MiB+7 -> 768 MiB (index 9 = 2), 300 MiB+7 unrounded (index 8 = 1).
  EXPECT_EQ(parse_ok("roundup_power2_divisions:[256:1,512:2,>:8]").roundup_power2_divisions,
            (Divisions{1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 8, 8, 8, 8, 8, 8}));
  // the rdivlist recordings
  EXPECT_EQ(parse_ok("roundup_power2_divisions:[256:1,512:2,1024:4,>:8]").roundup_power2_divisions,
            (Divisions{1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 4, 8, 8, 8, 8, 8}));
  // 84 MiB -> 88 MiB (index 6 = 8), 300 MiB+7 -> 384 MiB (index 8 = 2).
  EXPECT_EQ(parse_ok("roundup_power2_divisions:[64:8,128:2,256:2,512:2,1024:1,>:1]")
                .roundup_power2_divisions,
            (Divisions{8, 8, 8, 8, 8, 8, 8, 2, 2, 2, 1, 1, 1, 1, 1, 1}));
  // [2:16]: 5 MiB+1 is not rounded (index 2 = 0).
  EXPECT_EQ(parse_ok("roundup_power2_divisions:[2:16]").roundup_power2_divisions,
            (Divisions{16, 16, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}));
  // 2.11 leaves gaps at 0: [1:4,16:8] does not round 3 MiB+1 (index 1).
  const auto r = parse_config("roundup_power2_divisions:[1:4,16:8]", ConfigSource::PyTorch);
  EXPECT_EQ(r.config.roundup_power2_divisions,
            (Divisions{4, 0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}));
  ASSERT_EQ(r.warnings.size(), 1u);
  EXPECT_TRUE(contains(r.warnings[0].message, "[2 MiB, 16 MiB)")) << r.warnings[0].message;
  // Boundaries beyond 32 GiB clamp to the last interval.
  EXPECT_EQ(parse_ok("roundup_power2_divisions:[65536:4]").roundup_power2_divisions, filled(4));
}

// ---------------------------------------------------------------------------------------------
// The list form in any order. PyTorch 2.11, c10/core/AllocatorConfig.cpp,
// AcceleratorAllocatorConfig::parseRoundUpPower2Divisions applies the entries in the order
// written to a table of 16 zeros: `b:v` sets index log2(b) (clamped to 15) and remembers it as
// last_index; the first `b:v` (even after a '>') also fills every index below its own; `>:v`
// fills last_index + 1 .. 15 (last_index starts at 0) and changes neither. The lookup,
// AcceleratorAllocatorConfig::roundup_power2_divisions(size), takes index = log2(size) - 20
// (0 below 2 MiB), at most 15. Every table below is worked out by hand from that loop.

TEST(Roundup, ListAppliedInOrderLikePyTorch) {
  auto table = [](const std::string& list) {
    return parse_ok("roundup_power2_divisions:" + list).roundup_power2_divisions;
  };
  // ascending, '>' last: 32 fills 0..5 with 4; 64 sets 6; '>' fills 7..15
  EXPECT_EQ(table("[32:4,64:8,>:2]"), (Divisions{4, 4, 4, 4, 4, 4, 8, 2, 2, 2, 2, 2, 2, 2, 2, 2}));
  // '>' last after a gap: index 7 stays 0; '>' starts after 256 (index 8)
  EXPECT_EQ(table("[64:8,256:1,>:4]"), (Divisions{8, 8, 8, 8, 8, 8, 8, 0, 1, 4, 4, 4, 4, 4, 4, 4}));
  // backwards, then '>': 256 fills 0..8 with 1; 128 sets 7 and last_index = 7; '>' fills 8..15,
  // so 256:1 is overwritten (300 MiB rounds in 4 divisions)
  EXPECT_EQ(table("[256:1,128:2,>:4]"), (Divisions{1, 1, 1, 1, 1, 1, 1, 2, 4, 4, 4, 4, 4, 4, 4, 4}));
  // the same three entries, '>' first: '>' fills 1..15 with 4 (index 0 untouched); 128 is still
  // the first size, so it fills 0..6 with 2 and sets 7; 256 sets 8
  EXPECT_EQ(table("[>:4,128:2,256:1]"), (Divisions{2, 2, 2, 2, 2, 2, 2, 2, 1, 4, 4, 4, 4, 4, 4, 4}));
  // '>' in the middle: 64 fills 0..6 with 8; '>' fills 7..15 with 4; 256 then sets 8
  EXPECT_EQ(table("[64:8,>:4,256:1]"), (Divisions{8, 8, 8, 8, 8, 8, 8, 4, 1, 4, 4, 4, 4, 4, 4, 4}));
  // descending without '>': 64 fills 0..6 with 8; 32 sets 5 only; nothing above 64
  EXPECT_EQ(table("[64:8,32:4]"), (Divisions{8, 8, 8, 8, 8, 4, 8, 0, 0, 0, 0, 0, 0, 0, 0, 0}));
  // backwards then '>': '>' starts after 256 (index 8) and overwrites 1024:4 at index 10
  EXPECT_EQ(table("[1024:4,256:2,>:8]"), (Divisions{4, 4, 4, 4, 4, 4, 4, 4, 2, 8, 8, 8, 8, 8, 8, 8}));
  // '>' alone or first: index 0 (sizes below 2 MiB) is left at 0 unless a size entry follows
  EXPECT_EQ(table("[>:4]"), (Divisions{0, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4}));
  EXPECT_EQ(table("[>:4,1:2]"), (Divisions{2, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4}));
  // repeats: the last one written wins at its index; the first size's fill stays below it
  EXPECT_EQ(table("[64:8,64:2]"), (Divisions{8, 8, 8, 8, 8, 8, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0}));
  EXPECT_EQ(table("[>:4,>:2]"), (Divisions{0, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2}));
  EXPECT_EQ(table("[128:2,64:8,128:4]"), (Divisions{2, 2, 2, 2, 2, 2, 8, 4, 0, 0, 0, 0, 0, 0, 0, 0}));
  // two sizes that clamp to the same index (15): the second wins there
  EXPECT_EQ(table("[32768:2,65536:4]"), (Divisions{2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 4}));
}

TEST(Roundup, OutOfOrderListRoundsLikePyTorch) {
  // Request size -> the size PyTorch 2.11 rounds it to (c10/cuda/CUDACachingAllocator.cpp,
  // round_size / roundup_power2_next_division), under the tables above; worked out by hand.
  auto rounded = [](const std::string& list, cachet::Bytes size) {
    return cachet::model::round_size(parse_ok("roundup_power2_divisions:" + list), size);
  };
  constexpr cachet::Bytes M = MiB;
  // [256:1,128:2,>:4]: index 8 has 4 divisions (not the 1 written for 256)
  EXPECT_EQ(rounded("[256:1,128:2,>:4]", 300 * M + 7), 320 * M);  // 64 MiB steps
  EXPECT_EQ(rounded("[256:1,128:2,>:4]", 200 * M + 1), 256 * M);  // index 7: 2 divisions
  EXPECT_EQ(rounded("[256:1,128:2,>:4]", 100 * M + 3), 104'858'112u);  // index 6: 1, 512 B
  // [>:4,128:2,256:1]: everything below 256 MiB in 2 divisions, index 0 included
  EXPECT_EQ(rounded("[>:4,128:2,256:1]", 100'000), 131'072u);  // 64 KiB floor, 32 KiB steps
  EXPECT_EQ(rounded("[>:4,128:2,256:1]", M + 1), M + M / 2);
  EXPECT_EQ(rounded("[>:4,128:2,256:1]", 3 * M + 1), 4 * M);  // not 3.5 MiB (4 divisions)
  EXPECT_EQ(rounded("[>:4,128:2,256:1]", 300 * M + 7), 314'573'312u);  // index 8: 1
  EXPECT_EQ(rounded("[>:4,128:2,256:1]", 600 * M + 7), 640 * M);  // index 9: 4
  // [64:8,32:4]
  EXPECT_EQ(rounded("[64:8,32:4]", 40 * M + 1), 48 * M);  // index 5: 4 divisions of 32 MiB
  EXPECT_EQ(rounded("[64:8,32:4]", 84 * M), 88 * M);  // index 6: 8 divisions of 64 MiB
  EXPECT_EQ(rounded("[64:8,32:4]", 200 * M + 1), 209'715'712u);  // index 7: 0, 512 B
}

TEST(Roundup, OutOfOrderListWarnsAndPrintsItsTable) {
  const auto r = parse_config("roundup_power2_divisions:[256:1,128:2,>:4]", ConfigSource::PyTorch);
  ASSERT_EQ(r.warnings.size(), 1u);
  const std::string& w = r.warnings[0].message;
  EXPECT_TRUE(contains(w, "not in ascending order")) << w;
  EXPECT_TRUE(contains(w, "'256:1' is overwritten")) << w;
  EXPECT_TRUE(contains(w, "[64:1,128:2,>:4]")) << w;
  EXPECT_EQ(r.warnings[0].column, 33u);  // the '128' of 128:2 (25 + "[256:1," = 32)
  EXPECT_EQ(cachet::to_string(r.config), "roundup_power2_divisions:[64:1,128:2,>:4]");
  // '>' first, then sizes: nothing is lost, but the table is not what the order suggests
  const auto w2 = parse_config("roundup_power2_divisions:[>:4,128:2,256:1]", ConfigSource::PyTorch);
  ASSERT_EQ(w2.warnings.size(), 1u);
  EXPECT_TRUE(contains(w2.warnings[0].message, "[128:2,256:1,>:4]")) << w2.warnings[0].message;
  // The canonical form of any of them is ascending with '>' last: it parses without a warning.
  for (const std::string s : {"[256:1,128:2,>:4]", "[>:4,128:2,256:1]", "[64:8,32:4]",
                              "[64:8,>:4,256:1]", "[1024:4,256:2,>:8]", "[128:2,64:8,128:4]"}) {
    SCOPED_TRACE(s);
    const std::string canon = cachet::to_string(parse_ok("roundup_power2_divisions:" + s));
    EXPECT_TRUE(parse_config(canon, ConfigSource::PyTorch).warnings.empty()) << canon;
  }
}

// ---------------------------------------------------------------------------------------------
// Warnings

std::vector<std::string> warnings_of(const std::string& s) {
  std::vector<std::string> out;
  for (const auto& w : parse_config(s, ConfigSource::PyTorch).warnings) out.push_back(w.message);
  return out;
}

TEST(Warnings, AcceptedButSuspicious) {
  EXPECT_TRUE(warnings_of("max_split_size_mb:128").empty());
  EXPECT_TRUE(warnings_of("roundup_power2_divisions:[256:1,512:2,1024:4,>:8]").empty());
  EXPECT_TRUE(warnings_of("garbage_collection_threshold:0.6,per_process_memory_fraction:0.8").empty());

  auto one = [](const std::string& s, const std::string& words) {
    SCOPED_TRACE(s);
    const auto w = warnings_of(s);
    ASSERT_EQ(w.size(), 1u);
    EXPECT_TRUE(contains(w[0], words)) << w[0];
  };
  one("max_split_size_mb:128,max_split_size_mb:256", "last value wins");
  one("garbage_collection_threshold:0.6", "per_process_memory_fraction");
  one("garbage_collection_threshold:0.6", "106660");
  one("max_split_size_mb:128,expandable_segments:True", "expandable_segments");
  one("backend:cudaMallocAsync,roundup_power2_divisions:4", "ignores roundup_power2_divisions");
  one("roundup_power2_divisions:1", "no effect");
  one("roundup_power2_divisions:[1:4,4:4,>:4]", "[2 MiB, 4 MiB)");
}

// ---------------------------------------------------------------------------------------------
// to_string: canonical, and parse_config(to_string(c)) == c

TEST(RoundTrip, CanonicalForms) {
  auto canon = [](const std::string& s, ConfigSource src = ConfigSource::PyTorch) {
    return cachet::to_string(parse_ok(s, src));
  };
  EXPECT_EQ(canon(""), "");
  EXPECT_EQ(canon(" max_split_size_mb : 128 ,"), "max_split_size_mb:128");
  EXPECT_EQ(canon("garbage_collection_threshold:0.6,max_split_size_mb:64"),
            "max_split_size_mb:64,garbage_collection_threshold:0.6");
  EXPECT_EQ(canon("roundup_power2_divisions:[256:1,512:2,1024:4,>:8]"),
            "roundup_power2_divisions:[256:1,512:2,1024:4,>:8]");
  EXPECT_EQ(canon("roundup_power2_divisions:[2:4,>:4]"), "roundup_power2_divisions:4");
  EXPECT_EQ(canon("expandable_segments:False"), "");
  EXPECT_EQ(canon("large_segment_size_mb:40,max_non_split_rounding_mb:40"),
            "large_segment_size_mb:40");
  EXPECT_EQ(canon("cachet_validate:True,policy:cachet", ConfigSource::Cachet),
            "policy:cachet,cachet_validate:True");
}

TEST(RoundTrip, ManyConfigs) {
  const std::string strings[] = {
      "",
      "max_split_size_mb:20",
      "max_split_size_mb:17592186044415",
      "max_split_size_mb:256,roundup_power2_divisions:4",
      "roundup_power2_divisions:[256:1,512:2,1024:4,>:8]",
      "roundup_power2_divisions:[64:8,128:2,256:2,512:2,1024:1,>:1]",
      "roundup_power2_divisions:[2:16]",
      "roundup_power2_divisions:[1:4,16:8]",
      "roundup_power2_divisions:[>:8]",
      "roundup_power2_divisions:[1:0,2:0,>:0]",
      "roundup_power2_divisions:[4:2,8:0,16:2,>:2]",
      "roundup_power2_divisions:[256:1,128:2,>:4]",
      "roundup_power2_divisions:[>:4,128:2,256:1]",
      "roundup_power2_divisions:[64:8,>:4,256:1]",
      "roundup_power2_divisions:[64:8,32:4]",
      "roundup_power2_divisions:[>:4,>:2]",
      "garbage_collection_threshold:0.1,per_process_memory_fraction:0.3333333333333333",
      "expandable_segments:True,pinned_use_background_threads:True",
      "large_segment_size_mb:64,max_non_split_rounding_mb:100,max_split_size_mb:64",
      "backend:cudaMallocAsync,release_lock_on_cudamalloc:True",
      "pinned_use_cuda_host_register:True,pinned_num_register_threads:16,"
      "pinned_reserve_segment_size_mb:4096,graph_capture_record_stream_reuse:True",
      "per_process_memory_fraction:0",
      "policy:cachet,cachet_validate:True,expandable_segments:True",
  };
  for (const std::string& s : strings) {
    SCOPED_TRACE(s);
    const Config c = parse_ok(s, ConfigSource::Cachet);
    const std::string t = cachet::to_string(c);
    EXPECT_EQ(parse_ok(t, ConfigSource::Cachet), c) << t;
    EXPECT_EQ(cachet::to_string(parse_ok(t, ConfigSource::Cachet)), t);  // canonical is a fixpoint
  }
}

TEST(RoundTrip, Randomized) {
  std::mt19937_64 rng(20261121);
  auto pick = [&](std::uint64_t n) { return std::uniform_int_distribution<std::uint64_t>(0, n - 1)(rng); };
  auto coin = [&] { return pick(2) == 1; };
  auto pow2 = [&](int max_log) { return std::uint32_t{1} << pick(static_cast<std::uint64_t>(max_log) + 1); };
  for (int iter = 0; iter < 3000; ++iter) {
    Config c;
    c.large_segment_size = coin() ? cachet::kDefaultLargeSegmentSize : (11 + pick(200)) * MiB;
    const std::uint64_t min_mb = c.large_segment_size / MiB;
    c.max_non_split_rounding = coin() ? c.large_segment_size : (min_mb + pick(1000)) * MiB;
    if (coin()) c.max_split_size = (min_mb + pick(100000)) * MiB;
    switch (pick(3)) {
      case 0: break;
      case 1: c.roundup_power2_divisions.fill(pow2(12)); break;
      default:
        for (auto& d : c.roundup_power2_divisions) d = coin() ? 0 : pow2(31);
    }
    if (coin()) c.garbage_collection_threshold = std::uniform_real_distribution<double>(0.001, 0.999)(rng);
    if (coin()) c.per_process_memory_fraction = std::uniform_real_distribution<double>(0.0, 1.0)(rng);
    c.expandable_segments = coin();
    c.pinned_use_background_threads = coin();
    c.backend = coin() ? cachet::Backend::Native : cachet::Backend::CudaMallocAsync;
    c.release_lock_on_cudamalloc = coin();
    c.pinned_use_cuda_host_register = coin();
    c.pinned_num_register_threads = pow2(7);
    c.pinned_reserve_segment_size_mb = pick(3) == 0 ? 0 : 1 + pick(1 << 20);
    c.graph_capture_record_stream_reuse = coin();
    c.policy = coin() ? cachet::Policy::PyTorch : cachet::Policy::Cachet;
    c.validate = coin();
    const std::string t = cachet::to_string(c);
    SCOPED_TRACE(t);
    ASSERT_EQ(parse_ok(t, ConfigSource::Cachet), c);
  }
}

// ---------------------------------------------------------------------------------------------
// config_from_environment (probe env_*.json)

class Environment : public ::testing::Test {
 protected:
  static constexpr const char* kVars[] = {"CACHET_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF",
                                          "PYTORCH_ALLOC_CONF", "PYTORCH_NO_CUDA_MEMORY_CACHING"};
  void SetUp() override {
    for (const char* v : kVars) unsetenv(v);
  }
  void TearDown() override {
    for (const char* v : kVars) unsetenv(v);
  }
};

TEST_F(Environment, NoneSet) {
  const auto env = cachet::config_from_environment();
  EXPECT_EQ(env.variable, "");
  EXPECT_EQ(env.parsed.config, Config{});
}

TEST_F(Environment, CudaVariableWinsOverGeneric) {
  // env_both: PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:40 and PYTORCH_ALLOC_CONF=...:60 ->
  // max_split_size 41,943,040.
  setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:40", 1);
  setenv("PYTORCH_ALLOC_CONF", "max_split_size_mb:60", 1);
  const auto env = cachet::config_from_environment();
  EXPECT_EQ(env.variable, "PYTORCH_CUDA_ALLOC_CONF");
  EXPECT_EQ(env.text, "max_split_size_mb:40");
  EXPECT_EQ(env.parsed.config.max_split_size_stat(), 41943040);
}

TEST_F(Environment, GenericAlone) {
  // env_alloc_only: max_split_size 62,914,560.
  setenv("PYTORCH_ALLOC_CONF", "max_split_size_mb:60", 1);
  const auto env = cachet::config_from_environment();
  EXPECT_EQ(env.variable, "PYTORCH_ALLOC_CONF");
  EXPECT_EQ(env.parsed.config.max_split_size_stat(), 62914560);
}

TEST_F(Environment, EmptyIsValid) {
  // env_empty: PYTORCH_CUDA_ALLOC_CONF="" -> ok, max_split_size -1.
  setenv("PYTORCH_CUDA_ALLOC_CONF", "", 1);
  const auto env = cachet::config_from_environment();
  EXPECT_EQ(env.variable, "PYTORCH_CUDA_ALLOC_CONF");
  EXPECT_EQ(env.parsed.config.max_split_size_stat(), -1);
}

TEST_F(Environment, CachetVariableFirstWithCachetKeys) {
  setenv("CACHET_ALLOC_CONF", "policy:cachet,max_split_size_mb:64", 1);
  setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:40", 1);
  const auto env = cachet::config_from_environment();
  EXPECT_EQ(env.variable, "CACHET_ALLOC_CONF");
  EXPECT_EQ(env.parsed.config.policy, cachet::Policy::Cachet);
  EXPECT_EQ(env.parsed.config.max_split_size, 67108864u);
}

TEST_F(Environment, ErrorsNameTheVariable) {
  // env_bad: PYTORCH_CUDA_ALLOC_CONF=foo:1 -> ValueError "Unrecognized key 'foo' ...".
  setenv("PYTORCH_CUDA_ALLOC_CONF", "foo:1", 1);
  try {
    cachet::config_from_environment();
    ADD_FAILURE() << "foo:1 accepted";
  } catch (const ConfigError& e) {
    EXPECT_TRUE(contains(e.what(), "PYTORCH_CUDA_ALLOC_CONF")) << e.what();
    EXPECT_EQ(e.key(), "foo");
  }
  setenv("PYTORCH_CUDA_ALLOC_CONF", "policy:cachet", 1);
  try {
    cachet::config_from_environment();
    ADD_FAILURE() << "policy:cachet accepted from PYTORCH_CUDA_ALLOC_CONF";
  } catch (const ConfigError& e) {
    EXPECT_TRUE(contains(e.what(), "move it to CACHET_ALLOC_CONF")) << e.what();
  }
}

TEST_F(Environment, NoCudaMemoryCaching) {
  setenv("PYTORCH_NO_CUDA_MEMORY_CACHING", "1", 1);
  EXPECT_TRUE(cachet::config_from_environment().parsed.config.no_caching);
  setenv("PYTORCH_NO_CUDA_MEMORY_CACHING", "0", 1);
  EXPECT_FALSE(cachet::config_from_environment().parsed.config.no_caching);
  setenv("PYTORCH_NO_CUDA_MEMORY_CACHING", "yes", 1);
  try {
    cachet::config_from_environment();
    ADD_FAILURE() << "yes accepted";
  } catch (const ConfigError& e) {
    EXPECT_TRUE(contains(e.what(), "PYTORCH_NO_CUDA_MEMORY_CACHING")) << e.what();
  }
}

}  // namespace

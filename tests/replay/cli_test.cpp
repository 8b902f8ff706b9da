// The commands: `cachet replay --json` has its fields, unreadable files exit 2 with a clear
// message, a mid-run trace is reported in one line and replayed, tune recommends, summary
// prints memory_summary twice, plot writes a well-formed SVG with its series.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "cachet/test/cli_run.h"

namespace {

namespace fs = std::filesystem;
const std::string kData = std::string(CACHET_TEST_DATA) + "/oracle/";

using namespace cachet::test;

TEST(ReplayCli, JsonHasTheFields) {
  CliRun o = run_cachet("replay " + kData + "workloads/gpt2_train.trace.json.gz --json --conf '' --conf expandable_segments:True");
  ASSERT_EQ(o.rc, 0) << o.err;
  ASSERT_EQ(o.out.front(), '[');
  for (const char* key : {"\"conf\"", "\"peak_allocated\"", "\"peak_reserved\"", "\"num_ooms\"", "\"num_alloc_retries\"",
                          "\"events\": 18685", "\"final_stats\"", "\"reserved_bytes.all.peak\"", "\"num_device_alloc\""})
    EXPECT_NE(o.out.find(key), std::string::npos) << key;
  EXPECT_NE(o.out.find("\"peak_reserved\": 15286140928"), std::string::npos);  // '' is the recorded (default) config
  EXPECT_NE(o.out.find("\"conf\": \"expandable_segments:True\""), std::string::npos);
}

TEST(ReplayCli, TableAndRecordedPeaks) {
  CliRun o = run_cachet("replay " + kData + "results/res_pressure_default.json.gz");
  ASSERT_EQ(o.rc, 0) << o.err;
  EXPECT_NE(o.out.find("peak reserved"), std::string::npos);
  EXPECT_NE(o.out.find("PyTorch recorded"), std::string::npos);
}

TEST(ReplayCli, UnreadableFilesExit2) {
  CliRun o = run_cachet("replay /nonexistent/trace.json.gz");
  EXPECT_EQ(o.rc, 2);
  EXPECT_NE(o.err.find("/nonexistent/trace.json.gz"), std::string::npos) << o.err;
  const fs::path bad = scratch_dir() / "bad.json";
  std::ofstream(bad) << "{\"segments\": [1, 2";
  o = run_cachet("replay " + bad.string());
  EXPECT_EQ(o.rc, 2);
  EXPECT_FALSE(o.err.empty());
  o = run_cachet("replay " + kData + "workloads/gpt2_train.trace.json.gz --conf 'max_split_size_mb:128;garbage_interval:5'");
  EXPECT_EQ(o.rc, 2);
  o = run_cachet("replay " + kData + "workloads/gpt2_train.trace.json.gz --device-memory lots");
  EXPECT_EQ(o.rc, 2);
}

TEST(ReplayCli, MidRunTraceIsOneLineNotFatal) {
  // The pickle snapshot's device trace, written as JSON with its first events cut off.
  const fs::path p = scratch_dir() / "midrun.json";
  {
    std::ofstream f(p);
    f << R"({"segments": [], "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": ""}, "device_traces": [[)"
      << R"({"action": "free_requested", "addr": 140000000000000, "size": 4096, "stream": 0, "time_us": 1},)"
      << R"({"action": "free_completed", "addr": 140000000000000, "size": 4096, "stream": 0, "time_us": 2},)"
      << R"({"action": "segment_alloc", "addr": 140000002097152, "size": 2097152, "stream": 0, "time_us": 3},)"
      << R"({"action": "alloc", "addr": 140000002097152, "size": 1000, "stream": 0, "time_us": 4},)"
      << R"({"action": "free_requested", "addr": 140000002097152, "size": 1000, "stream": 0, "time_us": 5},)"
      << R"({"action": "free_completed", "addr": 140000002097152, "size": 1000, "stream": 0, "time_us": 6})"
      << "]]}";
  }
  CliRun o = run_cachet("replay " + p.string());
  ASSERT_EQ(o.rc, 0) << o.err;
  // The note is one line, wrapped to 100 columns.
  for (std::size_t at; (at = o.out.find("\n  ")) != std::string::npos;) o.out.replace(at, 3, " ");
  EXPECT_NE(o.out.find("mid-run"), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("1 frees of blocks never seen allocated"), std::string::npos) << o.out;
}

TEST(ReplayCli, PickleAndRecordingReplay) {
  CliRun o = run_cachet("replay " + kData + "snapshots/mlp_train.pickle.gz --json");
  ASSERT_EQ(o.rc, 0) << o.err;
  EXPECT_NE(o.out.find("\"peak_reserved\""), std::string::npos);
  o = run_cachet("replay " + kData + "results/res_mixed_expandable.json.gz --addresses synthetic --device-memory 140GiB");
  ASSERT_EQ(o.rc, 0) << o.err;
}

// A real run with private pools (tests/data/oracle-h100/snapshots/graphed_mlp.pickle.gz): what
// the replay inferred, what it cannot know, and that it ends as PyTorch did (every figure checked
// by hand against the pickle and graphed_mlp.stats.json.gz; tests/replay/pools_test.cpp says how).
TEST(ReplayCli, PrivatePoolsOfARealRun) {
  const CliRun o = run_cachet("replay " + std::string(CACHET_TEST_DATA) + "/oracle-h100/snapshots/graphed_mlp.pickle.gz");
  ASSERT_EQ(o.rc, 0) << o.err;
  EXPECT_EQ(o.err, "");
  const std::string pools =
      "private pools: the snapshot's segments name 2 private pools; the allocations in their segments are\n"
      "  replayed into them\n"
      "  pool (0, 1): 13 allocations (trace events 119..157) on stream 661764992; at the end 8 segments,\n"
      "    246.00 MiB = 257949696 bytes reserved, 201.04 MiB = 210804736 bytes allocated; entered 2 times:\n"
      "    each as a CUDA graph capture of its stream, since the CUDA generator's graph seed and offset,\n"
      "    two 8-byte allocations in the default pool on its stream at trace events 116 and 117, come just\n"
      "    before its first allocation, as at a process's first capture\n"
      "  pool (0, 2): 3 allocations (trace events 163..166) on stream 0; at the end 2 segments, 60.00 MiB =\n"
      "    62914560 bytes reserved, 0 B allocated; entered 1 time: as use_mem_pool, though the trace cannot\n"
      "    tell it from a capture of its one stream\n"
      "note: what the trace cannot tell about private pools: (1) its entries carry no pool id; an\n"
      "  allocation's pool is its segment's, and only segments alive at the snapshot carry one: 7 segments\n"
      "  (304.00 MiB = 318767104 bytes) released before the snapshot, with 18 allocations, are taken to be\n"
      "  the default pools'; (2) when each pool was entered and left (capture_begin/capture_end,\n"
      "  use_mem_pool): taken as just before the first and just after the last allocation of each run of\n"
      "  its allocations, and never across an empty_cache() (so a pool's allocations before and after an\n"
      "  empty_cache() are two windows: 1 here); (3) use counts and releases (graph reset, MemPool\n"
      "  destroyed): every pool is taken as alive to the end; (4) graph replays, which allocate nothing\n";
  EXPECT_NE(o.out.find(pools), std::string::npos) << o.out;
  const std::string end =
      "(default)      486.08 MiB  564.00 MiB      1.160     0        0          27/7\n"
      "end state matches the snapshot's segments (reserved 564.00 MiB, allocated 406.08 MiB)\n"
      "pool (0, 1) at the end: 8 segments, 246.00 MiB = 257949696 bytes reserved, 201.04 MiB = 210804736\n"
      "  bytes allocated, as in the snapshot\n"
      "pool (0, 2) at the end: 2 segments, 60.00 MiB = 62914560 bytes reserved, 0 B allocated, as in the\n"
      "  snapshot\n"
      "final stats: all 122 memory_stats() keys equal PyTorch's recorded ones\n";
  EXPECT_NE(o.out.find(end), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("PyTorch recorded: peak allocated 486.08 MiB, peak reserved 564.00 MiB (1.160)\n"),
            std::string::npos);
  // A snapshot without private pools says nothing of them (after the first line, which names the
  // file: a checkout's path may contain "pool").
  const CliRun plain = run_cachet("replay " + kData + "snapshots/mlp_train.pickle.gz");
  ASSERT_EQ(plain.rc, 0) << plain.err;
  EXPECT_EQ(plain.out.find("pool", plain.out.find('\n')), std::string::npos) << plain.out;
}

TEST(ReplayCli, TuneRecommends) {
  CliRun o = run_cachet("tune " + kData + "workloads/resnet50_train.trace.json.gz");
  ASSERT_EQ(o.rc, 0) << o.err;
  EXPECT_NE(o.out.find("With PyTorch's allocator: PYTORCH_CUDA_ALLOC_CONF=\""), std::string::npos) << o.out;
  o = run_cachet("tune " + kData + "results/res_mixed_default.json.gz --cap 16GiB --json");
  ASSERT_EQ(o.rc, 0) << o.err;
  EXPECT_NE(o.out.find("garbage_collection_threshold"), std::string::npos);
}

// The number after `"key": ` in the JSON object that starts at `from` (-1 when none).
long long json_number(const std::string& s, std::size_t from, const std::string& key) {
  const std::size_t end = s.find("\"final_stats\"", from);
  const std::size_t at = s.find("\"" + key + "\": ", from);
  if (at == std::string::npos || at > end) return -1;
  return std::stoll(s.substr(at + key.size() + 4));
}

// tune considers policy:cachet once, and its row is exactly what `replay --policy cachet` gives.
TEST(ReplayCli, TuneHasTheCachetPolicyRowEqualToReplay) {
  const std::string trace = kData + "workloads/resnet50_train.trace.json.gz";
  CliRun t = run_cachet("tune " + trace + " --json");
  ASSERT_EQ(t.rc, 0) << t.err;
  const std::string row = "{\"conf\": \"policy:cachet\"";
  const std::size_t at = t.out.find(row);
  ASSERT_NE(at, std::string::npos) << t.out.substr(0, 2000);
  EXPECT_EQ(t.out.find(row, at + 1), std::string::npos) << "policy:cachet twice";
  const long long tuned = json_number(t.out, at, "peak_reserved");
  ASSERT_GT(tuned, 0);
  EXPECT_EQ(json_number(t.out, at, "num_ooms"), 0);

  CliRun r = run_cachet("replay " + trace + " --policy cachet --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  const std::size_t rat = r.out.find(row);
  ASSERT_NE(rat, std::string::npos) << r.out.substr(0, 2000);
  EXPECT_EQ(json_number(r.out, rat, "peak_reserved"), tuned);
  EXPECT_EQ(json_number(r.out, rat, "peak_requested"), json_number(t.out, at, "peak_requested"));
  // Recorded addresses are the PyTorch policy's: synthetic by default, and said so.
  EXPECT_NE(r.out.find("\"addresses\": \"synthetic\""), std::string::npos);
  EXPECT_NE(r.out.find("policy:cachet: synthetic addresses"), std::string::npos) << r.out.substr(0, 2000);
  // --conf policy:cachet is the same configuration.
  CliRun c = run_cachet("replay " + trace + " --conf policy:cachet --json");
  ASSERT_EQ(c.rc, 0) << c.err;
  EXPECT_EQ(json_number(c.out, c.out.find(row), "peak_reserved"), tuned);

  // The table shows the row (in the ranking, or after it) with its conf text.
  CliRun tt = run_cachet("tune " + trace + " --top 1");
  ASSERT_EQ(tt.rc, 0) << tt.err;
  EXPECT_NE(tt.out.find("policy:cachet"), std::string::npos) << tt.out;
}

// Every line of `text` fits `width` columns (stdout is a file here: 100).
void fits(const std::string& text, std::size_t width = 100) {
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) EXPECT_LE(line.size(), width) << line;
}

// The value of `"key": ` at the top level of tune's JSON (before "results").
long long top_number(const std::string& s, const std::string& key) {
  const std::size_t at = s.find("\"" + key + "\": ");
  if (at == std::string::npos || at > s.find("\"results\"")) return -2;
  return s.compare(at + key.size() + 4, 4, "null") == 0 ? -3 : std::stoll(s.substr(at + key.size() + 4));
}

// The `n`-th object of tune's "results" (0-based).
std::string result_at(const std::string& s, long long n) {
  std::size_t at = s.find("\"results\"");
  for (long long k = 0; k <= n && at != std::string::npos; ++k) at = s.find("{\"conf\"", at + 1);
  return at == std::string::npos ? std::string() : s.substr(at, s.find("\"final_stats\"", at) - at);
}

// Issue 17: under a 13.5 GiB cap the default fails 3 requests; tune's answer is the best
// configuration PyTorch accepts that fails none, expandable_segments:True.
TEST(ReplayCli, TuneUnderACapRecommendsWhatDoesNotFail) {
  const std::string trace = kData + "workloads/gpt2_train.trace.json.gz --cap 13.5G";
  CliRun o = run_cachet("tune " + trace);
  ASSERT_EQ(o.rc, 0) << o.err;
  EXPECT_NE(o.out.find("With PyTorch's allocator: PYTORCH_CUDA_ALLOC_CONF=\"expandable_segments:True\"\n"
                       "  All 3 requests that ran out of memory succeed."),
            std::string::npos)
      << o.out;
  EXPECT_NE(o.out.find("With cachet's plug-in"), std::string::npos) << o.out;
  // One count: the recorded configuration and the candidates.
  EXPECT_NE(o.out.find("64 configurations replayed on 2 threads: the recorded one and 63 candidates"),
            std::string::npos)
      << o.out;
  EXPECT_NE(o.out.find("(10 of 63)"), std::string::npos) << o.out;
  EXPECT_TRUE(o.err.empty()) << o.err;  // no progress line when stderr is not a terminal
  fits(o.out);

  o = run_cachet("tune " + trace + " --json");
  ASSERT_EQ(o.rc, 0) << o.err;
  const long long best = top_number(o.out, "best"), native = top_number(o.out, "best_native");
  ASSERT_GE(best, 1) << o.out.substr(0, 400);
  EXPECT_EQ(native, 1);
  EXPECT_NE(result_at(o.out, best).find("\"num_ooms\": 0,"), std::string::npos) << result_at(o.out, best);
  EXPECT_NE(result_at(o.out, native).find("{\"conf\": \"expandable_segments:True\","), std::string::npos);
  EXPECT_NE(result_at(o.out, 0).find("\"num_ooms\": 3,"), std::string::npos) << result_at(o.out, 0);
  EXPECT_EQ(top_number(o.out, "memory_needed"), -3);  // null: the best fails nothing
  EXPECT_EQ(top_number(o.out, "cap"), 14495514624);    // 13.5 x 2^30
}

TEST(ReplayCli, TuneRefusesZeroThreads) {
  CliRun o = run_cachet("tune " + kData + "workloads/gpt2_train.trace.json.gz --threads 0");
  EXPECT_EQ(o.rc, 2);
  EXPECT_NE(o.err.find("--threads"), std::string::npos) << o.err;
  EXPECT_TRUE(o.out.empty()) << o.out;
}

// The real OOM snapshot (a 12 GiB cap, not recorded in the pickle): replay and tune ask for the
// cap; given, replay is PyTorch's run (gpt2_train_oom_cap12g.json: reserved peak 12750684160,
// num_ooms 1, num_alloc_retries 2); under 11 GiB nothing PyTorch accepts avoids the OOM and tune
// says how much memory it needs.
TEST(ReplayCli, TheOomSnapshotNeedsItsCap) {
  const std::string trace = kData + "snapshots/gpt2_train_oom_cap12g.pickle.gz";
  for (const char* cmd : {"replay ", "tune "}) {
    CliRun o = run_cachet(cmd + trace);
    EXPECT_EQ(o.rc, 2) << cmd;
    EXPECT_NE(o.err.find("a memory cap was in force"), std::string::npos) << o.err;
    EXPECT_NE(o.err.find("--cap"), std::string::npos) << o.err;
  }
  CliRun r = run_cachet("replay " + trace + " --cap 12GiB --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("\"peak_reserved\": 12750684160,"), std::string::npos) << r.out.substr(0, 400);
  EXPECT_NE(r.out.find("\"num_ooms\": 1, \"num_alloc_retries\": 2,"), std::string::npos) << r.out.substr(0, 400);
  r = run_cachet("replay " + trace + " --cap 12GiB");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("from the trace's out-of-memory entry"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("memory cap: 12.00 GiB = 12884901888 bytes"), std::string::npos) << r.out;
  fits(r.out);
  CliRun t = run_cachet("tune " + trace + " --cap 11G");
  ASSERT_EQ(t.rc, 0) << t.err;
  EXPECT_NE(t.out.find("No configuration tried avoids running out of memory"), std::string::npos) << t.out;
  EXPECT_NE(t.out.find("(found by replay, to 2 MiB: the smallest from which"), std::string::npos) << t.out;
  fits(t.out);
  t = run_cachet("tune " + trace + " --cap 11G --json");
  ASSERT_EQ(t.rc, 0) << t.err;
  const long long need = top_number(t.out, "memory_needed");
  EXPECT_GT(need, 12LL << 30);  // PyTorch ran out of memory under 12 GiB
  EXPECT_EQ(need % (2 << 20), 0);
  // The cap it names is enough: replayed under it, the best fails nothing.
  const std::string best = result_at(t.out, top_number(t.out, "best"));
  const std::string conf = best.substr(10, best.find('"', 10) - 10);
  CliRun ok = run_cachet("replay " + trace + " --cap " + std::to_string(need) + " --conf '" + conf + "' --json");
  ASSERT_EQ(ok.rc, 0) << ok.err;
  EXPECT_NE(ok.out.find("\"num_ooms\": 0,"), std::string::npos) << conf;
  CliRun less = run_cachet("replay " + trace + " --cap " + std::to_string(need - (2 << 20)) + " --conf '" + conf + "' --json");
  EXPECT_EQ(less.out.find("\"num_ooms\": 0,"), std::string::npos) << conf;
  EXPECT_EQ(run_cachet("replay " + trace + " --cap 0").rc, 2);
  EXPECT_EQ(run_cachet("replay " + trace + " --cap lots").rc, 2);
}

// --policy cachet: its note once, and the keys it does not use named.
TEST(ReplayCli, PolicyCachetNoteOnceAndIgnoredKeysNamed) {
  CliRun o = run_cachet("replay " + kData + "snapshots/mlp_train.pickle.gz --policy cachet --conf max_split_size_mb:128 "
              "--conf expandable_segments:True,roundup_power2_divisions:4");
  ASSERT_EQ(o.rc, 0) << o.err;
  const std::string note = "policy:cachet: replayed with synthetic addresses";
  ASSERT_NE(o.out.find(note), std::string::npos) << o.out;
  EXPECT_EQ(o.out.find(note, o.out.find(note) + 1), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("policy:cachet does not use max_split_size_mb (given in 'max_split_size_mb:128')"),
            std::string::npos)
      << o.out;
  EXPECT_NE(o.out.find("does not use expandable_segments, roundup_power2_divisions"), std::string::npos) << o.out;
  // Nothing tells this snapshot's device memory, and nothing needs it: said, no limit assumed.
  EXPECT_NE(o.out.find("device memory: not recorded in the trace"), std::string::npos) << o.out;
  EXPECT_EQ(o.out.find("80.00 GiB"), std::string::npos) << o.out;
  fits(o.out);
}

TEST(ReplayCli, SummaryAtTheEndAndAtThePeak) {
  CliRun o = run_cachet("summary " + kData + "workloads/gpt2_train.trace.json.gz");
  ASSERT_EQ(o.rc, 0) << o.err;
  EXPECT_NE(o.out.find("== at the end of the trace =="), std::string::npos);
  EXPECT_NE(o.out.find("== at peak reserved"), std::string::npos);
  std::size_t n = 0;
  for (std::size_t at = 0; (at = o.out.find("PyTorch CUDA memory summary", at)) != std::string::npos; ++at) ++n;
  EXPECT_EQ(n, 2u);
}

// Minimal well-formedness: every tag closes in order; no scripts, no external references.
bool well_formed(const std::string& s, std::string* why) {
  std::vector<std::string> stack;
  std::size_t i = 0;
  while ((i = s.find('<', i)) != std::string::npos) {
    const std::size_t j = s.find('>', i);
    if (j == std::string::npos) return *why = "unterminated tag", false;
    std::string tag = s.substr(i + 1, j - i - 1);
    i = j + 1;
    if (tag.empty()) return *why = "empty tag", false;
    if (tag[0] == '?' || tag[0] == '!') continue;
    if (tag.back() == '/') continue;
    if (tag[0] == '/') {
      const std::string name = tag.substr(1);
      if (stack.empty() || stack.back() != name) return *why = "mismatched </" + name + ">", false;
      stack.pop_back();
      continue;
    }
    stack.push_back(tag.substr(0, tag.find_first_of(" \t\n")));
  }
  if (!stack.empty()) return *why = "unclosed <" + stack.back() + ">", false;
  return true;
}

TEST(ReplayCli, PlotWritesAWellFormedSvg) {
  const fs::path svg = scratch_dir() / "gpt2.svg";
  CliRun o = run_cachet("plot " + kData + "workloads/gpt2_train.trace.json.gz -o " + svg.string());
  ASSERT_EQ(o.rc, 0) << o.err;
  const std::string s = slurp(svg);
  std::string why;
  EXPECT_TRUE(well_formed(s, &why)) << why;
  EXPECT_NE(s.find("<svg"), std::string::npos);
  EXPECT_NE(s.find("id=\"allocated\""), std::string::npos);
  EXPECT_NE(s.find("id=\"reserved\""), std::string::npos);
  EXPECT_NE(s.find("class=\"allocated\""), std::string::npos);  // segment map blocks
  EXPECT_NE(s.find("class=\"inactive\""), std::string::npos);
  EXPECT_NE(s.find("gpt2_train"), std::string::npos);              // title
  EXPECT_NE(s.find("memory (GiB)"), std::string::npos);            // axis with units
  EXPECT_EQ(s.find("<script"), std::string::npos);
  EXPECT_EQ(s.find("http://", s.find("<svg") + 60), std::string::npos);  // only the xmlns
  EXPECT_EQ(s.find("https://"), std::string::npos);
  // The pickle too.
  o = run_cachet("plot " + kData + "snapshots/mlp_train.pickle.gz -o " + (scratch_dir() / "mlp.svg").string());
  ASSERT_EQ(o.rc, 0) << o.err;
  EXPECT_TRUE(well_formed(slurp(scratch_dir() / "mlp.svg"), &why)) << why;
}

}  // namespace

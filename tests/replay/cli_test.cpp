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

namespace {

namespace fs = std::filesystem;
const std::string kData = std::string(CACHET_TEST_DATA) + "/oracle/";

struct Out {
  int rc = -1;
  std::string out, err;
};

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

fs::path tmp_dir() {
  fs::path d = fs::temp_directory_path() / ("cachet_replay_cli_" + std::to_string(::getpid()));
  fs::create_directories(d);
  return d;
}

Out run(const std::string& args) {
  const fs::path d = tmp_dir();
  const std::string cmd = std::string(CACHET_EXE) + " " + args + " >" + (d / "out").string() + " 2>" + (d / "err").string();
  Out o;
  const int st = std::system(cmd.c_str());
  o.rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  o.out = slurp(d / "out");
  o.err = slurp(d / "err");
  return o;
}

TEST(ReplayCli, JsonHasTheFields) {
  Out o = run("replay " + kData + "workloads/gpt2_train.trace.json.gz --json --conf '' --conf expandable_segments:True");
  ASSERT_EQ(o.rc, 0) << o.err;
  ASSERT_EQ(o.out.front(), '[');
  for (const char* key : {"\"conf\"", "\"peak_allocated\"", "\"peak_reserved\"", "\"num_ooms\"", "\"num_alloc_retries\"",
                          "\"events\": 18685", "\"final_stats\"", "\"reserved_bytes.all.peak\"", "\"num_device_alloc\""})
    EXPECT_NE(o.out.find(key), std::string::npos) << key;
  EXPECT_NE(o.out.find("\"peak_reserved\": 15286140928"), std::string::npos);  // '' is the recorded (default) config
  EXPECT_NE(o.out.find("\"conf\": \"expandable_segments:True\""), std::string::npos);
}

TEST(ReplayCli, TableAndRecordedPeaks) {
  Out o = run("replay " + kData + "results/res_pressure_default.json.gz");
  ASSERT_EQ(o.rc, 0) << o.err;
  EXPECT_NE(o.out.find("peak reserved"), std::string::npos);
  EXPECT_NE(o.out.find("PyTorch recorded"), std::string::npos);
}

TEST(ReplayCli, UnreadableFilesExit2) {
  Out o = run("replay /nonexistent/trace.json.gz");
  EXPECT_EQ(o.rc, 2);
  EXPECT_NE(o.err.find("/nonexistent/trace.json.gz"), std::string::npos) << o.err;
  const fs::path bad = tmp_dir() / "bad.json";
  std::ofstream(bad) << "{\"segments\": [1, 2";
  o = run("replay " + bad.string());
  EXPECT_EQ(o.rc, 2);
  EXPECT_FALSE(o.err.empty());
  o = run("replay " + kData + "workloads/gpt2_train.trace.json.gz --conf 'max_split_size_mb:128;garbage_interval:5'");
  EXPECT_EQ(o.rc, 2);
  o = run("replay " + kData + "workloads/gpt2_train.trace.json.gz --device-memory lots");
  EXPECT_EQ(o.rc, 2);
}

TEST(ReplayCli, MidRunTraceIsOneLineNotFatal) {
  // The pickle snapshot's device trace, written as JSON with its first events cut off.
  const fs::path p = tmp_dir() / "midrun.json";
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
  Out o = run("replay " + p.string());
  ASSERT_EQ(o.rc, 0) << o.err;
  EXPECT_NE(o.out.find("mid-run"), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("1 frees of blocks never seen allocated"), std::string::npos) << o.out;
}

TEST(ReplayCli, PickleAndRecordingReplay) {
  Out o = run("replay " + kData + "snapshots/mlp_train.pickle.gz --json");
  ASSERT_EQ(o.rc, 0) << o.err;
  EXPECT_NE(o.out.find("\"peak_reserved\""), std::string::npos);
  o = run("replay " + kData + "results/res_mixed_expandable.json.gz --addresses synthetic --device-memory 140GiB");
  ASSERT_EQ(o.rc, 0) << o.err;
}

TEST(ReplayCli, TuneRecommends) {
  Out o = run("tune " + kData + "workloads/resnet50_train.trace.json.gz");
  ASSERT_EQ(o.rc, 0) << o.err;
  EXPECT_NE(o.out.find("recommended: "), std::string::npos) << o.out;
  o = run("tune " + kData + "results/res_mixed_default.json.gz --cap 16GiB --json");
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
  Out t = run("tune " + trace + " --json");
  ASSERT_EQ(t.rc, 0) << t.err;
  const std::string row = "{\"conf\": \"policy:cachet\"";
  const std::size_t at = t.out.find(row);
  ASSERT_NE(at, std::string::npos) << t.out.substr(0, 2000);
  EXPECT_EQ(t.out.find(row, at + 1), std::string::npos) << "policy:cachet twice";
  const long long tuned = json_number(t.out, at, "peak_reserved");
  ASSERT_GT(tuned, 0);
  EXPECT_EQ(json_number(t.out, at, "num_ooms"), 0);

  Out r = run("replay " + trace + " --policy cachet --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  const std::size_t rat = r.out.find(row);
  ASSERT_NE(rat, std::string::npos) << r.out.substr(0, 2000);
  EXPECT_EQ(json_number(r.out, rat, "peak_reserved"), tuned);
  EXPECT_EQ(json_number(r.out, rat, "peak_requested"), json_number(t.out, at, "peak_requested"));
  // Recorded addresses are the PyTorch policy's: synthetic by default, and said so.
  EXPECT_NE(r.out.find("\"addresses\": \"synthetic\""), std::string::npos);
  EXPECT_NE(r.out.find("policy:cachet: synthetic addresses"), std::string::npos) << r.out.substr(0, 2000);
  // --conf policy:cachet is the same configuration.
  Out c = run("replay " + trace + " --conf policy:cachet --json");
  ASSERT_EQ(c.rc, 0) << c.err;
  EXPECT_EQ(json_number(c.out, c.out.find(row), "peak_reserved"), tuned);

  // The table shows the row (in the ranking, or after it) with its conf text.
  Out tt = run("tune " + trace + " --top 1");
  ASSERT_EQ(tt.rc, 0) << tt.err;
  EXPECT_NE(tt.out.find("policy:cachet"), std::string::npos) << tt.out;
}

TEST(ReplayCli, SummaryAtTheEndAndAtThePeak) {
  Out o = run("summary " + kData + "workloads/gpt2_train.trace.json.gz");
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
  const fs::path svg = tmp_dir() / "gpt2.svg";
  Out o = run("plot " + kData + "workloads/gpt2_train.trace.json.gz -o " + svg.string());
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
  o = run("plot " + kData + "snapshots/mlp_train.pickle.gz -o " + (tmp_dir() / "mlp.svg").string());
  ASSERT_EQ(o.rc, 0) << o.err;
  EXPECT_TRUE(well_formed(slurp(tmp_dir() / "mlp.svg"), &why)) << why;
}

}  // namespace

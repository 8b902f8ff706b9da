// Issue 35, the OOM doctor as a new user meets it: one answer from every command (explain, tune,
// report, replay: one pick, one verdict, cachet/replay/recommend.h), sizes with units, readable
// sites, one figure per thing, check-conf, less refusal. Each test runs the `cachet` binary on the
// repository's traces and asserts exact text or numbers.
// Data: tests/data/oracle/snapshots/gpt2_train_oom_cap12g.pickle.gz (GPT-2 training, an OOM under a
// 12 GiB cap, PyTorch 2.11), snapshots/mlp_train.pickle.gz (no OOM),
// results/res_pressure_default.json.gz (an oracle recording: OOMs under its recorded 6 GiB cap),
// oracle-issue23/results/res_threads_expandable.json.gz (expandable_segments:True, no OOM).
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cachet/io/frames.h"
#include "cachet/test/cli_run.h"

namespace {

using cachet::test::CliRun;
using cachet::test::run_cachet;
namespace fs = std::filesystem;

const std::string kData = std::string(CACHET_TEST_DATA) + "/oracle/";
const std::string kOom = kData + "snapshots/gpt2_train_oom_cap12g.pickle.gz";
const std::string kMlp = kData + "snapshots/mlp_train.pickle.gz";
const std::string kPressure = kData + "results/res_pressure_default.json.gz";
const std::string kThreads = std::string(CACHET_TEST_DATA) + "/oracle-issue23/results/res_threads_expandable.json.gz";

// The text with its wrapped lines joined (wrap_text and fit_lines break at spaces; continuation
// lines of fit_lines are indented by two).
std::string flat(std::string s) {
  for (std::size_t at; (at = s.find("\n  ")) != std::string::npos;) s.replace(at, 3, " ");
  return s;
}

// The paragraph starting at `head` (up to the next blank line), its lines joined by spaces.
std::string paragraph(const std::string& text, const std::string& head) {
  const auto at = text.find(head);
  if (at == std::string::npos) return "(no paragraph starting '" + head + "')";
  auto end = text.find("\n\n", at);
  if (end == std::string::npos) end = text.size();
  std::string p = text.substr(at, end - at);
  for (auto& c : p)
    if (c == '\n') c = ' ';
  while (!p.empty() && p.back() == ' ') p.pop_back();
  return p;
}

using nlohmann::json;

struct Case {
  std::string trace;
  std::string cap;  // "" = none
  std::string pick;  // tune's pick, the one answer
  std::string verdict;  // the verdict paragraph, the same in replay, tune and explain
};

// Done-when 1: the same traces and caps to explain, tune, report and replay give one pick and
// one verdict.
TEST(OomDoctor, EveryCommandGivesOnePickAndOneVerdict) {
  const std::vector<Case> cases = {
      // Only the plug-in avoids the OOM: it is the pick, said plainly.
      {kOom, "12G", "policy:cachet",
       "Verdict for the recorded configuration (PyTorch's defaults) under the cap of 12.00 GiB: it does not fit: 1 "
       "request runs out of memory (peak reserved 11.88 GiB = 12750684160 bytes). 2 allocation retries: the allocator "
       "reached the cap, freed its cached blocks and tried again. The smallest cap it fits under: 12.70 GiB = "
       "13635682304 bytes (by replay, to 2 MiB), 716.00 MiB more than the cap. If the cap is from PyTorch's \"12.00 "
       "GiB allowed\", which is rounded to 0.01 GiB, the true cap lies within 5.12 MiB of it: the verdict holds "
       "across that range (the smallest cap that fits is 716.00 MiB above the cap)."},
      // The plug-in is not clearly better: PyTorch's pick (2 keys; the 1-key policy:cachet is a
      // second line in explain only).
      {kPressure, "6.4G", "max_split_size_mb:128,garbage_collection_threshold:0.6",
       "Verdict for the recorded configuration (PyTorch's defaults) under the cap of 6.40 GiB: it does not fit: 15 "
       "requests run out of memory (peak reserved 6.37 GiB = 6843006976 bytes). 28 allocation retries: the allocator "
       "reached the cap, freed its cached blocks and tried again. The smallest cap it fits under: 9.67 GiB = "
       "10380902400 bytes (by replay, to 2 MiB), 3.27 GiB more than the cap. If the cap is from PyTorch's \"6.40 GiB "
       "allowed\", which is rounded to 0.01 GiB, the true cap lies within 5.12 MiB of it: the verdict holds across "
       "that range (the smallest cap that fits is 3.27 GiB above the cap)."},
      // No OOM, no cap: keep the recorded configuration ("").
      {kMlp, "", "",
       "Verdict for the recorded configuration (PyTorch's defaults) with no device limit (the device's memory is not "
       "known: --device-memory gives it): it fits, no out-of-memory. Peak reserved 198.00 MiB = 207618048 bytes. No "
       "allocation retry. The smallest cap it fits under: 186.00 MiB = 195035136 bytes (by replay, to 2 MiB); less "
       "than its peak reserved: under a cap the allocator frees its cached blocks and retries."},
      // No OOM: the plug-in for its headroom (issue 25's TuneRecommendsThePlugInForItsHeadroom).
      {kThreads, "2100M", "policy:cachet",
       "Verdict for the recorded configuration 'expandable_segments:True' under the cap of 2.05 GiB: it fits, no "
       "out-of-memory. Peak reserved 1.90 GiB = 2040528896 bytes, 154.00 MiB = 161480704 bytes under the cap (close: "
       "under 256.00 MiB, other libraries' memory on the GPU or another allocation order can still make it fail). No "
       "allocation retry. The smallest cap it fits under: 1.90 GiB = 2042626048 bytes (by replay, to 2 MiB)."},
  };
  const fs::path dir = cachet::test::scratch_dir();
  for (const Case& c : cases) {
    SCOPED_TRACE(c.trace + " " + c.cap);
    const std::string cap = c.cap.empty() ? "" : " --cap " + c.cap;
    CliRun tune = run_cachet("tune " + c.trace + cap + " --json");
    ASSERT_EQ(tune.rc, 0) << tune.err;
    CliRun tune_text = run_cachet("tune " + c.trace + cap);
    CliRun explain = run_cachet("explain " + c.trace + cap + " --json");
    ASSERT_EQ(explain.rc, 0) << explain.err;
    CliRun explain_text = run_cachet("explain " + c.trace + cap);
    CliRun report = run_cachet("report " + c.trace + cap + " -o " + (dir / "r.html").string());
    ASSERT_EQ(report.rc, 0) << report.err;
    CliRun replay = run_cachet("replay " + c.trace + cap);
    ASSERT_EQ(replay.rc, 0) << replay.err;

    // One pick.
    const json tj = json::parse(tune.out), ej = json::parse(explain.out);
    EXPECT_EQ(tj["results"][tj["pick"].get<int>()]["conf"], c.pick);
    EXPECT_EQ(ej["recommendation"]["conf"], c.pick);
    const std::string var = c.pick.starts_with("policy:cachet") ? "CACHET_ALLOC_CONF" : "PYTORCH_CUDA_ALLOC_CONF";
    const std::string said = c.pick.empty() ? "keep the recorded configuration, \"\"" : var + "=\"" + c.pick + "\"";
    EXPECT_NE(report.out.find("recommendation (cachet tune's pick): " + said), std::string::npos) << report.out;
    // Where only the plug-in avoids the OOM, tune and explain say so plainly.
    const bool only = c.trace == kOom;
    EXPECT_EQ(tj["only_plugin_avoids"].get<bool>(), only);
    EXPECT_EQ(ej["recommendation"]["only_plugin_avoids"].get<bool>(), only);
    if (only)
      EXPECT_EQ(paragraph(tune_text.out, "Only cachet's plug-in"),
                "Only cachet's plug-in avoids the out-of-memory: none of the 62 configurations tried that PyTorch's "
                "own allocator accepts does; CACHET_ALLOC_CONF=\"policy:cachet\" needs the plug-in (python/README.md), "
                "PyTorch rejects the key in its own variables.");
    else
      EXPECT_EQ(tune_text.out.find("Only cachet's plug-in"), std::string::npos);
    EXPECT_EQ(explain_text.out.find("  Only cachet's plug-in avoids it: with PyTorch's own allocator, none of the "
                                    "configurations tried does.\n") != std::string::npos,
              only);
    EXPECT_EQ(report.out.find("(only cachet's plug-in avoids the out-of-memory)") != std::string::npos, only);
    // One verdict: the same object in tune's and explain's JSON, the same paragraph in replay,
    // tune and explain.
    EXPECT_EQ(tj["verdict"], ej["verdict"]);
    EXPECT_EQ(paragraph(replay.out, "Verdict for"), c.verdict);
    EXPECT_EQ(paragraph(tune_text.out, "Verdict for"), c.verdict);
    EXPECT_EQ(paragraph(explain_text.out, "Verdict for"), c.verdict);
    const bool fits = tj["verdict"]["fits"].get<bool>();
    EXPECT_NE(report.out.find(std::string("verdict: the recorded configuration ") + (fits ? "fits" : "does not fit")),
              std::string::npos)
        << report.out;
    // The report's page holds both.
    const std::string html = cachet::test::slurp(dir / "r.html");
    EXPECT_NE(html.find("Verdict for"), std::string::npos);
    EXPECT_NE(html.find("Recommended"), std::string::npos);
  }
}

}  // namespace

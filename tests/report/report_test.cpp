// `cachet report`: the HTML is self-contained (no script, no external resource) and, opened in
// headless Chromium, logs no console message and shows the explain text and the segments. The
// browser must start: a missing or broken Chromium fails the test (scripts/bootstrap installs it).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "cachet/test/cli_run.h"

namespace {

namespace fs = std::filesystem;

const std::string kOom = std::string(CACHET_TEST_DATA) + "/oracle/snapshots/gpt2_train_oom_cap12g.pickle.gz";

using namespace cachet::test;

// Headless Chromium on `page`, with a fresh profile; stdout is the DOM after load, stderr the log
// (console messages are its "CONSOLE" lines).
CliRun chromium(const fs::path& page) {
  static int n = 0;
  const fs::path profile = scratch_dir() / ("profile" + std::to_string(++n));
  fs::remove_all(profile);
  return run_shell("timeout 120 chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run "
            "--disable-background-networking --disable-component-update --disable-sync --disable-dev-shm-usage "
            "--user-data-dir=" +
            profile.string() + " --enable-logging=stderr --v=0 --dump-dom file://" + fs::absolute(page).string());
}

std::string console_lines(const std::string& log) {
  std::string out;
  std::istringstream in(log);
  for (std::string line; std::getline(in, line);)
    if (line.find(":CONSOLE") != std::string::npos) out += line + "\n";
  return out;
}

std::size_t count(const std::string& s, const std::string& what) {
  std::size_t n = 0;
  for (std::size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + 1)) ++n;
  return n;
}

// The text of <section id="id"> ... </section>.
std::string section(const std::string& dom, const std::string& id) {
  const std::size_t b = dom.find("<section id=\"" + id + "\"");
  if (b == std::string::npos) return {};
  const std::size_t e = dom.find("</section>", b);
  return dom.substr(b, e == std::string::npos ? std::string::npos : e - b);
}

// The detector works: a page with a planted SVG error logs a console line in this browser.
TEST(Report, ChromiumStartsAndReportsConsoleErrors) {
  const fs::path bad = scratch_dir() / "planted.html";
  std::ofstream(bad) << "<!DOCTYPE html><html><head><meta charset=\"utf-8\"><link rel=\"icon\" href=\"data:,\">"
                        "<title>planted</title></head><body><p id=\"x\">planted page</p>"
                        "<svg xmlns=\"http://www.w3.org/2000/svg\"><rect x=\"a\" width=\"1\" height=\"1\"/></svg>"
                        "</body></html>";
  CliRun o = chromium(bad);
  ASSERT_EQ(o.rc, 0) << "headless Chromium did not run (scripts/bootstrap installs Debian's chromium):\n" << o.err;
  EXPECT_NE(o.out.find("planted page"), std::string::npos) << o.out;
  EXPECT_NE(console_lines(o.err), "") << "the planted SVG error was not logged:\n" << o.err;
}

TEST(Report, RealOomOpensCleanInChromium) {
  const fs::path page = scratch_dir() / "report.html";
  CliRun o = run_shell(std::string(CACHET_EXE) + " report " + kOom + " --cap 12G --device-memory 85017493504 -o " + page.string());
  ASSERT_EQ(o.rc, 0) << o.err;
  EXPECT_NE(o.out.find("149 segments at the peak, 149 at the out-of-memory"), std::string::npos) << o.out;
  const std::string html = slurp(page);
  // Self-contained: nothing to fetch, nothing to run.
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_EQ(html.find("src="), std::string::npos);
  EXPECT_EQ(html.find("url("), std::string::npos);
  EXPECT_EQ(html.find("@import"), std::string::npos);
  EXPECT_EQ(html.find("https:"), std::string::npos);
  EXPECT_EQ(count(html, "http:"), count(html, "xmlns=\"http://www.w3.org/2000/svg\""));  // namespaces only
  EXPECT_EQ(count(html, "<link"), 1u);  // the empty data: icon (no request for favicon.ico)

  o = chromium(page);
  ASSERT_EQ(o.rc, 0) << "headless Chromium did not run:\n" << o.err;
  EXPECT_EQ(console_lines(o.err), "") << "console messages while loading the report";
  const std::string& dom = o.out;
  ASSERT_NE(dom.find("<h1>cachet report: gpt2_train_oom_cap12g.pickle.gz</h1>"), std::string::npos) << dom.substr(0, 2000);
  // The explain section: the request and the exact partition (tests/explain has the figures).
  const std::string ex = section(dom, "explain");
  EXPECT_NE(ex.find("Why it ran out of memory"), std::string::npos);
  EXPECT_NE(ex.find("The first out-of-memory, at trace event 5754: a request of 1.53 GiB"), std::string::npos) << ex;
  EXPECT_NE(ex.find("= reserved - allocated, exactly (1581035008 bytes)"), std::string::npos) << ex;
  // Issue 35: the verdict and tune's recommendation, as tune and explain give them.
  EXPECT_NE(ex.find("Verdict for the recorded configuration"), std::string::npos) << ex;
  EXPECT_NE(ex.find("it does not\nfit: 1 request runs out of memory"), std::string::npos) << ex;
  EXPECT_NE(ex.find("CACHET_ALLOC_CONF=&quot;policy:cachet&quot;") != std::string::npos ||
                ex.find("CACHET_ALLOC_CONF=\"policy:cachet\"") != std::string::npos,
            false)
      << ex;
  EXPECT_NE(ex.find("plug-in avoids it: with PyTorch"), std::string::npos) << ex;
  // Segments drawn: 149 at the peak and at the out-of-memory (the segment_alloc/segment_free
  // events of the trace leave 149 live at event 5754, and peak reserved, 12,750,684,160 bytes,
  // is first reached at event 5614 with the same 149).
  EXPECT_EQ(count(section(dom, "segments-peak"), "<g class=\"segment\""), 149u);
  EXPECT_EQ(count(section(dom, "segments-oom"), "<g class=\"segment\""), 149u);
  EXPECT_NE(section(dom, "segments-oom").find("<span class=\"count\">149</span> segments, 11.88 GiB reserved"),
            std::string::npos);
  // The timeline marks the one out-of-memory; the table has the recorded row and the ranking.
  EXPECT_EQ(count(section(dom, "timeline"), "class=\"oom\""), 1u);
  const std::string tune = section(dom, "tune");
  EXPECT_EQ(count(tune, "<tr class=\"recorded\">"), 1u);
  EXPECT_GE(count(tune, "<tr>"), 10u);
}

// Issue 35: a run with no out-of-memory gets the verdict and the recommendation on the page too.
TEST(Report, NoOomReportHoldsTheVerdictAndTheRecommendation) {
  const fs::path page = scratch_dir() / "mlp.html";
  CliRun o = run_shell(std::string(CACHET_EXE) + " report " + std::string(CACHET_TEST_DATA) +
                       "/oracle/snapshots/mlp_train.pickle.gz -o " + page.string());
  ASSERT_EQ(o.rc, 0) << o.err;
  EXPECT_NE(o.out.find("\nrecommendation (cachet tune"), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("\nverdict: the recorded configuration fits; the smallest cap at and above which it fits: 186.00 MiB = "
                       "195035136 bytes\n"),
            std::string::npos)
      << o.out;
  o = chromium(page);
  ASSERT_EQ(o.rc, 0) << "headless Chromium did not run:\n" << o.err;
  EXPECT_EQ(console_lines(o.err), "") << "console messages while loading the report";
  const std::string ex = section(o.out, "explain");
  EXPECT_NE(ex.find("Verdict for the recorded configuration"), std::string::npos) << ex;
  EXPECT_NE(ex.find("it fits, no out-of-memory."), std::string::npos) << ex;
  EXPECT_NE(ex.find("Recommended configuration (cachet tune"), std::string::npos) << ex;
  EXPECT_NE(ex.find("  keep the recorded configuration: no configuration tried fails fewer requests"),
            std::string::npos)
      << ex;
}

TEST(Report, BadOutputIsExit2WithReason) {
  CliRun o = run_shell(std::string(CACHET_EXE) + " report " + kOom + " --cap 12G -o /nonexistent/folder/report.html");
  EXPECT_EQ(o.rc, 2);
  EXPECT_NE(o.err.find("cachet report: -o /nonexistent/folder/report.html: cannot write there: the folder "
                       "/nonexistent/folder does not exist"),
            std::string::npos)
      << o.err;
  o = run_shell(std::string(CACHET_EXE) + " report " + kOom + " --cap 12G -o " + scratch_dir().string());
  EXPECT_EQ(o.rc, 2);
  EXPECT_NE(o.err.find("is a folder; give a file name"), std::string::npos) << o.err;
}

}  // namespace

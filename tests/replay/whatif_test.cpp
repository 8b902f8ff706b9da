// Issue 25: what-if answers off the recorded path. Each test runs the `cachet` binary on the
// repository's traces and asserts the exact text or number.
// Data: tests/data/oracle/snapshots/gpt2_train_oom_cap12g.pickle.gz (a real OOM under a 12 GiB
// cap, PyTorch 2.11, H100; PyTorch's figures in gpt2_train_oom_cap12g.json: peak reserved
// 12750684160, num_ooms 1, num_alloc_retries 2). Its trace events 1267-1270 are the allocator's
// free-and-retry (segment_free of four cached segments, no frames recorded) for the 1.53 GiB
// segment_alloc of event 1271 that the 12 GiB cap did not allow otherwise.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "cachet/replay/report.h"

namespace {

namespace fs = std::filesystem;
const std::string kData = std::string(CACHET_TEST_DATA) + "/oracle/";
const std::string kOom = kData + "snapshots/gpt2_train_oom_cap12g.pickle.gz";

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
  fs::path d = fs::temp_directory_path() / ("cachet_whatif_" + std::to_string(::getpid()));
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

// The text with its wrapped lines joined (fit_lines wraps at 100 columns, continuation lines
// indented by two).
std::string flat(std::string s) {
  for (std::size_t at; (at = s.find("\n  ")) != std::string::npos;) s.replace(at, 3, " ");
  return s;
}

long long json_number(const std::string& s, const std::string& key) {
  const auto at = s.find("\"" + key + "\": ");
  if (at == std::string::npos) return -1;
  return std::stoll(s.substr(at + key.size() + 4));
}

// 1: a cap above the recorded one never turns the free-and-retry into an empty_cache(), and the
// default configuration's peak reserved never falls as the cap rises.
TEST(WhatIf, LargerCapsInventNoEmptyCacheAndPeaksNeverFall) {
  long long last = 0;
  for (int gib = 12; gib <= 20; ++gib) {
    const std::string cap = std::to_string(gib) + "G";
    Out o = run("replay " + kOom + " --cap " + cap);
    ASSERT_EQ(o.rc, 0) << o.err;
    EXPECT_EQ(o.out.find("empty_cache() calls"), std::string::npos) << cap << "\n" << o.out;
    EXPECT_NE(flat(o.out).find("the recorded allocator's own segment releases (its free-and-retry, garbage collection): 1 "
                         "(1 before a new segment, 0 before an out-of-memory error)"),
              std::string::npos)
        << o.out;
    Out j = run("replay " + kOom + " --cap " + cap + " --json");
    ASSERT_EQ(j.rc, 0) << j.err;
    const long long peak = json_number(j.out, "peak_reserved");
    EXPECT_GE(peak, last) << cap;
    if (gib == 12) EXPECT_EQ(peak, 12750684160LL);  // PyTorch's reserved_bytes.all.peak
    // No release: 11987320832 + the 1648361472 segment of event 1271 + the 2 MiB one of event 5614.
    if (gib >= 13) EXPECT_EQ(peak, 13637779456LL) << cap;
    last = peak;
  }
}

}  // namespace

// explain's "  reserved  <human>  <bytes> bytes" line's tail: the exact bytes, right-aligned in 15.
std::string fmt_bytes_line(long long bytes) {
  std::string n = std::to_string(bytes);
  return std::string(n.size() < 15 ? 15 - n.size() : 0, ' ') + n + " bytes (segments from the device)";
}

// The first "peak_reserved" of a JSON text (replay --json: the first configuration; tune --json:
// results[0], the recorded configuration).
long long first_peak(const std::string& s) { return json_number(s, "peak_reserved"); }

// Every trace and pickle the repository has: the snapshots (pickle and JSON), the derived pickle,
// the oracle recordings of tests/data/oracle*/results. Each with the options it needs (the OOM
// pickles record no cap: --cap 12G, the cap they ran under).
std::vector<std::pair<std::string, std::string>> every_repo_trace() {
  std::vector<std::pair<std::string, std::string>> out;
  const fs::path root(CACHET_TEST_DATA);
  for (const char* dir : {"oracle/snapshots", "oracle/workloads", "oracle-h100/snapshots", "derived", "oracle/results",
                          "oracle-h100/results", "oracle-issue23/results"}) {
    std::vector<std::string> files;
    for (const auto& f : fs::directory_iterator(root / dir)) {
      const std::string name = f.path().filename().string();
      // res_issue23_deferred_free*: props_gpu_test's pointer probe (hex-string addresses, no steps),
      // not a recording the tools read (tests/data/oracle-issue23/README.md).
      if (name.starts_with("res_issue23_deferred_free")) continue;
      if (name.ends_with(".pickle.gz") || name.ends_with(".trace.json.gz") ||
          (std::string(dir).ends_with("results") && name.ends_with(".json.gz")))
        files.push_back(f.path().string());
    }
    std::sort(files.begin(), files.end());
    // A run that ran out of memory under a cap: gpt2_train_oom_cap12g's 12 GiB; t5_train_oom's
    // set_per_process_memory_fraction(0.02) of the H200's 150109880320 bytes (t5_train_oom.json).
    for (const auto& f : files)
      out.emplace_back(f, f.find("t5_train_oom") != std::string::npos ? " --cap 3002197606"
                          : f.find("oom") != std::string::npos      ? " --cap 12G"
                                                                    : "");
  }
  return out;
}

// The `<td>`s of the report's row of the recorded configuration.
std::vector<std::string> recorded_row(const std::string& page) {
  std::vector<std::string> cells;
  auto at = page.find("<tr class=\"recorded\">");
  if (at == std::string::npos) return cells;
  const auto end = page.find("</tr>", at);
  while ((at = page.find("<td", at)) < end) {
    const auto from = page.find('>', at) + 1;
    const auto to = page.find("</td>", from);
    cells.push_back(page.substr(from, to - from));
    at = to;
  }
  return cells;
}

// 2: one peak reserved for the recorded configuration in replay, tune, explain, summary, plot and
// report, on every trace and pickle of the repository. tune and explain replay it with the
// recorded addresses, as replay does. The report's figures: its table's row of the recorded
// configuration and its explain block ("instead of ..." under a fix, the moment's reserved bytes
// at a peak).
TEST(WhatIf, OnePeakForTheRecordedConfigurationEverywhere) {
  const auto traces = every_repo_trace();
  EXPECT_EQ(traces.size(), 89u);  // 9 pickles, 4 JSON snapshots, 76 recordings: a new file is compared too
  for (const auto& [trace, opts] : traces) {
    SCOPED_TRACE(trace + opts);
    Out r = run("replay " + trace + opts + " --json");
    ASSERT_EQ(r.rc, 0) << r.err;
    const long long peak = first_peak(r.out);
    ASSERT_GT(peak, 0);
    const std::string human = cachet::replay::human_bytes(peak);
    Out t = run("tune " + trace + opts + " --json --threads 2");
    ASSERT_EQ(t.rc, 0) << t.err;
    EXPECT_EQ(first_peak(t.out.substr(t.out.find("\"results\""))), peak);
    Out e = run("explain " + trace + opts + " --json");
    ASSERT_EQ(e.rc, 0) << e.err;
    EXPECT_EQ(json_number(e.out, "recorded_configuration_peak_reserved"), peak);
    const bool fix = e.out.find("\"baseline_peak_reserved\"") != std::string::npos;
    const bool at_peak = e.out.find("\"kind\": \"peak\"") != std::string::npos;  // no OOM: explained at the peak
    if (fix) {
      EXPECT_EQ(json_number(e.out, "baseline_peak_reserved"), peak);
    }
    if (at_peak) {
      EXPECT_EQ(json_number(e.out, "reserved"), peak);
    }
    Out s = run("summary " + trace + opts);
    ASSERT_EQ(s.rc, 0) << s.err;
    EXPECT_NE(s.out.find("== at peak reserved (" + human + "), trace event"), std::string::npos) << s.out;
    const fs::path svg = tmp_dir() / "p.svg", html = tmp_dir() / "p.html";
    Out p = run("plot " + trace + opts + " -o " + svg.string());
    ASSERT_EQ(p.rc, 0) << p.err;
    EXPECT_NE(slurp(svg).find("peak reserved " + human + " ("), std::string::npos);
    Out h = run("report " + trace + opts + " -o " + html.string());
    ASSERT_EQ(h.rc, 0) << h.err;
    const std::string page = slurp(html);
    const auto row = recorded_row(page);
    ASSERT_EQ(row.size(), 9u) << page.substr(0, 2000);
    EXPECT_EQ(row[4], human);  // # | configuration | OOMs | failed allocations | peak reserved
    if (fix) {
      // The fix's peak against this one: "X instead of <peak>", "<peak>, unchanged", or, for two that
      // print alike, "<peak> = N bytes instead of <peak's bytes> bytes".
      EXPECT_TRUE(page.find("instead of " + human + " (the recorded configuration") != std::string::npos ||
                  page.find(human + ", unchanged (the recorded configuration") != std::string::npos ||
                  page.find("instead of " + std::to_string(peak) + " bytes (the recorded configuration") !=
                      std::string::npos);
    }
    if (at_peak) {
      EXPECT_NE(page.find(fmt_bytes_line(peak)), std::string::npos);
    }
  }
}

// 5: impossible caps are refused, ignored or replaced keys said.
TEST(WhatIf, ImpossibleCapsAndIgnoredKeysAreSaid) {
  for (const char* cmd : {"replay ", "tune ", "explain ", "summary "}) {
    Out o = run(cmd + kOom + " --cap 100G");
    EXPECT_EQ(o.rc, 2) << cmd;
    EXPECT_EQ(o.err.substr(o.err.find(':') + 2),
              "--cap 100G: more than this process could get on the device (78.43 GiB: reserved 11.88 GiB + 66.55 GiB "
              "free at the trace's out-of-memory entry); a cap above it changes nothing. Give a smaller cap, or the "
              "device's memory with --device-memory if the device had more\n")
        << cmd;
  }
  Out o = run("replay " + kOom + " --cap 18446744073709551615");
  EXPECT_EQ(o.rc, 2);
  EXPECT_EQ(o.err, "cachet replay: --cap 18446744073709551615: too large (more than 8 EiB); give the size in bytes or "
                   "with K/M/G/T\n");
  o = run("replay " + kOom + " --cap 12G --conf backend:cudaMallocAsync");
  ASSERT_EQ(o.rc, 0) << o.err;
  EXPECT_NE(flat(o.out).find("warning: backend:cudaMallocAsync (in 'backend:cudaMallocAsync') is CUDA's own "
                             "stream-ordered allocator, not the caching allocator: there is nothing of it to replay; its "
                             "row is the native caching allocator's\n"),
            std::string::npos)
      << o.out;
  o = run("replay " + kOom + " --cap 12G --conf per_process_memory_fraction:0.05");
  ASSERT_EQ(o.rc, 0) << o.err;
  EXPECT_NE(flat(o.out).find("warning: per_process_memory_fraction (in 'per_process_memory_fraction:0.05'): 0.05, a cap "
                             "of 3.92 GiB, is replaced by the cap in force, 12.00 GiB, as a program's "
                             "set_per_process_memory_fraction() call replaces it in PyTorch; leave --cap out to replay "
                             "under it\n"),
            std::string::npos)
      << o.out;
}

// 4: C++ frames (stacks="all") do not break explain: the site is the first Python frame outside
// PyTorch, the C++ frames are counted in one line, no frame line is longer than 200 characters.
// tests/data/derived/gpt2_oom_cpp_stacks.pickle.gz: the OOM snapshot with 29 C++ frames put
// before every stack (tests/data/derived/make_cpp_stacks.py).
TEST(WhatIf, CppStacksDoNotBreakExplain) {
  Out o = run("explain " + std::string(CACHET_TEST_DATA) + "/derived/gpt2_oom_cpp_stacks.pickle.gz --cap 12G");
  ASSERT_EQ(o.rc, 0) << o.err;
  std::istringstream in(o.out);
  for (std::string line; std::getline(in, line);)  // stack frames and sites, indented by four
    if (line.starts_with("    ")) EXPECT_LE(line.size(), 200u) << line.substr(0, 120);
  EXPECT_EQ(o.out.find("torch::unwind::unwind() (??:0)"), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("     3.94 GiB     48 blocks  forward (activations.py:66)\n"), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("    cross_entropy /opt/torch/.venv/lib/python3.12/site-packages/torch/nn/functional.py:3504\n"),
            std::string::npos);
  EXPECT_NE(o.out.find("    (29 C++ frames left out, PyTorch's own (torch::unwind, c10::, at::, ?\?); --json lists "
                       "them)\n"),
            std::string::npos)
      << o.out;
}

// Expectations: the headroom of each pick under the cap, and the caveat of a trace that ends at
// its out-of-memory error (explain and tune).
TEST(WhatIf, HeadroomAndTheCaveatOfATraceThatEndsAtTheOom) {
  Out e = run("explain " + kOom + " --cap 12G");
  ASSERT_EQ(e.rc, 0) << e.err;
  EXPECT_NE(e.out.find("  headroom under the cap: 2.00 MiB = 2097152 bytes (peak reserved 12.00 GiB of 12.00 GiB); close "
                       "to the cap (under 256.00 MiB): on the GPU, other libraries' memory or another allocation order "
                       "can still make it fail, so prefer a pick with more headroom or a slightly larger cap\n"),
            std::string::npos)
      << e.out;
  EXPECT_NE(e.out.find("note: the trace ends at its out-of-memory error (trace event 5754; nothing is allocated after "
                       "it): what the program would have done next is not in the trace, so a configuration or cap that "
                       "avoids the error is judged on the steps before it only; record a run that gets past it (a "
                       "larger cap) to see the rest\n"),
            std::string::npos)
      << e.out;
  Out t = run("tune " + kOom + " --cap 12G");
  ASSERT_EQ(t.rc, 0) << t.err;
  EXPECT_NE(flat(t.out).find("Headroom under the cap: 2.00 MiB = 2097152 bytes (peak reserved 12.00 GiB of 12.00 GiB)"),
            std::string::npos)
      << t.out;
  EXPECT_NE(flat(t.out).find("Caveat: the trace ends at its out-of-memory error (trace event 5754;"), std::string::npos)
      << t.out;
}

// 6 (part): `cachet help`, tune --top 0, the device memory when nothing tells it (explain, report).
TEST(WhatIf, SmallerItems) {
  Out h = run("help");
  EXPECT_EQ(h.rc, 0);
  EXPECT_NE(h.out.find("Usage: "), std::string::npos) << h.out << h.err;
  h = run("help replay");
  EXPECT_EQ(h.rc, 0);
  EXPECT_NE(h.out.find(" replay [OPTIONS] TRACE"), std::string::npos) << h.out << h.err;
  const std::string mlp = kData + "snapshots/mlp_train.pickle.gz";
  Out t = run("tune " + mlp + " --top 0");
  ASSERT_EQ(t.rc, 0) << t.err;
  const auto from = t.out.find("(0 of 57):\n");
  ASSERT_NE(from, std::string::npos) << t.out;
  const std::string rows = t.out.substr(from, t.out.find("\nVerdict for") - from);
  EXPECT_EQ(rows.find("policy:cachet"), std::string::npos) << rows;
  EXPECT_EQ(std::count(rows.begin(), rows.end(), '\n'), 4) << rows;  // the header and the table's head only
  Out e = run("explain " + mlp);
  ASSERT_EQ(e.rc, 0) << e.err;
  EXPECT_NE(e.out.find("configuration: (default); device memory not recorded (no device limit)\n"), std::string::npos)
      << e.out;
}

// 7 (part): the report's explain block wraps instead of overflowing, its legend says what the
// dashed line is; free memory is the same grey in plot and report.
TEST(WhatIf, ChartsSayWhatTheyDraw) {
  const fs::path html = tmp_dir() / "r.html", svg = tmp_dir() / "r.svg";
  Out r = run("report " + kOom + " --cap 12G -o " + html.string());
  ASSERT_EQ(r.rc, 0) << r.err;
  const std::string page = slurp(html);
  EXPECT_NE(page.find("pre{background:#f7f7f7;padding:10px;white-space:pre-wrap;overflow-wrap:anywhere;"),
            std::string::npos);
  EXPECT_NE(page.find("the dashed vertical line marks when peak reserved was reached"), std::string::npos);
  EXPECT_NE(page.find("#e2e8f0"), std::string::npos);
  Out p = run("plot " + kOom + " --cap 12G -o " + svg.string());
  ASSERT_EQ(p.rc, 0) << p.err;
  EXPECT_NE(slurp(svg).find("fill=\"#e2e8f0\""), std::string::npos);
}

// 3: the request that ran out of memory is replayed at the size the program asked for, from the
// best source there is, and the output says which; PyTorch's oom entry records only the rounded
// size. res_pressure_msplit256_r4 (roundup_power2_divisions:4): op 776 of ops/ops_pressure asked
// for 1156508816 bytes, the entry records 1342177280. The same recording copied away from its op
// list: the rounded size, said to be assumed. The GPT-2 pickle: trace event 1154, the first
// step's allocation with the same stack (1646821376 bytes, a multiple of 512: no rounding).
TEST(WhatIf, TheFailedRequestIsReplayedAtItsRequestedSize) {
  const std::string r4 = kData + "results/res_pressure_msplit256_r4.json.gz";
  Out e = run("explain " + r4);
  ASSERT_EQ(e.rc, 0) << e.err;
  EXPECT_NE(e.out.find("The first out-of-memory, at trace event 1317: a request of 1.08 GiB (1156508816 bytes) on "
                       "stream 1044175696, large pool.\n  rounded to 1342177280 bytes (docs/pytorch-allocator.md §1.2)\n"
                       "  the size replayed: what the program asked for, from op 776 of the op list "
                       "ops_pressure.json.gz; PyTorch's oom entry records 1342177280 bytes, the size after its "
                       "rounding\n  (no stacks recorded"),
            std::string::npos)
      << e.out;
  Out r = run("replay " + r4);
  EXPECT_NE(flat(r.out).find("the request that ran out of memory in the recorded run (trace event 1317) is replayed at "
                             "1156508816 bytes, what the program asked for, from op 776 of the op list "
                             "ops_pressure.json.gz; PyTorch's oom entry records 1342177280 bytes, the size after its "
                             "rounding; of the 19 requests that ran out of memory, 19 are sized from the op list, 0 from "
                             "an earlier allocation with the same stack, 0 from one at the same place in a repeated "
                             "step, 0 at the rounded size (assumed)\n"),
            std::string::npos)
      << r.out;
  // At a cap where the requests succeed, peak requested counts what the program asked for.
  Out j = run("replay " + r4 + " --cap 20G --json");
  EXPECT_EQ(json_number(j.out, "peak_requested"), 7086577616LL);

  const fs::path away = tmp_dir() / "no_op_list";
  fs::create_directories(away);
  fs::copy_file(r4, away / "res_pressure_msplit256_r4.json.gz", fs::copy_options::overwrite_existing);
  const std::string copy = (away / "res_pressure_msplit256_r4.json.gz").string();
  e = run("explain " + copy);
  ASSERT_EQ(e.rc, 0) << e.err;
  EXPECT_NE(e.out.find("a request of 1.25 GiB (1342177280 bytes) on stream 1044175696, large pool.\n  the size "
                       "replayed: the size after PyTorch's rounding that its oom entry records: nothing in the trace "
                       "tells the request (no op list, no earlier allocation that rounds to it with its stack or at "
                       "its place in a repeated step), so the rounded size is assumed; the program asked for 1073741825 to 1342177280 bytes\n"),
            std::string::npos)
      << e.out;
  j = run("replay " + copy + " --cap 20G --json");
  EXPECT_EQ(json_number(j.out, "peak_requested"), 7261474569LL);
  Out t = run("tune " + copy + " --top 1");
  EXPECT_NE(flat(t.out).find("0 from an earlier allocation with the same stack, 0 from one at the same place in a "
                             "repeated step, 19 at the rounded size (assumed)\n"),
            std::string::npos)
      << t.out;

  e = run("explain " + kOom + " --cap 12G");
  ASSERT_EQ(e.rc, 0) << e.err;
  EXPECT_NE(e.out.find("a request of 1.53 GiB (1646821376 bytes) on stream 0, large pool.\n  the size replayed: the "
                       "size of trace event 1154, an earlier allocation with the same stack whose size rounds to the "
                       "oom entry's 1646821376 bytes (the entry records the size after PyTorch's rounding, not the "
                       "request)\n"),
            std::string::npos)
      << e.out;
  // No stacks at all (tests/data/derived/gpt2_oom_no_frames.pickle.gz, as the autograd thread's
  // requests have none): the same request of step 0, found by the 8 allocations before it.
  e = run("explain " + std::string(CACHET_TEST_DATA) + "/derived/gpt2_oom_no_frames.pickle.gz --cap 12G");
  ASSERT_EQ(e.rc, 0) << e.err;
  EXPECT_NE(e.out.find("  the size replayed: the size of trace event 1154, an earlier allocation at the same place in "
                       "a repeated step (no stack recorded for either; the 8 allocations before each have the same "
                       "sizes and streams) whose size rounds to the oom entry's 1646821376 bytes (the entry records "
                       "the size after PyTorch's rounding, not the request)\n"),
            std::string::npos)
      << e.out;
  // At the recorded cap, peak requested is PyTorch's requested_bytes.all.peak
  // (gpt2_train_oom_cap12g.json): the failed request adds nothing.
  j = run("replay " + kOom + " --cap 12G --json");
  EXPECT_EQ(json_number(j.out, "peak_requested"), 12565134024LL);
  e = run("explain " + kOom + " --cap 12G --json");
  EXPECT_NE(e.out.find("\"size\": 1646821376, \"rounded\": 1646821376, \"recorded_size\": 1646821376, "
                       "\"size_source\": \"same_stack\""),
            std::string::npos)
      << e.out.substr(0, 600);
}

// Item 2, as issue 35 makes it: explain's recommendation is tune's (fewest OOMs, then peak
// reserved: the most headroom among those without OOM), and the change with the fewest keys is a
// second, labelled line. res_pressure_default at a 6.4 GiB cap: tune's pick
// max_split_size_mb:128,garbage_collection_threshold:0.6 (2 keys) peaks 319.60 MiB under the cap;
// policy:cachet (1 key, lower peak than expandable_segments:True, the other 1-key change) is not
// clearly better, so it is the second line only.
TEST(WhatIf, ExplainPrefersAFixWithHeadroom) {
  Out e = run("explain " + kData + "results/res_pressure_default.json.gz --cap 6.4G");
  ASSERT_EQ(e.rc, 0) << e.err;
  EXPECT_NE(e.out.find("without out-of-memory):\n"
                       "  PYTORCH_CUDA_ALLOC_CONF=\"max_split_size_mb:128,garbage_collection_threshold:0.6\"\n"
                       "  2 keys changed: max_split_size_mb, garbage_collection_threshold\n"),
            std::string::npos)
      << e.out;
  EXPECT_NE(e.out.find("  headroom under the cap: 319.60 MiB = 335124889 bytes (peak reserved 6.09 GiB of 6.40 GiB)\n"
                       "The change with the fewest keys that also avoids it (a second answer, not the "
                       "recommendation): CACHET_ALLOC_CONF=\"policy:cachet\", 1 key changed (policy); peak reserved "
                       "6.00 GiB; headroom under the cap: 409.60 MiB = 429496729 bytes (peak reserved 6.00 GiB of "
                       "6.40 GiB)\n"),
            std::string::npos)
      << e.out;
  Out j = run("explain " + kData + "results/res_pressure_default.json.gz --cap 6.4G --json");
  EXPECT_NE(j.out.find("\"recommendation\": {\"variable\": \"PYTORCH_CUDA_ALLOC_CONF\", \"conf\": "
                       "\"max_split_size_mb:128,garbage_collection_threshold:0.6\", \"keep_recorded\": false, "
                       "\"recommend_plugin\": false, \"only_plugin_avoids\": false, \"native\": "
                       "\"max_split_size_mb:128,garbage_collection_threshold:0.6\", \"fewest_keys\": \"policy:cachet\"}"),
            std::string::npos)
      << j.out;
  EXPECT_NE(j.out.find("\"smaller_fix_passed_over\": {\"variable\": \"CACHET_ALLOC_CONF\", \"conf\": "
                       "\"policy:cachet\""),
            std::string::npos);
  // Where nothing but the pick avoids it, no second line (the README's run).
  Out k = run("explain " + kOom + " --cap 12G");
  EXPECT_EQ(k.out.find("fewest keys"), std::string::npos) << k.out;
}

// Item 2 in tune: its ranking already puts the most headroom first among configurations with as
// few OOMs (lower peak reserved); the plug-in is recommended over PyTorch's allocator's pick when,
// with no OOM, it leaves at least 256 MiB under the cap where that pick leaves less.
// oracle-issue23 res_threads_expandable under a what-if cap of 2100M (2202009600 bytes): the
// recorded expandable_segments:True, kept, leaves 154 MiB (peak reserved 2040528896), policy:cachet
// 304 MiB with 7.7% less peak reserved (short of the 10% asked otherwise); with no cap it is not
// recommended. (oracle-h100 res_pools_gccap showed this until its replay entered its pools where
// its op list does: its peak reserved is PyTorch's 2.40 GiB since, and the plug-in's 19.1% less.)
TEST(WhatIf, TuneRecommendsThePlugInForItsHeadroom) {
  const std::string f = std::string(CACHET_TEST_DATA) + "/oracle-issue23/results/res_threads_expandable.json.gz";
  Out t = run("tune " + f + " --cap 2100M");
  ASSERT_EQ(t.rc, 0) << t.err;
  EXPECT_NE(t.out.find("With cachet's plug-in (python/README.md): CACHET_ALLOC_CONF=\"policy:cachet\"\n"
                       "  Peak reserved 1.75 GiB instead of 1.90 GiB (7.7% less); retries unchanged (0); device calls 254\n"
                       "  instead of 132. Headroom under the cap: 304.00 MiB = 318767104 bytes (peak reserved 1.75 GiB of\n"
                       "  2.05 GiB).\n"),
            std::string::npos)
      << t.out;
  Out j = run("tune " + f + " --cap 2100M --json");
  EXPECT_NE(j.out.find("\"recommend_plugin\": true"), std::string::npos);
  EXPECT_EQ(json_number(j.out.substr(j.out.find("\"results\"")), "peak_reserved"), 2040528896);
  Out n = run("tune " + f + " --json");
  EXPECT_NE(n.out.find("\"recommend_plugin\": false"), std::string::npos);
}

// Item 2: explain names the rounding when it is a cause. res_pressure_rdivlist
// (roundup_power2_divisions:[256:1,512:2,1024:4,>:8]) at its first out-of-memory: the live blocks
// hold 369.27 MiB beyond what was asked, the request (678795896 bytes) was rounded up to 805306368,
// and the request lacked 68 MiB under the 6 GiB cap. res_pressure_msplit256_r4's rounding (628 MiB)
// is short of what its request lacked (700 MiB): not named there.
TEST(WhatIf, ExplainNamesRoundingWhenItIsACause) {
  Out e = run("explain " + kData + "results/res_pressure_rdivlist.json.gz");
  ASSERT_EQ(e.rc, 0) << e.err;
  EXPECT_NE(e.out.find("  rounding is a cause: the live blocks hold 369.27 MiB more than was asked for and the request "
                       "itself was rounded up by 120.65 MiB (678795896 to 805306368 bytes), 489.92 MiB of rounding in "
                       "all, at least the 68.00 MiB the request lacked under the cap; reserved but not allocated was "
                       "1.54 GiB; the recorded configuration sets roundup_power2_divisions, which rounds requests up "
                       "beyond 512 bytes\n"),
            std::string::npos)
      << e.out;
  Out j = run("explain " + kData + "results/res_pressure_rdivlist.json.gz --json");
  EXPECT_NE(j.out.find("\"request_rounding\": 126510080, \"lacked\": 71303168, \"rounding_is_a_cause\": true"),
            std::string::npos);
  Out n = run("explain " + kData + "results/res_pressure_msplit256_r4.json.gz --json");
  EXPECT_NE(n.out.find("\"request_rounding\": 185668096, \"lacked\": 734003200, \"rounding_is_a_cause\": false"),
            std::string::npos);
  EXPECT_EQ(run("explain " + kData + "results/res_pressure_msplit256_r4.json.gz").out.find("rounding is a cause"),
            std::string::npos);
  // An oracle recording writes no free bytes in its oom rows: nothing is said of them.
  EXPECT_EQ(e.out.find("the driver reported"), std::string::npos) << e.out;
}

// 6 (part): check-conf's suggestion for options split by the shell is a string it accepts, and
// --source cachet names the keys policy:cachet ignores, as replay does.
TEST(WhatIf, CheckConfSuggestsWhatItAcceptsAndNamesIgnoredKeys) {
  Out c = run("check-conf expandable_segments:True, max_split_size_mb:128");
  EXPECT_EQ(c.rc, 2);
  EXPECT_EQ(c.err, "error: check-conf takes one string, got 2 arguments; quote the string, with its options separated "
                   "by ',': cachet check-conf 'expandable_segments:True,max_split_size_mb:128'\n");
  EXPECT_EQ(run("check-conf 'expandable_segments:True,max_split_size_mb:128'").rc, 0);
  c = run("check-conf --source cachet 'policy:cachet,roundup_power2_divisions:4'");
  EXPECT_EQ(c.rc, 0);
  EXPECT_EQ(c.err, "warning: policy:cachet does not use roundup_power2_divisions: it has no effect under it\n");
}

// What was left of issue 25 (a second pass).
// 1: conform's usage line names its files plainly, not CLI11's "files(1x)"; a third file is refused.
TEST(WhatIf, ConformUsageNamesItsFiles) {
  Out h = run("conform --help");
  EXPECT_EQ(h.rc, 0);
  EXPECT_NE(h.out.find("conform [OPTIONS] FILE...\n"), std::string::npos) << h.out;
  EXPECT_EQ(h.out.find("(1x)"), std::string::npos) << h.out;
  Out c = run("conform a b c");
  EXPECT_EQ(c.rc, 2);
  EXPECT_EQ(c.err, "cachet conform: 3 files given; expected OPS RESULT, or RESULT alone\n");
}

// 2: the final stats line is printed when the stats sidecar exists and the snapshot lists no
// segment (workloads/gpt2_train: "segments": [], beside gpt2_train.stats.json).
TEST(WhatIf, FinalStatsWithoutSegments) {
  Out o = run("replay " + kData + "workloads/gpt2_train.trace.json.gz");
  ASSERT_EQ(o.rc, 0) << o.err;
  EXPECT_NE(o.out.find("(default)      12.68 GiB  14.24 GiB      1.123     0        0         154/0\n"
                       "final stats: all 122 memory_stats() keys equal PyTorch's recorded ones\n"),
            std::string::npos)
      << o.out;
}

// 3: explain's note on a replay that runs out of memory where the recording did not is a sentence.
TEST(WhatIf, TheReplaysOwnOomIsSaidInASentence) {
  Out e = run("explain " + kData + "snapshots/mlp_train.pickle.gz --cap 100M --device-memory 80G");
  ASSERT_EQ(e.rc, 0) << e.err;
  EXPECT_NE(e.out.find("note: the recorded run had no out-of-memory error; this replay has one (a smaller cap or "
                       "device memory than the recording's); what follows explains the replay's first "
                       "out-of-memory error\n"),
            std::string::npos)
      << e.out;
}

// 5: both charts draw the cap as a labelled horizontal line, and only when a cap applies.
TEST(WhatIf, ChartsDrawTheCap) {
  const fs::path html = tmp_dir() / "cap.html", svg = tmp_dir() / "cap.svg";
  Out p = run("plot " + kOom + " --cap 12G -o " + svg.string());
  ASSERT_EQ(p.rc, 0) << p.err;
  const std::string s = slurp(svg);
  EXPECT_NE(s.find("<g id=\"cap\"><line x1=\"90.0\" y1=\"172.0\" x2=\"1160.0\" y2=\"172.0\" stroke=\"#c0392b\" "
                   "stroke-width=\"1.2\"/><text x=\"1156.0\" y=\"168.0\" font-size=\"11\" fill=\"#c0392b\" "
                   "text-anchor=\"end\">cap 12.00 GiB</text></g>\n"),
            std::string::npos)
      << s.substr(0, 4000);
  Out r = run("report " + kOom + " --cap 12G -o " + html.string());
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(slurp(html).find("<g class=\"cap\"><line x1=\"70\" y1=\"76.0\" x2=\"1080\" y2=\"76.0\" stroke=\"#c53030\" "
                              "stroke-width=\"1.2\"/><text x=\"1076\" y=\"72.0\" class=\"tick\" "
                              "text-anchor=\"end\">cap 12.00 GiB</text></g>\n"),
            std::string::npos);
  EXPECT_NE(slurp(html).find("; the dashed vertical line marks when peak reserved was reached; the red horizontal line "
                             "is the cap, 12.00 GiB.</p>"),
            std::string::npos);
  p = run("plot " + kData + "snapshots/mlp_train.pickle.gz -o " + svg.string());
  ASSERT_EQ(p.rc, 0) << p.err;
  EXPECT_EQ(slurp(svg).find("cap "), std::string::npos);
}

// 4: the fallback to synthetic addresses is a note that says what happened and that it is
// harmless, not a device call that "failed" (oracle-issue23 res_threads_default: its pools are
// entered on other threads, so their windows are inferred from the snapshot, and the replay's
// device calls leave PyTorch's at its seventh (a 20 MiB segment where PyTorch made a 2 MiB one); oracle-h100 res_graphs_default, which left
// them at its sixth while its windows were inferred, keeps them all since its op list gives them).
TEST(WhatIf, TheAddressFallbackIsAHarmlessNote) {
  Out o = run("replay " + std::string(CACHET_TEST_DATA) + "/oracle-issue23/results/res_threads_default.json.gz");
  ASSERT_EQ(o.rc, 0) << o.err;
  const std::string out = flat(o.out);
  EXPECT_NE(out.find("\nnote ((default)): the recorded addresses could not be kept to the end (the replay's device "
                     "call #7 is a cudaMalloc of 20971520 bytes after 0 segment frees, the recording's was a cudaMalloc "
                     "of 2097152 bytes after 0), so the replay ran again with synthetic addresses; this is harmless: "
                     "every op is replayed, only the addresses are not the recorded ones\n"),
            std::string::npos)
      << o.out;
  EXPECT_EQ(out.find("failed"), std::string::npos) << o.out;
  Out g = run("replay " + std::string(CACHET_TEST_DATA) + "/oracle-h100/results/res_graphs_default.json.gz --json");
  ASSERT_EQ(g.rc, 0) << g.err;
  EXPECT_NE(g.out.find("\"addresses\": \"recorded\", "), std::string::npos) << g.out.substr(0, 1000);
}

// Issue 25: an out-of-memory inside use_mem_pool is replayed where PyTorch had it and explained,
// its pool named (oracle-h100 res_flip_pool_retry, a 60 MiB cap, ops a0 f0 pb0 a1 pe0 a2 f2 pr0 e:
// a0's 30 MiB segment is cached in the default pool when a1, 40 MiB inside the pool, fails, for
// inside a pool PyTorch does no free-and-retry of the default pools, docs/pytorch-allocator.md
// §14.6; a2, the same size after the pool is left, succeeds by it). Before the replay entered the
// pool from the op list (no segment is left at the end to name it), explain exited 2: "the replay
// ... did not" run out of memory.
TEST(WhatIf, ExplainsAnOutOfMemoryInsideAPrivatePool) {
  const std::string f = std::string(CACHET_TEST_DATA) + "/oracle-h100/results/res_flip_pool_retry.json.gz";
  Out e = run("explain " + f);
  ASSERT_EQ(e.rc, 0) << e.err;
  EXPECT_EQ(e.err, "");
  for (const char* line :
       {"\nThe first out-of-memory, at trace event 4: a request of 40.00 MiB (41943040 bytes) on stream 0, large pool, "
        "in the private pool (0, 1) (use_mem_pool).\n",
        "\n  in a private pool PyTorch does not free the default pools' cached segments and retry, as it does outside "
        "one (no free-and-retry while use_mem_pool or a capture is under way, docs/pytorch-allocator.md §14.6): the "
        "default pools' 1 segment with no block in use, 30.00 MiB (31457280 bytes), stayed reserved; releasing it "
        "(torch.cuda.empty_cache() before entering the pool) would have made room for the request, which lacked "
        "10.00 MiB\n",
        "\n  reserved    30.00 MiB         31457280 bytes (segments from the device)\n",
        "\n  allocated         0 B                0 bytes (blocks in use)\n",
        "\n  private pools   30.00 MiB      1 blocks  in pools other than the private pool (0, 1) the request went to\n",
        "\nRecommended change (cachet tune's pick: fewest out-of-memory errors, then lowest peak reserved; cachet's "
        "plug-in only when clearly better; by replay: 63 configurations tried, 0 without out-of-memory):\n  none of "
        "them avoids it.\n",
        // a1 and a2 both fit only when the cap holds the pool's cached 40 MiB and a2's 40 MiB
        "\n  The recorded configuration fits under a cap of 80.00 MiB (83886080 bytes) and under every larger one "
        "(found by replay to 2 MiB).\n"})
    EXPECT_NE(e.out.find(line), std::string::npos) << line << "\n" << e.out;

  Out j = run("explain " + f + " --json");
  ASSERT_EQ(j.rc, 0) << j.err;
  EXPECT_NE(j.out.find("\"moment\": {\"kind\": \"oom\", \"op\": 3, \"event\": 4, \"size\": 41943040, "),
            std::string::npos)
      << j.out;
  EXPECT_NE(j.out.find("\"stream\": 0, \"pool\": \"large\", \"private_pool\": [0, 1], \"pool_entry\": "
                       "\"use_mem_pool\", \"default_idle_segments\": 1, \"default_idle_bytes\": 31457280, "),
            std::string::npos)
      << j.out;
  EXPECT_EQ(json_number(j.out, "reserved"), 31457280);
  EXPECT_EQ(json_number(j.out, "lacked"), 10485760);
  EXPECT_EQ(json_number(j.out, "cap_needed"), 83886080);
  EXPECT_EQ(json_number(j.out, "recorded_configuration_peak_reserved"), 41943040);  // PyTorch's peak

  // replay: one out-of-memory and one retry, as PyTorch had them; every final key PyTorch's.
  Out r = run("replay " + f + " --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(json_number(r.out, "num_ooms"), 1);
  EXPECT_EQ(json_number(r.out, "num_alloc_retries"), 1);
  EXPECT_EQ(json_number(r.out, "oom_requests_ok"), 0);
  EXPECT_EQ(json_number(r.out, "peak_reserved"), 41943040);
  Out t = run("replay " + f);
  ASSERT_EQ(t.rc, 0) << t.err;
  EXPECT_NE(flat(t.out).find("\nfinal stats: all 122 memory_stats() keys equal PyTorch's recorded ones\n"),
            std::string::npos)
      << t.out;
  std::string words;  // the text with every run of spaces and newlines as one space
  for (char ch : t.out)
    if (ch != ' ' && ch != '\n') words += ch;
    else if (!words.empty() && words.back() != ' ') words += ' ';
  EXPECT_NE(words.find(" private pools: the op list ops_flip_pool_retry.json.gz enters 1 private pool (its "
                       "use_mem_pool and capture ops, as PyTorch's front end calls the allocator for them); the "
                       "replay enters and leaves them where it does pool (0, 1): no allocation went to it; "
                       "use_mem_pool 1 time; at the end 0 segments, 0 B reserved, 0 B allocated pools released (a "
                       "MemPool dropped, a graph reset): 1; the user's empty_cache() calls are the op list's "),
            std::string::npos)
      << t.out;
  // report: its explain block names the pool.
  const fs::path html = tmp_dir() / "pool.html";
  Out h = run("report " + f + " -o " + html.string());
  ASSERT_EQ(h.rc, 0) << h.err;
  EXPECT_NE(slurp(html).find("on stream 0, large pool, in the private pool (0, 1) (use_mem_pool).\n"),
            std::string::npos);
}

// 7: trace-info shows each out-of-memory entry: where it is, the failed request, the free memory
// it records (an oracle recording writes none).
TEST(WhatIf, TraceInfoShowsTheOutOfMemoryEntry) {
  Out o = run("trace-info " + kOom);
  ASSERT_EQ(o.rc, 0) << o.err;
  EXPECT_NE(o.out.find("  out of memory: trace event 5754 of 5851: a request of 1.53 GiB = 1646821376 bytes (after "
                       "PyTorch's rounding) on stream 0; the device had 66.55 GiB = 71462748160 bytes free (recorded "
                       "in the entry)\n"),
            std::string::npos)
      << o.out;
  o = run("trace-info " + kData + "results/res_pressure_msplit256_r4.json.gz");
  ASSERT_EQ(o.rc, 0) << o.err;
  EXPECT_NE(o.out.find("  out of memory: trace event 1317 of 2612: a request of 1.25 GiB = 1342177280 bytes (after "
                       "PyTorch's rounding) on stream 1044175696; the device's free memory is not recorded in the "
                       "entry\n"),
            std::string::npos)
      << o.out;
  EXPECT_EQ(run("trace-info " + kData + "snapshots/mlp_train.pickle.gz").out.find("out of memory"), std::string::npos);
}

// 6: --fraction F beside --cap: the cap is size_t(F x the device memory), here what the trace's
// out-of-memory entry shows the process could get (84213432320 bytes): 0.15 x that = 12632014848;
// with --device-memory 80G, 0.5 of it. Both given, or no device memory known: a clear error.
TEST(WhatIf, FractionGivesTheCapAsPyTorchSetsIt) {
  Out o = run("replay " + kOom + " --fraction 0.15");
  ASSERT_EQ(o.rc, 0) << o.err;
  EXPECT_NE(o.out.find("memory cap: 11.76 GiB = 12632014848 bytes (set_per_process_memory_fraction, --cap)\n"),
            std::string::npos)
      << o.out;
  for (const char* cmd : {"tune", "explain", "summary"}) {
    Out c = run(std::string(cmd) + " " + kOom + " --fraction 0.15");
    EXPECT_EQ(c.rc, 0) << cmd << c.err;
    if (std::string(cmd) != "summary") EXPECT_NE(c.out.find("11.76 GiB"), std::string::npos) << cmd << c.out;
  }
  const std::string mlp = kData + "snapshots/mlp_train.pickle.gz";
  o = run("replay " + mlp + " --fraction 0.5 --device-memory 80G");
  ASSERT_EQ(o.rc, 0) << o.err;
  EXPECT_NE(o.out.find("memory cap: 40.00 GiB = 42949672960 bytes"), std::string::npos) << o.out;
  o = run("replay " + kOom + " --fraction 0.15 --cap 12G");
  EXPECT_EQ(o.rc, 2);
  EXPECT_EQ(o.err, "cachet replay: --cap 12G and --fraction 0.15 both given: give one (--fraction F is a cap of F x "
                   "the device's memory)\n");
  o = run("plot " + mlp + " --fraction 0.5 -o " + (tmp_dir() / "f.svg").string());
  EXPECT_EQ(o.rc, 2);
  EXPECT_EQ(o.err, "cachet plot: --fraction 0.5: the device's memory is not known (not recorded beside the trace, and "
                   "the trace has no out-of-memory entry): give it with --device-memory (e.g. --device-memory 80G), "
                   "or give the cap in bytes with --cap\n");
  o = run("report " + kOom + " --fraction 1.5 -o " + (tmp_dir() / "f.html").string());
  EXPECT_EQ(o.rc, 2);
  EXPECT_EQ(o.err, "cachet report: --fraction 1.5: not a fraction in (0, 1] (set_per_process_memory_fraction's "
                   "argument, e.g. 0.15); leave it out for no cap\n");
}

// Bad input to the `cachet` command: each case runs the real binary and checks the exit status
// (2, bad input) and the exact message: what was wrong, what the file is, and what to pass.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "cachet/io/file.h"
#include "cachet/test/cli_run.h"

namespace {

namespace fs = std::filesystem;
const std::string kData = std::string(CACHET_TEST_DATA) + "/oracle/";

using namespace cachet::test;

void write(const fs::path& p, const std::string& text) { std::ofstream(p, std::ios::binary) << text; }

const std::string kFormats =
    "cachet reads a PyTorch memory snapshot (a pickle from torch.cuda.memory._dump_snapshot(), or the same dict as "
    "JSON: {\"segments\": ..., \"device_traces\": ...}) or a cachet oracle recording (results/res_*.json), either one "
    "optionally gzipped";

// Was: "<dir>: empty file".
TEST(BadInput, DirectoryAsTraceSaysDirectoryAndWhatToPass) {
  const fs::path dir = scratch_dir() / "traces";
  fs::create_directories(dir / "sub");
  write(dir / "run1.pickle", "x");
  write(dir / "run2.json.gz", "x");
  for (const char* cmd : {"replay", "trace-info", "summary", "tune"}) {
    const CliRun o = run_cachet(std::string(cmd) + " " + dir.string());
    EXPECT_EQ(o.rc, 2) << cmd;
    EXPECT_EQ(o.err, "cachet " + std::string(cmd) + ": " + dir.string() +
                         ": is a directory, not a file; pass one file (in it: run1.pickle, run2.json.gz). " + kFormats +
                         "\n")
        << cmd;
  }
  const fs::path empty = scratch_dir() / "nothing_here";
  fs::create_directories(empty);
  CliRun o = run_cachet("plot " + empty.string() + " -o " + (scratch_dir() / "p.svg").string());
  EXPECT_EQ(o.rc, 2);
  EXPECT_EQ(o.err, "cachet plot: " + empty.string() + ": is a directory, not a file; pass one file (it holds no files). " +
                       kFormats + "\n");
  o = run_cachet("conform " + empty.string());
  EXPECT_EQ(o.rc, 2);
  EXPECT_EQ(o.err, "cachet conform: " + empty.string() + ": is a directory, not a file; pass one file (it holds no files)\n");
}

// Was: "unrecognised format (first byte 0x5b)".
TEST(BadInput, JsonArraySaysWhatItIs) {
  const fs::path list = scratch_dir() / "list.json";
  write(list, "  [1, 2, 3]\n");
  CliRun o = run_cachet("replay " + list.string());
  EXPECT_EQ(o.rc, 2);
  EXPECT_EQ(o.err, "cachet replay: " + list.string() + ": a JSON array (a list), not a trace: " + kFormats + "\n");
  // torch.cuda.memory_snapshot() written as JSON: segments, no trace.
  const fs::path segs = scratch_dir() / "segments.json";
  write(segs, R"([{"device": 0, "address": 0, "total_size": 2097152, "stream": 0, "segment_type": "small", "blocks": []}])");
  o = run_cachet("trace-info " + segs.string());
  EXPECT_EQ(o.rc, 2);
  EXPECT_EQ(o.err, "cachet trace-info: " + segs.string() +
                       ": a JSON array of segments (torch.cuda.memory_snapshot()): segments only, no trace events to "
                       "replay; save torch.cuda.memory._snapshot() (a dict with \"device_traces\") instead: " +
                       kFormats + "\n");
  // An oracle op list handed to replay.
  o = run_cachet("replay " + kData + "ops/ops_small.json.gz");
  EXPECT_EQ(o.rc, 2);
  EXPECT_EQ(o.err, "cachet replay: " + kData +
                       "ops/ops_small.json.gz: a JSON array of ops, a cachet op list (ops_*.json), which `cachet "
                       "conform OPS RESULT` reads, not a trace: " +
                       kFormats + "\n");
  // torch.save() output (a zip archive).
  const fs::path zip = scratch_dir() / "model.pt";
  write(zip, std::string("PK\x03\x04", 4) + "archive/data.pkl");
  o = run_cachet("summary " + zip.string());
  EXPECT_EQ(o.rc, 2);
  EXPECT_EQ(o.err, "cachet summary: " + zip.string() +
                       ": a zip archive (torch.save() writes these: a model or tensors, not a memory trace): " +
                       kFormats + "\n");
}

// Was: "<root>: malformed or truncated JSON (byte offset 0)".
TEST(BadInput, TruncatedJsonSaysWhereItEnds) {
  const std::string head =
      R"({"segments": [], "device_traces": [[{"action": "segment_alloc", "addr": 139901982998528, "size": 155189248, )"
      R"("stream": 0, "time_us": 1}, {"action": "alloc", "addr": 139901982998528, "size": 15438)";
  const fs::path cut = scratch_dir() / "cut.json";
  write(cut, head);
  CliRun o = run_cachet("trace-info " + cut.string());
  EXPECT_EQ(o.rc, 2);
  EXPECT_EQ(o.err, "cachet trace-info: " + cut.string() + ": device_traces[0][1].size: truncated JSON: the text ends at byte " +
                       std::to_string(head.size()) +
                       ", with 4 objects or arrays left open; the file was cut short (an interrupted write or copy?): "
                       "save or copy it again\n");
  // Cut inside a string.
  write(cut, head.substr(0, 49));  // ...[[{"action": "s
  o = run_cachet("replay " + cut.string());
  EXPECT_EQ(o.rc, 2);
  EXPECT_EQ(o.err, "cachet replay: " + cut.string() +
                       ": device_traces[0][0].action: truncated JSON: the text ends at byte 49 inside a string, with 4 "
                       "objects or arrays left open; the file was cut short (an interrupted write or copy?): save or "
                       "copy it again\n");
  // A bracket that does not match is not a truncation.
  write(cut, R"({"device_traces": [[{"action": "alloc"]]]})");
  o = run_cachet("replay " + cut.string());
  EXPECT_EQ(o.rc, 2);
  EXPECT_EQ(o.err, "cachet replay: " + cut.string() +
                       ": device_traces[0][0].action: malformed JSON: the ']' at byte 38 does not close the '{' opened "
                       "at byte 20\n");
  // A recording cut short, given to conform.
  write(cut, R"({"conf": "", "cap": 0, "total_memory": 100, "steps": [[null, 1, 2)");
  o = run_cachet("conform " + kData + "ops/ops_small.json.gz " + cut.string());
  EXPECT_EQ(o.rc, 2);
  EXPECT_EQ(o.err, "cachet conform: " + cut.string() +
                       ": steps[0][2]: truncated JSON: the text ends at byte 65, with 3 objects or arrays left open; the "
                       "file was cut short (an interrupted write or copy?): save or copy it again\n");
}

// Was: `top level: missing field "conf"`.
TEST(BadInput, ConformSaysASnapshotIsNotARecording) {
  const std::string readers =
      "`cachet conform` compares an oracle recording with its op list; a snapshot is read by `cachet replay` (and "
      "summary, plot, trace-info, tune)\n";
  CliRun o = run_cachet("conform " + kData + "snapshots/mlp_train.pickle.gz");
  EXPECT_EQ(o.rc, 2);
  EXPECT_EQ(o.err, "cachet conform: " + kData +
                       "snapshots/mlp_train.pickle.gz: a PyTorch memory snapshot (pickle from "
                       "torch.cuda.memory._dump_snapshot()), not an oracle recording "
                       "(results/res_<regime>_<config>.json.gz); " +
                       readers);
  o = run_cachet("conform " + kData + "workloads/gpt2_train.trace.json.gz");
  EXPECT_EQ(o.rc, 2);
  EXPECT_EQ(o.err, "cachet conform: " + kData +
                       "workloads/gpt2_train.trace.json.gz: a PyTorch memory snapshot as JSON (its dict has "
                       "\"device_traces\" or \"segments\"), not an oracle recording "
                       "(results/res_<regime>_<config>.json.gz); " +
                       readers);
  // A snapshot in the OPS place.
  o = run_cachet("conform " + kData + "snapshots/mlp_train.pickle.gz " + kData + "results/res_small_default.json.gz");
  EXPECT_EQ(o.rc, 2);
  EXPECT_EQ(o.err, "cachet conform: " + kData +
                       "snapshots/mlp_train.pickle.gz: a PyTorch memory snapshot (pickle from "
                       "torch.cuda.memory._dump_snapshot()), not an op list (ops/ops_<regime>.json.gz); " +
                       readers);
  // OPS and RESULT swapped.
  o = run_cachet("conform " + kData + "results/res_small_default.json.gz " + kData + "ops/ops_small.json.gz");
  EXPECT_EQ(o.rc, 2);
  EXPECT_EQ(o.err, "cachet conform: " + kData +
                       "ops/ops_small.json.gz: an op list (ops_*.json), not an oracle recording "
                       "(results/res_<regime>_<config>.json.gz); pass the op list first: cachet conform OPS RESULT\n");
}

// Was: "A subcommand is required" for a misspelt command. The list is checked by name (other
// commands may join it), the suggestion exactly.
TEST(BadInput, UnknownCommandIsNamedWithTheNearest) {
  auto check = [](const std::string& args, const std::string& head) {
    const CliRun o = run_cachet(args);
    EXPECT_EQ(o.rc, 2) << args;
    EXPECT_EQ(o.out, "") << args;
    ASSERT_EQ(o.err.substr(0, head.size()), head) << o.err;
    const std::string tail = " (cachet --help says what each does)\n";
    ASSERT_GT(o.err.size(), head.size() + tail.size()) << o.err;
    ASSERT_EQ(o.err.substr(o.err.size() - tail.size()), tail) << o.err;
    std::vector<std::string> names;
    std::stringstream list(o.err.substr(head.size(), o.err.size() - head.size() - tail.size()));
    for (std::string n; std::getline(list, n, ',');) names.push_back(n.substr(n[0] == ' ' ? 1 : 0));
    EXPECT_TRUE(std::is_sorted(names.begin(), names.end())) << o.err;
    for (const char* want : {"check-conf", "conform", "plot", "replay", "summary", "trace-info", "tune"})
      EXPECT_NE(std::find(names.begin(), names.end(), want), names.end()) << want << " in " << o.err;
  };
  check("replya x.pickle", "cachet: unknown command 'replya'; did you mean 'replay'? The commands: ");
  check("trace x.pickle", "cachet: unknown command 'trace'; did you mean 'trace-info'? The commands: ");
  check("chek-conf x", "cachet: unknown command 'chek-conf'; did you mean 'check-conf'? The commands: ");
  check("frobnicate", "cachet: unknown command 'frobnicate'. The commands: ");
  check("", "cachet: a command is required; commands: ");
}

// Was: "... ('12x' at column 21). Accepted: ... (column 21)": the column once.
TEST(BadInput, ConfigurationErrorSaysItsColumnOnce) {
  const std::string msg =
      "--conf 'max_split_size_mb:12x': max_split_size_mb: unexpected text 'x' after the number ('12x' at column 21). "
      "Accepted: a whole number of MiB >= large_segment_size_mb (20 by default), e.g. max_split_size_mb:128\n";
  const std::string trace = kData + "snapshots/mlp_train.pickle.gz";
  CliRun o = run_cachet("replay " + trace + " --conf 'max_split_size_mb:12x'");
  EXPECT_EQ(o.rc, 2);
  EXPECT_EQ(o.err, "cachet replay: " + msg);
  o = run_cachet("summary " + trace + " --conf 'max_split_size_mb:12x'");
  EXPECT_EQ(o.rc, 2);
  EXPECT_EQ(o.err, "cachet summary: " + msg);
  o = run_cachet("plot " + trace + " --conf 'max_split_size_mb:12x' -o " + (scratch_dir() / "c.svg").string());
  EXPECT_EQ(o.rc, 2);
  EXPECT_EQ(o.err, "cachet plot: " + msg);
}

// Was: "cachet plot: cannot write DIR/x.svg", no reason.
TEST(BadInput, PlotIntoAMissingFolderNamesTheFolderAndTheReason) {
  const std::string trace = kData + "snapshots/mlp_train.pickle.gz";
  const fs::path missing = scratch_dir() / "no_such_folder";
  CliRun o = run_cachet("plot " + trace + " -o " + (missing / "mem.svg").string());
  EXPECT_EQ(o.rc, 2);
  EXPECT_EQ(o.err, "cachet plot: -o " + (missing / "mem.svg").string() + ": cannot write there: the folder " +
                       missing.string() + " does not exist (No such file or directory); create it first\n");
  EXPECT_FALSE(fs::exists(missing));
  // A file where the folder should be.
  const fs::path file = scratch_dir() / "a_file";
  write(file, "x");
  o = run_cachet("plot " + trace + " -o " + (file / "mem.svg").string());
  EXPECT_EQ(o.rc, 2);
  EXPECT_EQ(o.err, "cachet plot: -o " + (file / "mem.svg").string() + ": cannot write there: " + file.string() +
                       " is not a folder (Not a directory)\n");
  // A folder given as the file.
  o = run_cachet("plot " + trace + " -o " + scratch_dir().string());
  EXPECT_EQ(o.rc, 2);
  EXPECT_EQ(o.err, "cachet plot: -o " + scratch_dir().string() + ": cannot write there: " + scratch_dir().string() +
                       " is a folder; give a file name, for example " + scratch_dir().string() + "/memory.svg\n");
}

// Was: 1596 mismatches listed for ops of another sequence with as many ops as the recording.
TEST(BadInput, ConformDetectsAnOpListOfAnotherSequence) {
  const std::string tail =
      " ops disagree with their steps); pass the op list the recording was made from "
      "(results/res_<regime>_<config> pairs with ops/ops_<regime>)\n";
  // mixed and mixed_empty both have 3000 ops.
  const std::string ops = kData + "ops/ops_mixed.json.gz";
  const std::string res = kData + "results/res_mixed_empty_default.json.gz";
  CliRun o = run_cachet("conform " + ops + " " + res);
  EXPECT_EQ(o.rc, 2);
  EXPECT_EQ(o.out, "");
  EXPECT_EQ(o.err, "cachet conform: the op list and the recording do not belong together: op 4 of " + ops +
                       " allocates 28 bytes, but at step 4 of " + res +
                       " requested_bytes.all.current grew by 2 (2326 of 3000" + tail);
  // ops_small with its first alloc and free swapped: op 0 is a free where PyTorch returned a pointer.
  std::string text = cachet::io::read_file(kData + "ops/ops_small.json.gz");
  const std::string head = R"([["a", 0, 89, 0], ["f", 0], )";
  ASSERT_EQ(text.substr(0, head.size()), head);
  text.replace(0, head.size(), R"([["f", 0], ["a", 0, 89, 0], )");
  const fs::path swapped = scratch_dir() / "ops_small_swapped.json";
  write(swapped, text);
  const std::string small = kData + "results/res_small_default.json.gz";
  o = run_cachet("conform " + swapped.string() + " " + small);
  EXPECT_EQ(o.rc, 2);
  EXPECT_EQ(o.err, "cachet conform: the op list and the recording do not belong together: op 0 of " + swapped.string() +
                       " is a free, but step 0 of " + small + " returned a pointer (2 of 3000" + tail);
}

// Was: "segments at end: 0 (0 blocks, ...)" then "live at end: 3 blocks". PyTorch's own
// memory_stats() beside the trace says 154 segments (segment.all.current) and 3 blocks
// (active.all.current) at the end.
TEST(BadInput, TraceInfoSaysTheSegmentListIsMissingNotEmpty) {
  const CliRun o = run_cachet("trace-info " + kData + "workloads/gpt2_train.trace.json.gz");
  ASSERT_EQ(o.rc, 0) << o.err;
  EXPECT_NE(o.out.find("\n  segments at end: not in the file (its \"segments\" list is empty, yet the trace ends with "
                       "3 blocks live and 154 segments not freed); the replay does not need them\n  trace: 18685 events"),
            std::string::npos)
      << o.out;
  EXPECT_EQ(o.out.find("segments at end: 0"), std::string::npos) << o.out;
  EXPECT_EQ(o.out.find("note: the trace has no segment"), std::string::npos) << o.out;
  // A snapshot with its segment list keeps the count.
  const CliRun p = run_cachet("trace-info " + kData + "snapshots/mlp_train.pickle.gz");
  ASSERT_EQ(p.rc, 0) << p.err;
  EXPECT_NE(p.out.find("\n  segments at end: 15 (52 blocks, "), std::string::npos) << p.out;
  // Was: "207618048 (0.19 GiB) reserved" beside "live at end: 39 blocks (143728640 bytes)": one unit
  // style, the one replay and tune print (hand-checked: 207618048 / 2^20 = 198.00, 143728640 / 2^20 = 137.07).
  EXPECT_NE(p.out.find("(52 blocks, 198.00 MiB = 207618048 bytes reserved)"), std::string::npos) << p.out;
  EXPECT_NE(p.out.find("live at end: 39 blocks (137.07 MiB = 143728640 bytes requested)"), std::string::npos) << p.out;
  EXPECT_NE(p.out.find("total memory:  not recorded (replay and tune take it"), std::string::npos) << p.out;
}

// Was: "malloc needs address #1 but the recording has only 0" (in the replay's note).
TEST(BadInput, TraceWithoutSegmentEventsSaysWhatItMeans) {
  const fs::path p = scratch_dir() / "no_segment_events.json";
  write(p, R"({"segments": [], "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": ""}, "device_traces": [[)"
           R"({"action": "alloc", "addr": 140000002097152, "size": 1024, "stream": 0, "time_us": 1},)"
           R"({"action": "alloc", "addr": 140000002098176, "size": 1024, "stream": 0, "time_us": 2},)"
           R"({"action": "free_requested", "addr": 140000002098176, "size": 1024, "stream": 0, "time_us": 3},)"
           R"({"action": "free_completed", "addr": 140000002098176, "size": 1024, "stream": 0, "time_us": 4})"
           "]]}");
  const std::string why =
      "the trace has no segment_alloc or segment_map events: its segments were reserved before "
      "torch.cuda.memory._record_memory_history() was called, or the max_entries ring buffer dropped those events, so "
      "PyTorch's segment addresses are unknown and the replay uses its own (as with --addresses synthetic); to record "
      "them, call _record_memory_history() before the first CUDA allocation";
  CliRun o = run_cachet("trace-info " + p.string());
  ASSERT_EQ(o.rc, 0) << o.err;
  EXPECT_NE(o.out.find("\n  segments at end: not in the file (its \"segments\" list is empty, yet the trace ends with "
                       "1 blocks live); the replay does not need them\n"),
            std::string::npos)
      << o.out;
  EXPECT_NE(o.out.find("\n  note: " + why + "\n"), std::string::npos) << o.out;
  o = run_cachet("replay " + p.string());
  ASSERT_EQ(o.rc, 0) << o.err;
  // replay wraps its lines to 100 columns (continuations indented by two): undo that.
  for (std::size_t at; (at = o.out.find("\n  ")) != std::string::npos;) o.out.replace(at, 3, " ");
  EXPECT_NE(o.out.find("\nnote ((default)): " + why + "\n"), std::string::npos) << o.out;
  EXPECT_EQ(o.out.find("needs address"), std::string::npos) << o.out;
  o = run_cachet("replay " + p.string() + " --json");
  ASSERT_EQ(o.rc, 0) << o.err;
  EXPECT_NE(o.out.find("\"addresses\": \"synthetic\""), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("\"note\": \"" + why + "\""), std::string::npos) << o.out;
  o = run_cachet("summary " + p.string());
  ASSERT_EQ(o.rc, 0) << o.err;
  EXPECT_NE(o.out.find("\nnote: " + why + "\n"), std::string::npos) << o.out;
  o = run_cachet("plot " + p.string() + " -o " + (scratch_dir() / "noseg.svg").string());
  ASSERT_EQ(o.rc, 0) << o.err;
  EXPECT_EQ(o.err, "note: " + why + "\n");
}

// Was: replayed as all zeros, exit 0 (replay, summary, plot, tune).
TEST(BadInput, TraceWithNothingToReplayIsRefused) {
  const fs::path p = scratch_dir() / "segments_only.json";
  write(p, R"({"segments": [{"device": 0, "address": 1048576, "total_size": 2097152, "stream": 0, )"
           R"("segment_type": "small", "blocks": [{"address": 1048576, "size": 2097152, "state": "inactive"}]}], )"
           R"("device_traces": []})");
  const std::string why =
      ": nothing to replay: the trace has no alloc or oom event (0 trace events, 1 segments in the file); the snapshot "
      "was taken without torch.cuda.memory._record_memory_history() (or after it was turned off): call "
      "_record_memory_history(max_entries=1000000) before the code to study, then _dump_snapshot()\n";
  for (const char* cmd : {"replay", "summary", "tune"}) {
    const CliRun o = run_cachet(std::string(cmd) + " " + p.string());
    EXPECT_EQ(o.rc, 2) << cmd;
    EXPECT_EQ(o.out, "") << cmd;
    EXPECT_EQ(o.err, "cachet " + std::string(cmd) + ": " + p.string() + why) << cmd;
  }
  const CliRun o = run_cachet("plot " + p.string() + " -o " + (scratch_dir() / "none.svg").string());
  EXPECT_EQ(o.rc, 2);
  EXPECT_EQ(o.err, "cachet plot: " + p.string() + why);
  EXPECT_FALSE(fs::exists(scratch_dir() / "none.svg"));
  // trace-info still describes it.
  const CliRun i = run_cachet("trace-info " + p.string());
  EXPECT_EQ(i.rc, 0) << i.err;
}

// Was: "not a PyTorch memory snapshot or oracle recording: no 'device_traces', ... key".
TEST(BadInput, StatsFileGivenAsTheTraceSaysPassTheTrace) {
  const std::string stats = kData + "workloads/gpt2_train.stats.json";
  const CliRun o = run_cachet("replay " + stats);
  EXPECT_EQ(o.rc, 2);
  EXPECT_EQ(o.err, "cachet replay: " + stats +
                       ": <root>: a stats file (\"final_stats\": memory_stats() at the end), not a trace; cachet reads "
                       "it beside its trace (<base>.stats.json beside <base>.trace.json.gz): pass the trace\n");
}

// Was: tune aborted (an internal check in the expandable segment code, exit 134); summary and
// plot replayed a device of 0 bytes; a total_memory of 0 beside a trace was taken as is.
TEST(BadInput, DeviceMemoryOfZeroIsRefused) {
  const std::string trace = kData + "snapshots/mlp_train.pickle.gz";
  // One message for every command that takes a size (tools/commands/trace_input.h, size_option).
  const std::string zero =
      ": --device-memory: not a positive size: '0' (bytes, or with a suffix K, M, G or T, powers of 1024: '13.5G', "
      "'80GiB')\n";
  CliRun o = run_cachet("tune " + trace + " --device-memory 0");
  EXPECT_EQ(o.rc, 2);
  EXPECT_EQ(o.err, "cachet tune" + zero);
  o = run_cachet("summary " + trace + " --device-memory 0");
  EXPECT_EQ(o.rc, 2);
  EXPECT_EQ(o.err, "cachet summary" + zero);
  o = run_cachet("plot " + trace + " --device-memory 0 -o " + (scratch_dir() / "zero.svg").string());
  EXPECT_EQ(o.rc, 2);
  EXPECT_EQ(o.err, "cachet plot" + zero);
  const fs::path dir = scratch_dir() / "zero_memory";
  fs::create_directories(dir);
  fs::copy_file(trace, dir / "mlp.pickle.gz", fs::copy_options::overwrite_existing);
  write(dir / "mlp.stats.json", R"({"total_memory": 0})");
  o = run_cachet("replay " + (dir / "mlp.pickle.gz").string());
  EXPECT_EQ(o.rc, 2);
  EXPECT_EQ(o.err, "cachet replay: " + (dir / "mlp.stats.json").string() + ": sidecar.total_memory: absurd total_memory 0\n");
}

// Was: --ops silently replaced OPS; -o '' said "No such file or directory".
TEST(BadInput, ConflictingOrEmptyArguments) {
  const std::string small = kData + "ops/ops_small.json.gz";
  const std::string mixed = kData + "ops/ops_mixed.json.gz";
  CliRun o = run_cachet("conform " + small + " " + kData + "results/res_small_default.json.gz --ops " + mixed);
  EXPECT_EQ(o.rc, 2);
  EXPECT_EQ(o.err, "cachet conform: the op list is given twice, as OPS (" + small + ") and as --ops (" + mixed +
                       "): give it once\n");
  o = run_cachet("plot " + kData + "snapshots/mlp_train.pickle.gz -o ''");
  EXPECT_EQ(o.rc, 2);
  EXPECT_EQ(o.err, "cachet plot: -o: an empty file name; give the SVG file to write, for example -o memory.svg\n");
}

// Was: summary, plot and tune replayed the default configuration in place of a recorded one
// they could not read, without a word (replay said it); trace-info printed it as valid.
TEST(BadInput, RecordedConfigurationNotUnderstoodIsSaid) {
  const fs::path p = scratch_dir() / "bad_recorded_conf.json";
  write(p, R"({"segments": [], "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128;garbage_interval:5"}, )"
           R"("device_traces": [[{"action": "segment_alloc", "addr": 140000002097152, "size": 2097152, "stream": 0},)"
           R"({"action": "alloc", "addr": 140000002097152, "size": 1024, "stream": 0}]]})");
  const std::string why =
      "max_split_size_mb: options are separated by ',' not ';', and 'garbage_interval' is no option (did you mean "
      "'garbage_collection_threshold'?) ('128;garbage_interval' at column 22)";
  const std::string note = ": recorded configuration not understood (" + why + "); using the default\n";
  for (const char* cmd : {"replay", "summary", "tune"}) {
    const CliRun o = run_cachet(std::string(cmd) + " " + p.string());
    EXPECT_EQ(o.rc, 0) << cmd << o.err;
    EXPECT_EQ(o.err, "cachet " + std::string(cmd) + note) << cmd;
  }
  CliRun o = run_cachet("plot " + p.string() + " -o " + (scratch_dir() / "bc.svg").string());
  EXPECT_EQ(o.rc, 0) << o.err;
  EXPECT_EQ(o.err, "cachet plot" + note);
  // With --conf the recorded configuration is not used: nothing to say.
  o = run_cachet("summary " + p.string() + " --conf ''");
  EXPECT_EQ(o.rc, 0) << o.err;
  EXPECT_EQ(o.err, "");
  o = run_cachet("trace-info " + p.string());
  EXPECT_EQ(o.rc, 0) << o.err;
  EXPECT_NE(o.out.find("alloc conf:    \"max_split_size_mb:128;garbage_interval:5\"\n               not understood: " +
                       why + "; replay uses the default\n"),
            std::string::npos)
      << o.out;
}

// Was: device 0 replayed and device 1 ignored, without a word.
TEST(BadInput, SeveralDevicesSayWhichIsReplayed) {
  const fs::path p = scratch_dir() / "two_devices.json";
  write(p, R"({"segments": [], "device_traces": [[)"
           R"({"action": "segment_alloc", "addr": 140000002097152, "size": 2097152, "stream": 0},)"
           R"({"action": "alloc", "addr": 140000002097152, "size": 1024, "stream": 0}], [)"
           R"({"action": "segment_alloc", "addr": 150000002097152, "size": 4194304, "stream": 0},)"
           R"({"action": "alloc", "addr": 150000002097152, "size": 3000000, "stream": 0}]]})");
  const std::string note =
      ": the file has trace events for 2 devices (0, 1); device 0 is replayed (the first), the others are not\n";
  for (const char* cmd : {"replay", "summary", "tune"}) {
    const CliRun o = run_cachet(std::string(cmd) + " " + p.string());
    EXPECT_EQ(o.rc, 0) << cmd << o.err;
    EXPECT_EQ(o.err, "cachet " + std::string(cmd) + note) << cmd;
  }
  const CliRun o = run_cachet("plot " + p.string() + " -o " + (scratch_dir() / "two.svg").string());
  EXPECT_EQ(o.rc, 0) << o.err;
  EXPECT_EQ(o.err, "cachet plot" + note);
}

// Was: a cap of 0, or one above the device's memory, was taken as no cap, without a word
// (set_per_process_memory_fraction accepts a fraction in (0, 1] only).
TEST(BadInput, TuneCapOfZeroOrAboveTheDeviceIsRefused) {
  const std::string mlp = kData + "snapshots/mlp_train.pickle.gz";
  CliRun o = run_cachet("tune " + mlp + " --cap 0");
  EXPECT_EQ(o.rc, 2);
  EXPECT_EQ(o.err, "cachet tune: --cap 0: a cap of 0 bytes; leave --cap out for no cap\n");
  o = run_cachet("tune " + mlp + " --cap 200G --device-memory 100G");
  EXPECT_EQ(o.rc, 2);
  EXPECT_EQ(o.err, "cachet tune: --cap 200G: more than the device's memory (100.00 GiB, --device-memory); give a "
                   "smaller cap, or the device's memory with --device-memory\n");
  // gpt2_train.stats.json records the H200's total_memory, 150109880320 bytes = 139.80 GiB.
  o = run_cachet("tune " + kData + "workloads/gpt2_train.trace.json.gz --cap 200G");
  EXPECT_EQ(o.rc, 2);
  EXPECT_EQ(o.err, "cachet tune: --cap 200G: more than the device's memory (139.80 GiB, recorded beside the trace); "
                   "give a smaller cap, or the device's memory with --device-memory\n");
}

// Was: output that could not be written (here /dev/full: "No space left on device") exited 0.
TEST(BadInput, OutputThatCannotBeWrittenIsAnError) {
  ASSERT_TRUE(fs::exists("/dev/full"));
  CliRun o = run_cachet("trace-info " + kData + "snapshots/mlp_train.pickle.gz >/dev/full");
  EXPECT_EQ(o.rc, 2);
  EXPECT_EQ(o.err, "cachet trace-info: cannot write the output: No space left on device\n");
  // A larger output fails in an earlier write: the reason is then not known.
  o = run_cachet("replay " + kData + "workloads/gpt2_train.trace.json.gz --json >/dev/full");
  EXPECT_EQ(o.rc, 2);
  EXPECT_EQ(o.err,
            "cachet replay: cannot write the output: a write to stdout failed (a full disk, or a closed pipe?)\n");
}

// Was: --policy cachet silently overrode --conf policy:pytorch; --max-report -1 printed every
// mismatch (the count wrapped around).
TEST(BadInput, ConflictingPolicyAndNegativeCountAreRefused) {
  CliRun o = run_cachet("replay " + kData + "snapshots/mlp_train.pickle.gz --policy cachet --conf 'policy:pytorch,max_split_size_mb:64'");
  EXPECT_EQ(o.rc, 2);
  EXPECT_EQ(o.out, "");
  EXPECT_EQ(o.err, "cachet replay: --policy cachet and --conf 'policy:pytorch,max_split_size_mb:64' (policy:pytorch) "
                   "disagree; give one\n");
  o = run_cachet("conform " + kData + "results/res_small_default.json.gz --max-report -1");
  EXPECT_EQ(o.rc, 2);
  EXPECT_EQ(o.err, "--max-report: a count, 0 or more, not -1\nRun with --help for more information.\n");
}

// Was: "malloc needs address #2 but the recording has only 1; the replay made more device calls
// than PyTorch did": one segment event, and a 3 MiB request that needs a second (large) segment.
TEST(BadInput, TooFewSegmentEventsAreSaidInTheTracesTerms) {
  const fs::path p = scratch_dir() / "few_segments.json";
  write(p, R"({"segments": [], "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": ""}, "device_traces": [[)"
           R"({"action": "segment_alloc", "addr": 140000002097152, "size": 2097152, "stream": 0},)"
           R"({"action": "alloc", "addr": 140000002097152, "size": 1024, "stream": 0},)"
           R"({"action": "alloc", "addr": 150000000000000, "size": 3145728, "stream": 0}]]})");
  CliRun o = run_cachet("replay " + p.string());
  ASSERT_EQ(o.rc, 0) << o.err;
  // replay wraps its lines to 100 columns (continuations indented by two): undo that.
  for (std::size_t at; (at = o.out.find("\n  ")) != std::string::npos;) o.out.replace(at, 3, " ");
  EXPECT_NE(o.out.find("\nnote ((default)): the replay left the recorded addresses (the replay needed more segments "
                       "than the trace's 1 segment events: the trace starts mid-run (its first segments were reserved "
                       "before recording), or this configuration reserves more often than the recorded one); "
                       "replayed with synthetic addresses\n"),
            std::string::npos)
      << o.out;
}

// Was: "<file>: empty file", with nothing on what was expected.
TEST(BadInput, EmptyFileSaysWhatIsRead) {
  const fs::path p = scratch_dir() / "empty.pickle";
  write(p, "");
  const CliRun o = run_cachet("replay " + p.string());
  EXPECT_EQ(o.rc, 2);
  EXPECT_EQ(o.err, "cachet replay: " + p.string() + ": empty file (0 bytes; was it written completely?): " + kFormats + "\n");
}

}  // namespace

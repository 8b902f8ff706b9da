// `cachet conform` on altered and malformed input: the exit code (0 ok, 1 mismatch, 2 bad
// input) and the message naming what was wrong. Data: tests/data/oracle (ORACLE_README.md).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "cachet/io/file.h"
#include "cachet/test/cli_run.h"

namespace {

namespace fs = std::filesystem;
const std::string kOracle = std::string(CACHET_TEST_DATA) + "/oracle";

using cachet::test::CliRun;

// `cachet ARGS`, stdout and stderr in one text, in the order written.
CliRun cachet(const std::string& args) { return cachet::test::run_cachet(args, cachet::test::Stderr::merged); }

// A scratch results/ + ops/ layout with plain (gunzipped) copies.
class ConformCli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("cachet_conform_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_ / "results");
    fs::create_directories(dir_ / "ops");
    write("ops/ops_small.json", cachet::io::read_file(kOracle + "/ops/ops_small.json.gz"));
    recording_ = cachet::io::read_file(kOracle + "/results/res_small_default.json.gz");
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string write(const std::string& rel, const std::string& text) {
    std::ofstream(dir_ / rel, std::ios::binary) << text;
    return (dir_ / rel).string();
  }
  fs::path dir_;
  std::string recording_;
};

TEST_F(ConformCli, PlainCopiesConformAndOpsAreFoundBesideTheResults) {
  const std::string res = write("results/res_small_default.json", recording_);
  const CliRun r = cachet("conform " + res);
  EXPECT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("conform: 3000 ops, 0 mismatches"), std::string::npos) << r.out;
}

TEST_F(ConformCli, AlteredPointerIsAMismatchNamingTheOp) {
  // steps[0][0] is the first returned pointer; move it by 512 bytes.
  const std::string key = "\"steps\": [[";
  const auto at = recording_.find(key);
  ASSERT_NE(at, std::string::npos);
  const auto begin = at + key.size();
  const auto end = recording_.find(',', begin);
  const unsigned long long ptr = std::stoull(recording_.substr(begin, end - begin));
  std::string altered = recording_;
  altered.replace(begin, end - begin, std::to_string(ptr + 512));
  const std::string res = write("results/res_small_default.json", altered);
  const CliRun r = cachet("conform " + res);
  EXPECT_EQ(r.rc, 1) << r.out;
  EXPECT_NE(r.out.find("op 0: alloc"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("conform: 3000 ops, 1 mismatches"), std::string::npos) << r.out;
}

TEST_F(ConformCli, AlteredSegmentSizeIsADivergence) {
  // The first segment_alloc row: the model asks for 2 MiB; the altered recording says 4 MiB.
  const std::string key = "[\"segment_alloc\", ";
  const auto at = recording_.find(key);
  ASSERT_NE(at, std::string::npos);
  const auto size_at = recording_.find(", 2097152,", at);
  ASSERT_NE(size_at, std::string::npos);
  std::string altered = recording_;
  altered.replace(size_at, 10, ", 4194304,");
  const std::string res = write("results/res_small_default.json", altered);
  const CliRun r = cachet("conform " + res);
  EXPECT_EQ(r.rc, 1) << r.out;
  EXPECT_NE(r.out.find("op 0: divergence"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("expected size 4194304, got size 2097152"), std::string::npos) << r.out;
}

TEST_F(ConformCli, OpsOfAnotherRegimeAreBadInput) {
  const std::string res = write("results/res_small_default.json", recording_);
  const std::string ops = write("ops/ops_frag.json", cachet::io::read_file(kOracle + "/ops/ops_frag.json.gz"));
  const CliRun r = cachet("conform " + ops + " " + res);
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_NE(r.out.find("has 2172 ops but"), std::string::npos) << r.out;
}

TEST_F(ConformCli, TruncatedRecordingIsBadInputNamingTheFile) {
  const std::string res = write("results/res_small_default.json", recording_.substr(0, 1000));
  const CliRun r = cachet("conform " + res);
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_EQ(r.out, "cachet conform: " + res +
                       ": steps[12]: truncated JSON: the text ends at byte 1000, with 2 objects or arrays left open; "
                       "the file was cut short (an interrupted write or copy?): save or copy it again\n");
}

TEST_F(ConformCli, MissingOpsFileIsBadInput) {
  const std::string res = write("results/res_nosuch_default.json", recording_);
  const CliRun r = cachet("conform " + res);
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_NE(r.out.find("pass --ops FILE"), std::string::npos) << r.out;
}

TEST_F(ConformCli, UnknownEngineIsBadInput) {
  const std::string res = write("results/res_small_default.json", recording_);
  const CliRun r = cachet("conform " + res + " --engine foo");
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_NE(r.out.find("--engine must be model, impl or both"), std::string::npos) << r.out;
}

// The pool and capture ops replay through the production allocator too (issue 16): a MemPool
// op is no longer refused for --engine impl (it was bad input, exit 2, before gpu/ had private
// pools). The H100 graphs recording replays with 0 mismatches, the figure its ctest asserts too.
TEST_F(ConformCli, PoolOpsReplayThroughTheImplEngine) {
  const std::string res = std::string(CACHET_TEST_DATA) + "/oracle-h100/results/res_graphs_default.json.gz";
  const CliRun r = cachet("conform " + res + " --engine impl");
  EXPECT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("conform: 1660 ops, 0 mismatches"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("has no private pools"), std::string::npos) << r.out;
}

TEST_F(ConformCli, MalformedCaptureOpIsBadInputNamingTheOp) {
  const std::string res = write("results/res_small_default.json", recording_);
  std::string ops = cachet::io::read_file(kOracle + "/ops/ops_small.json.gz");
  ops.replace(0, 2, "[[\"gb\", 0, 1], [");
  write("ops/ops_small.json", ops);
  const CliRun r = cachet("conform " + res);
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_NE(r.out.find("op 0: expected [\"gb\", graph, stream, share] (share: a graph index or -1)"), std::string::npos)
      << r.out;
}

// The order in which PyTorch processed a batch of deferred frees (its hash map's, no function of
// the ops, docs/pytorch-allocator.md §14.10.3) is taken from the recording's free_completed rows
// and each engine says so. res_deferred_order_pair_j3 freed h1 (0x...200) then h4 (0x...800)
// during a capture; PyTorch completed h4 first. j0 has the made order: nothing to say.
const std::string kIssue23 = std::string(CACHET_TEST_DATA) + "/oracle-issue23";
const std::string kPairJ3Order =
    " op 14: 2 deferred frees processed in the recording's order (its free_completed rows: PyTorch's hash-map order, "
    "docs/pytorch-allocator.md §14.10.3) 0x7fa485a00800 0x7fa485a00200, not in the order they were made "
    "0x7fa485a00200 0x7fa485a00800\n";

TEST_F(ConformCli, DeferredFreesTakeTheRecordingsOrder) {
  const CliRun r = cachet("conform " + kIssue23 + "/results/res_deferred_order_pair_j3.json.gz --engine both");
  EXPECT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("[model]" + kPairJ3Order), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("[impl]" + kPairJ3Order), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("conform: 15 ops, 0 mismatches"), std::string::npos) << r.out;
  const CliRun made = cachet("conform " + kIssue23 + "/results/res_deferred_order_pair_j0.json.gz --engine both");
  EXPECT_EQ(made.rc, 0) << made.out;
  EXPECT_EQ(made.out, "conform: 15 ops, 0 mismatches\n");
}

// The order is the recording's rows': with j3's two free_completed rows swapped (the made order),
// no order is given, and the recorded peaks (PyTorch's order) no longer match the trace's.
TEST_F(ConformCli, DeferredOrderFollowsTheFreeCompletedRows) {
  write("ops/ops_deferred_order_pair.json", cachet::io::read_file(kIssue23 + "/ops/ops_deferred_order_pair.json.gz"));
  std::string rec = cachet::io::read_file(kIssue23 + "/results/res_deferred_order_pair_j3.json.gz");
  const std::string h4 = "[\"free_completed\", 140344593221632, 512, 644156992]";
  const std::string h1 = "[\"free_completed\", 140344593220096, 512, 644156992]";
  const auto at = rec.find(h4 + ", " + h1);
  ASSERT_NE(at, std::string::npos);
  rec.replace(at, h4.size() + 2 + h1.size(), h1 + ", " + h4);
  const std::string res = write("results/res_deferred_order_pair_j3.json", rec);
  const CliRun r = cachet("conform " + res + " --engine both");
  EXPECT_EQ(r.rc, 1) << r.out;
  EXPECT_EQ(r.out.find("deferred frees processed"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("[model] final stats: inactive_split.all.peak expected 3, got 4"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("[impl] final stats: inactive_split.all.peak expected 3, got 4"), std::string::npos) << r.out;
}

// The order in which PyTorch walked the streams with pending events (its cuda_events hash map's,
// keyed by cudaStream_t: no function of the ops, docs/pytorch-allocator.md §14.10.3) is taken from
// the recording's free_completed rows and each engine says so. res_reuse_on, op 483: a block of
// stream 2 (655902384) with its event on stream 1 (655849888), blocks of stream 1 with theirs on
// stream 2; PyTorch walked stream 2's events first, the engines by stream value would take stream 1's.
const std::string kReuseOp483 =
    " op 483: the events of 2 streams walked in the recording's order (its free_completed rows: PyTorch's hash-map "
    "order of streams, docs/pytorch-allocator.md §14.10.3) 655902384 655849888, not 655849888 655902384\n";

TEST_F(ConformCli, StreamsWithEventsTakeTheRecordingsOrder) {
  const CliRun r = cachet("conform " + kIssue23 + "/results/res_reuse_on.json.gz --engine both");
  EXPECT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("[model]" + kReuseOp483), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("[impl]" + kReuseOp483), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("conform: 2322 ops, 0 mismatches"), std::string::npos) << r.out;
}

}  // namespace

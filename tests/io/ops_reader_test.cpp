// io::read_ops: a recording's op list becomes the op vocabulary (cachet/ops.h), id-addressed,
// with the pool and capture ops of the torch-2.11-h100 recordings (tests/data/oracle-h100/README.md).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <unistd.h>
#include <vector>

#include "cachet/io/file.h"
#include "cachet/io/recording.h"
#include "cachet/ops.h"

namespace cachet::io {
namespace {

std::string write_temp(const std::string& name, const std::string& text) {
  const auto p = std::filesystem::temp_directory_path() / ("cachet_ops_" + std::to_string(::getpid()) + "_" + name);
  std::ofstream(p, std::ios::binary) << text;
  return p.string();
}

TEST(ReadOps, EveryRecordedOpKind) {
  const std::string path = write_temp(
      "kinds.json",
      R"([["a", 7, 1230, 1], ["pb", 2], ["pe", 2], ["pr", 2], ["gb", 0, 2, -1], ["gb", 1, 1, 0], ["ge", 1],)"
      R"( ["gx", 0], ["r", 7, 3], ["f", 7], ["e"]])");
  const std::vector<ops::Op> got = read_ops(path);
  const std::vector<ops::Op> want{ops::Allocate{1230, 1, 7}, ops::UseMemPoolBegin{2},    ops::UseMemPoolEnd{2},
                                  ops::ReleasePool{2},       ops::CaptureBegin{0, 2, {}}, ops::CaptureBegin{1, 1, 0},
                                  ops::CaptureEnd{1},        ops::GraphReset{0},          ops::RecordStream{7, 3},
                                  ops::Free{7},              ops::EmptyCache{}};
  EXPECT_EQ(got, want);
  EXPECT_EQ(ops::addressing(got), ops::Addressing::Ids);
  EXPECT_EQ(ops::show(got),
            "alloc h7 1230 s1\nuse_pool p2\nend_pool p2\nrelease_pool p2\ncapture_begin g0 s2 pool new\n"
            "capture_begin g1 s1 pool g0\ncapture_end g1\ngraph_reset g0\nrecord h7 s3\nfree h7\nempty_cache\n");
  std::filesystem::remove(path);
}

// A last element: the op's thread (docs/pytorch-allocator.md §14.10.2); absent: 0.
TEST(ReadOps, Threads) {
  const std::string path =
      write_temp("threads.json", R"([["pb", 1, 2], ["a", 3, 1000, 0, 2], ["a", 4, 1000, 1], ["f", 3, 1], ["pe", 1, 2]])");
  const std::vector<ops::Op> want{ops::UseMemPoolBegin{1, 2}, ops::Allocate{1000, 0, 3, 2}, ops::Allocate{1000, 1, 4, 0},
                                  ops::Free{3}, ops::UseMemPoolEnd{1}};
  EXPECT_EQ(read_ops(path), want);
  EXPECT_EQ(ops::show(want), "use_pool p1 t2\nalloc h3 1000 s0 t2\nalloc h4 1000 s1\nfree h3\nend_pool p1\n");
  std::filesystem::remove(path);
}

// The capture-graph ops of issue 23 (docs/pytorch-allocator.md §14.10.1): wait_stream, a kernel and
// a runtime setting, and their text form.
TEST(ReadOps, CaptureGraphOps) {
  const std::string path = write_temp(
      "graph.json", R"([["cfg", "graph_capture_record_stream_reuse:True"], ["w", 2, 1], ["k", 2], ["a", 0, 32, 2]])");
  const std::vector<ops::Op> want{ops::SetAllocatorSettings{"graph_capture_record_stream_reuse:True"},
                                  ops::WaitStream{2, 1}, ops::Kernel{2}, ops::Allocate{32, 2, 0}};
  EXPECT_EQ(read_ops(path), want);
  EXPECT_EQ(ops::show(want),
            "cfg graph_capture_record_stream_reuse:True\nwait_stream s2 s1\nkernel s2\nalloc h0 32 s2\n");
  EXPECT_EQ(ops::parse_ops(ops::show(want)), want);
  EXPECT_TRUE(ops::is_stream_op(want[1]));
  EXPECT_TRUE(ops::is_stream_op(want[2]));
  EXPECT_FALSE(ops::is_stream_op(want[0]));
  EXPECT_FALSE(ops::is_pool_op(want[1]));
  // The recorded list of PyTorch's test_graph_capture_reclaim_2_streams.
  const auto reclaim = read_ops(std::string(CACHET_TEST_DATA) + "/oracle-issue23/ops/ops_reclaim_2_streams.json.gz");
  ASSERT_EQ(reclaim.size(), 21u);
  EXPECT_EQ(reclaim[5], (ops::Op{ops::WaitStream{2, 1}}));
  EXPECT_EQ(reclaim[7], (ops::Op{ops::Kernel{2}}));
  std::filesystem::remove(path);
}

TEST(ReadOps, TheOracleListsAreIdAddressed) {
  const auto ops = read_ops(std::string(CACHET_TEST_DATA) + "/oracle/ops/ops_small.json.gz");
  ASSERT_EQ(ops.size(), 3000u);
  EXPECT_EQ(ops[0], (ops::Op{ops::Allocate{89, 0, 0}}));  // ["a", 0, 89, 0]
  EXPECT_EQ(ops[1], (ops::Op{ops::Free{0}}));             // ["f", 0]
}

TEST(ReadOps, MalformedOpsNameTheOpAndTheForm) {
  const std::pair<const char*, const char*> rows[] = {
      {R"([["a", 0, 1]])", ": op 0: expected [\"a\", id, size, stream] or [\"a\", id, size, stream, thread]"},
      {R"([["pb"]])", ": op 0: expected [\"pb\"|\"pe\", pool(, thread)] or [\"pr\", pool]"},
      {R"([["pr", 0, 1]])", ": op 0: expected [\"pb\"|\"pe\", pool(, thread)] or [\"pr\", pool]"},
      {R"([["a", 0, 1, 0, 4294967296]])", ": op 0 thread: expected a thread index below 2^32"},
      {R"([["e"], ["gb", 0, 1, -2]])", ": op 1 share: expected a graph index or -1 (a new pool)"},
      {R"([["gx", 0, 1]])", ": op 0: expected [\"ge\"|\"gx\", graph]"},
      {R"([["a", 0, 1, 0], ["r", 0]])", ": op 1: expected [\"r\", id, stream] (Tensor.record_stream)"},
      {R"([["k", 2, 1]])", ": op 0: expected [\"k\", stream] (a kernel on the stream)"},
      {R"([["e"], ["w", 1]])", ": op 1: expected [\"w\", a, b] (streams[a].wait_stream(streams[b]))"},
      {R"([["cfg", "a b"]])", ": op 0 text: expected allocator settings without whitespace, e.g. "
                              "\"graph_capture_record_stream_reuse:True\""},
      {R"([["zz", 0]])", ": op 0: unknown op \"zz\" (expected \"a\", \"f\", \"r\", \"e\", \"pb\", \"pe\", \"pr\", \"gb\", \"ge\", \"gx\", \"w\", \"k\" or \"cfg\")"},
  };
  for (const auto& [text, message] : rows) {
    const std::string path = write_temp("bad.json", text);
    try {
      (void)read_ops(path);
      ADD_FAILURE() << text << ": no error";
    } catch (const ReadError& e) {
      EXPECT_EQ(std::string(e.what()), path + message) << text;
    }
    std::filesystem::remove(path);
  }
}

}  // namespace
}  // namespace cachet::io

// summary_test: cachet's copies of PyTorch's texts against what PyTorch 2.11 printed.
//
// Data (all recorded from torch 2.11.0+cu130 on an H200):
//   tests/data/oracle/results/res_*.json.gz   `final_stats` (memory_stats()) and `summary`
//                                            (memory_summary()) at the end of each replay;
//                                            res_pressure_default also has `oom_messages`.
//   tests/summary/data/summary.json + summary_full.txt   the probe's stats and their full and
//                                            abbreviated summaries (probe P14).
//   tests/summary/data/oom_msg.json, fraction.json      the probe's OOM messages.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cachet/errors.h"
#include "cachet/io/file.h"
#include "cachet/stats.h"
#include "cachet/summary.h"

namespace {

using cachet::Bytes;
using cachet::GiB;
using cachet::MiB;
using nlohmann::json;

const std::string kResults = CACHET_TEST_DATA "/oracle/results";
const std::string kProbe = CACHET_SOURCE_DIR "/tests/summary/data";

json load(const std::string& path) { return json::parse(cachet::io::read_file(path)); }

cachet::DeviceStats stats_of(const json& j) {
  std::map<std::string, std::int64_t> kv;
  for (const auto& [k, v] : j.items()) kv[k] = v.get<std::int64_t>();
  std::vector<std::string> unknown;
  cachet::DeviceStats s = cachet::unflatten(kv, &unknown);
  EXPECT_TRUE(unknown.empty()) << "unknown stat key " << unknown.front();
  return s;
}

std::vector<std::string> recordings() {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(kResults)) {
    if (e.path().string().ends_with(".json.gz")) out.push_back(e.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

// --- memory_summary -------------------------------------------------------------------------

TEST(MemorySummary, EveryRecordingByteForByte) {
  const auto files = recordings();
  ASSERT_EQ(files.size(), 30u) << "tests/data/oracle/results should hold the 30 recordings";
  for (const auto& path : files) {
    SCOPED_TRACE(path);
    const json rec = load(path);
    const cachet::DeviceStats s = stats_of(rec.at("final_stats"));
    // Every replay ran on device 0 (`device` holds the GPU name).
    EXPECT_EQ(cachet::memory_summary(s, 0, false),
              rec.at("summary").get<std::string>());
  }
}

TEST(MemorySummary, ProbeFullAndAbbreviated) {
  const cachet::DeviceStats s = stats_of(load(kProbe + "/summary.json").at("stats"));
  const std::string text = cachet::io::read_file(kProbe + "/summary_full.txt");
  const std::string sep = "\n\n=== abbreviated ===\n";  // after the full text's final "|\n"
  const auto at = text.find(sep);
  ASSERT_NE(at, std::string::npos);
  const std::string full = text.substr(0, at);
  const std::string abbreviated = text.substr(at + sep.size());
  EXPECT_EQ(cachet::memory_summary(s, 0, false), full);
  EXPECT_EQ(cachet::memory_summary(s, 0, true), abbreviated);
}

TEST(MemorySummary, UnitsStepUpFromTheAllRow) {
  // memory.py: 768 KiB stays in bytes' next unit only from 768*1024 on; sub-rows use the unit
  // of their "all" row. Values chosen at the thresholds of _format_size/_format_count.
  cachet::DeviceStats s;
  s.allocated_bytes[0].current = 786431;  // < 768 KiB: bytes
  s.allocated_bytes[2].current = 786431;
  s.allocated_bytes[0].peak = 786432;     // = 768 KiB: KiB
  s.allocation[0].current = 749999;       // counts: no unit
  s.allocation[0].peak = 750000;          // 750 K
  s.num_ooms = 3;
  s.num_alloc_retries = 12345678;
  const std::string out = cachet::memory_summary(s, 7, false);
  EXPECT_NE(out.find("| Allocated memory      | 786431 B   |    768 KiB |      0 B   |      0 B   |"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("|       from large pool | 786431 B   |      0 KiB |      0 B   |      0 B   |"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("| Allocations           |  749999    |     750 K  |       0    |       0    |"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("|            CUDA OOMs: 3            |        cudaMalloc retries: 12345678  |"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("PyTorch CUDA memory summary, device ID 7                 |"), std::string::npos);
}

// --- format_size ----------------------------------------------------------------------------

TEST(FormatSize, PyTorchUnits) {
  EXPECT_EQ(cachet::format_size(0), "0 bytes");
  EXPECT_EQ(cachet::format_size(1024), "1024 bytes");
  EXPECT_EQ(cachet::format_size(1025), "1.00 KiB");
  EXPECT_EQ(cachet::format_size(MiB), "1024.00 KiB");
  EXPECT_EQ(cachet::format_size(2 * MiB), "2.00 MiB");          // fraction.json alloc_with_0
  EXPECT_EQ(cachet::format_size(GiB), "1024.00 MiB");
  EXPECT_EQ(cachet::format_size(150109880320), "139.80 GiB");   // H200 total capacity
  EXPECT_EQ(cachet::format_size(858993459200000000), "800000000.00 GiB");  // oom_msg.json huge
}

// --- oom_message ----------------------------------------------------------------------------

// Bytes that format_size prints as `v` `unit` (the numbers implied by a message).
Bytes implied(double v, Bytes unit) { return static_cast<Bytes>(std::llround(v * static_cast<double>(unit))); }

constexpr Bytes kH200Total = 150109880320;  // the recordings' total_memory

TEST(OomMessage, PressureDefaultRecording) {
  const json rec = load(kResults + "/res_pressure_default.json.gz");
  const auto msgs = rec.at("oom_messages").get<std::vector<std::string>>();
  ASSERT_EQ(msgs.size(), 3u);
  ASSERT_EQ(rec.at("total_memory").get<Bytes>(), kH200Total);
  const Bytes cap = rec.at("cap").get<Bytes>();
  struct Row {
    double alloc_mib, free_gib, proc_gib, allocated_gib, unallocated;
    Bytes unallocated_unit;
  };
  const Row rows[3] = {{648, 133.72, 6.07, 3.42, 2.08, GiB},
                       {748, 133.72, 6.07, 3.05, 2.45, GiB},
                       {1.16 * 1024, 133.62, 6.17, 4.73, 879.87, MiB}};
  for (int i = 0; i < 3; ++i) {
    cachet::OomFacts f;
    f.alloc_size = implied(rows[i].alloc_mib, MiB);
    f.device = 0;
    f.device_total = kH200Total;
    f.device_free = implied(rows[i].free_gib, GiB);
    f.process_in_use = implied(rows[i].proc_gib, GiB);
    f.allowed = cap;
    f.allocated = implied(rows[i].allocated_gib, GiB);
    f.reserved = f.allocated + implied(rows[i].unallocated, rows[i].unallocated_unit);
    EXPECT_EQ(cachet::oom_message(f), msgs[i]) << "message " << i;
  }
}

TEST(OomMessage, ProbeHugeFractionAndExa) {
  const json oom = load(kProbe + "/oom_msg.json");
  const json obs = oom.at("observer_calls");
  const json after = oom.at("stats_after");

  cachet::OomFacts huge;
  huge.alloc_size = obs[0][1].get<Bytes>();
  huge.device_total = obs[0][2].get<Bytes>();
  huge.device_free = obs[0][3].get<Bytes>();
  huge.process_in_use = 518 * MiB;
  EXPECT_EQ(cachet::oom_message(huge), oom.at("huge")[1].get<std::string>());

  cachet::OomFacts frac;
  frac.alloc_size = obs[1][1].get<Bytes>();
  frac.allowed = obs[1][2].get<Bytes>();  // the observer gets allowed_max when a cap is set
  frac.device_total = kH200Total;
  frac.device_free = obs[1][3].get<Bytes>();
  frac.process_in_use = 568 * MiB;
  frac.allocated = after.at("allocated_bytes.all.current").get<Bytes>();
  frac.reserved = after.at("reserved_bytes.all.current").get<Bytes>();
  EXPECT_EQ(cachet::oom_message(frac), oom.at("fraction")[1].get<std::string>());

  cachet::OomFacts exa;
  exa.alloc_size = cachet::kMaxRequest;
  EXPECT_EQ(cachet::oom_message(exa), oom.at("exa")[1].get<std::string>());
}

TEST(OomMessage, ProbeFractionZeroAllowed) {
  const json fr = load(kProbe + "/fraction.json");
  cachet::OomFacts f;
  f.alloc_size = 2 * MiB;  // a 1-byte request under fraction 0 asks for a 2 MiB segment
  f.device_total = kH200Total;
  f.device_free = implied(139.29, GiB);
  f.process_in_use = 518 * MiB;
  f.allowed = 0;
  EXPECT_EQ(cachet::oom_message(f), fr.at("alloc_with_0")[1].get<std::string>());
}

TEST(OomMessage, PrivatePoolsAndNoNvml) {
  // Wording of the optional parts (docs/pytorch-allocator.md §3.7): no proc_info without NVML,
  // private_msg when private pools hold free blocks, counted in "allocated by PyTorch" and out of
  // "unallocated".
  cachet::OomFacts f;
  f.alloc_size = 20 * MiB;
  f.device = 1;
  f.device_total = 80 * GiB;
  f.device_free = 10 * MiB;
  f.allocated = 3 * MiB;
  f.private_pool_free = 1 * MiB;
  f.reserved = 6 * MiB;
  EXPECT_EQ(cachet::oom_message(f),
            "CUDA out of memory. Tried to allocate 20.00 MiB. GPU 1 has a total capacity of 80.00 "
            "GiB of which 10.00 MiB is free. Of the allocated memory 4.00 MiB is allocated by "
            "PyTorch, with 1024.00 KiB allocated in private pools (e.g., CUDA Graphs), and 2.00 MiB "
            "is reserved by PyTorch but unallocated. If reserved but unallocated memory is large "
            "try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  "
            "See documentation for Memory Management  "
            "(https://docs.pytorch.org/docs/stable/notes/cuda.html"
            "#optimizing-memory-usage-with-pytorch-cuda-alloc-conf)");
}

// An allocator throws OutOfMemory with its facts; what() is oom_message's text of them, formatted
// at the first what(), and copies read the same text.
TEST(OomMessage, OutOfMemoryFromFactsReadsTheirText) {
  cachet::OomFacts f;
  f.alloc_size = 20 * MiB;
  f.device_total = 80 * GiB;
  f.device_free = 10 * MiB;
  f.reserved = 2 * MiB;
  const cachet::OutOfMemory e(f);
  ASSERT_NE(e.facts(), nullptr);
  EXPECT_EQ(e.facts()->alloc_size, 20 * MiB);
  EXPECT_EQ(e.facts()->device_free, 10 * MiB);
  const cachet::OutOfMemory copy = e;
  const std::string expected =
      "CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of 80.00 GiB of which 10.00 "
      "MiB is free. Of the allocated memory 0 bytes is allocated by PyTorch, and 2.00 MiB is reserved by PyTorch "
      "but unallocated. If reserved but unallocated memory is large try setting "
      "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory "
      "Management  (https://docs.pytorch.org/docs/stable/notes/cuda.html"
      "#optimizing-memory-usage-with-pytorch-cuda-alloc-conf)";
  EXPECT_EQ(std::string(copy.what()), expected);
  EXPECT_EQ(std::string(e.what()), expected);
  const cachet::OutOfMemory text("CUDA error: out of memory");
  EXPECT_EQ(text.facts(), nullptr);
  EXPECT_EQ(std::string(text.what()), "CUDA error: out of memory");
}

}  // namespace

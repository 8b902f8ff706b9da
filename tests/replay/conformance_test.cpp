// Replaying PyTorch's own recordings with their recorded configuration and addresses
// reproduces PyTorch's numbers: the four workloads (tests/data/oracle/workloads, peaks from
// their .stats.json final_stats) and every oracle recording (results/*.json.gz, replayed from
// its trace rows, compared with its final_stats).
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "cachet/replay/replay.h"
#include "cachet/stats.h"

namespace {

using namespace cachet;
using namespace cachet::replay;
namespace fs = std::filesystem;

const std::string kData = std::string(CACHET_TEST_DATA) + "/oracle/";

std::vector<std::string> files(const std::string& dir, const std::string& suffix) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(kData + dir)) {
    const std::string p = e.path().string();
    if (p.size() > suffix.size() && p.compare(p.size() - suffix.size(), suffix.size(), suffix) == 0) out.push_back(p);
  }
  std::sort(out.begin(), out.end());
  return out;
}

void expect_reproduces(const std::string& path, bool all_keys) {
  SCOPED_TRACE(path);
  LoadedTrace lt = load_trace(path);
  ASSERT_FALSE(lt.file.final_stats.empty()) << "no recorded final_stats";
  ASSERT_TRUE(lt.recorded_config.has_value() || !lt.file.settings.conf);
  ReplayResult r = cachet::replay::replay(lt.trace, lt.run.config, recorded_options(lt, AddressMode::Recorded));
  EXPECT_TRUE(r.recorded_addresses) << r.note;
  EXPECT_EQ(r.peak_allocated(), lt.file.final_stats.at("allocated_bytes.all.peak"));
  EXPECT_EQ(r.peak_reserved(), lt.file.final_stats.at("reserved_bytes.all.peak"));
  if (all_keys) {
    for (const auto& [k, v] : flatten(r.stats)) {
      auto it = lt.file.final_stats.find(k);
      if (it != lt.file.final_stats.end()) {
        EXPECT_EQ(v, it->second) << k;
      }
    }
  }
}

TEST(ReplayConformance, WorkloadPeaksAreExact) {
  const auto traces = files("workloads", ".trace.json.gz");
  ASSERT_EQ(traces.size(), 4u);
  for (const auto& p : traces) {
    // The peaks come from the .stats.json beside the trace (read_trace's sidecar).
    LoadedTrace lt = load_trace(p);
    EXPECT_FALSE(lt.file.sidecar.empty()) << p;
    expect_reproduces(p, true);
  }
}

TEST(ReplayConformance, EveryRecordingReproducesItsFinalStats) {
  const auto recs = files("results", ".json.gz");
  ASSERT_GE(recs.size(), 30u);
  for (const auto& p : recs) expect_reproduces(p, true);
}

// Synthetic addresses change best-fit tie-breaks (equal sizes go to the lowest address), so
// the peaks may differ slightly from the recorded run; they stay close.
TEST(ReplayConformance, SyntheticAddressesGiveClosePeaksOnWorkloads) {
  for (const auto& p : files("workloads", ".trace.json.gz")) {
    SCOPED_TRACE(p);
    LoadedTrace lt = load_trace(p);
    ReplayResult r = cachet::replay::replay(lt.trace, lt.run.config, recorded_options(lt, AddressMode::Synthetic));
    const auto rp = static_cast<double>(lt.file.final_stats.at("reserved_bytes.all.peak"));
    const auto ap = static_cast<double>(lt.file.final_stats.at("allocated_bytes.all.peak"));
    EXPECT_NEAR(static_cast<double>(r.peak_reserved()), rp, rp * 0.01);
    EXPECT_NEAR(static_cast<double>(r.peak_allocated()), ap, ap * 0.01);
  }
}

}  // namespace

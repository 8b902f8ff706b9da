// `cachet conform RESULT --policy cachet` (tools/conform_cachet.h): policy:cachet's waste on a
// private-pool recording, through its model and the production allocator side by side with their
// invariants after every op, and the refusals of bad options. Data: tests/data/oracle-h100
// (README.md there).
#include <gtest/gtest.h>

#include <string>

#include "cachet/test/cli_run.h"

namespace {

const std::string kResults = std::string(CACHET_TEST_DATA) + "/oracle-h100/results/";

using cachet::test::CliRun;

// `cachet ARGS`, stdout and stderr in one text, in the order written.
CliRun cachet(const std::string& args) { return cachet::test::run_cachet(args, cachet::test::Stderr::merged); }

bool has(const std::string& out, const std::string& line) { return out.find(line + "\n") != std::string::npos; }

// The graph-capture sequence under PyTorch's 1,879,048,192 B cap (1.75 GiB), where PyTorch ran
// out of memory 5 times. What was checked independently of policy:cachet's code: PyTorch's
// figures are the recording's final memory_stats(); policy:cachet served every request, so its
// requested peak is that of the same ops without a cap, recorded by PyTorch in
// res_graphs_default (1,328,885,618 B); its peak reserved, 775 pages = 1,625,292,800 B, lies
// under the cap (896 pages), as 0 OOMs needs; its two implementations (model/ and gpu/, no code
// shared) agree on every op's outcome and byte stats.
TEST(ConformCachet, GraphsUnderACapWasteAndOoms) {
  const CliRun r = cachet("conform " + kResults + "res_graphs_defaultcap.json.gz --policy cachet");
  EXPECT_EQ(r.rc, 0) << r.out;
  EXPECT_TRUE(has(r.out, "  peak requested: policy:cachet 1328885618 B, PyTorch 1295309909 B")) << r.out;
  EXPECT_TRUE(has(r.out, "  peak reserved: policy:cachet 1625292800 B (1.2230 x peak requested), PyTorch "
                         "1879048192 B (1.4507)"))
      << r.out;
  EXPECT_TRUE(has(r.out, "  reserved at end: policy:cachet 1495269376 B, PyTorch 1623195648 B")) << r.out;
  EXPECT_TRUE(has(r.out, "  OOMs: policy:cachet 0, PyTorch 5")) << r.out;
  EXPECT_TRUE(has(r.out, "conform --policy cachet: 1660 ops, 0 problems")) << r.out;
  EXPECT_NE(r.out.find("through cachet-model and impl"), std::string::npos) << r.out;
}

TEST(ConformCachet, OneEngineOnRequest) {
  const CliRun r = cachet("conform " + kResults + "res_pools_default.json.gz --policy cachet --engine model");
  EXPECT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("2501 ops through cachet-model (invariants"), std::string::npos) << r.out;
}

TEST(ConformCachet, BadPolicyOrEngineIsRefused) {
  CliRun r = cachet("conform " + kResults + "res_pools_default.json.gz --policy lowwaste");
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_NE(r.out.find("--policy must be pytorch or cachet (got \"lowwaste\")"), std::string::npos) << r.out;
  r = cachet("conform " + kResults + "res_pools_default.json.gz --policy cachet --engine fast");
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_NE(r.out.find("--engine must be model, impl or both (got \"fast\")"), std::string::npos) << r.out;
}

}  // namespace

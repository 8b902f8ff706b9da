// Replays every tests/fuzz_regressions/*.ops case (made by fuzz/crash-to-test from a fuzz_ops
// crash) through the lockstep harness: the model and the real allocator agree after every op.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "src/ops_interp.h"

namespace {

std::vector<std::string> cases() {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(CACHET_FUZZ_REGRESSIONS))
    if (e.path().extension() == ".ops") out.push_back(e.path().stem().string());
  std::sort(out.begin(), out.end());
  return out;
}

class FuzzRegression : public testing::TestWithParam<std::string> {};

TEST_P(FuzzRegression, ModelAndAllocatorAgree) {
  const std::string path = std::string(CACHET_FUZZ_REGRESSIONS) + "/" + GetParam() + ".ops";
  std::ifstream in(path);
  ASSERT_TRUE(in) << path;
  const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  const cachet::fuzz::Case c = cachet::fuzz::parse_ops_file(text);
  ASSERT_FALSE(c.ops.empty()) << path << " holds no ops";
  EXPECT_EQ(cachet::fuzz::run_case(c), "") << path << "\n" << text;
}

INSTANTIATE_TEST_SUITE_P(Cases, FuzzRegression, testing::ValuesIn(cases()),
                         [](const testing::TestParamInfo<std::string>& i) {
                           std::string n = i.param;
                           for (char& ch : n)
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return n;
                         });

TEST(FuzzRegressionFormat, OpsFileRoundTrips) {
  cachet::fuzz::Case c;
  c.config = "max_split_size_mb:128";
  c.capacity = 256ull << 20;
  c.ops = {cachet::lockstep::Allocate{1000, 1, {}}, cachet::lockstep::Free{0}, cachet::lockstep::EmptyCache{}};
  const cachet::fuzz::Case back = cachet::fuzz::parse_ops_file(cachet::fuzz::to_ops_file(c));
  EXPECT_EQ(back.config, c.config);
  EXPECT_EQ(back.capacity, c.capacity);
  EXPECT_EQ(back.ops, c.ops);
}

}  // namespace

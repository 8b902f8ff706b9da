// check_conf_test: `cachet check-conf STRING` as a user runs it (the built binary, CACHET_BIN):
// exit 0 with exactly one canonical line on stdout that parses back to the same configuration,
// warnings on stderr; exit 2 with the error and a caret under the offending column.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <sys/wait.h>
#include <unistd.h>

#include "cachet/config.h"

namespace {

struct Outcome {
  int status = -1;
  std::string out;
  std::string err;
};

std::string slurp(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Single-quotes `s` for /bin/sh.
std::string quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

Outcome check_conf(const std::string& args) {
  const auto dir = std::filesystem::temp_directory_path();
  const auto out = dir / ("check_conf_out_" + std::to_string(::getpid()));
  const auto err = dir / ("check_conf_err_" + std::to_string(::getpid()));
  const std::string cmd = std::string(CACHET_BIN) + " check-conf " + args + " >" + out.string() +
                          " 2>" + err.string();
  const int rc = std::system(cmd.c_str());
  Outcome r;
  r.status = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  r.out = slurp(out);
  r.err = slurp(err);
  std::filesystem::remove(out);
  std::filesystem::remove(err);
  return r;
}

TEST(CheckConf, ValidPrintsOneCanonicalLine) {
  const Outcome r = check_conf(quote(" garbage_collection_threshold:0.6 , max_split_size_mb : 64 ,"));
  EXPECT_EQ(r.status, 0);
  EXPECT_EQ(r.out, "max_split_size_mb:64,garbage_collection_threshold:0.6\n");
  // the GC-without-cap warning (PyTorch issue #106660) goes to stderr
  EXPECT_NE(r.err.find("warning:"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("per_process_memory_fraction"), std::string::npos) << r.err;
  const std::string line = r.out.substr(0, r.out.size() - 1);
  EXPECT_EQ(cachet::parse_config(line, cachet::ConfigSource::PyTorch).config,
            cachet::parse_config(" garbage_collection_threshold:0.6 , max_split_size_mb : 64 ,",
                                 cachet::ConfigSource::PyTorch)
                .config);
}

TEST(CheckConf, RecordingConfigs) {
  // The six PYTORCH_CUDA_ALLOC_CONF strings of the oracle recordings, and their normal forms.
  const std::pair<std::string, std::string> cases[] = {
      {"", "\n"},
      {"max_split_size_mb:128", "max_split_size_mb:128\n"},
      {"max_split_size_mb:256,roundup_power2_divisions:4",
       "max_split_size_mb:256,roundup_power2_divisions:4\n"},
      {"garbage_collection_threshold:0.6,max_split_size_mb:64",
       "max_split_size_mb:64,garbage_collection_threshold:0.6\n"},
      {"roundup_power2_divisions:[256:1,512:2,1024:4,>:8]",
       "roundup_power2_divisions:[256:1,512:2,1024:4,>:8]\n"},
      {"expandable_segments:True", "expandable_segments:True\n"},
  };
  for (const auto& [in, want] : cases) {
    SCOPED_TRACE(in);
    const Outcome r = check_conf(quote(in));
    EXPECT_EQ(r.status, 0) << r.err;
    EXPECT_EQ(r.out, want);
  }
}

TEST(CheckConf, OutOfOrderDivisionsListWarnsAndPrintsAnAscendingOne) {
  // PyTorch 2.11 (c10/core/AllocatorConfig.cpp, parseRoundUpPower2Divisions) applies the list in
  // the order written: '>' fills from after 128 MiB, so 256:1 is overwritten by 4.
  const Outcome r = check_conf(quote("roundup_power2_divisions:[256:1,128:2,>:4]"));
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "roundup_power2_divisions:[64:1,128:2,>:4]\n");
  EXPECT_NE(r.err.find("warning: column 33:"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("'256:1' is overwritten"), std::string::npos) << r.err;
}

TEST(CheckConf, ErrorWithCaret) {
  const std::string s = "max_split_size_mb:128;garbage_interval:5";
  const Outcome r = check_conf(quote(s));
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.out, "");
  EXPECT_NE(r.err.find("not ';'"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("garbage_collection_threshold"), std::string::npos) << r.err;
  // the string, then a caret under column 22 (the ';')
  EXPECT_NE(r.err.find("\n  " + s + "\n  " + std::string(21, ' ') + "^\n"), std::string::npos)
      << r.err;
}

// Was: "'PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb' is no option", "'\"max_split_size_mb' is no
// option", and CLI11's "The following argument was not expected" for an unquoted second option.
TEST(CheckConf, PastedAssignmentQuotesAndSplitStringsAreNamed) {
  Outcome r = check_conf(quote("PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:128"));
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.err,
            "error: the string starts with the variable's name: give only its value, what follows "
            "'PYTORCH_CUDA_ALLOC_CONF=' ('PYTORCH_CUDA_ALLOC_CONF=' at column 1)\n"
            "  PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:128\n  ^\n");
  r = check_conf(quote("\"expandable_segments:True\""));
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.err,
            "error: the value has quotes in it: remove them (quotes around the value belong to the shell, not "
            "to it) ('\"' at column 1)\n  \"expandable_segments:True\"\n  ^\n");
  r = check_conf("max_split_size_mb:128 expandable_segments:True");
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(r.err,
            "error: check-conf takes one string, got 2 arguments; quote the string, with its options separated "
            "by ',': cachet check-conf 'max_split_size_mb:128,expandable_segments:True'\n");
}

TEST(CheckConf, SourceDecidesCachetKeys) {
  Outcome r = check_conf(quote("policy:cachet"));
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("CACHET_ALLOC_CONF"), std::string::npos) << r.err;
  r = check_conf("--source cachet " + quote("cachet_validate:True,policy:cachet"));
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "policy:cachet,cachet_validate:True\n");
  r = check_conf("--source pytorch " + quote("max_split_size_mb:-1"));
  EXPECT_EQ(r.status, 2);
  r = check_conf("--source nonsense " + quote(""));
  EXPECT_EQ(r.status, 2);
}

TEST(CheckConf, MissingArgumentIsBadInput) {
  const Outcome r = check_conf("");
  EXPECT_EQ(r.status, 2);
}

}  // namespace

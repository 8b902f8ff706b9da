// cachet/test/cli_run.h: the one runner of the `cachet` command (and of any other command line) for
// the tests that check the CLI: conform_cli_test, conform_cachet_test, explain_test, report_test,
// replay_cli_test and bad_input_test. The command runs through the shell (popen): its stdout is
// read through the pipe, its stderr lands in a scratch file and is read back, and the exit status
// is the process's (-1 when it did not exit normally). Link cachet_test_cli (tests/common), which
// defines CACHET_EXE, the `cachet` executable under test.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace cachet::test {

// What a command did: its exit status, its stdout and its stderr (empty when `merged`).
struct CliRun {
  int rc = -1;
  std::string out;
  std::string err;
};

// The whole of a file (empty when it cannot be read).
inline std::string slurp(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// A scratch folder for this test process, $TMPDIR/cachet_<name>_<pid> (name: the test executable's
// by default), created if missing.
inline std::filesystem::path scratch_dir(const std::string& name = program_invocation_short_name) {
  std::filesystem::path d = std::filesystem::temp_directory_path() / ("cachet_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::create_directories(d);
  return d;
}

enum class Stderr { separate, merged };

// Runs `command` through the shell. With Stderr::merged, stderr goes to stdout (2>&1) and `err` is
// empty; a command that redirects its own stdout (`>/dev/full`) leaves `out` empty.
inline CliRun run_shell(const std::string& command, Stderr mode = Stderr::separate) {
  const std::filesystem::path err_file = scratch_dir("cli_run") / "stderr";
  const std::string line = command + (mode == Stderr::merged ? " 2>&1" : " 2>" + err_file.string());
  CliRun r;
  FILE* p = popen(line.c_str(), "r");
  if (p == nullptr) {
    r.err = "popen failed for: " + line;
    return r;
  }
  std::array<char, 4096> buf{};
  std::size_t n = 0;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  const int status = pclose(p);
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  if (mode == Stderr::separate) r.err = slurp(err_file);
  return r;
}

// `cachet ARGS` (ARGS as the shell reads them).
inline CliRun run_cachet(const std::string& args, Stderr mode = Stderr::separate) {
  return run_shell(std::string(CACHET_EXE) + " " + args, mode);
}

}  // namespace cachet::test

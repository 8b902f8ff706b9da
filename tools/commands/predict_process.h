// tools/predict_process.h: starting the programs `cachet predict` drives (the capture in the
// user's Python, and cachet's own replay, tune and explain for the answers), and finding the files
// it needs (the fake CUDA device, the cachet_torch package) in the build tree or the installation.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace cachet::cli {

struct ProcessResult {
  int exit_code = -1;   // the exit status; 128 + signal when killed by one
  std::string out;      // its standard output, when captured
};

// Runs argv[0] (looked up on PATH) with `env` added to this process's environment. Its standard
// output is captured into `out` when capture_stdout, else sent to this process's standard error
// (so that --json keeps stdout for the answer). Standard error is passed through. nullopt (with
// `error` set) when it cannot be started.
std::optional<ProcessResult> run_process(const std::vector<std::string>& argv,
                                         const std::map<std::string, std::string>& env, bool capture_stdout,
                                         std::string* error);

// The running cachet executable's path (/proc/self/exe).
std::string self_path();
// The folder holding the cachet_torch package: $CACHET_PYTHONPATH, else the source tree's python/,
// else the installation's lib/cachet/python, else where `python` imports it from (pip). Empty
// when none exists.
std::string find_python_package_dir(const std::string& python);
// libcachet_fakecuda.so: $CACHET_FAKECUDA, else the build tree's, else the installation's lib/cachet/,
// else inside the cachet_torch package of `package_dir` (pip). Empty when none exists.
std::string find_fakecuda(const std::string& package_dir);

}  // namespace cachet::cli

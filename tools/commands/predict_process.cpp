// tools/predict_process.cpp: see predict_process.h.
#include "predict_process.h"

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>

extern char** environ;

namespace cachet::cli {
namespace fs = std::filesystem;

std::optional<ProcessResult> run_process(const std::vector<std::string>& argv,
                                         const std::map<std::string, std::string>& env, bool capture_stdout,
                                         std::string* error) {
  std::map<std::string, std::string> all;
  for (char** e = environ; *e; ++e) {
    const char* eq = std::strchr(*e, '=');
    if (eq) all[std::string(*e, static_cast<std::size_t>(eq - *e))] = eq + 1;
  }
  for (const auto& [k, v] : env) all[k] = v;
  std::vector<std::string> env_text;
  for (const auto& [k, v] : all) env_text.push_back(k + "=" + v);
  std::vector<char*> envp, args;
  for (std::string& s : env_text) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> argv_copy = argv;
  for (std::string& s : argv_copy) args.push_back(s.data());
  args.push_back(nullptr);

  int pipefd[2] = {-1, -1};
  if (capture_stdout && pipe(pipefd) != 0) {
    *error = std::strerror(errno);
    return std::nullopt;
  }
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  if (capture_stdout) {
    posix_spawn_file_actions_adddup2(&fa, pipefd[1], 1);
    posix_spawn_file_actions_addclose(&fa, pipefd[0]);
    posix_spawn_file_actions_addclose(&fa, pipefd[1]);
  } else {
    posix_spawn_file_actions_adddup2(&fa, 2, 1);
  }
  pid_t pid = 0;
  const int rc = posix_spawnp(&pid, args[0], &fa, nullptr, args.data(), envp.data());
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) {
    if (capture_stdout) {
      close(pipefd[0]);
      close(pipefd[1]);
    }
    *error = std::strerror(rc);
    return std::nullopt;
  }
  ProcessResult r;
  if (capture_stdout) {
    close(pipefd[1]);
    char buf[65536];
    for (;;) {
      const ssize_t n = read(pipefd[0], buf, sizeof buf);
      if (n > 0) r.out.append(buf, static_cast<std::size_t>(n));
      else if (n == 0 || errno != EINTR) break;
    }
    close(pipefd[0]);
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

std::string self_path() {
  std::error_code ec;
  fs::path p = fs::read_symlink("/proc/self/exe", ec);
  return ec ? std::string("cachet") : p.string();
}

std::string find_fakecuda(const std::string& package_dir) {
  if (const char* e = std::getenv("CACHET_FAKECUDA"); e && *e) return e;
  std::vector<fs::path> candidates;
#ifdef CACHET_BUILD_FAKECUDA
  candidates.emplace_back(CACHET_BUILD_FAKECUDA);
#endif
  const fs::path exe_dir = fs::path(self_path()).parent_path();
  candidates.push_back(exe_dir / ".." / "python" / "fakecuda" / "libcachet_fakecuda.so");
  candidates.push_back(exe_dir / ".." / "lib" / "cachet" / "libcachet_fakecuda.so");
  candidates.push_back(exe_dir / ".." / "lib64" / "cachet" / "libcachet_fakecuda.so");
  if (!package_dir.empty()) candidates.push_back(fs::path(package_dir) / "cachet_torch" / "libcachet_fakecuda.so");
  for (const fs::path& c : candidates) {
    std::error_code ec;
    if (fs::exists(c, ec)) return fs::weakly_canonical(c, ec).string();
  }
  return {};
}

std::string find_python_package_dir(const std::string& python) {
  if (const char* e = std::getenv("CACHET_PYTHONPATH"); e && *e) return e;
  std::vector<fs::path> candidates;
#ifdef CACHET_SOURCE_PYTHON_DIR
  candidates.emplace_back(CACHET_SOURCE_PYTHON_DIR);
#endif
  const fs::path exe_dir = fs::path(self_path()).parent_path();
  candidates.push_back(exe_dir / ".." / "lib" / "cachet" / "python");
  for (const fs::path& c : candidates) {
    std::error_code ec;
    if (fs::exists(c / "cachet_torch" / "_capture.py", ec)) return fs::weakly_canonical(c, ec).string();
  }
  // Installed with pip into that Python's environment: ask it (importing cachet_torch never imports torch).
  std::string error;
  auto r = run_process({python, "-c", "import cachet_torch, os; print(os.path.dirname(os.path.dirname(cachet_torch.__file__)))"},
                       {}, true, &error);
  if (r && r->exit_code == 0) {
    std::string dir = r->out.substr(0, r->out.find('\n'));
    std::error_code ec;
    if (!dir.empty() && fs::exists(fs::path(dir) / "cachet_torch" / "_capture.py", ec)) return dir;
  }
  return {};
}

}  // namespace cachet::cli

// Runs the tests' Python scripts (the PyTorch reference twins, tests/hf/*.py, the tokenizer
// references) as `TRAINER_PYTHON SCRIPT ARGS > LOG 2>&1` would, through one fork server per test
// binary (tests/hf/fork_server.py): it imports torch, transformers and PEFT once and forks a fresh
// child per script, which saves each script the 3 to 7 s of those imports (docs/DESIGN.md, "Tests
// and benchmarks"). TRAINER_TEST_FORK_SERVER=0 starts a plain Python per script instead. For test
// binaries whose target defines TRAINER_SOURCE_DIR and TRAINER_PYTHON.
#pragma once

#include <nlohmann/json.hpp>

#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <string>

#include <fcntl.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

extern char** environ;

namespace test {

class PythonRunner {
 public:
  static PythonRunner& instance() {
    static PythonRunner runner;
    return runner;
  }

  // The exit status of `script` (a path) run with `args` (split as a shell would), its stdout and
  // stderr in `log`; -1 when the server could not start or died.
  int run(const std::string& script, const std::string& args, const std::string& log) {
    const char* use = std::getenv("TRAINER_TEST_FORK_SERVER");
    if (use && std::string(use) == "0") return plain(script, args, log);
    std::lock_guard<std::mutex> lock(mutex_);
    if (fd_ < 0 && !start()) return -1;
    const std::string line =
        nlohmann::json{{"script", script}, {"args", args}, {"log", log}}.dump() + "\n";
    std::string answer;
    if (!write_all(line) || !read_line(answer)) {
      stop();
      std::ofstream(log, std::ios::app)
          << "\n[python_runner] the fork server (tests/hf/fork_server.py) died or did not start; "
             "TRAINER_TEST_FORK_SERVER=0 runs each script in a Python of its own\n";
      return -1;
    }
    return std::atoi(answer.c_str());
  }

  PythonRunner(const PythonRunner&) = delete;
  PythonRunner& operator=(const PythonRunner&) = delete;

 private:
  PythonRunner() = default;
  ~PythonRunner() { stop(); }

  static int plain(const std::string& script, const std::string& args, const std::string& log) {
    const std::string cmd =
        std::string(TRAINER_PYTHON) + " " + script + " " + args + " > " + log + " 2>&1";
    const int status = std::system(cmd.c_str());
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }

  // The server on a socket of ours as its descriptor 3 (a descriptor above 3 first, so that the
  // spawn's dup2 always clears close-on-exec).
  bool start() {
    int sv[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) return false;
    const int theirs = ::fcntl(sv[1], F_DUPFD_CLOEXEC, 10);
    ::close(sv[1]);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, theirs, 3);
    const std::string python = TRAINER_PYTHON;
    const std::string server = std::string(TRAINER_SOURCE_DIR) + "/tests/hf/fork_server.py";
    char* argv[] = {const_cast<char*>(python.c_str()), const_cast<char*>(server.c_str()),
                    const_cast<char*>("3"), nullptr};
    const int rc = ::posix_spawn(&pid_, python.c_str(), &actions, nullptr, argv, environ);
    posix_spawn_file_actions_destroy(&actions);
    ::close(theirs);
    if (rc != 0) {
      ::close(sv[0]);
      return false;
    }
    fd_ = sv[0];
    std::signal(SIGPIPE, SIG_IGN);  // a dead server is an error from write, not a signal
    return true;
  }

  void stop() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
    if (pid_ > 0) ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

  bool write_all(const std::string& s) {
    for (size_t done = 0; done < s.size();) {
      const ssize_t n = ::write(fd_, s.data() + done, s.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return false;
      done += static_cast<size_t>(n);
    }
    return true;
  }

  bool read_line(std::string& line) {
    for (char c;;) {
      const ssize_t n = ::read(fd_, &c, 1);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return false;
      if (c == '\n') return true;
      line += c;
    }
  }

  std::mutex mutex_;
  int fd_ = -1;
  pid_t pid_ = -1;
};

// `TRAINER_PYTHON script args > log 2>&1`, through the fork server: the exit status.
inline int run_python(const std::string& script, const std::string& args, const std::string& log) {
  return PythonRunner::instance().run(script, args, log);
}

}  // namespace test

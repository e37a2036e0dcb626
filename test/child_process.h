// child_process.h — runs a piece of a CPU-build test in a forked child, for simt checks that end
// the process (abort with a message) rather than return an error: how the child ended and what it
// wrote to stderr. ScheduleScope sets the thread order for the scope.
#pragma once
#include <catch2/catch.hpp>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fcntl.h>
#include <string>
#include <sys/wait.h>
#include <unistd.h>

namespace test {

struct ChildResult {
  bool aborted = false;
  int exit_code = -1;
  std::string stderr_text;
};

// Runs body in a child process; reports how it ended and what it wrote to stderr.
template <typename Body>
ChildResult run_in_child(Body body) {
  int fds[2];
  REQUIRE(pipe(fds) == 0);
  std::fflush(nullptr);
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    close(fds[0]);
    dup2(fds[1], STDERR_FILENO);
    dup2(open("/dev/null", O_WRONLY), STDOUT_FILENO);  // the child's copy of Catch2 must not report
    std::signal(SIGABRT, SIG_DFL);                      // nor turn the abort into a test failure
    std::_Exit(body());
  }
  close(fds[1]);
  ChildResult r;
  char buf[4096];
  for (ssize_t n; (n = read(fds[0], buf, sizeof buf)) > 0;) r.stderr_text.append(buf, static_cast<size_t>(n));
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  r.aborted = WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

struct ScheduleScope {
  explicit ScheduleScope(const char* order) { setenv("SIMT_SCHEDULE", order, 1); }
  ~ScheduleScope() { unsetenv("SIMT_SCHEDULE"); }
};

}  // namespace test

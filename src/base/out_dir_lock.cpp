// out_dir_lock.cpp — the --out-dir lock
#include "src/base/out_dir_lock.h"

#include "src/base/durable_file.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <stdexcept>
#include <string>

namespace {

// "pid N on HOST" as the holder wrote it (it may not have written it yet).
std::string read_holder(int fd) {
  char buf[300] = {};
  const ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
  std::string text(buf, n > 0 ? static_cast<size_t>(n) : 0);
  while (!text.empty() && (text.back() == '\n' || text.back() == '\0')) text.pop_back();
  return text.empty() ? "pid unknown" : text;
}

// Takes the exclusive lock on fd, or closes fd and throws naming the holder.
void lock_or_throw(int fd, const std::string& out_dir, const std::string& path) {
  if (::flock(fd, LOCK_EX | LOCK_NB) == 0) return;
  const int err = errno;
  const std::string holder = read_holder(fd);
  ::close(fd);
  if (err == EWOULDBLOCK)
    throw std::runtime_error(out_dir + " is in use by another run (" + holder + "; lock file " + path +
                             "): wait for it to end or choose another --out-dir");
  throw file_error(path, "cannot lock", err);
}

}  // namespace

void OutDirLock::check_free(const std::string& out_dir) {
  const std::string path = out_dir + "/" + kOutDirLockName;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;  // no lock file: no run holds out_dir
  lock_or_throw(fd, out_dir, path);
  ::close(fd);  // releases the lock at once
}

OutDirLock::OutDirLock(const std::string& out_dir) : path_(out_dir + "/" + kOutDirLockName) {
  fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) throw file_error(path_, "cannot create the lock file", errno);
  lock_or_throw(fd_, out_dir, path_);
  char host[256] = "unknown host";
  ::gethostname(host, sizeof host - 1);
  const std::string holder = "pid " + std::to_string(::getpid()) + " on " + host + "\n";
  if (::ftruncate(fd_, 0) != 0 ||
      ::pwrite(fd_, holder.data(), holder.size(), 0) != static_cast<ssize_t>(holder.size())) {
    const int err = errno;
    ::close(fd_);
    throw file_error(path_, "cannot write the lock file", err);
  }
}

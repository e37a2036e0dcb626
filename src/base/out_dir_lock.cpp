// out_dir_lock.cpp — the --out-dir lock
#include "src/base/out_dir_lock.h"

#include "src/base/durable_file.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <stdexcept>
#include <string>

OutDirLock::OutDirLock(const std::string& out_dir) : path_(out_dir + "/" + kOutDirLockName) {
  fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) throw file_error(path_, "cannot create the lock file", errno);
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    const std::string holder = read_holder();
    ::close(fd_);
    if (err == EWOULDBLOCK)
      throw std::runtime_error(out_dir + " is in use by another run (" + holder + "; lock file " + path_ +
                               "): wait for it to end or choose another --out-dir");
    throw file_error(path_, "cannot lock", err);
  }
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

std::string OutDirLock::read_holder() const {
  char buf[300] = {};
  const ssize_t n = ::pread(fd_, buf, sizeof buf - 1, 0);
  std::string text(buf, n > 0 ? static_cast<size_t>(n) : 0);
  while (!text.empty() && (text.back() == '\n' || text.back() == '\0')) text.pop_back();
  return text.empty() ? "pid unknown" : text;
}

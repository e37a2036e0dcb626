// out_dir_lock.h — the exclusive lock that keeps two runs out of one --out-dir.
//
// OUT/.train_gpt.lock is locked with flock(LOCK_EX) for the life of the run that writes into OUT
// and holds that run's pid and host, for the error of a second run that finds it taken. The
// kernel drops the lock when the process ends, however it ends, so a lock file left by a dead
// run locks nothing: the next run takes it. The file is never removed: removing it would let one
// run lock the old file while another creates and locks a new one of the same name.
#pragma once
#include "src/base/durable_file.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <stdexcept>
#include <string>

constexpr char kOutDirLockName[] = ".train_gpt.lock";

class OutDirLock {
 public:
  // Takes the lock on out_dir (an existing directory) or throws one line naming the holder.
  explicit OutDirLock(const std::string& out_dir) : path_(out_dir + "/" + kOutDirLockName) {
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
  OutDirLock(const OutDirLock&) = delete;
  OutDirLock& operator=(const OutDirLock&) = delete;
  ~OutDirLock() { ::close(fd_); }  // releases the lock

 private:
  // "pid N on HOST" as the holder wrote it (it may not have written it yet).
  std::string read_holder() const {
    char buf[300] = {};
    const ssize_t n = ::pread(fd_, buf, sizeof buf - 1, 0);
    std::string text(buf, n > 0 ? static_cast<size_t>(n) : 0);
    while (!text.empty() && (text.back() == '\n' || text.back() == '\0')) text.pop_back();
    return text.empty() ? "pid unknown" : text;
  }

  std::string path_;
  int fd_ = -1;
};

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
  explicit OutDirLock(const std::string& out_dir);
  // Throws the same line if another run holds out_dir's lock now; creates nothing (no lock file,
  // no directory), so a command can refuse what it finds in out_dir without touching it.
  static void check_free(const std::string& out_dir);
  OutDirLock(const OutDirLock&) = delete;
  OutDirLock& operator=(const OutDirLock&) = delete;
  ~OutDirLock() { ::close(fd_); }  // releases the lock

 private:

  std::string path_;
  int fd_ = -1;
};

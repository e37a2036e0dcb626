// durable_file.h — files that appear complete or not at all (AtomicFileWriter: temp file, fsync,
// rename, fsync of the directory), CRC-32C checksums of what is written and read back, and the
// one-line file error every writer and reader throws. Every file the trainer writes goes through
// AtomicFileWriter: model files, checkpoint state and manifests, metrics rewrites, rendezvous ids.
#pragma once
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

// "PATH: what: strerror(err)".
std::runtime_error file_error(const std::string& path, const std::string& what, int err);

namespace durable_file_detail {

// CRC-32C (Castagnoli polynomial, reflected 0x82F63B78), eight table lookups per 8 bytes.
const std::array<std::array<uint32_t, 256>, 8>& crc32c_tables();

}  // namespace durable_file_detail

class Crc32c {
 public:
  void update(const void* data, size_t bytes);
  uint32_t value() const { return ~state_; }

 private:
  uint32_t state_ = 0xFFFFFFFFu;
};

std::string crc_hex(uint32_t crc);

// fsync of a directory makes the creation, rename or removal of its entries durable.
void fsync_directory(const std::string& dir);

std::string parent_directory(const std::string& path);

// A file that appears complete or not at all. Bytes go to PATH.tmp (same directory, so the
// rename cannot cross file systems); commit() syncs it, renames it to PATH and syncs the
// directory. Destroyed without commit() (an error, an exception): the temp file is removed and
// PATH is untouched. A set of files that must appear together (a tokenized dataset) calls
// close_synced() on each as it is complete and commit() on all once every one is.
class AtomicFileWriter {
 public:
  explicit AtomicFileWriter(std::string path) : path_(std::move(path)), temp_(path_ + ".tmp") {
    fd_ = ::open(temp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) throw file_error(temp_, "cannot create", errno);
  }
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;
  ~AtomicFileWriter();

  void write(const void* data, size_t bytes);
  // Rewrites bytes already written at `offset` (a header whose counts are known at the end);
  // crc32c() is then no longer the file's and may not be asked for.
  void patch(uint64_t offset, const void* data, size_t bytes);

  // Syncs and closes the temp file; nothing more may be written.
  void close_synced();
  // close_synced() if not yet, then the rename into place and the directory's sync.
  void commit();

  uint64_t size() const { return size_; }
  uint32_t crc32c() const;
  const std::string& path() const { return path_; }
  const std::string& temp_path() const { return temp_; }

 private:
  std::string path_, temp_;
  int fd_ = -1;
  bool committed_ = false, patched_ = false;
  uint64_t size_ = 0;
  Crc32c crc_;
};

// Size and CRC-32C of a whole file; false if it cannot be read.
bool file_size_and_crc(const std::string& path, uint64_t* size, uint32_t* crc);


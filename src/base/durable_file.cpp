// durable_file.cpp — atomic file writes (temp, fsync, rename, directory fsync), CRC-32C, file errors
#include "src/base/durable_file.h"

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

std::runtime_error file_error(const std::string& path, const std::string& what, int err) {
  return std::runtime_error(path + ": " + what + ": " + std::strerror(err));
}

namespace durable_file_detail {

const std::array<std::array<uint32_t, 256>, 8>& crc32c_tables() {
  static const std::array<std::array<uint32_t, 256>, 8> tables = [] {
    std::array<std::array<uint32_t, 256>, 8> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int bit = 0; bit < 8; ++bit) c = (c >> 1) ^ ((c & 1u) ? 0x82F63B78u : 0u);
      t[0][i] = c;
    }
    // t[s][i]: the CRC of byte i followed by s zero bytes.
    for (int s = 1; s < 8; ++s)
      for (uint32_t i = 0; i < 256; ++i) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xFFu];
    return t;
  }();
  return tables;
}

}  // namespace durable_file_detail

void Crc32c::update(const void* data, size_t bytes) {
  const auto& t = durable_file_detail::crc32c_tables();
  const unsigned char* p = static_cast<const unsigned char*>(data);
  uint32_t c = state_;
  for (; bytes >= 8; bytes -= 8, p += 8) {
    uint64_t word;
    std::memcpy(&word, p, 8);
    word ^= c;
    c = t[7][word & 0xFF] ^ t[6][(word >> 8) & 0xFF] ^ t[5][(word >> 16) & 0xFF] ^ t[4][(word >> 24) & 0xFF] ^
        t[3][(word >> 32) & 0xFF] ^ t[2][(word >> 40) & 0xFF] ^ t[1][(word >> 48) & 0xFF] ^ t[0][word >> 56];
  }
  for (; bytes > 0; --bytes, ++p) c = (c >> 8) ^ t[0][(c ^ *p) & 0xFFu];
  state_ = c;
}

std::string crc_hex(uint32_t crc) {
  char buf[9];
  std::snprintf(buf, sizeof buf, "%08x", crc);
  return buf;
}

void fsync_directory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw file_error(dir, "cannot open the directory to sync it", errno);
  const int status = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (status != 0) throw file_error(dir, "cannot sync the directory", err);
}

std::string parent_directory(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

AtomicFileWriter::~AtomicFileWriter() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(temp_.c_str());
}

void AtomicFileWriter::write(const void* data, size_t bytes) {
  if (fd_ < 0) throw std::logic_error(temp_ + ": written after close_synced()");
  crc_.update(data, bytes);
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::write(fd_, p, bytes);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw file_error(temp_, "write failed", n < 0 ? errno : ENOSPC);
    p += n;
    bytes -= static_cast<size_t>(n);
    size_ += static_cast<uint64_t>(n);
  }
}

void AtomicFileWriter::patch(uint64_t offset, const void* data, size_t bytes) {
  if (fd_ < 0 || offset + bytes > size_) throw std::logic_error(temp_ + ": patch outside what was written");
  patched_ = true;
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::pwrite(fd_, p, bytes, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw file_error(temp_, "write failed", n < 0 ? errno : ENOSPC);
    p += n;
    bytes -= static_cast<size_t>(n);
    offset += static_cast<uint64_t>(n);
  }
}

uint32_t AtomicFileWriter::crc32c() const {
  if (patched_) throw std::logic_error(temp_ + ": CRC-32C asked for after patch()");
  return crc_.value();
}

void AtomicFileWriter::close_synced() {
  if (fd_ < 0) return;
  if (::fsync(fd_) != 0) throw file_error(temp_, "fsync failed", errno);
  const int status = ::close(fd_);
  fd_ = -1;
  if (status != 0) throw file_error(temp_, "close failed", errno);
}

void AtomicFileWriter::commit() {
  close_synced();
  if (std::rename(temp_.c_str(), path_.c_str()) != 0) throw file_error(path_, "cannot rename " + temp_ + " into place", errno);
  committed_ = true;
  fsync_directory(parent_directory(path_));
}

bool file_size_and_crc(const std::string& path, uint64_t* size, uint32_t* crc) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  std::vector<char> buffer(1 << 20);
  Crc32c c;
  uint64_t total = 0;
  for (;;) {
    const ssize_t n = ::read(fd, buffer.data(), buffer.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      ::close(fd);
      return false;
    }
    if (n == 0) break;
    c.update(buffer.data(), static_cast<size_t>(n));
    total += static_cast<uint64_t>(n);
  }
  ::close(fd);
  *size = total;
  *crc = c.value();
  return true;
}

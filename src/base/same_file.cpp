// same_file.cpp — two paths compared by device and inode
#include "src/base/same_file.h"

#include <filesystem>
#include <string>
#include <system_error>

bool same_file(const std::string& a, const std::string& b) {
  std::error_code ec;
  const bool same = std::filesystem::equivalent(a, b, ec);  // stat() both: st_dev and st_ino
  return !ec && same;
}

// units.h — sizes and counts as people read them: "12.3 MiB", "1.50 GiB", "124,475,904".
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

// 12939264 -> "12.3 MiB": the one MiB formatter (memory, disk and checkpoint sizes).
inline std::string mib(uint64_t bytes) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(bytes) / 1048576.0);
  return buf;
}

// The unit that keeps the figure short: "1.50 GiB", "12.3 MiB" or "512 B".
inline std::string format_bytes(uint64_t bytes) {
  if (bytes < (uint64_t{1} << 20)) return std::to_string(bytes) + " B";
  if (bytes < (uint64_t{1} << 30)) return mib(bytes);
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.2f GiB", static_cast<double>(bytes) / 1073741824.0);
  return buf;
}

// 124475904 -> "124,475,904"
inline std::string thousands(unsigned long long n) {
  const std::string digits = std::to_string(n);
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

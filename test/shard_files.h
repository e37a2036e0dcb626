// shard_files.h — fixtures of the data-file tests (test_dataloader.cu, test_token_shards.cu,
// test_hellaswag.cu): a scratch directory removed with its files, token shards written byte by byte
// as docs/FORMATS.md states them (damaged on request), and the message a call throws.
#pragma once
#include <catch2/catch.hpp>

#include <dirent.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

// A fresh directory under $TMPDIR (or /tmp), removed with its files at scope exit.
struct TempDir {
  std::string path;
  TempDir() {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base && *base ? base : "/tmp") + "/train_gpt_test_XXXXXX";
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    REQUIRE(mkdtemp(buf.data()) != nullptr);
    path = buf.data();
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  ~TempDir() {
    if (DIR* d = opendir(path.c_str())) {
      while (dirent* e = readdir(d)) {
        const std::string name = e->d_name;
        if (name != "." && name != "..") std::remove((path + "/" + name).c_str());
      }
      closedir(d);
    }
    rmdir(path.c_str());
  }
  std::string file(const std::string& name) const { return path + "/" + name; }
};

// Writes a shard: header (magic, version, ids.size()) then each id in `width` little-endian bytes
// (defaults: GPT-2's uint16 shard); extra_bytes < 0 drops bytes from the end (truncation), > 0
// appends zero bytes.
template <typename Id>
void write_shard(const std::string& path, const std::vector<Id>& ids, int32_t magic = 20240520, int32_t version = 1,
                 int width = 2, long extra_bytes = 0) {
  int32_t header[256] = {};
  header[0] = magic;
  header[1] = version;
  header[2] = static_cast<int32_t>(ids.size());
  std::vector<char> bytes(reinterpret_cast<const char*>(header), reinterpret_cast<const char*>(header) + 1024);
  for (Id id : ids)
    for (int b = 0; b < width; ++b) bytes.push_back(static_cast<char>((static_cast<uint32_t>(id) >> (8 * b)) & 0xFF));
  bytes.resize(static_cast<size_t>(static_cast<long>(bytes.size()) + extra_bytes), 0);
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  REQUIRE(out.good());
}

// Runs f and returns the runtime_error message it throws ("" if it does not throw one).
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "";
}

// checkpoint_dirs.cpp — checkpoint directories: naming, verification against their manifests, the newest usable, retention, removal, free space
#include "src/ckpt/checkpoint_dirs.h"

#include "src/base/durable_file.h"
#include "src/base/units.h"

#include <dirent.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

std::string checkpoint_dir_name(long long step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%s%08lld", kCheckpointPrefix, step);
  return buf;
}

std::string state_file_name(int rank) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "state_r%05d.bin", rank);
  return buf;
}

bool is_checkpoint_dir_name(const std::string& name) {
  const size_t prefix = std::strlen(kCheckpointPrefix);
  if (name.size() <= prefix || name.compare(0, prefix, kCheckpointPrefix) != 0) return false;
  const std::string digits = name.substr(prefix);
  return digits.size() <= 18 && digits.find_first_not_of("0123456789") == std::string::npos;
}

std::vector<CheckpointDir> list_checkpoint_dirs(const std::string& out_dir) {
  std::vector<CheckpointDir> found;
  DIR* dir = ::opendir(out_dir.c_str());
  if (dir == nullptr) return found;
  while (const dirent* entry = ::readdir(dir)) {
    const std::string name = entry->d_name;
    if (!is_checkpoint_dir_name(name)) continue;
    const std::string path = out_dir + "/" + name;
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) continue;
    found.push_back({std::stoll(name.substr(std::strlen(kCheckpointPrefix))), path});
  }
  ::closedir(dir);
  std::sort(found.begin(), found.end(), [](const CheckpointDir& a, const CheckpointDir& b) { return a.step > b.step; });
  return found;
}

std::optional<Checkpoint> verify_checkpoint(const std::string& dir, std::string* problem,
                                                   bool check_files) {
  struct stat st {};
  const bool exists = ::stat(dir.c_str(), &st) == 0;
  if (!exists || !S_ISDIR(st.st_mode)) {
    *problem = exists ? "not a directory" : "no such directory";
    return std::nullopt;
  }
  const std::string manifest_path = dir + "/" + kManifestName;
  std::ifstream in(manifest_path);
  if (!in) {
    *problem = "no " + std::string(kManifestName) + " (incomplete: the run stopped while writing it)";
    return std::nullopt;
  }
  Checkpoint c;
  c.path = dir;
  try {
    c.manifest = nlohmann::json::parse(in);
    if (c.manifest.value("format", "") != kManifestFormat)
      throw std::runtime_error("\"format\" is not \"" + std::string(kManifestFormat) + "\"");
    if (c.manifest.at("version").get<int>() != kManifestVersion)
      throw std::runtime_error("version " + c.manifest.at("version").dump() + ", expected " +
                               std::to_string(kManifestVersion));
    c.step = c.manifest.at("step").get<long long>();
    const nlohmann::json& files = c.manifest.at("files");
    if (!files.is_array() || files.empty()) throw std::runtime_error("\"files\" is not a non-empty list");
    for (const nlohmann::json& f : files) {
      const std::string name = f.at("name").get<std::string>();
      if (name.empty() || name.find('/') != std::string::npos) throw std::runtime_error("bad file name " + name);
      const uint64_t expected_size = f.at("bytes").get<uint64_t>();
      const std::string expected_crc = f.at("crc32c").get<std::string>();
      if (!check_files) continue;
      uint64_t size = 0;
      uint32_t crc = 0;
      if (!file_size_and_crc(dir + "/" + name, &size, &crc)) {
        *problem = name + " is missing or unreadable";
        return std::nullopt;
      }
      if (size != expected_size) {
        *problem = name + " has " + std::to_string(size) + " bytes, the manifest says " +
                   std::to_string(expected_size) + " (truncated or overwritten)";
        return std::nullopt;
      }
      if (crc_hex(crc) != expected_crc) {
        *problem = name + " has CRC-32C " + crc_hex(crc) + ", the manifest says " + expected_crc + " (corrupt)";
        return std::nullopt;
      }
    }
  } catch (const std::exception& e) {
    *problem = std::string(kManifestName) + " is not a valid manifest (" + e.what() + ")";
    return std::nullopt;
  }
  return c;
}

bool is_incomplete_checkpoint(const std::string& dir) {
  struct stat st {};
  return ::stat((dir + "/" + kManifestName).c_str(), &st) != 0 && errno == ENOENT;
}

std::optional<Checkpoint> find_latest_checkpoint(const std::string& out_dir, std::vector<std::string>* skipped) {
  for (const CheckpointDir& d : list_checkpoint_dirs(out_dir)) {
    std::string problem;
    std::optional<Checkpoint> c = verify_checkpoint(d.path, &problem);
    if (c) return c;
    skipped->push_back(d.path + ": " + problem);
  }
  return std::nullopt;
}

void remove_checkpoint_dir(const std::string& dir) {
  const std::string manifest = dir + "/" + kManifestName;
  if (::unlink(manifest.c_str()) == 0) fsync_directory(dir);
  else if (errno != ENOENT) throw file_error(manifest, "cannot delete it (nothing of the checkpoint was deleted)", errno);
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) throw file_error(dir, "cannot list the checkpoint directory to delete it", errno);
  std::vector<std::string> names;
  while (const dirent* entry = ::readdir(d)) {
    const std::string name = entry->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  ::closedir(d);
  for (const std::string& name : names)
    if (::unlink((dir + "/" + name).c_str()) != 0 && errno != ENOENT)
      throw file_error(dir + "/" + name, "cannot delete", errno);
  if (::rmdir(dir.c_str()) != 0) throw file_error(dir, "cannot delete the directory", errno);
}

std::vector<std::string> prune_checkpoints(const std::string& out_dir, long long current_step,
                                                  long long keep_last, long long keep_every,
                                                  std::vector<std::string>* failed) {
  std::vector<std::string> removed;
  if (keep_last == 0) return removed;
  long long kept = 0;
  for (const CheckpointDir& d : list_checkpoint_dirs(out_dir)) {
    if (d.step > current_step) continue;
    if (kept < keep_last) {
      ++kept;
      continue;
    }
    if (keep_every > 0 && d.step % keep_every == 0) continue;
    try {
      remove_checkpoint_dir(d.path);
      removed.push_back(d.path);
    } catch (const std::runtime_error& e) {
      if (failed == nullptr) throw;
      failed->push_back(e.what());
    }
  }
  return removed;
}

uint64_t checkpoints_at_once(long long start, long long max_steps, long long every, long long keep_last,
                                    long long keep_every, const std::vector<long long>& existing) {
  if (start >= max_steps) return 0;
  const uint64_t periodic = every > 0 ? static_cast<uint64_t>((max_steps - 1) / every - start / every) : 0;
  if (keep_last == 0) return periodic + 1;
  if (periodic == 0) return 1;
  // Multiples of keep_every among multiples of `every` in [lo, hi]: multiples of their lcm.
  const auto kept_for_good = [&](long long lo, long long hi) -> uint64_t {
    if (keep_every == 0 || lo > hi) return 0;
    long long a = every, b = keep_every;
    while (b != 0) a = std::exchange(b, a % b);
    const long long step = every / a;
    if (step > hi / keep_every) return 0;
    const long long lcm = step * keep_every;
    return static_cast<uint64_t>(hi / lcm - (lo - 1) / lcm);
  };
  const auto protected_existing = [&](size_t from, size_t to) -> uint64_t {
    uint64_t n = 0;
    for (size_t i = from; i < to; ++i) n += keep_every > 0 && existing[i] % keep_every == 0;
    return n;
  };
  const uint64_t keep = static_cast<uint64_t>(keep_last);
  const uint64_t newest_run = std::min(keep, periodic);
  const uint64_t newest_existing = std::min<uint64_t>(keep - newest_run, existing.size());
  const long long last = (max_steps - 1) / every;  // the last periodic checkpoint is at last·every
  const uint64_t left = newest_run + newest_existing +
                        kept_for_good(start + 1, max_steps - 1) -
                        kept_for_good((last - static_cast<long long>(newest_run) + 1) * every, last * every) +
                        protected_existing(newest_existing, existing.size());
  return std::max<uint64_t>(1, left + 1 > existing.size() ? left + 1 - existing.size() : 0);
}

void check_output_directory(const std::string& out_dir, uint64_t bytes_needed, const std::string& needed_for) {
  {
    AtomicFileWriter probe(out_dir + "/.write_test");
    probe.write("ok\n", 3);
    probe.commit();
  }
  ::unlink((out_dir + "/.write_test").c_str());
  struct statvfs fs {};
  if (::statvfs(out_dir.c_str(), &fs) != 0) throw file_error(out_dir, "statvfs failed", errno);
  const uint64_t available = static_cast<uint64_t>(fs.f_bavail) * fs.f_frsize;
  if (available < bytes_needed) {
    throw std::runtime_error(out_dir + ": " + mib(available) + " free, " + needed_for + " need " + mib(bytes_needed) +
                             " (free space or choose another --out-dir)");
  }
}

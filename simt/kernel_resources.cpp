// kernel_resources.cpp — the GPU build's registers and static shared memory per kernel and
// architecture (make ptx-report's table), and the checks of a launch or a shared-memory opt-in
// against each architecture's limits: what a GPU of any architecture the build targets refuses,
// simt refuses (runtime.cpp reports it).
#include "kernel_resources.h"
#include "simt.h"
#include "state.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace simt {
namespace {

// Shared memory one block may use after cudaFuncSetAttribute's opt-in, per architecture the GPU
// build compiles for (Makefile, GPU_ARCH): 163 KB on compute capability 8.0 and 227 KB on 9.0
// (CUDA C++ Programming Guide, "Technical Specifications per Compute Capability"; the SM's 164 and
// 228 KB less the 1 KB CUDA reserves per block, Ampere and Hopper tuning guides).
struct ArchitectureLimits {
  const char* arch;
  size_t optin_smem_per_block;
};
constexpr ArchitectureLimits kArchitectures[] = {
    {"sm_80", 163 * 1024}, {"sm_90", 227 * 1024}, {"sm_90a", 227 * 1024}};
// 64 K 32-bit registers per block on 8.0 and 9.0 (same table).
constexpr long long kRegistersPerBlock = 64 * 1024;

// What ptxas reported for one kernel on one architecture.
struct Row {
  std::string arch;
  int registers;       // per thread
  size_t static_smem;  // bytes per block
  size_t optin_smem_per_block;
};

struct Table {
  std::mutex mutex;
  std::map<std::string, std::vector<Row>> rows;  // by kernel, as c++filt prints it
  std::vector<std::string> files;                // loaded, for messages
  std::map<const void*, std::string> names;      // kernel address → its name, found once
  std::set<std::string> reported_unlisted;       // kernels SIMT_VERBOSE has named as missing
};

[[noreturn]] void table_error(const std::string& file, int line, const std::string& what) {
  std::fprintf(stderr, "simt: kernel resources %s:%d: %s\n", file.c_str(), line, what.c_str());
  std::fflush(nullptr);
  std::_Exit(2);  // no destructors: this may be a forked child or the middle of a launch
}

long long parse_count(const std::string& field, const std::string& file, int line, const char* what) {
  errno = 0;
  char* end = nullptr;
  const long long value = std::strtoll(field.c_str(), &end, 10);
  if (field.empty() || *end != '\0' || errno != 0 || value < 0)
    table_error(file, line, std::string(what) + " '" + field + "' is not a count");
  return value;
}

// Caller holds t.mutex.
void load_into(Table& t, const std::string& file) {
  std::ifstream in(file);
  if (!in) table_error(file, 0, "cannot be read");
  std::string text;
  int line = 0, added = 0;
  while (std::getline(in, text)) {
    ++line;
    std::vector<std::string> fields;
    std::istringstream split(text);
    for (std::string field; std::getline(split, field, '\t');) fields.push_back(field);
    if (fields.size() != 7)
      table_error(file, line, "expected 7 tab-separated fields (kernel, arch, regs, spill stores, spill loads, smem, "
                              "stack), got " + std::to_string(fields.size()));
    const auto limits = std::find_if(std::begin(kArchitectures), std::end(kArchitectures),
                                     [&](const ArchitectureLimits& a) { return fields[1] == a.arch; });
    if (limits == std::end(kArchitectures))
      table_error(file, line, "no launch limits known for architecture '" + fields[1] + "' (simt/kernel_resources.cpp)");
    const Row row{fields[1], static_cast<int>(parse_count(fields[2], file, line, "registers")),
                  static_cast<size_t>(parse_count(fields[5], file, line, "shared memory")),
                  limits->optin_smem_per_block};
    std::vector<Row>& rows = t.rows[fields[0]];
    const auto same_arch = std::find_if(rows.begin(), rows.end(), [&](const Row& r) { return r.arch == row.arch; });
    if (same_arch == rows.end()) {
      rows.push_back(row);
    } else {  // the kernel compiled in several translation units: its worst figures
      same_arch->registers = std::max(same_arch->registers, row.registers);
      same_arch->static_smem = std::max(same_arch->static_smem, row.static_smem);
    }
    ++added;
  }
  t.files.push_back(file);
  if (std::getenv("SIMT_VERBOSE"))
    std::fprintf(stderr, "simt: kernel resources from %s (%d rows; %zu kernels in all) will be checked at launches\n",
                 file.c_str(), added, t.rows.size());
}

// The table, with SIMT_KERNEL_RESOURCES's rows added on first use.
Table& table() {
  static Table t;
  static std::once_flag environment_loaded;
  std::call_once(environment_loaded, [] {
    const char* file = std::getenv("SIMT_KERNEL_RESOURCES");
    if (file && *file) {
      std::lock_guard<std::mutex> lock(t.mutex);
      load_into(t, file);
    }
  });
  return t;
}

std::string loaded_files(const Table& t) {
  std::string out;
  for (const std::string& f : t.files) out += (out.empty() ? "" : ", ") + f;
  return out;
}

// The kernel's rows, or nullptr when it has none. Caller holds t.mutex.
const std::vector<Row>* rows_of(Table& t, const void* kernel) {
  if (t.rows.empty()) return nullptr;  // no table: the rule is not applied
  auto name = t.names.find(kernel);
  if (name == t.names.end()) name = t.names.emplace(kernel, describe_kernel(kernel)).first;
  const auto rows = t.rows.find(name->second);
  if (rows != t.rows.end()) return &rows->second;
  if (std::getenv("SIMT_VERBOSE") && t.reported_unlisted.insert(name->second).second)
    std::fprintf(stderr, "simt: kernel %s has no row in %s: its registers and shared memory are not checked\n",
                 name->second.c_str(), loaded_files(t).c_str());
  return nullptr;
}

long long round_up(long long value, long long unit) { return (value + unit - 1) / unit * unit; }

// The registers a block of `threads` holds, counted as the GPU's launch check counts them (CUDA
// toolkit, cuda_occupancy.h, cudaOccMaxBlocksPerSMRegsLimit: "Hardware verifies if a launch fits
// the per-CTA register limit"): each warp's registers rounded up to the 256-register allocation
// unit, the block's warps rounded up to the SM's 4 sub-partitions.
long long block_registers(int registers_per_thread, long long threads) {
  const long long per_warp = round_up(static_cast<long long>(registers_per_thread) * kWarpSize, 256);
  const long long warps = round_up((threads + kWarpSize - 1) / kWarpSize, 4);
  return per_warp * warps;
}

}  // namespace

void load_kernel_resources(const std::string& path) {
  Table& t = table();
  std::lock_guard<std::mutex> lock(t.mutex);
  load_into(t, path);
}

size_t static_shared_memory(const void* kernel) {
  Table& t = table();
  std::lock_guard<std::mutex> lock(t.mutex);
  size_t most = 0;
  if (const std::vector<Row>* rows = rows_of(t, kernel))
    for (const Row& r : *rows) most = std::max(most, r.static_smem);
  return most;
}

// A block with more registers than the SM gives one block: "too many resources requested for
// launch" (driver_types.h, cudaErrorLaunchOutOfResources: "the kernel launch specifies too many
// threads for the kernel's register count").
Refusal check_launch_registers(const void* kernel, dim3 block) {
  Table& t = table();
  std::lock_guard<std::mutex> lock(t.mutex);
  const std::vector<Row>* rows = rows_of(t, kernel);
  if (!rows) return {};
  const long long threads = static_cast<long long>(block.x) * block.y * block.z;
  for (const Row& r : *rows) {
    const long long needed = block_registers(r.registers, threads);
    if (needed > kRegistersPerBlock) {
      char why[256];
      std::snprintf(why, sizeof why,
                    "%s: %d registers per thread x %lld threads take %lld registers (whole warps, 256-register units, "
                    "4 sub-partitions); a block has %lld",
                    r.arch.c_str(), r.registers, threads, needed, kRegistersPerBlock);
      return {cudaErrorLaunchOutOfResources, why};
    }
  }
  return {};
}

// cudaFuncAttributeMaxDynamicSharedMemorySize: "The sum of this value and the function attribute
// sharedSizeBytes cannot exceed the device attribute cudaDevAttrMaxSharedMemoryPerBlockOptin"
// (cuda_runtime_api.h, cudaFuncSetAttribute), else cudaErrorInvalidValue.
Refusal check_max_dynamic_shared_memory(const void* kernel, size_t bytes) {
  Table& t = table();
  std::lock_guard<std::mutex> lock(t.mutex);
  const std::vector<Row>* rows = rows_of(t, kernel);
  if (!rows) return {};
  for (const Row& r : *rows) {
    if (r.static_smem + bytes > r.optin_smem_per_block) {
      char why[256];
      std::snprintf(why, sizeof why,
                    "%s: %zu bytes of static + %zu of dynamic shared memory exceed the %zu a block may use", r.arch.c_str(),
                    r.static_smem, bytes, r.optin_smem_per_block);
      return {cudaErrorInvalidValue, why};
    }
  }
  return {};
}

}  // namespace simt

// simt's launch resource rule, CPU build only: with a table of ptxas figures loaded (make
// ptx-report's .tsv layout; written here for this file's kernels), a launch whose block needs more
// registers than a GPU gives a block fails with cudaErrorLaunchOutOfResources, static + dynamic
// shared memory over 48 KB without the opt-in fails with cudaErrorInvalidValue, and a
// cudaFuncSetAttribute opt-in over an architecture's limit is refused, as on a GPU; launches that
// fit run. A table simt cannot use stops the program.
#include "test/child_process.h"
#include "test/test_util.h"

#include <cstdio>
#include <cstdlib>
#include <string>
#include <unistd.h>

namespace {

// A table file with the given rows, removed with this object.
struct TableFile {
  std::string path;
  explicit TableFile(const std::string& rows) {
    char name[] = "/tmp/simt_launch_resources_XXXXXX";
    const int fd = mkstemp(name);
    REQUIRE(fd >= 0);
    REQUIRE(write(fd, rows.data(), rows.size()) == static_cast<ssize_t>(rows.size()));
    close(fd);
    path = name;
  }
  TableFile(const TableFile&) = delete;
  TableFile& operator=(const TableFile&) = delete;
  ~TableFile() { unlink(path.c_str()); }
};

// One row as ptx_report.sh writes it: kernel, arch, regs, spill stores, spill loads, smem, stack.
std::string row(const std::string& kernel, const char* arch, int registers, int smem) {
  return kernel + "\t" + arch + "\t" + std::to_string(registers) + "\t0\t0\t" + std::to_string(smem) + "\t0\n";
}

// Launches kernel on 2 blocks of `block`, checks the error cudaGetLastError reports, and returns
// how many threads ran.
template <typename... Params>
int threads_run(void (*kernel)(Params...), dim3 block, size_t dynamic_smem, cudaError_t expected) {
  test::DeviceBuffer<int> ran(1);
  CUDA_CHECK(cudaMemset(ran.ptr, 0, sizeof(int)));
  launch(kernel, dim3(2), block, dynamic_smem, nullptr, ran.ptr);
  CHECK(cudaGetLastError() == expected);
  return ran.download()[0];
}

}  // namespace

// The table names REGISTERS as its figure (c++filt: "void registers_kernel<255>(int*)").
template <int REGISTERS>
__global__ void registers_kernel(int* ran) {
  atomicAdd(ran, 1);
}

__global__ void per_arch_registers_kernel(int* ran) { atomicAdd(ran, 1); }

TEST_CASE("a block needing more registers than a GPU gives one fails; one that fits runs", "[launch]") {
  const TableFile table(row("void registers_kernel<255>(int*)", "sm_90a", 255, 0) +
                        row("void registers_kernel<136>(int*)", "sm_90a", 136, 0) +
                        row("void registers_kernel<128>(int*)", "sm_90a", 128, 0) +
                        row("per_arch_registers_kernel(int*)", "sm_80", 168, 0) +
                        row("per_arch_registers_kernel(int*)", "sm_90a", 128, 0));
  simt::load_kernel_resources(table.path);
  // Planted: 255 registers x 512 threads = 130,560 > 65,536.
  CHECK(threads_run(registers_kernel<255>, dim3(512), 0, cudaErrorLaunchOutOfResources) == 0);
  // Correct counterpart: 8 warps of 255 (rounded to 256) registers: exactly 65,536.
  CHECK(threads_run(registers_kernel<255>, dim3(256), 0, cudaSuccess) == 2 * 256);
  // Planted: 136 x 480 = 65,280 registers, but the GPU counts 15 warps as 16 (4 sub-partitions).
  CHECK(threads_run(registers_kernel<136>, dim3(480), 0, cudaErrorLaunchOutOfResources) == 0);
  CHECK(threads_run(registers_kernel<136>, dim3(32, 12), 0, cudaSuccess) == 2 * 384);
  // Correct counterpart at the limit: 128 x 512 = 65,536, a 2-D block too.
  CHECK(threads_run(registers_kernel<128>, dim3(16, 32), 0, cudaSuccess) == 2 * 512);
  // Planted: fits sm_90a's 128 registers but not sm_80's 168 (the build runs on both).
  CHECK(threads_run(per_arch_registers_kernel, dim3(512), 0, cudaErrorLaunchOutOfResources) == 0);
  CHECK(threads_run(per_arch_registers_kernel, dim3(384), 0, cudaSuccess) == 2 * 384);
}

// Counts its threads; touches the last byte of its dynamic shared memory.
__global__ void default_smem_kernel(int* ran) {
  DYNAMIC_SHARED(unsigned char, smem);
  if (threadIdx.x == 0) smem[0] = 1;
  atomicAdd(ran, 1);
}
__global__ void optin_smem_kernel(int* ran) {
  DYNAMIC_SHARED(unsigned char, smem);
  if (threadIdx.x == 0) smem[0] = 1;
  atomicAdd(ran, 1);
}
__global__ void per_arch_optin_smem_kernel(int* ran) {
  DYNAMIC_SHARED(unsigned char, smem);
  if (threadIdx.x == 0) smem[0] = 1;
  atomicAdd(ran, 1);
}

TEST_CASE("static + dynamic shared memory over a GPU's limit fails; within it runs", "[launch]") {
  const TableFile table(row("default_smem_kernel(int*)", "sm_90a", 32, 40000) +
                        row("optin_smem_kernel(int*)", "sm_90a", 32, 40000) +
                        row("per_arch_optin_smem_kernel(int*)", "sm_80", 32, 1024) +
                        row("per_arch_optin_smem_kernel(int*)", "sm_90a", 32, 1024));
  simt::load_kernel_resources(table.path);
  const size_t kDefault = 48 * 1024, kSm80 = 163 * 1024, kSm90 = 227 * 1024;

  // Without the opt-in a block has 48 KB in all. Planted: 40,000 static + 9,153 dynamic.
  CHECK(threads_run(default_smem_kernel, dim3(64), kDefault - 40000 + 1, cudaErrorInvalidValue) == 0);
  // Correct counterpart: exactly 48 KB.
  CHECK(threads_run(default_smem_kernel, dim3(64), kDefault - 40000, cudaSuccess) == 2 * 64);

  // Planted: an opt-in that with the static 40,000 bytes exceeds sm_90a's 227 KB is refused, and
  // the launch that needed it fails.
  const void* optin = reinterpret_cast<const void*>(optin_smem_kernel);
  CHECK(cudaFuncSetAttribute(optin, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kSm90 - 40000 + 1)) ==
        cudaErrorInvalidValue);
  CHECK(cudaGetLastError() == cudaErrorInvalidValue);
  CHECK(threads_run(optin_smem_kernel, dim3(64), kSm90 - 40000 + 1, cudaErrorInvalidValue) == 0);
  // Correct counterpart: exactly 227 KB in all.
  CHECK(cudaFuncSetAttribute(optin, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kSm90 - 40000)) == cudaSuccess);
  CHECK(threads_run(optin_smem_kernel, dim3(64), kSm90 - 40000, cudaSuccess) == 2 * 64);

  // Planted: within sm_90a's 227 KB but over sm_80's 163 KB.
  const void* per_arch = reinterpret_cast<const void*>(per_arch_optin_smem_kernel);
  CHECK(cudaFuncSetAttribute(per_arch, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kSm80 - 1024 + 1)) ==
        cudaErrorInvalidValue);
  CHECK(cudaGetLastError() == cudaErrorInvalidValue);
  CHECK(cudaFuncSetAttribute(per_arch, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kSm80 - 1024)) ==
        cudaSuccess);
  CHECK(threads_run(per_arch_optin_smem_kernel, dim3(64), kSm80 - 1024, cudaSuccess) == 2 * 64);
}

__global__ void unlisted_kernel(int* ran) { atomicAdd(ran, 1); }

TEST_CASE("SIMT_VERBOSE says which figures refused a launch, and which kernels have no row", "[launch]") {
  const TableFile table(row("void registers_kernel<255>(int*)", "sm_90a", 255, 0));
  test::ChildResult r = test::run_in_child([&] {
    setenv("SIMT_VERBOSE", "1", 1);
    simt::load_kernel_resources(table.path);
    test::DeviceBuffer<int> ran(1);
    launch(registers_kernel<255>, dim3(1), dim3(512), 0, nullptr, ran.ptr);
    if (cudaGetLastError() != cudaErrorLaunchOutOfResources) return 1;
    launch(unlisted_kernel, dim3(1), dim3(1024), 0, nullptr, ran.ptr);
    return cudaGetLastError() == cudaSuccess ? 0 : 2;
  });
  INFO("stderr: " << r.stderr_text);
  CHECK(r.exit_code == 0);
  CHECK(r.stderr_text.find("launch of void registers_kernel<255>(int*) refused: sm_90a: 255 registers per thread x "
                           "512 threads take 131072 registers") != std::string::npos);
  CHECK(r.stderr_text.find("kernel unlisted_kernel(int*) has no row in ") != std::string::npos);
}

TEST_CASE("a table simt cannot use stops the program, naming the file and line", "[launch]") {
  // What follows the table's path in the message of a child that loaded `rows`.
  const auto load_error = [](const std::string& rows) {
    const TableFile table(rows);
    const test::ChildResult r = test::run_in_child([&] {
      simt::load_kernel_resources(table.path);
      return 0;
    });
    CHECK(r.exit_code == 2);
    const size_t at = r.stderr_text.find(table.path);
    return at == std::string::npos ? r.stderr_text : r.stderr_text.substr(at + table.path.size());
  };
  CHECK_THAT(load_error(row("k(int*)", "sm_80", 32, 0) + "k(int*)\tsm_90a\t32\n"),
             Catch::StartsWith(":2: expected 7 tab-separated fields"));
  CHECK_THAT(load_error(row("k(int*)", "sm_80", -1, 0)), Catch::StartsWith(":1: registers '-1' is not a count"));
  CHECK_THAT(load_error(row("k(int*)", "sm_100a", 32, 0)),
             Catch::StartsWith(":1: no launch limits known for architecture 'sm_100a'"));

  test::ChildResult missing = test::run_in_child([] {
    simt::load_kernel_resources("/nonexistent/ptx-report.txt.tsv");
    return 0;
  });
  CHECK(missing.exit_code == 2);
  CHECK(missing.stderr_text.find("/nonexistent/ptx-report.txt.tsv:0: cannot be read") != std::string::npos);
}

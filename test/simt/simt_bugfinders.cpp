// simt's bug finders, CPU build only: a missing __syncthreads is caught by one of the thread
// orders; divergent warp collectives, barrier deadlocks and barriers at different source
// lines abort with a message naming the kernel and the threads; a misaligned 128-bit access
// is reported as cudaErrorMisalignedAddress. Aborting cases run in a forked child whose
// stderr is captured.
#include "test/child_process.h"
#include "test/test_util.h"

#include <cstdlib>
#include <string>

// Each thread stores its value, then reads its neighbour's; without the barrier the
// neighbour may not have stored yet (the buffer starts as NaN poison).
template <bool WITH_BARRIER>
__global__ void neighbour_kernel(float* out, const float* in, int n) {
  DYNAMIC_SHARED(float, buffer);
  const int i = threadIdx.x;
  buffer[i] = in[i];
  if (WITH_BARRIER) __syncthreads();
  out[i] = buffer[(i + 1) % n];
}

static int wrong_neighbours(void (*kernel)(float*, const float*, int), const char* order) {
  test::ScheduleScope scope(order);
  const int n = 64;
  std::vector<float> host = test::random_floats(n, 1);
  test::DeviceBuffer<float> in(host);
  test::DeviceBuffer<float> out(n);
  launch(kernel, dim3(1), dim3(n), n * sizeof(float), nullptr, out.ptr, in.ptr, n);
  test::require_no_cuda_error();
  std::vector<float> got = out.download();
  int wrong = 0;
  for (int i = 0; i < n; ++i) wrong += !(got[i] == host[(i + 1) % n]);
  return wrong;
}

TEST_CASE("a missing __syncthreads is caught by forward or reverse order", "[bugfinder]") {
  const int forward = wrong_neighbours(neighbour_kernel<false>, "forward");
  const int reverse = wrong_neighbours(neighbour_kernel<false>, "reverse");
  INFO("wrong results: forward " << forward << ", reverse " << reverse);
  CHECK(forward + reverse > 0);
  CHECK(wrong_neighbours(neighbour_kernel<true>, "forward") == 0);
  CHECK(wrong_neighbours(neighbour_kernel<true>, "reverse") == 0);
  CHECK(wrong_neighbours(neighbour_kernel<true>, "random:17") == 0);
}

__global__ void divergent_shuffle_kernel(float* out) {
  float v = static_cast<float>(threadIdx.x);
  if (threadIdx.x < 16) v = __shfl_xor_sync(0xffffffffu, v, 1);
  else v = static_cast<float>(__ballot_sync(0xffffffffu, v > 20.0f));
  out[threadIdx.x] = v;
}

TEST_CASE("lanes of one warp in different collectives abort with a clear message", "[bugfinder]") {
  for (const char* order : {"forward", "reverse"}) {
    test::ChildResult r = test::run_in_child([order] {
      test::ScheduleScope scope(order);
      test::DeviceBuffer<float> out(32);
      launch(divergent_shuffle_kernel, dim3(1), dim3(32), 0, nullptr, out.ptr);
      return 0;
    });
    INFO(order << " stderr: " << r.stderr_text);
    CHECK(r.aborted);
    CHECK(r.stderr_text.find("divergent warp collective") != std::string::npos);
    CHECK(r.stderr_text.find("divergent_shuffle_kernel") != std::string::npos);
  }
}

// Lanes 0-15 of warp 1 shuffle with the whole warp while lanes 16-31 wait at the barrier.
__global__ void deadlock_kernel(float* out) {
  float v = static_cast<float>(threadIdx.x);
  if (threadIdx.x >= 32 && threadIdx.x < 48) v = __shfl_xor_sync(0xffffffffu, v, 1);
  __syncthreads();
  out[threadIdx.x] = v;
}

TEST_CASE("a deadlock names the kernel and where its threads wait", "[bugfinder]") {
  test::ChildResult r = test::run_in_child([] {
    test::DeviceBuffer<float> out(64);
    launch(deadlock_kernel, dim3(1), dim3(64), 0, nullptr, out.ptr);
    return 0;
  });
  INFO("stderr: " << r.stderr_text);
  CHECK(r.aborted);
  CHECK(r.stderr_text.find("deadlock") != std::string::npos);
  CHECK(r.stderr_text.find("deadlock_kernel") != std::string::npos);
  CHECK(r.stderr_text.find("threads 32-47 wait in __shfl_xor_sync") != std::string::npos);
  CHECK(r.stderr_text.find("at __syncthreads") != std::string::npos);
}

__global__ void split_barrier_kernel(float* out) {
  if (threadIdx.x < 32) {
    __syncthreads();
  } else {
    __syncthreads();
  }
  out[threadIdx.x] = 1.0f;
}

TEST_CASE("threads at different __syncthreads lines abort, unless allowed", "[bugfinder]") {
  test::ChildResult r = test::run_in_child([] {
    test::DeviceBuffer<float> out(64);
    launch(split_barrier_kernel, dim3(1), dim3(64), 0, nullptr, out.ptr);
    return 0;
  });
  INFO("stderr: " << r.stderr_text);
  CHECK(r.aborted);
  CHECK(r.stderr_text.find("different __syncthreads") != std::string::npos);
  CHECK(r.stderr_text.find("simt_bugfinders.cpp") != std::string::npos);

  test::ChildResult allowed = test::run_in_child([] {
    setenv("SIMT_BARRIER_SITES", "0", 1);
    test::DeviceBuffer<float> out(64);
    launch(split_barrier_kernel, dim3(1), dim3(64), 0, nullptr, out.ptr);
    return cudaDeviceSynchronize() == cudaSuccess ? 0 : 1;
  });
  CHECK(allowed.exit_code == 0);
}

__global__ void misaligned_kernel(float* out, const float* in) {
  store128(out, load128(in + 1));  // in + 1 is 4-byte aligned only
}

TEST_CASE("a misaligned 128-bit access is a sticky cudaErrorMisalignedAddress", "[bugfinder]") {
  test::ChildResult r = test::run_in_child([] {
    test::DeviceBuffer<float> in(8), out(8);
    launch(misaligned_kernel, dim3(1), dim3(1), 0, nullptr, out.ptr, in.ptr);
    if (cudaDeviceSynchronize() != cudaErrorMisalignedAddress) return 1;
    if (cudaGetLastError() != cudaErrorMisalignedAddress) return 2;
    if (cudaGetLastError() != cudaErrorMisalignedAddress) return 3;  // sticky, as on a GPU
    return 0;
  });
  INFO("stderr: " << r.stderr_text);
  CHECK(r.exit_code == 0);
  CHECK(r.stderr_text.find("misaligned_kernel") != std::string::npos);
}

__global__ void block_size_kernel(int* out) {
  if (threadIdx.x == 0 && threadIdx.y == 0) out[blockIdx.x] = static_cast<int>(blockDim.x * blockDim.y);
}

TEST_CASE("blocks run on the persistent pool: many launches, 2-D blocks", "[pool]") {
  test::DeviceBuffer<int> out(16);
  for (int launch_index = 0; launch_index < 200; ++launch_index)
    launch(block_size_kernel, dim3(16), dim3(8, 4), 0, nullptr, out.ptr);
  test::require_no_cuda_error();
  for (int v : out.download()) REQUIRE(v == 32);
}

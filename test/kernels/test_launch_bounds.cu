// __launch_bounds__ is honoured in both builds: a launch with more threads per block than the
// kernel's bound fails with cudaErrorLaunchOutOfResources through cudaGetLastError, runs nothing,
// and leaves the next launch unaffected; a launch within the bound runs. (simt: the kernel's
// LAUNCH_BOUNDS_GUARD, kernels/common.cuh; a GPU refuses the launch itself.)
#include "test/test_util.h"

constexpr int kBound = 64;

__global__ void __launch_bounds__(kBound) bounded_kernel(int* out) {
  LAUNCH_BOUNDS_GUARD(kBound);
  atomicAdd(out, 1);
}

TEST_CASE("a launch over the kernel's __launch_bounds__ fails; one within it runs", "[launch]") {
  test::DeviceBuffer<int> out(1);
  CUDA_CHECK(cudaMemset(out.ptr, 0, sizeof(int)));
  // Planted: twice the bound.
  launch(bounded_kernel, dim3(2), dim3(2 * kBound), 0, nullptr, out.ptr);
  CHECK(cudaGetLastError() == cudaErrorLaunchOutOfResources);
  CHECK(out.download()[0] == 0);
  // Correct counterpart: exactly the bound, as 2-D blocks too.
  launch(bounded_kernel, dim3(2), dim3(kBound), 0, nullptr, out.ptr);
  test::require_no_cuda_error();
  launch(bounded_kernel, dim3(1), dim3(kBound / 2, 2), 0, nullptr, out.ptr);
  test::require_no_cuda_error();
  CHECK(out.download()[0] == 3 * kBound);
}

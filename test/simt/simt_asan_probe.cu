// Probe for test/checks/simt_asan.sh (built with -fsanitize=address, not a Catch2 test):
// `inside` fills dynamic shared memory exactly; `past-end` writes one float beyond it.
#include "kernels/common.cuh"

#include <cstring>

__global__ void fill_shared(float* out, int extra) {
  DYNAMIC_SHARED(float, buffer);
  buffer[threadIdx.x + extra] = 1.0f;
  __syncthreads();
  out[threadIdx.x] = buffer[threadIdx.x];
}

int main(int argc, char** argv) {
  const int threads = 64;
  const int extra = argc > 1 && std::strcmp(argv[1], "past-end") == 0 ? 1 : 0;
  float* out = nullptr;
  CUDA_CHECK(cudaMalloc(&out, threads * sizeof(float)));
  launch(fill_shared, dim3(2), dim3(threads), threads * sizeof(float), nullptr, out, extra);
  CUDA_CHECK(cudaDeviceSynchronize());
  CUDA_CHECK(cudaFree(out));
  return 0;
}

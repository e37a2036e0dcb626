// train_gpt — pretrains GPT-2 family models. Placeholder main until the trainer lands.
#include "kernels/common.cuh"

int main() {
  int devices = 0;
  cudaError_t err = cudaGetDeviceCount(&devices);
  if (err != cudaSuccess || devices == 0) {
    std::fprintf(stderr, "no CUDA device: %s; use train_gpt_cpu (make cpu) on machines without a GPU\n",
                 err != cudaSuccess ? cudaGetErrorString(err) : "no device found");
    return 1;
  }
  cudaDeviceProp prop;
  CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s\n", prop.name);
  return 0;
}

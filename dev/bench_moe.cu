// bench_moe.cu — times the mixture-of-experts kernels (kernels/moe_router.cuh, moe_dispatch.cuh)
// in bf16 at three model-sized shapes (16,384 tokens; Mixtral-8x7B's, OLMoE's and DeepSeek-V3's
// C, E and K), a routing from random logits: the mean of 20 calls after 3 warm-ups, with the
// bytes each op must move per ms. On a GPU machine:
//   nvcc -std=c++17 -O3 -arch=sm_90a -I. -o build/bench_moe dev/bench_moe.cu && build/bench_moe
// docs/MOE.md records its figures.
#include "kernels/moe_router.cuh"
#include "kernels/moe_dispatch.cuh"
#include <cstdio>
#include <vector>
#include <random>

template <typename F>
float time_ms(F f, int reps = 20) {
  for (int i = 0; i < 3; ++i) f();
  cudaEvent_t a, b;
  CUDA_CHECK(cudaEventCreate(&a));
  CUDA_CHECK(cudaEventCreate(&b));
  CUDA_CHECK(cudaEventRecord(a));
  for (int i = 0; i < reps; ++i) f();
  CUDA_CHECK(cudaEventRecord(b));
  CUDA_CHECK(cudaEventSynchronize(b));
  float ms = 0;
  CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
  CUDA_CHECK(cudaEventDestroy(a));
  CUDA_CHECK(cudaEventDestroy(b));
  return ms / reps;
}

template <typename T> T* dev_random(size_t n, float scale, uint64_t seed) {
  std::vector<T> h(n); std::mt19937_64 r(seed); std::normal_distribution<float> d(0, scale);
  for (auto& x : h) x = T(d(r));
  T* p; CUDA_CHECK(cudaMalloc(&p, n * sizeof(T))); CUDA_CHECK(cudaMemcpy(p, h.data(), n * sizeof(T), cudaMemcpyHostToDevice));
  return p;
}
template <typename T> T* dev_alloc(size_t n) { T* p; CUDA_CHECK(cudaMalloc(&p, n * sizeof(T))); CUDA_CHECK(cudaMemset(p, 0, n * sizeof(T))); return p; }

void bench(const char* name, int N, int C, int E, int K) {
  using T = bf16;
  const size_t S = size_t(N) * K;
  T* x = dev_random<T>(size_t(N) * C, 1, 1); T* w = dev_random<T>(size_t(E) * C, 0.02f, 2);
  float* logits = dev_alloc<float>(size_t(N) * E); float* probs = dev_alloc<float>(size_t(N) * E);
  int* expert = dev_alloc<int>(S); float* gate = dev_alloc<float>(S); float* dgate = dev_random<float>(S, 1, 3);
  int* counts = dev_alloc<int>(E); float* sums = dev_alloc<float>(E); float* aux = dev_random<float>(E, 0.01f, 4);
  float* dlogits = dev_alloc<float>(size_t(N) * E);
  T* dx = dev_alloc<T>(size_t(N) * C); T* dw = dev_alloc<T>(size_t(E) * C);
  float* scratch = dev_alloc<float>(moe_router_input_backward_scratch_bytes(N, C, E) / 4);
  int* offsets = dev_alloc<int>(E + 1); int* slot = dev_alloc<int>(S); int* tos = dev_alloc<int>(S);
  T* xp = dev_alloc<T>(S * C); T* y = dev_random<T>(S * C, 1, 5); T* out = dev_alloc<T>(size_t(N) * C);
  T* dy = dev_alloc<T>(S * C);
  moe_router_logits<T>(logits, x, w, N, C, E, 0);
  moe_route_softmax_topk(probs, expert, gate, logits, N, E, K, 0);
  moe_dispatch_plan(offsets, slot, tos, expert, N, E, K, 0);
  CUDA_CHECK(cudaDeviceSynchronize());
  const double xbytes = double(N) * C * 2, sbytes = double(S) * C * 2;
  printf("%s: N=%d C=%d E=%d K=%d\n", name, N, C, E, K);
  auto row = [](const char* op, float ms, double bytes) { printf("  %-28s %8.3f ms  %7.0f GB/s\n", op, ms, bytes / ms / 1e6); };
  row("router_logits", time_ms([&] { moe_router_logits<T>(logits, x, w, N, C, E, 0); }), xbytes + double(N) * E * 4);
  row("route_softmax_topk", time_ms([&] { moe_route_softmax_topk(probs, expert, gate, logits, N, E, K, 0); }), double(N) * E * 8);
  row("route_sigmoid_topk", time_ms([&] { moe_route_sigmoid_topk(probs, expert, gate, logits, aux, N, E, K, 0); }), double(N) * E * 8);
  moe_route_softmax_topk(probs, expert, gate, logits, N, E, K, 0);
  row("router_stats", time_ms([&] { moe_router_stats(counts, sums, expert, probs, N, E, K, 0); }), double(N) * E * 4);
  row("router_backward_softmax", time_ms([&] { moe_router_backward_softmax(dlogits, dgate, probs, expert, gate, aux, N, E, K, 0); }), double(N) * E * 8);
  row("router_input_backward", time_ms([&] { moe_router_input_backward<T>(dx, dw, scratch, dlogits, x, w, N, C, E, 0); }), 3 * xbytes + double(N) * E * 4);
  row("dispatch_plan", time_ms([&] { moe_dispatch_plan(offsets, slot, tos, expert, N, E, K, 0); }), double(S) * 12);
  row("permute", time_ms([&] { moe_permute<T>(xp, x, tos, int(S), C, 0); }), 2 * sbytes);
  row("combine", time_ms([&] { moe_combine<T>(out, y, gate, slot, N, K, C, 0); }), sbytes + xbytes);
  row("combine_backward", time_ms([&] { moe_combine_backward<T>(dy, dgate, out, y, gate, slot, N, K, C, 0); }), 2 * sbytes + xbytes);
  row("unpermute_sum", time_ms([&] { moe_unpermute_sum<T>(dx, y, slot, N, K, C, true, 0); }), sbytes + 2 * xbytes);
  CUDA_CHECK(cudaDeviceSynchronize());
  for (void* p : std::vector<void*>{x, w, logits, probs, expert, gate, dgate, counts, sums, aux, dlogits, dx, dw, scratch,
                                    offsets, slot, tos, xp, y, out, dy})
    CUDA_CHECK(cudaFree(p));
}

int main() {
  bench("Mixtral-8x7B-like", 16384, 4096, 8, 2);
  bench("OLMoE-like", 16384, 2048, 64, 8);
  bench("DeepSeek-V3-like", 16384, 7168, 256, 8);
  return 0;
}

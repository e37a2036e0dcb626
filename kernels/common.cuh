// common.cuh — what every kernel and every host file includes.
// This is the single point where the GPU build (nvcc) and the CPU build (g++ over simt/)
// differ: under SIMT the CUDA language, runtime and PTX wrappers come from simt/simt.h;
// otherwise from the CUDA toolkit and the inline PTX below. Everything after the #endif
// is shared, byte for byte, by both builds.
#pragma once
#include <cstdarg>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>

#ifdef SIMT
#include "../simt/simt.h"
// UNROLL before a loop with a compile-time trip count unrolls it fully (on the GPU, register
// arrays indexed by its variable then stay in registers); g++ spells the pragma its own way.
#define UNROLL _Pragma("GCC unroll 64")
#else
#define UNROLL _Pragma("unroll")
#include <cuda_runtime.h>
#include <cuda_bf16.h>

// kernel<<<grid, block, smem, stream>>>(args...), for launch() below; the CPU build's simt.h
// answers the same call with its own scheduler.
template <typename... Params, typename... Args>
inline void launch_on_device(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                             cudaStream_t stream, Args&&... args) {
  kernel<<<grid, block, smem, stream>>>(std::forward<Args>(args)...);
}

// Dynamic shared memory as a typed pointer; one raw byte array avoids nvcc's
// "one type per extern __shared__ name" rule across kernels of a translation unit.
#define DYNAMIC_SHARED(T, name)                          \
  extern __shared__ __align__(16) unsigned char name##_bytes[]; \
  T* name = reinterpret_cast<T*>(name##_bytes)

// A kernel declared __launch_bounds__(N) opens with LAUNCH_BOUNDS_GUARD(N): nothing here, where a
// launch over the bound fails on its own; the CPU build fails the launch the same way
// (test/lint/launch_bounds.sh fails a kernel without it).
#define LAUNCH_BOUNDS_GUARD(max_threads_per_block)

// 128-bit global/shared access primitives; the shared Vec128 helpers below build on them.
__device__ __forceinline__ int4 load_int4(const void* p) { return *reinterpret_cast<const int4*>(p); }
__device__ __forceinline__ int4 load_int4_streaming(const void* p) { return __ldcs(reinterpret_cast<const int4*>(p)); }
__device__ __forceinline__ void store_int4(void* p, int4 v) { *reinterpret_cast<int4*>(p) = v; }
__device__ __forceinline__ void store_int4_streaming(void* p, int4 v) { __stcs(reinterpret_cast<int4*>(p), v); }

// D = A·B + C on tensor cores: A 16x16 bf16 (row), B 16x8 bf16 (col), C/D 16x8 fp32.
// Fragment layout per the PTX ISA, section "Matrix Fragments for mma.m16n8k16".
__device__ __forceinline__ void mma_m16n8k16_bf16(float d[4], const uint32_t a[4], const uint32_t b[2],
                                                  const float c[4]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
      "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%11,%12,%13};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]),
        "f"(c[2]), "f"(c[3]));
}

__device__ __forceinline__ unsigned shared_address(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// ldmatrix: each participating lane passes the address of one 16-byte row in shared memory
// (lanes 0-7 matrix 0, 8-15 matrix 1, ...); every lane receives one 32-bit word per matrix.
__device__ __forceinline__ void ldmatrix_x1(uint32_t r[1], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];\n" : "=r"(r[0]) : "r"(shared_address(row)));
}
__device__ __forceinline__ void ldmatrix_x2(uint32_t r[2], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1]) : "r"(shared_address(row)));
}
__device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(shared_address(row)));
}
__device__ __forceinline__ void ldmatrix_x1_trans(uint32_t r[1], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16 {%0}, [%1];\n" : "=r"(r[0]) : "r"(shared_address(row)));
}
__device__ __forceinline__ void ldmatrix_x2_trans(uint32_t r[2], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1]) : "r"(shared_address(row)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t r[4], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(shared_address(row)));
}

// Asynchronous 16-byte global→shared copies, grouped by commit; wait<N> leaves N groups in flight.
__device__ __forceinline__ void cp_async_16(void* smem_dst, const void* gmem_src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(shared_address(smem_dst)), "l"(gmem_src));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }
#endif  // SIMT

// ---------------------------------------------------------------------------------------
// Shared by both builds.

using bf16 = __nv_bfloat16;

// The one error path of kernels/ (launchers' argument checks, CUDA_CHECK, matmul.cuh's CUBLAS_CHECK),
// host code and tests alike: throws std::runtime_error(what), so the caller decides (train_gpt
// reports it with the rank and ends every rank; a test checks the message). No launcher exits.
[[noreturn]] inline void throw_error(const std::string& what) { throw std::runtime_error(what); }
// throw_error with a printf-style message.
[[noreturn]] inline __attribute__((format(printf, 1, 2))) void throw_errorf(const char* format, ...) {
  va_list args;
  va_start(args, format);
  const int length = std::vsnprintf(nullptr, 0, format, args);
  va_end(args);
  std::string what(length > 0 ? static_cast<size_t>(length) : 0, '\0');
  va_start(args, format);
  std::vsnprintf(&what[0], what.size() + 1, format, args);
  va_end(args);
  throw_error(what);
}

// The check of CUDA runtime results: throws "<what>: <the runtime's message>". CUDA_CHECK(call)
// names the call and where it stands. The message is built only on failure: launchers check after
// every launch.
[[noreturn]] inline void cuda_fail(cudaError_t err, const char* what) {
  throw_error(std::string(what) + ": " + cudaGetErrorString(err));
}
inline void cuda_check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) cuda_fail(err, what);
}
#define CUDA_CHECK_STRINGIFY_(x) #x
#define CUDA_CHECK_LINE_(x) CUDA_CHECK_STRINGIFY_(x)
#define CUDA_CHECK(call) cuda_check((call), __FILE__ ":" CUDA_CHECK_LINE_(__LINE__) ": " #call)

#include "profile.cuh"

// Launches kernel<<<grid, block, smem, stream>>>(args...). Every launch goes through here, so the
// CPU build answers it with its own scheduler and --profile (profile.cuh) sees every kernel.
template <typename... Params, typename... Args>
inline void launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                   Args&&... args) {
  profiled_kernel(reinterpret_cast<const void*>(kernel), stream,
                  [&] { launch_on_device(kernel, grid, block, smem, stream, std::forward<Args>(args)...); });
}

template <typename T>
__host__ __device__ constexpr T ceil_div(T a, T b) { return (a + b - 1) / b; }

// Scalar conversions between storage types and fp32 compute.
__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(bf16 x) { return __bfloat162float(x); }
template <typename T> __device__ __forceinline__ T from_float(float x);
template <> __device__ __forceinline__ float from_float<float>(float x) { return x; }
template <> __device__ __forceinline__ bf16 from_float<bf16>(float x) { return __float2bfloat16_rn(x); }

// 16 bytes of T, moved with one 128-bit access. Pointers must be 16-byte aligned
// (the CPU build reports a misaligned one as cudaErrorMisalignedAddress).
template <typename T>
struct alignas(16) Vec128 {
  static constexpr int size = 16 / sizeof(T);
  T v[size];
  __device__ __forceinline__ T& operator[](int i) { return v[i]; }
  __device__ __forceinline__ const T& operator[](int i) const { return v[i]; }
  __device__ __forceinline__ static Vec128 from_int4(int4 bits) {
    Vec128 r;
    memcpy(static_cast<void*>(&r), &bits, sizeof(r));
    return r;
  }
  __device__ __forceinline__ int4 to_int4() const {
    int4 bits;
    memcpy(&bits, static_cast<const void*>(this), sizeof(bits));
    return bits;
  }
};
template <typename T> __device__ __forceinline__ Vec128<T> load128(const T* p) { return Vec128<T>::from_int4(load_int4(p)); }
template <typename T> __device__ __forceinline__ Vec128<T> load128cs(const T* p) { return Vec128<T>::from_int4(load_int4_streaming(p)); }
template <typename T> __device__ __forceinline__ void store128(T* p, const Vec128<T>& v) { store_int4(p, v.to_int4()); }
template <typename T> __device__ __forceinline__ void store128cs(T* p, const Vec128<T>& v) { store_int4_streaming(p, v.to_int4()); }

// Warp-wide reductions (all 32 lanes participate; every lane gets the result).
__device__ __forceinline__ float warp_sum(float x) {
  for (int offset = 16; offset > 0; offset >>= 1) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}
__device__ __forceinline__ float warp_max(float x) {
  for (int offset = 16; offset > 0; offset >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
  return x;
}

// Column sums of an fp32 (rows × cols) row-major matrix of partial sums: the second level of the
// bias-gradient and LayerNorm-backward reductions. Block b, of (kColumnSumWidth, kColumnSumWarps)
// threads, owns columns [b·kColumnSumWidth, (b+1)·kColumnSumWidth): a warp reads 128 contiguous
// bytes per row, and each column's rows are spread over kColumnSumWarps warps rather than walked
// by one thread, whose chain of dependent loads would set the kernel's time whatever its width.
// Thread (x, y) adds rows y, y + kColumnSumWarps, ... of its column in increasing order; then the
// threads with y = 0 add the kColumnSumWarps sums in increasing y. The order depends on `rows`
// alone, never on scheduling. Called once per block, by every thread, over a grid of
// ceil(cols / kColumnSumWidth) blocks; the threads with y = 0 and a column < cols get its sum.
constexpr int kColumnSumWidth = 32;
constexpr int kColumnSumWarps = 16;
__device__ __forceinline__ float block_column_sum(const float* matrix, int rows, int cols) {
  __shared__ float warp_sums[kColumnSumWarps][kColumnSumWidth];
  const int col = blockIdx.x * kColumnSumWidth + threadIdx.x;
  float sum = 0.0f;
  if (col < cols)
    for (int r = threadIdx.y; r < rows; r += kColumnSumWarps) sum += matrix[static_cast<size_t>(r) * cols + col];
  warp_sums[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  float total = 0.0f;
  if (threadIdx.y == 0)
    for (int y = 0; y < kColumnSumWarps; ++y) total += warp_sums[y][threadIdx.x];
  return total;
}

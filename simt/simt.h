// simt.h — the CUDA language on a CPU, for the g++ build (included by kernels/common.cuh
// when SIMT is defined, never by nvcc).
//
// Every CUDA thread of a block is a fiber; the threads of one block run cooperatively on
// one OS thread, switching at __syncthreads, warp collectives and exit; blocks are spread
// over a persistent pool of OS threads (simt/runtime.cpp). `__shared__` becomes
// `thread_local`: a block-scope thread_local is static, one copy per OS thread, and blocks
// never interleave on an OS thread, so it is one copy per running block.
//
// Environment: SIMT_SCHEDULE=forward|reverse|random:SEED (order threads of a block run in),
// SIMT_THREADS=N (OS threads for blocks), SIMT_BARRIER_SITES=0 (allow __syncthreads of one
// barrier at different source lines), SIMT_STACK_KB (fiber stack size).
#pragma once
#ifdef __CUDACC__
#error "simt/simt.h is for the host compiler; nvcc builds use the CUDA toolkit"
#endif

// Execution-space keywords must exist before any CUDA header: crt/host_defines.h only
// defines them when they are still undefined.
#define __global__
#define __device__
#define __host__
#define __constant__
#define __managed__
#define __grid_constant__
// The attribute cannot carry its bound to g++, and its position (before the kernel's name) admits
// nothing that could register it; kernels that declare a bound restate it with LAUNCH_BOUNDS_GUARD
// (kernels/common.cuh), which simt honours.
#define __launch_bounds__(...)
#define __shared__ thread_local

#include <cuda_runtime.h>
#include <cuda_bf16.h>

#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <type_traits>
#include <utility>

#include "counters.h"
#include "kernel_resources.h"
#include "streams.h"

// Built-in variables, kept current by the scheduler at every fiber switch.
inline thread_local uint3 threadIdx;
inline thread_local uint3 blockIdx;
inline thread_local dim3 blockDim;
inline thread_local dim3 gridDim;
constexpr int warpSize = 32;

namespace simt {

constexpr int kWarpSize = 32;
constexpr size_t kLanePayload = 64;  // bytes one lane may pass into a warp collective

struct WarpState;
using CollectiveFn = void (*)(WarpState&);

// One warp's rendezvous: each lane deposits its input; the last lane to arrive computes
// every lane's output at once, so a lane racing ahead into the next collective cannot
// overwrite inputs still being read.
struct WarpState {
  unsigned live = 0;        // lanes that exist and have not returned
  unsigned arrived = 0;     // lanes waiting in the open collective
  unsigned mask = 0;        // member mask of the open collective
  CollectiveFn fn = nullptr;
  int param = 0;            // collective-specific (e.g. ldmatrix matrix count)
  const char* what = nullptr;
  int src_lane[kWarpSize];
  alignas(16) unsigned char in[kWarpSize][kLanePayload];
  alignas(16) unsigned char out[kWarpSize][kLanePayload];
};

// What one launch runs: the kernel's address (for attributes and messages), a type-erased call
// of the kernel with its converted arguments, and for the stream ordering checker its stream and
// the device memory its pointer arguments reach.
struct LaunchSpec {
  const void* kernel;
  dim3 grid, block;
  size_t dynamic_smem;
  void (*invoke)(const void* bound);
  const void* bound;
  cudaStream_t stream;
  const MemoryAccess* accesses;
  size_t access_count;
};

// Runs a launch: validates the configuration (an invalid one sets the error
// cudaGetLastError reports, as on a GPU) and executes every block.
void run_launch(const LaunchSpec& spec);

// Device-side services, implemented in runtime.cpp.
// False (and the launch fails with cudaErrorLaunchOutOfResources, as a GPU refuses it) when the
// block has more threads than the kernel's __launch_bounds__ allows.
bool within_launch_bounds(int max_threads_per_block);
void syncthreads(const char* site);
void warp_collective(unsigned mask, const char* what, CollectiveFn fn, int param, const void* in,
                     size_t in_bytes, void* out, size_t out_bytes, int src_lane = 0);
int lane_id();
unsigned live_lanes();
void* dynamic_shared_memory();
// A fault inside a kernel (what a GPU would report at the next synchronization):
// recorded as a sticky error, with one message on stderr.
void kernel_fault(cudaError_t err, const char* what, const void* address);

void gather_fn(WarpState& w);
void ballot_fn(WarpState& w);
void nop_fn(WarpState& w);
void mma_m16n8k16_bf16_fn(WarpState& w);
void ldmatrix_fn(WarpState& w);  // param = matrices | (transpose << 8)

void cp_async_enqueue(void* dst, const void* src, size_t bytes);
void cp_async_commit_group();
void cp_async_wait_groups(int keep_in_flight);

template <typename Kernel, typename Tuple>
struct BoundKernel {
  Kernel kernel;
  Tuple args;
  static void invoke(const void* self) {
    const BoundKernel* b = static_cast<const BoundKernel*>(self);
    std::apply(b->kernel, b->args);
  }
};

// A kernel's pointer argument reaches from where it points to the end of that allocation: a
// pointer to const is read, any other is read and written.
template <typename T>
void add_pointer_access(const T& arg, MemoryAccess* accesses, size_t* count) {
  if constexpr (std::is_pointer<T>::value)
    accesses[(*count)++] = {static_cast<const void*>(arg), kWholeRest, !std::is_const<std::remove_pointer_t<T>>::value};
}

template <typename T>
T shuffle(unsigned mask, const char* what, T v, int src_lane) {
  static_assert(std::is_trivially_copyable<T>::value && sizeof(T) <= kLanePayload, "shuffle type");
  T r;
  warp_collective(mask, what, gather_fn, 0, &v, sizeof(T), &r, sizeof(T), src_lane);
  return r;
}

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

}  // namespace simt

// ---- launch and dynamic shared memory (same call syntax as the nvcc definitions; common.cuh's
// launch() calls launch_on_device)
template <typename... Params, typename... Args>
inline void launch_on_device(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                             Args&&... args) {
  // Arguments are converted to the parameter types once, as cudaLaunchKernel copies them.
  using Tuple = std::tuple<std::decay_t<Params>...>;
  simt::BoundKernel<void (*)(Params...), Tuple> bound{kernel, Tuple(std::forward<Args>(args)...)};
  std::array<simt::MemoryAccess, sizeof...(Params)> accesses{};
  size_t access_count = 0;
  std::apply([&](const auto&... arg) { (simt::add_pointer_access(arg, accesses.data(), &access_count), ...); },
             bound.args);
  simt::run_launch({reinterpret_cast<const void*>(kernel), grid, block, smem, &decltype(bound)::invoke, &bound,
                    stream, accesses.data(), access_count});
}

#define DYNAMIC_SHARED(T, name) T* name = reinterpret_cast<T*>(::simt::dynamic_shared_memory())
#define LAUNCH_BOUNDS_GUARD(max_threads_per_block) \
  if (!::simt::within_launch_bounds(max_threads_per_block)) return

// ---- synchronization and warp collectives
#define SIMT_STRINGIFY2(x) #x
#define SIMT_STRINGIFY(x) SIMT_STRINGIFY2(x)
#define __syncthreads() ::simt::syncthreads(__FILE__ ":" SIMT_STRINGIFY(__LINE__))

inline void __syncwarp(unsigned mask = 0xffffffffu) {
  simt::warp_collective(mask, "__syncwarp", simt::nop_fn, 0, nullptr, 0, nullptr, 0);
}
template <typename T>
T __shfl_sync(unsigned mask, T v, int src, int width = warpSize) {
  int lane = simt::lane_id();
  return simt::shuffle(mask, "__shfl_sync", v, (lane & ~(width - 1)) + (src & (width - 1)));
}
template <typename T>
T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = warpSize) {
  int lane = simt::lane_id(), src = lane ^ lane_mask;
  if ((src & ~(width - 1)) > (lane & ~(width - 1))) src = lane;  // beyond this segment: own value
  return simt::shuffle(mask, "__shfl_xor_sync", v, src);
}
template <typename T>
T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = warpSize) {
  int lane = simt::lane_id();
  int src = (lane & (width - 1)) + static_cast<int>(delta) < width ? lane + static_cast<int>(delta) : lane;
  return simt::shuffle(mask, "__shfl_down_sync", v, src);
}
template <typename T>
T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = warpSize) {
  int lane = simt::lane_id();
  int src = (lane & (width - 1)) >= static_cast<int>(delta) ? lane - static_cast<int>(delta) : lane;
  return simt::shuffle(mask, "__shfl_up_sync", v, src);
}
inline unsigned __ballot_sync(unsigned mask, int predicate) {
  unsigned char p = predicate != 0;
  unsigned bits;
  simt::warp_collective(mask, "__ballot_sync", simt::ballot_fn, 0, &p, 1, &bits, sizeof bits);
  return bits;
}
inline int __any_sync(unsigned mask, int predicate) { return __ballot_sync(mask, predicate) != 0; }
inline int __all_sync(unsigned mask, int predicate) {
  unsigned participants = mask & simt::live_lanes();
  return (__ballot_sync(mask, predicate) & participants) == participants;
}

// ---- atomics: real atomics, because blocks run on several OS threads at once
inline int atomicAdd(int* p, int v) { return __atomic_fetch_add(p, v, __ATOMIC_RELAXED); }
inline unsigned atomicAdd(unsigned* p, unsigned v) { return __atomic_fetch_add(p, v, __ATOMIC_RELAXED); }
inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) {
  return __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
}
inline int atomicMax(int* p, int v) {
  int old = __atomic_load_n(p, __ATOMIC_RELAXED);
  while (old < v && !__atomic_compare_exchange_n(p, &old, v, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
  }
  return old;
}
inline int atomicCAS(int* p, int expected, int desired) {
  __atomic_compare_exchange_n(p, &expected, desired, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
  return expected;
}
inline unsigned atomicCAS(unsigned* p, unsigned expected, unsigned desired) {
  __atomic_compare_exchange_n(p, &expected, desired, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
  return expected;
}
namespace simt {
// Read-modify-write of a 32-bit word through compare-and-swap.
template <typename T, typename Op>
T atomic_update32(T* p, Op op) {
  static_assert(sizeof(T) == 4, "32-bit atomics only");
  uint32_t* word = reinterpret_cast<uint32_t*>(p);
  uint32_t old_bits = __atomic_load_n(word, __ATOMIC_RELAXED), new_bits;
  T old_value;
  do {
    std::memcpy(static_cast<void*>(&old_value), &old_bits, 4);
    T new_value = op(old_value);
    std::memcpy(&new_bits, static_cast<const void*>(&new_value), 4);
  } while (!__atomic_compare_exchange_n(word, &old_bits, new_bits, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
  return old_value;
}
}  // namespace simt
inline float atomicAdd(float* p, float v) {
  return simt::atomic_update32(p, [v](float x) { return x + v; });
}
inline __nv_bfloat162 atomicAdd(__nv_bfloat162* p, __nv_bfloat162 v) {
  return simt::atomic_update32(p, [v](__nv_bfloat162 x) {
    return __floats2bfloat162_rn(__low2float(x) + __low2float(v), __high2float(x) + __high2float(v));
  });
}
inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline void __threadfence_block() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }

// ---- cache-hinted loads/stores are plain accesses on a CPU
template <typename T> T __ldg(const T* p) { return *p; }
template <typename T> T __ldcs(const T* p) { return *p; }
template <typename T> T __ldcg(const T* p) { return *p; }
template <typename T> void __stcs(T* p, T v) { *p = v; }
template <typename T> void __stcg(T* p, T v) { *p = v; }

// ---- device math that libm lacks
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline float __expf(float x) noexcept { return std::exp(x); }
inline float __logf(float x) noexcept { return std::log(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline float __saturatef(float x) { return x < 0.f ? 0.f : (x > 1.f ? 1.f : x); }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }
inline size_t min(size_t a, size_t b) { return a < b ? a : b; }
inline size_t max(size_t a, size_t b) { return a > b ? a : b; }
inline float min(float a, float b) { return std::fmin(a, b); }
inline float max(float a, float b) { return std::fmax(a, b); }

// ---- 128-bit access primitives (kernels use Vec128 from common.cuh on top of these)
inline int4 load_int4(const void* p) {
  if (!simt::aligned16(p)) simt::kernel_fault(cudaErrorMisalignedAddress, "128-bit load", p);
  int4 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline int4 load_int4_streaming(const void* p) { return load_int4(p); }
inline void store_int4(void* p, int4 v) {
  if (!simt::aligned16(p)) simt::kernel_fault(cudaErrorMisalignedAddress, "128-bit store", p);
  std::memcpy(p, &v, sizeof v);
}
inline void store_int4_streaming(void* p, int4 v) { store_int4(p, v); }

// ---- tensor-core and shared-memory PTX wrappers, emulated as warp collectives
inline void mma_m16n8k16_bf16(float d[4], const uint32_t a[4], const uint32_t b[2], const float c[4]) {
  uint32_t in[10];
  std::memcpy(in, a, 16);
  std::memcpy(in + 4, b, 8);
  std::memcpy(in + 6, c, 16);
  simt::warp_collective(0xffffffffu, "mma.sync.m16n8k16", simt::mma_m16n8k16_bf16_fn, 0, in, sizeof in, d, 16);
}
namespace simt {
inline void ldmatrix(uint32_t* r, int matrices, bool transpose, const void* row) {
  warp_collective(0xffffffffu, transpose ? "ldmatrix.trans" : "ldmatrix", ldmatrix_fn,
                  matrices | (transpose ? 256 : 0), &row, sizeof row, r, 4 * static_cast<size_t>(matrices));
}
}  // namespace simt
inline void ldmatrix_x1(uint32_t r[1], const void* row) { simt::ldmatrix(r, 1, false, row); }
inline void ldmatrix_x2(uint32_t r[2], const void* row) { simt::ldmatrix(r, 2, false, row); }
inline void ldmatrix_x4(uint32_t r[4], const void* row) { simt::ldmatrix(r, 4, false, row); }
inline void ldmatrix_x1_trans(uint32_t r[1], const void* row) { simt::ldmatrix(r, 1, true, row); }
inline void ldmatrix_x2_trans(uint32_t r[2], const void* row) { simt::ldmatrix(r, 2, true, row); }
inline void ldmatrix_x4_trans(uint32_t r[4], const void* row) { simt::ldmatrix(r, 4, true, row); }

// cp.async copies are deferred until the wait that covers their group, so a kernel that
// reads shared memory before waiting sees the poison, as it could on a GPU.
inline void cp_async_16(void* smem_dst, const void* gmem_src) {
  if (!simt::aligned16(smem_dst) || !simt::aligned16(gmem_src))
    simt::kernel_fault(cudaErrorMisalignedAddress, "cp.async 16-byte copy",
                       simt::aligned16(smem_dst) ? gmem_src : smem_dst);
  simt::cp_async_enqueue(smem_dst, gmem_src, 16);
}
inline void cp_async_commit() { simt::cp_async_commit_group(); }
template <int N>
inline void cp_async_wait() { simt::cp_async_wait_groups(N); }


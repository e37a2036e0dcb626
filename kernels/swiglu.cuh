// swiglu.cuh — the element-wise part of Llama's MLP, w2(silu(w1·x) ⊙ w3·x): given the two
// products a = w1·x and b = w3·x (cuBLASLt's), out = silu(a)·b with silu(a) = a·σ(a), and its
// backward da, db given dout.
//
// Layouts: a and b are (N, H) matrices whose rows lie `ld` elements apart (ld = H for two
// separate buffers; ld = 2H with b = a + H for one fused [w1 | w3] product); out and dout are
// (N, H) contiguous; da and db take a's and b's layout. Math is fp32 with Meta's roundings:
// silu(a) is rounded to T before the multiply by b (PyTorch's F.silu returns T), then the product
// is rounded once. One 128-bit access per operand per thread, so H and ld must be multiples of
// 16 / sizeof(T) (4 floats, 8 bf16). The forward can also write its output's FP8 E4M3 copy and
// record its amax (Fp8Out, kernels/fp8_cast.cuh: the codes and amax fp8_cast gives on the rounded
// output, bit for bit): the input cast of the MLP's down product (src/model/fp8_state.h).
#pragma once
#include "common.cuh"
#include "fp8_cast.cuh"

constexpr int kSwigluBlock = 256;

__device__ __forceinline__ float swiglu_sigmoid(float a) { return 1.0f / (1.0f + expf(-a)); }

// silu(a)·b rounded to T, silu(a) rounded to T first (Meta's roundings).
template <typename T>
__device__ __forceinline__ T swiglu_value(float a, float b) {
  const float silu = to_float(from_float<T>(a * swiglu_sigmoid(a)));
  return from_float<T>(silu * b);
}

// The chunk-th 128-bit chunk of the (N, H) output: its element offset in the contiguous out/dout
// and in the strided a/b (or da/db). Both are written as a chunk count times the chunk's width,
// which lets nvcc see the 16-byte alignment and keep the stores 128-bit.
struct SwigluChunk {
  size_t dense, strided;
};
template <typename T>
__device__ __forceinline__ SwigluChunk swiglu_chunk(size_t chunk, int H, int ld) {
  constexpr int kVec = Vec128<T>::size;
  const size_t chunks_per_row = static_cast<size_t>(H / kVec);
  const size_t row = chunk / chunks_per_row;
  const size_t strided_chunk = row * static_cast<size_t>(ld / kVec) + chunk % chunks_per_row;
  return {chunk * kVec, strided_chunk * kVec};
}

// kFp8 (an FP8 copy, out8 set): a kernel of its own, so that the plain activation keeps its
// registers; out8, scale8, amax8 are Fp8Out's. Every thread reaches the block's amax reduction.
template <typename T, bool kFp8>
__global__ void __launch_bounds__(kSwigluBlock)
    swiglu_forward_kernel(T* out, const T* a, const T* b, size_t chunks, int H, int ld, fp8e4m3* out8,
                          const float* scale8, float* amax8) {
  LAUNCH_BOUNDS_GUARD(kSwigluBlock);
  constexpr int kVec = Vec128<T>::size;
  const size_t chunk = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  int key = 0;
  if (chunk < chunks) {
    const SwigluChunk at = swiglu_chunk<T>(chunk, H, ld);
    const Vec128<T> va = load128(a + at.strided);
    const Vec128<T> vb = load128(b + at.strided);
    Vec128<T> y;
    for (int k = 0; k < kVec; ++k) y[k] = swiglu_value<T>(to_float(va[k]), to_float(vb[k]));
    store128(out + at.dense, y);
    if constexpr (kFp8) key = fp8_cast_chunk(out8 + at.dense, y, *scale8, key);
  }
  if (kFp8 && amax8 != nullptr) fp8_record_amax<kSwigluBlock>(amax8, key);
}

// One element's gradients: da = dout·b·silu'(a), silu'(a) = σ(a)·(1 + a·(1 − σ(a))); db =
// dout·silu(a), silu(a) rounded to T as the forward pass used it; each rounded once to T. Both
// backward kernels take them from here, so their bits agree.
template <typename T>
__device__ __forceinline__ void swiglu_gradients(T& da, T& db, float g, float a, float b) {
  const float sig = swiglu_sigmoid(a);
  const float silu = to_float(from_float<T>(a * sig));
  da = from_float<T>(g * b * sig * (1.0f + a * (1.0f - sig)));
  db = from_float<T>(g * silu);
}

// da = dout·b·silu'(a), db = dout·silu(a) (swiglu_gradients). Each thread reads its a, b and
// dout chunks before writing, so da may alias a and db may alias b.
template <typename T>
__global__ void swiglu_backward_kernel(T* da, T* db, const T* dout, const T* a, const T* b, size_t chunks, int H,
                                      int ld) {
  constexpr int kVec = Vec128<T>::size;
  const size_t chunk = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (chunk >= chunks) return;
  const SwigluChunk at = swiglu_chunk<T>(chunk, H, ld);
  const Vec128<T> va = load128(a + at.strided);
  const Vec128<T> vb = load128(b + at.strided);
  const Vec128<T> dy = load128(dout + at.dense);
  Vec128<T> ga, gb;
  for (int k = 0; k < kVec; ++k) swiglu_gradients(ga[k], gb[k], to_float(dy[k]), to_float(va[k]), to_float(vb[k]));
  store128(da + at.strided, ga);
  store128(db + at.strided, gb);
}

// The backward's gradients cast for FP8 products as it computes them (src/model/fp8_state.h: with
// delayed scaling, the w1 and w3 products' output gradients): the bf16 da and db that
// swiglu_backward_kernel computes, never written, cast to E5M2 with their own scales, each written
// as stored (N, H) and transposed (H, N), and their amaxes recorded: the codes and amaxes fp8_cast
// gives on swiglu_backward's outputs, bit for bit. fp8_cast_wide_kernel's tiling: a block of (8, 32)
// threads owns a 64×64 tile of both gradients, a thread 8 columns of two rows; the transposed codes
// go through shared memory. a, b, dout: (N, H) contiguous.
__global__ void __launch_bounds__(kFp8WideThreads)
    swiglu_backward_fp8_kernel(fp8e5m2* da8, fp8e5m2* da8t, float* amax_a, fp8e5m2* db8, fp8e5m2* db8t,
                               float* amax_b, const bf16* dout, const bf16* a, const bf16* b, int N, int H,
                               const float* scale_a, const float* scale_b) {
  LAUNCH_BOUNDS_GUARD(kFp8WideThreads);
  static_assert(Vec128<bf16>::size == kFp8WideChunk, "one 16-byte load per operand and chunk");
  __shared__ Fp8WideTile tiles[2];  // da's codes, db's
  const float sa = *scale_a, sb = *scale_b;
  const int row0 = blockIdx.x * kFp8WideTile, col0 = blockIdx.y * kFp8WideTile;
  const int c = kFp8WideChunk * threadIdx.x;
  int key_a = 0, key_b = 0;
  UNROLL
  for (int pass = 0; pass < kFp8WideTile / kFp8WideRowsPerPass; ++pass) {
    const int r = threadIdx.y + pass * kFp8WideRowsPerPass;
    if (row0 + r >= N || col0 + c >= H) continue;
    const size_t i = static_cast<size_t>(row0 + r) * H + col0 + c;
    const Vec128<bf16> va = load128(a + i), vb = load128(b + i), dy = load128(dout + i);
    float xa[kFp8WideChunk], xb[kFp8WideChunk];
    UNROLL
    for (int k = 0; k < kFp8WideChunk; ++k) {
      bf16 ga, gb;
      swiglu_gradients(ga, gb, to_float(dy[k]), to_float(va[k]), to_float(vb[k]));
      xa[k] = to_float(ga);
      xb[k] = to_float(gb);
    }
    uint32_t words[2];
    key_a = fp8_wide_cast_chunk<fp8e5m2>(xa, sa, key_a, words, &tiles[0], r, c);
    *reinterpret_cast<uint2*>(reinterpret_cast<uint8_t*>(da8) + i) = uint2{words[0], words[1]};
    key_b = fp8_wide_cast_chunk<fp8e5m2>(xb, sb, key_b, words, &tiles[1], r, c);
    *reinterpret_cast<uint2*>(reinterpret_cast<uint8_t*>(db8) + i) = uint2{words[0], words[1]};
  }
  __syncthreads();
  fp8_wide_store_transposed(da8t, tiles[0], row0, col0, N, H);
  fp8_wide_store_transposed(db8t, tiles[1], row0, col0, N, H);
  if (amax_a != nullptr) fp8_record_amax<kFp8WideThreads>(amax_a, key_a);
  __syncthreads();  // fp8_record_amax's shared keys are used again
  if (amax_b != nullptr) fp8_record_amax<kFp8WideThreads>(amax_b, key_b);
}

template <typename T>
void swiglu_check_shape(const char* op, int N, int H, int ld) {
  constexpr int kVec = Vec128<T>::size;
  if (N < 0 || H < 1 || H % kVec != 0 || ld < H || ld % kVec != 0) {
    throw_errorf("%s: need N>=0, H a positive multiple of %d (128-bit accesses) and ld >= H a multiple of %d; "
                 "got N=%d H=%d ld=%d",
                 op, kVec, kVec, N, H, ld);
  }
}

inline unsigned swiglu_blocks(size_t chunks) {
  return static_cast<unsigned>(ceil_div(chunks, static_cast<size_t>(kSwigluBlock)));
}

// out = silu(a)·b over N rows of H (out written, not accumulated). fp8 (none by default): out's
// FP8 copy (N, H) and its amax, as fp8_cast of out would give them.
template <typename T>
void swiglu_forward(T* out, const T* a, const T* b, int N, int H, int ld, cudaStream_t stream,
                    const Fp8Out& fp8 = {}) {
  swiglu_check_shape<T>("swiglu_forward", N, H, ld);
  fp8_out_check<T>("swiglu_forward", fp8);
  const size_t chunks = static_cast<size_t>(N) * (H / Vec128<T>::size);
  if (chunks == 0) return;
  auto* kernel = fp8.out != nullptr ? swiglu_forward_kernel<T, true> : swiglu_forward_kernel<T, false>;
  launch(kernel, dim3(swiglu_blocks(chunks)), dim3(kSwigluBlock), 0, stream, out, a, b, chunks, H, ld, fp8.out,
         fp8.scale, fp8.amax);
  CUDA_CHECK(cudaGetLastError());
}

// da, db = the gradients of silu(a)·b given dout (written, not accumulated: a and b are each
// used once). da may alias a and db may alias b (the fused product's gradient in place).
template <typename T>
void swiglu_backward(T* da, T* db, const T* dout, const T* a, const T* b, int N, int H, int ld,
                     cudaStream_t stream) {
  swiglu_check_shape<T>("swiglu_backward", N, H, ld);
  const size_t chunks = static_cast<size_t>(N) * (H / Vec128<T>::size);
  if (chunks == 0) return;
  launch(swiglu_backward_kernel<T>, dim3(swiglu_blocks(chunks)), dim3(kSwigluBlock), 0, stream, da, db, dout, a, b,
         chunks, H, ld);
  CUDA_CHECK(cudaGetLastError());
}

// With FP8 products (src/model/fp8_state.h): swiglu_backward's da and db for a, b (N, H) contiguous,
// not written, but cast to E5M2 at *scale_a and *scale_b as stored (da8, db8: N × H) and transposed
// (da8t, db8t: H × N), their amaxes folded into *amax_a and *amax_b (nullptr: not recorded), as
// fp8_cast of each would. N and H multiples of 8, the inputs 16-byte and the codes 8-byte aligned.
inline void swiglu_backward_fp8(fp8e5m2* da8, fp8e5m2* da8t, float* amax_a, const float* scale_a, fp8e5m2* db8,
                                fp8e5m2* db8t, float* amax_b, const float* scale_b, const bf16* dout, const bf16* a,
                                const bf16* b, int N, int H, cudaStream_t stream) {
  if (N < 0 || H < 0 || N % kFp8WideChunk != 0 || H % kFp8WideChunk != 0)
    throw_errorf("swiglu_backward_fp8: N=%d H=%d must be multiples of %d", N, H, kFp8WideChunk);
  if (scale_a == nullptr || scale_b == nullptr) throw_error("swiglu_backward_fp8: a scale is null");
  for (const void* p : {static_cast<const void*>(dout), static_cast<const void*>(a), static_cast<const void*>(b)})
    if (!fp8_aligned(p, 16)) throw_error("swiglu_backward_fp8: the inputs must be 16-byte aligned");
  for (const void* p : {static_cast<const void*>(da8), static_cast<const void*>(da8t), static_cast<const void*>(db8),
                        static_cast<const void*>(db8t)})
    if (p == nullptr || !fp8_aligned(p, 8)) throw_error("swiglu_backward_fp8: the codes must be given and 8-byte aligned");
  if (N == 0 || H == 0) return;
  const dim3 grid(static_cast<unsigned>(ceil_div(N, kFp8WideTile)), static_cast<unsigned>(ceil_div(H, kFp8WideTile)));
  launch(swiglu_backward_fp8_kernel, grid, dim3(kFp8WideChunksPerRow, kFp8WideRowsPerPass), 0, stream, da8, da8t,
         amax_a, db8, db8t, amax_b, dout, a, b, N, H, scale_a, scale_b);
  CUDA_CHECK(cudaGetLastError());
}

// fp8_cast_wide's Source for silu(a)·b of stored bf16 products a, b ((N, H) contiguous), rounded as
// swiglu_forward writes it: the MLP's activation recomputed for the backward straight into its FP8
// cast, never written (swiglu_forward_fp8).
struct SwigluOfStored {
  const bf16* a;
  const bf16* b;
  __device__ __forceinline__ void load(size_t i, float (&x)[kFp8WideChunk]) const {
    static_assert(Vec128<bf16>::size == kFp8WideChunk, "one 16-byte load per operand and chunk");
    const Vec128<bf16> va = load128(a + i), vb = load128(b + i);
    UNROLL
    for (int k = 0; k < kFp8WideChunk; ++k) x[k] = to_float(swiglu_value<bf16>(to_float(va[k]), to_float(vb[k])));
  }
};

// swiglu_forward's output for a, b ((N, H) contiguous) cast to E4M3 at *scale as stored (out)
// and/or transposed (out_t), its amax folded into *amax (nullptr: none), without writing the
// output: the codes fp8_cast gives on it (fp8_cast_wide's shapes). a, b 16-byte aligned.
inline void swiglu_forward_fp8(fp8e4m3* out, fp8e4m3* out_t, float* amax, const float* scale, const bf16* a,
                               const bf16* b, int N, int H, cudaStream_t stream) {
  if (!fp8_aligned(a, 16) || !fp8_aligned(b, 16))
    throw_error("swiglu_forward_fp8: the inputs must be 16-byte aligned");
  fp8_cast_wide(out, out_t, amax, SwigluOfStored{a, b}, N, H, scale, stream);
}

// swiglu.cuh — the element-wise part of Llama's MLP, w2(silu(w1·x) ⊙ w3·x): given the two
// products a = w1·x and b = w3·x (cuBLASLt's), out = silu(a)·b with silu(a) = a·σ(a), and its
// backward da, db given dout.
//
// Layouts: a and b are (N, H) matrices whose rows lie `ld` elements apart (ld = H for two
// separate buffers; ld = 2H with b = a + H for one fused [w1 | w3] product); out and dout are
// (N, H) contiguous; da and db take a's and b's layout. Math is fp32 with Meta's roundings:
// silu(a) is rounded to T before the multiply by b (PyTorch's F.silu returns T), then the product
// is rounded once. One 128-bit access per operand per thread, so H and ld must be multiples of
// 16 / sizeof(T) (4 floats, 8 bf16).
#pragma once
#include "common.cuh"

constexpr int kSwigluBlock = 256;

__device__ __forceinline__ float swiglu_sigmoid(float a) { return 1.0f / (1.0f + expf(-a)); }

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

template <typename T>
__global__ void swiglu_forward_kernel(T* out, const T* a, const T* b, size_t chunks, int H, int ld) {
  constexpr int kVec = Vec128<T>::size;
  const size_t chunk = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (chunk >= chunks) return;
  const SwigluChunk at = swiglu_chunk<T>(chunk, H, ld);
  const Vec128<T> va = load128(a + at.strided);
  const Vec128<T> vb = load128(b + at.strided);
  Vec128<T> y;
  for (int k = 0; k < kVec; ++k) {
    const float x = to_float(va[k]);
    const float silu = to_float(from_float<T>(x * swiglu_sigmoid(x)));
    y[k] = from_float<T>(silu * to_float(vb[k]));
  }
  store128(out + at.dense, y);
}

// da = dout·b·silu'(a), silu'(a) = σ(a)·(1 + a·(1 − σ(a))); db = dout·silu(a), silu(a) rounded to
// T as the forward pass used it. Each thread reads its a, b and dout chunks before writing, so da
// may alias a and db may alias b.
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
  for (int k = 0; k < kVec; ++k) {
    const float x = to_float(va[k]);
    const float g = to_float(dy[k]);
    const float sig = swiglu_sigmoid(x);
    const float silu = to_float(from_float<T>(x * sig));
    ga[k] = from_float<T>(g * to_float(vb[k]) * sig * (1.0f + x * (1.0f - sig)));
    gb[k] = from_float<T>(g * silu);
  }
  store128(da + at.strided, ga);
  store128(db + at.strided, gb);
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

// out = silu(a)·b over N rows of H (out written, not accumulated).
template <typename T>
void swiglu_forward(T* out, const T* a, const T* b, int N, int H, int ld, cudaStream_t stream) {
  swiglu_check_shape<T>("swiglu_forward", N, H, ld);
  const size_t chunks = static_cast<size_t>(N) * (H / Vec128<T>::size);
  if (chunks == 0) return;
  launch(swiglu_forward_kernel<T>, dim3(swiglu_blocks(chunks)), dim3(kSwigluBlock), 0, stream, out, a, b, chunks, H,
         ld);
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

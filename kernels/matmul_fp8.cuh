// matmul_fp8.cuh — the Linear layer's three products (matmul.cuh's forward, input gradient and
// weight gradient) with FP8 operands on cuBLASLt: E4M3 activations and weights, E5M2 output
// gradients, fp32 accumulation, bf16 results. The casts that make the operands are fp8_cast.cuh's;
// the per-tensor scales fp8_scaling.cuh's.
//
// Every FP8 operand x8 holds round(x · scale) for its tensor's scale; the products take the
// inverses (scale_inv = 1/scale, device scalars: CUBLASLT_MATMUL_DESC_A/B_SCALE_POINTER), so
// D = scale_inv_a · scale_inv_b · (A8 · B8) is the product of the decoded values in the tensors'
// own units. cuBLASLt's FP8 products exist only in the "TN" form (A transposed, B not, column-
// major: docs/SIMT.md, "The FP8 oracle"), i.e. both operands stored row-major with the reduction
// dimension contiguous. In the row-major terms of matmul.cuh (inp (rows, C), weight (OC, C)):
//   forward    out (rows, OC)     = inp8 (rows, C) · weight8 (OC, C)^T        k = C
//   dinp       dinp (rows, C)     = g8 (rows, OC) · weight8T (C, OC)^T        k = OC
//   dweight    dweight (OC, C)   += g8T (OC, rows) · inp8T (C, rows)^T        k = rows
// so the input gradient needs the weight's transposed copy, and the weight gradient transposed
// copies of the output gradient and of the input. cuBLASLt also wants k (and the leading
// dimensions) multiples of 16 bytes: C, OC and rows multiples of 16.
// The bias (bf16) is cuBLASLt's BIAS epilogue, as in matmul.cuh; its gradient and a GELU's are
// matmul.cuh's matmul_backward_bias (bf16 sums of the bf16 output gradient), or
// matmul_fp8_gradient's, which makes the same g and sums and casts g to E5M2 on the way.
#pragma once
#include "common.cuh"
#include "fp8.cuh"
#include "fp8_cast.cuh"
#include "gelu.cuh"
#include "matmul.cuh"

#include <string>

template <typename T> constexpr cudaDataType_t fp8_data_type();
template <> constexpr cudaDataType_t fp8_data_type<fp8e4m3>() { return CUDA_R_8F_E4M3; }
template <> constexpr cudaDataType_t fp8_data_type<fp8e5m2>() { return CUDA_R_8F_E5M2; }

inline void matmul_fp8_check_shape(const char* op, int rows, int C, int OC) {
  if (rows < 16 || C < 16 || OC < 16 || rows % 16 != 0 || C % 16 != 0 || OC % 16 != 0)
    throw_errorf("%s: rows=%d in_features=%d out_features=%d: cuBLASLt's FP8 products need each a positive "
                 "multiple of 16", op, rows, C, OC);
  if (matmul_context.handle == nullptr) throw_errorf("%s: matmul_init() has not been called", op);
}

// D (m × n, bf16, column-major) = scale_a·scale_b·(op_T(A) · B) + beta·D + bias (nullptr: none):
// matmul.cuh's plan for these types, whose scale pointers every call sets (a bf16 product's plan
// has other types, so never carries them).
template <typename TA, typename TB>
void matmul_fp8_cublaslt(bf16* d, const TA* a, const float* scale_a, const TB* b, const float* scale_b,
                         const bf16* bias, int m, int n, int k, float beta, const char* what, cudaStream_t stream) {
  const MatmulTypes types{fp8_data_type<TA>(), fp8_data_type<TB>(), CUDA_R_16BF};
  const MatmulPlan& plan = matmul_plan(types, true, false, bias, matmul_pointer_alignment(a),
                                       matmul_pointer_alignment(b), matmul_pointer_alignment(d), m, n, k);
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &scale_a, sizeof(scale_a)));
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &scale_b, sizeof(scale_b)));
  const double M = m, N = n, K = k;
  matmul_run(plan, d, a, b, bias, beta, stream,
             M * K + K * N + sizeof(bf16) * M * N * (beta != 0.0f ? 2 : 1) + (bias != nullptr ? 2 * M : 0),
             2 * M * N * K, [&] {  // --profile's site: "cublasLt fp8 <what>" and the shape
               return std::string("cublasLt fp8 ") + what + " m=" + std::to_string(m) + " n=" + std::to_string(n) +
                      " k=" + std::to_string(k) + (bias != nullptr ? " +bias" : "") + (beta != 0.0f ? " +=" : "");
             });
}

// out (rows × OC) = inp8 (rows × C) @ weight8 (OC × C)^T (decoded: × their scale_invs) + bias.
inline void matmul_fp8_forward(bf16* out, const fp8e4m3* inp8, const float* inp_scale_inv, const fp8e4m3* weight8,
                               const float* weight_scale_inv, const bf16* bias, int rows, int in_features,
                               int out_features, cudaStream_t stream) {
  matmul_fp8_check_shape("matmul_fp8_forward", rows, in_features, out_features);
  matmul_fp8_cublaslt(out, weight8, weight_scale_inv, inp8, inp_scale_inv, bias, out_features, rows, in_features, 0.0f,
                      "forward", stream);
}

// dinp (rows × C) = g8 (rows × OC) @ weight, from the weight's transposed copy weight8T (C × OC);
// written, or added to (accumulate: the second of two products of one input, as matmul_backward's).
inline void matmul_fp8_input_gradient(bf16* dinp, const fp8e5m2* g8, const float* g_scale_inv, const fp8e4m3* weight8T,
                                      const float* weight_scale_inv, int rows, int in_features, int out_features,
                                      bool accumulate, cudaStream_t stream) {
  matmul_fp8_check_shape("matmul_fp8_input_gradient", rows, in_features, out_features);
  matmul_fp8_cublaslt(dinp, weight8T, weight_scale_inv, g8, g_scale_inv, nullptr, in_features, rows, out_features,
                      accumulate ? 1.0f : 0.0f, "input gradient", stream);
}

// dweight (OC × C) += g^T @ inp, from the transposed copies g8T (OC × rows) and inp8T (C × rows).
inline void matmul_fp8_weight_gradient(bf16* dweight, const fp8e5m2* g8T, const float* g_scale_inv,
                                       const fp8e4m3* inp8T, const float* inp_scale_inv, int rows, int in_features,
                                       int out_features, cudaStream_t stream) {
  matmul_fp8_check_shape("matmul_fp8_weight_gradient", rows, in_features, out_features);
  matmul_fp8_cublaslt(dweight, inp8T, inp_scale_inv, g8T, g_scale_inv, nullptr, in_features, out_features, rows, 1.0f,
                      "weight gradient", stream);
}

// matmul_backward_bias's work for an FP8 product, with the output gradient's casts on the way: g =
// dout, or bf16(dout · gelu'(pre_gelu)) as matmul_backward_bias rounds it, is not written in bf16
// but cast to E5M2 at *scale as stored (g8: rows × OC) and transposed (g8t: OC × rows), with its
// amax folded into *amax (nullptr: not recorded), fp8_cast_wide_kernel's tiling; and with a bias,
// the stage-1 partial sums of dbias in matmul_backward_bias's own order (a 64-row tile is one of
// its chunks, matmul_fp8_gradient_fits: column sums over rows y, y + 8, ... of the chunk for each
// y < kBiasBlockY, then over y), so dbias gets its bits. partials nullptr: no bias.
template <bool kGelu>
__global__ void __launch_bounds__(kFp8WideThreads)
    matmul_fp8_gradient_kernel(fp8e5m2* g8, fp8e5m2* g8t, float* amax, const float* scale, float* partials,
                               const bf16* dout, const bf16* pre_gelu, int rows, int OC) {
  LAUNCH_BOUNDS_GUARD(kFp8WideThreads);
  static_assert(Vec128<bf16>::size == kFp8WideChunk, "one 16-byte load per operand and chunk");
  static_assert(kFp8WideTile % kBiasBlockY == 0 && kFp8WideThreads % kFp8WideTile == 0, "whole column sums");
  __shared__ Fp8WideTile tile;
  __shared__ bf16 g_tile[kFp8WideTile][kFp8WideTile];  // g, [row][column], for the bias sums
  __shared__ float y_sums[kBiasBlockY][kFp8WideTile];
  const float s = *scale;
  const int row0 = blockIdx.x * kFp8WideTile, col0 = blockIdx.y * kFp8WideTile;
  const int c = kFp8WideChunk * threadIdx.x;
  int key = 0;
  UNROLL
  for (int pass = 0; pass < kFp8WideTile / kFp8WideRowsPerPass; ++pass) {
    const int r = threadIdx.y + pass * kFp8WideRowsPerPass;
    if (row0 + r >= rows || col0 + c >= OC) continue;
    const size_t i = static_cast<size_t>(row0 + r) * OC + col0 + c;
    Vec128<bf16> g = load128(dout + i);
    if constexpr (kGelu) {
      const Vec128<bf16> x = load128(pre_gelu + i);
      UNROLL
      for (int k = 0; k < kFp8WideChunk; ++k) g[k] = from_float<bf16>(to_float(g[k]) * gelu_grad(to_float(x[k])));
    }
    float x[kFp8WideChunk];
    UNROLL
    for (int k = 0; k < kFp8WideChunk; ++k) {
      x[k] = to_float(g[k]);
      g_tile[r][c + k] = g[k];
    }
    uint32_t words[2];
    key = fp8_wide_cast_chunk<fp8e5m2>(x, s, key, words, &tile, r, c);
    *reinterpret_cast<uint2*>(reinterpret_cast<uint8_t*>(g8) + i) = uint2{words[0], words[1]};
  }
  __syncthreads();
  fp8_wide_store_transposed(g8t, tile, row0, col0, rows, OC);
  if (partials != nullptr) {  // the same for every thread of the block
    // Thread t sums column t % 64 for y = t / 64 and y + 4: rows y, y + 8, ... of the tile.
    const int t = threadIdx.y * kFp8WideChunksPerRow + threadIdx.x, col = t % kFp8WideTile;
    for (int y = t / kFp8WideTile; y < kBiasBlockY; y += kFp8WideThreads / kFp8WideTile) {
      float sum = 0.0f;
      for (int rr = y; rr < kFp8WideTile && row0 + rr < rows; rr += kBiasBlockY) sum += to_float(g_tile[rr][col]);
      y_sums[y][col] = sum;
    }
    __syncthreads();
    if (t < kFp8WideTile && col0 + t < OC) {
      float total = 0.0f;
      for (int y = 0; y < kBiasBlockY; ++y) total += y_sums[y][t];
      partials[static_cast<size_t>(blockIdx.x) * OC + col0 + t] = total;
    }
  }
  if (amax != nullptr) fp8_record_amax<kFp8WideThreads>(amax, key);
}

// Whether matmul_fp8_gradient takes (rows, OC): whole chunks of 8 and, with a bias, 64-row chunks
// in matmul_backward_bias (or one chunk of at most 64 rows), so that its tiles sum as those do.
inline bool matmul_fp8_gradient_fits(int rows, int OC, bool bias) {
  if (rows < 1 || OC < 1 || rows % kFp8WideChunk != 0 || OC % kFp8WideChunk != 0) return false;
  return !bias || rows <= kFp8WideTile || matmul_bias_rows_per_chunk(rows, OC) == kFp8WideTile;
}

// The output gradient of an FP8 product (matmul_fp8_gradient_kernel): g from dout (and pre_gelu:
// nullptr without GELU) cast into g8 and g8t, its amax into *amax (nullptr: none), dbias (nullptr:
// no bias) += Σ_rows g with matmul_backward_bias's bits. The shape must fit
// (matmul_fp8_gradient_fits); dout and pre_gelu 16-byte aligned, the codes 8-byte aligned.
inline void matmul_fp8_gradient(fp8e5m2* g8, fp8e5m2* g8t, float* amax, const float* scale, bf16* dbias,
                                const bf16* dout, const bf16* pre_gelu, int rows, int OC, cudaStream_t stream) {
  if (!matmul_fp8_gradient_fits(rows, OC, dbias != nullptr))
    throw_errorf("matmul_fp8_gradient: rows=%d out_features=%d: need multiples of 8%s", rows, OC,
                 dbias != nullptr ? " and matmul_backward_bias's 64-row chunks" : "");
  if (scale == nullptr) throw_error("matmul_fp8_gradient: the scale is null");
  if (!fp8_aligned(dout, 16) || !fp8_aligned(pre_gelu, 16)) throw_error("matmul_fp8_gradient: the inputs must be 16-byte aligned");
  if (g8 == nullptr || g8t == nullptr || !fp8_aligned(g8, 8) || !fp8_aligned(g8t, 8))
    throw_error("matmul_fp8_gradient: the codes must be given and 8-byte aligned");
  const dim3 grid(static_cast<unsigned>(ceil_div(rows, kFp8WideTile)), static_cast<unsigned>(ceil_div(OC, kFp8WideTile)));
  float* partials = dbias != nullptr ? matmul_context.bias_partials : nullptr;
  auto* kernel = pre_gelu != nullptr ? matmul_fp8_gradient_kernel<true> : matmul_fp8_gradient_kernel<false>;
  launch(kernel, grid, dim3(kFp8WideChunksPerRow, kFp8WideRowsPerPass), 0, stream, g8, g8t, amax, scale, partials, dout,
         pre_gelu, rows, OC);
  CUDA_CHECK(cudaGetLastError());
  if (dbias != nullptr) matmul_bias_reduce(dbias, static_cast<int>(grid.x), OC, stream);
}

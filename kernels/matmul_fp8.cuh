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
// The bias (bf16) is cuBLASLt's BIAS epilogue, as in matmul.cuh; its gradient and a GELU's stay
// matmul.cuh's matmul_backward_bias (bf16 sums of the bf16 output gradient).
#pragma once
#include "common.cuh"
#include "fp8.cuh"
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

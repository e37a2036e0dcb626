// matmul.cuh — the Linear layer (PyTorch nn.Linear, row-major): out = inp @ weight^T + bias, and
// its backward, optionally through the gradient of a tanh-GELU that followed it. Products run on
// cuBLASLt (the CPU build answers the same cublasLt* calls in simt/cublaslt.cpp); the bias
// gradient and the GELU gradient are kernels here.
//
// Shapes: inp (rows, C), weight (OC, C), bias (OC), out/pre_gelu (rows, OC), C = in_features,
// OC = out_features. Both must be multiples of 8: cuBLASLt wants 16-byte aligned rows, and the
// bias-gradient kernel reads whole 128-bit vectors of a row. The launchers refuse any other shape (throw_error).
//
// Row-major ↔ cuBLASLt (column-major): a row-major (r × c) matrix is the column-major (c × r)
// matrix with ld = c, i.e. its transpose. So, with every buffer viewed column-major:
//   forward   out^T (OC × rows)  = op_T(weight^T (C × OC)) · inp^T (C × rows)        m=OC, n=rows, k=C
//   dinp      dinp^T (C × rows)  = weight^T (C × OC) · dout^T (OC × rows)             m=C,  n=rows, k=OC
//   dweight   dweight^T (C × OC) += inp^T (C × rows) · op_T(dout^T (OC × rows))       m=C,  n=OC,   k=rows
// The bias of the epilogue has length m = OC and is broadcast along n = rows, as nn.Linear's.
//
// Numerics: fp32 accumulation always (CUBLAS_COMPUTE_32F; no TF32 for float, for parity with
// PyTorch), scale type fp32, epilogue in fp32, one rounding to T at the end. A weight gradient
// summed over several calls (row blocks) may be kept in fp32 instead (a float dweight) and
// rounded once by matmul_add_weight_gradient.
// Every call shares one workspace (cuBLASLt's and the bias-gradient partial sums): issue all
// matmul calls on one stream.
#pragma once
#include "common.cuh"
#include "gelu.cuh"

#include <algorithm>
#include <functional>
#include <map>
#include <tuple>
#include <type_traits>

#include <cublasLt.h>

// Host-side check for cuBLASLt calls, through common.cuh's throw_error: file, line, the call and
// the library's message.
inline void cublas_check(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS) throw_error(std::string(what) + ": " + cublasLtGetStatusString(status));
}
#define CUBLAS_CHECK(call) cublas_check((call), __FILE__ ":" CUDA_CHECK_LINE_(__LINE__) ": " #call)

// ---------------------------------------------------------------------------------------
// The cuBLASLt context: one handle and one workspace per process.

constexpr size_t kMatmulWorkspaceBytes = 32u << 20;    // cuBLASLt's recommendation for Hopper
constexpr size_t kBiasPartialFloats = 4u << 20;        // 16 MiB of fp32 per-chunk column sums

// One cuBLASLt plan: the matmul descriptor, the matrix layouts and the heuristic's algorithm for
// one (m, n, k, transposes, bias or not, A, B and D data types, operand alignments). Made on first
// use and kept, so a training step makes no descriptor and queries no heuristic after its first.
struct MatmulPlan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t layout_a = nullptr, layout_b = nullptr, layout_d = nullptr;
  cublasLtMatmulAlgo_t algo{};
  size_t workspace_bytes = 0;  // what the algorithm asked for
};
using MatmulPlanKey = std::tuple<int, int, int, bool, bool, bool, cudaDataType_t, cudaDataType_t, cudaDataType_t,
                                 uint32_t, uint32_t, uint32_t>;

// The data types of a product's A, B and D (C is D).
struct MatmulTypes {
  cudaDataType_t a, b, d;
};

struct MatmulContext {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  float* bias_partials = nullptr;  // (chunks × OC) column sums of the bias-gradient kernel
  std::map<MatmulPlanKey, MatmulPlan> plans;
};
MatmulContext matmul_context;

void matmul_init() {
  if (matmul_context.handle != nullptr) return;
  CUBLAS_CHECK(cublasLtCreate(&matmul_context.handle));
  CUDA_CHECK(cudaMalloc(&matmul_context.workspace, kMatmulWorkspaceBytes));
  CUDA_CHECK(cudaMalloc(&matmul_context.bias_partials, kBiasPartialFloats * sizeof(float)));
}

void matmul_destroy() {
  if (matmul_context.handle == nullptr) return;
  for (auto& [key, plan] : matmul_context.plans) {
    CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(plan.layout_d));
    CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(plan.layout_b));
    CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(plan.layout_a));
    CUBLAS_CHECK(cublasLtMatmulDescDestroy(plan.desc));
  }
  CUDA_CHECK(cudaFree(matmul_context.bias_partials));
  CUDA_CHECK(cudaFree(matmul_context.workspace));
  CUBLAS_CHECK(cublasLtDestroy(matmul_context.handle));
  matmul_context = MatmulContext{};
}

// ---------------------------------------------------------------------------------------
// Kernels.

// Bias-gradient block: x picks a 16-byte column group, y interleaves rows.
constexpr int kBiasBlockX = 32;
constexpr int kBiasBlockY = 8;
constexpr int kBiasMaxChunks = 256;  // row chunks of stage 1, each one row of partial sums

// Stage 1 of the bias gradient, fused with the GELU gradient. Block (bx, by) covers the
// column groups of bx and the rows [by·rows_per_chunk, (by+1)·rows_per_chunk):
//  - pre_gelu != nullptr: dpre = dout ⊙ gelu'(pre_gelu), rounded to T (dpre may alias dout:
//    each thread reads its 16 bytes before writing them). The column sums use the rounded
//    values, the ones the weight/input products see.
//  - partials != nullptr: partials[by·OC + c] = Σ over the chunk's rows of dout'(r, c), summed
//    in fp32 in a fixed order (per-thread row stride kBiasBlockY, then y = 0..7).
// Requires OC % Vec128<T>::size == 0.
template <typename T>
__global__ void matmul_backward_bias_partial_kernel(float* partials, T* dpre, const T* dout, const T* pre_gelu,
                                                    int rows, int OC, int rows_per_chunk) {
  constexpr int kVec = Vec128<T>::size;
  __shared__ float column_sums[kBiasBlockY][kBiasBlockX * kVec];
  const int col = (blockIdx.x * kBiasBlockX + threadIdx.x) * kVec;
  const int row_begin = blockIdx.y * rows_per_chunk;
  const int row_end = min(row_begin + rows_per_chunk, rows);
  float sum[kVec];
  for (int i = 0; i < kVec; ++i) sum[i] = 0.0f;
  if (col < OC) {
    for (int r = row_begin + threadIdx.y; r < row_end; r += kBiasBlockY) {
      const size_t offset = static_cast<size_t>(r) * OC + col;
      Vec128<T> g = load128(dout + offset);
      if (pre_gelu != nullptr) {
        const Vec128<T> x = load128(pre_gelu + offset);
        for (int i = 0; i < kVec; ++i) g[i] = from_float<T>(to_float(g[i]) * gelu_grad(to_float(x[i])));
        store128(dpre + offset, g);
      }
      for (int i = 0; i < kVec; ++i) sum[i] += to_float(g[i]);
    }
  }
  if (partials == nullptr) return;  // uniform across the block
  for (int i = 0; i < kVec; ++i) column_sums[threadIdx.y][threadIdx.x * kVec + i] = sum[i];
  __syncthreads();
  if (threadIdx.y == 0 && col < OC) {
    for (int i = 0; i < kVec; ++i) {
      float s = 0.0f;
      for (int y = 0; y < kBiasBlockY; ++y) s += column_sums[y][threadIdx.x * kVec + i];
      partials[static_cast<size_t>(blockIdx.y) * OC + col + i] = s;
    }
  }
}

// Stage 2: dbias[c] += Σ_chunk partials[chunk·OC + c] in block_column_sum's fixed order; blocks of
// (kColumnSumWidth, kColumnSumWarps) threads, one per kColumnSumWidth columns.
template <typename T>
__global__ void matmul_backward_bias_reduce_kernel(T* dbias, const float* partials, int chunks, int OC) {
  const int col = blockIdx.x * kColumnSumWidth + threadIdx.x;
  const float sum = block_column_sum(partials, chunks, OC);
  if (threadIdx.y == 0 && col < OC) dbias[col] = from_float<T>(to_float(dbias[col]) + sum);
}

// ---------------------------------------------------------------------------------------
// Host side.

// T in a parameter that must not take part in deducing T, so callers may pass a plain nullptr
// for an optional pointer.
template <typename T>
struct NonDeducedType {
  using type = T;
};
template <typename T>
using NonDeduced = typename NonDeducedType<T>::type;

template <typename T> constexpr cudaDataType_t matmul_data_type();
template <> constexpr cudaDataType_t matmul_data_type<float>() { return CUDA_R_32F; }
template <> constexpr cudaDataType_t matmul_data_type<bf16>() { return CUDA_R_16BF; }

void matmul_check_shape(const char* op, int rows, int C, int OC) {
  if (rows < 1 || C < 8 || OC < 8 || C % 8 != 0 || OC % 8 != 0) {
    throw_errorf("%s: rows=%d in_features=%d out_features=%d: need rows >= 1 and in/out features "
                 "positive multiples of 8", op, rows, C, OC);
  }
  if (matmul_context.handle == nullptr) {
    throw_errorf("%s: matmul_init() has not been called", op);
  }
}

// Largest power of two (≤ 256) dividing the address: tells the heuristic how aligned a matrix
// really is, so it never picks an algorithm that needs more (its default assumption is 256).
uint32_t matmul_pointer_alignment(const void* p) {
  const uintptr_t address = reinterpret_cast<uintptr_t>(p);
  uint32_t alignment = 256;
  while (alignment > 1 && address % alignment != 0) alignment /= 2;
  return alignment;
}

// The plan for one product (see MatmulPlan): found in matmul_context.plans, or made now. The bias
// (nullptr: none) is D's type (cuBLASLt's default); its pointer is set again by every call.
const MatmulPlan& matmul_plan(MatmulTypes types, bool transpose_a, bool transpose_b, const void* bias,
                              uint32_t align_a, uint32_t align_b, uint32_t align_d, int m, int n, int k) {
  const MatmulPlanKey key{m,       n,       k,       transpose_a, transpose_b, bias != nullptr,
                          types.a, types.b, types.d, align_a,     align_b,     align_d};
  const auto found = matmul_context.plans.find(key);
  if (found != matmul_context.plans.end()) return found->second;

  MatmulPlan plan;
  CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const int32_t op_a = transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const int32_t op_b = transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)));
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)));
  const uint32_t epilogue = bias != nullptr ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)));
  if (bias != nullptr)
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.layout_a, types.a, transpose_a ? k : m, transpose_a ? m : k,
                                          transpose_a ? k : m));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.layout_b, types.b, transpose_b ? n : k, transpose_b ? k : n,
                                          transpose_b ? n : k));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.layout_d, types.d, m, n, m));

  cublasLtMatmulPreference_t preference;
  CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&preference));
  const uint64_t workspace_bytes = kMatmulWorkspaceBytes;
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                    &workspace_bytes, sizeof(workspace_bytes)));
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a,
                                                    sizeof(align_a)));
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b,
                                                    sizeof(align_b)));
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_d,
                                                    sizeof(align_d)));
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_d,
                                                    sizeof(align_d)));
  // C is D (in place; only read when beta != 0). cuBLASLt answers CUBLAS_STATUS_NOT_SUPPORTED
  // when no algorithm fits (cublasLt.h); zero results are treated the same.
  cublasLtMatmulHeuristicResult_t heuristic;
  int found_count = 0;
  const cublasStatus_t searched =
      cublasLtMatmulAlgoGetHeuristic(matmul_context.handle, plan.desc, plan.layout_a, plan.layout_b, plan.layout_d,
                                     plan.layout_d, preference, 1, &heuristic, &found_count);
  CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(preference));
  if (searched == CUBLAS_STATUS_NOT_SUPPORTED || (searched == CUBLAS_STATUS_SUCCESS && found_count == 0)) {
    CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(plan.layout_d));
    CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(plan.layout_b));
    CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(plan.layout_a));
    CUBLAS_CHECK(cublasLtMatmulDescDestroy(plan.desc));
    throw_errorf("cuBLASLt has no algorithm for m=%d n=%d k=%d (transA=%d transB=%d, bias=%d, types %d x %d -> %d, "
                 "workspace %zu bytes)", m, n, k, transpose_a, transpose_b, bias != nullptr, static_cast<int>(types.a),
                 static_cast<int>(types.b), static_cast<int>(types.d), kMatmulWorkspaceBytes);
  }
  CUBLAS_CHECK(searched);
  plan.algo = heuristic.algo;
  plan.workspace_bytes = heuristic.workspaceSize;
  return matmul_context.plans.emplace(key, plan).first->second;
}

// Runs `plan` on (a, b) into d (C is d: beta != 0 adds to it), its bias pointer set (nullptr: none);
// under --profile as the site site_name() names, moving `bytes` and doing `flops`.
template <typename SiteName>
void matmul_run(const MatmulPlan& plan, void* d, const void* a, const void* b, const void* bias, float beta,
                cudaStream_t stream, double bytes, double flops, SiteName&& site_name) {
  if (bias != nullptr)
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
  const float alpha = 1.0f;
  auto product = [&] {
    CUBLAS_CHECK(cublasLtMatmul(matmul_context.handle, plan.desc, &alpha, a, plan.layout_a, b, plan.layout_b, &beta,
                                d, plan.layout_d, d, plan.layout_d, &plan.algo, matmul_context.workspace,
                                plan.workspace_bytes, stream));
  };
  if (!DeviceProfiler::get().on()) return product();
  profile_declare(bytes, flops);
  const std::string& label = DeviceProfiler::get().label();
  profiled(label.empty() ? site_name() : label, stream, product);
}

// One cuBLASLt product, column-major, every matrix packed (ld = its stored row count):
//   D (m × n) = op(A) · op(B) + beta·D,  op(A) (m × k), op(B) (k × n),
// then + bias (length m, cuBLASLt's BIAS epilogue) if bias != nullptr.
template <typename T, typename TD>
void matmul_cublaslt(TD* d, const T* a, bool transpose_a, const T* b, bool transpose_b, const TD* bias, int m, int n,
                     int k, float beta, cudaStream_t stream) {
  static_assert(std::is_same<TD, T>::value || std::is_same<TD, float>::value, "D is T or float");
  const MatmulTypes types{matmul_data_type<T>(), matmul_data_type<T>(), matmul_data_type<TD>()};
  const MatmulPlan& plan = matmul_plan(types, transpose_a, transpose_b, bias, matmul_pointer_alignment(a),
                                       matmul_pointer_alignment(b), matmul_pointer_alignment(d), m, n, k);
  const double M = m, N = n, K = k;
  matmul_run(plan, d, a, b, bias, beta, stream,
             sizeof(T) * (M * K + K * N) + sizeof(TD) * M * N * (beta != 0.0f ? 2 : 1) +
                 (bias != nullptr ? sizeof(TD) * M : 0),
             2 * M * N * K, [&] {  // --profile's site: the product's shape (each of the model's products has its own)
               return std::string("cublasLt ") + (transpose_a ? "T" : "N") + (transpose_b ? "T" : "N") + " m=" +
                      std::to_string(m) + " n=" + std::to_string(n) + " k=" + std::to_string(k) +
                      (bias != nullptr ? " +bias" : "") + (beta != 0.0f ? " +=" : "") +
                      (std::is_same<TD, float>::value && !std::is_same<T, float>::value ? " fp32-out" : "");
             });
}

// out (rows × OC) = inp (rows × C) @ weight (OC × C)^T + bias (OC; nullptr: none). Written, not
// accumulated. (GELU runs as its own kernel after it: see gelu.cuh.)
template <typename T>
void matmul_forward(T* out, const T* inp, const T* weight, const NonDeduced<T>* bias, int rows, int in_features,
                    int out_features, cudaStream_t stream) {
  matmul_check_shape("matmul_forward", rows, in_features, out_features);
  matmul_cublaslt(out, weight, true, inp, false, bias, out_features, rows, in_features, 0.0f, stream);
}

// The rows of each stage-1 chunk of matmul_backward_bias (its order of summation): chunks of >= 64
// rows, at most kBiasMaxChunks of them, within the partial-sum buffer. At d12's 65,536 rows, 256
// chunks of 256 rows, 768 (OC = 768) to 3,072 (OC = 3,072) stage-1 blocks, 5.8 to 23 per H100 SM,
// and stage 2 adds 16 partials per thread. The chunking depends only on the shape, so the
// summation order (and every bit) does too.
inline int matmul_bias_rows_per_chunk(int rows, int OC) {
  const int max_chunks = static_cast<int>(std::min<size_t>(kBiasMaxChunks, kBiasPartialFloats / OC));
  if (max_chunks < 1) {
    throw_errorf("matmul_backward: out_features=%d exceeds the bias-gradient buffer (%zu)", OC,
                 kBiasPartialFloats);
  }
  return ceil_div(rows, std::min(ceil_div(rows, 64), max_chunks));
}

// Stage 2: dbias (OC) += the column sums of matmul_context.bias_partials' `chunks` rows.
template <typename T>
void matmul_bias_reduce(T* dbias, int chunks, int OC, cudaStream_t stream) {
  launch(matmul_backward_bias_reduce_kernel<T>, dim3(ceil_div(OC, kColumnSumWidth)),
         dim3(kColumnSumWidth, kColumnSumWarps), 0, stream, dbias, static_cast<const float*>(matmul_context.bias_partials),
         chunks, OC);
  CUDA_CHECK(cudaGetLastError());
}

// matmul_backward's first part: g = dout, or dout ⊙ gelu'(pre_gelu) into dpre_gelu (may be dout:
// overwritten in place) when pre_gelu != nullptr; dbias (OC) += Σ_rows g when dbias != nullptr. The
// FP8 products (matmul_fp8.cuh) take g from here too.
template <typename T>
void matmul_backward_bias(T* dbias, T* dpre_gelu, const T* dout, const T* pre_gelu, int rows, int OC,
                          cudaStream_t stream) {
  if ((pre_gelu == nullptr) != (dpre_gelu == nullptr)) {
    throw_errorf("matmul_backward: pre_gelu and dpre_gelu must be given together");
  }
  if (pre_gelu == nullptr && dbias == nullptr) return;
  const int rows_per_chunk = matmul_bias_rows_per_chunk(rows, OC);
  const int chunks = ceil_div(rows, rows_per_chunk);
  const int column_groups = ceil_div(OC / Vec128<T>::size, kBiasBlockX);
  float* partials = dbias != nullptr ? matmul_context.bias_partials : nullptr;
  launch(matmul_backward_bias_partial_kernel<T>, dim3(column_groups, chunks), dim3(kBiasBlockX, kBiasBlockY), 0,
         stream, partials, dpre_gelu, dout, pre_gelu, rows, OC, rows_per_chunk);
  CUDA_CHECK(cudaGetLastError());
  if (dbias != nullptr) matmul_bias_reduce(dbias, chunks, OC, stream);
}

// Backward of matmul_forward. With g = dout (rows × OC), or g = dout ⊙ gelu'(pre_gelu) when the
// forward applied GELU (pre_gelu != nullptr):
//   dinp    (rows × C)  = g @ weight                 written, or with accumulate_input_gradient
//                                                    added (cuBLASLt beta = 1; one rounding of the
//                                                    sum: the second of two products of one input)
//   dweight (OC × C)   += g^T @ inp                  accumulated (cuBLASLt beta = 1); T, or float
//                                                    (matmul_backward<T, float>) to sum row
//                                                    blocks before one rounding; nullptr: left
//                                                    for later (matmul_weight_gradient with g:
//                                                    a zero-bubble pipeline's weight backward)
//   dbias   (OC)       += Σ_rows g                   accumulated; nullptr: no bias
//   dpre_gelu (rows × OC) = g                        only with pre_gelu (nullptr otherwise);
//                                                    may be dout itself (overwritten in place)
// g and the bias sums come from one kernel (GELU gradient in fp32, rounded to T; fixed-order
// fp32 column sums in chunks of rows), then a second sums the chunks' rows of partials in a fixed
// order (block_column_sum), so the result is deterministic. `after_input_gradient` (optional) is
// called once dinp's product is queued and before dweight's: work it queues elsewhere on dinp (a
// tensor-parallel reduction) runs while dweight's product does.
// dweight (OC × C) += g^T @ inp: matmul_backward's weight gradient alone, from its g (rows × OC).
template <typename T, typename TW = T>
void matmul_weight_gradient(NonDeduced<TW>* dweight, const T* inp, const T* g, int rows, int in_features,
                            int out_features, cudaStream_t stream) {
  matmul_check_shape("matmul_weight_gradient", rows, in_features, out_features);
  matmul_cublaslt<T, TW>(dweight, inp, false, g, true, nullptr, in_features, out_features, rows, 1.0f, stream);
}

template <typename T, typename TW = T>
void matmul_backward(T* dinp, NonDeduced<TW>* dweight, NonDeduced<T>* dbias, NonDeduced<T>* dpre_gelu, const T* dout, const T* inp,
                     const T* weight, const NonDeduced<T>* pre_gelu, int rows, int in_features, int out_features, cudaStream_t stream,
                     const std::function<void()>& after_input_gradient = nullptr,
                     bool accumulate_input_gradient = false) {
  const int C = in_features, OC = out_features;
  matmul_check_shape("matmul_backward", rows, C, OC);
  matmul_backward_bias(dbias, dpre_gelu, dout, pre_gelu, rows, OC, stream);
  const T* g = pre_gelu != nullptr ? dpre_gelu : dout;
  matmul_cublaslt<T, T>(dinp, weight, false, g, false, nullptr, C, rows, OC, accumulate_input_gradient ? 1.0f : 0.0f,
                        stream);
  if (after_input_gradient) after_input_gradient();
  if (dweight != nullptr) matmul_weight_gradient<T, TW>(dweight, inp, g, rows, C, OC, stream);
}

// dweight[i] += dweight_fp32[i], rounded once to T; Vec128<T>::size elements per thread.
template <typename T>
__global__ void matmul_add_weight_gradient_kernel(T* dweight, const float* dweight_fp32, size_t count) {
  constexpr int kVec = Vec128<T>::size, kFloatVec = Vec128<float>::size;
  const size_t i = (static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x) * kVec;
  if (i >= count) return;
  Vec128<T> w = load128(dweight + i);
  for (int j = 0; j < kVec; j += kFloatVec) {
    const Vec128<float> add = load128(dweight_fp32 + i + j);
    for (int e = 0; e < kFloatVec; ++e) w[j + e] = from_float<T>(to_float(w[j + e]) + add[e]);
  }
  store128(dweight + i, w);
}

// The end of a weight gradient summed in fp32 over row blocks (matmul_backward with a float
// dweight): dweight (count elements, a multiple of 8) += dweight_fp32, one rounding per element.
template <typename T>
void matmul_add_weight_gradient(T* dweight, const float* dweight_fp32, size_t count, cudaStream_t stream) {
  if (count % 8 != 0) {
    throw_errorf("matmul_add_weight_gradient: count=%zu is not a multiple of 8", count);
  }
  const size_t threads = count / Vec128<T>::size;
  launch(matmul_add_weight_gradient_kernel<T>, dim3(static_cast<unsigned>(ceil_div(threads, size_t{256}))), dim3(256),
         0, stream, dweight, dweight_fp32, count);
  CUDA_CHECK(cudaGetLastError());
}

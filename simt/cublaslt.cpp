// cublaslt.cpp — the cuBLASLt library on the CPU, at its API: the toolkit's own declarations
// (cublasLt.h), answered with OpenBLAS. Device pointers are host pointers (simt's cudaMalloc);
// streams are synchronous, so every call completes before it returns.
//
// Implemented, with the documented semantics:
//   D = epilogue(alpha·op(A)·op(B) + beta·C), column-major (CUBLASLT_ORDER_COL), any ld ≥ rows,
//   op ∈ {N, T}, C may be D (then with D's layout), C unread when beta == 0;
//   types: A = B = C = D ∈ {CUDA_R_32F, CUDA_R_16BF}, or A = B = CUDA_R_16BF with C = D = CUDA_R_32F
//   (epilogue DEFAULT only), compute CUBLAS_COMPUTE_32F, scale CUDA_R_32F,
//   alpha/beta in host memory; bf16 operands are widened to fp32, the product is OpenBLAS sgemm
//   (fp32 accumulation), the epilogue runs in fp32 and results are rounded once, to nearest even;
//   epilogues DEFAULT, BIAS, GELU, GELU_BIAS, GELU_AUX, GELU_AUX_BIAS: the bias (D's type, length
//   m = rows of D) is added after the beta term; GELU is the tanh approximation; the *_AUX
//   variants store the GELU input to the aux matrix (D's type, ld = EPILOGUE_AUX_LD, which must
//   be ≥ m and a multiple of 8, as the library requires).
//   The heuristic returns one algorithm that records the operand alignments the preference
//   allowed (default 256 bytes, as in the library); cublasLtMatmul refuses operands less aligned
//   than that, as a GPU algorithm chosen for them would.
// Rules of the real library the stand-in enforces (cublasLt.h's documentation of these calls):
//   - The algorithm splits k when k >= 2·max(m, n) and then asks for kSplitKWorkspace bytes of
//     workspace (deterministic, so the CPU build exercises a caller's workspace handling);
//     cublasLtMatmul with a smaller workspace is refused (INVALID_VALUE: "parameters ... in an
//     impossible configuration").
//   - cublasLtMatmulAlgoGetHeuristic returns CUBLAS_STATUS_NOT_SUPPORTED ("if no heuristic function
//     available for current configuration"), never success with zero results, when nothing fits:
//     the preference's maximum workspace is below what the algorithm needs, or the bias/aux pointer
//     set on the descriptor (whose value the heuristic reads for its alignment) is not 16-byte
//     aligned. cublasLtMatmul refuses a bias or aux pointer that is not 16-byte aligned.
//   - D may not overlap A or B, nor C unless D == C with the same layout (in place).
// FP8 products (docs/SIMT.md, "The FP8 oracle"): A and B of CUDA_R_8F_E4M3 / CUDA_R_8F_E5M2 as the
//   cuBLAS documentation's cublasLtMatmul() section allows them on Hopper, computed exactly: each
//   element decoded (cuda_fp8.h), each D element one fp32 sum over k in increasing order (the products
//   of two FP8 values are exact in fp32, so only the sum rounds), then
//     t = (alpha·scale_A·scale_B)·sum + (beta·scale_C)·C + bias,  amax_D = max |t|,
//     D = t·scale_D when D is FP8 (round to nearest even, saturating to ±max finite), else t rounded
//   to D's type. The scales are fp32 in device memory (CUBLASLT_MATMUL_DESC_{A,B,C,D}_SCALE_POINTER,
//   1 when unset), AMAX_D_POINTER receives amax_D. What the documentation requires of FP8 and this
//   file refuses otherwise (see fp8_rules below): the "TN" form, compute and scale type 32F, the type
//   combinations of its table that this subset implements, the Tensor Core alignments.
// Everything else — other attributes, values, types, epilogues, orders, batching — returns
// CUBLAS_STATUS_NOT_SUPPORTED (or INVALID_VALUE for malformed input); nothing is ignored.
#include <cublasLt.h>

#include "counters.h"
#include "streams.h"
#include <cblas.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <new>
#include <vector>

struct cublasLtContext {
  uint64_t magic;
};

namespace {

constexpr uint64_t kHandleMagic = 0x63756c7448616e64ull;      // "cultHand"
constexpr uint64_t kDescMagic = 0x63756c7444657363ull;        // "cultDesc"
constexpr uint64_t kLayoutMagic = 0x63756c744c61796full;      // "cultLayo"
constexpr uint64_t kPreferenceMagic = 0x63756c7450726566ull;  // "cultPref"
constexpr uint64_t kAlgoMagic = 0x63756c74416c676full;        // "cultAlgo"
constexpr int32_t kTypeUnset = -1;                            // "same as D" for bias/aux types
constexpr uint32_t kDefaultAlignment = 256;                   // the preference's documented default
constexpr uint64_t kSplitKWorkspace = 1u << 20;               // what the split-k algorithm asks for
constexpr uintptr_t kEpilogueAlignment = 16;                  // bias and aux vectors

enum ScaleOperand { kScaleA, kScaleB, kScaleC, kScaleD };

struct MatmulDesc {
  uint64_t magic = kDescMagic;
  int32_t trans_a = CUBLAS_OP_N, trans_b = CUBLAS_OP_N;
  uint32_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  const void* bias = nullptr;
  int32_t bias_type = kTypeUnset;
  void* aux = nullptr;
  int64_t aux_ld = 0;
  int32_t aux_type = kTypeUnset;
  const void* scale[4] = {nullptr, nullptr, nullptr, nullptr};  // fp32 device scalars of A, B, C, D
  void* amax_d = nullptr;                                       // fp32 device scalar
};

struct Layout {
  uint64_t magic = kLayoutMagic;
  cudaDataType type;
  int64_t rows, cols, ld;
};

struct Preference {
  uint64_t magic = kPreferenceMagic;
  uint64_t max_workspace = 0;
  uint32_t alignment[4] = {kDefaultAlignment, kDefaultAlignment, kDefaultAlignment, kDefaultAlignment};  // A B C D
};

MatmulDesc* desc_of(cublasLtMatmulDesc_t d) {
  MatmulDesc* p = reinterpret_cast<MatmulDesc*>(d);
  return p != nullptr && p->magic == kDescMagic ? p : nullptr;
}
const Layout* layout_of(cublasLtMatrixLayout_t l) {
  const Layout* p = reinterpret_cast<const Layout*>(l);
  return p != nullptr && p->magic == kLayoutMagic ? p : nullptr;
}
Preference* preference_of(cublasLtMatmulPreference_t p) {
  Preference* q = reinterpret_cast<Preference*>(p);
  return q != nullptr && q->magic == kPreferenceMagic ? q : nullptr;
}
bool valid_handle(cublasLtHandle_t h) { return h != nullptr && h->magic == kHandleMagic; }

bool supported_type(int32_t t) { return t == CUDA_R_32F || t == CUDA_R_16BF; }
bool is_fp8(int32_t t) { return t == CUDA_R_8F_E4M3 || t == CUDA_R_8F_E5M2; }
size_t element_bytes(cudaDataType t) { return t == CUDA_R_32F ? 4 : t == CUDA_R_16BF ? 2 : 1; }

bool has_bias(uint32_t e) { return (e & CUBLASLT_EPILOGUE_BIAS) != 0; }
bool has_gelu(uint32_t e) { return (e & CUBLASLT_EPILOGUE_GELU) != 0; }
bool has_aux(uint32_t e) { return e == CUBLASLT_EPILOGUE_GELU_AUX || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS; }

// Copies an attribute value of exactly the attribute's size.
template <typename V>
cublasStatus_t read_value(V* dst, const void* buf, size_t size) {
  if (buf == nullptr || size != sizeof(V)) return CUBLAS_STATUS_INVALID_VALUE;
  std::memcpy(dst, buf, sizeof(V));
  return CUBLAS_STATUS_SUCCESS;
}

// The shape of a validated product.
struct Problem {
  int64_t m, n, k;
  bool fp8;                  // A and B are FP8: the FP8 rules and arithmetic apply
  cudaDataType bias_type;    // the bias vector's elements, when the epilogue has one
  const Layout *a, *b, *c, *d;
};

bool sets_fp8_scaling(const MatmulDesc& desc) {
  return desc.scale[kScaleA] != nullptr || desc.scale[kScaleB] != nullptr || desc.scale[kScaleC] != nullptr ||
         desc.scale[kScaleD] != nullptr || desc.amax_d != nullptr;
}

// What cuBLASLt requires of an FP8 product, from the cuBLAS documentation's cublasLtMatmul() section
// (docs.nvidia.com/cuda/cublas, "cublasLtMatmul()"): "To use FP8 kernels, the following set of
// requirements must be satisfied: all matrix dimensions must meet the optimal requirements listed in
// Tensor Core Usage; A must be transposed and B non-transposed (the "TN" format) [on Ada and Hopper];
// the compute type must be CUBLAS_COMPUTE_32F; the scale type must be CUDA_R_32F" (the last two are
// all cublasLtMatmulDescCreate accepts here), and its table of FP8 types. NOT_SUPPORTED otherwise, as
// the library answers a product it has no kernel for.
cublasStatus_t fp8_rules(const MatmulDesc& desc, const Layout* a, const Layout* b, const Layout* c, const Layout* d,
                         int64_t m, int64_t k) {
  if (!is_fp8(a->type) || !is_fp8(b->type)) return CUBLAS_STATUS_NOT_SUPPORTED;  // FP8 times a wider type
  // The table pairs E4M3×E4M3, E4M3×E5M2 and E5M2×E4M3; E5M2×E5M2 has no kernel.
  if (a->type == CUDA_R_8F_E5M2 && b->type == CUDA_R_8F_E5M2) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (desc.trans_a != CUBLAS_OP_T || desc.trans_b != CUBLAS_OP_N) return CUBLAS_STATUS_NOT_SUPPORTED;
  // (C, D) of the table implemented here: bf16 → bf16, fp32 → fp32, bf16 → E4M3, and bf16 → E5M2 when an
  // operand is E5M2 (the table lists no E5M2 output of E4M3×E4M3). fp16 C/D are in the table, not here.
  const bool e5m2_operand = a->type == CUDA_R_8F_E5M2 || b->type == CUDA_R_8F_E5M2;
  const bool types = (c->type == CUDA_R_16BF && d->type == CUDA_R_16BF) ||
                     (c->type == CUDA_R_32F && d->type == CUDA_R_32F) ||
                     (c->type == CUDA_R_16BF && d->type == CUDA_R_8F_E4M3) ||
                     (c->type == CUDA_R_16BF && d->type == CUDA_R_8F_E5M2 && e5m2_operand);
  if (!types) return CUBLAS_STATUS_NOT_SUPPORTED;
  // Epilogues implemented for FP8: none and BIAS. The bias is bf16 for every (C, D) above
  // (cublasLt.h, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE: "fp8 kernels with an output type of CUDA_R_32F,
  // CUDA_R_8F_E4M3 or CUDA_R_8F_E5M2" are the exceptions to "same type as D"; the table gives them bf16).
  if (desc.epilogue != CUBLASLT_EPILOGUE_DEFAULT && desc.epilogue != CUBLASLT_EPILOGUE_BIAS)
    return CUBLAS_STATUS_NOT_SUPPORTED;
  if (desc.bias_type != kTypeUnset && desc.bias_type != CUDA_R_16BF) return CUBLAS_STATUS_NOT_SUPPORTED;
  // Tensor Core Usage: ((op_A == N ? m : k)·sizeof(A)) % 16 and ((op_B == N ? k : n)·sizeof(B)) % 16 — k in
  // the TN form —, (m·sizeof(C)) % 16, (lda·sizeof(A)) % 16, (ldb·sizeof(B)) % 16, (ldc·sizeof(C)) % 16; the
  // pointers' 16-byte alignment is checked by cublasLtMatmul.
  const int64_t c_bytes = static_cast<int64_t>(element_bytes(c->type));
  if (k % 16 != 0 || a->ld % 16 != 0 || b->ld % 16 != 0 || (m * c_bytes) % 16 != 0 || (c->ld * c_bytes) % 16 != 0)
    return CUBLAS_STATUS_NOT_SUPPORTED;
  // D's scale converts into D's FP8 range; for a wider D it is "set for an unsupported matrix data ...
  // combination" (cublasLt.h, CUBLASLT_MATMUL_DESC_D_SCALE_POINTER): INVALID_VALUE.
  if (desc.scale[kScaleD] != nullptr && !is_fp8(d->type)) return CUBLAS_STATUS_INVALID_VALUE;
  return CUBLAS_STATUS_SUCCESS;
}

// Checks everything the heuristic and the product have in common (not the A/B/C/D pointers).
cublasStatus_t validate(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc_handle, cublasLtMatrixLayout_t a_handle,
                        cublasLtMatrixLayout_t b_handle, cublasLtMatrixLayout_t c_handle,
                        cublasLtMatrixLayout_t d_handle, Problem* problem) {
  if (!valid_handle(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
  const MatmulDesc* desc = desc_of(desc_handle);
  const Layout *a = layout_of(a_handle), *b = layout_of(b_handle), *c = layout_of(c_handle), *d = layout_of(d_handle);
  if (desc == nullptr || a == nullptr || b == nullptr || c == nullptr || d == nullptr)
    return CUBLAS_STATUS_INVALID_VALUE;
  const bool fp8 = is_fp8(a->type) || is_fp8(b->type);
  if (!fp8) {
    if (a->type != b->type || c->type != d->type) return CUBLAS_STATUS_NOT_SUPPORTED;
    const bool bf16_into_fp32 = a->type == CUDA_R_16BF && d->type == CUDA_R_32F;
    if (a->type != d->type && !(bf16_into_fp32 && desc->epilogue == CUBLASLT_EPILOGUE_DEFAULT))
      return CUBLAS_STATUS_NOT_SUPPORTED;
    // The scale and amax pointers belong to narrow-precision products (cublasLt.h: "If set for an
    // unsupported matrix data, scale, and compute type combination, calling cublasLtMatmul() will
    // return CUBLAS_INVALID_VALUE").
    if (sets_fp8_scaling(*desc)) return CUBLAS_STATUS_INVALID_VALUE;
  }
  const bool ta = desc->trans_a == CUBLAS_OP_T, tb = desc->trans_b == CUBLAS_OP_T;
  const int64_t m = d->rows, n = d->cols;
  const int64_t k = ta ? a->rows : a->cols;
  if ((ta ? a->cols : a->rows) != m) return CUBLAS_STATUS_INVALID_VALUE;
  if ((tb ? b->cols : b->rows) != k || (tb ? b->rows : b->cols) != n) return CUBLAS_STATUS_INVALID_VALUE;
  if (c->rows != m || c->cols != n) return CUBLAS_STATUS_INVALID_VALUE;
  for (const Layout* l : {a, b, c, d})
    if (l->ld < (l->rows > 1 ? l->rows : 1)) return CUBLAS_STATUS_INVALID_VALUE;
  if (fp8) {
    const cublasStatus_t status = fp8_rules(*desc, a, b, c, d, m, k);
    if (status != CUBLAS_STATUS_SUCCESS) return status;
  }
  if (has_bias(desc->epilogue)) {
    if (desc->bias == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
    if (!fp8 && desc->bias_type != kTypeUnset && desc->bias_type != d->type) return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  if (has_aux(desc->epilogue)) {
    if (desc->aux == nullptr || desc->aux_ld < m || desc->aux_ld % 8 != 0) return CUBLAS_STATUS_INVALID_VALUE;
    if (desc->aux_type != kTypeUnset && desc->aux_type != d->type) return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  *problem = Problem{m, n, k, fp8, fp8 ? CUDA_R_16BF : d->type, a, b, c, d};
  return CUBLAS_STATUS_SUCCESS;
}

float bf16_to_float(uint16_t bits) {
  const uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

uint16_t float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even (overflow rounds to inf)
  return static_cast<uint16_t>(u >> 16);
}

__nv_fp8_interpretation_t fp8_kind(cudaDataType type) { return type == CUDA_R_8F_E4M3 ? __NV_E4M3 : __NV_E5M2; }

// FP8 elements through cuda_fp8.h's host implementation (test/kernels/test_fp8.cu checks it against
// every code): decoded exactly; encoded with round to nearest even, saturating to ±max finite.
float load(const void* base, cudaDataType type, size_t index) {
  if (type == CUDA_R_32F) return static_cast<const float*>(base)[index];
  if (type == CUDA_R_16BF) return bf16_to_float(static_cast<const uint16_t*>(base)[index]);
  const __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<const __nv_fp8_storage_t*>(base)[index], fp8_kind(type));
  return __half2float(__half(h));
}

void store(void* base, cudaDataType type, size_t index, float v) {
  if (type == CUDA_R_32F)
    static_cast<float*>(base)[index] = v;
  else if (type == CUDA_R_16BF)
    static_cast<uint16_t*>(base)[index] = float_to_bf16(v);
  else
    static_cast<__nv_fp8_storage_t*>(base)[index] = __nv_cvt_float_to_fp8(v, __NV_SATFINITE, fp8_kind(type));
}

// An operand as fp32 for sgemm: float data in place, bf16 widened into `storage` (packed).
const float* as_float(const void* data, const Layout* l, std::vector<float>& storage, int64_t* ld) {
  if (l->type == CUDA_R_32F) {
    *ld = l->ld;
    return static_cast<const float*>(data);
  }
  const int64_t packed_ld = l->rows > 1 ? l->rows : 1;
  storage.resize(static_cast<size_t>(packed_ld) * static_cast<size_t>(l->cols));
  for (int64_t j = 0; j < l->cols; ++j)
    for (int64_t i = 0; i < l->rows; ++i)
      storage[static_cast<size_t>(i + j * packed_ld)] = load(data, l->type, static_cast<size_t>(i + j * l->ld));
  *ld = packed_ld;
  return storage.data();
}

float gelu_tanh(float x) {
  const float u = 0.7978845608028654f * (x + 0.044715f * x * x * x);  // sqrt(2/π)·(x + 0.044715·x³)
  return 0.5f * x * (1.0f + std::tanh(u));
}

uint32_t alignment_of(const void* p) {
  const uintptr_t address = reinterpret_cast<uintptr_t>(p);
  uint32_t alignment = kDefaultAlignment;
  while (alignment > 1 && address % alignment != 0) alignment /= 2;
  return alignment;
}

// The workspace the stand-in's algorithm needs for a product (see the file comment).
uint64_t workspace_needed(const Problem& p) {
  return p.k >= 2 * std::max(p.m, p.n) ? kSplitKWorkspace : 0;
}

bool epilogue_vectors_aligned(const MatmulDesc& desc) {
  if (has_bias(desc.epilogue) && reinterpret_cast<uintptr_t>(desc.bias) % kEpilogueAlignment != 0) return false;
  return !has_aux(desc.epilogue) || reinterpret_cast<uintptr_t>(desc.aux) % kEpilogueAlignment == 0;
}

// The bytes a matrix of layout l at p spans: [p, p + ((cols - 1)·ld + rows) elements).
bool overlap(const void* x, const Layout* lx, const void* y, const Layout* ly) {
  auto end = [](const void* p, const Layout* l) {
    const size_t bytes = element_bytes(l->type);
    const size_t elements = l->cols > 0 && l->rows > 0 ? static_cast<size_t>((l->cols - 1) * l->ld + l->rows) : 0;
    return reinterpret_cast<uintptr_t>(p) + elements * bytes;
  };
  const uintptr_t a = reinterpret_cast<uintptr_t>(x), b = reinterpret_cast<uintptr_t>(y);
  return x != nullptr && y != nullptr && a < end(y, ly) && b < end(x, lx);
}

const char* status_name(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
  }
  return "CUBLAS_STATUS_UNKNOWN";
}

// D = epilogue(alpha·op(A)·op(B) + beta·C) of fp32 or bf16 operands: the product by OpenBLAS sgemm.
void wide_product(const Problem& pr, const MatmulDesc& desc, float alpha, float beta, const void* A, const void* B,
                  const void* C, void* D) {
  const int m = static_cast<int>(pr.m), n = static_cast<int>(pr.n), k = static_cast<int>(pr.k);
  std::vector<float> product(static_cast<size_t>(m) * n, 0.0f);
  if (k > 0) {
    std::vector<float> a_storage, b_storage;
    int64_t lda, ldb;
    const float* a = as_float(A, pr.a, a_storage, &lda);
    const float* b = as_float(B, pr.b, b_storage, &ldb);
    cblas_sgemm(CblasColMajor, desc.trans_a == CUBLAS_OP_T ? CblasTrans : CblasNoTrans,
                desc.trans_b == CUBLAS_OP_T ? CblasTrans : CblasNoTrans, m, n, k, 1.0f, a, static_cast<int>(lda), b,
                static_cast<int>(ldb), 0.0f, product.data(), m);
  }
  const bool bias = has_bias(desc.epilogue), gelu = has_gelu(desc.epilogue), aux = has_aux(desc.epilogue);
  for (int64_t j = 0; j < pr.n; ++j) {
    for (int64_t i = 0; i < pr.m; ++i) {
      float v = alpha * product[static_cast<size_t>(i + j * pr.m)];
      if (beta != 0.0f) v += beta * load(C, pr.c->type, static_cast<size_t>(i + j * pr.c->ld));
      if (bias) v += load(desc.bias, pr.bias_type, static_cast<size_t>(i));
      if (aux) store(desc.aux, pr.d->type, static_cast<size_t>(i + j * desc.aux_ld), v);
      if (gelu) v = gelu_tanh(v);
      store(D, pr.d->type, static_cast<size_t>(i + j * pr.d->ld), v);
    }
  }
}

// The FP8 product (the file comment's formula). In the TN form op(A)'s row i is A's column i and
// op(B)'s column j is B's column j, so both are decoded into packed k-vectors and each D element is one
// fp32 sum of their products in increasing k. The scalars combine as (alpha·scale_A)·scale_B and
// beta·scale_C, in fp32; amax_D takes the largest |t| (std::fmax: a NaN element does not count).
void fp8_product(const Problem& pr, const MatmulDesc& desc, float alpha, float beta, const void* A, const void* B,
                 const void* C, void* D) {
  const size_t m = static_cast<size_t>(pr.m), n = static_cast<size_t>(pr.n), k = static_cast<size_t>(pr.k);
  std::vector<float> a(m * k), b(n * k);
  for (size_t i = 0; i < m; ++i)
    for (size_t p = 0; p < k; ++p) a[i * k + p] = load(A, pr.a->type, p + i * static_cast<size_t>(pr.a->ld));
  for (size_t j = 0; j < n; ++j)
    for (size_t p = 0; p < k; ++p) b[j * k + p] = load(B, pr.b->type, p + j * static_cast<size_t>(pr.b->ld));
  auto scale = [&](ScaleOperand which) {
    return desc.scale[which] != nullptr ? *static_cast<const float*>(desc.scale[which]) : 1.0f;
  };
  const float product_scale = alpha * scale(kScaleA) * scale(kScaleB), c_scale = beta * scale(kScaleC);
  const float d_scale = is_fp8(pr.d->type) ? scale(kScaleD) : 1.0f;
  const bool bias = has_bias(desc.epilogue);
  float amax = 0.0f;
  for (size_t j = 0; j < n; ++j) {
    for (size_t i = 0; i < m; ++i) {
      float sum = 0.0f;
      for (size_t p = 0; p < k; ++p) sum += a[i * k + p] * b[j * k + p];
      float t = product_scale * sum;
      if (beta != 0.0f) t += c_scale * load(C, pr.c->type, i + j * static_cast<size_t>(pr.c->ld));
      if (bias) t += load(desc.bias, pr.bias_type, i);
      amax = std::fmax(amax, std::fabs(t));
      store(D, pr.d->type, i + j * static_cast<size_t>(pr.d->ld), t * d_scale);
    }
  }
  if (desc.amax_d != nullptr) *static_cast<float*>(desc.amax_d) = amax;
}

}  // namespace

// ---- status strings
const char* CUBLASWINAPI cublasLtGetStatusName(cublasStatus_t status) { return status_name(status); }

const char* CUBLASWINAPI cublasLtGetStatusString(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "the library was not initialized (invalid cuBLASLt handle)";
    case CUBLAS_STATUS_ALLOC_FAILED: return "resource allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE: return "an invalid value was used as an argument";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "the functionality requested is not supported (by the simt cuBLASLt stand-in: see simt/cublaslt.cpp)";
    default: return status_name(status);
  }
}

// ---- handle
cublasStatus_t CUBLASWINAPI cublasLtCreate(cublasLtHandle_t* lightHandle) {
  if (lightHandle == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *lightHandle = new (std::nothrow) cublasLtContext{kHandleMagic};
  return *lightHandle != nullptr ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_ALLOC_FAILED;
}

cublasStatus_t CUBLASWINAPI cublasLtDestroy(cublasLtHandle_t lightHandle) {
  if (!valid_handle(lightHandle)) return CUBLAS_STATUS_NOT_INITIALIZED;
  lightHandle->magic = 0;
  delete lightHandle;
  return CUBLAS_STATUS_SUCCESS;
}

// ---- matmul descriptor
cublasStatus_t CUBLASWINAPI cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* matmulDesc,
                                                     cublasComputeType_t computeType, cudaDataType_t scaleType) {
  if (matmulDesc == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  if (computeType != CUBLAS_COMPUTE_32F || scaleType != CUDA_R_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
  MatmulDesc* desc = new (std::nothrow) MatmulDesc;
  if (desc == nullptr) return CUBLAS_STATUS_ALLOC_FAILED;
  *matmulDesc = reinterpret_cast<cublasLtMatmulDesc_t>(desc);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t matmulDesc) {
  MatmulDesc* desc = desc_of(matmulDesc);
  if (desc == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  desc->magic = 0;
  delete desc;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t matmulDesc,
                                                           cublasLtMatmulDescAttributes_t attr, const void* buf,
                                                           size_t sizeInBytes) {
  MatmulDesc* desc = desc_of(matmulDesc);
  if (desc == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  cublasStatus_t status;
  switch (attr) {
    case CUBLASLT_MATMUL_DESC_COMPUTE_TYPE:
    case CUBLASLT_MATMUL_DESC_SCALE_TYPE:
    case CUBLASLT_MATMUL_DESC_POINTER_MODE: {
      int32_t v;
      if ((status = read_value(&v, buf, sizeInBytes)) != CUBLAS_STATUS_SUCCESS) return status;
      // The only values implemented; they are also what MatmulDescCreate accepted.
      int32_t only = CUBLASLT_POINTER_MODE_HOST;
      if (attr == CUBLASLT_MATMUL_DESC_COMPUTE_TYPE) only = CUBLAS_COMPUTE_32F;
      if (attr == CUBLASLT_MATMUL_DESC_SCALE_TYPE) only = CUDA_R_32F;
      return v == only ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_NOT_SUPPORTED;
    }
    case CUBLASLT_MATMUL_DESC_TRANSA:
    case CUBLASLT_MATMUL_DESC_TRANSB: {
      int32_t v;
      if ((status = read_value(&v, buf, sizeInBytes)) != CUBLAS_STATUS_SUCCESS) return status;
      if (v != CUBLAS_OP_N && v != CUBLAS_OP_T) return CUBLAS_STATUS_NOT_SUPPORTED;
      (attr == CUBLASLT_MATMUL_DESC_TRANSA ? desc->trans_a : desc->trans_b) = v;
      return CUBLAS_STATUS_SUCCESS;
    }
    case CUBLASLT_MATMUL_DESC_EPILOGUE: {
      uint32_t v;
      if ((status = read_value(&v, buf, sizeInBytes)) != CUBLAS_STATUS_SUCCESS) return status;
      switch (v) {
        case CUBLASLT_EPILOGUE_DEFAULT:
        case CUBLASLT_EPILOGUE_BIAS:
        case CUBLASLT_EPILOGUE_GELU:
        case CUBLASLT_EPILOGUE_GELU_BIAS:
        case CUBLASLT_EPILOGUE_GELU_AUX:
        case CUBLASLT_EPILOGUE_GELU_AUX_BIAS:
          desc->epilogue = v;
          return CUBLAS_STATUS_SUCCESS;
        default:
          return CUBLAS_STATUS_NOT_SUPPORTED;
      }
    }
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER: return read_value(&desc->bias, buf, sizeInBytes);
    case CUBLASLT_MATMUL_DESC_A_SCALE_POINTER: return read_value(&desc->scale[kScaleA], buf, sizeInBytes);
    case CUBLASLT_MATMUL_DESC_B_SCALE_POINTER: return read_value(&desc->scale[kScaleB], buf, sizeInBytes);
    case CUBLASLT_MATMUL_DESC_C_SCALE_POINTER: return read_value(&desc->scale[kScaleC], buf, sizeInBytes);
    case CUBLASLT_MATMUL_DESC_D_SCALE_POINTER: return read_value(&desc->scale[kScaleD], buf, sizeInBytes);
    case CUBLASLT_MATMUL_DESC_AMAX_D_POINTER: return read_value(&desc->amax_d, buf, sizeInBytes);
    case CUBLASLT_MATMUL_DESC_FAST_ACCUM: {
      // Only the default (off): fast accumulation skips the periodic promotion to higher precision
      // (cublasLt.h), an order of rounding the stand-in does not model.
      int8_t v;
      if ((status = read_value(&v, buf, sizeInBytes)) != CUBLAS_STATUS_SUCCESS) return status;
      return v == 0 ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_NOT_SUPPORTED;
    }
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER: return read_value(&desc->aux, buf, sizeInBytes);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD: return read_value(&desc->aux_ld, buf, sizeInBytes);
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE:
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE: {
      int32_t v;
      if ((status = read_value(&v, buf, sizeInBytes)) != CUBLAS_STATUS_SUCCESS) return status;
      if (!supported_type(v)) return CUBLAS_STATUS_NOT_SUPPORTED;
      (attr == CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE ? desc->bias_type : desc->aux_type) = v;
      return CUBLAS_STATUS_SUCCESS;
    }
    default:
      return CUBLAS_STATUS_NOT_SUPPORTED;
  }
}

// ---- matrix layouts
cublasStatus_t CUBLASWINAPI cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* matLayout, cudaDataType type,
                                                       uint64_t rows, uint64_t cols, int64_t ld) {
  if (matLayout == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  if (!supported_type(type) && !is_fp8(type)) return CUBLAS_STATUS_NOT_SUPPORTED;
  constexpr uint64_t kMaxDim = static_cast<uint64_t>(std::numeric_limits<int>::max());  // OpenBLAS's int sizes
  if (rows > kMaxDim || cols > kMaxDim || ld < 0 || static_cast<uint64_t>(ld) > kMaxDim)
    return CUBLAS_STATUS_NOT_SUPPORTED;
  Layout* layout = new (std::nothrow) Layout{kLayoutMagic, type, static_cast<int64_t>(rows), static_cast<int64_t>(cols), ld};
  if (layout == nullptr) return CUBLAS_STATUS_ALLOC_FAILED;
  *matLayout = reinterpret_cast<cublasLtMatrixLayout_t>(layout);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t matLayout) {
  Layout* layout = const_cast<Layout*>(layout_of(matLayout));
  if (layout == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  layout->magic = 0;
  delete layout;
  return CUBLAS_STATUS_SUCCESS;
}

// ---- heuristic preference
cublasStatus_t CUBLASWINAPI cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) {
  if (pref == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  Preference* p = new (std::nothrow) Preference;
  if (p == nullptr) return CUBLAS_STATUS_ALLOC_FAILED;
  *pref = reinterpret_cast<cublasLtMatmulPreference_t>(p);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
  Preference* p = preference_of(pref);
  if (p == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  p->magic = 0;
  delete p;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                                 cublasLtMatmulPreferenceAttributes_t attr,
                                                                 const void* buf, size_t sizeInBytes) {
  Preference* p = preference_of(pref);
  if (p == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  switch (attr) {
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES: return read_value(&p->max_workspace, buf, sizeInBytes);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES:
      return read_value(&p->alignment[attr - CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES], buf, sizeInBytes);
    default:
      return CUBLAS_STATUS_NOT_SUPPORTED;
  }
}

// ---- heuristic: one algorithm, remembering the alignments it may assume and the workspace it needs.
cublasStatus_t CUBLASWINAPI cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t lightHandle,
                                                           cublasLtMatmulDesc_t operationDesc,
                                                           cublasLtMatrixLayout_t Adesc, cublasLtMatrixLayout_t Bdesc,
                                                           cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
                                                           cublasLtMatmulPreference_t preference,
                                                           int requestedAlgoCount,
                                                           cublasLtMatmulHeuristicResult_t heuristicResultsArray[],
                                                           int* returnAlgoCount) {
  ++simt::counters().heuristic_queries;
  if (requestedAlgoCount <= 0 || heuristicResultsArray == nullptr || returnAlgoCount == nullptr)
    return CUBLAS_STATUS_INVALID_VALUE;
  const Preference* p = preference_of(preference);
  if (p == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  Problem problem;
  const cublasStatus_t status = validate(lightHandle, operationDesc, Adesc, Bdesc, Cdesc, Ddesc, &problem);
  if (status != CUBLAS_STATUS_SUCCESS) return status;
  *returnAlgoCount = 0;
  const uint64_t workspace = workspace_needed(problem);
  if (workspace > p->max_workspace || !epilogue_vectors_aligned(*desc_of(operationDesc)))
    return CUBLAS_STATUS_NOT_SUPPORTED;  // nothing fits
  cublasLtMatmulHeuristicResult_t& result = heuristicResultsArray[0];
  std::memset(&result, 0, sizeof result);
  result.algo.data[0] = kAlgoMagic;
  // An FP8 kernel needs 16-byte aligned A, B and C (the Tensor Core Usage requirements, fp8_rules).
  for (int i = 0; i < 4; ++i)
    result.algo.data[1 + i] = problem.fp8 && i < 3 ? std::max(p->alignment[i], 16u) : p->alignment[i];
  result.algo.data[5] = workspace;
  result.workspaceSize = workspace;
  result.state = CUBLAS_STATUS_SUCCESS;
  result.wavesCount = 1.0f;
  *returnAlgoCount = 1;
  return CUBLAS_STATUS_SUCCESS;
}

// ---- the product
cublasStatus_t CUBLASWINAPI cublasLtMatmul(cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t computeDesc,
                                           const void* alpha, const void* A, cublasLtMatrixLayout_t Adesc,
                                           const void* B, cublasLtMatrixLayout_t Bdesc, const void* beta,
                                           const void* C, cublasLtMatrixLayout_t Cdesc, void* D,
                                           cublasLtMatrixLayout_t Ddesc, const cublasLtMatmulAlgo_t* algo,
                                           void* workspace, size_t workspaceSizeInBytes, cudaStream_t stream) {
  Problem pr;
  const cublasStatus_t status = validate(lightHandle, computeDesc, Adesc, Bdesc, Cdesc, Ddesc, &pr);
  if (status != CUBLAS_STATUS_SUCCESS) return status;
  if (alpha == nullptr || beta == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  const MatmulDesc* desc = desc_of(computeDesc);
  const float alpha_f = *static_cast<const float*>(alpha), beta_f = *static_cast<const float*>(beta);
  if (pr.m == 0 || pr.n == 0) return CUBLAS_STATUS_SUCCESS;
  if (D == nullptr || (beta_f != 0.0f && C == nullptr) || (pr.k > 0 && (A == nullptr || B == nullptr)))
    return CUBLAS_STATUS_INVALID_VALUE;
  if (C == D && (pr.c->ld != pr.d->ld || pr.c->type != pr.d->type))
    return CUBLAS_STATUS_INVALID_VALUE;  // in place needs one layout
  if (overlap(D, pr.d, A, pr.a) || overlap(D, pr.d, B, pr.b) || (C != D && beta_f != 0.0f && overlap(D, pr.d, C, pr.c)))
    return CUBLAS_STATUS_INVALID_VALUE;
  if (!epilogue_vectors_aligned(*desc)) return CUBLAS_STATUS_INVALID_VALUE;
  // Measured on an H200 (CUDA 13.1's cuBLASLt; not in the documentation): an FP8 product whose
  // A or B scale pointer is 4 or 8 bytes past a 16-byte boundary answers NOT_SUPPORTED from
  // cublasLtMatmul (the heuristic, which sees no pointer values, has answered SUCCESS); 16-byte
  // aligned ones run. The C and D scales and amax_D are held to the same rule.
  if (pr.fp8) {
    for (const void* scalar : {desc->scale[0], desc->scale[1], desc->scale[2], desc->scale[3],
                               static_cast<const void*>(desc->amax_d)})
      if (scalar != nullptr && alignment_of(scalar) < 16) return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  if (workspace == nullptr && workspaceSizeInBytes > 0) return CUBLAS_STATUS_INVALID_VALUE;
  // Without an algorithm the library picks one itself, which may need workspace as well.
  const uint64_t needed = algo != nullptr ? algo->data[5] : workspace_needed(pr);
  if (workspaceSizeInBytes < needed) return CUBLAS_STATUS_INVALID_VALUE;
  const void* operands[4] = {A, B, C, D};
  if (algo != nullptr) {
    if (algo->data[0] != kAlgoMagic) return CUBLAS_STATUS_INVALID_VALUE;
    for (int i = 0; i < 4; ++i)
      if (operands[i] != nullptr && alignment_of(operands[i]) < algo->data[1 + i]) return CUBLAS_STATUS_INVALID_VALUE;
  } else if (pr.fp8) {  // the library's own choice: no FP8 kernel takes A, B or C less than 16-byte aligned
    for (int i = 0; i < 3; ++i)
      if (operands[i] != nullptr && alignment_of(operands[i]) < 16) return CUBLAS_STATUS_NOT_SUPPORTED;
  }

  // The stream ordering checker: A, B (and C when beta reads it), bias and scales read; D, aux, amax and
  // workspace written.
  auto extent = [](cudaDataType type, int64_t rows, int64_t cols, int64_t ld) {
    return static_cast<size_t>((cols - 1) * ld + rows) * element_bytes(type);
  };
  auto scalar = [](const void* p) -> size_t { return p != nullptr ? sizeof(float) : 0; };
  const simt::MemoryAccess accesses[] = {
      {A, pr.k > 0 ? extent(pr.a->type, pr.a->rows, pr.a->cols, pr.a->ld) : 0, false},
      {B, pr.k > 0 ? extent(pr.b->type, pr.b->rows, pr.b->cols, pr.b->ld) : 0, false},
      {C, beta_f != 0.0f ? extent(pr.c->type, pr.c->rows, pr.c->cols, pr.c->ld) : 0, false},
      {desc->bias, has_bias(desc->epilogue) ? extent(pr.bias_type, pr.m, 1, pr.m) : 0, false},
      {desc->scale[kScaleA], scalar(desc->scale[kScaleA]), false},
      {desc->scale[kScaleB], scalar(desc->scale[kScaleB]), false},
      {desc->scale[kScaleC], scalar(desc->scale[kScaleC]), false},
      {desc->scale[kScaleD], scalar(desc->scale[kScaleD]), false},
      {D, extent(pr.d->type, pr.d->rows, pr.d->cols, pr.d->ld), true},
      {desc->aux, has_aux(desc->epilogue) ? extent(pr.d->type, pr.m, pr.n, desc->aux_ld) : 0, true},
      {desc->amax_d, scalar(desc->amax_d), true},
      {workspace, workspace != nullptr ? workspaceSizeInBytes : 0, true}};
  simt::stream_operation(stream, "cublasLtMatmul", accesses, sizeof accesses / sizeof accesses[0]);

  if (pr.fp8)
    fp8_product(pr, *desc, alpha_f, beta_f, A, B, C, D);
  else
    wide_product(pr, *desc, alpha_f, beta_f, A, B, C, D);
  return CUBLAS_STATUS_SUCCESS;
}

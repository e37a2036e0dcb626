// The CPU build's cuBLASLt stand-in (simt/cublaslt.cpp) implements a subset of cuBLASLt;
// everything outside it must fail loudly instead of computing something else. The real
// library implements these, so this test exists only in the CPU build. The library's own rules hold
// too: workspace the heuristic asks for, NOT_SUPPORTED when nothing fits, 16-byte aligned bias and
// aux vectors, D overlapping no operand but C in place; and matmul.cuh's answer to NOT_SUPPORTED.
#include "test/cublaslt_call.h"
#include "kernels/matmul.cuh"

TEST_CASE("simt cuBLASLt stand-in refuses what it does not implement", "[matmul][cublaslt]") {
  test::LtCall call;
  // Epilogues and attributes outside the subset.
  CHECK(call.set(CUBLASLT_MATMUL_DESC_EPILOGUE, static_cast<uint32_t>(CUBLASLT_EPILOGUE_DGELU_BGRAD)) ==
        CUBLAS_STATUS_NOT_SUPPORTED);
  CHECK(call.set(CUBLASLT_MATMUL_DESC_EPILOGUE, static_cast<uint32_t>(CUBLASLT_EPILOGUE_RELU_BIAS)) ==
        CUBLAS_STATUS_NOT_SUPPORTED);
  CHECK(call.set(CUBLASLT_MATMUL_DESC_EPILOGUE, static_cast<uint32_t>(CUBLASLT_EPILOGUE_BGRADB)) ==
        CUBLAS_STATUS_NOT_SUPPORTED);
  CHECK(call.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_AMAX_POINTER, static_cast<void*>(nullptr)) ==
        CUBLAS_STATUS_NOT_SUPPORTED);
  CHECK(call.set(CUBLASLT_MATMUL_DESC_FAST_ACCUM, static_cast<int8_t>(1)) == CUBLAS_STATUS_NOT_SUPPORTED);
  CHECK(call.set(CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, static_cast<int32_t>(64)) == CUBLAS_STATUS_NOT_SUPPORTED);
  CHECK(call.set(CUBLASLT_MATMUL_DESC_TRANSA, static_cast<int32_t>(CUBLAS_OP_C)) == CUBLAS_STATUS_NOT_SUPPORTED);
  CHECK(call.set(CUBLASLT_MATMUL_DESC_POINTER_MODE, static_cast<int32_t>(CUBLASLT_POINTER_MODE_DEVICE)) ==
        CUBLAS_STATUS_NOT_SUPPORTED);
  CHECK(call.set(CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, static_cast<int32_t>(CUDA_R_16F)) ==
        CUBLAS_STATUS_NOT_SUPPORTED);
  const uint32_t search = CUBLASLT_SEARCH_BEST_FIT;
  CHECK(cublasLtMatmulPreferenceSetAttribute(call.preference, CUBLASLT_MATMUL_PREF_SEARCH_MODE, &search,
                                             sizeof(search)) == CUBLAS_STATUS_NOT_SUPPORTED);
  // Compute and data types outside the subset.
  cublasLtMatmulDesc_t tf32_desc = nullptr;
  CHECK(cublasLtMatmulDescCreate(&tf32_desc, CUBLAS_COMPUTE_32F_FAST_TF32, CUDA_R_32F) == CUBLAS_STATUS_NOT_SUPPORTED);
  cublasLtMatrixLayout_t half_layout = nullptr;
  CHECK(cublasLtMatrixLayoutCreate(&half_layout, CUDA_R_16F, 8, 8, 8) == CUBLAS_STATUS_NOT_SUPPORTED);

  // A well-formed 8×8×8 product, then one thing wrong at a time.
  test::DeviceBuffer<float> a(64), b(64), d(64), aux(64);
  test::DeviceBuffer<bf16> d_bf16(64);
  const float alpha = 1.0f, beta = 0.0f;
  REQUIRE(cublasLtMatrixLayoutCreate(&call.a, CUDA_R_32F, 8, 8, 8) == CUBLAS_STATUS_SUCCESS);
  REQUIRE(cublasLtMatrixLayoutCreate(&call.b, CUDA_R_32F, 8, 8, 8) == CUBLAS_STATUS_SUCCESS);
  REQUIRE(cublasLtMatrixLayoutCreate(&call.c, CUDA_R_32F, 8, 8, 8) == CUBLAS_STATUS_SUCCESS);
  REQUIRE(cublasLtMatrixLayoutCreate(&call.d, CUDA_R_32F, 8, 8, 8) == CUBLAS_STATUS_SUCCESS);
  cublasLtMatmulHeuristicResult_t heuristic;
  REQUIRE(call.heuristic(&heuristic) == CUBLAS_STATUS_SUCCESS);
  auto matmul = [&](const void* a_ptr, void* d_ptr, cublasLtMatrixLayout_t d_layout) {
    return cublasLtMatmul(call.handle, call.desc, &alpha, a_ptr, call.a, b, call.b, &beta, d_ptr, call.c, d_ptr,
                          d_layout, &heuristic.algo, nullptr, 0, nullptr);
  };
  // Operands less aligned than the heuristic was allowed to assume (256 bytes by default).
  CHECK(matmul(a.ptr + 1, d, call.d) == CUBLAS_STATUS_INVALID_VALUE);
  // Mixed data types (bf16 D with fp32 A/B/C).
  cublasLtMatrixLayout_t bf16_layout = nullptr;
  REQUIRE(cublasLtMatrixLayoutCreate(&bf16_layout, CUDA_R_16BF, 8, 8, 8) == CUBLAS_STATUS_SUCCESS);
  CHECK(matmul(a, d_bf16, bf16_layout) == CUBLAS_STATUS_NOT_SUPPORTED);
  cublasLtMatrixLayoutDestroy(bf16_layout);
  // GELU_AUX needs an aux matrix whose leading dimension is a multiple of 8 and >= m.
  REQUIRE(call.set(CUBLASLT_MATMUL_DESC_EPILOGUE, static_cast<uint32_t>(CUBLASLT_EPILOGUE_GELU_AUX)) ==
          CUBLAS_STATUS_SUCCESS);
  CHECK(matmul(a, d, call.d) == CUBLAS_STATUS_INVALID_VALUE);  // no aux pointer
  REQUIRE(call.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, static_cast<void*>(aux.ptr)) == CUBLAS_STATUS_SUCCESS);
  REQUIRE(call.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, static_cast<int64_t>(12)) == CUBLAS_STATUS_SUCCESS);
  CHECK(matmul(a, d, call.d) == CUBLAS_STATUS_INVALID_VALUE);
  REQUIRE(call.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, static_cast<int64_t>(8)) == CUBLAS_STATUS_SUCCESS);
  CHECK(matmul(a, d, call.d) == CUBLAS_STATUS_SUCCESS);
  // BIAS epilogue without a bias vector.
  REQUIRE(call.set(CUBLASLT_MATMUL_DESC_EPILOGUE, static_cast<uint32_t>(CUBLASLT_EPILOGUE_BIAS)) ==
          CUBLAS_STATUS_SUCCESS);
  CHECK(matmul(a, d, call.d) == CUBLAS_STATUS_INVALID_VALUE);
  // Shapes that do not chain: op(A) is 8 × 8 but B has 4 rows.
  REQUIRE(call.set(CUBLASLT_MATMUL_DESC_EPILOGUE, static_cast<uint32_t>(CUBLASLT_EPILOGUE_DEFAULT)) ==
          CUBLAS_STATUS_SUCCESS);
  cublasLtMatrixLayoutDestroy(call.b);
  REQUIRE(cublasLtMatrixLayoutCreate(&call.b, CUDA_R_32F, 4, 16, 4) == CUBLAS_STATUS_SUCCESS);
  CHECK(matmul(a, d, call.d) == CUBLAS_STATUS_INVALID_VALUE);
}

namespace {

// An fp32 product of m × k by k × n into m × n, every matrix packed.
void make_layouts(test::LtCall& call, uint64_t m, uint64_t n, uint64_t k) {
  REQUIRE(cublasLtMatrixLayoutCreate(&call.a, CUDA_R_32F, m, k, static_cast<int64_t>(m)) == CUBLAS_STATUS_SUCCESS);
  REQUIRE(cublasLtMatrixLayoutCreate(&call.b, CUDA_R_32F, k, n, static_cast<int64_t>(k)) == CUBLAS_STATUS_SUCCESS);
  REQUIRE(cublasLtMatrixLayoutCreate(&call.c, CUDA_R_32F, m, n, static_cast<int64_t>(m)) == CUBLAS_STATUS_SUCCESS);
  REQUIRE(cublasLtMatrixLayoutCreate(&call.d, CUDA_R_32F, m, n, static_cast<int64_t>(m)) == CUBLAS_STATUS_SUCCESS);
}

cublasStatus_t set_max_workspace(test::LtCall& call, uint64_t bytes) {
  return cublasLtMatmulPreferenceSetAttribute(call.preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &bytes,
                                              sizeof bytes);
}

}  // namespace

TEST_CASE("simt cuBLASLt stand-in: the heuristic may ask for workspace and says NOT_SUPPORTED when none fits",
          "[matmul][cublaslt]") {
  test::LtCall call;
  make_layouts(call, 8, 8, 64);  // k >= 2·max(m, n): the split-k algorithm
  test::DeviceBuffer<float> a(8 * 64), b(64 * 8), d(64);
  cublasLtMatmulHeuristicResult_t heuristic;
  int found = -1;
  // Planted: no workspace allowed for a product whose algorithm needs some.
  REQUIRE(set_max_workspace(call, 0) == CUBLAS_STATUS_SUCCESS);
  CHECK(cublasLtMatmulAlgoGetHeuristic(call.handle, call.desc, call.a, call.b, call.c, call.d, call.preference, 1,
                                       &heuristic, &found) == CUBLAS_STATUS_NOT_SUPPORTED);
  CHECK(found == 0);
  // Correct counterpart: enough workspace allowed; then the product needs all of it.
  REQUIRE(set_max_workspace(call, 32u << 20) == CUBLAS_STATUS_SUCCESS);
  REQUIRE(call.heuristic(&heuristic) == CUBLAS_STATUS_SUCCESS);
  REQUIRE(heuristic.workspaceSize > 0);
  test::DeviceBuffer<unsigned char> workspace(heuristic.workspaceSize);
  const float alpha = 1.0f, beta = 0.0f;
  auto matmul = [&](size_t workspace_bytes) {
    return cublasLtMatmul(call.handle, call.desc, &alpha, a, call.a, b, call.b, &beta, d, call.c, d, call.d,
                          &heuristic.algo, workspace, workspace_bytes, nullptr);
  };
  CHECK(matmul(heuristic.workspaceSize - 1) == CUBLAS_STATUS_INVALID_VALUE);  // planted: too small
  CHECK(matmul(heuristic.workspaceSize) == CUBLAS_STATUS_SUCCESS);
  // A product with k < 2·max(m, n) needs none.
  test::LtCall small;
  make_layouts(small, 8, 8, 8);
  REQUIRE(small.heuristic(&heuristic) == CUBLAS_STATUS_SUCCESS);
  CHECK(heuristic.workspaceSize == 0);
}

TEST_CASE("simt cuBLASLt stand-in: bias and aux vectors must be 16-byte aligned", "[matmul][cublaslt]") {
  test::LtCall call;
  make_layouts(call, 8, 8, 8);
  test::DeviceBuffer<float> a(64), b(64), d(64), bias(16), aux(64);
  cublasLtMatmulHeuristicResult_t heuristic;
  REQUIRE(call.set(CUBLASLT_MATMUL_DESC_EPILOGUE, static_cast<uint32_t>(CUBLASLT_EPILOGUE_GELU_AUX_BIAS)) ==
          CUBLAS_STATUS_SUCCESS);
  REQUIRE(call.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, static_cast<int64_t>(8)) == CUBLAS_STATUS_SUCCESS);
  REQUIRE(call.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, static_cast<void*>(aux.ptr)) == CUBLAS_STATUS_SUCCESS);
  // Planted: a bias 8 bytes off; the heuristic reads its alignment and finds nothing.
  REQUIRE(call.set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, static_cast<const void*>(bias.ptr + 2)) == CUBLAS_STATUS_SUCCESS);
  CHECK(call.heuristic(&heuristic) == CUBLAS_STATUS_NOT_SUPPORTED);
  REQUIRE(call.set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, static_cast<const void*>(bias.ptr)) == CUBLAS_STATUS_SUCCESS);
  REQUIRE(call.heuristic(&heuristic) == CUBLAS_STATUS_SUCCESS);
  const float alpha = 1.0f, beta = 0.0f;
  auto matmul = [&] {
    return cublasLtMatmul(call.handle, call.desc, &alpha, a, call.a, b, call.b, &beta, d, call.c, d, call.d,
                          &heuristic.algo, nullptr, 0, nullptr);
  };
  CHECK(matmul() == CUBLAS_STATUS_SUCCESS);
  // Planted after the heuristic: a misaligned bias, then a misaligned aux.
  REQUIRE(call.set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, static_cast<const void*>(bias.ptr + 1)) == CUBLAS_STATUS_SUCCESS);
  CHECK(matmul() == CUBLAS_STATUS_INVALID_VALUE);
  REQUIRE(call.set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, static_cast<const void*>(bias.ptr)) == CUBLAS_STATUS_SUCCESS);
  REQUIRE(call.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, static_cast<void*>(aux.ptr + 2)) == CUBLAS_STATUS_SUCCESS);
  CHECK(matmul() == CUBLAS_STATUS_INVALID_VALUE);
}

TEST_CASE("simt cuBLASLt stand-in: D overlaps A, B or C only as C in place", "[matmul][cublaslt]") {
  test::LtCall call;
  make_layouts(call, 8, 8, 8);
  test::DeviceBuffer<float> a(64), b(64), c(64), d(128);
  const std::vector<float> zeros(64, 0.0f);
  for (test::DeviceBuffer<float>* x : {&a, &b, &c}) x->upload(zeros);
  cublasLtMatmulHeuristicResult_t heuristic;
  REQUIRE(call.heuristic(&heuristic) == CUBLAS_STATUS_SUCCESS);
  const float alpha = 1.0f, beta = 1.0f;
  auto matmul = [&](const void* a_ptr, const void* b_ptr, const void* c_ptr, void* d_ptr) {
    return cublasLtMatmul(call.handle, call.desc, &alpha, a_ptr, call.a, b_ptr, call.b, &beta, c_ptr, call.c, d_ptr,
                          call.d, nullptr, nullptr, 0, nullptr);
  };
  CHECK(matmul(a, b, c, d) == CUBLAS_STATUS_SUCCESS);
  CHECK(matmul(a, b, c, c) == CUBLAS_STATUS_SUCCESS);  // in place: D == C, one layout
  // Planted: D over A, over B, and over part of C.
  CHECK(matmul(d.ptr + 32, b, c, d) == CUBLAS_STATUS_INVALID_VALUE);
  CHECK(matmul(a, d.ptr + 60, c, d) == CUBLAS_STATUS_INVALID_VALUE);
  CHECK(matmul(a, b, d.ptr + 8, d) == CUBLAS_STATUS_INVALID_VALUE);
}

TEST_CASE("matmul.cuh reports cuBLASLt's NOT_SUPPORTED as 'no algorithm'", "[matmul][cublaslt]") {
  matmul_init();
  const int rows = 4, C = 8, OC = 8;
  test::DeviceBuffer<float> out(rows * OC), inp(rows * C), weight(OC * C), bias(OC + 2);
  // Planted: a bias 8 bytes off 16-byte alignment (nothing fits); the aligned one works.
  CHECK_THROWS_WITH(matmul_forward<float>(out, inp, weight, bias.ptr + 2, rows, C, OC, nullptr),
                    Catch::Contains("cuBLASLt has no algorithm for m=8 n=4 k=8"));
  CHECK_NOTHROW(matmul_forward<float>(out, inp, weight, bias.ptr, rows, C, OC, nullptr));
  matmul_destroy();
}

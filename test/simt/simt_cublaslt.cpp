// The CPU build's cuBLASLt stand-in (simt/cublaslt.cpp) implements a subset of cuBLASLt;
// everything outside it must fail loudly instead of computing something else. The real
// library implements these, so this test exists only in the CPU build.
#include "test/cublaslt_call.h"

TEST_CASE("simt cuBLASLt stand-in refuses what it does not implement", "[matmul][cublaslt]") {
  test::LtCall call;
  // Epilogues and attributes outside the subset.
  CHECK(call.set(CUBLASLT_MATMUL_DESC_EPILOGUE, static_cast<uint32_t>(CUBLASLT_EPILOGUE_DGELU_BGRAD)) ==
        CUBLAS_STATUS_NOT_SUPPORTED);
  CHECK(call.set(CUBLASLT_MATMUL_DESC_EPILOGUE, static_cast<uint32_t>(CUBLASLT_EPILOGUE_RELU_BIAS)) ==
        CUBLAS_STATUS_NOT_SUPPORTED);
  CHECK(call.set(CUBLASLT_MATMUL_DESC_EPILOGUE, static_cast<uint32_t>(CUBLASLT_EPILOGUE_BGRADB)) ==
        CUBLAS_STATUS_NOT_SUPPORTED);
  CHECK(call.set(CUBLASLT_MATMUL_DESC_AMAX_D_POINTER, static_cast<void*>(nullptr)) == CUBLAS_STATUS_NOT_SUPPORTED);
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

// cublaslt_call.h — one cuBLASLt matmul call assembled piece by piece, for tests that drive
// the cuBLASLt API directly (test_matmul.cu in both builds, simt_cublaslt.cpp on the CPU).
#pragma once
#include "test/test_util.h"

#include <cublasLt.h>

namespace test {

// Descriptors of one product, destroyed at scope exit.
struct LtCall {
  cublasLtHandle_t handle = nullptr;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr, d = nullptr;
  cublasLtMatmulPreference_t preference = nullptr;
  LtCall() {
    REQUIRE(cublasLtCreate(&handle) == CUBLAS_STATUS_SUCCESS);
    REQUIRE(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS);
    REQUIRE(cublasLtMatmulPreferenceCreate(&preference) == CUBLAS_STATUS_SUCCESS);
  }
  ~LtCall() {
    for (cublasLtMatrixLayout_t l : {a, b, c, d})
      if (l != nullptr) cublasLtMatrixLayoutDestroy(l);
    cublasLtMatmulPreferenceDestroy(preference);
    cublasLtMatmulDescDestroy(desc);
    cublasLtDestroy(handle);
  }
  template <typename V>
  cublasStatus_t set(cublasLtMatmulDescAttributes_t attr, const V& value) {
    return cublasLtMatmulDescSetAttribute(desc, attr, &value, sizeof(value));
  }
  cublasStatus_t heuristic(cublasLtMatmulHeuristicResult_t* result) {
    int found = 0;
    cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(handle, desc, a, b, c, d, preference, 1, result, &found);
    return status == CUBLAS_STATUS_SUCCESS && found == 0 ? CUBLAS_STATUS_NOT_SUPPORTED : status;
  }
};

}  // namespace test

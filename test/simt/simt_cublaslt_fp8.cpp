// The CPU build's cuBLASLt stand-in as the FP8 oracle (simt/cublaslt.cpp; docs/SIMT.md, "The FP8
// oracle"): each FP8 type combination it answers, against a double loop over values decoded by
// test/fp8_reference.h, byte for byte (the data are chosen so that every fp32 sum is exact; FP8 results
// are the codes a search of the table gives); the scale pointers and amax_D; the documented order of
// the fp32 sum; and each FP8 product cuBLASLt refuses. CPU build only, like the other stand-in tests.
#include "test/cublaslt_call.h"
#include "test/fp8_reference.h"

#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

namespace {

constexpr uint8_t kPoison = 0xFF;  // test::DeviceBuffer's fill: NaN as fp32, bf16 and both FP8 formats
constexpr size_t kWorkspaceBytes = 1u << 20;

bool is_fp8(cudaDataType t) { return t == CUDA_R_8F_E4M3 || t == CUDA_R_8F_E5M2; }
size_t element_bytes(cudaDataType t) { return t == CUDA_R_32F ? 4 : t == CUDA_R_16BF ? 2 : 1; }
const test::Format& format_of(cudaDataType t) { return t == CUDA_R_8F_E4M3 ? test::kE4M3 : test::kE5M2; }

// One product: D (m × n) = op(A) op(B), cuBLASLt's column-major terms; a leading dimension of 0 is the
// stored row count; a scale of 0 leaves its pointer unset.
struct Fp8Product {
  cudaDataType a_type = CUDA_R_8F_E4M3, b_type = CUDA_R_8F_E4M3, c_type = CUDA_R_16BF, d_type = CUDA_R_16BF;
  int32_t trans_a = CUBLAS_OP_T, trans_b = CUBLAS_OP_N;
  int64_t m = 16, n = 8, k = 32;
  int64_t lda = 0, ldb = 0, ldc = 0;  // D has C's layout
  float alpha = 1.0f, beta = 0.0f;
  bool bias = false, amax = false;
  float scale_a = 0, scale_b = 0, scale_c = 0, scale_d = 0;
  int scale_offset = 0;  // floats past each scale's 16-byte boundary
  uint32_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;  // BIAS when `bias`
  int32_t bias_type = -1;                         // -1: not set

  int64_t a_rows() const { return trans_a == CUBLAS_OP_T ? k : m; }
  int64_t a_cols() const { return trans_a == CUBLAS_OP_T ? m : k; }
  int64_t b_rows() const { return trans_b == CUBLAS_OP_N ? k : n; }
  int64_t b_cols() const { return trans_b == CUBLAS_OP_N ? n : k; }
  int64_t ld_a() const { return lda != 0 ? lda : a_rows(); }
  int64_t ld_b() const { return ldb != 0 ? ldb : b_rows(); }
  int64_t ld_c() const { return ldc != 0 ? ldc : m; }
};

// The operands' stored bytes.
struct Operands {
  std::vector<uint8_t> a, b, c, bias;
};

double read_wide(const std::vector<uint8_t>& bytes, cudaDataType type, size_t index) {
  if (type == CUDA_R_32F) {
    float v;
    std::memcpy(&v, &bytes[4 * index], 4);
    return v;
  }
  __nv_bfloat16 v;
  std::memcpy(&v, &bytes[2 * index], 2);
  return __bfloat162float(v);
}

// fp32, or bf16 rounded to nearest even (cuda_bf16.h's conversion, not the stand-in's).
void write_wide(std::vector<uint8_t>& bytes, cudaDataType type, size_t index, double v) {
  if (type == CUDA_R_32F) {
    const float f = static_cast<float>(v);
    std::memcpy(&bytes[4 * index], &f, 4);
  } else {
    const __nv_bfloat16 h = __float2bfloat16_rn(static_cast<float>(v));
    std::memcpy(&bytes[2 * index], &h, 2);
  }
}

// An FP8 code of magnitude 2^-3 .. just under 2^3, or ±0 one time in eight: with k ≤ 64 every partial
// sum of products is a multiple of 2^-12 below 2^12, so fp32 holds it exactly whatever the order.
uint8_t moderate_code(const test::Format& f, std::mt19937& rng) {
  std::uniform_int_distribution<int> exponent(-3, 2), mantissa(0, (1 << f.mantissa_bits) - 1), die(0, 15);
  const int roll = die(rng), sign = (roll & 1) << 7;
  if (roll < 2) return static_cast<uint8_t>(sign);
  return static_cast<uint8_t>(sign | ((exponent(rng) + f.bias) << f.mantissa_bits) | mantissa(rng));
}

Operands make_operands(const Fp8Product& p, uint32_t seed) {
  std::mt19937 rng(seed);
  Operands x;
  auto fp8_matrix = [&](cudaDataType type, int64_t ld, int64_t cols) {
    std::vector<uint8_t> v(static_cast<size_t>(ld * cols));
    for (uint8_t& code : v) code = moderate_code(format_of(type), rng);
    return v;
  };
  x.a = fp8_matrix(p.a_type, p.ld_a(), p.a_cols());
  x.b = fp8_matrix(p.b_type, p.ld_b(), p.b_cols());
  std::uniform_int_distribution<int> small(-64, 64);
  const size_t c_count = static_cast<size_t>(p.ld_c() * p.n);
  x.c.assign(c_count * element_bytes(p.c_type), 0);
  if (!is_fp8(p.c_type))  // an FP8 C (refused) stays zero
    for (size_t i = 0; i < c_count; ++i) write_wide(x.c, p.c_type, i, small(rng) / 4.0);
  x.bias.assign(static_cast<size_t>(p.m) * 2, 0);
  for (int64_t i = 0; i < p.m; ++i) write_wide(x.bias, CUDA_R_16BF, static_cast<size_t>(i), small(rng) / 8.0);
  return x;
}

struct Result {
  std::vector<uint8_t> d;  // D's bytes, ld_c · n elements (the rows past m keep the poison)
  double amax = 0;
};

// The documented result, in double: t = alpha·scale_A·scale_B·Σ a·b + beta·scale_C·C + bias,
// amax = max |t|, D = t·scale_D as the FP8 code the table search gives (saturating), or t in D's type.
Result reference(const Fp8Product& p, const Operands& x) {
  auto scale = [](float s) { return s != 0 ? static_cast<double>(s) : 1.0; };
  const test::Format &fa = format_of(p.a_type), &fb = format_of(p.b_type);
  const size_t bytes = element_bytes(p.d_type);
  Result r;
  r.d.assign(static_cast<size_t>(p.ld_c() * p.n) * bytes, kPoison);
  for (int64_t j = 0; j < p.n; ++j)
    for (int64_t i = 0; i < p.m; ++i) {
      double sum = 0;
      for (int64_t q = 0; q < p.k; ++q)  // op(A)(i, q) = A(q, i); op(B)(q, j) = B(q, j)
        sum += test::decode(fa, x.a[q + i * p.ld_a()]) * test::decode(fb, x.b[q + j * p.ld_b()]);
      double t = p.alpha * scale(p.scale_a) * scale(p.scale_b) * sum;
      const size_t at = static_cast<size_t>(i + j * p.ld_c());
      if (p.beta != 0) t += p.beta * scale(p.scale_c) * read_wide(x.c, p.c_type, at);
      if (p.bias) t += read_wide(x.bias, CUDA_R_16BF, static_cast<size_t>(i));
      r.amax = std::max(r.amax, std::fabs(t));
      if (is_fp8(p.d_type))
        r.d[at] = test::expected_code(format_of(p.d_type), t * scale(p.scale_d), true);
      else
        write_wide(r.d, p.d_type, at, t);
    }
  return r;
}

struct Outcome {
  cublasStatus_t heuristic = CUBLAS_STATUS_INTERNAL_ERROR, matmul = CUBLAS_STATUS_INTERNAL_ERROR;
  Result got;
};

// Runs the product through the cuBLASLt API: the heuristic, then cublasLtMatmul with its algorithm
// (or, with `library_choice` or when the heuristic found none, without one). `a_offset` moves A off
// its allocation's alignment by that many bytes. `scales_late`: the scale pointers are set after
// the heuristic has chosen the algorithm.
Outcome run(const Fp8Product& p, const Operands& x, bool library_choice = false, size_t a_offset = 0,
            bool scales_late = false) {
  test::LtCall call;
  Outcome out;
  REQUIRE(call.set(CUBLASLT_MATMUL_DESC_TRANSA, p.trans_a) == CUBLAS_STATUS_SUCCESS);
  REQUIRE(call.set(CUBLASLT_MATMUL_DESC_TRANSB, p.trans_b) == CUBLAS_STATUS_SUCCESS);
  const uint32_t epilogue = p.bias ? static_cast<uint32_t>(CUBLASLT_EPILOGUE_BIAS) : p.epilogue;
  REQUIRE(call.set(CUBLASLT_MATMUL_DESC_EPILOGUE, epilogue) == CUBLAS_STATUS_SUCCESS);
  if (p.bias_type != -1) REQUIRE(call.set(CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, p.bias_type) == CUBLAS_STATUS_SUCCESS);

  test::DeviceBuffer<uint8_t> a(x.a.size() + a_offset), b(x.b), c(x.c), bias(x.bias);
  CUDA_CHECK(cudaMemcpy(a.ptr + a_offset, x.a.data(), x.a.size(), cudaMemcpyHostToDevice));
  test::DeviceBuffer<uint8_t> d(static_cast<size_t>(p.ld_c() * p.n) * element_bytes(p.d_type));
  test::DeviceBuffer<uint8_t> workspace(kWorkspaceBytes);
  // Each scale at its own 16-byte boundary (cuBLASLt's FP8 products need it), plus scale_offset floats.
  test::DeviceBuffer<float> scales(17), amax(1);
  std::vector<float> scale_slots(17, 0.0f);
  const float scale_of[4] = {p.scale_a, p.scale_b, p.scale_c, p.scale_d};
  for (int i = 0; i < 4; ++i) scale_slots[4 * i + p.scale_offset] = scale_of[i];
  scales.upload(scale_slots);
  const cublasLtMatmulDescAttributes_t scale_attributes[4] = {
      CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
      CUBLASLT_MATMUL_DESC_C_SCALE_POINTER, CUBLASLT_MATMUL_DESC_D_SCALE_POINTER};
  const float scale_values[4] = {p.scale_a, p.scale_b, p.scale_c, p.scale_d};
  auto set_scales = [&] {
    for (int i = 0; i < 4; ++i)
      if (scale_values[i] != 0)
        REQUIRE(call.set(scale_attributes[i], static_cast<const void*>(scales.ptr + 4 * i + p.scale_offset)) ==
                CUBLAS_STATUS_SUCCESS);
  };
  if (!scales_late) set_scales();
  if (p.amax) REQUIRE(call.set(CUBLASLT_MATMUL_DESC_AMAX_D_POINTER, static_cast<void*>(amax.ptr)) == CUBLAS_STATUS_SUCCESS);
  if (p.bias) REQUIRE(call.set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, static_cast<const void*>(bias.ptr)) == CUBLAS_STATUS_SUCCESS);

  REQUIRE(cublasLtMatrixLayoutCreate(&call.a, p.a_type, p.a_rows(), p.a_cols(), p.ld_a()) == CUBLAS_STATUS_SUCCESS);
  REQUIRE(cublasLtMatrixLayoutCreate(&call.b, p.b_type, p.b_rows(), p.b_cols(), p.ld_b()) == CUBLAS_STATUS_SUCCESS);
  REQUIRE(cublasLtMatrixLayoutCreate(&call.c, p.c_type, p.m, p.n, p.ld_c()) == CUBLAS_STATUS_SUCCESS);
  REQUIRE(cublasLtMatrixLayoutCreate(&call.d, p.d_type, p.m, p.n, p.ld_c()) == CUBLAS_STATUS_SUCCESS);
  const uint64_t max_workspace = kWorkspaceBytes;
  REQUIRE(cublasLtMatmulPreferenceSetAttribute(call.preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                               &max_workspace, sizeof max_workspace) == CUBLAS_STATUS_SUCCESS);
  cublasLtMatmulHeuristicResult_t heuristic;
  out.heuristic = call.heuristic(&heuristic);
  if (scales_late) set_scales();
  const bool with_algo = out.heuristic == CUBLAS_STATUS_SUCCESS && !library_choice;
  out.matmul = cublasLtMatmul(call.handle, call.desc, &p.alpha, a.ptr + a_offset, call.a, b.ptr, call.b, &p.beta,
                              c.ptr, call.c, d.ptr, call.d, with_algo ? &heuristic.algo : nullptr, workspace.ptr,
                              kWorkspaceBytes, nullptr);
  out.got.d = d.download();
  out.got.amax = p.amax ? amax.download()[0] : 0.0;
  return out;
}

// Runs the product and compares every byte of D (and amax_D) with the reference.
void check_product(const Fp8Product& p, uint32_t seed) {
  INFO("A " << format_of(p.a_type).name << " B " << format_of(p.b_type).name << " C type " << p.c_type
            << " D type " << p.d_type << " m=" << p.m << " n=" << p.n << " k=" << p.k << " lda=" << p.ld_a()
            << " ldb=" << p.ld_b() << " ldc=" << p.ld_c() << " alpha=" << p.alpha << " beta=" << p.beta
            << " bias=" << p.bias << " scales " << p.scale_a << " " << p.scale_b << " " << p.scale_c << " "
            << p.scale_d);
  const Operands x = make_operands(p, seed);
  const Result want = reference(p, x);
  const Outcome got = run(p, x);
  REQUIRE(got.heuristic == CUBLAS_STATUS_SUCCESS);
  REQUIRE(got.matmul == CUBLAS_STATUS_SUCCESS);
  size_t first_bad = want.d.size(), bad = 0;
  for (size_t i = 0; i < want.d.size(); ++i)
    if (got.got.d[i] != want.d[i] && bad++ == 0) first_bad = i;
  INFO(bad << " of " << want.d.size() << " bytes of D differ; first at byte " << first_bad);
  CHECK(bad == 0);
  if (p.amax) CHECK(got.got.amax == want.amax);
}

struct TypePair {
  cudaDataType c, d;
};

}  // namespace

TEST_CASE("FP8 products: each type combination against a double loop, byte for byte", "[cublaslt][fp8]") {
  const cudaDataType pairs[3][2] = {{CUDA_R_8F_E4M3, CUDA_R_8F_E4M3},
                                    {CUDA_R_8F_E4M3, CUDA_R_8F_E5M2},
                                    {CUDA_R_8F_E5M2, CUDA_R_8F_E4M3}};
  uint32_t seed = 1;
  for (const auto& ab : pairs) {
    const bool e5m2_operand = ab[0] == CUDA_R_8F_E5M2 || ab[1] == CUDA_R_8F_E5M2;
    std::vector<TypePair> outputs = {{CUDA_R_16BF, CUDA_R_16BF}, {CUDA_R_32F, CUDA_R_32F}, {CUDA_R_16BF, CUDA_R_8F_E4M3}};
    if (e5m2_operand) outputs.push_back({CUDA_R_16BF, CUDA_R_8F_E5M2});
    for (const TypePair& cd : outputs) {
      Fp8Product p;
      p.a_type = ab[0];
      p.b_type = ab[1];
      p.c_type = cd.c;
      p.d_type = cd.d;
      // Smallest: one column, k = 16.
      p.m = cd.c == CUDA_R_32F ? 4 : 8, p.n = 1, p.k = 16;
      check_product(p, seed++);
      // Odd n, m not a multiple of 16, padded leading dimensions, bias, beta, every scale.
      p.m = cd.c == CUDA_R_32F ? 12 : 24, p.n = 13, p.k = 48;
      p.lda = p.k + 16, p.ldb = p.k + 32, p.ldc = p.m + 8;
      p.bias = true, p.beta = 1.0f, p.alpha = 0.5f, p.amax = true;
      p.scale_a = 0.5f, p.scale_b = 4.0f, p.scale_c = 2.0f;
      if (is_fp8(cd.d)) p.scale_d = 0.25f;
      check_product(p, seed++);
      // FP8 D scaled past its largest finite value: saturates.
      if (is_fp8(cd.d)) {
        p.scale_d = 64.0f;
        check_product(p, seed++);
      }
    }
  }
}

TEST_CASE("FP8 products: the scales multiply as documented and amax_D is taken before scale_D", "[cublaslt][fp8]") {
  // One element: D = scale_D·(alpha·scale_A·scale_B·Σ a·b + beta·scale_C·C), each scale a different
  // power of two, so a scale applied twice, dropped or misplaced changes the result.
  Fp8Product p;
  p.m = 8, p.n = 1, p.k = 16, p.d_type = CUDA_R_8F_E4M3, p.alpha = 2.0f, p.beta = 1.0f, p.amax = true;
  p.scale_a = 0.5f, p.scale_b = 0.125f, p.scale_c = 4.0f, p.scale_d = 8.0f;
  Operands x = make_operands(p, 7);
  std::fill(x.a.begin(), x.a.end(), uint8_t{0});
  std::fill(x.b.begin(), x.b.end(), uint8_t{0});
  std::fill(x.c.begin(), x.c.end(), uint8_t{0});
  x.a[0] = 0x40;  // E4M3 2 (A(0, 0) = op(A)(0, 0))
  x.b[0] = 0x48;  // E4M3 4
  write_wide(x.c, CUDA_R_16BF, 0, 0.25);
  // t = 2·0.5·0.125·(2·4) + 1·4·0.25 = 2; amax_D = 2; D = 8·2 = 16 (E4M3 0x58).
  const Result want = reference(p, x);
  REQUIRE(want.amax == 2.0);
  REQUIRE(want.d[0] == 0x58);
  const Outcome got = run(p, x);
  REQUIRE(got.matmul == CUBLAS_STATUS_SUCCESS);
  CHECK(int{got.got.d[0]} == 0x58);
  CHECK(got.got.amax == 2.0);
  for (int64_t i = 1; i < p.m; ++i) CHECK(int{got.got.d[static_cast<size_t>(i)]} == 0);
  // amax_D of a bf16 D: the largest |D|.
  p.d_type = CUDA_R_16BF, p.scale_d = 0;
  const Outcome wide = run(p, x);
  REQUIRE(wide.matmul == CUBLAS_STATUS_SUCCESS);
  CHECK(wide.got.amax == 2.0);
}

TEST_CASE("FP8 products: each D element is one fp32 sum in increasing k", "[cublaslt][fp8]") {
  // Products 2^23, 2^23, 1, -2^23, -2^23 (then zeros): in increasing k the running fp32 sum is 2^24,
  // then 2^24 + 1 rounds to 2^24 (ties to even), then 2^23, then 0. The exact sum, and the reverse
  // order (-2^24 + 1 is representable), give 1.
  Fp8Product p;
  p.a_type = CUDA_R_8F_E5M2, p.b_type = CUDA_R_8F_E4M3, p.c_type = CUDA_R_32F, p.d_type = CUDA_R_32F;
  p.m = 4, p.n = 1, p.k = 16;
  Operands x = make_operands(p, 11);
  std::fill(x.a.begin(), x.a.end(), uint8_t{0});
  std::fill(x.b.begin(), x.b.end(), uint8_t{0});
  const uint8_t e5m2_2_15 = 0x78, e5m2_one = 0x3C, e4m3_256 = 0x78, e4m3_one = 0x38;
  const uint8_t a_column[5] = {e5m2_2_15, e5m2_2_15, e5m2_one, static_cast<uint8_t>(0x80 | e5m2_2_15),
                               static_cast<uint8_t>(0x80 | e5m2_2_15)};
  const uint8_t b_column[5] = {e4m3_256, e4m3_256, e4m3_one, e4m3_256, e4m3_256};
  for (int q = 0; q < 5; ++q) x.a[q] = a_column[q], x.b[q] = b_column[q];
  REQUIRE(test::decode(test::kE5M2, e5m2_2_15) * test::decode(test::kE4M3, e4m3_256) == std::ldexp(1.0, 23));
  const Outcome got = run(p, x);
  REQUIRE(got.matmul == CUBLAS_STATUS_SUCCESS);
  float d0;
  std::memcpy(&d0, got.got.d.data(), 4);
  CHECK(d0 == 0.0f);
}

TEST_CASE("FP8 products: the stand-in refuses what cuBLASLt refuses", "[cublaslt][fp8]") {
  const Operands x = make_operands(Fp8Product{}, 3);
  auto refused = [&](const Fp8Product& p, cublasStatus_t status) {
    const Operands operands = make_operands(p, 5);
    const Outcome got = run(p, operands);
    CHECK(got.heuristic == status);
    CHECK(got.matmul == status);
    const Outcome library = run(p, operands, true);
    CHECK(library.matmul == status);
  };
  const Fp8Product ok;
  {
    const Outcome got = run(ok, x);
    REQUIRE(got.heuristic == CUBLAS_STATUS_SUCCESS);
    REQUIRE(got.matmul == CUBLAS_STATUS_SUCCESS);
  }
  SECTION("scale pointers not 16-byte aligned (NOT_SUPPORTED on an H200), whenever they are set") {
    Fp8Product p = ok;
    p.scale_a = 0.5f, p.scale_b = 2.0f;
    for (const bool late : {false, true}) {
      CHECK(run(p, x, false, 0, late).matmul == CUBLAS_STATUS_SUCCESS);  // each at a 16-byte boundary
      p.scale_offset = 1;  // 4 bytes past the boundary
      const Outcome off = run(p, x, false, 0, late);
      CHECK(off.heuristic == CUBLAS_STATUS_SUCCESS);
      CHECK(off.matmul == CUBLAS_STATUS_NOT_SUPPORTED);
      CHECK(run(p, x, true, 0, late).matmul == CUBLAS_STATUS_NOT_SUPPORTED);
      p.scale_offset = 0;
    }
  }
  SECTION("E5M2 x E5M2") {
    Fp8Product p = ok;
    p.a_type = p.b_type = CUDA_R_8F_E5M2;
    refused(p, CUBLAS_STATUS_NOT_SUPPORTED);
  }
  SECTION("any form but TN (A transposed, B not)") {
    for (int32_t ta : {CUBLAS_OP_N, CUBLAS_OP_T})
      for (int32_t tb : {CUBLAS_OP_N, CUBLAS_OP_T}) {
        if (ta == CUBLAS_OP_T && tb == CUBLAS_OP_N) continue;
        Fp8Product p = ok;
        p.trans_a = ta, p.trans_b = tb;
        p.n = 16;  // every stored leading dimension (m, n or k) a multiple of 16: only the form is wrong
        INFO("transa " << ta << " transb " << tb);
        refused(p, CUBLAS_STATUS_NOT_SUPPORTED);
      }
  }
  SECTION("C and D types outside the table (or this subset of it)") {
    Fp8Product p = ok;
    p.d_type = CUDA_R_8F_E5M2;  // E4M3 x E4M3 has no E5M2 output
    refused(p, CUBLAS_STATUS_NOT_SUPPORTED);
    p.d_type = CUDA_R_8F_E4M3, p.c_type = CUDA_R_32F;  // an FP8 D takes a bf16 (or fp16) C
    refused(p, CUBLAS_STATUS_NOT_SUPPORTED);
    p.c_type = CUDA_R_8F_E4M3;  // C is never FP8
    refused(p, CUBLAS_STATUS_NOT_SUPPORTED);
    p.c_type = CUDA_R_32F, p.d_type = CUDA_R_16BF;  // C and D differ, neither FP8
    refused(p, CUBLAS_STATUS_NOT_SUPPORTED);
  }
  SECTION("epilogues other than bias, and a bias that is not bf16") {
    Fp8Product p = ok;
    p.epilogue = CUBLASLT_EPILOGUE_GELU;
    refused(p, CUBLAS_STATUS_NOT_SUPPORTED);
    p.epilogue = CUBLASLT_EPILOGUE_DEFAULT, p.bias = true, p.bias_type = CUDA_R_32F;
    refused(p, CUBLAS_STATUS_NOT_SUPPORTED);
  }
  SECTION("dimensions off the Tensor Core alignments") {
    Fp8Product p = ok;
    p.k = 24, p.lda = p.ldb = 32;  // k·1 byte not a multiple of 16 (the leading dimensions are)
    refused(p, CUBLAS_STATUS_NOT_SUPPORTED);
    p = ok, p.lda = p.k + 8;
    refused(p, CUBLAS_STATUS_NOT_SUPPORTED);
    p = ok, p.ldb = p.k + 4;
    refused(p, CUBLAS_STATUS_NOT_SUPPORTED);
    p = ok, p.m = 12, p.ldc = 16;  // 12 bf16 = 24 bytes (ldc's 32 bytes are fine)
    refused(p, CUBLAS_STATUS_NOT_SUPPORTED);
    p = ok, p.ldc = p.m + 4;
    refused(p, CUBLAS_STATUS_NOT_SUPPORTED);
    p = ok, p.c_type = p.d_type = CUDA_R_32F, p.m = 12;  // 12 fp32 = 48 bytes: allowed
    const Outcome got = run(p, make_operands(p, 9));
    CHECK(got.matmul == CUBLAS_STATUS_SUCCESS);
  }
  SECTION("an A pointer off 16-byte alignment") {
    const Outcome with_algo = run(ok, x, false, 8);
    CHECK(with_algo.heuristic == CUBLAS_STATUS_SUCCESS);
    CHECK(with_algo.matmul == CUBLAS_STATUS_INVALID_VALUE);  // less aligned than the algorithm assumed
    CHECK(run(ok, x, true, 8).matmul == CUBLAS_STATUS_NOT_SUPPORTED);  // no FP8 kernel takes it
    CHECK(run(ok, x, true, 16).matmul == CUBLAS_STATUS_SUCCESS);
  }
  SECTION("FP8 scaling on products it does not belong to") {
    Fp8Product p = ok;
    p.scale_d = 2.0f;  // D is bf16: scale_D is for an FP8 D
    refused(p, CUBLAS_STATUS_INVALID_VALUE);
  }
  SECTION("FP8 times bf16") {
    Fp8Product p = ok;
    p.b_type = CUDA_R_16BF;
    refused(p, CUBLAS_STATUS_NOT_SUPPORTED);
  }
}

TEST_CASE("scale and amax pointers on a bf16 product are refused", "[cublaslt][fp8]") {
  test::LtCall call;
  REQUIRE(cublasLtMatrixLayoutCreate(&call.a, CUDA_R_16BF, 16, 16, 16) == CUBLAS_STATUS_SUCCESS);
  REQUIRE(cublasLtMatrixLayoutCreate(&call.b, CUDA_R_16BF, 16, 16, 16) == CUBLAS_STATUS_SUCCESS);
  REQUIRE(cublasLtMatrixLayoutCreate(&call.c, CUDA_R_16BF, 16, 16, 16) == CUBLAS_STATUS_SUCCESS);
  REQUIRE(cublasLtMatrixLayoutCreate(&call.d, CUDA_R_16BF, 16, 16, 16) == CUBLAS_STATUS_SUCCESS);
  cublasLtMatmulHeuristicResult_t heuristic;
  REQUIRE(call.heuristic(&heuristic) == CUBLAS_STATUS_SUCCESS);
  test::DeviceBuffer<float> scalar(1);
  for (cublasLtMatmulDescAttributes_t attribute :
       {CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
        CUBLASLT_MATMUL_DESC_C_SCALE_POINTER, CUBLASLT_MATMUL_DESC_D_SCALE_POINTER,
        CUBLASLT_MATMUL_DESC_AMAX_D_POINTER}) {
    INFO("attribute " << attribute);
    REQUIRE(call.set(attribute, static_cast<void*>(scalar.ptr)) == CUBLAS_STATUS_SUCCESS);
    CHECK(call.heuristic(&heuristic) == CUBLAS_STATUS_INVALID_VALUE);
    REQUIRE(call.set(attribute, static_cast<void*>(nullptr)) == CUBLAS_STATUS_SUCCESS);
    CHECK(call.heuristic(&heuristic) == CUBLAS_STATUS_SUCCESS);
  }
}

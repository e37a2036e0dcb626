// matmul_fp8.cuh's three products against a double loop over the decoded FP8 codes (the codes'
// values from test/fp8_reference.h, written from the formats' fields): the forward with and without
// its bf16 bias, the input gradient written and accumulated, the weight gradient accumulated into a
// bf16 gradient, each with non-trivial scale_invs; shapes at cuBLASLt's FP8 minimum (16) and odd
// multiples of it; the refusal of a size that is not a multiple of 16. On the CPU build the
// products are simt's FP8 oracle; on a GPU, cuBLASLt's (fp32 sums in another order: one bf16
// rounding step apart at most). matmul_fp8_gradient against matmul_backward_bias (checked against
// CPU loops in test_matmul.cu): every E5M2 code of its g, as stored and transposed, from the E5M2
// table, dbias with the same bits, the amax, nothing written past the codes; with and without GELU
// and bias, at partial tiles and d48's width, and the shapes it refuses.
#include "test/fp8_copy_check.h"
#include "test/fp8_reference.h"
#include "test/test_util.h"
#include "kernels/matmul_fp8.cuh"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

namespace {

// n random codes of a format, finite and away from the extremes (|value| <= 4).
template <typename F8>
std::vector<F8> random_codes(const test::Format& f, size_t n, uint64_t seed) {
  std::vector<F8> codes(n);
  const std::vector<float> u = test::random_floats(n, seed, 4.0f);
  for (size_t i = 0; i < n; ++i) {
    const uint8_t code = test::expected_code(f, u[i], true);
    std::memcpy(&codes[i], &code, 1);
  }
  return codes;
}

template <typename F8>
double value(const test::Format& f, F8 x) {
  uint8_t code;
  std::memcpy(&code, &x, 1);
  return test::decode(f, code);
}

// got (bf16) against want (double) within one bf16 rounding of the exact value plus the fp32 sum's.
void check_close(const char* what, const std::vector<bf16>& got, const std::vector<double>& want) {
  REQUIRE(got.size() == want.size());
  size_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = static_cast<float>(got[i]), w = want[i];
    if (!(std::fabs(g - w) <= std::fabs(w) * (1.0 / 128) + 1e-3)) {
      if (bad++ < 5) UNSCOPED_INFO(what << "[" << i << "]: " << g << " vs " << w);
    }
  }
  CHECK(bad == 0);
}

void check_products(int rows, int C, int OC, bool bias) {
  INFO("rows " << rows << " C " << C << " OC " << OC << (bias ? " +bias" : ""));
  using test::kE4M3;
  using test::kE5M2;
  const std::vector<fp8e4m3> x = random_codes<fp8e4m3>(kE4M3, static_cast<size_t>(rows) * C, 1);
  const std::vector<fp8e4m3> w = random_codes<fp8e4m3>(kE4M3, static_cast<size_t>(OC) * C, 2);
  const std::vector<fp8e5m2> g = random_codes<fp8e5m2>(kE5M2, static_cast<size_t>(rows) * OC, 3);
  const float sx = 0.5f, sw = 3.0f, sg = 0.125f;  // the tensors' scale_invs
  const std::vector<float> b_host = test::round_to<bf16>(test::random_floats(OC, 4, 1.0f));
  // Transposed copies, as fp8_cast writes them.
  std::vector<fp8e4m3> wT(w.size()), xT(x.size());
  std::vector<fp8e5m2> gT(g.size());
  for (int o = 0; o < OC; ++o)
    for (int c = 0; c < C; ++c) wT[static_cast<size_t>(c) * OC + o] = w[static_cast<size_t>(o) * C + c];
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < C; ++c) xT[static_cast<size_t>(c) * rows + r] = x[static_cast<size_t>(r) * C + c];
    for (int o = 0; o < OC; ++o) gT[static_cast<size_t>(o) * rows + r] = g[static_cast<size_t>(r) * OC + o];
  }
  test::DeviceBuffer<fp8e4m3> d_x(x), d_w(w), d_wT(wT), d_xT(xT);
  test::DeviceBuffer<fp8e5m2> d_g(g), d_gT(gT);
  test::DeviceBuffer<float> d_sx(std::vector<float>{sx}), d_sw(std::vector<float>{sw}), d_sg(std::vector<float>{sg});
  test::DeviceBuffer<bf16> d_b(test::from_floats<bf16>(b_host));

  // forward: out = sx·sw · x @ w^T + b
  std::vector<double> want(static_cast<size_t>(rows) * OC);
  for (int r = 0; r < rows; ++r)
    for (int o = 0; o < OC; ++o) {
      double s = 0;
      for (int c = 0; c < C; ++c)
        s += value(kE4M3, x[static_cast<size_t>(r) * C + c]) * value(kE4M3, w[static_cast<size_t>(o) * C + c]);
      want[static_cast<size_t>(r) * OC + o] = s * sx * sw + (bias ? b_host[o] : 0.0);
    }
  test::DeviceBuffer<bf16> out(want.size());
  out.poison();
  matmul_fp8_forward(out, d_x, d_sx, d_w, d_sw, bias ? d_b.ptr : nullptr, rows, C, OC, nullptr);
  test::require_no_cuda_error();
  check_close("forward", out.download(), want);

  // input gradient: dinp = sg·sw · g @ w, written, then accumulated onto a start value
  std::vector<double> dinp(static_cast<size_t>(rows) * C);
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < C; ++c) {
      double s = 0;
      for (int o = 0; o < OC; ++o)
        s += value(kE5M2, g[static_cast<size_t>(r) * OC + o]) * value(kE4M3, w[static_cast<size_t>(o) * C + c]);
      dinp[static_cast<size_t>(r) * C + c] = s * sg * sw;
    }
  test::DeviceBuffer<bf16> d_dinp(dinp.size());
  d_dinp.poison();
  matmul_fp8_input_gradient(d_dinp, d_g, d_sg, d_wT, d_sw, rows, C, OC, false, nullptr);
  test::require_no_cuda_error();
  check_close("input gradient", d_dinp.download(), dinp);
  const std::vector<float> start = test::round_to<bf16>(test::random_floats(dinp.size(), 5, 1.0f));
  d_dinp.upload(test::from_floats<bf16>(start));
  matmul_fp8_input_gradient(d_dinp, d_g, d_sg, d_wT, d_sw, rows, C, OC, true, nullptr);
  std::vector<double> summed(dinp);
  for (size_t i = 0; i < summed.size(); ++i) summed[i] += start[i];
  check_close("input gradient, accumulated", d_dinp.download(), summed);

  // weight gradient: dweight += sg·sx · g^T @ x
  const std::vector<float> dw_start = test::round_to<bf16>(test::random_floats(w.size(), 6, 1.0f));
  std::vector<double> dweight(w.size());
  for (int o = 0; o < OC; ++o)
    for (int c = 0; c < C; ++c) {
      double s = 0;
      for (int r = 0; r < rows; ++r)
        s += value(kE5M2, g[static_cast<size_t>(r) * OC + o]) * value(kE4M3, x[static_cast<size_t>(r) * C + c]);
      dweight[static_cast<size_t>(o) * C + c] = s * sg * sx + dw_start[static_cast<size_t>(o) * C + c];
    }
  test::DeviceBuffer<bf16> d_dw(test::from_floats<bf16>(dw_start));
  matmul_fp8_weight_gradient(d_dw, d_gT, d_sg, d_xT, d_sx, rows, C, OC, nullptr);
  test::require_no_cuda_error();
  check_close("weight gradient", d_dw.download(), dweight);
}

// matmul_fp8_gradient on dout (and pre_gelu) against matmul_backward_bias's g and dbias (see the
// opening comment). nan: one of dout's values is a NaN.
void check_gradient(int rows, int OC, bool gelu, bool bias, uint64_t seed, bool nan = false) {
  INFO("rows " << rows << " OC " << OC << (gelu ? " GELU" : "") << (bias ? " +bias" : "") << (nan ? " NaN" : ""));
  constexpr float kAmaxStart = 0.25f, kScale = 700.0f;  // past E5M2's 57344 for the largest |g|
  const size_t n = static_cast<size_t>(rows) * OC;
  std::vector<float> dout = test::round_to<bf16>(test::random_floats(n, seed, 100.0f));
  if (nan) dout[n / 3] = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> pre = test::round_to<bf16>(test::random_floats(n, seed + 1, 3.0f));
  const std::vector<float> bias0 = test::round_to<bf16>(test::random_floats(OC, seed + 2));
  test::DeviceBuffer<bf16> d_dout(test::from_floats<bf16>(dout)), d_pre(test::from_floats<bf16>(pre)), d_g(n);
  test::DeviceBuffer<bf16> want_bias(test::from_floats<bf16>(bias0)), got_bias(test::from_floats<bf16>(bias0));
  matmul_backward_bias<bf16>(bias ? want_bias.ptr : nullptr, gelu ? d_g.ptr : nullptr, d_dout,
                             gelu ? d_pre.ptr : nullptr, rows, OC, nullptr);
  test::require_no_cuda_error();
  // Stage 1's fp32 partial sums (matmul_context.bias_partials), which show any other order of the
  // sums where dbias's bf16 rounding may hide it.
  const size_t partials = bias ? static_cast<size_t>(ceil_div(rows, 64)) * OC : 0;
  auto stage1 = [&] {
    std::vector<float> p(partials);
    CUDA_CHECK(cudaMemcpy(p.data(), matmul_context.bias_partials, partials * sizeof(float), cudaMemcpyDeviceToHost));
    return p;
  };
  const std::vector<float> want_partials = stage1();
  const std::vector<bf16> g = gelu ? d_g.download() : test::from_floats<bf16>(dout);
  test::DeviceBuffer<uint8_t> stored(n + test::kCodeGuard), transposed(n + test::kCodeGuard);
  test::DeviceBuffer<float> scale(std::vector<float>{kScale}), amax(std::vector<float>{kAmaxStart});
  matmul_fp8_gradient(reinterpret_cast<fp8e5m2*>(stored.ptr), reinterpret_cast<fp8e5m2*>(transposed.ptr), amax,
                      scale, bias ? got_bias.ptr : nullptr, d_dout, gelu ? d_pre.ptr : nullptr, rows, OC, nullptr);
  test::require_no_cuda_error();
  test::ExpectedCodes expected(test::kE5M2, kScale, kAmaxStart);
  const std::vector<uint8_t> got = stored.download();
  test::check_codes(expected, g, rows, OC, &got, transposed.download());
  expected.check_amax(amax.download()[0]);
  CHECK(test::bytes_of(got_bias.download()) == test::bytes_of(want_bias.download()));
  CHECK(test::same_bits(stage1(), want_partials));
}

}  // namespace

TEST_CASE("matmul_fp8: forward, input and weight gradients equal the decoded products", "[matmul][fp8]") {
  matmul_init();
  check_products(16, 16, 16, false);
  check_products(48, 32, 80, true);
  check_products(16, 112, 48, true);
  check_products(80, 48, 16, false);
}

TEST_CASE("matmul_fp8: a size that is not a multiple of 16 is refused", "[matmul][fp8]") {
  matmul_init();
  test::DeviceBuffer<fp8e4m3> x(24 * 16), w(16 * 16);
  test::DeviceBuffer<float> s(std::vector<float>{1.0f});
  test::DeviceBuffer<bf16> out(24 * 16);
  CHECK_THROWS_WITH(matmul_fp8_forward(out, x, s, w, s, nullptr, 24, 16, 16, nullptr),
                    Catch::Contains("multiple of 16"));
}

TEST_CASE("matmul_fp8_gradient: matmul_backward_bias's g cast to E5M2 both ways, its dbias bit for bit", "[matmul][fp8]") {
  matmul_init();
  uint64_t seed = 900;
  for (const bool gelu : {false, true}) {
    for (const bool bias : {false, true}) {
      if (!gelu && !bias) continue;  // plain g: fp8_cast's
      check_gradient(8, 8, gelu, bias, seed += 10);
      check_gradient(40, 136, gelu, bias, seed += 10);    // one partial chunk, a partial column tile
      check_gradient(64, 200, gelu, bias, seed += 10);
      check_gradient(192, 72, gelu, bias, seed += 10);    // three 64-row chunks
      check_gradient(8192, 8, gelu, bias, seed += 10);    // d48 B=8's rows: 128 chunks of 64
      check_gradient(64, 6400, gelu, bias, seed += 10);   // d48's MLP width
    }
    check_gradient(136, 40, gelu, false, seed += 10);     // rows that matmul_backward_bias chunks otherwise
  }
  check_gradient(64, 64, true, true, seed += 10, true);
}

TEST_CASE("matmul_fp8_gradient: shapes it cannot take are refused", "[matmul][fp8]") {
  matmul_init();
  CHECK(matmul_fp8_gradient_fits(8192, 6400, true));
  CHECK(matmul_fp8_gradient_fits(40, 8, true));
  CHECK_FALSE(matmul_fp8_gradient_fits(136, 40, true));  // matmul_backward_bias: 2 chunks of 68 rows
  CHECK(matmul_fp8_gradient_fits(136, 40, false));
  CHECK_FALSE(matmul_fp8_gradient_fits(32768, 64, true));  // 256 chunks of 128 rows
  CHECK_FALSE(matmul_fp8_gradient_fits(44, 8, false));
  test::DeviceBuffer<bf16> buf(136 * 40), bias(40);
  test::DeviceBuffer<uint8_t> codes(136 * 40);
  test::DeviceBuffer<float> s(std::vector<float>{1.0f});
  fp8e5m2* c = reinterpret_cast<fp8e5m2*>(codes.ptr);
  CHECK_THROWS_WITH(matmul_fp8_gradient(c, c, nullptr, s, bias, buf, nullptr, 136, 40, nullptr),
                    Catch::Contains("matmul_fp8_gradient: rows=136 out_features=40") &&
                        Catch::Contains("64-row chunks"));
  CHECK_THROWS_WITH(matmul_fp8_gradient(c, nullptr, nullptr, s, bias, buf, nullptr, 64, 40, nullptr),
                    Catch::Contains("the codes must be given"));
}

// The Linear layer (kernels/matmul.cuh) against plain CPU loops: forward with and without bias
// and tanh-GELU, backward (dinp written; dweight/dbias accumulated onto known values; the GELU
// gradient, separate and in place), the bias and GELU gradients at every preset's out_features
// (test/preset_shapes.h), determinism, the plain reference kernel, and cuBLASLt called
// directly (padded leading dimensions, alpha/beta, a separate C). In the CPU build the cuBLASLt
// calls are answered by simt/cublaslt.cpp; its refusals of what it does not implement are
// checked in simt_cublaslt.cpp.
#include "test/preset_shapes.h"
#include "test/test_util.h"

#include "kernels/matmul.cuh"
#include "test/cublaslt_call.h"

#include <cmath>
#include <cstring>

namespace {

struct Shape {
  int rows, C, OC;
};
// in/out features must be multiples of 8 (see matmul.cuh); rows are free.
const Shape kShapes[] = {{1, 24, 8}, {3, 40, 72}, {37, 24, 72}, {37, 40, 8}};

// Tolerances for sums of O(1) products: fp32 accumulation over up to 72 terms is off by a few
// 1e-6 absolute; bf16 results are rounded once (2^-9 relative), and an element of the GELU
// gradient may round to the neighbouring bf16 value when the reference's gelu' differs in the
// last fp32 bit, which moves a sum by about 2^-8 of one term.
template <typename T> struct MatmulTolerance;
template <> struct MatmulTolerance<float> { static constexpr double rel = 1e-5, abs = 2e-5; };
template <> struct MatmulTolerance<bf16> { static constexpr double rel = 1.6e-2, abs = 1e-2; };

template <typename T, typename W>
bool close(const std::string& what, const std::vector<T>& got, const std::vector<W>& want) {
  return test::all_close(what, got, want, MatmulTolerance<T>::rel, MatmulTolerance<T>::abs);
}

double gelu_ref(double x) {
  const double s = std::sqrt(2.0 / M_PI);
  return 0.5 * x * (1.0 + std::tanh(s * (x + 0.044715 * x * x * x)));
}
double gelu_grad_ref(double x) {
  const double s = std::sqrt(2.0 / M_PI);
  const double t = std::tanh(s * (x + 0.044715 * x * x * x));
  return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * s * (1.0 + 3.0 * 0.044715 * x * x);
}

// y[r, o] = Σ_c x[r, c]·w[o, c] (+ b[o]), in double.
std::vector<double> linear_ref(const std::vector<float>& x, const std::vector<float>& w, const std::vector<float>* b,
                               const Shape& s) {
  std::vector<double> y(static_cast<size_t>(s.rows) * s.OC);
  for (int r = 0; r < s.rows; ++r)
    for (int o = 0; o < s.OC; ++o) {
      double acc = b != nullptr ? (*b)[o] : 0.0;
      for (int c = 0; c < s.C; ++c) acc += static_cast<double>(x[r * s.C + c]) * w[o * s.C + c];
      y[r * s.OC + o] = acc;
    }
  return y;
}

// Inputs of one layer, already rounded to T; weights scaled so pre-activations are O(1)
// (GELU's curved region).
template <typename T>
struct LayerData {
  std::vector<float> inp, weight, bias;
  LayerData(const Shape& s, uint64_t seed)
      : inp(test::round_to<T>(test::random_floats(static_cast<size_t>(s.rows) * s.C, seed))),
        weight(test::round_to<T>(test::random_floats(static_cast<size_t>(s.OC) * s.C, seed + 1,
                                                     1.0f / std::sqrt(static_cast<float>(s.C))))),
        bias(test::round_to<T>(test::random_floats(s.OC, seed + 2, 0.5f))) {}
};

// matmul_init / matmul_destroy around each test case.
struct MatmulSession {
  MatmulSession() { matmul_init(); }
  ~MatmulSession() { matmul_destroy(); }
};

std::string describe(const Shape& s, bool bias, bool gelu) {
  return "rows=" + std::to_string(s.rows) + " C=" + std::to_string(s.C) + " OC=" + std::to_string(s.OC) +
         (bias ? " +bias" : "") + (gelu ? " +gelu" : "");
}

// One matmul_backward call against CPU loops (seed: its data).
template <typename T>
void check_backward(const Shape& s, bool with_bias, bool with_gelu, uint64_t seed) {
  // With GELU, the gradient w.r.t. the pre-activation goes to its own buffer without bias
  // and over dout (in place) with bias, so both uses are covered.
  const bool in_place = with_gelu && with_bias;
  INFO(describe(s, with_bias, with_gelu) << (in_place ? " (dpre_gelu = dout)" : ""));
  LayerData<T> data(s, seed);
  const size_t n_out = static_cast<size_t>(s.rows) * s.OC;
  const std::vector<float> dout_v = test::round_to<T>(test::random_floats(n_out, seed + 3));
  const std::vector<float> pre_v = test::round_to<T>(test::random_floats(n_out, seed + 4, 1.5f));
  const std::vector<float> dweight_v =
      test::round_to<T>(test::random_floats(static_cast<size_t>(s.OC) * s.C, seed + 5, 0.5f));
  const std::vector<float> dbias_v = test::round_to<T>(test::random_floats(s.OC, seed + 6, 0.5f));

  test::DeviceBuffer<T> inp(test::from_floats<T>(data.inp)), weight(test::from_floats<T>(data.weight));
  test::DeviceBuffer<T> dout(test::from_floats<T>(dout_v)), pre(test::from_floats<T>(pre_v));
  test::DeviceBuffer<T> dweight(test::from_floats<T>(dweight_v)), dbias(test::from_floats<T>(dbias_v));
  test::DeviceBuffer<T> dinp(static_cast<size_t>(s.rows) * s.C), dpre_separate(n_out);
  T* dpre = with_gelu ? (in_place ? dout.ptr : dpre_separate.ptr) : nullptr;
  matmul_backward<T>(dinp, dweight, with_bias ? dbias.ptr : nullptr, dpre, dout, inp, weight,
                     with_gelu ? pre.ptr : nullptr, s.rows, s.C, s.OC, nullptr);
  test::require_no_cuda_error();

  // g: the gradient the products see (rounded to T, as the kernel stores it).
  std::vector<float> g = dout_v;
  if (with_gelu) {
    for (size_t i = 0; i < n_out; ++i) g[i] = static_cast<float>(dout_v[i] * gelu_grad_ref(pre_v[i]));
    g = test::round_to<T>(g);
    CHECK(close("dpre_gelu", (in_place ? dout : dpre_separate).download(), g));
  } else {
    const std::vector<T> dout_after = dout.download();
    CHECK(std::memcmp(dout_after.data(), test::from_floats<T>(dout_v).data(), n_out * sizeof(T)) == 0);
  }
  std::vector<double> dinp_ref(static_cast<size_t>(s.rows) * s.C, 0.0);
  std::vector<double> dweight_ref(dweight_v.begin(), dweight_v.end());
  std::vector<double> dbias_ref(dbias_v.begin(), dbias_v.end());
  for (int r = 0; r < s.rows; ++r)
    for (int o = 0; o < s.OC; ++o) {
      const double go = g[r * s.OC + o];
      dbias_ref[o] += go;
      for (int c = 0; c < s.C; ++c) {
        dinp_ref[r * s.C + c] += go * data.weight[o * s.C + c];
        dweight_ref[o * s.C + c] += go * data.inp[r * s.C + c];
      }
    }
  // dinp sums OC products in fp32: beyond 4,096 terms its rounding error grows like sqrt(OC) (the
  // widest presets' MLP is 53,248 wide), so the absolute tolerance grows with it.
  const double sum_scale = std::max(1.0, std::sqrt(s.OC / 4096.0));
  CHECK(test::all_close("dinp", dinp.download(), dinp_ref, MatmulTolerance<T>::rel, MatmulTolerance<T>::abs * sum_scale));
  CHECK(close("dweight (prefilled, +=)", dweight.download(), dweight_ref));
  if (with_bias) {
    CHECK(close("dbias (prefilled, +=)", dbias.download(), dbias_ref));
  } else {
    const std::vector<T> dbias_after = dbias.download();
    CHECK(std::memcmp(dbias_after.data(), test::from_floats<T>(dbias_v).data(), s.OC * sizeof(T)) == 0);
  }

  // The weight gradient left for later (dweight nullptr: dweight untouched, dinp the same bits),
  // then matmul_weight_gradient from the g the call left (dpre_gelu, or dout): the same bits as
  // the whole call's (a zero-bubble pipeline's split backward).
  const std::vector<T> dinp_whole = dinp.download(), dweight_whole = dweight.download();
  test::DeviceBuffer<T> dout2(test::from_floats<T>(dout_v)), dweight2(test::from_floats<T>(dweight_v));
  test::DeviceBuffer<T> dpre2(n_out), dbias2(test::from_floats<T>(dbias_v));
  dinp.poison();
  T* dpre_later = with_gelu ? (in_place ? dout2.ptr : dpre2.ptr) : nullptr;
  matmul_backward<T>(dinp, static_cast<T*>(nullptr), with_bias ? dbias2.ptr : nullptr, dpre_later, dout2, inp, weight,
                     with_gelu ? pre.ptr : nullptr, s.rows, s.C, s.OC, nullptr);
  test::require_no_cuda_error();
  CHECK(test::bytes_of(dinp.download()) == test::bytes_of(dinp_whole));
  CHECK(test::bytes_of(dweight2.download()) == test::bytes_of(test::from_floats<T>(dweight_v)));
  matmul_weight_gradient<T>(dweight2, inp, with_gelu ? dpre_later : dout2.ptr, s.rows, s.C, s.OC, nullptr);
  test::require_no_cuda_error();
  CHECK(test::bytes_of(dweight2.download()) == test::bytes_of(dweight_whole));
}

}  // namespace

TEMPLATE_TEST_CASE("matmul_forward computes inp @ weight^T + bias", "[matmul]", float, bf16) {
  using T = TestType;
  MatmulSession session;
  uint64_t seed = 100;
  for (const Shape& s : kShapes)
    for (bool with_bias : {false, true}) {
      INFO(describe(s, with_bias, false));
      LayerData<T> data(s, seed += 20);
      test::DeviceBuffer<T> inp(test::from_floats<T>(data.inp)), weight(test::from_floats<T>(data.weight)),
          bias(test::from_floats<T>(data.bias));
      test::DeviceBuffer<T> out(static_cast<size_t>(s.rows) * s.OC);
      matmul_forward<T>(out, inp, weight, with_bias ? bias.ptr : nullptr, s.rows, s.C, s.OC, nullptr);
      test::require_no_cuda_error();
      CHECK(close("out", out.download(), linear_ref(data.inp, data.weight, with_bias ? &data.bias : nullptr, s)));
    }
}

// The launchers' argument checks throw (kernels/common.cuh's throw_error) instead of ending the process.
TEST_CASE("matmul launchers refuse bad arguments with an error naming the launcher", "[matmul]") {
  MatmulSession session;
  test::DeviceBuffer<float> out(4 * 16), inp(4 * 16), weight(16 * 16), grad(16 * 16);
  // Planted: in_features 12 (not a multiple of 8), pre_gelu without dpre_gelu, a count of 12.
  CHECK_THROWS_WITH(matmul_forward<float>(out, inp, weight, nullptr, 4, 12, 16, nullptr),
                    Catch::Contains("matmul_forward: rows=4 in_features=12 out_features=16"));
  CHECK_THROWS_WITH(matmul_backward<float>(inp, weight, nullptr, nullptr, out, inp, weight, out.ptr, 4, 16, 16, nullptr),
                    Catch::Contains("matmul_backward: pre_gelu and dpre_gelu must be given together"));
  CHECK_THROWS_WITH(matmul_add_weight_gradient<float>(weight, grad, 12, nullptr),
                    Catch::Contains("matmul_add_weight_gradient: count=12"));
  // The correct counterpart of the first.
  CHECK_NOTHROW(matmul_forward<float>(out, inp, weight, nullptr, 4, 16, 16, nullptr));
}

TEMPLATE_TEST_CASE("matmul_backward writes dinp and accumulates dweight and dbias", "[matmul]", float, bf16) {
  MatmulSession session;
  uint64_t seed = 500;
  for (const Shape& s : kShapes)
    for (bool with_bias : {false, true})
      for (bool with_gelu : {false, true}) check_backward<TestType>(s, with_bias, with_gelu, seed += 10);
}

// The bias-gradient and GELU-gradient kernels at each preset's widths: two rows of the model's
// out_features (QKV (NH + 2·NKV)·HS, projections C, MLP H with GELU). Their launches depend on out_features and
// rows only; in_features is kept at 8, since the products are cuBLASLt's, no kernel of ours.
TEMPLATE_TEST_CASE("matmul_backward's kernels launch and match at every preset's width", "[matmul]", float, bf16) {
  MatmulSession session;
  uint64_t seed = 900;
  for (const test::PresetShape& p : test::preset_shapes()) {
    INFO("presets " << p.presets);
    check_backward<TestType>(Shape{2, 8, p.QKV}, true, false, seed += 10);
    check_backward<TestType>(Shape{2, 8, p.C}, true, false, seed += 10);
    check_backward<TestType>(Shape{2, 8, p.H}, true, true, seed += 10);
  }
}

TEMPLATE_TEST_CASE("matmul_backward is deterministic and accumulates across calls", "[matmul]", float, bf16) {
  using T = TestType;
  MatmulSession session;
  // Enough rows for several bias-gradient chunks (64 rows each).
  const Shape s{200, 40, 72};
  LayerData<T> data(s, 900);
  const size_t n_out = static_cast<size_t>(s.rows) * s.OC;
  test::DeviceBuffer<T> inp(test::from_floats<T>(data.inp)), weight(test::from_floats<T>(data.weight));
  test::DeviceBuffer<T> dout(test::from_floats<T>(test::random_floats(n_out, 901)));
  test::DeviceBuffer<T> pre(test::from_floats<T>(test::random_floats(n_out, 902)));
  const std::vector<T> zero_dweight(static_cast<size_t>(s.OC) * s.C, T(0.0f)), zero_dbias(s.OC, T(0.0f));

  auto run = [&](int calls, std::vector<T>* dinp_out, std::vector<T>* dweight_out, std::vector<T>* dbias_out) {
    test::DeviceBuffer<T> dinp(static_cast<size_t>(s.rows) * s.C), dpre(n_out);
    test::DeviceBuffer<T> dweight(zero_dweight), dbias(zero_dbias);
    for (int i = 0; i < calls; ++i)
      matmul_backward<T>(dinp, dweight, dbias, dpre, dout, inp, weight, pre, s.rows, s.C, s.OC, nullptr);
    test::require_no_cuda_error();
    *dinp_out = dinp.download();
    *dweight_out = dweight.download();
    *dbias_out = dbias.download();
  };
  std::vector<T> dinp1, dweight1, dbias1, dinp1b, dweight1b, dbias1b, dinp2, dweight2, dbias2;
  run(1, &dinp1, &dweight1, &dbias1);
  run(1, &dinp1b, &dweight1b, &dbias1b);
  CHECK(std::memcmp(dinp1.data(), dinp1b.data(), dinp1.size() * sizeof(T)) == 0);
  CHECK(std::memcmp(dweight1.data(), dweight1b.data(), dweight1.size() * sizeof(T)) == 0);
  CHECK(std::memcmp(dbias1.data(), dbias1b.data(), dbias1.size() * sizeof(T)) == 0);

  run(2, &dinp2, &dweight2, &dbias2);
  std::vector<double> twice_dweight(dweight1.size()), twice_dbias(dbias1.size());
  for (size_t i = 0; i < dweight1.size(); ++i) twice_dweight[i] = 2.0 * static_cast<float>(dweight1[i]);
  for (size_t i = 0; i < dbias1.size(); ++i) twice_dbias[i] = 2.0 * static_cast<float>(dbias1[i]);
  CHECK(std::memcmp(dinp1.data(), dinp2.data(), dinp1.size() * sizeof(T)) == 0);  // written, not accumulated
  CHECK(close("dweight after two calls", dweight2, twice_dweight));
  CHECK(close("dbias after two calls", dbias2, twice_dbias));
}

// SwiGLU's two products of one input: the second matmul_backward adds its input gradient to the
// first's. dinp = g1 @ w1 + g2 @ w3 against a double loop.
TEMPLATE_TEST_CASE("matmul_backward with accumulate_input_gradient adds dinp", "[matmul]", float, bf16) {
  using T = TestType;
  MatmulSession session;
  const Shape s{37, 24, 40};
  LayerData<T> first(s, 1300), second(s, 1400);
  const size_t n_out = static_cast<size_t>(s.rows) * s.OC, n_in = static_cast<size_t>(s.rows) * s.C;
  const std::vector<float> g1 = test::random_floats(n_out, 1301), g2 = test::random_floats(n_out, 1401);
  test::DeviceBuffer<T> inp(test::from_floats<T>(first.inp)), w1(test::from_floats<T>(first.weight)),
      w3(test::from_floats<T>(second.weight)), dout1(test::from_floats<T>(g1)), dout2(test::from_floats<T>(g2));
  test::DeviceBuffer<T> dw1(std::vector<T>(static_cast<size_t>(s.OC) * s.C, T(0.0f))),
      dw3(std::vector<T>(static_cast<size_t>(s.OC) * s.C, T(0.0f)));
  test::DeviceBuffer<T> dinp(std::vector<T>(n_in, T(123.0f)));  // poisoned: the first call writes it
  matmul_backward<T>(dinp, dw1, nullptr, nullptr, dout1, inp, w1, nullptr, s.rows, s.C, s.OC, nullptr);
  matmul_backward<T>(dinp, dw3, nullptr, nullptr, dout2, inp, w3, nullptr, s.rows, s.C, s.OC, nullptr, nullptr, true);
  test::require_no_cuda_error();
  const std::vector<float> w1v = test::to_floats(test::from_floats<T>(first.weight)),
                           w3v = test::to_floats(test::from_floats<T>(second.weight)),
                           g1v = test::to_floats(test::from_floats<T>(g1)), g2v = test::to_floats(test::from_floats<T>(g2));
  std::vector<double> expected(n_in, 0.0);
  for (int r = 0; r < s.rows; ++r)
    for (int c = 0; c < s.C; ++c)
      for (int o = 0; o < s.OC; ++o)
        expected[static_cast<size_t>(r) * s.C + c] +=
            static_cast<double>(g1v[static_cast<size_t>(r) * s.OC + o]) * w1v[static_cast<size_t>(o) * s.C + c] +
            static_cast<double>(g2v[static_cast<size_t>(r) * s.OC + o]) * w3v[static_cast<size_t>(o) * s.C + c];
  CHECK(close("dinp of two products", dinp.download(), expected));
}

// The bias gradient's two stages at many rows: 16,411 rows make the most (256) row chunks of 65
// rows but the last (253 in all), so the second stage adds 16 rows of partials per thread; OC = 40
// and 72 leave its 32-column blocks partly used. Only dbias and the GELU gradient are checked:
// the products' fp32 sums over 16,411 rows are the cuBLASLt stand-in's, tested above at 37 rows.
TEMPLATE_TEST_CASE("matmul_backward's bias gradient over many row chunks", "[matmul]", float, bf16) {
  using T = TestType;
  MatmulSession session;
  uint64_t seed = 1100;
  for (const Shape& s : {Shape{16411, 8, 40}, Shape{16411, 8, 72}})
    for (bool with_gelu : {false, true}) {
      INFO(describe(s, true, with_gelu));
      LayerData<T> data(s, seed);
      const size_t n_out = static_cast<size_t>(s.rows) * s.OC;
      const std::vector<float> dout_v = test::round_to<T>(test::random_floats(n_out, seed + 3));
      const std::vector<float> pre_v = test::round_to<T>(test::random_floats(n_out, seed + 4, 1.5f));
      const std::vector<float> dbias_v = test::round_to<T>(test::random_floats(s.OC, seed + 6, 0.5f));
      test::DeviceBuffer<T> inp(test::from_floats<T>(data.inp)), weight(test::from_floats<T>(data.weight));
      test::DeviceBuffer<T> dout(test::from_floats<T>(dout_v)), pre(test::from_floats<T>(pre_v));
      test::DeviceBuffer<T> dinp(static_cast<size_t>(s.rows) * s.C), dweight(static_cast<size_t>(s.OC) * s.C);
      test::DeviceBuffer<T> dpre(n_out), dbias(test::from_floats<T>(dbias_v));
      auto run = [&] {
        dbias.upload(test::from_floats<T>(dbias_v));
        dpre.poison();
        matmul_backward<T>(dinp, dweight, dbias, with_gelu ? dpre.ptr : nullptr, dout, inp, weight,
                           with_gelu ? pre.ptr : nullptr, s.rows, s.C, s.OC, nullptr);
        test::require_no_cuda_error();
        return dbias.download();
      };
      const std::vector<T> dbias_first = run();
      std::vector<float> g = dout_v;
      if (with_gelu) {
        for (size_t i = 0; i < n_out; ++i) g[i] = static_cast<float>(dout_v[i] * gelu_grad_ref(pre_v[i]));
        g = test::round_to<T>(g);
        CHECK(close("dpre_gelu", dpre.download(), g));
      }
      std::vector<double> dbias_ref(dbias_v.begin(), dbias_v.end());
      for (int r = 0; r < s.rows; ++r)
        for (int o = 0; o < s.OC; ++o) dbias_ref[o] += g[static_cast<size_t>(r) * s.OC + o];
      CHECK(close("dbias (prefilled, +=)", dbias_first, dbias_ref));
      CHECK(test::bytes_of(run()) == test::bytes_of(dbias_first));  // the same bits again
    }
}

TEMPLATE_TEST_CASE("matmul_backward sums a float dweight over row blocks; matmul_add_weight_gradient rounds once",
                   "[matmul]", float, bf16) {
  using T = TestType;
  MatmulSession session;
  const Shape s{37, 40, 72};
  const int split = 10;  // row blocks [0, 10) and [10, 37)
  LayerData<T> data(s, 1300);
  const size_t n_out = static_cast<size_t>(s.rows) * s.OC, n_weight = static_cast<size_t>(s.OC) * s.C;
  const std::vector<float> dout_v = test::round_to<T>(test::random_floats(n_out, 1301));
  const std::vector<float> prefill_fp32 = test::random_floats(n_weight, 1302, 0.5f);
  const std::vector<float> prefill_t = test::round_to<T>(test::random_floats(n_weight, 1303, 0.5f));
  test::DeviceBuffer<T> inp(test::from_floats<T>(data.inp)), weight(test::from_floats<T>(data.weight));
  test::DeviceBuffer<T> dout(test::from_floats<T>(dout_v)), dinp(static_cast<size_t>(s.rows) * s.C);
  test::DeviceBuffer<float> dweight_fp32(prefill_fp32);
  for (int begin : {0, split}) {
    const int rows = begin == 0 ? split : s.rows - split;
    matmul_backward<T, float>(dinp.ptr + static_cast<size_t>(begin) * s.C, dweight_fp32.ptr, nullptr, nullptr,
                       dout.ptr + static_cast<size_t>(begin) * s.OC, inp.ptr + static_cast<size_t>(begin) * s.C,
                       weight, nullptr, rows, s.C, s.OC, nullptr);
  }
  test::require_no_cuda_error();
  std::vector<double> dweight_ref(prefill_fp32.begin(), prefill_fp32.end());
  for (int r = 0; r < s.rows; ++r)
    for (int o = 0; o < s.OC; ++o)
      for (int c = 0; c < s.C; ++c)
        dweight_ref[o * s.C + c] += static_cast<double>(dout_v[r * s.OC + o]) * data.inp[r * s.C + c];
  // Kept in fp32: the fp32 tolerance, whatever T is.
  const std::vector<float> summed = dweight_fp32.download();
  CHECK(test::all_close("fp32 dweight over two row blocks", summed, dweight_ref, MatmulTolerance<float>::rel,
                        MatmulTolerance<float>::abs));

  test::DeviceBuffer<T> dweight(test::from_floats<T>(prefill_t));
  matmul_add_weight_gradient(dweight.ptr, dweight_fp32.ptr, n_weight, nullptr);
  test::require_no_cuda_error();
  // One rounding of (prefill + fp32 sum) per element: bit for bit.
  const std::vector<T> added = dweight.download();
  const std::vector<T> want = test::from_floats<T>([&] {
    std::vector<float> v(n_weight);
    for (size_t i = 0; i < n_weight; ++i) v[i] = prefill_t[i] + summed[i];
    return v;
  }());
  CHECK(std::memcmp(added.data(), want.data(), n_weight * sizeof(T)) == 0);
}

// ---- cuBLASLt called directly.


TEMPLATE_TEST_CASE("cuBLASLt: padded leading dimensions, alpha/beta with a separate C, GELU_BIAS", "[matmul][cublaslt]",
                   float, bf16) {
  using T = TestType;
  constexpr cudaDataType_t type = matmul_data_type<T>();
  // D (m × n, ldd 40) = gelu(2·op(A)·B + 0.5·C + bias), op(A) = A^T with A stored k × m (lda 24),
  // B stored k × n (ldb 24), C m × n (ldc 32). Padding holds NaN: it must never be read.
  const int m = 24, n = 5, k = 16, lda = 24, ldb = 24, ldc = 32, ldd = 40;
  const float alpha = 2.0f, beta = 0.5f;
  std::vector<float> a_v = test::round_to<T>(test::random_floats(static_cast<size_t>(lda) * m, 31, 0.25f));
  std::vector<float> b_v = test::round_to<T>(test::random_floats(static_cast<size_t>(ldb) * n, 32));
  std::vector<float> c_v = test::round_to<T>(test::random_floats(static_cast<size_t>(ldc) * n, 33));
  std::vector<float> bias_v = test::round_to<T>(test::random_floats(m, 34, 0.5f));
  for (int j = 0; j < m; ++j)
    for (int i = k; i < lda; ++i) a_v[i + j * lda] = NAN;
  for (int j = 0; j < n; ++j) {
    for (int i = k; i < ldb; ++i) b_v[i + j * ldb] = NAN;
    for (int i = m; i < ldc; ++i) c_v[i + j * ldc] = NAN;
  }
  test::DeviceBuffer<T> a(test::from_floats<T>(a_v)), b(test::from_floats<T>(b_v)), c(test::from_floats<T>(c_v)),
      bias(test::from_floats<T>(bias_v)), d(static_cast<size_t>(ldd) * n);

  test::LtCall call;
  REQUIRE(call.set(CUBLASLT_MATMUL_DESC_TRANSA, static_cast<int32_t>(CUBLAS_OP_T)) == CUBLAS_STATUS_SUCCESS);
  REQUIRE(call.set(CUBLASLT_MATMUL_DESC_EPILOGUE, static_cast<uint32_t>(CUBLASLT_EPILOGUE_GELU_BIAS)) ==
          CUBLAS_STATUS_SUCCESS);
  REQUIRE(call.set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, static_cast<const void*>(bias.ptr)) == CUBLAS_STATUS_SUCCESS);
  REQUIRE(cublasLtMatrixLayoutCreate(&call.a, type, k, m, lda) == CUBLAS_STATUS_SUCCESS);
  REQUIRE(cublasLtMatrixLayoutCreate(&call.b, type, k, n, ldb) == CUBLAS_STATUS_SUCCESS);
  REQUIRE(cublasLtMatrixLayoutCreate(&call.c, type, m, n, ldc) == CUBLAS_STATUS_SUCCESS);
  REQUIRE(cublasLtMatrixLayoutCreate(&call.d, type, m, n, ldd) == CUBLAS_STATUS_SUCCESS);
  cublasLtMatmulHeuristicResult_t heuristic;
  REQUIRE(call.heuristic(&heuristic) == CUBLAS_STATUS_SUCCESS);
  REQUIRE(cublasLtMatmul(call.handle, call.desc, &alpha, a, call.a, b, call.b, &beta, c, call.c, d, call.d,
                         &heuristic.algo, nullptr, 0, nullptr) == CUBLAS_STATUS_SUCCESS);
  test::require_no_cuda_error();

  const std::vector<T> got = d.download();
  std::vector<T> got_packed;
  std::vector<double> want;
  for (int j = 0; j < n; ++j)
    for (int i = 0; i < m; ++i) {
      double acc = 0.0;
      for (int p = 0; p < k; ++p) acc += static_cast<double>(a_v[p + i * lda]) * b_v[p + j * ldb];
      want.push_back(gelu_ref(alpha * acc + beta * c_v[i + j * ldc] + bias_v[i]));
      got_packed.push_back(got[i + j * ldd]);
    }
  CHECK(close("D", got_packed, want));
}

TEST_CASE("cuBLASLt rejects malformed attributes and requests", "[matmul][cublaslt]") {
  test::LtCall call;
  const int32_t op = CUBLAS_OP_T;
  // Attribute sizes must match exactly (documented for every SetAttribute).
  CHECK(cublasLtMatmulDescSetAttribute(call.desc, CUBLASLT_MATMUL_DESC_TRANSA, &op, 8) == CUBLAS_STATUS_INVALID_VALUE);
  CHECK(cublasLtMatmulDescSetAttribute(call.desc, CUBLASLT_MATMUL_DESC_TRANSA, nullptr, 4) ==
        CUBLAS_STATUS_INVALID_VALUE);
  const uint32_t workspace = 0;  // the attribute is uint64_t
  CHECK(cublasLtMatmulPreferenceSetAttribute(call.preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace,
                                             sizeof(workspace)) == CUBLAS_STATUS_INVALID_VALUE);
  REQUIRE(cublasLtMatrixLayoutCreate(&call.a, CUDA_R_32F, 8, 8, 8) == CUBLAS_STATUS_SUCCESS);
  REQUIRE(cublasLtMatrixLayoutCreate(&call.b, CUDA_R_32F, 8, 8, 8) == CUBLAS_STATUS_SUCCESS);
  REQUIRE(cublasLtMatrixLayoutCreate(&call.c, CUDA_R_32F, 8, 8, 8) == CUBLAS_STATUS_SUCCESS);
  REQUIRE(cublasLtMatrixLayoutCreate(&call.d, CUDA_R_32F, 8, 8, 8) == CUBLAS_STATUS_SUCCESS);
  cublasLtMatmulHeuristicResult_t result;
  int found = 0;
  CHECK(cublasLtMatmulAlgoGetHeuristic(call.handle, call.desc, call.a, call.b, call.c, call.d, call.preference, 0,
                                       &result, &found) == CUBLAS_STATUS_INVALID_VALUE);
}

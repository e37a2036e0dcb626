// Causal multi-head and grouped-query attention, forward (out, lse) and backward (dqkv), against
// a naive CPU implementation in double: full T×T score matrix, causal mask, softmax, matrix
// products; with NKV < NH K/V heads, query head h uses K/V head h / (NH / NKV) and a K/V head's
// gradients add up its query heads' terms. Odd shapes, and every preset's heads
// (test/preset_shapes.h).
#include "test/preset_shapes.h"
#include "test/test_util.h"
#include "kernels/attention.cuh"

#include <cstring>

namespace {

struct AttentionShape {
  int B, T, NH, HS;
  float input_scale;  // std of the random q, k, v; large values make the softmax nearly one-hot
  int NKV = 0;        // K/V heads, dividing NH; 0: NH (multi-head attention)
};

struct ReferenceAttention {
  std::vector<double> out, lse, dqkv;
  double max_abs_score = 0.0;  // largest |q·k|/sqrt(HS) over unmasked pairs
};

// Naive attention over qkv (B, T, (NH + 2·NKV)·HS): NH query heads, then NKV key and NKV value
// heads. dout may be empty (forward only). The softmax backward needs D_t = rowsum(P ∘ dP)_t =
// dout_t · out_t; it is taken from out_seen when given (the rounded out a bf16 backward is
// handed), else computed exactly from P and dP.
ReferenceAttention reference_gqa_attention(const std::vector<double>& qkv, const std::vector<double>& dout, int B,
                                           int T, int NH, int NKV, int HS,
                                           const std::vector<double>* out_seen = nullptr) {
  const int C = NH * HS, W = (NH + 2 * NKV) * HS;
  const double scale = 1.0 / std::sqrt(static_cast<double>(HS));
  // Channel i: part 0 of query head h, part 1 (k) and 2 (v) of K/V head h / (NH / NKV).
  auto channel = [&](int part, int h, int i) {
    return part == 0 ? h * HS + i : C + (part - 1) * NKV * HS + h / (NH / NKV) * HS + i;
  };
  auto at = [&](const std::vector<double>& x, int b, int t, int part, int h, int i) -> double {
    return x[(static_cast<size_t>(b) * T + t) * W + channel(part, h, i)];
  };
  ReferenceAttention r;
  r.out.assign(static_cast<size_t>(B) * T * C, 0.0);
  r.lse.assign(static_cast<size_t>(B) * NH * T, 0.0);
  r.dqkv.assign(static_cast<size_t>(B) * T * W, 0.0);
  std::vector<double> P(static_cast<size_t>(T) * T), dP(static_cast<size_t>(T) * T), dS(static_cast<size_t>(T) * T);
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < NH; ++h) {
      for (int t = 0; t < T; ++t) {
        std::vector<double> score(T, -INFINITY);
        double max_score = -INFINITY;
        for (int s = 0; s <= t; ++s) {
          double dot = 0.0;
          for (int i = 0; i < HS; ++i) dot += at(qkv, b, t, 0, h, i) * at(qkv, b, s, 1, h, i);
          score[s] = dot * scale;
          r.max_abs_score = std::max(r.max_abs_score, std::fabs(score[s]));
          max_score = std::max(max_score, score[s]);
        }
        double sum = 0.0;
        for (int s = 0; s < T; ++s) sum += std::exp(score[s] - max_score);  // masked: exp(-inf) = 0
        for (int s = 0; s < T; ++s) P[t * T + s] = std::exp(score[s] - max_score) / sum;
        r.lse[(static_cast<size_t>(b) * NH + h) * T + t] = max_score + std::log(sum);
        for (int i = 0; i < HS; ++i) {
          double o = 0.0;
          for (int s = 0; s < T; ++s) o += P[t * T + s] * at(qkv, b, s, 2, h, i);
          r.out[(static_cast<size_t>(b) * T + t) * C + h * HS + i] = o;
        }
      }
      if (dout.empty()) continue;
      auto dout_at = [&](int t, int i) { return dout[(static_cast<size_t>(b) * T + t) * C + h * HS + i]; };
      auto dqkv_at = [&](int t, int part, int i) -> double& {
        return r.dqkv[(static_cast<size_t>(b) * T + t) * W + channel(part, h, i)];
      };
      // dP = dout·Vᵀ; softmax backward dS = P ∘ (dP − D), D = rowsum(P ∘ dP).
      for (int t = 0; t < T; ++t) {
        double row = 0.0;
        for (int s = 0; s < T; ++s) {
          double d = 0.0;
          for (int i = 0; i < HS; ++i) d += dout_at(t, i) * at(qkv, b, s, 2, h, i);
          dP[t * T + s] = d;
          row += P[t * T + s] * d;
        }
        if (out_seen) {
          row = 0.0;
          for (int i = 0; i < HS; ++i) {
            row += dout_at(t, i) * (*out_seen)[(static_cast<size_t>(b) * T + t) * C + h * HS + i];
          }
        }
        for (int s = 0; s < T; ++s) dS[t * T + s] = P[t * T + s] * (dP[t * T + s] - row);
      }
      for (int t = 0; t < T; ++t) {
        for (int i = 0; i < HS; ++i) {
          double dq = 0.0, dk = 0.0, dv = 0.0;
          for (int u = 0; u < T; ++u) {
            dq += dS[t * T + u] * at(qkv, b, u, 1, h, i);       // dQ = scale · dS · K
            dk += dS[u * T + t] * at(qkv, b, u, 0, h, i);       // dK = scale · dSᵀ · Q
            dv += P[u * T + t] * dout_at(u, i);                 // dV = Pᵀ · dout
          }
          dqkv_at(t, 0, i) = scale * dq;
          dqkv_at(t, 1, i) += scale * dk;  // K/V heads: the sum over the query heads sharing them
          dqkv_at(t, 2, i) += dv;
        }
      }
    }
  }
  return r;
}

// Multi-head attention: qkv (B, T, 3C).
ReferenceAttention reference_attention(const std::vector<double>& qkv, const std::vector<double>& dout, int B, int T,
                                       int NH, int HS, const std::vector<double>* out_seen = nullptr) {
  return reference_gqa_attention(qkv, dout, B, T, NH, NH, HS, out_seen);
}

std::vector<double> to_doubles(const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); }

double max_abs(const std::vector<double>& v) {
  double m = 0.0;
  for (double x : v) m = std::max(m, std::fabs(x));
  return m;
}


// One shape: forward and backward against reference_gqa_attention, then a second run (outputs
// re-poisoned) that must give the same bits. Uses seeds `seed` and `seed + 1` and advances it.
template <typename T>
void check_attention(const AttentionShape& shape, uint64_t& seed) {
  const bool is_bf16 = sizeof(T) == 2;
  const int B = shape.B, T_ = shape.T, NH = shape.NH, HS = shape.HS, C = NH * HS;
  const int NKV = shape.NKV ? shape.NKV : NH;
  INFO("B=" << B << " T=" << T_ << " NH=" << NH << " NKV=" << NKV << " HS=" << HS << " input std="
            << shape.input_scale);
  const size_t qkv_n = static_cast<size_t>(B) * T_ * (C + 2 * NKV * HS), out_n = static_cast<size_t>(B) * T_ * C;
  const size_t lse_n = static_cast<size_t>(B) * NH * T_;
  std::vector<float> qkv_host = test::round_to<T>(test::random_floats(qkv_n, seed++, shape.input_scale));
  std::vector<float> dout_host = test::round_to<T>(test::random_floats(out_n, seed++));

  test::DeviceBuffer<T> qkv(test::from_floats<T>(qkv_host)), dout(test::from_floats<T>(dout_host));
  test::DeviceBuffer<T> out(out_n), dqkv(qkv_n);
  test::DeviceBuffer<float> lse(lse_n);
  test::DeviceBuffer<float> scratch(attention_backward_scratch_bytes(B, T_, NH) / sizeof(float));
  REQUIRE(attention_backward_scratch_bytes(B, T_, NH) == lse_n * sizeof(float));

  attention_forward<T>(out, lse, qkv, B, T_, C, NH, NKV, nullptr);
  test::require_no_cuda_error();
  // The backward consumes the forward's own out and lse, as in training.
  attention_backward<T>(dqkv, scratch, dout, qkv, out, lse, B, T_, C, NH, NKV, nullptr);
  test::require_no_cuda_error();
  std::vector<T> out_got = out.download(), dqkv_got = dqkv.download();
  std::vector<float> lse_got = lse.download();

  // fp32: the exact gradient. bf16: the backward is handed out rounded to bf16 (a ~2^-9 relative
  // error in D, amplified by |v| and |k| for sharp inputs), so the reference uses that same out.
  std::vector<double> out_seen = to_doubles(test::to_floats(out_got));
  ReferenceAttention want = reference_gqa_attention(to_doubles(qkv_host), to_doubles(dout_host), B, T_, NH, NKV, HS,
                                                    is_bf16 ? &out_seen : nullptr);
  // out: fp32 math, then one rounding to T. An fp32 score s is off by ~|s|·2^-24 per operation and
  // the exponential turns that into the same relative error of its weight, so with large scores
  // (sharp inputs) the absolute error grows like max|score|·max|v|.
  const double out_abs = test::Tolerance<T>::abs + 4 * 0x1p-24 * want.max_abs_score * max_abs(to_doubles(qkv_host));
  CHECK(test::all_close("out", out_got, want.out, test::Tolerance<T>::rel, out_abs));
  // lse is fp32 for both storage types and sees the same (rounded) inputs as the reference.
  CHECK(test::all_close("lse", lse_got, want.lse, 1e-5, 1e-5));
  // Gradients: entries near zero come from cancellation in dS = P(dP - D), so the absolute
  // tolerance is relative to the tensor's largest entry.
  const double grad_rel = is_bf16 ? 1e-2 : 1e-4, grad_abs = (is_bf16 ? 5e-3 : 1e-5) * max_abs(want.dqkv);
  CHECK(test::all_close("dqkv", dqkv_got, want.dqkv, grad_rel, grad_abs));

  // Same inputs → same bits, with every output re-poisoned in between.
  out.poison();
  lse.poison();
  dqkv.poison();
  scratch.poison();
  attention_forward<T>(out, lse, qkv, B, T_, C, NH, NKV, nullptr);
  attention_backward<T>(dqkv, scratch, dout, qkv, out, lse, B, T_, C, NH, NKV, nullptr);
  test::require_no_cuda_error();
  CHECK(test::same_bits(out.download(), out_got));
  CHECK(test::same_bits(lse.download(), lse_got));
  CHECK(test::same_bits(dqkv.download(), dqkv_got));
}

}  // namespace

// The reference's backward is itself checked: central differences of L = sum(out ∘ dout).
TEST_CASE("attention reference backward matches finite differences", "[attention]") {
  const int B = 2, T = 4, NH = 2, HS = 3, C = NH * HS;
  std::vector<double> qkv = to_doubles(test::random_floats(static_cast<size_t>(B) * T * 3 * C, 11));
  std::vector<double> dout = to_doubles(test::random_floats(static_cast<size_t>(B) * T * C, 12));
  std::vector<double> analytic = reference_attention(qkv, dout, B, T, NH, HS).dqkv;
  auto loss = [&](const std::vector<double>& x) {
    std::vector<double> out = reference_attention(x, {}, B, T, NH, HS).out;
    double l = 0.0;
    for (size_t i = 0; i < out.size(); ++i) l += out[i] * dout[i];
    return l;
  };
  const double eps = 1e-5;
  std::vector<double> numeric(qkv.size());
  for (size_t i = 0; i < qkv.size(); ++i) {
    std::vector<double> x = qkv;
    x[i] = qkv[i] + eps;
    double up = loss(x);
    x[i] = qkv[i] - eps;
    numeric[i] = (up - loss(x)) / (2 * eps);
  }
  // Central differences in double: truncation ~eps² and cancellation ~1e-16/eps, both far below 1e-7.
  CHECK(test::all_close("reference dqkv vs finite differences", analytic, numeric, 1e-6, 1e-7));
  // Non-trivial gradients, so the comparison above means something.
  CHECK(max_abs(analytic) > 0.1);
}

TEMPLATE_TEST_CASE("attention forward and backward match naive CPU loops", "[attention]", float, bf16) {
  using T = TestType;
  const AttentionShape shapes[] = {
      {1, 1, 1, 8, 1.0f},    {3, 1, 4, 16, 1.0f},  {1, 7, 2, 16, 1.0f},  {2, 7, 3, 8, 1.0f},
      {3, 33, 4, 64, 1.0f},  {2, 33, 2, 24, 1.0f}, {1, 17, 2, 128, 1.0f}, {2, 17, 2, 16, 5.0f},
  };
  uint64_t seed = 100;
  for (const AttentionShape& shape : shapes) check_attention<T>(shape, seed);
}

// Every preset's heads (all NH of them on its NKV K/V heads, its head size): one sequence of 3 rows.
TEMPLATE_TEST_CASE("attention launches and matches at every preset's heads", "[attention]", float, bf16) {
  uint64_t seed = 700;
  for (const test::PresetShape& p : test::preset_shapes()) {
    INFO("presets " << p.presets);
    check_attention<TestType>({1, 3, p.NH, p.head_size, 1.0f, p.NKV}, seed);
  }
}

// The GQA reference's backward (a K/V head's gradient summed over its query heads) against
// central differences, as above: NH 4 query heads on NKV 2 K/V heads.
TEST_CASE("grouped-query attention reference backward matches finite differences", "[attention]") {
  const int B = 2, T = 4, NH = 4, NKV = 2, HS = 3, W = (NH + 2 * NKV) * HS;
  std::vector<double> qkv = to_doubles(test::random_floats(static_cast<size_t>(B) * T * W, 13));
  std::vector<double> dout = to_doubles(test::random_floats(static_cast<size_t>(B) * T * NH * HS, 14));
  std::vector<double> analytic = reference_gqa_attention(qkv, dout, B, T, NH, NKV, HS).dqkv;
  auto loss = [&](const std::vector<double>& x) {
    std::vector<double> out = reference_gqa_attention(x, {}, B, T, NH, NKV, HS).out;
    double l = 0.0;
    for (size_t i = 0; i < out.size(); ++i) l += out[i] * dout[i];
    return l;
  };
  const double eps = 1e-5;
  std::vector<double> numeric(qkv.size());
  for (size_t i = 0; i < qkv.size(); ++i) {
    std::vector<double> x = qkv;
    x[i] = qkv[i] + eps;
    double up = loss(x);
    x[i] = qkv[i] - eps;
    numeric[i] = (up - loss(x)) / (2 * eps);
  }
  CHECK(test::all_close("GQA reference dqkv vs finite differences", analytic, numeric, 1e-6, 1e-7));
  CHECK(max_abs(analytic) > 0.1);
}

// Grouped-query attention: NKV = 1, NH/2 and NH K/V heads; T = 1, odd T; head sizes 16, 64 and
// 128; a group of 3 (NH 6, NKV 2); sharp inputs; Llama 3.1 8B's heads (NH 32, NKV 8, HS 128) on
// a few rows.
TEMPLATE_TEST_CASE("grouped-query attention forward and backward match naive CPU loops", "[attention]", float,
                   bf16) {
  using T = TestType;
  const AttentionShape shapes[] = {
      {1, 1, 4, 16, 1.0f, 1},  {2, 1, 4, 64, 1.0f, 2},  {2, 7, 4, 16, 1.0f, 1},  {1, 7, 4, 64, 1.0f, 4},
      {2, 33, 4, 64, 1.0f, 2}, {1, 17, 6, 16, 1.0f, 2}, {1, 17, 4, 128, 1.0f, 1}, {2, 17, 4, 16, 5.0f, 2},
      {1, 3, 32, 128, 1.0f, 8},
  };
  uint64_t seed = 500;
  for (const AttentionShape& shape : shapes) check_attention<T>(shape, seed);
}

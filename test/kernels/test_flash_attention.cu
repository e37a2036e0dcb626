// Flash attention (kernels/flash_attention.cuh), forward (out, lse) and backward (dQ, dK, dV),
// against a plain double-precision CPU loop and against the simple kernel of attention.cuh;
// head dims 64 and 128, sequence lengths with and without tails, several batches and heads,
// multi-head and grouped-query (NKV < NH K/V heads, each serving NH/NKV query heads, dK and dV
// summed over them); every output poisoned first and reproduced bit for bit by a second run;
// every preset whose head size flash attention takes, with all its heads (test/preset_shapes.h).
#include "test/preset_shapes.h"
#include "test/test_util.h"
#include "kernels/attention.cuh"
#include "kernels/flash_attention.cuh"

#include <algorithm>
#include <cstdio>
#include <limits>

namespace {

struct FlashShape {
  int B, T, NH, HD;
  float input_std;  // std of the random q, k, v; large values make the softmax nearly one-hot
  int NKV = 0;      // K/V heads, dividing NH; 0: NH (multi-head attention)
  int kv_heads() const { return NKV ? NKV : NH; }
};

// Exact attention over the (bf16-valued) inputs, in double, plus two magnitudes per output
// element that bound what the kernels' roundings can do to it (see the tolerances below):
// qkv rows hold NH query heads, then NKV key and NKV value heads; query head h attends with K/V
// head h / (NH / NKV), so a K/V head's dK and dV add up the terms of all its query heads.
//  mag: the sum of the absolute values of the terms the element adds up, Σ|P_tu v_u| for O,
//       Σ|P_ut dout_u| for dV, scale·Σ|dS_tu k_u| for dQ and scale·Σ|dS_ut q_u| for dK, where the
//       kernels round P or dS to bf16 before the last product;
//  cancel: for dQ and dK, the same sums with |dS_tu| replaced by P_tu·Σ_i|dout_ti|(|v_ui| + |out_ti|),
//       the magnitudes behind dP_tu − D_t, whose fp32 difference can cancel to nothing.
struct Reference {
  std::vector<double> out, out_mag, lse, dqkv, dqkv_mag, dqkv_cancel;
  double score_mag = 0.0;  // largest scale·Σ|q_i k_i| over unmasked pairs: bounds fp32 error in a score
};

// dout may be empty (forward only). D_t = dout_t · out_t uses out_seen, the bf16 out the
// backward is handed (as the kernels do), so the reference differentiates what they see.
Reference reference(const std::vector<float>& qkv, const std::vector<float>& dout, const std::vector<float>& out_seen,
                    const FlashShape& s) {
  const int T = s.T, NH = s.NH, HD = s.HD, C = NH * HD, NKV = s.kv_heads(), W = (NH + 2 * NKV) * HD;
  const double scale = 1.0 / std::sqrt(static_cast<double>(HD));
  // Channel i of row t: part 0 of query head h, part 1 (k) and 2 (v) of K/V head h / (NH / NKV).
  auto channel = [&](int part, int h, int i) {
    return part == 0 ? h * HD + i : C + (part - 1) * NKV * HD + h / (NH / NKV) * HD + i;
  };
  auto x = [&](int b, int t, int part, int h, int i) -> double {
    return qkv[(static_cast<size_t>(b) * T + t) * W + channel(part, h, i)];
  };
  Reference r;
  r.out.assign(static_cast<size_t>(s.B) * T * C, 0.0);
  r.out_mag = r.out;
  r.lse.assign(static_cast<size_t>(s.B) * NH * T, 0.0);
  r.dqkv.assign(static_cast<size_t>(s.B) * T * W, 0.0);
  r.dqkv_mag = r.dqkv;
  r.dqkv_cancel = r.dqkv;
  std::vector<double> P(static_cast<size_t>(T) * T), dS(static_cast<size_t>(T) * T), dS_mag(static_cast<size_t>(T) * T);
  for (int b = 0; b < s.B; ++b) {
    for (int h = 0; h < NH; ++h) {
      for (int t = 0; t < T; ++t) {
        double max_score = -INFINITY;
        for (int u = 0; u <= t; ++u) {
          double dot = 0.0, mag = 0.0;
          for (int i = 0; i < HD; ++i) {
            dot += x(b, t, 0, h, i) * x(b, u, 1, h, i);
            mag += std::fabs(x(b, t, 0, h, i) * x(b, u, 1, h, i));
          }
          P[t * T + u] = dot * scale;
          r.score_mag = std::max(r.score_mag, mag * scale);
          max_score = std::max(max_score, dot * scale);
        }
        double sum = 0.0;
        for (int u = 0; u <= t; ++u) sum += std::exp(P[t * T + u] - max_score);
        for (int u = 0; u <= t; ++u) P[t * T + u] = std::exp(P[t * T + u] - max_score) / sum;
        r.lse[(static_cast<size_t>(b) * NH + h) * T + t] = max_score + std::log(sum);
        for (int i = 0; i < HD; ++i) {
          double o = 0.0, mag = 0.0;
          for (int u = 0; u <= t; ++u) {
            o += P[t * T + u] * x(b, u, 2, h, i);
            mag += P[t * T + u] * std::fabs(x(b, u, 2, h, i));
          }
          r.out[(static_cast<size_t>(b) * T + t) * C + h * HD + i] = o;
          r.out_mag[(static_cast<size_t>(b) * T + t) * C + h * HD + i] = mag;
        }
      }
      if (dout.empty()) continue;
      auto dy = [&](int t, int i) -> double { return dout[(static_cast<size_t>(b) * T + t) * C + h * HD + i]; };
      // dP = dout·Vᵀ; dS = P ∘ (dP − D), D_t = dout_t · out_t.
      for (int t = 0; t < T; ++t) {
        double D = 0.0, D_mag = 0.0;
        for (int i = 0; i < HD; ++i) {
          const double o = out_seen[(static_cast<size_t>(b) * T + t) * C + h * HD + i];
          D += dy(t, i) * o;
          D_mag += std::fabs(dy(t, i) * o);
        }
        for (int u = 0; u <= t; ++u) {
          double dp = 0.0, dp_mag = 0.0;
          for (int i = 0; i < HD; ++i) {
            dp += dy(t, i) * x(b, u, 2, h, i);
            dp_mag += std::fabs(dy(t, i) * x(b, u, 2, h, i));
          }
          dS[t * T + u] = P[t * T + u] * (dp - D);
          dS_mag[t * T + u] = P[t * T + u] * (dp_mag + D_mag);
        }
      }
      for (int t = 0; t < T; ++t) {
        const size_t at = (static_cast<size_t>(b) * T + t) * W;
        for (int i = 0; i < HD; ++i) {
          double dq = 0, dq_mag = 0, dq_cancel = 0, dk = 0, dk_mag = 0, dk_cancel = 0, dv = 0, dv_mag = 0;
          for (int u = 0; u <= t; ++u) {  // dQ_t = scale · Σ_{u<=t} dS_tu k_u
            dq += dS[t * T + u] * x(b, u, 1, h, i);
            dq_mag += std::fabs(dS[t * T + u] * x(b, u, 1, h, i));
            dq_cancel += dS_mag[t * T + u] * std::fabs(x(b, u, 1, h, i));
          }
          for (int u = t; u < T; ++u) {  // key t: dK_t = scale · Σ_{u>=t} dS_ut q_u, dV_t = Σ P_ut dout_u
            dk += dS[u * T + t] * x(b, u, 0, h, i);
            dk_mag += std::fabs(dS[u * T + t] * x(b, u, 0, h, i));
            dk_cancel += dS_mag[u * T + t] * std::fabs(x(b, u, 0, h, i));
            dv += P[u * T + t] * dy(u, i);
            dv_mag += P[u * T + t] * std::fabs(dy(u, i));
          }
          const size_t q = at + channel(0, h, i), k = at + channel(1, h, i), v = at + channel(2, h, i);
          r.dqkv[q] = scale * dq;
          r.dqkv_mag[q] = scale * dq_mag;
          r.dqkv_cancel[q] = scale * dq_cancel;
          r.dqkv[k] += scale * dk;  // K/V heads: the sum over the query heads sharing them
          r.dqkv_mag[k] += scale * dk_mag;
          r.dqkv_cancel[k] += scale * dk_cancel;
          r.dqkv[v] += dv;
          r.dqkv_mag[v] += dv_mag;
        }
      }
    }
  }
  return r;
}

// Tolerances. bf16 keeps 8 significant bits: rounding to bf16 is off by at most u = 2^-8 of the
// value (half an ulp), fp32 by 2^-24.
//  - out and the gradients: |got − want| <= 2^-7·(|want| + mag) + 2^-22·(HD + T)·(mag + cancel).
//    2^-7·|want| = 2u: the final rounding to bf16 of got and, against the simple kernel, of want.
//    2^-7·mag: the kernel rounds P (or dS) to bf16 before the last product, which moves the
//    element by at most u·mag (Reference); the factor 2 leaves room for exp2f and the scores' fp32
//    error in P. The last term is fp32 accumulation: a sum of n fp32 terms is off by at most
//    n·2^-24 of the sum of their magnitudes, n <= HD + T, taken 4 times (dP, D and the product
//    of each kernel); it is what remains where dP − D cancels (a row attending only to itself).
//  - lse (fp32 throughout): a score is off by at most HD·2^-24·score_mag (fp32 dot product), the
//    running sum by T·2^-24 relative, exp2f/log2f and the scalings by a few ulps of |lse|; twice
//    2^-24·(HD·score_mag + T + 4|lse| + 8) bounds one kernel, twice that two kernels' difference.
constexpr double kRounding = 0x1p-7, kAccumulation = 0x1p-22;

struct Worst {
  double err = 0.0, ratio = 0.0;  // largest |got − want| and largest |got − want| / tolerance
  void add(double e, double tol) {
    err = std::max(err, e);
    ratio = std::max(ratio, e / tol);
  }
};

// Elements [begin, begin + width) of every row of a tensor with rows of `row` elements.
template <typename V>
std::vector<V> columns(const std::vector<V>& v, size_t row, size_t begin, size_t width) {
  std::vector<V> r;
  r.reserve(v.size() / row * width);
  for (size_t at = 0; at < v.size(); at += row) {
    auto first = v.begin() + static_cast<std::ptrdiff_t>(at + begin);
    r.insert(r.end(), first, first + static_cast<std::ptrdiff_t>(width));
  }
  return r;
}

// |got − want| <= kRounding·(|want| + mag) + kAccumulation·(HD + T)·(mag + cancel), element by
// element; NaN (an element a kernel did not write) always fails.
bool close_by_magnitude(const std::string& what, const std::vector<float>& got, const std::vector<double>& want,
                        const std::vector<double>& mag, const std::vector<double>& cancel, int terms, Worst& worst) {
  REQUIRE(got.size() == want.size());
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(got[i] - want[i]);
    // Below the smallest normal float, fp32 and bf16 keep fewer significant bits than the
    // relative terms assume (sharp softmaxes at small HD reach there): that much is always allowed.
    const double tol = kRounding * (std::fabs(want[i]) + mag[i]) + kAccumulation * terms * (mag[i] + cancel[i]) +
                       std::numeric_limits<float>::min();
    if (!(err <= tol) && bad++ == 0) first = i;
    if (std::isfinite(err)) worst.add(err, tol);
  }
  if (bad) {
    UNSCOPED_INFO(what << ": " << bad << "/" << got.size() << " elements off; first at [" << first << "] got "
                       << got[first] << " want " << want[first] << " (mag " << mag[first] << ", cancel "
                       << cancel[first] << ")");
  }
  return bad == 0;
}

bool close_absolute(const std::string& what, const std::vector<float>& got, const std::vector<double>& want,
                    double tol, Worst& worst) {
  REQUIRE(got.size() == want.size());
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(got[i] - want[i]);
    if (!(err <= tol) && bad++ == 0) first = i;
    if (std::isfinite(err)) worst.add(err, tol);
  }
  if (bad) {
    UNSCOPED_INFO(what << ": " << bad << "/" << got.size() << " elements off; first at [" << first << "] got "
                       << got[first] << " want " << want[first] << " (tolerance " << tol << ")");
  }
  return bad == 0;
}

std::vector<double> doubles(const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); }

// Worst errors over all shapes of a test case, printed at its end (the logs keep the headroom).
struct Report {
  Worst out, lse, dq, dk, dv;  // flash vs double
  Worst simple_out, simple_lse, simple_dq, simple_dk, simple_dv;  // flash vs the simple kernel
  void print(int HD) const {
    auto line = [](const char* name, const Worst& a, const Worst& b) {
      std::printf("  %-4s max err %.3g (%.2f of tolerance) vs double, %.3g (%.2f) vs simple kernel\n", name, a.err,
                  a.ratio, b.err, b.ratio);
    };
    std::printf("flash attention HD=%d, worst over all shapes:\n", HD);
    line("out", out, simple_out);
    line("lse", lse, simple_lse);
    line("dq", dq, simple_dq);
    line("dk", dk, simple_dk);
    line("dv", dv, simple_dv);
  }
};

void check_shape(const FlashShape& s, uint64_t seed, Report& report) {
  const int B = s.B, T = s.T, NH = s.NH, HD = s.HD, C = NH * HD, NKV = s.kv_heads(), W = C + 2 * NKV * HD;
  INFO("B=" << B << " T=" << T << " NH=" << NH << " NKV=" << NKV << " HD=" << HD << " input std=" << s.input_std);
  const size_t qkv_n = static_cast<size_t>(B) * T * W, out_n = static_cast<size_t>(B) * T * C;
  const size_t lse_n = static_cast<size_t>(B) * NH * T;
  const std::vector<float> qkv_host = test::round_to<bf16>(test::random_floats(qkv_n, seed, s.input_std));
  const std::vector<float> dout_host = test::round_to<bf16>(test::random_floats(out_n, seed + 1));

  test::DeviceBuffer<bf16> qkv(test::from_floats<bf16>(qkv_host)), dout(test::from_floats<bf16>(dout_host));
  test::DeviceBuffer<bf16> out(out_n), dqkv(qkv_n);
  test::DeviceBuffer<float> lse(lse_n), scratch(flash_attention_backward_scratch_bytes(B, T, NH) / sizeof(float));
  flash_attention_forward(out, lse, qkv, B, T, C, NH, NKV, nullptr);
  test::require_no_cuda_error();
  flash_attention_backward(dqkv, scratch, dout, qkv, out, lse, B, T, C, NH, NKV, nullptr);
  test::require_no_cuda_error();
  const std::vector<bf16> out_got = out.download(), dqkv_got = dqkv.download();
  const std::vector<float> lse_got = lse.download();
  const std::vector<float> out_f = test::to_floats(out_got), dqkv_f = test::to_floats(dqkv_got);

  // (b) the double-precision loop.
  const Reference want = reference(qkv_host, dout_host, out_f, s);
  const double max_lse = std::fabs(*std::max_element(want.lse.begin(), want.lse.end(),
                                                     [](double a, double b) { return std::fabs(a) < std::fabs(b); }));
  const double lse_tol = 2 * 0x1p-24 * (HD * want.score_mag + T + 4 * max_lse + 8);
  const std::vector<double> no_cancel(out_n, 0.0);  // O = P V has no difference inside
  const int terms = HD + NH / NKV * T;  // a K/V head's gradients add up T rows of each of its query heads
  CHECK(close_by_magnitude("out vs double", out_f, want.out, want.out_mag, no_cancel, terms, report.out));
  CHECK(close_absolute("lse vs double", lse_got, want.lse, lse_tol, report.lse));
  Worst* grads[3] = {&report.dq, &report.dk, &report.dv};
  const char* names[3] = {"dq", "dk", "dv"};
  const size_t part_begin[3] = {0, static_cast<size_t>(C), static_cast<size_t>(C) + NKV * HD};
  const size_t part_width[3] = {static_cast<size_t>(C), static_cast<size_t>(NKV) * HD, static_cast<size_t>(NKV) * HD};
  auto part_of = [&](const auto& v, int part) { return columns(v, W, part_begin[part], part_width[part]); };
  for (int part = 0; part < 3; ++part) {
    CHECK(close_by_magnitude(std::string(names[part]) + " vs double", part_of(dqkv_f, part), part_of(want.dqkv, part),
                             part_of(want.dqkv_mag, part), part_of(want.dqkv_cancel, part), terms, *grads[part]));
  }

  // (a) the simple kernel: its own forward; its backward on the flash forward's out and lse, so
  // both backward passes see the same inputs.
  test::DeviceBuffer<bf16> simple_out(out_n), simple_dqkv(qkv_n);
  test::DeviceBuffer<float> simple_lse(lse_n);
  test::DeviceBuffer<float> simple_scratch(attention_backward_scratch_bytes(B, T, NH) / sizeof(float));
  attention_forward<bf16>(simple_out, simple_lse, qkv, B, T, C, NH, NKV, nullptr);
  attention_backward<bf16>(simple_dqkv, simple_scratch, dout, qkv, out, lse, B, T, C, NH, NKV, nullptr);
  test::require_no_cuda_error();
  const std::vector<float> simple_dqkv_f = test::to_floats(simple_dqkv.download());
  CHECK(close_by_magnitude("out vs simple", out_f, doubles(test::to_floats(simple_out.download())), want.out_mag,
                           no_cancel, terms, report.simple_out));
  CHECK(close_absolute("lse vs simple", lse_got, doubles(simple_lse.download()), 2 * lse_tol, report.simple_lse));
  Worst* simple_grads[3] = {&report.simple_dq, &report.simple_dk, &report.simple_dv};
  for (int part = 0; part < 3; ++part) {
    CHECK(close_by_magnitude(std::string(names[part]) + " vs simple", part_of(dqkv_f, part),
                             doubles(part_of(simple_dqkv_f, part)), part_of(want.dqkv_mag, part),
                             part_of(want.dqkv_cancel, part), terms, *simple_grads[part]));
  }

  // Same inputs → same bits, every output re-poisoned in between.
  out.poison();
  lse.poison();
  dqkv.poison();
  scratch.poison();
  flash_attention_forward(out, lse, qkv, B, T, C, NH, NKV, nullptr);
  flash_attention_backward(dqkv, scratch, dout, qkv, out, lse, B, T, C, NH, NKV, nullptr);
  test::require_no_cuda_error();
  CHECK(test::same_bits(out.download(), out_got));
  CHECK(test::same_bits(lse.download(), lse_got));
  CHECK(test::same_bits(dqkv.download(), dqkv_got));
}

void check_head_dim(int HD) {
  // T: a single row, a tail inside the first tile, exactly one 64-row tile, one row into the
  // next, and several tiles with a tail (also a tail of the 32-row tiles of HD 128's backward).
  // The last two shapes have sharp inputs (std 4: scaled scores with std 16), a nearly one-hot
  // softmax whose running maximum changes from tile to tile.
  const FlashShape shapes[] = {
      {1, 1, 1, HD, 1.0f},  {2, 1, 3, HD, 1.0f},  {1, 7, 1, HD, 1.0f},   {2, 7, 3, HD, 1.0f},
      {1, 64, 1, HD, 1.0f}, {2, 64, 3, HD, 1.0f}, {1, 65, 1, HD, 1.0f},  {2, 65, 3, HD, 1.0f},
      {1, 200, 1, HD, 1.0f}, {2, 200, 3, HD, 1.0f}, {1, 130, 2, HD, 4.0f}, {2, 97, 1, HD, 4.0f},
  };
  Report report;
  uint64_t seed = 1000 + HD;
  for (const FlashShape& s : shapes) {
    check_shape(s, seed, report);
    seed += 2;
  }
  report.print(HD);
}

}  // namespace

TEST_CASE("flash attention supports head dims 16, 32, 64 and 128 and needs the simple kernel's scratch", "[flash]") {
  for (int hd : {16, 32, 64, 128}) CHECK(flash_attention_supports(hd));
  for (int hd : {8, 24, 48, 96}) CHECK_FALSE(flash_attention_supports(hd));
  CHECK(flash_attention_backward_scratch_bytes(2, 65, 3) == attention_backward_scratch_bytes(2, 65, 3));
}

TEST_CASE("flash attention HD 16 matches double-precision loops and the simple kernel", "[flash]") {
  check_head_dim(16);
}

TEST_CASE("flash attention HD 32 matches double-precision loops and the simple kernel", "[flash]") {
  check_head_dim(32);
}

TEST_CASE("flash attention HD 64 matches double-precision loops and the simple kernel", "[flash]") {
  check_head_dim(64);
}

TEST_CASE("flash attention HD 128 matches double-precision loops and the simple kernel", "[flash]") {
  check_head_dim(128);
}

// Grouped-query attention: NKV = 1 (one K/V head for all), NH/2 and NH K/V heads, with a T of 1,
// odd T, T exactly a tile, one row past it and several tiles with a tail; sharp inputs on a
// group of 2; a group of 3 (NH 6, NKV 2); then Llama 3.1 8B's heads (NH 32, NKV 8) on a few rows.
namespace {
void check_grouped_query(int HD) {
  const FlashShape shapes[] = {
      {1, 1, 4, HD, 1.0f, 1},   {2, 1, 4, HD, 1.0f, 2},   {2, 7, 4, HD, 1.0f, 1},  {1, 7, 4, HD, 1.0f, 4},
      {1, 64, 4, HD, 1.0f, 2},  {2, 65, 4, HD, 1.0f, 1},  {1, 65, 4, HD, 1.0f, 2}, {1, 130, 4, HD, 4.0f, 2},
      {1, 200, 4, HD, 1.0f, 1}, {1, 33, 6, HD, 1.0f, 2},  {1, 5, 32, HD, 1.0f, 8},
  };
  Report report;
  uint64_t seed = 2000 + HD;
  for (const FlashShape& s : shapes) {
    check_shape(s, seed, report);
    seed += 2;
  }
  report.print(HD);
}
}  // namespace

TEST_CASE("flash attention GQA HD 64 (K/V heads shared by NH/NKV query heads) matches double loops and simple",
          "[flash]") {
  check_grouped_query(64);
}

TEST_CASE("flash attention GQA HD 128, up to Llama 3.1 8B's NH 32 NKV 8, matches double loops and simple",
          "[flash]") {
  check_grouped_query(128);
}

// Every preset's heads, all NH of them, where its head size is one flash attention takes (the
// model runs the simple kernel otherwise): one sequence of 17 rows, a tail inside the first tile.
// Each on its NKV K/V heads.
TEST_CASE("flash attention launches and matches at every preset's heads", "[flash]") {
  uint64_t seed = 5000;
  for (const test::PresetShape& p : test::preset_shapes()) {
    if (!flash_attention_supports(p.head_size)) continue;
    INFO("presets " << p.presets);
    Report report;
    check_shape({1, 17, p.NH, p.head_size, 1.0f, p.NKV}, seed += 2, report);
  }
}

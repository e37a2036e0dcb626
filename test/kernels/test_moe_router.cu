// moe_router.cuh vs. CPU loops written here (double precision): the logits' product; the softmax
// and sigmoid routings (probabilities, the top K with ties to the lower index, the gates
// renormalised over the chosen; exact ties in whole rows and at the K-th place); the statistics
// accumulated into pre-filled counts and sums; both routings' backward passes against an explicit
// Jacobian (itself checked by finite differences of the forward in double), the aux term
// included; the input and weight gradients accumulated into pre-filled buffers (one row group,
// several, and the scratch-capped grouping); the bias update's sign; the balanced (round-robin)
// choice of --moe-balanced-routing. Shapes: N = 1, 37, 1000,
// C = 40 and 200 (multiples of 8, not of 32), E = 1, 8, 33, 64, 256, K = 1 … E, every preset's
// width and Llama 3.1 405B's C = 16384; bf16 and float; every output poisoned first and every
// op rerun for bit-identical results.
#include "test/test_util.h"
#include "test/preset_shapes.h"
#include "kernels/moe_router.cuh"

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <type_traits>

namespace {

template <typename T> constexpr double kRel = std::is_same<T, float>::value ? 1e-5 : 1.0 / 64;

size_t at(int row, int col, int cols) { return static_cast<size_t>(row) * cols + col; }

// The K largest keys of a row, larger first, equal keys in increasing index.
std::vector<int> reference_top_k(const float* keys, int E, int K) {
  std::vector<int> order(E);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return keys[a] > keys[b]; });
  order.resize(K);
  return order;
}

struct RouteCase {
  int N, E, K;
};
const RouteCase kRouteCases[] = {{1, 1, 1}, {37, 1, 1}, {37, 8, 2},  {5, 8, 8},    {37, 33, 3},
                                 {37, 64, 8}, {7, 64, 64}, {3, 256, 8}, {2, 256, 256}, {1000, 8, 2}};

// Rows of logits with ties: row 3m all equal; row 3m+1 random with two equal maxima at experts
// E−1 and E/2 and (when 3 <= K < E) a tie across the K-th place; row 3m+2 random.
std::vector<float> router_logits(int N, int E, int K, uint64_t seed) {
  std::vector<float> l = test::random_floats(static_cast<size_t>(N) * E, seed, 2.0f);
  for (int n = 0; n < N; ++n) {
    float* row = &l[at(n, 0, E)];
    if (n % 3 == 0) {
      std::fill(row, row + E, 0.25f);
    } else if (n % 3 == 1 && E > 1) {
      const float top = *std::max_element(row, row + E) + 1.0f;
      row[E - 1] = top;
      row[E / 2] = top;
      if (K >= 3 && K < E) {  // the (K+1)-th largest raised to the K-th: the lower index of the two is chosen
        std::vector<int> order(E);
        std::iota(order.begin(), order.end(), 0);
        std::sort(order.begin(), order.end(), [&](int a, int b) { return row[a] > row[b]; });
        row[order[K]] = row[order[K - 1]];
      }
    }
  }
  return l;
}

struct Routing {
  std::vector<float> values;  // probs or scores
  std::vector<int> expert;
  std::vector<float> gate;
};

// Checks one routing's outputs against the reference: values to ~1e-6 of the double values; the
// selection exactly (the reference's rule applied to the keys the kernel's own values give);
// gates against the double renormalisation.
void check_routing(const Routing& got, const std::vector<double>& want_values, const std::vector<float>& bias, int N,
                   int E, int K) {
  CHECK(test::all_close("values", got.values, want_values, 1e-5, 1e-7));
  std::vector<int> want_expert(static_cast<size_t>(N) * K);
  std::vector<double> want_gate(static_cast<size_t>(N) * K);
  for (int n = 0; n < N; ++n) {
    std::vector<float> keys(&got.values[at(n, 0, E)], &got.values[at(n, 0, E)] + E);
    if (!bias.empty())
      for (int e = 0; e < E; ++e) keys[e] += bias[e];
    const std::vector<int> chosen = reference_top_k(keys.data(), E, K);
    double total = 0;
    for (int k = 0; k < K; ++k) total += want_values[at(n, chosen[k], E)];
    for (int k = 0; k < K; ++k) {
      want_expert[at(n, k, K)] = chosen[k];
      want_gate[at(n, k, K)] = want_values[at(n, chosen[k], E)] / total;
    }
  }
  CHECK(got.expert == want_expert);
  CHECK(test::all_close("gate", got.gate, want_gate, 1e-5, 1e-7));
}

std::vector<double> reference_softmax(const std::vector<float>& logits, int N, int E) {
  std::vector<double> p(logits.size());
  for (int n = 0; n < N; ++n) {
    double m = -1e300, s = 0;
    for (int e = 0; e < E; ++e) m = std::max(m, static_cast<double>(logits[at(n, e, E)]));
    for (int e = 0; e < E; ++e) s += std::exp(logits[at(n, e, E)] - m);
    for (int e = 0; e < E; ++e) p[at(n, e, E)] = std::exp(logits[at(n, e, E)] - m) / s;
  }
  return p;
}

std::vector<double> reference_sigmoid(const std::vector<float>& logits) {
  std::vector<double> s(logits.size());
  for (size_t i = 0; i < s.size(); ++i) s[i] = 1.0 / (1.0 + std::exp(-static_cast<double>(logits[i])));
  return s;
}

template <typename Run>
Routing run_routing(Run run, int N, int E, int K) {
  test::DeviceBuffer<float> values(static_cast<size_t>(N) * E), gate(static_cast<size_t>(N) * K);
  test::DeviceBuffer<int> expert(static_cast<size_t>(N) * K);
  run(values.ptr, expert.ptr, gate.ptr);
  test::require_no_cuda_error();
  return {values.download(), expert.download(), gate.download()};
}

// The explicit Jacobian of the routing's backward (reference): dL/dv_j = Σ_k dgate_k ∂g_k/∂v_j,
// ∂g_k/∂v_j = [j = e_k]/S − v_{e_k}/S² for a chosen j, plus aux_j; softmax: dL/dl_i =
// Σ_j dL/dv_j · p_j (δ_ij − p_i); sigmoid: dL/dl_i = dL/dv_i · s_i (1 − s_i).
std::vector<double> reference_router_backward(bool sigmoid, const std::vector<double>& v, const std::vector<int>& expert,
                                              const std::vector<float>& dgate, const std::vector<float>& aux, int N,
                                              int E, int K) {
  std::vector<double> dl(static_cast<size_t>(N) * E);
  for (int n = 0; n < N; ++n) {
    const double* vr = &v[at(n, 0, E)];
    double S = 0;
    for (int k = 0; k < K; ++k) S += vr[expert[at(n, k, K)]];
    std::vector<double> dv(E, 0.0);
    for (int j = 0; j < E; ++j) {
      if (!aux.empty()) dv[j] += aux[j];
      bool chosen = false;
      for (int k = 0; k < K; ++k) chosen = chosen || expert[at(n, k, K)] == j;
      if (!chosen) continue;
      for (int k = 0; k < K; ++k) {
        const int ek = expert[at(n, k, K)];
        dv[j] += dgate[at(n, k, K)] * ((ek == j ? 1.0 / S : 0.0) - vr[ek] / (S * S));
      }
    }
    for (int i = 0; i < E; ++i) {
      double g = 0;
      if (sigmoid) {
        g = dv[i] * vr[i] * (1.0 - vr[i]);
      } else {
        for (int j = 0; j < E; ++j) g += dv[j] * vr[j] * ((i == j ? 1.0 : 0.0) - vr[i]);
      }
      dl[at(n, i, E)] = g;
    }
  }
  return dl;
}

// The forward as a function of the logits in double, with the selection held fixed:
// L = Σ_n Σ_k dgate·g + Σ_n Σ_e aux_e·p_e (the aux term for softmax only).
double reference_router_loss(bool sigmoid, const std::vector<double>& logits, const std::vector<int>& expert,
                             const std::vector<float>& dgate, const std::vector<float>& aux, int N, int E, int K) {
  double loss = 0;
  for (int n = 0; n < N; ++n) {
    std::vector<double> v(E);
    double m = -1e300, s = 0;
    for (int e = 0; e < E; ++e) m = std::max(m, logits[at(n, e, E)]);
    for (int e = 0; e < E; ++e) s += std::exp(logits[at(n, e, E)] - m);
    for (int e = 0; e < E; ++e)
      v[e] = sigmoid ? 1.0 / (1.0 + std::exp(-logits[at(n, e, E)])) : std::exp(logits[at(n, e, E)] - m) / s;
    double S = 0;
    for (int k = 0; k < K; ++k) S += v[expert[at(n, k, K)]];
    for (int k = 0; k < K; ++k) loss += dgate[at(n, k, K)] * v[expert[at(n, k, K)]] / S;
    if (!aux.empty())
      for (int e = 0; e < E; ++e) loss += aux[e] * v[e];
  }
  return loss;
}

}  // namespace

TEST_CASE("router backward reference agrees with finite differences of the forward", "[moe_router]") {
  const int N = 3, E = 6, K = 3;
  const std::vector<float> logits_f = test::random_floats(N * E, 71, 1.5f);
  const std::vector<double> logits(logits_f.begin(), logits_f.end());
  const std::vector<float> dgate = test::random_floats(N * K, 72), aux = test::random_floats(E, 73);
  const std::vector<int> expert = {4, 1, 2, 0, 5, 3, 2, 3, 1};
  for (bool sigmoid : {false, true}) {
    INFO((sigmoid ? "sigmoid" : "softmax"));
    const std::vector<float> a = sigmoid ? std::vector<float>() : aux;
    std::vector<double> v(N * E);
    for (int n = 0; n < N; ++n) {
      double m = -1e300, s = 0;
      for (int e = 0; e < E; ++e) m = std::max(m, logits[at(n, e, E)]);
      for (int e = 0; e < E; ++e) s += std::exp(logits[at(n, e, E)] - m);
      for (int e = 0; e < E; ++e)
        v[at(n, e, E)] = sigmoid ? 1.0 / (1.0 + std::exp(-logits[at(n, e, E)])) : std::exp(logits[at(n, e, E)] - m) / s;
    }
    const std::vector<double> analytic = reference_router_backward(sigmoid, v, expert, dgate, a, N, E, K);
    for (int i = 0; i < N * E; ++i) {
      const double h = 1e-6;
      std::vector<double> up = logits, down = logits;
      up[i] += h;
      down[i] -= h;
      const double numeric = (reference_router_loss(sigmoid, up, expert, dgate, a, N, E, K) -
                              reference_router_loss(sigmoid, down, expert, dgate, a, N, E, K)) / (2 * h);
      INFO("logit " << i);
      CHECK(std::fabs(numeric - analytic[i]) < 1e-7);
    }
  }
}

TEMPLATE_TEST_CASE("moe_router_logits matches CPU loops", "[moe_router]", float, bf16) {
  using T = TestType;
  struct Shape {
    int N, C, E;
  };
  std::vector<Shape> shapes = {{1, 8, 1}, {37, 40, 8}, {37, 200, 64}, {5, 40, 33}, {3, 200, 256}, {2, 16384, 256}};
  for (const test::PresetShape& p : test::preset_shapes()) shapes.push_back({2, p.C, 64});
  uint64_t seed = 100;
  for (const Shape& s : shapes) {
    INFO("N " << s.N << " C " << s.C << " E " << s.E);
    const std::vector<float> x = test::round_to<T>(test::random_floats(static_cast<size_t>(s.N) * s.C, ++seed));
    const std::vector<float> w = test::round_to<T>(test::random_floats(static_cast<size_t>(s.E) * s.C, ++seed, 0.1f));
    std::vector<double> want(static_cast<size_t>(s.N) * s.E);
    for (int n = 0; n < s.N; ++n)
      for (int e = 0; e < s.E; ++e) {
        double sum = 0;
        for (int c = 0; c < s.C; ++c) sum += static_cast<double>(x[at(n, c, s.C)]) * w[at(e, c, s.C)];
        want[at(n, e, s.E)] = sum;
      }
    test::DeviceBuffer<T> d_x(test::from_floats<T>(x)), d_w(test::from_floats<T>(w));
    test::DeviceBuffer<float> d_logits(want.size());
    moe_router_logits<T>(d_logits, d_x, d_w, s.N, s.C, s.E, nullptr);
    test::require_no_cuda_error();
    const std::vector<float> first = d_logits.download();
    // fp32 sums of C products of O(0.1) terms: ~1e-6 of √C·0.1.
    CHECK(test::all_close("logits", first, want, 1e-5, 2e-5 * std::sqrt(static_cast<double>(s.C)) * 0.1));
    d_logits.poison();
    moe_router_logits<T>(d_logits, d_x, d_w, s.N, s.C, s.E, nullptr);
    test::require_no_cuda_error();
    CHECK(test::same_bits(d_logits.download(), first));
  }
}

TEST_CASE("moe_route_softmax_topk matches CPU loops, ties to the lower index", "[moe_router]") {
  uint64_t seed = 200;
  for (const RouteCase& c : kRouteCases) {
    INFO("N " << c.N << " E " << c.E << " K " << c.K);
    const std::vector<float> logits = router_logits(c.N, c.E, c.K, ++seed);
    test::DeviceBuffer<float> d_logits(logits);
    auto run = [&](float* probs, int* expert, float* gate) {
      moe_route_softmax_topk(probs, expert, gate, d_logits, c.N, c.E, c.K, nullptr);
    };
    const Routing got = run_routing(run, c.N, c.E, c.K);
    check_routing(got, reference_softmax(logits, c.N, c.E), {}, c.N, c.E, c.K);
    // Row 0's logits are all equal: experts 0 … K−1 in order; row 1's two maxima: the lower first.
    for (int k = 0; k < c.K; ++k) CHECK(got.expert[k] == k);
    if (c.N > 1 && c.E > 2) {
      CHECK(got.expert[at(1, 0, c.K)] == c.E / 2);
      if (c.K > 1) CHECK(got.expert[at(1, 1, c.K)] == c.E - 1);
    }
    const Routing again = run_routing(run, c.N, c.E, c.K);
    CHECK(test::same_bits(again.values, got.values));
    CHECK(again.expert == got.expert);
    CHECK(test::same_bits(again.gate, got.gate));
  }
}

// MoeChoice::balanced: row n's k-th expert is (n·K + k) mod E whatever the logits (row 1's two
// maxima included), so every expert gets N·K/E rows (± 1); the values as the routing's own and the
// gates the chosen values renormalised, for both routings.
TEST_CASE("moe routings with MoeChoice::balanced choose round-robin, gates from the values", "[moe_router]") {
  uint64_t seed = 250;
  for (const RouteCase& c : kRouteCases) {
    for (const bool sigmoid : {false, true}) {
      INFO("N " << c.N << " E " << c.E << " K " << c.K << (sigmoid ? " sigmoid" : " softmax"));
      const std::vector<float> logits = router_logits(c.N, c.E, c.K, ++seed);
      test::DeviceBuffer<float> d_logits(logits), d_bias(std::vector<float>(c.E, 0.5f));
      const Routing got = run_routing(
          [&](float* v, int* ex, float* g) {
            if (sigmoid)
              moe_route_sigmoid_topk<float>(v, ex, g, d_logits, d_bias, c.N, c.E, c.K, nullptr, MoeChoice::balanced);
            else
              moe_route_softmax_topk(v, ex, g, d_logits, c.N, c.E, c.K, nullptr, MoeChoice::balanced);
          },
          c.N, c.E, c.K);
      const std::vector<double> values = sigmoid ? reference_sigmoid(logits) : reference_softmax(logits, c.N, c.E);
      CHECK(test::all_close("values", got.values, values, 1e-5, 1e-7));
      std::vector<int> want_expert(static_cast<size_t>(c.N) * c.K);
      std::vector<double> want_gate(want_expert.size());
      std::vector<int> rows_per_expert(c.E, 0);
      for (int n = 0; n < c.N; ++n) {
        double total = 0;
        for (int k = 0; k < c.K; ++k) {
          want_expert[at(n, k, c.K)] = static_cast<int>((static_cast<long long>(n) * c.K + k) % c.E);
          total += values[at(n, want_expert[at(n, k, c.K)], c.E)];
        }
        for (int k = 0; k < c.K; ++k) {
          want_gate[at(n, k, c.K)] = values[at(n, want_expert[at(n, k, c.K)], c.E)] / total;
          ++rows_per_expert[want_expert[at(n, k, c.K)]];
        }
      }
      CHECK(got.expert == want_expert);
      CHECK(test::all_close("gate", got.gate, want_gate, 1e-5, 1e-7));
      const auto [fewest, most] = std::minmax_element(rows_per_expert.begin(), rows_per_expert.end());
      CHECK(*most - *fewest <= 1);
    }
  }
}

TEST_CASE("moe_route_sigmoid_topk: the bias steers the selection, not the gates", "[moe_router]") {
  uint64_t seed = 300;
  for (const RouteCase& c : kRouteCases) {
    INFO("N " << c.N << " E " << c.E << " K " << c.K);
    const std::vector<float> logits = router_logits(c.N, c.E, c.K, ++seed);
    // A bias large enough to reorder the choices; expert 0's raised above every score.
    std::vector<float> bias = test::random_floats(c.E, ++seed, 0.3f);
    bias[0] = 3.0f;
    test::DeviceBuffer<float> d_logits(logits), d_bias(bias);
    auto run = [&](float* scores, int* expert, float* gate) {
      moe_route_sigmoid_topk<float>(scores, expert, gate, d_logits, d_bias, c.N, c.E, c.K, nullptr);
    };
    const Routing got = run_routing(run, c.N, c.E, c.K);
    check_routing(got, reference_sigmoid(logits), bias, c.N, c.E, c.K);
    for (int n = 0; n < c.N; ++n) CHECK(got.expert[at(n, 0, c.K)] == 0);
    const Routing again = run_routing(run, c.N, c.E, c.K);
    CHECK(test::same_bits(again.values, got.values));
    CHECK(again.expert == got.expert);
    CHECK(test::same_bits(again.gate, got.gate));
  }
  // Equal biases and equal logits: the lower indices.
  const int N = 2, E = 8, K = 3;
  test::DeviceBuffer<float> d_logits(std::vector<float>(N * E, -0.5f)), d_bias(std::vector<float>(E, 0.125f));
  const Routing tied = run_routing(
      [&](float* s, int* ex, float* g) { moe_route_sigmoid_topk<float>(s, ex, g, d_logits, d_bias, N, E, K, nullptr); }, N, E,
      K);
  CHECK(tied.expert == std::vector<int>{0, 1, 2, 0, 1, 2});
  // No bias (nullptr): the same choices and gates as equal biases.
  const Routing unbiased = run_routing(
      [&](float* s, int* ex, float* g) { moe_route_sigmoid_topk<float>(s, ex, g, d_logits, nullptr, N, E, K, nullptr); }, N,
      E, K);
  CHECK(unbiased.expert == tied.expert);
  CHECK(test::same_bits(unbiased.gate, tied.gate));
}

TEST_CASE("moe_route_sigmoid_topk reads a bf16 bias as the float of its value", "[moe_router]") {
  const int N = 37, E = 64, K = 6;
  const std::vector<float> logits = router_logits(N, E, K, 901);
  std::vector<bf16> bias16(E);
  std::vector<float> bias32(E);
  const std::vector<float> raw = test::random_floats(E, 902, 0.5f);
  for (int e = 0; e < E; ++e) {
    bias16[e] = __float2bfloat16_rn(raw[e]);
    bias32[e] = __bfloat162float(bias16[e]);
  }
  test::DeviceBuffer<float> d_logits(logits), d_bias32(bias32);
  test::DeviceBuffer<bf16> d_bias16(bias16);
  const Routing wide = run_routing(
      [&](float* s, int* ex, float* g) { moe_route_sigmoid_topk<float>(s, ex, g, d_logits, d_bias32, N, E, K, nullptr); },
      N, E, K);
  const Routing narrow = run_routing(
      [&](float* s, int* ex, float* g) { moe_route_sigmoid_topk<bf16>(s, ex, g, d_logits, d_bias16, N, E, K, nullptr); },
      N, E, K);
  check_routing(narrow, reference_sigmoid(logits), bias32, N, E, K);
  CHECK(narrow.expert == wide.expert);
  CHECK(test::same_bits(narrow.gate, wide.gate));
}

TEST_CASE("moe_router_stats accumulates counts and probability sums", "[moe_router]") {
  struct Case {
    int N, E, K;
    const char* what;
  };
  const Case cases[] = {{1, 1, 1, "E = 1"},           {37, 8, 2, "E = 8, K = 2"},
                        {37, 64, 8, "E = 64, zero-token experts"}, {40, 8, 1, "all tokens on expert 5"},
                        {7, 33, 33, "K = E"},           {1000, 256, 8, "E = 256, N = 1000"}};
  uint64_t seed = 400;
  for (const Case& c : cases) {
    INFO(c.what << ": N " << c.N << " E " << c.E << " K " << c.K);
    const size_t pairs = static_cast<size_t>(c.N) * c.K;
    std::vector<int> expert(pairs);
    std::mt19937_64 rng(++seed);
    for (int n = 0; n < c.N; ++n) {
      std::vector<int> perm(c.E);
      std::iota(perm.begin(), perm.end(), 0);
      std::shuffle(perm.begin(), perm.end(), rng);
      for (int k = 0; k < c.K; ++k) expert[at(n, k, c.K)] = c.E == 8 && c.K == 1 ? 5 : perm[k];
    }
    if (c.E == 64)  // expert 13 never chosen
      for (int& e : expert)
        if (e == 13) e = 14;
    std::vector<float> probs = test::random_floats(static_cast<size_t>(c.N) * c.E, ++seed);
    for (float& p : probs) p = std::fabs(p) / c.E;
    std::vector<int> counts0(c.E);
    for (int e = 0; e < c.E; ++e) counts0[e] = 3 * e + 1;  // pre-filled: the earlier layers'
    const std::vector<float> sums0 = test::random_floats(c.E, ++seed);

    std::vector<int> want_counts = counts0;
    for (int e : expert) ++want_counts[e];
    std::vector<double> want_sums(sums0.begin(), sums0.end());
    for (int n = 0; n < c.N; ++n)
      for (int e = 0; e < c.E; ++e) want_sums[e] += probs[at(n, e, c.E)];
    if (c.E == 64) CHECK(want_counts[13] == counts0[13]);

    test::DeviceBuffer<int> d_expert(expert), d_counts(counts0);
    test::DeviceBuffer<float> d_probs(probs), d_sums(sums0);
    moe_router_stats(d_counts, d_sums, d_expert, d_probs, c.N, c.E, c.K, nullptr);
    test::require_no_cuda_error();
    CHECK(d_counts.download() == want_counts);
    const std::vector<float> first = d_sums.download();
    CHECK(test::all_close("prob_sums", first, want_sums, 1e-5, 1e-6));
    d_counts.upload(counts0);
    d_sums.upload(sums0);
    moe_router_stats(d_counts, d_sums, d_expert, d_probs, c.N, c.E, c.K, nullptr);
    test::require_no_cuda_error();
    CHECK(test::same_bits(d_sums.download(), first));
  }
}

TEST_CASE("moe router backward passes match the explicit Jacobian", "[moe_router]") {
  uint64_t seed = 500;
  for (const RouteCase& c : kRouteCases) {
    for (bool sigmoid : {false, true}) {
      for (bool with_aux : {false, true}) {
        if (sigmoid && with_aux) continue;
        INFO((sigmoid ? "sigmoid" : "softmax") << (with_aux ? " + aux" : "") << ": N " << c.N << " E " << c.E << " K "
                                               << c.K);
        const std::vector<float> logits = router_logits(c.N, c.E, c.K, ++seed);
        const std::vector<float> bias = sigmoid ? test::random_floats(c.E, ++seed, 0.3f) : std::vector<float>();
        test::DeviceBuffer<float> d_logits(logits), d_bias(sigmoid ? bias : std::vector<float>(1, 0.0f));
        const Routing r = run_routing(
            [&](float* v, int* ex, float* g) {
              if (sigmoid)
                moe_route_sigmoid_topk<float>(v, ex, g, d_logits, d_bias, c.N, c.E, c.K, nullptr);
              else
                moe_route_softmax_topk(v, ex, g, d_logits, c.N, c.E, c.K, nullptr);
            },
            c.N, c.E, c.K);
        const std::vector<float> dgate = test::random_floats(static_cast<size_t>(c.N) * c.K, ++seed);
        const std::vector<float> aux = with_aux ? test::random_floats(c.E, ++seed, 0.5f) : std::vector<float>();
        const std::vector<double> v(r.values.begin(), r.values.end());
        const std::vector<double> want = reference_router_backward(sigmoid, v, r.expert, dgate, aux, c.N, c.E, c.K);

        test::DeviceBuffer<float> d_v(r.values), d_gate(r.gate), d_dgate(dgate),
            d_aux(with_aux ? aux : std::vector<float>(1, 0.0f)), d_dl(want.size());
        test::DeviceBuffer<int> d_expert(r.expert);
        auto run = [&] {
          if (sigmoid)
            moe_router_backward_sigmoid(d_dl, d_dgate, d_v, d_expert, d_gate, c.N, c.E, c.K, nullptr);
          else
            moe_router_backward_softmax(d_dl, d_dgate, d_v, d_expert, d_gate, with_aux ? d_aux.ptr : nullptr, c.N,
                                        c.E, c.K, nullptr);
          test::require_no_cuda_error();
        };
        run();
        const std::vector<float> first = d_dl.download();
        CHECK(test::all_close("dlogits", first, want, 1e-4, 1e-6));
        d_dl.poison();
        run();
        CHECK(test::same_bits(d_dl.download(), first));
      }
    }
  }
}

TEMPLATE_TEST_CASE("moe_router_input_backward accumulates dx and dw", "[moe_router]", float, bf16) {
  using T = TestType;
  struct Shape {
    int N, C, E;
    const char* what;
  };
  std::vector<Shape> shapes = {{1, 8, 1, "one row, one expert"},     {37, 40, 8, "one row group"},
                               {1000, 200, 8, "32 row groups, the last part-full"},
                               {37, 200, 64, "E = 64"},            {300, 4096, 256, "groups capped by the scratch"},
                               {2, 16384, 256, "Llama 3.1 405B's C, E = 256"}};
  for (const test::PresetShape& p : test::preset_shapes()) shapes.push_back({2, p.C, 64, "preset width"});
  uint64_t seed = 600;
  for (const Shape& s : shapes) {
    INFO(s.what << ": N " << s.N << " C " << s.C << " E " << s.E << " groups "
                << moe_router_grad_groups(s.N, s.C, s.E));
    const int N = s.N, C = s.C, E = s.E;
    const std::vector<float> x = test::round_to<T>(test::random_floats(static_cast<size_t>(N) * C, ++seed));
    const std::vector<float> w = test::round_to<T>(test::random_floats(static_cast<size_t>(E) * C, ++seed, 0.1f));
    const std::vector<float> dl = test::random_floats(static_cast<size_t>(N) * E, ++seed, 0.1f);
    const std::vector<float> dx0 = test::round_to<T>(test::random_floats(x.size(), ++seed));
    const std::vector<float> dw0 = test::round_to<T>(test::random_floats(w.size(), ++seed));
    std::vector<double> want_dx(dx0.begin(), dx0.end()), want_dw(dw0.begin(), dw0.end());
    for (int n = 0; n < N; ++n)
      for (int e = 0; e < E; ++e) {
        const double g = dl[at(n, e, E)];
        for (int c = 0; c < C; ++c) {
          want_dx[at(n, c, C)] += g * w[at(e, c, C)];
          want_dw[at(e, c, C)] += g * x[at(n, c, C)];
        }
      }
    test::DeviceBuffer<T> d_x(test::from_floats<T>(x)), d_w(test::from_floats<T>(w));
    test::DeviceBuffer<T> d_dx(test::from_floats<T>(dx0)), d_dw(test::from_floats<T>(dw0));
    test::DeviceBuffer<float> d_dl(dl);
    test::DeviceBuffer<float> scratch(moe_router_input_backward_scratch_bytes(N, C, E) / sizeof(float));
    moe_router_input_backward<T>(d_dx, d_dw, scratch, d_dl, d_x, d_w, N, C, E, nullptr);
    test::require_no_cuda_error();
    const std::vector<T> dx_first = d_dx.download(), dw_first = d_dw.download();
    // dx: E terms of O(0.01); dw: N terms of O(0.1), fp32 noise ~1e-6 of their sum.
    CHECK(test::all_close("dx", dx_first, want_dx, kRel<T>, 1e-5));
    CHECK(test::all_close("dw", dw_first, want_dw, kRel<T>, 1e-5 + 1e-6 * N));
    d_dx.upload(test::from_floats<T>(dx0));
    d_dw.upload(test::from_floats<T>(dw0));
    scratch.poison();
    moe_router_input_backward<T>(d_dx, d_dw, scratch, d_dl, d_x, d_w, N, C, E, nullptr);
    test::require_no_cuda_error();
    CHECK(test::same_bits(d_dx.download(), dx_first));
    CHECK(test::same_bits(d_dw.download(), dw_first));
  }
}

namespace {
// The update rule in double, independently of the kernel: bias[l][e] += rate·sign(mean − count).
std::vector<double> reference_bias_update(std::vector<double> bias, const std::vector<int>& counts, double rate,
                                          int L, int E) {
  for (int l = 0; l < L; ++l) {
    double mean = 0.0;
    for (int e = 0; e < E; ++e) mean += counts[at(l, e, E)];
    mean /= E;
    for (int e = 0; e < E; ++e) {
      const int c = counts[at(l, e, E)];
      bias[at(l, e, E)] += mean > c ? rate : (mean < c ? -rate : 0.0);
    }
  }
  return bias;
}
}  // namespace

TEST_CASE("moe_update_expert_bias moves each bias toward its layer's mean load", "[moe_router]") {
  SECTION("one layer, fp32 parameters updated themselves") {
    const std::vector<int> counts = {3, 5, 4, 4, 0, 8};  // mean 4
    test::DeviceBuffer<int> d_counts(counts);
    test::DeviceBuffer<double> d_wide(6);
    d_wide.poison();
    moe_widen_counts(d_wide, d_counts, 6, nullptr);
    test::DeviceBuffer<float> d_bias(std::vector<float>{0.5f, -0.25f, 0.0f, 1.0f, 0.0f, 0.0f});
    moe_update_expert_bias<float>(d_bias, nullptr, d_wide, 0.125f, 1, 6, 0, 6, nullptr);
    test::require_no_cuda_error();
    CHECK(d_wide.download() == std::vector<double>{3, 5, 4, 4, 0, 8});
    CHECK(d_bias.download() == std::vector<float>{0.625f, -0.375f, 0.0f, 1.0f, 0.125f, -0.125f});
    // One expert: always at the mean.
    test::DeviceBuffer<double> one(std::vector<double>{9});
    test::DeviceBuffer<float> one_bias(std::vector<float>{0.25f});
    moe_update_expert_bias<float>(one_bias, nullptr, one, 1.0f, 1, 1, 0, 1, nullptr);
    test::require_no_cuda_error();
    CHECK(one_bias.download() == std::vector<float>{0.25f});
  }
  SECTION("several layers, owned sub-ranges, fp32 masters and bf16 parameters") {
    // 3 layers of 37 experts (means not integers; layer 1 balanced); the tensor updated as three
    // owned segments that cut through layers, each with its own master and parameter pointers.
    const int L = 3, E = 37;
    std::vector<int> counts(L * E);
    for (int e = 0; e < E; ++e) {
      counts[at(0, e, E)] = (e * 7) % 11;
      counts[at(1, e, E)] = 5;
      counts[at(2, e, E)] = e == 36 ? 1000 : e;
    }
    const std::vector<float> start = test::random_floats(L * E, 77, 0.01f);
    std::vector<double> start_d(start.begin(), start.end());
    const float rate = 1e-3f;
    const std::vector<double> want = reference_bias_update(start_d, counts, rate, L, E);
    test::DeviceBuffer<int> d_counts(counts);
    test::DeviceBuffer<double> d_wide(L * E);
    moe_widen_counts(d_wide, d_counts, L * E, nullptr);
    test::DeviceBuffer<float> d_master(start);
    std::vector<bf16> poisoned(L * E, bf16(-7.0f));
    test::DeviceBuffer<bf16> d_param(poisoned);
    const size_t cuts[] = {0, 20, 60, static_cast<size_t>(L * E)};
    for (int s = 0; s < 3; ++s)
      moe_update_expert_bias<bf16>(d_param.ptr + cuts[s], d_master.ptr + cuts[s], d_wide, rate, L, E, cuts[s],
                                   cuts[s + 1] - cuts[s], nullptr);
    test::require_no_cuda_error();
    const std::vector<float> master = d_master.download();
    const std::vector<bf16> param = d_param.download();
    for (int i = 0; i < L * E; ++i) {
      INFO("element " << i);
      CHECK(master[i] == static_cast<float>(start[i] + static_cast<double>(rate) * (want[i] > start_d[i] ? 1 : want[i] < start_d[i] ? -1 : 0)));
      CHECK(test::same_bits(std::vector<bf16>{param[i]}, std::vector<bf16>{__float2bfloat16_rn(master[i])}));
    }
    CHECK(master[at(1, 4, E)] == start[at(1, 4, E)]);  // a balanced layer does not move
    CHECK(master[at(2, 36, E)] < start[at(2, 36, E)]);   // the overloaded expert falls
  }
}

TEST_CASE("moe router launchers refuse bad shapes", "[moe_router]") {
  test::DeviceBuffer<float> f(1024);
  test::DeviceBuffer<int> i(1024);
  test::DeviceBuffer<bf16> b(1024);
  CHECK_THROWS_WITH(moe_route_softmax_topk(f, i, f, f, 4, 8, 9, nullptr),
                    Catch::Contains("moe_route_softmax_topk: need N>=0 and 1<=K<=E<=256; got N=4 E=8 K=9"));
  CHECK_THROWS_WITH(moe_route_sigmoid_topk<float>(f, i, f, f, f, 4, 257, 2, nullptr), Catch::Contains("E=257"));
  CHECK_THROWS_WITH(moe_router_logits<bf16>(f, b, b, 2, 12, 4, nullptr),
                    Catch::Contains("moe_router_logits: need C a positive multiple of 8"));
  CHECK_THROWS_WITH(moe_router_stats(i, f, i, f, 2, 4, 0, nullptr), Catch::Contains("K=0"));
  test::DeviceBuffer<double> d(1024);
  CHECK_THROWS_WITH(moe_update_expert_bias<float>(f, nullptr, d, 0.1f, 2, 0, 0, 0, nullptr), Catch::Contains("E=0"));
  CHECK_THROWS_WITH(moe_update_expert_bias<float>(f, nullptr, d, 0.1f, 2, 4, 6, 3, nullptr),
                    Catch::Contains("first+count<=L*E; got L=2 E=4 first=6 count=3"));
}

// adamw_update vs. a double-precision AdamW written here: several steps with bias
// correction, gradient scaling and weight decay, with and without fp32 master weights;
// pointers at misaligned and mutually misaligned offsets (vector and scalar paths must give
// the same bits); and the stochastic rounding to bf16 (always a neighbouring bf16 value,
// unbiased on average, same seed → same bits, another seed → other bits); and the optimizer's
// (src/model/optimizer.h) seed for that rounding: bit for bit the documented per-step, per-tensor seed,
// fresh every step, so a parameter held between two bf16 values averages to its master value.
#include "test/test_util.h"
#include "kernels/adamw.cuh"
#include "src/model/optimizer.h"

#include <cstdint>
#include <iterator>
#include <tuple>
#include <type_traits>

namespace {

struct Hyper {
  float lr = 1e-2f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0.1f, grad_scale = 0.5f;
};

// One AdamW step in double on p, m, v (step is 1-based).
void reference_step(std::vector<double>& p, std::vector<double>& m, std::vector<double>& v,
                    const std::vector<float>& grads, const Hyper& h, int step) {
  const double b1 = h.beta1, b2 = h.beta2;
  const double c1 = 1.0 - std::pow(b1, step), c2 = 1.0 - std::pow(b2, step);
  for (size_t i = 0; i < p.size(); ++i) {
    const double g = static_cast<double>(grads[i]) * h.grad_scale;
    m[i] = b1 * m[i] + (1.0 - b1) * g;
    v[i] = b2 * v[i] + (1.0 - b2) * g * g;
    p[i] -= h.lr * ((m[i] / c1) / (std::sqrt(v[i] / c2) + h.eps) + h.weight_decay * p[i]);
  }
}

uint32_t float_bits(float x) {
  uint32_t b;
  std::memcpy(&b, &x, sizeof b);
  return b;
}
float float_from_bits(uint32_t b) {
  float x;
  std::memcpy(&x, &b, sizeof x);
  return x;
}
// The two bf16 values around x: truncated toward zero, and one bf16 ulp further from zero.
float bf16_toward_zero(float x) { return float_from_bits(float_bits(x) & 0xFFFF0000u); }
float bf16_away_from_zero(float x) { return float_from_bits((float_bits(x) & 0xFFFF0000u) + 0x10000u); }

// Whether every bf16 parameter is x itself when x is a bf16 value, else one of its two neighbours.
bool rounded_to_neighbours(const std::vector<bf16>& params, const std::vector<float>& x) {
  for (size_t i = 0; i < x.size(); ++i) {
    const float got = static_cast<float>(params[i]);
    const bool exact = float_bits(x[i]) == float_bits(bf16_toward_zero(x[i]));
    const bool ok = exact ? float_bits(got) == float_bits(x[i])
                          : float_bits(got) == float_bits(bf16_toward_zero(x[i])) ||
                                float_bits(got) == float_bits(bf16_away_from_zero(x[i]));
    if (!ok) {
      UNSCOPED_INFO("param " << i << " = " << got << " is not a bf16 neighbour of " << x[i]);
      return false;
    }
  }
  return true;
}

// Element offsets of each array inside its allocation. The kernel vectorizes only when all
// arrays reach a 16-byte boundary at the same element; otherwise it runs scalar.
struct Layout {
  const char* name;
  size_t params, master, grads, m, v;
};
const Layout kLayouts[] = {
    {"aligned", 0, 0, 0, 0, 0},
    {"same misaligned offset", 3, 3, 3, 3, 3},
    {"mutually misaligned", 0, 1, 0, 0, 2},
};

template <typename T>
struct OptimizerRun {
  std::vector<T> params;
  std::vector<float> master, m, v;
};

// Runs `steps` AdamW steps from the given state (master weights when use_master) and checks
// each step against the double reference; returns the final device state.
template <typename T>
OptimizerRun<T> run_and_check(size_t n, const Layout& layout, bool use_master, int steps, const Hyper& h) {
  const std::vector<float> init = test::round_to<T>(test::random_floats(n, 100 + n, 1.0f));
  std::vector<double> p_ref(init.begin(), init.end()), m_ref(n, 0.0), v_ref(n, 0.0);

  const size_t pad = 4;
  test::DeviceBuffer<T> d_params(n + pad);
  test::DeviceBuffer<float> d_master(n + pad), d_m(n + pad), d_v(n + pad);
  test::DeviceBuffer<T> d_grads(n + pad);
  T* params = d_params.ptr + layout.params;
  float* master = use_master ? d_master.ptr + layout.master : nullptr;
  float* m = d_m.ptr + layout.m;
  float* v = d_v.ptr + layout.v;
  T* grads = d_grads.ptr + layout.grads;
  const std::vector<float> zeros(n, 0.0f);
  const std::vector<T> init_t = test::from_floats<T>(init);
  CUDA_CHECK(cudaMemcpy(params, init_t.data(), n * sizeof(T), cudaMemcpyHostToDevice));
  if (master) CUDA_CHECK(cudaMemcpy(master, init.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(m, zeros.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(v, zeros.data(), n * sizeof(float), cudaMemcpyHostToDevice));

  OptimizerRun<T> run{std::vector<T>(n), std::vector<float>(n), std::vector<float>(n), std::vector<float>(n)};
  for (int step = 1; step <= steps; ++step) {
    INFO("n " << n << ", " << layout.name << ", master " << use_master << ", step " << step);
    const std::vector<float> g = test::round_to<T>(test::random_floats(n, 1000 * step + n, 2.0f));
    const std::vector<T> g_t = test::from_floats<T>(g);
    CUDA_CHECK(cudaMemcpy(grads, g_t.data(), n * sizeof(T), cudaMemcpyHostToDevice));
    // With master weights the T copy is write-only: poison it so an unwritten element shows.
    if (master) CUDA_CHECK(cudaMemset(params, 0xFF, n * sizeof(T)));
    adamw_update(params, master, grads, m, v, n, h.lr, h.beta1, h.beta2, h.eps, h.weight_decay, h.grad_scale, step,
                 1234u + step, 0, nullptr);
    test::require_no_cuda_error();
    reference_step(p_ref, m_ref, v_ref, g, h, step);

    CUDA_CHECK(cudaMemcpy(run.params.data(), params, n * sizeof(T), cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(run.m.data(), m, n * sizeof(float), cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(run.v.data(), v, n * sizeof(float), cudaMemcpyDeviceToHost));
    if (master) CUDA_CHECK(cudaMemcpy(run.master.data(), master, n * sizeof(float), cudaMemcpyDeviceToHost));
    // fp32 state vs double: a few fp32 ulps of the values involved.
    CHECK(test::all_close("m", run.m, m_ref, 1e-5, 1e-7));
    CHECK(test::all_close("v", run.v, v_ref, 1e-5, 1e-8));
    if (master) {
      CHECK(test::all_close("master", run.master, p_ref, 1e-5, 1e-6));
      if constexpr (std::is_same<T, float>::value) {
        CHECK(std::memcmp(run.params.data(), run.master.data(), n * sizeof(float)) == 0);
      } else {
        CHECK(rounded_to_neighbours(run.params, run.master));
      }
    } else if constexpr (std::is_same<T, float>::value) {
      CHECK(test::all_close("params", run.params, p_ref, 1e-5, 1e-6));
    } else {
      // bf16 without master: each step rounds stochastically, so the reference (which keeps
      // full precision) drifts up to one bf16 ulp (2^-7 relative at worst) of the value per
      // step; the value moves by about lr per step, hence the absolute term.
      CHECK(test::all_close("params", run.params, p_ref, step * 0.0079, step * 1e-3));
    }
  }
  return run;
}

}  // namespace

TEMPLATE_TEST_CASE("adamw_update with master weights follows double AdamW over several steps", "[adamw]", float,
                   bf16) {
  const Hyper h;
  for (size_t n : {size_t(1), size_t(7), size_t(1000), size_t(100003)}) {
    std::vector<OptimizerRun<TestType>> runs;
    for (const Layout& layout : kLayouts) runs.push_back(run_and_check<TestType>(n, layout, true, 3, h));
    // Vector body, scalar head/tail and the all-scalar fallback do the same math per element.
    for (size_t k = 1; k < runs.size(); ++k) {
      INFO("n " << n << ": " << kLayouts[k].name << " vs aligned");
      CHECK(test::same_bits(runs[k].params, runs[0].params));
      CHECK(test::same_bits(runs[k].master, runs[0].master));
      CHECK(test::same_bits(runs[k].m, runs[0].m));
      CHECK(test::same_bits(runs[k].v, runs[0].v));
    }
  }
}

TEMPLATE_TEST_CASE("adamw_update without master weights updates the parameters in place", "[adamw]", float, bf16) {
  Hyper h;
  h.weight_decay = 0.0f;  // what the caller passes for biases and LayerNorm parameters
  h.grad_scale = 1.0f;
  for (size_t n : {size_t(1), size_t(7), size_t(1003)})
    for (const Layout& layout : kLayouts) run_and_check<TestType>(n, layout, false, 3, h);
}

namespace {

// Rounds `values` to bf16 through adamw_update with lr = 0 and zero gradients, which leaves
// the fp32 master value exactly as it is and stores it to the bf16 parameters.
std::vector<bf16> stochastic_round(const std::vector<float>& values, unsigned seed) {
  const size_t n = values.size();
  test::DeviceBuffer<bf16> params(n);
  test::DeviceBuffer<float> master(values);
  test::DeviceBuffer<bf16> grads(test::from_floats<bf16>(std::vector<float>(n, 0.0f)));
  test::DeviceBuffer<float> m(std::vector<float>(n, 0.0f)), v(std::vector<float>(n, 0.0f));
  adamw_update(params.ptr, master.ptr, grads.ptr, m.ptr, v.ptr, n, 0.0f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, 1, seed,
               0, nullptr);
  test::require_no_cuda_error();
  REQUIRE(test::same_bits(master.download(), values));
  return params.download();
}

}  // namespace

TEST_CASE("adamw_update rounds bf16 parameters stochastically and reproducibly", "[adamw]") {
  // Sections of equal values at a chosen fraction of a bf16 ulp above a bf16 number (in
  // magnitude); the fraction rounded away from zero estimates the rounding probability.
  struct Case {
    float base, fraction;
  };
  const Case cases[] = {{1.0f, 0.3f}, {-3.0f, 0.7f}, {0.0009765625f, 0.5f}, {2.5f, 0.0f}, {-7.0f, 0.05f}};
  const size_t per_case = 4096;
  std::vector<float> values;
  for (const Case& c : cases) {
    const float ulp = bf16_away_from_zero(c.base) - bf16_toward_zero(c.base);
    values.insert(values.end(), per_case, c.base + std::copysign(c.fraction * std::fabs(ulp), c.base));
  }

  const std::vector<bf16> rounded = stochastic_round(values, 42u);
  REQUIRE(rounded_to_neighbours(rounded, values));
  for (size_t k = 0; k < std::size(cases); ++k) {
    size_t away = 0;
    for (size_t i = k * per_case; i < (k + 1) * per_case; ++i)
      away += float_bits(static_cast<float>(rounded[i])) != float_bits(bf16_toward_zero(values[i]));
    const double rate = static_cast<double>(away) / per_case;
    INFO("base " << cases[k].base << " fraction " << cases[k].fraction << ": rounded away " << rate);
    // Binomial standard deviation is at most sqrt(0.25 / 4096) ≈ 0.008; allow 5 of them.
    CHECK(std::fabs(rate - cases[k].fraction) <= 0.04);
  }

  CHECK(test::same_bits(stochastic_round(values, 42u), rounded));
  CHECK_FALSE(test::same_bits(stochastic_round(values, 43u), rounded));
}

TEST_CASE("stochastic rounding of one element is unbiased over seeds", "[adamw]") {
  const float x = 1.0f + 0.25f * 0.0078125f;  // a quarter of a bf16 ulp above 1
  double sum = 0;
  const int seeds = 256;
  for (int s = 0; s < seeds; ++s) sum += static_cast<float>(stochastic_round({x}, 1000u + s)[0]);
  // Mean of 256 draws of 1 or 1 + 2^-7 with p = 0.25: standard deviation ≈ 2.1e-4.
  CHECK(std::fabs(sum / seeds - x) <= 1e-3);
}

TEMPLATE_TEST_CASE("adamw_update in pieces with index_offset matches one call over the whole range", "[adamw]", float,
                   bf16) {
  // A ZeRO shard boundary may split a tensor anywhere (odd, unaligned offsets included); each
  // piece passes where it starts in the tensor, so parameters, master weights and moments must
  // come out bit-identical to a single call. Without the offset, bf16 rounding bits would differ.
  const size_t n = 1001;
  const std::vector<float> init = test::round_to<TestType>(test::random_floats(n, 7, 1.0f));
  const std::vector<float> g = test::round_to<TestType>(test::random_floats(n, 8, 2.0f));
  auto run = [&](const std::vector<size_t>& cuts, bool with_offset) {
    test::DeviceBuffer<TestType> params(test::from_floats<TestType>(init)), grads(test::from_floats<TestType>(g));
    test::DeviceBuffer<float> master(init), m(std::vector<float>(n, 0.1f)), v(std::vector<float>(n, 0.2f));
    for (size_t k = 0; k + 1 < cuts.size(); ++k) {
      const size_t a = cuts[k], len = cuts[k + 1] - cuts[k];
      adamw_update(params.ptr + a, master.ptr + a, grads.ptr + a, m.ptr + a, v.ptr + a, len, 1e-2f, 0.9f, 0.95f,
                   1e-8f, 0.1f, 0.5f, 3, 99u, with_offset ? a : 0, nullptr);
    }
    test::require_no_cuda_error();
    return std::make_tuple(params.download(), master.download(), m.download(), v.download());
  };
  const auto whole = run({0, n}, true);
  const auto pieces = run({0, 3, 500, 501, 777, n}, true);
  CHECK(test::same_bits(std::get<0>(pieces), std::get<0>(whole)));
  CHECK(test::same_bits(std::get<1>(pieces), std::get<1>(whole)));
  CHECK(test::same_bits(std::get<2>(pieces), std::get<2>(whole)));
  CHECK(test::same_bits(std::get<3>(pieces), std::get<3>(whole)));
  if constexpr (std::is_same<TestType, bf16>::value)
    CHECK_FALSE(test::same_bits(std::get<0>(run({0, 3, 500, 501, 777, n}, false)), std::get<0>(whole)));
}

// ---- the optimizer's choice of rounding seed (src/model/optimizer.h's AdamWUpdate over a whole model)

namespace {

// The stochastic rounding to bf16 as kernels/adamw.cuh documents it, written out here: 16 random
// bits from (seed, index) — x = seed·0x9E3779B97F4A7C15 + index, MurmurHash3's 64-bit finalizer,
// bits 32..47 — added below the bf16 mantissa of x's fp32 bits, then truncated.
uint16_t documented_bf16_rounding(float x, unsigned seed, size_t index) {
  uint64_t h = static_cast<uint64_t>(seed) * 0x9E3779B97F4A7C15ull + index;
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  h *= 0xc4ceb9fe1a85ec53ull;
  h ^= h >> 33;
  return static_cast<uint16_t>((float_bits(x) + ((h >> 32) & 0xFFFFu)) >> 16);
}

// The rounding number src/base/rng.h documents for a tensor: its place among GPT-2's 16 in llm.c
// order, then fc2w 16 and lm_head 17.
int documented_rounding_number(const std::string& name) {
  const char* order[] = {"wte",  "wpe",  "ln1w", "ln1b", "qkvw",    "qkvb",    "attprojw", "attprojb", "ln2w",
                         "ln2b", "fcw",  "fcb",  "fcprojw", "fcprojb", "lnfw", "lnfb",    "fc2w",     "lm_head"};
  for (int i = 0; i < 18; ++i)
    if (name == order[i]) return i;
  throw std::runtime_error("no rounding number for tensor " + name);
}

// The seed src/base/rng.h documents for one AdamW call: SplitMix64's output mix of
// run_seed·0x9E3779B97F4A7C15 + (step << 5 | tensor's rounding number), upper 32 bits.
unsigned documented_seed(uint64_t run_seed, int step, int tensor) {
  uint64_t z = run_seed * 0x9E3779B97F4A7C15ull + ((static_cast<uint64_t>(step) << 5) | static_cast<uint64_t>(tensor));
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return static_cast<unsigned>((z ^ (z >> 31)) >> 32);
}

uint16_t bf16_bits(bf16 x) {
  uint16_t b;
  std::memcpy(&b, &x, sizeof b);
  return b;
}

// A one-rank model (L = 1, C = 8, Vp = maxT = 16: wte and wpe have the same shape) whose
// parameters, gradients (llm.c order) and optimizer state adamw_step updates.
struct ModelOptimizer {
  ParameterLayout layout{ModelConfig{16, 16, 16, 1, 1, 8}};
  GradientBuckets buckets{layout, 1, 1};
  std::vector<OptimizerSegment> segments = buckets.segments(0);
  test::DeviceBuffer<bf16> params{layout.total}, grads{layout.total};
  test::DeviceBuffer<float> master{buckets.shard_elements()};
  test::DeviceBuffer<float> m{std::vector<float>(buckets.shard_elements(), 0.0f)};
  test::DeviceBuffer<float> v{std::vector<float>(buckets.shard_elements(), 0.0f)};

  // Parameters and master weights set to `values` (llm.c order; bf16 copy rounded to nearest).
  void set(const std::vector<float>& values) {
    params.upload(test::from_floats<bf16>(values));
    std::vector<float> state(buckets.shard_elements(), 0.0f);
    for (const OptimizerSegment& s : segments)
      std::copy_n(values.begin() + static_cast<std::ptrdiff_t>(s.param), s.count,
                  state.begin() + static_cast<std::ptrdiff_t>(s.state));
    master.upload(state);
  }
  AdamWUpdate<bf16> update{layout, segments, [](const OptimizerSegment& s) { return s.param; },
                           [](const OptimizerSegment& s) { return s.param; }, params.ptr,
                           master.ptr, grads.ptr, m.ptr, v.ptr};
  void step(const OptimizerSettings& opt, float lr, int step) {
    update.step(opt, lr, step, 0.0f, nullptr);
    test::require_no_cuda_error();
  }
};

}  // namespace

TEST_CASE("the optimizer stores master weights rounded with its documented per-step, per-tensor seed",
          "[adamw][optimizer]") {
  // Reference: the documented seed and rounding written out above, applied to the master
  // weights the step produced. A seed that ignores the step or the tensor (the run's seed, say)
  // rounds hundreds of these elements differently.
  ModelOptimizer model;
  model.set(test::round_to<bf16>(test::random_floats(model.layout.total, 21, 0.5f)));
  OptimizerSettings opt;
  opt.seed = 1234;
  opt.weight_decay = 0.1f;
  opt.grad_clip = 0.0f;
  for (int step = 1; step <= 3; ++step) {
    model.grads.upload(test::from_floats<bf16>(test::random_floats(model.layout.total, 30 + step, 1.0f)));
    model.step(opt, 1e-2f, step);
    const std::vector<bf16> params = model.params.download();
    const std::vector<float> master = model.master.download();
    size_t mismatches = 0;
    for (const OptimizerSegment& s : model.segments) {
      const unsigned seed = documented_seed(opt.seed, step, documented_rounding_number(model.layout[s.tensor].name));
      for (size_t k = 0; k < s.count; ++k) {
        const size_t index = s.param - model.layout[s.tensor].offset + k;  // within the tensor
        const uint16_t want = documented_bf16_rounding(master[s.state + k], seed, index);
        if (bf16_bits(params[s.param + k]) != want && mismatches++ == 0)
          UNSCOPED_INFO("step " << step << ", " << model.layout[s.tensor].name << "[" << index << "]: bf16 bits "
                                << bf16_bits(params[s.param + k]) << ", documented rounding gives " << want);
      }
    }
    INFO("step " << step << ": " << mismatches << " of " << model.layout.total << " parameters differ");
    CHECK(mismatches == 0);
  }
}

TEST_CASE("a bf16 parameter held halfway between two bf16 values averages to its master value",
          "[adamw][optimizer]") {
  // lr = 0 keeps every master weight at 1 + 2^-8, halfway between the bf16 values 1 and
  // 1 + 2^-7; each step draws fresh rounding bits, so the stored values differ from step to step
  // and between tensors holding the same values (wte and wpe), and over 200 steps each element
  // is rounded up about half the time. A seed constant over steps rounds an element the same
  // way every step: its mean sits half a bf16 ulp off.
  ModelOptimizer model;
  const float halfway = 1.0f + 0x1.0p-8f;
  model.set(std::vector<float>(model.layout.total, halfway));
  model.grads.upload(std::vector<bf16>(model.layout.total, bf16(0.0f)));
  OptimizerSettings opt;
  opt.seed = 7;
  const int steps = 200;
  std::vector<double> sum(model.layout.total, 0.0);
  std::vector<bf16> first;
  for (int step = 1; step <= steps; ++step) {
    model.step(opt, 0.0f, step);
    const std::vector<bf16> params = model.params.download();
    for (size_t i = 0; i < params.size(); ++i) sum[i] += static_cast<float>(params[i]);
    if (step == 1) {
      first = params;
      const auto wte = params.begin() + static_cast<std::ptrdiff_t>(model.layout[kWte].offset);
      const auto wpe = params.begin() + static_cast<std::ptrdiff_t>(model.layout[kWpe].offset);
      CHECK_FALSE(std::equal(wte, wte + static_cast<std::ptrdiff_t>(model.layout[kWte].count), wpe,
                             [](bf16 a, bf16 b) { return bf16_bits(a) == bf16_bits(b); }));
    }
    if (step == 2) CHECK_FALSE(test::same_bits(params, first));
  }
  REQUIRE(model.master.download() == std::vector<float>(model.buckets.shard_elements(), halfway));
  // Rounded up k of 200 times: the mean is 1 + (k / 200) · 2^-7, k ~ Binomial(200, 1/2) with
  // standard deviation 7; a quarter ulp allows 50 (7 standard deviations).
  size_t off = 0;
  for (size_t i = 0; i < sum.size(); ++i) {
    const double mean = sum[i] / steps;
    if (std::fabs(mean - halfway) > 0x1.0p-9 && off++ == 0)
      UNSCOPED_INFO("parameter " << i << ": mean " << mean << " over " << steps << " steps, master " << halfway);
  }
  CHECK(off == 0);
}

// ---- the optimizer's table of segments (kernels/adamw.cuh's one launch per step)

namespace {

// The stochastic rounding as adamw.cuh specifies it, on the host: 16 bits from the counter-based
// hash of (seed, index) added below the bf16 mantissa of x, then truncated (x finite here).
float segment_test_rounded(float x, unsigned seed, size_t index) {
  uint64_t h = static_cast<uint64_t>(seed) * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(index);
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  h *= 0xc4ceb9fe1a85ec53ull;
  h ^= h >> 33;
  return float_from_bits((float_bits(x) + (static_cast<uint32_t>(h >> 32) & 0xFFFFu)) & 0xFFFF0000u);
}

// A segment of the table test: where its parameters and gradients start (its state is packed
// after the previous segment's, as a rank's state is), its element count, its first element's
// index within its tensor, the tensor (its seed) and whether weight decay applies.
struct TableSegment {
  size_t param, grad, count, index;
  int tensor;
  bool decayed;
};

}  // namespace

TEMPLATE_TEST_CASE("adamw over a table of segments updates each element as its segment says", "[adamw][segments]",
                   float, bf16) {
  // One launch over segments as a ZeRO shard cuts them: odd counts (scalar heads and tails, one
  // block and several), parameters and gradients in other orders with gaps between them, one
  // segment whose arrays are mutually aligned (128-bit body) and others not, tensors sharing a
  // seed or not, decayed or not, index bases anywhere in their tensor. Checked per element
  // against a plain double loop; the stored bf16 bits against the rounding recomputed here from
  // the segment's seed and the element's index; everything outside the segments untouched.
  using T = TestType;
  const std::vector<TableSegment> segs = {{5, 3000, 1, 0, 0, true},        {6, 2000, 7, 40, 0, true},
                                          {904, 0, 1000, 3, 1, false},     {13, 1005, 2 * 256 + 9, 100000, 2, true},
                                          {2000, 1700, 33, 7, 1, false}};
  const size_t P = 2040, G = 3001;
  size_t S = 0;
  std::vector<size_t> state;
  for (const TableSegment& s : segs) {
    state.push_back(S);
    S += s.count;
  }
  const Hyper h;
  const unsigned tensor_seeds[3] = {11u, 22u, 33u};
  for (const bool use_master : {true, false}) {
    if (std::is_same<T, bf16>::value && !use_master) continue;  // bf16 parameters always have master weights
    INFO("master " << use_master);
    const std::vector<float> init = test::round_to<T>(test::random_floats(P, 5, 1.0f));
    std::vector<double> p_ref(init.begin(), init.end()), m_ref(S, 0.0), v_ref(S, 0.0);
    std::vector<float> master_init(S);
    for (size_t k = 0; k < segs.size(); ++k)
      for (size_t i = 0; i < segs[k].count; ++i) master_init[state[k] + i] = init[segs[k].param + i];
    test::DeviceBuffer<T> params(test::from_floats<T>(init)), grads(G);
    test::DeviceBuffer<float> master(master_init), m(std::vector<float>(S, 0.0f)), v(std::vector<float>(S, 0.0f));

    std::vector<AdamWSegment> table;
    for (size_t k = 0; k < segs.size(); ++k)
      table.push_back(AdamWSegment{segs[k].param, segs[k].grad, state[k], segs[k].count, segs[k].index, 0, 0, 0,
                                   segs[k].tensor, segs[k].decayed ? 1 : 0});
    float* master_ptr = use_master ? master.ptr : nullptr;
    const AdamWPlan plan = adamw_plan_segments(table, params.ptr, master_ptr, grads.ptr, m.ptr, v.ptr);
    REQUIRE(table[2].vectors > 0);   // the aligned segment has a 128-bit body
    REQUIRE(table[3].head == table[3].count);  // the mutually misaligned one is all scalar
    test::DeviceBuffer<AdamWSegment> device_table(table);

    for (int step = 1; step <= 3; ++step) {
      INFO("step " << step);
      const std::vector<float> g = test::round_to<T>(test::random_floats(G, 50 + step, 2.0f));
      grads.upload(test::from_floats<T>(g));
      AdamWSeeds seeds{};
      for (int t = 0; t < 3; ++t) seeds.of_tensor[t] = tensor_seeds[t] + 100u * step;
      const AdamWHyper hyper = adamw_hyper(h.lr, h.beta1, h.beta2, h.eps, h.weight_decay, h.grad_scale, step);
      adamw_launch(device_table.ptr, static_cast<int>(table.size()), plan, params.ptr, master_ptr, grads.ptr, m.ptr,
                   v.ptr, hyper, seeds, nullptr);
      test::require_no_cuda_error();

      const std::vector<float> got_p = test::to_floats(params.download()), got_master = master.download(),
                               got_m = m.download(), got_v = v.download();
      std::vector<bool> in_segment(P, false);
      for (size_t k = 0; k < segs.size(); ++k) {
        const TableSegment& s = segs[k];
        INFO("segment " << k);
        Hyper hk = h;
        hk.weight_decay = s.decayed ? h.weight_decay : 0.0f;
        std::vector<double> p(p_ref.begin() + s.param, p_ref.begin() + s.param + s.count),
            mr(m_ref.begin() + state[k], m_ref.begin() + state[k] + s.count),
            vr(v_ref.begin() + state[k], v_ref.begin() + state[k] + s.count);
        reference_step(p, mr, vr, std::vector<float>(g.begin() + s.grad, g.begin() + s.grad + s.count), hk, step);
        std::copy(p.begin(), p.end(), p_ref.begin() + s.param);
        std::copy(mr.begin(), mr.end(), m_ref.begin() + state[k]);
        std::copy(vr.begin(), vr.end(), v_ref.begin() + state[k]);
        const auto slice = [&](const std::vector<float>& x, size_t at) {
          return std::vector<float>(x.begin() + at, x.begin() + at + s.count);
        };
        CHECK(test::all_close("m", slice(got_m, state[k]), mr, 1e-5, 1e-7));
        CHECK(test::all_close("v", slice(got_v, state[k]), vr, 1e-5, 1e-8));
        const std::vector<float> updated = use_master ? slice(got_master, state[k]) : slice(got_p, s.param);
        CHECK(test::all_close("parameters", updated, p, 1e-5, 1e-6));
        std::vector<float> stored(s.count);
        for (size_t i = 0; i < s.count; ++i) {
          stored[i] = std::is_same<T, bf16>::value ? segment_test_rounded(updated[i], seeds.of_tensor[s.tensor], s.index + i)
                                                   : updated[i];
          in_segment[s.param + i] = true;
        }
        CHECK(test::same_bits(slice(got_p, s.param), stored));
      }
      size_t touched = 0;
      for (size_t i = 0; i < P; ++i) touched += !in_segment[i] && float_bits(got_p[i]) != float_bits(init[i]);
      CHECK(touched == 0);
    }
  }
}

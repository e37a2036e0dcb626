// rope_frequencies / rope_table / rope_forward / rope_backward. The frequencies against the values
// PyTorch 1.13 printed from Meta's reference arithmetic (fp32 tensors: 1/θ^(arange(0, HS, 2)/HS),
// then Llama 3.1's scaling rule) for HS = 128 and 64, unscaled and at factors 8 (3.1) and 32 (3.2),
// and against the rule in double; the kernels against double-precision loops written here from
// Meta's complex multiplication of adjacent pairs: the fused QKV layout rotating q and k and
// leaving v untouched (out of place into a poisoned buffer, and in place), positions offset past
// the original context (decoding), odd sizes (T = 1, 37; HS = 8, 24), every preset's heads and
// head size up to Llama 3.1 405B's 128 + 8 rotated heads, both dtypes, bit-identical reruns.
#include "test/test_util.h"
#include "kernels/rope.cuh"

#include <complex>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace {

// float.hex() of PyTorch's fp32 results, θ = 500000.
const float kMetaFreqs128[] = {
    0x1p+0f, 0x1.a11582p-1f, 0x1.53c38cp-1f, 0x1.14c708p-1f, 0x1.c2ef78p-2f, 0x1.6f56fap-2f, 0x1.2b3dc6p-2f,
    0x1.e788c2p-3f, 0x1.8d276p-3f, 0x1.43874p-3f, 0x1.078d4p-3f, 0x1.ad6338p-4f, 0x1.5dc95ap-4f, 0x1.1cf13p-4f,
    0x1.d03ccep-5f, 0x1.7a2d08p-5f, 0x1.34119p-5f, 0x1.f5ea7ep-6f, 0x1.98de92p-6f, 0x1.4d1272p-6f,
    0x1.0f5386p-6f, 0x1.ba0dd8p-7f, 0x1.681adap-7f, 0x1.2558fep-7f, 0x1.ddee9ep-8f, 0x1.8554ecp-8f,
    0x1.3d2804p-8f, 0x1.025c6ap-8f, 0x1.a4ee4p-9f, 0x1.56e5b8p-9f, 0x1.175482p-9f, 0x1.c7182p-10f,
    0x1.72ba42p-10f, 0x1.2e0046p-10f, 0x1.ec07d4p-11f, 0x1.90d10cp-11f, 0x1.46831ap-11f, 0x1.09fb7ep-11f,
    0x1.b15902p-12f, 0x1.610332p-12f, 0x1.1f91fp-12f, 0x1.d484dep-13f, 0x1.7da9e8p-13f, 0x1.36e8eap-13f,
    0x1.fa8b86p-14f, 0x1.9ca3eap-14f, 0x1.5024d6p-14f, 0x1.11d41ep-14f, 0x1.be2188p-15f, 0x1.6b6d0ep-15f,
    0x1.280d96p-15f, 0x1.e257p-16f, 0x1.88ec2p-16f, 0x1.4014d2p-16f, 0x1.04be68p-16f, 0x1.a8d01p-17f,
    0x1.5a0f4ep-17f, 0x1.19e8p-17f, 0x1.cb4a9ap-18f, 0x1.76258ep-18f, 0x1.30c94ep-18f, 0x1.f09184p-19f,
    0x1.94836p-19f, 0x1.4985fep-19f
};
const float kMetaFreqs128Factor8[] = {
    0x1p+0f, 0x1.a11582p-1f, 0x1.53c38cp-1f, 0x1.14c708p-1f, 0x1.c2ef78p-2f, 0x1.6f56fap-2f, 0x1.2b3dc6p-2f,
    0x1.e788c2p-3f, 0x1.8d276p-3f, 0x1.43874p-3f, 0x1.078d4p-3f, 0x1.ad6338p-4f, 0x1.5dc95ap-4f, 0x1.1cf13p-4f,
    0x1.d03ccep-5f, 0x1.7a2d08p-5f, 0x1.34119p-5f, 0x1.f5ea7ep-6f, 0x1.98de92p-6f, 0x1.4d1272p-6f,
    0x1.0f5386p-6f, 0x1.ba0dd8p-7f, 0x1.681adap-7f, 0x1.2558fep-7f, 0x1.ddee9ep-8f, 0x1.8554ecp-8f,
    0x1.3d2804p-8f, 0x1.025c6ap-8f, 0x1.a4ee4p-9f, 0x1.1bfa0cp-9f, 0x1.67a23ap-10f, 0x1.c12f3cp-11f,
    0x1.132ba4p-11f, 0x1.47e21p-12f, 0x1.765ba4p-13f, 0x1.90d10cp-14f, 0x1.46831ap-14f, 0x1.09fb7ep-14f,
    0x1.b15902p-15f, 0x1.610332p-15f, 0x1.1f91fp-15f, 0x1.d484dep-16f, 0x1.7da9e8p-16f, 0x1.36e8eap-16f,
    0x1.fa8b86p-17f, 0x1.9ca3eap-17f, 0x1.5024d6p-17f, 0x1.11d41ep-17f, 0x1.be2188p-18f, 0x1.6b6d0ep-18f,
    0x1.280d96p-18f, 0x1.e257p-19f, 0x1.88ec2p-19f, 0x1.4014d2p-19f, 0x1.04be68p-19f, 0x1.a8d01p-20f,
    0x1.5a0f4ep-20f, 0x1.19e8p-20f, 0x1.cb4a9ap-21f, 0x1.76258ep-21f, 0x1.30c94ep-21f, 0x1.f09184p-22f,
    0x1.94836p-22f, 0x1.4985fep-22f
};
const float kMetaFreqs128Factor32[] = {
    0x1p+0f, 0x1.a11582p-1f, 0x1.53c38cp-1f, 0x1.14c708p-1f, 0x1.c2ef78p-2f, 0x1.6f56fap-2f, 0x1.2b3dc6p-2f,
    0x1.e788c2p-3f, 0x1.8d276p-3f, 0x1.43874p-3f, 0x1.078d4p-3f, 0x1.ad6338p-4f, 0x1.5dc95ap-4f, 0x1.1cf13p-4f,
    0x1.d03ccep-5f, 0x1.7a2d08p-5f, 0x1.34119p-5f, 0x1.f5ea7ep-6f, 0x1.98de92p-6f, 0x1.4d1272p-6f,
    0x1.0f5386p-6f, 0x1.ba0dd8p-7f, 0x1.681adap-7f, 0x1.2558fep-7f, 0x1.ddee9ep-8f, 0x1.8554ecp-8f,
    0x1.3d2804p-8f, 0x1.025c6ap-8f, 0x1.a4ee4p-9f, 0x1.15a9fp-9f, 0x1.524f36p-10f, 0x1.8fca8ep-11f,
    0x1.c26c4p-12f, 0x1.d32b32p-13f, 0x1.9731eep-14f, 0x1.90d10cp-16f, 0x1.46831ap-16f, 0x1.09fb7ep-16f,
    0x1.b15902p-17f, 0x1.610332p-17f, 0x1.1f91fp-17f, 0x1.d484dep-18f, 0x1.7da9e8p-18f, 0x1.36e8eap-18f,
    0x1.fa8b86p-19f, 0x1.9ca3eap-19f, 0x1.5024d6p-19f, 0x1.11d41ep-19f, 0x1.be2188p-20f, 0x1.6b6d0ep-20f,
    0x1.280d96p-20f, 0x1.e257p-21f, 0x1.88ec2p-21f, 0x1.4014d2p-21f, 0x1.04be68p-21f, 0x1.a8d01p-22f,
    0x1.5a0f4ep-22f, 0x1.19e8p-22f, 0x1.cb4a9ap-23f, 0x1.76258ep-23f, 0x1.30c94ep-23f, 0x1.f09184p-24f,
    0x1.94836p-24f, 0x1.4985fep-24f
};
const float kMetaFreqs64[] = {
    0x1p+0f, 0x1.53c38cp-1f, 0x1.c2ef78p-2f, 0x1.2b3dc6p-2f, 0x1.8d276p-3f, 0x1.078d4p-3f, 0x1.5dc95ap-4f,
    0x1.d03ccep-5f, 0x1.34119p-5f, 0x1.98de92p-6f, 0x1.0f5386p-6f, 0x1.681adap-7f, 0x1.ddee9ep-8f,
    0x1.3d2804p-8f, 0x1.a4ee4p-9f, 0x1.175482p-9f, 0x1.72ba42p-10f, 0x1.ec07d4p-11f, 0x1.46831ap-11f,
    0x1.b15902p-12f, 0x1.1f91fp-12f, 0x1.7da9e8p-13f, 0x1.fa8b86p-14f, 0x1.5024d6p-14f, 0x1.be2188p-15f,
    0x1.280d96p-15f, 0x1.88ec2p-16f, 0x1.04be68p-16f, 0x1.5a0f4ep-17f, 0x1.cb4a9ap-18f, 0x1.30c94ep-18f,
    0x1.94836p-19f
};
const float kMetaFreqs64Factor8[] = {
    0x1p+0f, 0x1.53c38cp-1f, 0x1.c2ef78p-2f, 0x1.2b3dc6p-2f, 0x1.8d276p-3f, 0x1.078d4p-3f, 0x1.5dc95ap-4f,
    0x1.d03ccep-5f, 0x1.34119p-5f, 0x1.98de92p-6f, 0x1.0f5386p-6f, 0x1.681adap-7f, 0x1.ddee9ep-8f,
    0x1.3d2804p-8f, 0x1.a4ee4p-9f, 0x1.67a23ap-10f, 0x1.132ba4p-11f, 0x1.765ba4p-13f, 0x1.46831ap-14f,
    0x1.b15902p-15f, 0x1.1f91fp-15f, 0x1.7da9e8p-16f, 0x1.fa8b86p-17f, 0x1.5024d6p-17f, 0x1.be2188p-18f,
    0x1.280d96p-18f, 0x1.88ec2p-19f, 0x1.04be68p-19f, 0x1.5a0f4ep-20f, 0x1.cb4a9ap-21f, 0x1.30c94ep-21f,
    0x1.94836p-22f
};
const float kMetaFreqs64Factor32[] = {
    0x1p+0f, 0x1.53c38cp-1f, 0x1.c2ef78p-2f, 0x1.2b3dc6p-2f, 0x1.8d276p-3f, 0x1.078d4p-3f, 0x1.5dc95ap-4f,
    0x1.d03ccep-5f, 0x1.34119p-5f, 0x1.98de92p-6f, 0x1.0f5386p-6f, 0x1.681adap-7f, 0x1.ddee9ep-8f,
    0x1.3d2804p-8f, 0x1.a4ee4p-9f, 0x1.524f36p-10f, 0x1.c26c4p-12f, 0x1.9731eep-14f, 0x1.46831ap-16f,
    0x1.b15902p-17f, 0x1.1f91fp-17f, 0x1.7da9e8p-18f, 0x1.fa8b86p-19f, 0x1.5024d6p-19f, 0x1.be2188p-20f,
    0x1.280d96p-20f, 0x1.88ec2p-21f, 0x1.04be68p-21f, 0x1.5a0f4ep-22f, 0x1.cb4a9ap-23f, 0x1.30c94ep-23f,
    0x1.94836p-24f
};

constexpr RopeConfig kLlama3{500000.0f, false, 0.0f, 0.0f, 0.0f, 0};
constexpr RopeConfig kLlama31{500000.0f, true, 8.0f, 1.0f, 4.0f, 8192};
constexpr RopeConfig kLlama32{500000.0f, true, 32.0f, 1.0f, 4.0f, 8192};

// The scaling rule in double, written from its description: wavelength λ = 2π/f; λ below
// context/high keeps f, above context/low divides it by the factor, and in between the two are
// blended by s = (context/λ − low)/(high − low).
std::vector<double> reference_frequencies(const RopeConfig& rope, int head_size) {
  std::vector<double> freqs(head_size / 2);
  for (int i = 0; i < head_size / 2; ++i) {
    double f = std::pow(static_cast<double>(rope.theta), -2.0 * i / head_size);
    if (rope.scaled) {
      const double wavelength = 2 * std::acos(-1.0) / f, context = rope.original_context;
      if (wavelength > context / rope.low_freq_factor) {
        f /= rope.factor;
      } else if (wavelength >= context / rope.high_freq_factor) {
        const double s = (context / wavelength - rope.low_freq_factor) / (rope.high_freq_factor - rope.low_freq_factor);
        f = (1 - s) * f / rope.factor + s * f;
      }
    }
    freqs[i] = f;
  }
  return freqs;
}

// The fp32 frequencies Meta's arithmetic gives: PyTorch's values where printed above, else the
// double rule rounded (used only at small positions, where one ulp of f does not show).
std::vector<float> meta_frequencies(const RopeConfig& rope, int head_size) {
  const float* printed = nullptr;
  if (head_size == 128)
    printed = !rope.scaled ? kMetaFreqs128 : rope.factor == 8 ? kMetaFreqs128Factor8 : kMetaFreqs128Factor32;
  if (head_size == 64)
    printed = !rope.scaled ? kMetaFreqs64 : rope.factor == 8 ? kMetaFreqs64Factor8 : kMetaFreqs64Factor32;
  if (printed) return std::vector<float>(printed, printed + head_size / 2);
  const std::vector<double> exact = reference_frequencies(rope, head_size);
  return std::vector<float>(exact.begin(), exact.end());
}

struct RopeShape {
  int B, T, NH, NKV, HS, first_position;
  RopeConfig rope;
};

const RopeShape kShapes[] = {
    {1, 1, 1, 1, 8, 0, kLlama3},          // T = 1, one bf16 chunk per head
    {2, 3, 3, 1, 16, 0, kLlama31},        // GQA 3:1
    {1, 37, 4, 2, 24, 0, kLlama32},       // odd T and HS (3 bf16 / 6 fp32 chunks per head)
    {2, 5, 32, 8, 64, 8190, kLlama32},    // Llama 3.2 1B, positions past the original context
    {1, 2, 24, 8, 128, 0, kLlama32},      // Llama 3.2 3B
    {1, 2, 32, 8, 128, 4000, kLlama31},   // Llama 3.1 8B
    {1, 2, 64, 8, 128, 0, kLlama31},      // Llama 3.1 70B
    {1, 2, 128, 8, 128, 8190, kLlama31},  // Llama 3.1 405B
    {1, 1, 4, 2, 128, 9000, kLlama3},     // one decoding step, unscaled
};

// rotate(x, ±1): the first NH + NKV heads of each row multiplied pairwise by e^{±i·a}, a = p·f in
// fp32 (as Meta's torch.outer forms it); the v heads copied.
std::vector<double> reference_rotate(const std::vector<float>& x, const RopeShape& s, double direction) {
  const std::vector<float> freqs = meta_frequencies(s.rope, s.HS);
  const int row_stride = (s.NH + 2 * s.NKV) * s.HS;
  std::vector<double> y(x.begin(), x.end());
  for (int b = 0; b < s.B; ++b)
    for (int t = 0; t < s.T; ++t) {
      const float position = static_cast<float>(s.first_position + t);
      for (int h = 0; h < s.NH + s.NKV; ++h)
        for (int i = 0; i < s.HS / 2; ++i) {
          const size_t at = (static_cast<size_t>(b) * s.T + t) * row_stride + static_cast<size_t>(h) * s.HS + 2 * i;
          const double angle = static_cast<float>(position * freqs[i]);
          const std::complex<double> z = std::complex<double>(x[at], x[at + 1]) * std::polar(1.0, direction * angle);
          y[at] = z.real();
          y[at + 1] = z.imag();
        }
    }
  return y;
}

// fp32 math, then one rounding (bf16: one ulp, 2^-7 relative); fp32: cos/sin rounded to fp32
// and two products.
template <typename T> constexpr double kRel = std::is_same<T, float>::value ? 1e-5 : 1.0 / 128;
constexpr double kAbs = 1e-5;

template <typename T>
void check_rope(const RopeShape& s, uint64_t seed) {
  INFO("B " << s.B << " T " << s.T << " NH " << s.NH << " NKV " << s.NKV << " HS " << s.HS << " from "
            << s.first_position << (s.rope.scaled ? " scaled by " : " unscaled ") << s.rope.factor);
  const int heads = s.NH + s.NKV, row_stride = (s.NH + 2 * s.NKV) * s.HS;
  const int positions = s.first_position + s.T;
  const size_t count = static_cast<size_t>(s.B) * s.T * row_stride;
  test::DeviceBuffer<float> table(rope_table(s.rope, s.HS, positions));
  const std::vector<float> qkv = test::round_to<T>(test::random_floats(count, seed));
  test::DeviceBuffer<T> d_qkv(test::from_floats<T>(qkv)), d_out(count);
  const std::vector<T> poisoned = d_out.download();
  // Only the q and k channels of a row are written; v keeps what was there.
  auto v_channels = [&](const std::vector<T>& m) {
    std::vector<T> v;
    for (size_t row = 0; row < count / row_stride; ++row)
      v.insert(v.end(), m.begin() + row * row_stride + static_cast<size_t>(heads) * s.HS,
               m.begin() + (row + 1) * row_stride);
    return v;
  };

  for (const double direction : {1.0, -1.0}) {
    INFO((direction > 0 ? "forward" : "backward"));
    auto run = [&](T* out, const T* inp) {
      if (direction > 0)
        rope_forward<T>(out, inp, table, positions, s.B, s.T, heads, s.HS, row_stride, s.first_position, nullptr);
      else
        rope_backward<T>(out, inp, table, positions, s.B, s.T, heads, s.HS, row_stride, s.first_position, nullptr);
      test::require_no_cuda_error();
    };
    std::vector<double> want = reference_rotate(qkv, s, direction);
    d_out.poison();
    run(d_out, d_qkv);
    const std::vector<T> got = d_out.download();
    CHECK(test::bytes_of(v_channels(got)) == test::bytes_of(v_channels(poisoned)));
    std::vector<T> got_qk = got;  // v compared as the input's values
    std::vector<T> input_bits = test::from_floats<T>(qkv);
    for (size_t row = 0; row < count / row_stride; ++row)
      for (size_t c = static_cast<size_t>(heads) * s.HS; c < static_cast<size_t>(row_stride); ++c)
        got_qk[row * row_stride + c] = input_bits[row * row_stride + c];
    CHECK(test::all_close(direction > 0 ? "rope_forward" : "rope_backward", got_qk, want, kRel<T>, kAbs));

    // Rerun into a re-poisoned buffer, then in place over the input: same bits, v untouched.
    d_out.poison();
    run(d_out, d_qkv);
    CHECK(test::bytes_of(d_out.download()) == test::bytes_of(got));
    test::DeviceBuffer<T> in_place(input_bits);
    run(in_place, in_place);
    CHECK(test::bytes_of(in_place.download()) == test::bytes_of(got_qk));
  }
}

}  // namespace

TEST_CASE("rope_frequencies match PyTorch's fp32 arithmetic for Llama 3, 3.1 and 3.2", "[rope]") {
  for (const RopeConfig& rope : {kLlama3, kLlama31, kLlama32})
    for (const int head_size : {128, 64}) {
      INFO("HS " << head_size << (rope.scaled ? " scaled by " : " unscaled ") << rope.factor);
      const std::vector<float> got = rope_frequencies(rope, head_size);
      const std::vector<float> printed = meta_frequencies(rope, head_size);
      CHECK(test::bytes_of(got) == test::bytes_of(printed));
      // The printed values themselves follow the rule (fp32 steps: a few ulps).
      CHECK(test::all_close("PyTorch's frequencies vs the rule in double", printed,
                            reference_frequencies(rope, head_size), 1e-6, 0.0));
    }
  // Scaling touches only the low frequencies: 3.1 and 3.2 keep f_0 and divide the last by their factor.
  const std::vector<float> plain = rope_frequencies(kLlama3, 128);
  const std::vector<float> by8 = rope_frequencies(kLlama31, 128), by32 = rope_frequencies(kLlama32, 128);
  CHECK(by8[0] == plain[0]);
  CHECK(by8[63] == plain[63] / 8);
  CHECK(by32[63] == plain[63] / 32);
}

TEST_CASE("rope_table holds cos and sin of the fp32 angle", "[rope]") {
  const int head_size = 64, positions = 9000;
  const std::vector<float> table = rope_table(kLlama32, head_size, positions);
  const std::vector<float> freqs = meta_frequencies(kLlama32, head_size);
  std::vector<double> want(table.size());
  for (int p = 0; p < positions; ++p)
    for (int i = 0; i < head_size / 2; ++i) {
      const double angle = static_cast<float>(static_cast<float>(p) * freqs[i]);
      want[static_cast<size_t>(p) * head_size + 2 * i] = std::cos(angle);
      want[static_cast<size_t>(p) * head_size + 2 * i + 1] = std::sin(angle);
    }
  CHECK(test::all_close("rope_table", table, want, 0.0, 6e-8));
}

TEMPLATE_TEST_CASE("rope forward and backward match Meta's complex rotation", "[rope]", float, bf16) {
  uint64_t seed = 6000;
  for (const RopeShape& s : kShapes) check_rope<TestType>(s, seed += 10);
}

TEST_CASE("rope launchers refuse bad shapes and positions outside the table", "[rope]") {
  test::DeviceBuffer<bf16> buf(1024);
  test::DeviceBuffer<float> table(rope_table(kLlama31, 16, 4));
  CHECK_THROWS_WITH(rope_forward<bf16>(buf, buf, table, 4, 1, 2, 2, 12, 24, 0, nullptr),
                    Catch::Contains("rope_forward: need B, T, heads >= 1, HS a positive multiple of 8"));
  CHECK_THROWS_WITH(rope_forward<bf16>(buf, buf, table, 4, 1, 2, 3, 16, 32, 0, nullptr),
                    Catch::Contains("row_stride=32"));
  CHECK_THROWS_WITH(rope_backward<bf16>(buf, buf, table, 4, 1, 3, 1, 16, 16, 2, nullptr),
                    Catch::Contains("rope_backward: positions [2, 5) outside the table's 4 positions"));
  CHECK_THROWS_WITH(rope_frequencies(RopeConfig{500000.0f, true, 8.0f, 4.0f, 4.0f, 8192}, 128),
                    Catch::Contains("high_freq_factor 4 must exceed low_freq_factor 4"));
}

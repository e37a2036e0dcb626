// fused_classifier vs. a double-precision softmax / cross-entropy written here: losses,
// in-place logit gradients, the untouched-logits mode, padded vocabulary columns (poisoned
// with NaN on input, exact zeros on output), numerically large logits, bit-identical reruns, and
// two rows of every preset's vocabulary (test/preset_shapes.h).
#include "test/preset_shapes.h"
#include "test/test_util.h"
#include "kernels/classifier.cuh"
#include "test/classifier_reference.h"

#include <cstdint>
#include <limits>
#include <type_traits>

namespace {

struct ClassifierShape {
  int rows, V, Vp;
  float offset;  // added to every real logit: a large one overflows a naive exp-sum in fp32
};

template <typename T>
std::vector<uint16_t> bits_of(const std::vector<T>& v) {
  std::vector<uint16_t> b(v.size() * sizeof(T) / 2);
  std::memcpy(b.data(), v.data(), v.size() * sizeof(T));
  return b;
}

template <typename T>
void check_classifier(const ClassifierShape& s, uint64_t seed) {
  INFO("rows " << s.rows << " V " << s.V << " Vp " << s.Vp << " offset " << s.offset);
  const size_t count = static_cast<size_t>(s.rows) * s.Vp;
  const std::vector<float> noise = test::random_floats(count, seed, 2.0f);
  std::vector<float> logits(count);
  for (int r = 0; r < s.rows; ++r)
    for (int j = 0; j < s.Vp; ++j) {
      const size_t i = static_cast<size_t>(r) * s.Vp + j;
      logits[i] = j < s.V ? noise[i] + s.offset : std::numeric_limits<float>::quiet_NaN();
    }
  logits = test::round_to<T>(logits);
  std::vector<int> targets = test::random_tokens(s.rows, s.V, seed + 1);
  targets[0] = s.V - 1;  // the last real column, inside the masked final vector
  if (s.rows > 1) targets[s.rows - 1] = 0;
  const float dloss = 1.0f / (3.0f * s.rows);
  const ClassifierReference ref = classifier_reference(logits, targets, s.rows, s.V, s.Vp, dloss);

  const std::vector<T> input = test::from_floats<T>(logits);
  test::DeviceBuffer<T> d_logits(input);
  test::DeviceBuffer<float> d_losses(s.rows);
  test::DeviceBuffer<int> d_targets(targets);

  // Losses are fp32 in both dtypes; |error| grows with the size of logsumexp (~|offset|).
  const double loss_abs = 1e-5 * (1.0 + std::fabs(s.offset));
  // Gradients: fp32 math, then stored as T (bf16: a few bf16 ulps); abs floor scaled by dloss.
  const double grad_rel = std::is_same<T, float>::value ? 1e-4 : test::Tolerance<bf16>::rel;
  const double grad_abs = 1e-6 * dloss;

  {  // loss only: logits untouched
    fused_classifier(d_logits.ptr, d_losses.ptr, d_targets.ptr, s.rows, s.V, s.Vp, dloss, false, nullptr);
    test::require_no_cuda_error();
    CHECK(test::all_close("losses", d_losses.download(), ref.losses, 1e-5, loss_abs));
    CHECK(bits_of(d_logits.download()) == bits_of(input));
  }

  {  // loss and dlogits, twice with the same bits
    d_losses.poison();
    fused_classifier(d_logits.ptr, d_losses.ptr, d_targets.ptr, s.rows, s.V, s.Vp, dloss, true, nullptr);
    test::require_no_cuda_error();
    const std::vector<float> losses = d_losses.download();
    const std::vector<T> dlogits = d_logits.download();
    CHECK(test::all_close("losses", losses, ref.losses, 1e-5, loss_abs));

    std::vector<float> real_got, padding_got;
    std::vector<double> real_want;
    for (int r = 0; r < s.rows; ++r)
      for (int j = 0; j < s.Vp; ++j) {
        const size_t i = static_cast<size_t>(r) * s.Vp + j;
        if (j < s.V) {
          real_got.push_back(static_cast<float>(dlogits[i]));
          real_want.push_back(ref.dlogits[i]);
        } else {
          padding_got.push_back(static_cast<float>(dlogits[i]));
        }
      }
    CHECK(test::all_close("dlogits", real_got, real_want, grad_rel, grad_abs));
    CHECK(padding_got == std::vector<float>(padding_got.size(), 0.0f));  // exact zeros (NaN != 0)

    d_logits.upload(input);
    d_losses.poison();
    fused_classifier(d_logits.ptr, d_losses.ptr, d_targets.ptr, s.rows, s.V, s.Vp, dloss, true, nullptr);
    test::require_no_cuda_error();
    const std::vector<float> losses_again = d_losses.download();
    CHECK(std::memcmp(losses.data(), losses_again.data(), losses.size() * sizeof(float)) == 0);
    CHECK(bits_of(d_logits.download()) == bits_of(dlogits));
  }
}

const ClassifierShape kShapes[] = {
    {1, 1, 128, 0.0f},      // a single real column: loss 0, gradient 0
    {3, 50, 128, 0.0f},     // V not a multiple of the vector width
    {37, 129, 256, 0.0f},   // one real column in the last 128-wide chunk
    {3, 200, 200, 0.0f},    // no padding (Vp == V, a multiple of 8)
    {2, 9000, 9088, 0.0f},  // more vectors than threads: each thread loops
    {3, 129, 256, 100.0f},  // exp(100) overflows fp32: needs the running maximum
};

}  // namespace

TEMPLATE_TEST_CASE("fused_classifier matches a double softmax cross-entropy", "[classifier]", float, bf16) {
  uint64_t seed = 11;
  for (const ClassifierShape& s : kShapes) check_classifier<TestType>(s, seed++);
}

TEMPLATE_TEST_CASE("fused_classifier launches and matches at every preset's vocabulary", "[classifier]", float,
                   bf16) {
  uint64_t seed = 40;
  for (const test::PresetShape& p : test::preset_shapes()) {
    INFO("presets " << p.presets);
    check_classifier<TestType>({2, p.V, p.Vp, 0.0f}, seed++);
  }
}

TEST_CASE("classifier_loss_sum adds the losses in fp64, the same bits every run", "[classifier]") {
  for (int rows : {1, 7, 255, 256, 1000}) {
    INFO("rows " << rows);
    const std::vector<float> losses = test::random_floats(static_cast<size_t>(rows), 900 + rows, 3.0f);
    double want = 0.25;
    for (float x : losses) want += x;
    test::DeviceBuffer<float> device_losses(losses);
    test::DeviceBuffer<double> sum(std::vector<double>{0.25});
    classifier_loss_sum(sum.ptr, device_losses.ptr, rows, nullptr);
    test::require_no_cuda_error();
    const double first = sum.download()[0];
    CHECK(std::fabs(first - want) <= 1e-12 * (std::fabs(want) + rows));
    sum.upload({0.25});
    classifier_loss_sum(sum.ptr, device_losses.ptr, rows, nullptr);
    CHECK(test::same_bits(sum.download(), std::vector<double>{first}));
  }
}

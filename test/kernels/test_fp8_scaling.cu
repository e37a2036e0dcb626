// fp8_scaling_init and fp8_update_scales (kernels/fp8_scaling.cuh) vs. a loop written here from the
// documented rule, in double (one rounding to fp32 of an exact-enough quotient equals the fp32
// division: 53 >= 2·24 + 2 bits), step by step over more than 2·H steps, bit for bit: the scale,
// scale_inv, the history row and the amax reset. An odd M = 5 of tensors in both formats: a spike
// that must leave the window exactly H steps after it entered, an all-zero tensor (the scale stays),
// inf and NaN amaxes (recorded, skipped, the scale stays), a growing amax, and one so small that the
// scale is capped at FLT_MAX; margins 0 and 2, delayed and current, H = 1, 4 and 16 (the default);
// a call on a sub-range of the tensors; and the refusals.
#include "test/test_util.h"
#include "kernels/fp8.cuh"
#include "kernels/fp8_scaling.cuh"

#include <cfloat>
#include <cmath>
#include <limits>
#include <vector>

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// Tensor m's amax at `step`.
float amax_at(int m, int step) {
  switch (m) {
    case 0: return step == 1 ? 100.0f : 1.0f;             // a spike at step 1
    case 1: return 0.0f;                                   // never nonzero
    case 2: return step == 2 ? kInf : step == 4 ? kNaN : 3.0f - 0.1f * static_cast<float>(step);  // bad steps
    case 3: return 0.75f * static_cast<float>(step + 1);   // growing
    default: return step == 0 ? 1e-38f : 0.0f;            // too small for a finite scale
  }
}

// The documented rule, written out.
struct Reference {
  int M, H, margin;
  bool delayed;
  std::vector<float> format_max, scale, scale_inv, history;

  Reference(int M_, int H_, int margin_, bool delayed_, std::vector<float> format_max_)
      : M(M_), H(H_), margin(margin_), delayed(delayed_), format_max(std::move(format_max_)), scale(M, 1.0f),
        scale_inv(M, 1.0f), history(static_cast<size_t>(M) * H, 0.0f) {}

  void step(const std::vector<float>& amax) {
    for (int m = 0; m < M; ++m) {
      float* row = &history[static_cast<size_t>(m) * H];
      for (int i = H - 1; i > 0; --i) row[i] = row[i - 1];
      row[0] = amax[m];
      double basis = 0;
      if (delayed) {
        for (int i = 0; i < H; ++i)
          if (std::isfinite(row[i])) basis = std::max(basis, static_cast<double>(row[i]));
      } else {
        basis = amax[m];
      }
      if (std::isfinite(basis) && basis > 0) {
        const double q = std::ldexp(static_cast<double>(format_max[m]), -margin) / basis;
        scale[m] = q > FLT_MAX ? FLT_MAX : static_cast<float>(q);
      }
      scale_inv[m] = static_cast<float>(1.0 / static_cast<double>(scale[m]));
    }
  }
};

struct State {
  test::DeviceBuffer<float> scale, scale_inv, history, amax, format_max;
  State(int M, int H, const std::vector<float>& fmax)
      : scale(M), scale_inv(static_cast<size_t>(M) * kFp8ScaleInvStride), history(static_cast<size_t>(M) * H), amax(M),
        format_max(fmax) {}
  // Each tensor's inverse scale (every kFp8ScaleInvStride-th float), and the floats between them,
  // which the kernels never write (they stay as the poison left there).
  std::vector<float> inverse(std::vector<float>* between = nullptr) {
    const std::vector<float> all = scale_inv.download();
    std::vector<float> each;
    for (size_t i = 0; i < all.size(); ++i) {
      if (i % kFp8ScaleInvStride == 0) each.push_back(all[i]);
      else if (between != nullptr) between->push_back(all[i]);
    }
    return each;
  }
};

void check_same(const char* what, const std::vector<float>& got, const std::vector<float>& want) {
  bool same = test::same_bits(got, want);
  if (!same) {
    for (size_t i = 0; i < got.size(); ++i) {
      if (test::same_bits(std::vector<float>{got[i]}, std::vector<float>{want[i]})) continue;
      INFO(what << "[" << i << "] got " << got[i] << " want " << want[i]);
      CHECK(same);
      break;
    }
  }
}

void check_run(int H, int margin, bool delayed) {
  const int M = 5;
  INFO("H " << H << " margin " << margin << (delayed ? " delayed" : " current"));
  const std::vector<float> fmax = {kFp8E4M3Max, kFp8E5M2Max, kFp8E4M3Max, kFp8E5M2Max, kFp8E4M3Max};
  State s(M, H, fmax);
  s.scale_inv.upload(std::vector<float>(static_cast<size_t>(M) * kFp8ScaleInvStride, -7.0f));  // poison
  fp8_scaling_init(s.scale, s.scale_inv, s.history, s.amax, M, H, nullptr);
  Reference ref(M, H, margin, delayed, fmax);
  for (int step = 0; step < 2 * H + 3; ++step) {
    INFO("step " << step);
    std::vector<float> amax(M);
    for (int m = 0; m < M; ++m) amax[m] = amax_at(m, step);
    s.amax.upload(amax);
    fp8_update_scales(s.scale, s.scale_inv, s.history, s.amax, s.format_max, M, H, margin, delayed, nullptr);
    test::require_no_cuda_error();
    ref.step(amax);
    const std::vector<float> scale = s.scale.download();
    check_same("scale", scale, ref.scale);
    std::vector<float> between;
    check_same("scale_inv", s.inverse(&between), ref.scale_inv);
    check_same("between the inverse scales", between, std::vector<float>(between.size(), -7.0f));
    check_same("history", s.history.download(), ref.history);
    check_same("amax", s.amax.download(), std::vector<float>(M, 0.0f));
    // The spike, by hand: delayed, it sets tensor 0's scale from step 1 through step H (H
    // updates, its own included) and is gone at step H + 1; current, at step 1 alone.
    const bool spike_counts = step >= 1 && (delayed ? step <= H : step == 1);
    CHECK(scale[0] == std::ldexp(kFp8E4M3Max, -margin) / (spike_counts ? 100.0f : 1.0f));
    CHECK(scale[1] == 1.0f);                       // never a nonzero amax
    CHECK(scale[4] == FLT_MAX);                    // 448 / 1e-38 overflows; later zeros keep it
  }
}

}  // namespace

TEST_CASE("fp8_scaling_init: scale and scale_inv 1, history and amax 0", "[fp8_scaling]") {
  const int M = 7, H = 16;
  State s(M, H, std::vector<float>(M, kFp8E4M3Max));  // DeviceBuffer poisons: NaN everywhere
  fp8_scaling_init(s.scale, s.scale_inv, s.history, s.amax, M, H, nullptr);
  test::require_no_cuda_error();
  CHECK(test::same_bits(s.scale.download(), std::vector<float>(M, 1.0f)));
  CHECK(test::same_bits(s.inverse(), std::vector<float>(M, 1.0f)));
  CHECK(test::same_bits(s.history.download(), std::vector<float>(static_cast<size_t>(M) * H, 0.0f)));
  CHECK(test::same_bits(s.amax.download(), std::vector<float>(M, 0.0f)));
}

TEST_CASE("fp8_update_scales: the window over more than 2H steps, margin, delayed and current, bad amaxes",
          "[fp8_scaling]") {
  for (int H : {1, 4, 16})
    for (int margin : {0, 2})
      for (bool delayed : {true, false}) check_run(H, margin, delayed);
}

TEST_CASE("fp8_update_scales on a sub-range of the tensors leaves the others alone", "[fp8_scaling]") {
  const int M = 5, H = 3;
  const std::vector<float> fmax(M, kFp8E5M2Max);
  State s(M, H, fmax);
  fp8_scaling_init(s.scale, s.scale_inv, s.history, s.amax, M, H, nullptr);
  s.amax.upload({2.0f, 4.0f, 8.0f, 16.0f, 32.0f});
  // Tensors [1, 3): every pointer offset by 1, the history by one row, the inverse scales by one stride.
  fp8_update_scales(s.scale.ptr + 1, s.scale_inv.ptr + kFp8ScaleInvStride, s.history.ptr + H, s.amax.ptr + 1,
                    s.format_max.ptr + 1, 2, H, 0, true, nullptr);
  test::require_no_cuda_error();
  CHECK(test::same_bits(s.scale.download(), std::vector<float>{1.0f, kFp8E5M2Max / 4, kFp8E5M2Max / 8, 1.0f, 1.0f}));
  CHECK(test::same_bits(s.inverse(), std::vector<float>{1.0f, 4 / kFp8E5M2Max, 8 / kFp8E5M2Max, 1.0f, 1.0f}));
  CHECK(test::same_bits(s.amax.download(), std::vector<float>{2.0f, 0.0f, 0.0f, 16.0f, 32.0f}));
  CHECK(test::same_bits(s.history.download(), std::vector<float>{0, 0, 0, 4, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0, 0}));
}

TEST_CASE("fp8_scaling refuses what it cannot do, naming it", "[fp8_scaling]") {
  test::DeviceBuffer<float> x(4);
  CHECK_THROWS_WITH(fp8_update_scales(x, x, x, x, x, 1, 0, 0, true, nullptr), Catch::Contains("H=0"));
  CHECK_THROWS_WITH(fp8_update_scales(x, x, x, x, x, -1, 1, 0, true, nullptr), Catch::Contains("M=-1"));
  CHECK_THROWS_WITH(fp8_update_scales(x, x, x, x, x, 1, 1, -1, true, nullptr), Catch::Contains("margin=-1"));
  CHECK_THROWS_WITH(fp8_update_scales(x, x, x, x, x, 1, 1, 33, true, nullptr), Catch::Contains("margin=33"));
  CHECK_THROWS_WITH(fp8_scaling_init(x, x, x, x, 1, 0, nullptr), Catch::Contains("H=0"));
}

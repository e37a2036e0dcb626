// vocab_parallel_classifier_{max,sums,finish} with tp ranks emulated in one process: a (rows, Vp)
// logits matrix is cut into tp column slices, phase 1 runs on each slice, the max all-reduce is
// done here, phase 2 on each, the sum all-reduce here, phase 3 on each. Checked against a
// double-precision softmax cross-entropy written here (per phase: each slice's max exactly,
// its exp-sums and target logit; then losses and the reassembled dlogits) and against
// fused_classifier over the whole matrix: tp = 1, 2, 3 (an odd split), 4, 5, 8, slices without a
// real column, V's boundary inside a vector and on a slice boundary, rows = 1 and odd, a target
// in every slice, large offsets, padding poisoned with NaN (exact zeros out), write_dlogits
// false (logits untouched), every output poisoned before its launch, bit-identical reruns; two rows
// of every preset's vocabulary whole (tp = 1) and in two slices (test/preset_shapes.h).
#include "test/preset_shapes.h"
#include "test/test_util.h"
#include "kernels/vocab_parallel_classifier.cuh"
#include "test/classifier_reference.h"

#include <cfloat>
#include <cstdint>
#include <limits>
#include <type_traits>

namespace {

struct TpShape {
  int rows, V, Vp, tp;
  float offset;  // added to every real logit: a large one overflows a naive exp-sum in fp32
};


// Columns [begin, begin + width) of a (rows, cols) row-major matrix.
template <typename E>
std::vector<E> columns(const std::vector<E>& m, int rows, int cols, int begin, int width) {
  std::vector<E> out(static_cast<size_t>(rows) * width);
  for (int r = 0; r < rows; ++r)
    std::copy_n(&m[static_cast<size_t>(r) * cols + begin], width, &out[static_cast<size_t>(r) * width]);
  return out;
}

// One emulated tensor-parallel rank: its logits slice and the buffers the launchers write.
template <typename T>
struct Rank {
  int vocab_begin;
  test::DeviceBuffer<T> logits;
  test::DeviceBuffer<float> row_max, row_sums, losses;
  test::DeviceBuffer<int> targets;
  Rank(int begin, const std::vector<T>& slice, const std::vector<int>& t, int rows)
      : vocab_begin(begin), logits(slice), row_max(rows), row_sums(2 * static_cast<size_t>(rows)), losses(rows),
        targets(t) {}
};

// What one pass over all ranks produced.
template <typename T>
struct TpResult {
  std::vector<std::vector<float>> local_max, local_sums, losses;  // per rank
  std::vector<float> global_max, global_sums;                      // the emulated all-reduces
  std::vector<std::vector<T>> dlogits;                             // per rank: its slice after phase 3
};

// Phases 1-3 over every rank, each output poisoned before its launch; the all-reduces on the host
// (max, then a sum in rank order, in fp32 as NCCL's), their results uploaded to every rank.
template <typename T>
TpResult<T> run_ranks(std::vector<Rank<T>>& ranks, int rows, int V, int Vl, float dloss, bool write_dlogits) {
  TpResult<T> got;
  got.global_max.assign(rows, -FLT_MAX);
  for (Rank<T>& rank : ranks) {
    rank.row_max.poison();
    vocab_parallel_classifier_max(rank.row_max.ptr, rank.logits.ptr, rows, rank.vocab_begin, V, Vl, nullptr);
    test::require_no_cuda_error();
    got.local_max.push_back(rank.row_max.download());
    for (int r = 0; r < rows; ++r) got.global_max[r] = std::max(got.global_max[r], got.local_max.back()[r]);
  }
  got.global_sums.assign(2 * static_cast<size_t>(rows), 0.0f);
  for (Rank<T>& rank : ranks) {
    rank.row_max.upload(got.global_max);
    rank.row_sums.poison();
    vocab_parallel_classifier_sums(rank.row_sums.ptr, rank.logits.ptr, rank.row_max.ptr, rank.targets.ptr, rows,
                                   rank.vocab_begin, V, Vl, nullptr);
    test::require_no_cuda_error();
    got.local_sums.push_back(rank.row_sums.download());
    for (size_t i = 0; i < got.global_sums.size(); ++i) got.global_sums[i] += got.local_sums.back()[i];
  }
  for (Rank<T>& rank : ranks) {
    rank.row_sums.upload(got.global_sums);
    rank.losses.poison();
    vocab_parallel_classifier_finish(rank.logits.ptr, rank.losses.ptr, rank.row_max.ptr, rank.row_sums.ptr,
                                     rank.targets.ptr, rows, rank.vocab_begin, V, Vl, dloss, write_dlogits, nullptr);
    test::require_no_cuda_error();
    got.losses.push_back(rank.losses.download());
    got.dlogits.push_back(rank.logits.download());
  }
  return got;
}

template <typename T>
void check_tp(const TpShape& s, uint64_t seed) {
  INFO("rows " << s.rows << " V " << s.V << " Vp " << s.Vp << " tp " << s.tp << " offset " << s.offset);
  REQUIRE(s.Vp % s.tp == 0);
  const int rows = s.rows, V = s.V, Vp = s.Vp, Vl = Vp / s.tp;
  const size_t count = static_cast<size_t>(rows) * Vp;
  const std::vector<float> noise = test::random_floats(count, seed, 2.0f);
  std::vector<float> logits(count);
  for (int r = 0; r < rows; ++r)
    for (int j = 0; j < Vp; ++j) {
      const size_t i = static_cast<size_t>(r) * Vp + j;
      logits[i] = j < V ? noise[i] + s.offset : std::numeric_limits<float>::quiet_NaN();
    }
  logits = test::round_to<T>(logits);
  const std::vector<T> input = test::from_floats<T>(logits);

  // Row r's target lies in slice r % (slices holding a real column): the first row to visit a
  // slice takes its last real column (V - 1 for the last), the next its first, the rest random.
  const int real_slices = std::min(s.tp, ceil_div(V, Vl));
  std::vector<int> targets = test::random_tokens(rows, 1 << 30, seed + 1);
  for (int r = 0; r < rows; ++r) {
    const int t = r % real_slices, lo = t * Vl, hi = std::min(V, lo + Vl);
    targets[r] = r < real_slices ? hi - 1 : r < 2 * real_slices ? lo : lo + targets[r] % (hi - lo);
  }
  const float dloss = 1.0f / (3.0f * rows);
  const ClassifierReference ref = classifier_reference(logits, targets, rows, V, Vp, dloss);

  // fused_classifier over the whole matrix: what the slices must reproduce together.
  test::DeviceBuffer<T> d_full(input);
  test::DeviceBuffer<float> d_full_losses(rows);
  test::DeviceBuffer<int> d_targets(targets);
  fused_classifier(d_full.ptr, d_full_losses.ptr, d_targets.ptr, rows, V, Vp, dloss, true, nullptr);
  test::require_no_cuda_error();
  const std::vector<float> fused_losses = d_full_losses.download();
  const std::vector<T> fused_dlogits = d_full.download();

  // Losses are fp32 in both dtypes; |error| grows with the size of logsumexp (~|offset|).
  const double loss_rel = 1e-5, loss_abs = 1e-5 * (1.0 + std::fabs(s.offset));
  // Gradients: fp32 math (the exponent x - log_sum carries log_sum's rounding, ~|offset| · 2^-24),
  // stored as T (bf16: a few bf16 ulps); the absolute floor scales with dloss.
  const double grad_rel = std::is_same<T, float>::value ? 1e-5 * (1.0 + std::fabs(s.offset) / 16)
                                                        : test::Tolerance<bf16>::rel;
  const double grad_abs = 1e-6 * dloss;

  std::vector<Rank<T>> ranks;
  ranks.reserve(s.tp);
  for (int t = 0; t < s.tp; ++t) ranks.emplace_back(t * Vl, test::from_floats<T>(columns(logits, rows, Vp, t * Vl, Vl)),
                                                    targets, rows);

  // Loss only: the statistics of every phase, and the slices left untouched.
  const TpResult<T> first = run_ranks(ranks, rows, V, Vl, dloss, false);
  for (int t = 0; t < s.tp; ++t) {
    INFO("rank " << t);
    const int begin = t * Vl, real = std::max(0, std::min(V - begin, Vl));
    std::vector<float> want_max(rows, -FLT_MAX), want_target(rows, 0.0f), got_sum(rows), got_target(rows);
    std::vector<double> want_sum(rows, 0.0);
    for (int r = 0; r < rows; ++r) {
      const float* x = &logits[static_cast<size_t>(r) * Vp + begin];  // the slice's row
      for (int j = 0; j < real; ++j) want_max[r] = std::max(want_max[r], x[j]);
      for (int j = 0; j < real; ++j) want_sum[r] += std::exp(static_cast<double>(x[j]) - first.global_max[r]);
      if (targets[r] >= begin && targets[r] < begin + Vl) want_target[r] = x[targets[r] - begin];
      got_sum[r] = first.local_sums[t][2 * r];
      got_target[r] = first.local_sums[t][2 * r + 1];
    }
    CHECK(test::same_bits(first.local_max[t], want_max));  // a max is exact, -FLT_MAX for no column
    // fp32 sums of positive terms <= 1; abs 0: a slice without a real column gives exactly 0.
    CHECK(test::all_close("exp sums", got_sum, want_sum, 1e-5, 0.0));
    CHECK(test::same_bits(got_target, want_target));
    CHECK(test::bytes_of(first.dlogits[t]) ==
          test::bytes_of(test::from_floats<T>(columns(logits, rows, Vp, t * Vl, Vl))));
    CHECK(test::same_bits(first.losses[t], first.losses[0]));  // every rank computes the same losses
  }
  std::vector<float> row_max(rows, -FLT_MAX);  // over the whole row's real columns
  for (int r = 0; r < rows; ++r)
    for (int j = 0; j < V; ++j) row_max[r] = std::max(row_max[r], logits[static_cast<size_t>(r) * Vp + j]);
  CHECK(test::same_bits(first.global_max, row_max));
  CHECK(test::all_close("losses (loss only) vs double", first.losses[0], ref.losses, loss_rel, loss_abs));
  CHECK(test::all_close("losses (loss only) vs fused_classifier", first.losses[0], fused_losses, loss_rel, loss_abs));

  // Losses and dlogits; then again from the same inputs: the same bits.
  const TpResult<T> second = run_ranks(ranks, rows, V, Vl, dloss, true);
  std::vector<T> dlogits(count);
  for (int t = 0; t < s.tp; ++t) {
    INFO("rank " << t);
    CHECK(test::same_bits(second.losses[t], first.losses[0]));  // the loss does not depend on write_dlogits
    for (int r = 0; r < rows; ++r)
      std::copy_n(&second.dlogits[t][static_cast<size_t>(r) * Vl], Vl, &dlogits[static_cast<size_t>(r) * Vp + t * Vl]);
  }
  std::vector<float> real_got, real_fused, padding_got;
  std::vector<double> real_want;
  for (int r = 0; r < rows; ++r)
    for (int j = 0; j < Vp; ++j) {
      const size_t i = static_cast<size_t>(r) * Vp + j;
      if (j < V) {
        real_got.push_back(static_cast<float>(dlogits[i]));
        real_fused.push_back(static_cast<float>(fused_dlogits[i]));
        real_want.push_back(ref.dlogits[i]);
      } else {
        padding_got.push_back(static_cast<float>(dlogits[i]));
      }
    }
  CHECK(test::all_close("dlogits vs double", real_got, real_want, grad_rel, grad_abs));
  CHECK(test::all_close("dlogits vs fused_classifier", real_got, real_fused, grad_rel, grad_abs));
  CHECK(test::bytes_of(padding_got) == test::bytes_of(std::vector<float>(padding_got.size(), 0.0f)));  // +0, not NaN

  for (int t = 0; t < s.tp; ++t)
    ranks[t].logits.upload(test::from_floats<T>(columns(logits, rows, Vp, t * Vl, Vl)));
  const TpResult<T> third = run_ranks(ranks, rows, V, Vl, dloss, true);
  for (int t = 0; t < s.tp; ++t) {
    INFO("rank " << t);
    CHECK(test::same_bits(third.local_sums[t], second.local_sums[t]));
    CHECK(test::same_bits(third.losses[t], second.losses[t]));
    CHECK(test::bytes_of(third.dlogits[t]) == test::bytes_of(second.dlogits[t]));
  }
}

const TpShape kShapes[] = {
    {1, 1, 128, 2, 0.0f},        // a single real column (loss 0, gradient 0); rank 1 holds none
    {3, 50, 128, 1, 0.0f},       // tp = 1: the whole row, V not a multiple of the vector width
    {5, 100, 128, 2, 0.0f},      // V's boundary inside a vector of rank 1
    {4, 64, 128, 2, 0.0f},       // V's boundary on the slice boundary: rank 1 is all padding
    {7, 140, 144, 3, 0.0f},      // odd split: 48 columns per rank, rank 2 partly padding
    {9, 60, 128, 4, 0.0f},       // ranks 2 and 3 hold no real column
    {1, 60, 128, 4, 0.0f},       // rows = 1 with empty ranks
    {37, 500, 512, 4, 0.0f},     // odd rows, every rank real
    {11, 200, 200, 5, 0.0f},     // no padding at all, 40 columns per rank
    {6, 1000, 1024, 8, -30.0f},  // eight ranks, negative logits
    {3, 129, 256, 2, 100.0f},    // exp(100) overflows fp32; rank 1 holds one real column
    {2, 17000, 17408, 2, 0.0f},  // 8704 columns per rank: more vectors than threads, each thread loops
};

}  // namespace

TEMPLATE_TEST_CASE("vocab_parallel_classifier over tp slices matches fused_classifier and a double softmax",
                   "[vocab_parallel_classifier]", float, bf16) {
  uint64_t seed = 101;
  for (const TpShape& s : kShapes) check_tp<TestType>(s, seed += 7);
}

TEMPLATE_TEST_CASE("vocab_parallel_classifier launches and matches at every preset's vocabulary",
                   "[vocab_parallel_classifier]", float, bf16) {
  uint64_t seed = 301;
  for (const test::PresetShape& p : test::preset_shapes()) {
    INFO("presets " << p.presets);
    for (int tp : {1, 2}) check_tp<TestType>({2, p.V, p.Vp, tp, 0.0f}, seed += 7);
  }
}

TEST_CASE("vocab_parallel_classifier launchers reject bad shapes in one line", "[vocab_parallel_classifier]") {
  test::DeviceBuffer<bf16> logits(64);
  test::DeviceBuffer<float> stats(8), losses(4);
  test::DeviceBuffer<int> targets(std::vector<int>{0, 1, 2, 3});
  const auto one_line = Catch::Matches("[^\n]*");
  // Vl not a multiple of 8 bf16 (one 128-bit vector).
  CHECK_THROWS_WITH(vocab_parallel_classifier_max(stats.ptr, logits.ptr, 4, 0, 10, 12, nullptr),
                    Catch::Contains("vocab_parallel_classifier_max: need") && Catch::Contains("Vl=12") && one_line);
  // A logits pointer that is not 16-byte aligned.
  CHECK_THROWS_WITH(vocab_parallel_classifier_sums(stats.ptr, logits.ptr + 1, stats.ptr, targets.ptr, 4, 0, 10, 8,
                                                   nullptr),
                    Catch::Contains("vocab_parallel_classifier_sums: need") && Catch::Contains("16-byte aligned"));
  // V < 1, vocab_begin < 0.
  CHECK_THROWS_WITH(vocab_parallel_classifier_finish(logits.ptr, losses.ptr, stats.ptr, stats.ptr, targets.ptr, 4, 0,
                                                     0, 16, 1.0f, true, nullptr),
                    Catch::Contains("vocab_parallel_classifier_finish: need") && Catch::Contains("V=0"));
  CHECK_THROWS_WITH(vocab_parallel_classifier_max(stats.ptr, logits.ptr, 4, -8, 10, 16, nullptr),
                    Catch::Contains("vocab_begin=-8"));
  test::require_no_cuda_error();  // nothing was launched
}

// Decode attention over a KV cache (kernels/attention_decode.cuh) against naive CPU loops in
// double: kv_cache_write stores exactly the new rows' keys and values, attention_decode_forward
// attends each sequence's new query over the cached rows [0, len) and reads nothing else (the
// rows past len and every output start poisoned with NaN), and it gives the bits of the full causal
// attention's last row (kernels/attention.cuh) for the same q, k, v. Odd shapes, and every preset's
// heads over a cache of its maxT rows (test/preset_shapes.h).
#include "test/preset_shapes.h"
#include "test/test_util.h"
#include "kernels/attention_decode.cuh"

namespace {

struct DecodeShape {
  int B, len, max_len, NH, HS;
  float input_scale;  // std of the random q, k, v; large values make the softmax nearly one-hot
};

// softmax(q·k_s / sqrt(HS)) over s < len, times v_s: q from the (B, 3C) rows, k and v from the
// (B, max_len, C) cache.
std::vector<double> reference_decode(const std::vector<float>& qkv, const std::vector<float>& k_cache,
                                     const std::vector<float>& v_cache, const DecodeShape& s) {
  const int C = s.NH * s.HS;
  const double scale = 1.0 / std::sqrt(static_cast<double>(s.HS));
  std::vector<double> out(static_cast<size_t>(s.B) * C);
  for (int b = 0; b < s.B; ++b) {
    for (int h = 0; h < s.NH; ++h) {
      std::vector<double> score(s.len);
      double max_score = -INFINITY;
      for (int t = 0; t < s.len; ++t) {
        double dot = 0.0;
        for (int i = 0; i < s.HS; ++i)
          dot += static_cast<double>(qkv[static_cast<size_t>(b) * 3 * C + h * s.HS + i]) *
                 k_cache[(static_cast<size_t>(b) * s.max_len + t) * C + h * s.HS + i];
        score[t] = dot * scale;
        max_score = std::max(max_score, score[t]);
      }
      double sum = 0.0;
      for (int t = 0; t < s.len; ++t) sum += std::exp(score[t] - max_score);
      for (int i = 0; i < s.HS; ++i) {
        double o = 0.0;
        for (int t = 0; t < s.len; ++t)
          o += std::exp(score[t] - max_score) / sum * v_cache[(static_cast<size_t>(b) * s.max_len + t) * C + h * s.HS + i];
        out[static_cast<size_t>(b) * C + h * s.HS + i] = o;
      }
    }
  }
  return out;
}

const DecodeShape kShapes[] = {
    {1, 1, 1, 1, 8, 1.0f},   {3, 1, 4, 4, 16, 1.0f},  {1, 7, 9, 2, 24, 1.0f},   {2, 5, 5, 3, 8, 1.0f},
    {3, 33, 40, 4, 64, 1.0f}, {1, 17, 20, 2, 128, 1.0f}, {2, 17, 17, 2, 16, 5.0f},
};

// kShapes, then each preset's heads (all NH, its head size) attending 3 rows of a cache of maxT.
std::vector<DecodeShape> shapes_and_presets() {
  std::vector<DecodeShape> shapes(std::begin(kShapes), std::end(kShapes));
  for (const test::PresetShape& p : test::preset_shapes())
    shapes.push_back({1, 3, p.max_seq_len, p.NH, p.head_size, 1.0f});
  return shapes;
}

}  // namespace

TEMPLATE_TEST_CASE("kv_cache_write stores the new rows' keys and values and nothing else", "[attention_decode]", float,
                   bf16) {
  using T = TestType;
  const int B = 2, n = 3, pos = 2, max_len = 7, NH = 3, HS = 8, C = NH * HS;
  const std::vector<float> qkv_host = test::round_to<T>(test::random_floats(static_cast<size_t>(B) * n * 3 * C, 5));
  test::DeviceBuffer<T> qkv(test::from_floats<T>(qkv_host));
  test::DeviceBuffer<T> k_cache(static_cast<size_t>(B) * max_len * C), v_cache(static_cast<size_t>(B) * max_len * C);
  kv_cache_write<T>(k_cache, v_cache, qkv, B, n, pos, max_len, C, NH, nullptr);
  test::require_no_cuda_error();
  const std::vector<float> k = test::to_floats(k_cache.download()), v = test::to_floats(v_cache.download());
  size_t wrong = 0;
  for (int b = 0; b < B; ++b) {
    for (int r = 0; r < max_len; ++r) {
      for (int c = 0; c < C; ++c) {
        const size_t at = (static_cast<size_t>(b) * max_len + r) * C + c;
        if (r < pos || r >= pos + n) {
          wrong += !std::isnan(k[at]) + !std::isnan(v[at]);  // untouched: still poisoned
          continue;
        }
        const size_t row = (static_cast<size_t>(b) * n + (r - pos)) * 3 * C;
        wrong += (k[at] != qkv_host[row + C + c]) + (v[at] != qkv_host[row + 2 * C + c]);
      }
    }
  }
  CHECK(wrong == 0);
}

TEMPLATE_TEST_CASE("attention_decode_forward matches naive CPU loops and reads only rows [0, len)",
                   "[attention_decode]", float, bf16) {
  using T = TestType;
  uint64_t seed = 300;
  for (const DecodeShape& s : shapes_and_presets()) {
    const int C = s.NH * s.HS;
    INFO("B=" << s.B << " len=" << s.len << " max_len=" << s.max_len << " NH=" << s.NH << " HS=" << s.HS
              << " input std=" << s.input_scale);
    const size_t cache_n = static_cast<size_t>(s.B) * s.max_len * C;
    std::vector<float> qkv_host = test::round_to<T>(test::random_floats(static_cast<size_t>(s.B) * 3 * C, seed++,
                                                                        s.input_scale));
    std::vector<float> k_host = test::round_to<T>(test::random_floats(cache_n, seed++, s.input_scale));
    std::vector<float> v_host = test::round_to<T>(test::random_floats(cache_n, seed++));
    // Rows at and past len hold NaN: reading one would poison the output.
    for (int b = 0; b < s.B; ++b)
      for (size_t i = (static_cast<size_t>(b) * s.max_len + s.len) * C; i < static_cast<size_t>(b + 1) * s.max_len * C; ++i)
        k_host[i] = v_host[i] = NAN;
    test::DeviceBuffer<T> qkv(test::from_floats<T>(qkv_host)), k_cache(test::from_floats<T>(k_host)),
        v_cache(test::from_floats<T>(v_host)), out(static_cast<size_t>(s.B) * C);

    attention_decode_forward<T>(out, qkv, k_cache, v_cache, s.B, s.len, s.max_len, C, s.NH, nullptr);
    test::require_no_cuda_error();
    const std::vector<T> got = out.download();
    const std::vector<double> want = reference_decode(qkv_host, k_host, v_host, s);
    // fp32 math, one rounding to T; sharp inputs (large scores) amplify fp32 score errors.
    const double abs_tol = test::Tolerance<T>::abs + (s.input_scale > 1.0f ? 1e-4 * s.input_scale * s.input_scale : 0.0);
    CHECK(test::all_close("out", got, want, test::Tolerance<T>::rel, abs_tol));

    out.poison();
    attention_decode_forward<T>(out, qkv, k_cache, v_cache, s.B, s.len, s.max_len, C, s.NH, nullptr);
    test::require_no_cuda_error();
    CHECK(test::same_bits(out.download(), got));
  }
}

TEMPLATE_TEST_CASE("attention_decode_forward gives the full causal attention's last row, bit for bit",
                   "[attention_decode]", float, bf16) {
  using T = TestType;
  uint64_t seed = 400;
  for (const DecodeShape& s : shapes_and_presets()) {
    const int C = s.NH * s.HS, len = s.len;
    INFO("B=" << s.B << " len=" << len << " NH=" << s.NH << " HS=" << s.HS);
    // The whole sequences' qkv (B, len, 3C), as the training forward sees them.
    const std::vector<float> full_host =
        test::round_to<T>(test::random_floats(static_cast<size_t>(s.B) * len * 3 * C, seed++, s.input_scale));
    test::DeviceBuffer<T> full(test::from_floats<T>(full_host)), full_out(static_cast<size_t>(s.B) * len * C);
    test::DeviceBuffer<float> lse(static_cast<size_t>(s.B) * s.NH * len);
    attention_forward<T>(full_out, lse, full, s.B, len, C, s.NH, nullptr);

    // Incremental: the first len - 1 rows of each sequence into the cache, then the last row.
    test::DeviceBuffer<T> k_cache(static_cast<size_t>(s.B) * s.max_len * C),
        v_cache(static_cast<size_t>(s.B) * s.max_len * C), out(static_cast<size_t>(s.B) * C);
    std::vector<float> prefix, last;
    for (int b = 0; b < s.B; ++b) {
      const auto row = full_host.begin() + static_cast<std::ptrdiff_t>(b) * len * 3 * C;
      prefix.insert(prefix.end(), row, row + static_cast<std::ptrdiff_t>(len - 1) * 3 * C);
      last.insert(last.end(), row + static_cast<std::ptrdiff_t>(len - 1) * 3 * C, row + static_cast<std::ptrdiff_t>(len) * 3 * C);
    }
    test::DeviceBuffer<T> prefix_qkv(test::from_floats<T>(prefix)), last_qkv(test::from_floats<T>(last));
    if (len > 1) kv_cache_write<T>(k_cache, v_cache, prefix_qkv, s.B, len - 1, 0, s.max_len, C, s.NH, nullptr);
    kv_cache_write<T>(k_cache, v_cache, last_qkv, s.B, 1, len - 1, s.max_len, C, s.NH, nullptr);
    attention_decode_forward<T>(out, last_qkv, k_cache, v_cache, s.B, len, s.max_len, C, s.NH, nullptr);
    test::require_no_cuda_error();

    const std::vector<T> full_got = full_out.download(), got = out.download();
    std::vector<T> want;
    for (int b = 0; b < s.B; ++b) {
      const auto row = full_got.begin() + (static_cast<std::ptrdiff_t>(b) * len + len - 1) * C;
      want.insert(want.end(), row, row + C);
    }
    CHECK(test::same_bits(got, want));
  }
}

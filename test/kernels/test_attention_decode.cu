// Decode attention over a KV cache (kernels/attention_decode.cuh) against naive CPU loops in
// double: kv_cache_write stores exactly the new rows' keys and values, attention_decode_forward
// attends each sequence's new query over the cached rows [0, len) and reads nothing else (the
// rows past len and every output start poisoned with NaN), and it gives the bits of the full causal
// attention's last row (kernels/attention.cuh) for the same q, k, v; for multi-head attention and
// grouped-query attention (NKV < NH K/V heads in the cache, query head h reading h / (NH / NKV)).
// Odd shapes, and every preset's heads over a cache of its maxT rows (test/preset_shapes.h).
#include "test/preset_shapes.h"
#include "test/test_util.h"
#include "kernels/attention_decode.cuh"

namespace {

struct DecodeShape {
  int B, len, max_len, NH, HS;
  float input_scale;  // std of the random q, k, v; large values make the softmax nearly one-hot
  int NKV = 0;        // K/V heads, dividing NH; 0: NH (multi-head attention)
  int kv_heads() const { return NKV ? NKV : NH; }
  int qkv_width() const { return (NH + 2 * kv_heads()) * HS; }
  int kv_width() const { return kv_heads() * HS; }
};

// softmax(q·k_s / sqrt(HS)) over s < len, times v_s: q of head h from the (B, (NH + 2·NKV)·HS)
// rows, k and v of K/V head h / (NH / NKV) from the (B, max_len, NKV·HS) cache.
std::vector<double> reference_decode(const std::vector<float>& qkv, const std::vector<float>& k_cache,
                                     const std::vector<float>& v_cache, const DecodeShape& s) {
  const int C = s.NH * s.HS, W = s.qkv_width(), KV = s.kv_width(), group = s.NH / s.kv_heads();
  const double scale = 1.0 / std::sqrt(static_cast<double>(s.HS));
  std::vector<double> out(static_cast<size_t>(s.B) * C);
  for (int b = 0; b < s.B; ++b) {
    for (int h = 0; h < s.NH; ++h) {
      const int kv = h / group * s.HS;  // the K/V head's first channel in a cache row
      std::vector<double> score(s.len);
      double max_score = -INFINITY;
      for (int t = 0; t < s.len; ++t) {
        double dot = 0.0;
        for (int i = 0; i < s.HS; ++i)
          dot += static_cast<double>(qkv[static_cast<size_t>(b) * W + h * s.HS + i]) *
                 k_cache[(static_cast<size_t>(b) * s.max_len + t) * KV + kv + i];
        score[t] = dot * scale;
        max_score = std::max(max_score, score[t]);
      }
      double sum = 0.0;
      for (int t = 0; t < s.len; ++t) sum += std::exp(score[t] - max_score);
      for (int i = 0; i < s.HS; ++i) {
        double o = 0.0;
        for (int t = 0; t < s.len; ++t)
          o += std::exp(score[t] - max_score) / sum * v_cache[(static_cast<size_t>(b) * s.max_len + t) * KV + kv + i];
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

// kShapes, then each preset's heads (all NH query heads on its NKV K/V heads, its head size)
// attending 3 rows of a cache of maxT, at most 8,192 rows: the cache's length only strides its
// rows (size_t offsets), and Llama's 131,072-row caches would take gigabytes of the CPU build's memory.
std::vector<DecodeShape> shapes_and_presets() {
  std::vector<DecodeShape> shapes(std::begin(kShapes), std::end(kShapes));
  for (const test::PresetShape& p : test::preset_shapes())
    shapes.push_back({1, 3, std::min(p.max_seq_len, 8192), p.NH, p.head_size, 1.0f, p.NKV});
  return shapes;
}

// kv_cache_write of n = 3 rows at pos = 2 into a 7-row cache, for NH = 3 query heads on NKV K/V
// heads: exactly the k and v parts of the new rows land in rows [2, 5), every other row stays poisoned.
template <typename T>
void check_cache_write(int NKV) {
  const int B = 2, n = 3, pos = 2, max_len = 7, NH = 3, HS = 8, C = NH * HS, KV = NKV * HS, W = C + 2 * KV;
  INFO("NH=" << NH << " NKV=" << NKV);
  const std::vector<float> qkv_host = test::round_to<T>(test::random_floats(static_cast<size_t>(B) * n * W, 5));
  test::DeviceBuffer<T> qkv(test::from_floats<T>(qkv_host));
  test::DeviceBuffer<T> k_cache(static_cast<size_t>(B) * max_len * KV), v_cache(static_cast<size_t>(B) * max_len * KV);
  kv_cache_write<T>(k_cache, v_cache, qkv, B, n, pos, max_len, C, NH, NKV, nullptr);
  test::require_no_cuda_error();
  const std::vector<float> k = test::to_floats(k_cache.download()), v = test::to_floats(v_cache.download());
  size_t wrong = 0;
  for (int b = 0; b < B; ++b) {
    for (int r = 0; r < max_len; ++r) {
      for (int c = 0; c < KV; ++c) {
        const size_t at = (static_cast<size_t>(b) * max_len + r) * KV + c;
        if (r < pos || r >= pos + n) {
          wrong += !std::isnan(k[at]) + !std::isnan(v[at]);  // untouched: still poisoned
          continue;
        }
        const size_t row = (static_cast<size_t>(b) * n + (r - pos)) * W;
        wrong += (k[at] != qkv_host[row + C + c]) + (v[at] != qkv_host[row + C + KV + c]);
      }
    }
  }
  CHECK(wrong == 0);
}

// Decoding over a cache whose rows at and past len hold NaN, against reference_decode; then a
// second run into a poisoned output gives the same bits. Uses seeds seed .. seed + 2, advances it.
template <typename T>
void check_decode(const DecodeShape& s, uint64_t& seed) {
  const int C = s.NH * s.HS, KV = s.kv_width();
  INFO("B=" << s.B << " len=" << s.len << " max_len=" << s.max_len << " NH=" << s.NH << " NKV=" << s.kv_heads()
            << " HS=" << s.HS << " input std=" << s.input_scale);
  const size_t cache_n = static_cast<size_t>(s.B) * s.max_len * KV;
  std::vector<float> qkv_host =
      test::round_to<T>(test::random_floats(static_cast<size_t>(s.B) * s.qkv_width(), seed++, s.input_scale));
  std::vector<float> k_host = test::round_to<T>(test::random_floats(cache_n, seed++, s.input_scale));
  std::vector<float> v_host = test::round_to<T>(test::random_floats(cache_n, seed++));
  // Rows at and past len hold NaN: reading one would poison the output.
  for (int b = 0; b < s.B; ++b) {
    const size_t end = static_cast<size_t>(b + 1) * s.max_len * KV;
    for (size_t i = (static_cast<size_t>(b) * s.max_len + s.len) * KV; i < end; ++i) k_host[i] = v_host[i] = NAN;
  }
  test::DeviceBuffer<T> qkv(test::from_floats<T>(qkv_host)), k_cache(test::from_floats<T>(k_host)),
      v_cache(test::from_floats<T>(v_host)), out(static_cast<size_t>(s.B) * C);

  attention_decode_forward<T>(out, qkv, k_cache, v_cache, s.B, s.len, s.max_len, C, s.NH, s.kv_heads(), nullptr);
  test::require_no_cuda_error();
  const std::vector<T> got = out.download();
  const std::vector<double> want = reference_decode(qkv_host, k_host, v_host, s);
  // fp32 math, one rounding to T; sharp inputs (large scores) amplify fp32 score errors.
  const double abs_tol = test::Tolerance<T>::abs + (s.input_scale > 1.0f ? 1e-4 * s.input_scale * s.input_scale : 0.0);
  CHECK(test::all_close("out", got, want, test::Tolerance<T>::rel, abs_tol));

  out.poison();
  attention_decode_forward<T>(out, qkv, k_cache, v_cache, s.B, s.len, s.max_len, C, s.NH, s.kv_heads(), nullptr);
  test::require_no_cuda_error();
  CHECK(test::same_bits(out.download(), got));
}

// The full causal attention of sequences of len rows, then the same rows written to the cache
// (the first len - 1, then the last) and the last row decoded: the decoded row has its bits.
template <typename T>
void check_decode_is_last_row(const DecodeShape& s, uint64_t seed) {
  const int C = s.NH * s.HS, KV = s.kv_width(), W = s.qkv_width(), len = s.len, NKV = s.kv_heads();
  INFO("B=" << s.B << " len=" << len << " NH=" << s.NH << " NKV=" << NKV << " HS=" << s.HS);
  // The whole sequences' qkv (B, len, W), as the training forward sees them.
  const std::vector<float> full_host =
      test::round_to<T>(test::random_floats(static_cast<size_t>(s.B) * len * W, seed, s.input_scale));
  test::DeviceBuffer<T> full(test::from_floats<T>(full_host)), full_out(static_cast<size_t>(s.B) * len * C);
  test::DeviceBuffer<float> lse(static_cast<size_t>(s.B) * s.NH * len);
  attention_forward<T>(full_out, lse, full, s.B, len, C, s.NH, NKV, nullptr);

  // Incremental: the first len - 1 rows of each sequence into the cache, then the last row.
  test::DeviceBuffer<T> k_cache(static_cast<size_t>(s.B) * s.max_len * KV),
      v_cache(static_cast<size_t>(s.B) * s.max_len * KV), out(static_cast<size_t>(s.B) * C);
  std::vector<float> prefix, last;
  for (int b = 0; b < s.B; ++b) {
    const auto row = full_host.begin() + static_cast<std::ptrdiff_t>(b) * len * W;
    prefix.insert(prefix.end(), row, row + static_cast<std::ptrdiff_t>(len - 1) * W);
    last.insert(last.end(), row + static_cast<std::ptrdiff_t>(len - 1) * W, row + static_cast<std::ptrdiff_t>(len) * W);
  }
  test::DeviceBuffer<T> prefix_qkv(test::from_floats<T>(prefix)), last_qkv(test::from_floats<T>(last));
  if (len > 1) kv_cache_write<T>(k_cache, v_cache, prefix_qkv, s.B, len - 1, 0, s.max_len, C, s.NH, NKV, nullptr);
  kv_cache_write<T>(k_cache, v_cache, last_qkv, s.B, 1, len - 1, s.max_len, C, s.NH, NKV, nullptr);
  attention_decode_forward<T>(out, last_qkv, k_cache, v_cache, s.B, len, s.max_len, C, s.NH, NKV, nullptr);
  test::require_no_cuda_error();

  const std::vector<T> full_got = full_out.download(), got = out.download();
  std::vector<T> want;
  for (int b = 0; b < s.B; ++b) {
    const auto row = full_got.begin() + (static_cast<std::ptrdiff_t>(b) * len + len - 1) * C;
    want.insert(want.end(), row, row + C);
  }
  CHECK(test::same_bits(got, want));
}

}  // namespace

TEMPLATE_TEST_CASE("kv_cache_write stores the new rows' keys and values and nothing else", "[attention_decode]", float,
                   bf16) {
  check_cache_write<TestType>(3);
}

TEMPLATE_TEST_CASE("attention_decode_forward matches naive CPU loops and reads only rows [0, len)",
                   "[attention_decode]", float, bf16) {
  uint64_t seed = 300;
  for (const DecodeShape& s : shapes_and_presets()) check_decode<TestType>(s, seed);
}

TEMPLATE_TEST_CASE("attention_decode_forward gives the full causal attention's last row, bit for bit",
                   "[attention_decode]", float, bf16) {
  uint64_t seed = 400;
  for (const DecodeShape& s : shapes_and_presets()) check_decode_is_last_row<TestType>(s, seed++);
}

// Grouped-query decoding: NKV = 1, NH/2 and NH K/V heads in the cache, len 1 and odd lengths, head
// sizes 16, 64 and 128, sharp inputs, a group of 3, and Llama 3.1 8B's heads (NH 32, NKV 8, HS 128).
const DecodeShape kGroupedQueryShapes[] = {
    {1, 1, 1, 4, 16, 1.0f, 1},   {3, 1, 4, 4, 16, 1.0f, 2},  {2, 7, 9, 4, 64, 1.0f, 1},  {1, 5, 5, 4, 64, 1.0f, 4},
    {2, 33, 40, 6, 16, 1.0f, 2}, {1, 17, 20, 4, 128, 1.0f, 2}, {2, 17, 17, 4, 16, 5.0f, 1},
    {1, 9, 12, 32, 128, 1.0f, 8},
};

TEMPLATE_TEST_CASE("kv_cache_write of grouped-query K/V heads stores the new rows' keys and values and nothing else",
                   "[attention_decode]", float, bf16) {
  check_cache_write<TestType>(1);
}

TEMPLATE_TEST_CASE("grouped-query attention_decode_forward matches naive CPU loops and reads only rows [0, len)",
                   "[attention_decode]", float, bf16) {
  uint64_t seed = 600;
  for (const DecodeShape& s : kGroupedQueryShapes) check_decode<TestType>(s, seed);
}

TEMPLATE_TEST_CASE("grouped-query attention_decode_forward gives the full causal attention's last row, bit for bit",
                   "[attention_decode]", float, bf16) {
  uint64_t seed = 700;
  for (const DecodeShape& s : kGroupedQueryShapes) check_decode_is_last_row<TestType>(s, seed++);
}

// encoder_forward / encoder_backward vs. embedding lookups and gradient sums written here:
// the host bucket list's exact layout (with and without buckets split into segments), odd
// shapes (B = 1, T = 1, one token everywhere, many repeats, buckets of kEncoderSegment and
// kEncoderSegment + 1 positions, tokens split into several segments at chunk counts that are
// not multiples of 32), accumulation into pre-filled gradients (rows of unused tokens and
// positions >= seq_len keep their bits), and bit-identical reruns over a re-poisoned scratch.
#include "test/test_util.h"
#include "kernels/encoder.cuh"

#include <cstdint>
#include <type_traits>

namespace {

struct EncoderShape {
  int B, T, C, V;  // V: rows of wte (tokens drawn from [0, V))
  int hot = 0;     // > 0: every hot-th position holds token 0 (a bucket split into segments)
};

// Forward: one fp32 add of two T values rounded once (float: exact to 1 float ulp; bf16: to
// one bf16 ulp). Backward: fp32 sums of O(1) terms (<= 37 per position row, up to 2 segments of
// <= 128 per token: noise ~1e-6) plus the gradient's one rounding to T.
template <typename T> constexpr double kRel = std::is_same<T, float>::value ? 1e-6 : 1.0 / 128;
constexpr double kAbs = 1e-5;

template <typename T>
void check_encoder(const EncoderShape& s, uint64_t seed) {
  INFO("B " << s.B << " T " << s.T << " C " << s.C << " V " << s.V << " hot " << s.hot);
  const int N = s.B * s.T, C = s.C, maxT = s.T + 2;  // wpe rows past seq_len must stay unused
  std::vector<int> tokens = test::random_tokens(N, s.V, seed);
  if (N > 2) tokens[N - 1] = tokens[0];  // a repeat across the whole batch
  if (s.hot > 0)
    for (int p = 0; p < N; p += s.hot) tokens[p] = 0;
  const std::vector<float> wte = test::round_to<T>(test::random_floats(static_cast<size_t>(s.V) * C, seed + 1));
  const std::vector<float> wpe = test::round_to<T>(test::random_floats(static_cast<size_t>(maxT) * C, seed + 2));
  test::DeviceBuffer<int> d_tokens(tokens);
  test::DeviceBuffer<T> d_wte(test::from_floats<T>(wte)), d_wpe(test::from_floats<T>(wpe));
  test::DeviceBuffer<T> d_out(static_cast<size_t>(N) * C);

  encoder_forward<T>(d_out, d_tokens, d_wte, d_wpe, s.B, s.T, C, nullptr);
  test::require_no_cuda_error();
  std::vector<double> want(static_cast<size_t>(N) * C);
  for (int b = 0; b < s.B; ++b)
    for (int t = 0; t < s.T; ++t)
      for (int c = 0; c < C; ++c)
        want[(static_cast<size_t>(b) * s.T + t) * C + c] = static_cast<double>(
            wte[static_cast<size_t>(tokens[b * s.T + t]) * C + c]) + wpe[static_cast<size_t>(t) * C + c];
  CHECK(test::all_close("encoder_forward out", d_out.download(), want, kRel<T>, kAbs));

  // Backward into pre-filled gradients.
  const std::vector<float> dout = test::round_to<T>(test::random_floats(static_cast<size_t>(N) * C, seed + 3));
  const std::vector<T> dwte_before = test::from_floats<T>(test::random_floats(static_cast<size_t>(s.V) * C, seed + 4));
  const std::vector<T> dwpe_before = test::from_floats<T>(test::random_floats(static_cast<size_t>(maxT) * C, seed + 5));
  std::vector<int> buckets_host(encoder_backward_buckets_bytes(s.B, s.T) / sizeof(int));
  const int segments = encoder_backward_build_buckets(buckets_host.data(), tokens.data(), s.B, s.T, s.V);
  test::DeviceBuffer<int> d_buckets(buckets_host);
  test::DeviceBuffer<T> d_dout(test::from_floats<T>(dout));
  test::DeviceBuffer<T> d_dwte(dwte_before), d_dwpe(dwpe_before);
  REQUIRE(static_cast<size_t>(buckets_host[1]) * C * sizeof(float) <= encoder_backward_scratch_bytes(s.B, s.T, C));
  // Poisoned (NaN) scratch: a partial-sum row read before it is written shows in dwte.
  test::DeviceBuffer<float> d_scratch(std::max<size_t>(1, encoder_backward_scratch_bytes(s.B, s.T, C) / sizeof(float)));

  encoder_backward<T>(d_dwte, d_dwpe, d_scratch, d_buckets, segments, d_dout, s.B, s.T, C, nullptr);
  test::require_no_cuda_error();

  const std::vector<float> dwte_before_f = test::to_floats(dwte_before), dwpe_before_f = test::to_floats(dwpe_before);
  std::vector<double> want_dwte(dwte_before_f.begin(), dwte_before_f.end());
  std::vector<double> want_dwpe(dwpe_before_f.begin(), dwpe_before_f.end());
  std::vector<bool> token_used(s.V, false);
  for (int b = 0; b < s.B; ++b)
    for (int t = 0; t < s.T; ++t) {
      const int p = b * s.T + t;
      token_used[tokens[p]] = true;
      for (int c = 0; c < C; ++c) {
        want_dwte[static_cast<size_t>(tokens[p]) * C + c] += dout[static_cast<size_t>(p) * C + c];
        want_dwpe[static_cast<size_t>(t) * C + c] += dout[static_cast<size_t>(p) * C + c];
      }
    }
  const std::vector<T> dwte_first = d_dwte.download(), dwpe_first = d_dwpe.download();
  CHECK(test::all_close("encoder_backward dwte", dwte_first, want_dwte, kRel<T>, kAbs));
  CHECK(test::all_close("encoder_backward dwpe", dwpe_first, want_dwpe, kRel<T>, kAbs));
  // Rows no position maps to are not rewritten at all.
  size_t changed_unused = 0;
  for (int v = 0; v < s.V; ++v)
    if (!token_used[v])
      changed_unused += std::memcmp(&dwte_first[static_cast<size_t>(v) * C], &dwte_before[static_cast<size_t>(v) * C],
                                    C * sizeof(T)) != 0;
  for (int t = s.T; t < maxT; ++t)
    changed_unused += std::memcmp(&dwpe_first[static_cast<size_t>(t) * C], &dwpe_before[static_cast<size_t>(t) * C],
                                  C * sizeof(T)) != 0;
  CHECK(changed_unused == 0);

  // Same pre-filled gradients and a re-poisoned scratch: same bits.
  d_dwte.upload(dwte_before);
  d_dwpe.upload(dwpe_before);
  d_scratch.poison();
  encoder_backward<T>(d_dwte, d_dwpe, d_scratch, d_buckets, segments, d_dout, s.B, s.T, C, nullptr);
  test::require_no_cuda_error();
  CHECK(test::bytes_of(d_dwte.download()) == test::bytes_of(dwte_first));
  CHECK(test::bytes_of(d_dwpe.download()) == test::bytes_of(dwpe_first));
}

}  // namespace

// The list's parts (kernels/encoder.cuh's layout), read here by offset.
struct BucketListParts {
  std::vector<int> header, segment_tokens, segment_starts, positions, split_starts;
};
BucketListParts split_list(const std::vector<int>& list, int N, int segments, int split) {
  auto part = [&](size_t at, int count) { return std::vector<int>(list.begin() + at, list.begin() + at + count); };
  return {part(0, 2), part(2, segments), part(2 + N, segments + 1), part(3 + 2 * N, N), part(3 + 3 * N, split + 1)};
}

TEST_CASE("encoder bucket list groups positions by token, largest bucket first", "[encoder]") {
  // B = 2, T = 4: token 3 at positions 0, 2, 3; token 1 at 1, 4; tokens 7, 5, 9 once each.
  const std::vector<int> tokens = {3, 1, 3, 3, 1, 7, 5, 9};
  const int N = 8;
  std::vector<int> list(encoder_backward_buckets_bytes(2, 4) / sizeof(int), -1);
  REQUIRE(list.size() == 3 * N + 4);  // no bucket of 8 positions can be split
  const int segments = encoder_backward_build_buckets(list.data(), tokens.data(), 2, 4, 10);
  REQUIRE(segments == 5);
  const BucketListParts got = split_list(list, N, segments, 0);
  CHECK(got.header == std::vector<int>({0, 0}));
  // Equal sizes keep increasing token order.
  CHECK(got.segment_tokens == std::vector<int>({3, 1, 5, 7, 9}));
  CHECK(got.segment_starts == std::vector<int>({0, 3, 5, 6, 7, 8}));
  CHECK(got.positions == std::vector<int>({0, 2, 3, 1, 4, 6, 5, 7}));
  CHECK(got.split_starts == std::vector<int>({0}));
}

TEST_CASE("encoder bucket list cuts buckets of more than kEncoderSegment positions into segments", "[encoder]") {
  REQUIRE(kEncoderSegment == 128);
  // B = 2, T = 264: token 7 at positions 0..10, token 5 at 11..138 (128: one segment); past them,
  // token 2 at every third position (q = p - 139, q % 3 == 2: 129 positions), token 4 at the rest (260).
  const int B = 2, T = 264, N = B * T;
  std::vector<int> tokens(N);
  for (int p = 0; p < N; ++p) tokens[p] = p < 11 ? 7 : p < 139 ? 5 : (p - 139) % 3 == 2 ? 2 : 4;
  std::vector<int> list(encoder_backward_buckets_bytes(B, T) / sizeof(int), -1);
  REQUIRE(list.size() == 3 * N + N / 129 + 4);
  const int segments = encoder_backward_build_buckets(list.data(), tokens.data(), B, T, 10);
  // Token 4: segments of 128, 128 and 4 positions; token 2: 128 and 1; tokens 5 and 7: one each.
  REQUIRE(segments == 7);
  const BucketListParts got = split_list(list, N, segments, 2);
  CHECK(got.header == std::vector<int>({2, 5}));  // two split buckets, five segments (partial rows)
  CHECK(got.segment_tokens == std::vector<int>({4, 4, 4, 2, 2, 5, 7}));
  CHECK(got.segment_starts == std::vector<int>({0, 128, 256, 260, 388, 389, 517, 528}));
  CHECK(got.split_starts == std::vector<int>({0, 3, 5}));
  std::vector<int> want_positions;
  for (int token : {4, 2, 5, 7})
    for (int p = 0; p < N; ++p)
      if (tokens[p] == token) want_positions.push_back(p);
  CHECK(got.positions == want_positions);
}

// encoder_backward_scratch_bytes: one row of C floats per segment of a split bucket, at most
// 2·floor(N / 128); buckets of 129 positions (two segments each) reach that bound.
TEST_CASE("encoder backward scratch holds the partial rows of the worst bucket sizes", "[encoder]") {
  const int B = 2, T = 129, N = B * T, C = 8;
  std::vector<int> tokens(N);
  for (int p = 0; p < N; ++p) tokens[p] = p / T;  // token 0 in batch row 0, token 1 in row 1
  std::vector<int> list(encoder_backward_buckets_bytes(B, T) / sizeof(int));
  REQUIRE(encoder_backward_build_buckets(list.data(), tokens.data(), B, T, 2) == 4);
  CHECK(list[0] == 2);  // split buckets
  CHECK(list[1] == 4);  // their segments: partial rows
  CHECK(encoder_backward_scratch_bytes(B, T, C) == 4 * C * sizeof(float));
}

TEMPLATE_TEST_CASE("encoder forward and backward match CPU loops", "[encoder]", float, bf16) {
  const EncoderShape shapes[] = {
      {1, 1, 8, 5},     // a single position
      {1, 37, 24, 3},   // B = 1, three tokens repeated many times
      {3, 1, 40, 50},   // T = 1: every position shares wpe row 0
      {2, 7, 200, 11},  // C = 200: 25 bf16 / 50 float chunks per row
      {3, 5, 16, 1},    // one token everywhere: a single bucket of 15 positions
      {2, 64, 16, 1},   // one bucket of exactly kEncoderSegment positions: one segment, no combination
      {1, 129, 8, 1},   // kEncoderSegment + 1 positions: segments of 128 and 1, combined
      {3, 97, 200, 2},  // two tokens of ~145 positions, each split; 25 bf16 / 50 float chunks
      {2, 300, 24, 40, 2},  // token 0 at every other position (3 segments) next to 39 small buckets
      {1, 130, 2056, 1},    // 257 bf16 / 514 float chunks: several chunk blocks per segment
  };
  uint64_t seed = 10;
  for (const EncoderShape& s : shapes) check_encoder<TestType>(s, seed += 10);
}

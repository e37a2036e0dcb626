// encoder_forward / encoder_backward vs. embedding lookups and gradient sums written here:
// the host bucket list's exact layout (with and without buckets split into segments), odd
// shapes (B = 1, T = 1, one token everywhere, many repeats, buckets of kEncoderSegment and
// kEncoderSegment + 1 positions, tokens split into several segments at chunk counts that are
// not multiples of 32), accumulation into pre-filled gradients (rows of unused tokens and
// positions >= seq_len keep their bits), and bit-identical reruns over a re-poisoned scratch.
// Vocabulary slices (vocab parallelism): the bucket list of a slice (relative tokens, positions
// of other tokens left out, no segment at all), slices' partial forwards (one with wpe) summing to
// the full forward bit for bit, each slice's backward giving its rows of the full dwte bit for bit,
// dwpe == nullptr and zero segments launching nothing (counted by the profiler), odd boundaries.
// Every preset's width C with the vocabulary's last tokens (test/preset_shapes.h).
#include "test/preset_shapes.h"
#include "test/test_util.h"
#include "kernels/encoder.cuh"

#include <cstdint>
#include <sstream>
#include <type_traits>
#include <utility>

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

TEST_CASE("encoder bucket list of a vocabulary slice keeps its tokens, relative to its first", "[encoder]") {
  // B = 2, T = 4: token 3 at positions 0, 2, 3; token 1 at 1, 4; tokens 7, 5, 9 once each.
  const std::vector<int> tokens = {3, 1, 3, 3, 1, 7, 5, 9};
  const int N = 8;
  std::vector<int> list(encoder_backward_buckets_bytes(2, 4) / sizeof(int), -1);
  // Slice [3, 8): tokens 3, 5, 7 as 0, 2, 4; positions 1, 4 (token 1) and 7 (token 9) left out.
  REQUIRE(encoder_backward_build_buckets(list.data(), tokens.data(), 2, 4, 10, 3, 8) == 3);
  BucketListParts got = split_list(list, N, 3, 0);
  CHECK(got.header == std::vector<int>({0, 0}));
  CHECK(got.segment_tokens == std::vector<int>({0, 2, 4}));
  CHECK(got.segment_starts == std::vector<int>({0, 3, 4, 5}));
  CHECK(got.positions == std::vector<int>({0, 2, 3, 6, 5, 0, 0, 0}));
  CHECK(got.split_starts == std::vector<int>({0}));
  // The last slice of a padded vocabulary ends past vocab_size: token 9 as 1.
  REQUIRE(encoder_backward_build_buckets(list.data(), tokens.data(), 2, 4, 10, 8, 16) == 1);
  got = split_list(list, N, 1, 0);
  CHECK(got.segment_tokens == std::vector<int>({1}));
  CHECK(got.segment_starts == std::vector<int>({0, 1}));
  CHECK(got.positions == std::vector<int>({7, 0, 0, 0, 0, 0, 0, 0}));
  // No token in [10, 16) (all padding) nor in [4, 5): no segment, an empty list.
  for (const std::pair<int, int>& slice : {std::make_pair(10, 16), std::make_pair(4, 5), std::make_pair(6, 6)}) {
    INFO("slice [" << slice.first << ", " << slice.second << ")");
    std::fill(list.begin(), list.end(), -1);
    REQUIRE(encoder_backward_build_buckets(list.data(), tokens.data(), 2, 4, 10, slice.first, slice.second) == 0);
    CHECK(list == std::vector<int>(list.size(), 0));
  }
  // vocab_end = -1 is vocab_size: the same list as without a slice.
  std::vector<int> whole(list.size()), from_zero(list.size());
  REQUIRE(encoder_backward_build_buckets(whole.data(), tokens.data(), 2, 4, 10) == 5);
  REQUIRE(encoder_backward_build_buckets(from_zero.data(), tokens.data(), 2, 4, 10, 0, -1) == 5);
  CHECK(whole == from_zero);
  // Ids are still checked against [0, vocab_size), inside the slice or not; a reversed slice is refused.
  const std::vector<int> bad = {3, 1, 3, 3, 1, 7, 5, 10};
  CHECK_THROWS_WITH(encoder_backward_build_buckets(list.data(), bad.data(), 2, 4, 10, 0, 5),
                    "encoder_backward: token 10 at position 7 is outside [0, 10)");
  CHECK_THROWS_WITH(encoder_backward_build_buckets(list.data(), tokens.data(), 2, 4, 10, 5, 4),
                    Catch::Contains("vocab_begin=5 vocab_end=4"));
  CHECK_THROWS_WITH(encoder_backward_build_buckets(list.data(), tokens.data(), 2, 4, 10, -1, 4),
                    Catch::Contains("vocab_begin=-1"));
}

namespace {

struct SliceShape {
  int B, T, C, V;
  std::vector<int> cuts;  // slice k holds tokens [cuts[k], cuts[k+1]); cuts[0] = 0, the last = V
  int wpe_slice;          // the slice that adds wpe (forward) and writes dwpe (backward)
  int hot = 0;            // > 0: every hot-th position holds hot_token (a bucket split into segments)
  int hot_token = 0;
  int unused_begin = 0, unused_end = 0;  // tokens drawn outside [unused_begin, unused_end)
};

// Kernel launches (profiler calls) made by f().
template <typename F>
long long launches_of(F&& f) {
  DeviceProfiler& profiler = DeviceProfiler::get();
  profiler.clear();
  profiler.start();
  f();
  profiler.stop();
  long long calls = 0;
  for (const ProfileSite& site : profiler.sites()) calls += site.calls;
  profiler.clear();
  return calls;
}

template <typename T>
void check_slices(const SliceShape& s, uint64_t seed) {
  std::ostringstream cuts;
  for (int c : s.cuts) cuts << c << " ";
  INFO("B " << s.B << " T " << s.T << " C " << s.C << " V " << s.V << " cuts " << cuts.str() << "wpe slice "
            << s.wpe_slice << " hot " << s.hot);
  const int N = s.B * s.T, C = s.C, maxT = s.T + 1, slices = static_cast<int>(s.cuts.size()) - 1;
  REQUIRE((s.cuts.front() == 0 && s.cuts.back() == s.V));
  std::vector<int> tokens = test::random_tokens(N, s.V - (s.unused_end - s.unused_begin), seed);
  for (int& token : tokens)
    if (token >= s.unused_begin) token += s.unused_end - s.unused_begin;
  if (s.hot > 0)
    for (int p = 0; p < N; p += s.hot) tokens[p] = s.hot_token;
  const std::vector<float> wte = test::round_to<T>(test::random_floats(static_cast<size_t>(s.V) * C, seed + 1));
  const std::vector<float> wpe = test::round_to<T>(test::random_floats(static_cast<size_t>(maxT) * C, seed + 2));
  const std::vector<T> wte_t = test::from_floats<T>(wte);
  test::DeviceBuffer<int> d_tokens(tokens);
  test::DeviceBuffer<T> d_wte(wte_t), d_wpe(test::from_floats<T>(wpe));
  auto rows_of = [&](const std::vector<T>& m, int begin, int end) {  // rows [begin, end) of a (rows, C) table
    return std::vector<T>(m.begin() + static_cast<size_t>(begin) * C, m.begin() + static_cast<size_t>(end) * C);
  };

  // Forward: the slices' partial outputs, added in fp32 and rounded once as the all-reduce does
  // (every term but the owner's wte row and wpe is 0), are the full forward's bits.
  test::DeviceBuffer<T> d_full(static_cast<size_t>(N) * C);
  encoder_forward<T>(d_full, d_tokens, d_wte, d_wpe, s.B, s.T, C, nullptr);
  test::require_no_cuda_error();
  const std::vector<T> full = d_full.download();
  std::vector<float> sum(static_cast<size_t>(N) * C, 0.0f);
  for (int k = 0; k < slices; ++k) {
    INFO("slice " << k);
    const int begin = s.cuts[k], end = s.cuts[k + 1];
    test::DeviceBuffer<T> d_slice_wte(rows_of(wte_t, begin, end)), d_out(static_cast<size_t>(N) * C);
    // The last slice passes vocab_rows = -1 (every token from begin on).
    encoder_forward<T>(d_out, d_tokens, d_slice_wte, k == s.wpe_slice ? d_wpe.ptr : nullptr, s.B, s.T, C, nullptr,
                       begin, k == slices - 1 ? -1 : end - begin);
    test::require_no_cuda_error();
    const std::vector<float> out = test::to_floats(d_out.download());
    std::vector<double> want(out.size());
    size_t nonzero_elsewhere = 0;  // positions of other slices' tokens, without wpe: exact zeros
    for (int p = 0; p < N; ++p)
      for (int c = 0; c < C; ++c) {
        const size_t i = static_cast<size_t>(p) * C + c;
        const bool owns = tokens[p] >= begin && tokens[p] < end;
        want[i] = (owns ? wte[static_cast<size_t>(tokens[p]) * C + c] : 0.0) +
                  (k == s.wpe_slice ? wpe[static_cast<size_t>(p % s.T) * C + c] : 0.0);
        nonzero_elsewhere += !owns && k != s.wpe_slice && !(out[i] == 0.0f && !std::signbit(out[i]));
        sum[i] += out[i];
      }
    CHECK(test::all_close("slice forward", out, want, kRel<T>, kAbs));
    CHECK(nonzero_elsewhere == 0);
  }
  CHECK(test::bytes_of(test::from_floats<T>(sum)) == test::bytes_of(full));

  // Backward into pre-filled gradients: the full tables, then each slice's rows and (one slice)
  // dwpe; every slice with the same poisoned scratch bound as the full list.
  const std::vector<T> dout = test::from_floats<T>(test::random_floats(static_cast<size_t>(N) * C, seed + 3));
  const std::vector<T> dwte_before = test::from_floats<T>(test::random_floats(static_cast<size_t>(s.V) * C, seed + 4));
  const std::vector<T> dwpe_before = test::from_floats<T>(test::random_floats(static_cast<size_t>(maxT) * C, seed + 5));
  const size_t list_ints = encoder_backward_buckets_bytes(s.B, s.T) / sizeof(int);
  const size_t scratch_floats = std::max<size_t>(1, encoder_backward_scratch_bytes(s.B, s.T, C) / sizeof(float));
  test::DeviceBuffer<T> d_dout(dout);
  std::vector<int> list(list_ints);
  const int all_segments = encoder_backward_build_buckets(list.data(), tokens.data(), s.B, s.T, s.V);
  test::DeviceBuffer<int> d_list(list);
  test::DeviceBuffer<T> d_dwte(dwte_before), d_dwpe(dwpe_before);
  test::DeviceBuffer<float> d_scratch(scratch_floats);
  encoder_backward<T>(d_dwte, d_dwpe, d_scratch, d_list, all_segments, d_dout, s.B, s.T, C, nullptr);
  test::require_no_cuda_error();
  const std::vector<T> full_dwte = d_dwte.download(), full_dwpe = d_dwpe.download();

  int kept_segments = 0;
  for (int k = 0; k < slices; ++k) {
    INFO("slice " << k);
    const int begin = s.cuts[k], end = s.cuts[k + 1];
    const bool with_wpe = k == s.wpe_slice;
    const bool any = std::any_of(tokens.begin(), tokens.end(), [&](int t) { return t >= begin && t < end; });
    std::vector<int> slice_list(list_ints);
    const int segments = encoder_backward_build_buckets(slice_list.data(), tokens.data(), s.B, s.T, s.V, begin, end);
    CHECK((segments > 0) == any);
    kept_segments += segments;
    test::DeviceBuffer<int> d_slice_list(slice_list);
    test::DeviceBuffer<T> d_slice_dwte(rows_of(dwte_before, begin, end)), d_slice_dwpe(dwpe_before);
    d_scratch.poison();
    const long long calls = launches_of([&] {
      encoder_backward<T>(d_slice_dwte, with_wpe ? d_slice_dwpe.ptr : nullptr, d_scratch, d_slice_list, segments,
                          d_dout, s.B, s.T, C, nullptr);
    });
    test::require_no_cuda_error();
    // The plan's count, less the wte kernels where no token falls in the slice.
    CHECK(calls == encoder_backward_launches(s.B, s.T, with_wpe) -
                       (segments > 0 ? 0 : encoder_backward_launches(s.B, s.T, false)));
    CHECK(test::bytes_of(d_slice_dwte.download()) == test::bytes_of(rows_of(full_dwte, begin, end)));
    if (with_wpe) CHECK(test::bytes_of(d_slice_dwpe.download()) == test::bytes_of(full_dwpe));
    else CHECK(test::bytes_of(d_slice_dwpe.download()) == test::bytes_of(dwpe_before));  // dwpe nullptr: not written
  }
  CHECK(kept_segments == all_segments);  // a bucket is cut the same way in its slice
}

// Two positions at a preset's width C holding the vocabulary's last two real tokens, V - 1 and
// V - 2, through a wte slice of just their rows (a vocabulary-parallel rank's view, so no V x C
// table is needed): forward and backward against CPU loops, dwpe included.
template <typename T>
void check_widest(const test::PresetShape& p, uint64_t seed) {
  const int C = p.C, B = 1, T_len = 2, N = B * T_len, begin = p.V - 2;
  const size_t NC = static_cast<size_t>(N) * C;  // also the size of the 2-row wte slice and of wpe
  const std::vector<int> tokens = {p.V - 1, p.V - 2};
  const std::vector<float> wte = test::round_to<T>(test::random_floats(NC, seed));
  const std::vector<float> wpe = test::round_to<T>(test::random_floats(NC, seed + 1));
  test::DeviceBuffer<int> d_tokens(tokens);
  test::DeviceBuffer<T> d_wte(test::from_floats<T>(wte)), d_wpe(test::from_floats<T>(wpe));
  test::DeviceBuffer<T> d_out(NC);
  encoder_forward<T>(d_out, d_tokens, d_wte, d_wpe, B, T_len, C, nullptr, begin, 2);
  test::require_no_cuda_error();
  std::vector<double> want(NC);
  for (int t = 0; t < N; ++t)
    for (int c = 0; c < C; ++c)
      want[static_cast<size_t>(t) * C + c] =
          static_cast<double>(wte[static_cast<size_t>(tokens[t] - begin) * C + c]) + wpe[static_cast<size_t>(t) * C + c];
  CHECK(test::all_close("encoder_forward out", d_out.download(), want, kRel<T>, kAbs));

  const std::vector<float> dout = test::round_to<T>(test::random_floats(NC, seed + 2));
  const std::vector<float> dwte_before = test::round_to<T>(test::random_floats(NC, seed + 3));
  const std::vector<float> dwpe_before = test::round_to<T>(test::random_floats(NC, seed + 4));
  std::vector<int> list(encoder_backward_buckets_bytes(B, T_len) / sizeof(int));
  const int segments = encoder_backward_build_buckets(list.data(), tokens.data(), B, T_len, p.V, begin, p.V);
  test::DeviceBuffer<int> d_list(list);
  test::DeviceBuffer<T> d_dout(test::from_floats<T>(dout));
  test::DeviceBuffer<T> d_dwte(test::from_floats<T>(dwte_before)), d_dwpe(test::from_floats<T>(dwpe_before));
  test::DeviceBuffer<float> d_scratch(std::max<size_t>(1, encoder_backward_scratch_bytes(B, T_len, C) / sizeof(float)));
  encoder_backward<T>(d_dwte, d_dwpe, d_scratch, d_list, segments, d_dout, B, T_len, C, nullptr);
  test::require_no_cuda_error();
  std::vector<double> want_dwte(dwte_before.begin(), dwte_before.end());
  std::vector<double> want_dwpe(dwpe_before.begin(), dwpe_before.end());
  for (int t = 0; t < N; ++t)
    for (int c = 0; c < C; ++c) {
      want_dwte[static_cast<size_t>(tokens[t] - begin) * C + c] += dout[static_cast<size_t>(t) * C + c];
      want_dwpe[static_cast<size_t>(t) * C + c] += dout[static_cast<size_t>(t) * C + c];
    }
  CHECK(test::all_close("encoder_backward dwte", d_dwte.download(), want_dwte, kRel<T>, kAbs));
  CHECK(test::all_close("encoder_backward dwpe", d_dwpe.download(), want_dwpe, kRel<T>, kAbs));
}

}  // namespace

TEMPLATE_TEST_CASE("encoder over vocabulary slices adds up to the full encoder", "[encoder]", float, bf16) {
  const SliceShape shapes[] = {
      {1, 1, 8, 5, {0, 5}, 0},                      // one slice: the whole table
      {2, 7, 24, 11, {0, 3, 4, 11}, 1},             // odd cuts, a one-token slice carries wpe
      {3, 5, 40, 50, {0, 17, 30, 50}, 2, 0, 0, 17, 30},  // no token in [17, 30): slice 1 has no segment
      {3, 97, 200, 20, {0, 7, 13, 20}, 1, 2, 9},    // token 9's bucket (~146 positions) split, in slice 1
      {2, 300, 16, 40, {0, 10, 20, 30, 40}, 3, 2, 25},  // three segments of token 25 in slice 2
      {1, 130, 2056, 4, {0, 1, 2, 4}, 0, 1, 3},     // several chunk blocks per segment, split in slice 2
  };
  uint64_t seed = 500;
  for (const SliceShape& s : shapes) check_slices<TestType>(s, seed += 10);
}

TEMPLATE_TEST_CASE("encoder launches and matches at every preset's width and last tokens", "[encoder]", float, bf16) {
  uint64_t seed = 900;
  for (const test::PresetShape& p : test::preset_shapes()) {
    INFO("presets " << p.presets << " C " << p.C << " V " << p.V);
    check_widest<TestType>(p, seed += 10);
  }
}

TEST_CASE("encoder_forward refuses a negative vocabulary slice", "[encoder]") {
  test::DeviceBuffer<int> tokens(std::vector<int>{0});
  test::DeviceBuffer<float> table(8), out(8);
  CHECK_THROWS_WITH(encoder_forward<float>(out, tokens, table, table, 1, 1, 8, nullptr, -1, 2),
                    Catch::Contains("encoder_forward: need vocab_begin >= 0") && Catch::Contains("vocab_begin=-1"));
  CHECK_THROWS_WITH(encoder_forward<float>(out, tokens, table, table, 1, 1, 8, nullptr, 0, -2),
                    Catch::Contains("vocab_rows=-2"));
  test::require_no_cuda_error();
}

// Blockwise attention for context parallelism (kernels/ring_attention.cuh): (a) a sequence cut
// into 2N zigzag chunks (N = 2, 3), every rank's query chunks attending to every key/value chunk
// in ring order with its mask kind, merged, equals the unsplit causal kernel's out and lse, and
// the blockwise backward's dq, dk, dv summed over the block pairs equal the unsplit dqkv; (b) one
// block pair with each mask kind against attention written out in double (scores, softmax, out,
// lse, gradients), accumulating into non-zero gradients; (c) the merge against its formula in
// double, rows that saw no key (lse = -inf, out poisoned), one block alone, and a fixed order
// reproducing its bits; (d) the zigzag layout's causal tile count, equal on every rank; (e) the
// ring's buffer copies (K/V packed, dqkv assembled, fp32 adds) against host loops. Odd block
// lengths, T = 1 blocks, GQA (NH 4 on NKV 2 and 1), MHA, every preset's heads.
#include "test/preset_shapes.h"
#include "test/test_util.h"
#include "kernels/attention.cuh"
#include "kernels/ring_attention.cuh"

#include <limits>

namespace {

// Which blockwise kernels a ring runs: the simple ones (float, bf16) or flash (bf16).
enum class Kernels { simple, flash };

template <typename T, typename OutT>
void block_forward(Kernels kernels, OutT* out, float* lse, const T* qkv, const T* kv, int B, int Tq, int Tk, int C,
                   int NH, int NKV, AttentionBlockMask mask) {
  if constexpr (std::is_same<T, bf16>::value && std::is_same<OutT, float>::value) {  // flash: fp32 out
    if (kernels == Kernels::flash) return ring_flash_attention_forward(out, lse, qkv, kv, B, Tq, Tk, C, NH, NKV, mask, nullptr);
  }
  ring_attention_forward<T, OutT>(out, lse, qkv, kv, B, Tq, Tk, C, NH, NKV, mask, nullptr);
}

template <typename T>
void block_backward(Kernels kernels, float* dq, float* dkv, float* scratch, const T* dout, const T* qkv, const T* out,
                    const float* lse, const T* kv, int B, int Tq, int Tk, int C, int NH, int NKV,
                    AttentionBlockMask mask) {
  if constexpr (std::is_same<T, bf16>::value) {
    if (kernels == Kernels::flash)
      return ring_flash_attention_backward(dq, dkv, scratch, dout, qkv, out, lse, kv, B, Tq, Tk, C, NH, NKV, mask, nullptr);
  }
  ring_attention_backward<T>(dq, dkv, scratch, dout, qkv, out, lse, kv, B, Tq, Tk, C, NH, NKV, mask, nullptr);
}

struct BlockShape {
  int B, Tq, Tk, NH, NKV, HS;
  float input_std = 1.0f;
};

std::vector<double> to_doubles(const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); }

double max_abs(const std::vector<double>& v) {
  double m = 0.0;
  for (double x : v) m = std::max(m, std::fabs(x));
  return m;
}

struct BlockReference {
  std::vector<double> out, lse, dq, dkv;
  double max_abs_score = 0.0;  // largest |q·k|/sqrt(HS) over visible pairs
};

// One query block (q: query heads of qkv (B, Tq, (NH + 2·NKV)·HS)) against one key/value block
// (kv (B, Tk, 2·NKV·HS): key heads, then value heads), in double, the softmax over this block's
// visible keys only: under causal_diagonal row t sees keys 0..t, under full all Tk. Gradients of
// L = sum(out ∘ dout): D_t = dout_t · out_t from out_seen where given (what a bf16 backward is
// handed), else from the exact out.
BlockReference reference_block(const std::vector<double>& qkv, const std::vector<double>& kv,
                               const std::vector<double>& dout, const BlockShape& s, AttentionBlockMask mask,
                               const std::vector<double>* out_seen = nullptr) {
  const int HS = s.HS, NH = s.NH, NKV = s.NKV, C = NH * HS, W = (NH + 2 * NKV) * HS, KW = 2 * NKV * HS;
  const double scale = 1.0 / std::sqrt(static_cast<double>(HS));
  auto q_at = [&](int b, int t, int h, int i) { return qkv[(static_cast<size_t>(b) * s.Tq + t) * W + h * HS + i]; };
  auto kv_index = [&](int b, int u, int part, int h, int i) {
    return (static_cast<size_t>(b) * s.Tk + u) * KW + part * NKV * HS + h / (NH / NKV) * HS + i;
  };
  auto out_index = [&](int b, int t, int h, int i) { return (static_cast<size_t>(b) * s.Tq + t) * C + h * HS + i; };
  BlockReference r;
  r.out.assign(static_cast<size_t>(s.B) * s.Tq * C, 0.0);
  r.lse.assign(static_cast<size_t>(s.B) * NH * s.Tq, 0.0);
  r.dq.assign(r.out.size(), 0.0);
  r.dkv.assign(static_cast<size_t>(s.B) * s.Tk * KW, 0.0);
  for (int b = 0; b < s.B; ++b) {
    for (int h = 0; h < NH; ++h) {
      for (int t = 0; t < s.Tq; ++t) {
        const int visible = mask == AttentionBlockMask::full ? s.Tk : t + 1;
        std::vector<double> score(visible), p(visible), dp(visible);
        double max_score = -INFINITY;
        for (int u = 0; u < visible; ++u) {
          double dot = 0.0;
          for (int i = 0; i < HS; ++i) dot += q_at(b, t, h, i) * kv[kv_index(b, u, 0, h, i)];
          score[u] = dot * scale;
          r.max_abs_score = std::max(r.max_abs_score, std::fabs(score[u]));
          max_score = std::max(max_score, score[u]);
        }
        double sum = 0.0;
        for (int u = 0; u < visible; ++u) sum += std::exp(score[u] - max_score);
        for (int u = 0; u < visible; ++u) p[u] = std::exp(score[u] - max_score) / sum;
        r.lse[(static_cast<size_t>(b) * NH + h) * s.Tq + t] = max_score + std::log(sum);
        for (int i = 0; i < HS; ++i) {
          double o = 0.0;
          for (int u = 0; u < visible; ++u) o += p[u] * kv[kv_index(b, u, 1, h, i)];
          r.out[out_index(b, t, h, i)] = o;
        }
        if (dout.empty()) continue;
        // dP = dout · v, D = dout · out, dS = P (dP - D); dq = scale dS K, dk += scale dS q, dv += P dout.
        double delta = 0.0;
        const std::vector<double>& out_for_delta = out_seen ? *out_seen : r.out;
        for (int i = 0; i < HS; ++i) delta += dout[out_index(b, t, h, i)] * out_for_delta[out_index(b, t, h, i)];
        for (int u = 0; u < visible; ++u) {
          double d = 0.0;
          for (int i = 0; i < HS; ++i) d += dout[out_index(b, t, h, i)] * kv[kv_index(b, u, 1, h, i)];
          dp[u] = d;
        }
        for (int u = 0; u < visible; ++u) {
          const double ds = p[u] * (dp[u] - delta);
          for (int i = 0; i < HS; ++i) {
            r.dq[out_index(b, t, h, i)] += scale * ds * kv[kv_index(b, u, 0, h, i)];
            r.dkv[kv_index(b, u, 0, h, i)] += scale * ds * q_at(b, t, h, i);
            r.dkv[kv_index(b, u, 1, h, i)] += p[u] * dout[out_index(b, t, h, i)];
          }
        }
      }
    }
  }
  return r;
}

// Rows [t0, t0 + n) of a (B, T, width) tensor, and the K/V block (the channels from C on) of such rows of qkv.
std::vector<float> rows(const std::vector<float>& x, int B, int T, int width, int t0, int n, int from = 0,
                        int count = -1) {
  if (count < 0) count = width - from;
  std::vector<float> r(static_cast<size_t>(B) * n * count);
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < n; ++t)
      for (int i = 0; i < count; ++i)
        r[(static_cast<size_t>(b) * n + t) * count + i] = x[(static_cast<size_t>(b) * T + t0 + t) * width + from + i];
  return r;
}
// The inverse: block (B, n, count) into rows [t0, t0 + n), channels [from, from + count) of x (B, T, width).
void put_rows(std::vector<float>& x, const std::vector<float>& block, int B, int T, int width, int t0, int n, int from,
              int count) {
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < n; ++t)
      for (int i = 0; i < count; ++i)
        x[(static_cast<size_t>(b) * T + t0 + t) * width + from + i] = block[(static_cast<size_t>(b) * n + t) * count + i];
}
// lse (B, NH, n) of a block into positions [t0, t0 + n) of (B, NH, T).
void put_lse(std::vector<float>& x, const std::vector<float>& block, int B, int NH, int T, int t0, int n) {
  for (int bh = 0; bh < B * NH; ++bh)
    for (int t = 0; t < n; ++t) x[static_cast<size_t>(bh) * T + t0 + t] = block[static_cast<size_t>(bh) * n + t];
}

// (b) One block pair against reference_block: forward with a fp32 and a T output, then the
// backward (handed the forward's own out and lse, the final ones when the block is all a row
// sees) adding into dq and dkv that start at random values; a second run gives the same bits.
template <typename T>
void check_block(const BlockShape& s, AttentionBlockMask mask, uint64_t& seed) {
  const bool is_bf16 = sizeof(T) == 2;
  const int C = s.NH * s.HS, W = (s.NH + 2 * s.NKV) * s.HS, KW = 2 * s.NKV * s.HS;
  INFO("B=" << s.B << " Tq=" << s.Tq << " Tk=" << s.Tk << " NH=" << s.NH << " NKV=" << s.NKV << " HS=" << s.HS
            << " mask=" << (mask == AttentionBlockMask::full ? "full" : "causal_diagonal"));
  const size_t out_n = static_cast<size_t>(s.B) * s.Tq * C, lse_n = static_cast<size_t>(s.B) * s.NH * s.Tq;
  const size_t dkv_n = static_cast<size_t>(s.B) * s.Tk * KW;
  std::vector<float> qkv_host = test::round_to<T>(test::random_floats(static_cast<size_t>(s.B) * s.Tq * W, seed++, s.input_std));
  std::vector<float> kv_host = test::round_to<T>(test::random_floats(dkv_n, seed++, s.input_std));
  std::vector<float> dout_host = test::round_to<T>(test::random_floats(out_n, seed++));
  std::vector<float> dq_start = test::random_floats(out_n, seed++), dkv_start = test::random_floats(dkv_n, seed++);

  test::DeviceBuffer<T> qkv(test::from_floats<T>(qkv_host)), kv(test::from_floats<T>(kv_host));
  test::DeviceBuffer<T> dout(test::from_floats<T>(dout_host)), out(out_n);
  test::DeviceBuffer<float> out_fp32(out_n), lse(lse_n), lse_again(lse_n), dq(dq_start), dkv(dkv_start);
  test::DeviceBuffer<float> scratch(ring_attention_backward_scratch_bytes(s.B, s.Tq, s.NH) / sizeof(float));
  ring_attention_forward<T, float>(out_fp32, lse, qkv, kv, s.B, s.Tq, s.Tk, C, s.NH, s.NKV, mask, nullptr);
  ring_attention_forward<T, T>(out, lse_again, qkv, kv, s.B, s.Tq, s.Tk, C, s.NH, s.NKV, mask, nullptr);
  ring_attention_backward<T>(dq, dkv, scratch, dout, qkv, out, lse, kv, s.B, s.Tq, s.Tk, C, s.NH, s.NKV, mask,
                             nullptr);
  test::require_no_cuda_error();
  std::vector<float> out_fp32_got = out_fp32.download(), lse_got = lse.download();
  std::vector<float> dq_got = dq.download(), dkv_got = dkv.download();
  std::vector<T> out_got = out.download();

  std::vector<double> out_seen = to_doubles(test::to_floats(out_got));
  BlockReference want = reference_block(to_doubles(qkv_host), to_doubles(kv_host), to_doubles(dout_host), s, mask,
                                        is_bf16 ? &out_seen : nullptr);
  // As test_attention.cu: an fp32 score is off by ~|s|·2^-24 per operation, and its weight by the
  // same relative error, so sharp inputs (large scores) widen the absolute error of out.
  const double score_error = 4 * 0x1p-24 * want.max_abs_score * max_abs(to_doubles(kv_host));
  CHECK(test::all_close("out (fp32)", out_fp32_got, want.out, 1e-5, 1e-6 + score_error));
  CHECK(test::all_close("out (T)", out_got, want.out, test::Tolerance<T>::rel, test::Tolerance<T>::abs + score_error));
  CHECK(test::all_close("lse", lse_got, want.lse, 1e-5, 1e-5));
  CHECK(test::same_bits(lse_again.download(), lse_got));  // the output type does not change lse
  std::vector<double> dq_want = want.dq, dkv_want = want.dkv;
  for (size_t i = 0; i < out_n; ++i) dq_want[i] += dq_start[i];
  for (size_t i = 0; i < dkv_n; ++i) dkv_want[i] += dkv_start[i];
  // As test_attention.cu: entries near zero come from cancellation in dS = P(dP - D).
  const double grad_rel = is_bf16 ? 1e-2 : 1e-4, grad_abs = is_bf16 ? 5e-3 : 1e-5;
  CHECK(test::all_close("dq", dq_got, dq_want, grad_rel, grad_abs * max_abs(want.dq)));
  CHECK(test::all_close("dkv", dkv_got, dkv_want, grad_rel, grad_abs * max_abs(want.dkv)));

  out_fp32.poison();
  lse.poison();
  scratch.poison();
  dq.upload(dq_start);
  dkv.upload(dkv_start);
  ring_attention_forward<T, float>(out_fp32, lse, qkv, kv, s.B, s.Tq, s.Tk, C, s.NH, s.NKV, mask, nullptr);
  ring_attention_backward<T>(dq, dkv, scratch, dout, qkv, out, lse, kv, s.B, s.Tq, s.Tk, C, s.NH, s.NKV, mask,
                             nullptr);
  test::require_no_cuda_error();
  CHECK(test::same_bits(out_fp32.download(), out_fp32_got));
  CHECK(test::same_bits(lse.download(), lse_got));
  CHECK(test::same_bits(dq.download(), dq_got));
  CHECK(test::same_bits(dkv.download(), dkv_got));
}

// Flash's blockwise forward and backward (bf16) on one block pair against reference_block: out
// (fp32), lse, and the gradients (handed out rounded to bf16) added into random accumulators; a
// second run gives the same bits.
void check_flash_block(const BlockShape& s, AttentionBlockMask mask, uint64_t& seed) {
  const int C = s.NH * s.HS, W = (s.NH + 2 * s.NKV) * s.HS, KW = 2 * s.NKV * s.HS;
  INFO("flash B=" << s.B << " Tq=" << s.Tq << " Tk=" << s.Tk << " NH=" << s.NH << " NKV=" << s.NKV << " HS=" << s.HS
                  << " mask=" << (mask == AttentionBlockMask::full ? "full" : "causal_diagonal"));
  const size_t out_n = static_cast<size_t>(s.B) * s.Tq * C, lse_n = static_cast<size_t>(s.B) * s.NH * s.Tq;
  std::vector<float> qkv_host = test::round_to<bf16>(test::random_floats(static_cast<size_t>(s.B) * s.Tq * W, seed++, s.input_std));
  const size_t dkv_n = static_cast<size_t>(s.B) * s.Tk * KW;
  std::vector<float> kv_host = test::round_to<bf16>(test::random_floats(dkv_n, seed++, s.input_std));
  std::vector<float> dout_host = test::round_to<bf16>(test::random_floats(out_n, seed++));
  std::vector<float> dq_start = test::random_floats(out_n, seed++), dkv_start = test::random_floats(dkv_n, seed++);
  test::DeviceBuffer<bf16> qkv(test::from_floats<bf16>(qkv_host)), kv(test::from_floats<bf16>(kv_host)), out(out_n);
  test::DeviceBuffer<bf16> dout(test::from_floats<bf16>(dout_host));
  test::DeviceBuffer<float> out_fp32(out_n), lse(lse_n), dq(dq_start), dkv(dkv_start);
  test::DeviceBuffer<float> scratch(ring_attention_backward_scratch_bytes(s.B, s.Tq, s.NH) / sizeof(float));
  ring_flash_attention_forward(out_fp32, lse, qkv, kv, s.B, s.Tq, s.Tk, C, s.NH, s.NKV, mask, nullptr);
  ring_attention_round<bf16>(out, out_fp32, out_n, nullptr);  // the bf16 out the backward is handed
  ring_flash_attention_backward(dq, dkv, scratch, dout, qkv, out, lse, kv, s.B, s.Tq, s.Tk, C, s.NH, s.NKV, mask,
                                nullptr);
  test::require_no_cuda_error();
  std::vector<float> out_fp32_got = out_fp32.download(), lse_got = lse.download();
  std::vector<float> dq_got = dq.download(), dkv_got = dkv.download();
  std::vector<double> out_seen = to_doubles(test::to_floats(out.download()));
  BlockReference want = reference_block(to_doubles(qkv_host), to_doubles(kv_host), to_doubles(dout_host), s, mask,
                                        &out_seen);
  // P is rounded to bf16 before P·V: up to 2^-7 of Σ|P v| <= max|v| (docs/ATTENTION.md "Numerics").
  const double v_max = max_abs(to_doubles(kv_host));
  const double score_error = 4 * 0x1p-24 * want.max_abs_score * v_max;
  CHECK(test::all_close("flash out", out_fp32_got, want.out, 0x1p-8, 0x1p-7 * v_max + score_error));
  CHECK(test::all_close("flash lse", lse_got, want.lse, 2e-5, 2e-5));
  std::vector<double> dq_want = want.dq, dkv_want = want.dkv;
  for (size_t i = 0; i < out_n; ++i) dq_want[i] += dq_start[i];
  for (size_t i = 0; i < dkv_n; ++i) dkv_want[i] += dkv_start[i];
  CHECK(test::all_close("flash dq", dq_got, dq_want, 2e-2, 1e-2 * max_abs(want.dq)));
  CHECK(test::all_close("flash dkv", dkv_got, dkv_want, 2e-2, 1e-2 * max_abs(want.dkv)));

  out_fp32.poison();
  lse.poison();
  scratch.poison();
  dq.upload(dq_start);
  dkv.upload(dkv_start);
  ring_flash_attention_forward(out_fp32, lse, qkv, kv, s.B, s.Tq, s.Tk, C, s.NH, s.NKV, mask, nullptr);
  ring_flash_attention_backward(dq, dkv, scratch, dout, qkv, out, lse, kv, s.B, s.Tq, s.Tk, C, s.NH, s.NKV, mask,
                                nullptr);
  CHECK(test::same_bits(out_fp32.download(), out_fp32_got));
  CHECK(test::same_bits(lse.download(), lse_got));
  CHECK(test::same_bits(dq.download(), dq_got));
  CHECK(test::same_bits(dkv.download(), dkv_got));
}

struct ZigzagShape {
  int B, chunk, NH, NKV, HS;  // chunk: rows per chunk; the sequence has 2N of them
};

struct ZigzagResult {
  std::vector<float> out, lse, dqkv;  // assembled over the chunks, in the unsplit tensors' layouts
};

// (a) Zigzag ring over N ranks: rank r holds query chunks r and 2N-1-r; at ring step i it holds
// the K/V chunks of rank (r - i) mod N. Every (query chunk, K/V chunk) pair the mask leaves runs
// forward into a fp32 block output merged into the chunk's running result, in ring order; the
// outputs are rounded to T once; then the backward of the same pairs in the same order, dq and
// dk/dv added into fp32 per chunk (the owner's fixed-order sum).
template <typename T>
ZigzagResult run_zigzag(const std::vector<float>& qkv_host, const std::vector<float>& dout_host, const ZigzagShape& s,
                        int N, Kernels kernels) {
  const int chunks = 2 * N, T_ = chunks * s.chunk, c = s.chunk;
  const int C = s.NH * s.HS, kv_C = s.NKV * s.HS, W = C + 2 * kv_C;
  std::vector<test::DeviceBuffer<T>> qkv, kv, dout, out;
  std::vector<test::DeviceBuffer<float>> run_out, run_lse, dq, dkv;
  for (int j = 0; j < chunks; ++j) {
    qkv.emplace_back(test::from_floats<T>(rows(qkv_host, s.B, T_, W, j * c, c)));
    kv.emplace_back(test::from_floats<T>(rows(qkv_host, s.B, T_, W, j * c, c, C, 2 * kv_C)));
    dout.emplace_back(test::from_floats<T>(rows(dout_host, s.B, T_, C, j * c, c)));
    out.emplace_back(static_cast<size_t>(s.B) * c * C);
    run_out.emplace_back(static_cast<size_t>(s.B) * c * C);
    run_lse.emplace_back(static_cast<size_t>(s.B) * s.NH * c);
    dq.emplace_back(std::vector<float>(static_cast<size_t>(s.B) * c * C, 0.0f));
    dkv.emplace_back(std::vector<float>(static_cast<size_t>(s.B) * c * 2 * kv_C, 0.0f));
    ring_attention_merge_reset(run_out[j], run_lse[j], s.B, c, C, s.NH, nullptr);
  }
  test::DeviceBuffer<float> block_out(static_cast<size_t>(s.B) * c * C), block_lse(static_cast<size_t>(s.B) * s.NH * c);
  test::DeviceBuffer<float> scratch(ring_attention_backward_scratch_bytes(s.B, c, s.NH) / sizeof(float));
  // Calls f(query chunk, key chunk, mask) for every pair in ring order.
  auto ring = [&](auto f) {
    for (int r = 0; r < N; ++r)
      for (int step = 0; step < N; ++step) {
        const int src = (r - step + N) % N;
        for (int qc : {r, chunks - 1 - r})
          for (int kc : {src, chunks - 1 - src}) {
            AttentionBlockMask mask;
            if (zigzag_block_mask(qc, kc, &mask)) f(qc, kc, mask);
          }
      }
  };
  ring([&](int qc, int kc, AttentionBlockMask mask) {
    block_out.poison();
    block_lse.poison();
    block_forward<T, float>(kernels, block_out, block_lse, qkv[qc], kv[kc], s.B, c, c, C, s.NH, s.NKV, mask);
    ring_attention_merge<float>(run_out[qc], run_lse[qc], block_out, block_lse, s.B, c, C, s.NH, nullptr);
  });
  for (int j = 0; j < chunks; ++j) ring_attention_round<T>(out[j], run_out[j], static_cast<size_t>(s.B) * c * C, nullptr);
  ring([&](int qc, int kc, AttentionBlockMask mask) {
    scratch.poison();
    block_backward<T>(kernels, dq[qc], dkv[kc], scratch, dout[qc], qkv[qc], out[qc], run_lse[qc], kv[kc], s.B, c, c,
                      C, s.NH, s.NKV, mask);
  });
  test::require_no_cuda_error();

  ZigzagResult r;
  r.out.assign(static_cast<size_t>(s.B) * T_ * C, NAN);
  r.lse.assign(static_cast<size_t>(s.B) * s.NH * T_, NAN);
  r.dqkv.assign(static_cast<size_t>(s.B) * T_ * W, NAN);
  for (int j = 0; j < chunks; ++j) {
    put_rows(r.out, test::to_floats(out[j].download()), s.B, T_, C, j * c, c, 0, C);
    put_lse(r.lse, run_lse[j].download(), s.B, s.NH, T_, j * c, c);
    put_rows(r.dqkv, dq[j].download(), s.B, T_, W, j * c, c, 0, C);
    put_rows(r.dqkv, dkv[j].download(), s.B, T_, W, j * c, c, C, 2 * kv_C);
  }
  return r;
}

// The zigzag ring against the unsplit causal kernel (attention.cuh) on the same inputs, and a
// second ring giving the same bits.
template <typename T>
void check_zigzag(const ZigzagShape& s, int N, uint64_t& seed, Kernels kernels = Kernels::simple) {
  const bool is_bf16 = sizeof(T) == 2, flash = kernels == Kernels::flash;
  const int T_ = 2 * N * s.chunk, C = s.NH * s.HS, W = C + 2 * s.NKV * s.HS;
  INFO((flash ? "flash " : "simple ") << "N=" << N << " B=" << s.B << " T=" << T_ << " (chunks of " << s.chunk << ") NH=" << s.NH << " NKV=" << s.NKV
            << " HS=" << s.HS);
  std::vector<float> qkv_host = test::round_to<T>(test::random_floats(static_cast<size_t>(s.B) * T_ * W, seed++));
  std::vector<float> dout_host = test::round_to<T>(test::random_floats(static_cast<size_t>(s.B) * T_ * C, seed++));

  test::DeviceBuffer<T> qkv(test::from_floats<T>(qkv_host)), dout(test::from_floats<T>(dout_host));
  test::DeviceBuffer<T> out(static_cast<size_t>(s.B) * T_ * C), dqkv(qkv_host.size());
  test::DeviceBuffer<float> lse(static_cast<size_t>(s.B) * s.NH * T_);
  test::DeviceBuffer<float> scratch(attention_backward_scratch_bytes(s.B, T_, s.NH) / sizeof(float));
  attention_forward<T>(out, lse, qkv, s.B, T_, C, s.NH, s.NKV, nullptr);
  attention_backward<T>(dqkv, scratch, dout, qkv, out, lse, s.B, T_, C, s.NH, s.NKV, nullptr);
  test::require_no_cuda_error();
  std::vector<float> out_want = test::to_floats(out.download()), lse_want = lse.download();
  std::vector<float> dqkv_want = test::to_floats(dqkv.download());

  ZigzagResult got = run_zigzag<T>(qkv_host, dout_host, s, N, kernels);
  // fp32: both are fp32 sums of the same terms in other orders. bf16: each is rounded once from
  // fp32, so they may differ by one bf16 step. Flash also rounds P to bf16 (2^-8 relative per
  // term, docs/ATTENTION.md "Numerics"): up to 2^-7 of the terms' magnitude, at most max|v|.
  const double v_max = max_abs(to_doubles(qkv_host));
  CHECK(test::all_close("out", got.out, out_want, is_bf16 ? 1e-2 : 1e-5,
                        flash ? 0x1p-7 * v_max : is_bf16 ? 1e-3 : 1e-6));
  CHECK(test::all_close("lse", got.lse, lse_want, flash ? 2e-5 : 1e-5, flash ? 2e-5 : 1e-5));
  // Gradients: the unsplit bf16 dqkv is rounded to bf16 and its D came from its own rounded out.
  std::vector<double> dqkv_want_d(dqkv_want.begin(), dqkv_want.end());
  // Flash also rounds P and dS to bf16 before their products.
  const double grad_rel = flash ? 2e-2 : is_bf16 ? 1e-2 : 1e-4;
  const double grad_abs = (flash ? 1e-2 : is_bf16 ? 5e-3 : 1e-5) * max_abs(dqkv_want_d);
  CHECK(test::all_close("dqkv", got.dqkv, dqkv_want, grad_rel, grad_abs));

  ZigzagResult again = run_zigzag<T>(qkv_host, dout_host, s, N, kernels);
  CHECK(test::same_bits(again.out, got.out));
  CHECK(test::same_bits(again.lse, got.lse));
  CHECK(test::same_bits(again.dqkv, got.dqkv));
}

}  // namespace

TEMPLATE_TEST_CASE("blockwise attention matches double loops for each mask kind", "[ring_attention]", float, bf16) {
  using T = TestType;
  const BlockShape shapes[] = {
      {1, 1, 1, 1, 1, 8},    {2, 1, 1, 4, 2, 16},  {2, 7, 7, 4, 2, 16},   {1, 7, 7, 4, 1, 64},
      {2, 33, 33, 3, 3, 8},  {1, 17, 17, 2, 2, 128}, {2, 9, 9, 4, 2, 16, 5.0f},
  };
  uint64_t seed = 100;
  for (const BlockShape& s : shapes) {
    check_block<T>(s, AttentionBlockMask::causal_diagonal, seed);
    check_block<T>(s, AttentionBlockMask::full, seed);
  }
  // Full blocks of different lengths (a key block wholly before the query block).
  const BlockShape full_only[] = {
      {1, 1, 5, 4, 2, 16}, {2, 5, 1, 4, 1, 16}, {2, 5, 33, 3, 3, 24}, {1, 33, 7, 4, 2, 64},
  };
  for (const BlockShape& s : full_only) check_block<T>(s, AttentionBlockMask::full, seed);
}

TEMPLATE_TEST_CASE("zigzag ring attention equals the unsplit causal kernel", "[ring_attention]", float, bf16) {
  using T = TestType;
  // Chunks of 1 row (T = 2N), odd chunk lengths; GQA NH 4 on NKV 2 and 1, MHA.
  const ZigzagShape shapes[] = {
      {1, 1, 4, 2, 16}, {2, 3, 4, 1, 16}, {2, 5, 3, 3, 8}, {1, 11, 4, 2, 64}, {1, 2, 2, 2, 128},
  };
  uint64_t seed = 300;
  for (int N : {2, 3})
    for (const ZigzagShape& s : shapes) check_zigzag<T>(s, N, seed);
}

// Flash: its head sizes, blocks shorter and longer than a streamed tile (64 rows, 32 at HD 128),
// T = 1 blocks, GQA and MHA, sharp inputs.
TEST_CASE("flash blockwise attention matches double loops for each mask kind", "[ring_attention]") {
  const BlockShape shapes[] = {
      {1, 1, 1, 1, 1, 16},  {2, 7, 7, 4, 2, 16}, {1, 70, 70, 2, 1, 16}, {2, 33, 33, 4, 2, 32},
      {1, 37, 37, 3, 3, 64}, {1, 33, 33, 2, 2, 128}, {2, 9, 9, 4, 2, 64, 4.0f},
  };
  uint64_t seed = 900;
  for (const BlockShape& s : shapes) {
    check_flash_block(s, AttentionBlockMask::causal_diagonal, seed);
    check_flash_block(s, AttentionBlockMask::full, seed);
  }
  const BlockShape full_only[] = {
      {1, 1, 70, 4, 2, 16}, {2, 70, 1, 4, 1, 16}, {1, 5, 33, 2, 2, 128}, {1, 130, 7, 2, 2, 32},
  };
  for (const BlockShape& s : full_only) check_flash_block(s, AttentionBlockMask::full, seed);
}

TEST_CASE("zigzag ring attention on flash equals the unsplit causal kernel", "[ring_attention]") {
  const ZigzagShape shapes[] = {
      {1, 1, 4, 2, 16}, {2, 5, 4, 1, 32}, {1, 37, 2, 2, 64}, {1, 33, 2, 1, 128}, {1, 70, 2, 2, 16},
  };
  uint64_t seed = 1100;
  for (int N : {2, 3})
    for (const ZigzagShape& s : shapes) check_zigzag<bf16>(s, N, seed, Kernels::flash);
}

// Every preset's heads (all NH on its NKV K/V heads, its head size), N = 2 ranks, chunks of 1 and 2
// rows; flash's forward at the head sizes it takes.
TEMPLATE_TEST_CASE("zigzag ring attention at every preset's heads", "[ring_attention]", float, bf16) {
  uint64_t seed = 700;
  for (const test::PresetShape& p : test::preset_shapes()) {
    INFO("presets " << p.presets);
    check_zigzag<TestType>({1, 1, p.NH, p.NKV, p.head_size}, 2, seed);
    check_zigzag<TestType>({1, 2, p.NH, p.NKV, p.head_size}, 2, seed);
    if (std::is_same<TestType, bf16>::value && flash_attention_supports(p.head_size)) {
      // Flash launches a 64- or 128-row block per head whatever T is: one block pair (full: its
      // masking differs only in the tail of the keys, covered at these head sizes above).
      check_flash_block({1, 2, 2, p.NH, p.NKV, p.head_size}, AttentionBlockMask::causal_diagonal, seed);
    }
  }
}

// (c) The merge against its formula in double; lse values far apart (e^lse overflows fp32) and
// rows that saw no key: a running lse of -inf with a poisoned (NaN) out takes the block's result,
// a block lse of -inf leaves the running result, both give lse -inf and out 0.
TEMPLATE_TEST_CASE("merge of block results: formula; rows without keys; one block; fixed order", "[ring_attention]",
                   float, bf16) {
  using T = TestType;
  const int B = 2, Tr = 5, NH = 3, HS = 24, C = NH * HS;
  const size_t out_n = static_cast<size_t>(B) * Tr * C, lse_n = static_cast<size_t>(B) * NH * Tr;
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> out_a = test::random_floats(out_n, 1), out_b = test::round_to<T>(test::random_floats(out_n, 2));
  std::vector<float> lse_a = test::random_floats(lse_n, 3, 60.0f), lse_b = test::random_floats(lse_n, 4, 60.0f);
  // Row r: r % 4 == 1 no key yet, == 2 no key in the block, == 3 neither.
  for (size_t r = 0; r < lse_n; ++r) {
    if (r % 4 == 1 || r % 4 == 3) lse_a[r] = -inf;
    if (r % 4 == 2 || r % 4 == 3) lse_b[r] = -inf;
  }
  std::vector<double> out_want(out_n), lse_want(lse_n);
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < Tr; ++t)
      for (int h = 0; h < NH; ++h) {
        const size_t r = (static_cast<size_t>(b) * NH + h) * Tr + t;
        const double a = lse_a[r], a_b = lse_b[r];
        const double merged = std::log(std::exp(a) + std::exp(a_b));  // fine in double for |lse| < 700
        lse_want[r] = merged;
        for (int i = 0; i < HS; ++i) {
          const size_t at = (static_cast<size_t>(b) * Tr + t) * C + h * HS + i;
          const double mine = a == -inf ? 0.0 : std::exp(a - merged) * out_a[at];
          const double theirs = a_b == -inf ? 0.0 : std::exp(a_b - merged) * out_b[at];
          out_want[at] = mine + theirs;
        }
      }
  std::vector<float> poisoned_out_a = out_a;
  for (size_t r = 0; r < lse_n; ++r) {
    if (lse_a[r] != -inf) continue;
    const int b = static_cast<int>(r / (NH * Tr)), h = static_cast<int>(r / Tr % NH), t = static_cast<int>(r % Tr);
    for (int i = 0; i < HS; ++i) poisoned_out_a[(static_cast<size_t>(b) * Tr + t) * C + h * HS + i] = NAN;
  }

  test::DeviceBuffer<float> out(poisoned_out_a), lse(lse_a), lse_blk(lse_b);
  test::DeviceBuffer<T> out_blk(test::from_floats<T>(out_b));
  ring_attention_merge<T>(out, lse, out_blk, lse_blk, B, Tr, C, NH, nullptr);
  test::require_no_cuda_error();
  std::vector<float> out_got = out.download(), lse_got = lse.download();
  CHECK(test::all_close("merged out", out_got, out_want, 1e-5, 1e-6));
  CHECK(test::all_close("merged lse", lse_got, lse_want, 1e-6, 1e-5));  // both -inf: -inf exactly

  // One block alone after a reset: its result exactly (weight e^0 = 1), whatever out held.
  test::DeviceBuffer<float> run_out(out_n), run_lse(lse_n);
  std::vector<float> lse_finite = test::random_floats(lse_n, 5, 60.0f);
  test::DeviceBuffer<float> lse_one(lse_finite);
  ring_attention_merge_reset(run_out, run_lse, B, Tr, C, NH, nullptr);
  ring_attention_merge<T>(run_out, run_lse, out_blk, lse_one, B, Tr, C, NH, nullptr);
  CHECK(test::same_bits(run_out.download(), test::round_to<T>(out_b)));
  CHECK(test::same_bits(run_lse.download(), lse_finite));

  // Three blocks in a fixed order, twice (re-poisoned): the same bits.
  std::vector<std::vector<float>> bits;
  for (int run = 0; run < 2; ++run) {
    run_out.poison();
    run_lse.poison();
    ring_attention_merge_reset(run_out, run_lse, B, Tr, C, NH, nullptr);
    for (uint64_t blk = 0; blk < 3; ++blk) {
      test::DeviceBuffer<T> o(test::from_floats<T>(test::random_floats(out_n, 10 + blk)));
      test::DeviceBuffer<float> l(test::random_floats(lse_n, 20 + blk, 3.0f));
      ring_attention_merge<T>(run_out, run_lse, o, l, B, Tr, C, NH, nullptr);
    }
    bits.push_back(run_out.download());
    std::vector<float> l = run_lse.download();
    bits.back().insert(bits.back().end(), l.begin(), l.end());
  }
  CHECK(test::same_bits(bits[0], bits[1]));
}

// (d) Zigzag balance: each rank's (query tile, key tile) pairs with a visible entry, counted here
// position by position, equal zigzag_tiles and are the same on every rank; a contiguous layout
// (rank r holds chunks 2r and 2r+1) is not balanced, so the count can tell them apart.
TEST_CASE("zigzag layout gives every rank the same causal tile count", "[ring_attention]") {
  // The rank's rows in its two chunks (ordered), and brute-force tile pairs over position lists.
  auto count_tiles = [](int T, int N, int tile, const std::vector<int>& chunks_held) {
    const int chunk = T / (2 * N);
    int64_t count = 0;
    for (int qc : chunks_held)
      for (int q0 = 0; q0 < chunk; q0 += tile)
        for (int kc = 0; kc < 2 * N; ++kc)
          for (int k0 = 0; k0 < chunk; k0 += tile) {
            bool visible = false;
            for (int q = q0; q < std::min(q0 + tile, chunk); ++q)
              for (int k = k0; k < std::min(k0 + tile, chunk); ++k) visible |= kc * chunk + k <= qc * chunk + q;
            count += visible;
          }
    return count;
  };
  for (int N : {1, 2, 3, 4, 8})
    for (int T : {2 * N, 2 * N * 7, 2 * N * 64, 2 * N * 100})
      for (int tile : {1, 16, 64}) {
        INFO("N=" << N << " T=" << T << " tile=" << tile);
        const int64_t rank0 = zigzag_tiles(T, N, 0, tile);
        for (int r = 0; r < N; ++r) {
          CHECK(zigzag_tiles(T, N, r, tile) == count_tiles(T, N, tile, {r, 2 * N - 1 - r}));
          CHECK(zigzag_tiles(T, N, r, tile) == rank0);
        }
        if (N > 1 && T / (2 * N) >= tile)
          CHECK(count_tiles(T, N, tile, {0, 1}) < count_tiles(T, N, tile, {2 * N - 2, 2 * N - 1}));
      }
}

// Bad calls: one line naming the call, nothing launched.
TEST_CASE("blockwise attention refuses shapes it cannot run", "[ring_attention]") {
  test::DeviceBuffer<bf16> qkv(4 * 3 * 64), kv(4 * 2 * 64);
  test::DeviceBuffer<float> out(4 * 64), lse(4), dq(4 * 64), dkv(4 * 2 * 64), scratch(4);
  // causal_diagonal needs the same positions on both sides.
  CHECK_THROWS_WITH((ring_attention_forward<bf16, float>(out, lse, qkv, kv, 1, 4, 3, 64, 1, 1,
                                                         AttentionBlockMask::causal_diagonal, nullptr)),
                    Catch::Contains("ring_attention_forward") && Catch::Contains("Tq=4 Tk=3"));
  CHECK_THROWS_WITH(ring_attention_backward<bf16>(dq, dkv, scratch, qkv, qkv, qkv, lse, kv, 1, 4, 0, 64, 1, 1,
                                                  AttentionBlockMask::full, nullptr),
                    Catch::Contains("Tk=0"));
  // Flash's head sizes: 16, 32, 64, 128 (48 is the simple kernel's only).
  CHECK_THROWS_WITH(ring_flash_attention_forward(out, lse, qkv, kv, 1, 2, 2, 48, 1, 1, AttentionBlockMask::full, nullptr),
                    Catch::Contains("ring_flash_attention_forward") && Catch::Contains("48"));
  CHECK_THROWS_WITH(zigzag_tiles(10, 2, 0, 16), Catch::Contains("zigzag_tiles") && Catch::Contains("T=10"));
  CHECK_THROWS_WITH(zigzag_tiles(8, 2, 2, 16), Catch::Contains("rank=2"));
  test::require_no_cuda_error();
}

// (e) The ring's buffer copies, exact: K/V heads out of qkv, dqkv from fp32 dq and dkv (rounded
// once), fp32 adds; odd row counts and widths, one row, GQA and MHA widths; outputs poisoned.
TEMPLATE_TEST_CASE("ring buffers: K/V packed from qkv, dqkv assembled, accumulators added", "[ring_attention]", float,
                   bf16) {
  using T = TestType;
  struct Shape {
    int rows, C, kv_width;
  };
  uint64_t seed = 1300;
  for (const Shape& s : {Shape{1, 8, 8}, Shape{7, 64, 32}, Shape{37, 24, 48}, Shape{5, 12, 4}}) {
    INFO("rows " << s.rows << " C " << s.C << " kv width " << s.kv_width);
    const int W = s.C + s.kv_width;
    const std::vector<float> qkv_host = test::round_to<T>(test::random_floats(static_cast<size_t>(s.rows) * W, seed++));
    test::DeviceBuffer<T> qkv(test::from_floats<T>(qkv_host)), kv(static_cast<size_t>(s.rows) * s.kv_width);
    ring_attention_pack_kv<T>(kv, qkv, s.rows, s.C, s.kv_width, nullptr);
    CHECK(test::same_bits(test::to_floats(kv.download()), rows(qkv_host, 1, s.rows, W, 0, s.rows, s.C, s.kv_width)));

    const std::vector<float> dq_host = test::random_floats(static_cast<size_t>(s.rows) * s.C, seed++);
    const std::vector<float> dkv_host = test::random_floats(static_cast<size_t>(s.rows) * s.kv_width, seed++);
    test::DeviceBuffer<float> dq(dq_host), dkv(dkv_host);
    test::DeviceBuffer<T> dqkv(static_cast<size_t>(s.rows) * W);
    ring_attention_assemble_dqkv<T>(dqkv, dq, dkv, s.rows, s.C, s.kv_width, nullptr);
    std::vector<float> want(static_cast<size_t>(s.rows) * W, NAN);
    put_rows(want, dq_host, 1, s.rows, W, 0, s.rows, 0, s.C);
    put_rows(want, dkv_host, 1, s.rows, W, 0, s.rows, s.C, s.kv_width);
    CHECK(test::same_bits(test::to_floats(dqkv.download()), test::round_to<T>(want)));

    test::DeviceBuffer<float> acc(dkv_host);
    ring_attention_add(acc, dq, std::min(dq_host.size(), dkv_host.size()), nullptr);
    std::vector<float> sum = dkv_host;
    for (size_t i = 0; i < std::min(dq_host.size(), dkv_host.size()); ++i) sum[i] += dq_host[i];
    CHECK(test::same_bits(acc.download(), sum));
  }
  test::require_no_cuda_error();
}

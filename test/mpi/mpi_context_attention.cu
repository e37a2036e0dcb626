// Context-parallel attention under mpirun (test/checks/distributed_nccl.sh, 2 and 4 ranks):
// src/model/context_attention.h's ring over a CP group (the whole launch; at 4 ranks also two
// groups of 2 with strided ranks {0,2} {1,3}). Every rank makes the same random (B, T) qkv and
// dout, takes its zigzag rows chunk-major, runs forward and backward through ContextAttention, and
// compares its own rows of out, lse and dqkv to the unsplit model_attention_forward/backward of
// the whole sequence (run on every rank) and to causal attention written out in double here.
// fp32 simple, bf16 simple and flash (HD 16 to 128); GQA (NH 4 on NKV 2 and 1) and MHA; chunks of
// 1 row (T = 2N) and odd lengths; a second run gives the same bits; the transfers went on the CP
// communicator (none on the launch's) with forward_send_bytes / backward_send_bytes each way; bad
// shapes are refused in one line.
#include "test/test_util.h"
#include "src/dist/comm.h"
#include "src/model/context_attention.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

namespace {

// A ring that deadlocks ends the run through the watchdog within a minute.
Communicator& world() {
  static Communicator instance{CommOptions{"", 60.0}};
  return instance;
}

struct Shape {
  int B, c, NH, NKV, HS;  // c: rows per chunk; the sequence has 2N chunks
};

struct Attention {
  std::vector<double> out, lse, dqkv;
};

// Causal attention of whole (B, T) sequences in double, from qkv (B, T, (NH + 2·NKV)·HS) (query
// heads, key heads, value heads; query head h reads K/V head h / (NH / NKV)), and the gradients of
// L = sum(out ∘ dout) into dqkv (qkv's layout).
Attention causal_attention(const std::vector<float>& qkv, const std::vector<float>& dout, const Shape& s, int T) {
  const int HS = s.HS, C = s.NH * HS, W = C + 2 * s.NKV * HS, group = s.NH / s.NKV;
  const double scale = 1.0 / std::sqrt(static_cast<double>(HS));
  auto q = [&](int b, int t, int h) { return (static_cast<size_t>(b) * T + t) * W + h * HS; };
  auto k = [&](int b, int t, int h) { return (static_cast<size_t>(b) * T + t) * W + C + h / group * HS; };
  auto v = [&](int b, int t, int h) { return k(b, t, h) + s.NKV * HS; };
  auto o = [&](int b, int t, int h) { return (static_cast<size_t>(b) * T + t) * C + h * HS; };
  Attention a;
  a.out.assign(static_cast<size_t>(s.B) * T * C, 0.0);
  a.lse.assign(static_cast<size_t>(s.B) * s.NH * T, 0.0);
  a.dqkv.assign(qkv.size(), 0.0);
  for (int b = 0; b < s.B; ++b)
    for (int h = 0; h < s.NH; ++h)
      for (int t = 0; t < T; ++t) {
        std::vector<double> p(t + 1);
        double top = -INFINITY;
        for (int u = 0; u <= t; ++u) {
          double dot = 0.0;
          for (int i = 0; i < HS; ++i) dot += static_cast<double>(qkv[q(b, t, h) + i]) * qkv[k(b, u, h) + i];
          p[u] = dot * scale;
          top = std::max(top, p[u]);
        }
        double sum = 0.0;
        for (double& x : p) sum += (x = std::exp(x - top));
        for (double& x : p) x /= sum;
        a.lse[(static_cast<size_t>(b) * s.NH + h) * T + t] = top + std::log(sum);
        for (int i = 0; i < HS; ++i)
          for (int u = 0; u <= t; ++u) a.out[o(b, t, h) + i] += p[u] * qkv[v(b, u, h) + i];
        double delta = 0.0;  // sum_i dout·out
        for (int i = 0; i < HS; ++i) delta += dout[o(b, t, h) + i] * a.out[o(b, t, h) + i];
        for (int u = 0; u <= t; ++u) {
          double dp = 0.0;
          for (int i = 0; i < HS; ++i) dp += static_cast<double>(dout[o(b, t, h) + i]) * qkv[v(b, u, h) + i];
          const double ds = p[u] * (dp - delta) * scale;
          for (int i = 0; i < HS; ++i) {
            a.dqkv[q(b, t, h) + i] += ds * qkv[k(b, u, h) + i];
            a.dqkv[k(b, u, h) + i] += ds * qkv[q(b, t, h) + i];
            a.dqkv[v(b, u, h) + i] += p[u] * dout[o(b, t, h) + i];
          }
        }
      }
  return a;
}

// CP rank r's rows of a (B, T, width) tensor, chunk-major: chunk r of every sequence, then chunk
// 2N-1-r ((2·B·c, width)).
template <typename V>
V local_rows(const V& x, int B, int T, int width, int N, int r) {
  const int c = T / (2 * N);
  V local;
  for (const int chunk : {r, 2 * N - 1 - r})
    for (int b = 0; b < B; ++b) {
      const auto first = x.begin() + (static_cast<size_t>(b) * T + chunk * c) * width;
      local.insert(local.end(), first, first + static_cast<size_t>(c) * width);
    }
  return local;
}
// lse (B, NH, T) likewise: [chunk r (B, NH, c)][chunk 2N-1-r (B, NH, c)].
template <typename V>
V local_lse(const V& x, int B, int NH, int T, int N, int r) {
  const int c = T / (2 * N);
  V local;
  for (const int chunk : {r, 2 * N - 1 - r})
    for (int bh = 0; bh < B * NH; ++bh) {
      const auto first = x.begin() + static_cast<size_t>(bh) * T + chunk * c;
      local.insert(local.end(), first, first + c);
    }
  return local;
}

double max_abs(const std::vector<double>& v) {
  double m = 0.0;
  for (double x : v) m = std::max(m, std::fabs(x));
  return m;
}

struct Result {
  std::vector<float> out, lse, dqkv;
};

// One forward and backward through the ring on this rank's rows; the CP communicator's transfers
// of each are checked against the class's byte counts.
template <typename T>
Result run_ring(ContextAttention<T>& ring, Communicator& cp, const std::vector<float>& qkv_local,
                const std::vector<float>& dout_local, const Shape& s, cudaStream_t stream) {
  const int N = cp.world_size(), C = s.NH * s.HS;
  const size_t rows = 2 * static_cast<size_t>(s.B) * s.c;
  test::DeviceBuffer<T> qkv(test::from_floats<T>(qkv_local)), dout(test::from_floats<T>(dout_local));
  test::DeviceBuffer<T> out(rows * C), dqkv(qkv_local.size());
  test::DeviceBuffer<float> lse(rows * s.NH);
  const long long world_sends = world().counts().send;
  const long long kv_bytes = static_cast<long long>(
      ContextAttention<T>::forward_send_bytes(N, s.B, s.c, C, s.NH, s.NKV, sizeof(T)));
  const long long both_bytes = static_cast<long long>(
      ContextAttention<T>::backward_send_bytes(N, s.B, s.c, C, s.NH, s.NKV, sizeof(T)));
  cp.counts() = {};
  ring.forward(out, lse, qkv);
  CHECK(cp.counts().send == N - 1);
  CHECK(cp.counts().send_bytes == kv_bytes);
  CHECK(cp.counts().recv_bytes == kv_bytes);
  cp.counts() = {};
  ring.backward(dqkv, dout, qkv, out, lse);
  CHECK(cp.counts().send == (N > 1 ? 2 * N - 1 : 0));
  CHECK(cp.counts().send_bytes == both_bytes);
  CHECK(cp.counts().recv_bytes == both_bytes);
  CHECK(cp.counts().all_reduce + cp.counts().all_gather + cp.counts().reduce_scatter + cp.counts().broadcast == 0);
  CHECK(world().counts().send == world_sends);
  CUDA_CHECK(cudaStreamSynchronize(stream));
  test::require_no_cuda_error();
  return {test::to_floats(out.download()), lse.download(), test::to_floats(dqkv.download())};
}

// The ring on CP group `cp` against the unsplit attention and the double loops, and run twice.
template <typename T>
void check_ring(Communicator& cp, AttentionKernel kernel, const Shape& s, uint64_t seed) {
  const bool is_bf16 = sizeof(T) == 2, flash = kernel == AttentionKernel::flash;
  const int N = cp.world_size(), r = cp.rank(), T_ = 2 * N * s.c, C = s.NH * s.HS, W = C + 2 * s.NKV * s.HS;
  INFO(attention_name(kernel) << (is_bf16 ? " bf16" : " fp32") << " N=" << N << " rank " << r << " B=" << s.B
                              << " T=" << T_ << " (chunks of " << s.c << ") NH=" << s.NH << " NKV=" << s.NKV
                              << " HS=" << s.HS);
  // The same inputs on every rank (the same seed).
  const std::vector<float> qkv_all = test::round_to<T>(test::random_floats(static_cast<size_t>(s.B) * T_ * W, seed));
  const std::vector<float> dout_all =
      test::round_to<T>(test::random_floats(static_cast<size_t>(s.B) * T_ * C, seed + 1));

  // The unsplit kernel on the whole sequence.
  CudaStream stream("the test's stream");
  test::DeviceBuffer<T> qkv(test::from_floats<T>(qkv_all)), dout(test::from_floats<T>(dout_all));
  test::DeviceBuffer<T> out(static_cast<size_t>(s.B) * T_ * C), dqkv(qkv_all.size());
  test::DeviceBuffer<float> lse(static_cast<size_t>(s.B) * s.NH * T_);
  test::DeviceBuffer<float> scratch(attention_backward_scratch_bytes(s.B, T_, s.NH) / sizeof(float));
  model_attention_forward<T>(kernel, out, lse, qkv, s.B, T_, C, s.NH, s.NKV, stream.get());
  model_attention_backward<T>(kernel, dqkv, scratch, dout, qkv, out, lse, s.B, T_, C, s.NH, s.NKV, stream.get());
  const std::vector<float> out_unsplit = local_rows(test::to_floats(out.download()), s.B, T_, C, N, r);
  const std::vector<float> lse_unsplit = local_lse(lse.download(), s.B, s.NH, T_, N, r);
  const std::vector<float> dqkv_unsplit = local_rows(test::to_floats(dqkv.download()), s.B, T_, W, N, r);
  const Attention exact = causal_attention(qkv_all, dout_all, s, T_);
  const std::vector<double> out_exact = local_rows(exact.out, s.B, T_, C, N, r);
  const std::vector<double> lse_exact = local_lse(exact.lse, s.B, s.NH, T_, N, r);
  const std::vector<double> dqkv_exact = local_rows(exact.dqkv, s.B, T_, W, N, r);

  ContextAttention<T> ring(cp, kernel, s.B, s.c, C, s.NH, s.NKV, stream.get());
  const std::vector<float> qkv_local = local_rows(qkv_all, s.B, T_, W, N, r);
  const std::vector<float> dout_local = local_rows(dout_all, s.B, T_, C, N, r);
  const Result got = run_ring<T>(ring, cp, qkv_local, dout_local, s, stream.get());

  // Tolerances, against both. fp32: sums of the same terms in other orders (worst measured: out
  // 5.4e-6 relative, lse 7.2e-7, dqkv 2.4e-5 on elements above 1% of the largest, 5.5e-7 of the
  // largest). bf16: test_ring_attention's zigzag ones (one rounding of each output; flash also
  // rounds P and dS to bf16).
  const double v_max = max_abs(std::vector<double>(qkv_all.begin(), qkv_all.end()));
  const double out_rel = is_bf16 ? 1e-2 : 1e-5, out_abs = flash ? 0x1p-7 * v_max : is_bf16 ? 1e-3 : 1e-6;
  const double lse_tol = flash ? 2e-5 : is_bf16 ? 1e-5 : 2e-6;
  const double grad_rel = flash ? 2e-2 : is_bf16 ? 1e-2 : 1e-5;
  const double grad_abs = (flash ? 1e-2 : is_bf16 ? 5e-3 : 2e-6) * max_abs(dqkv_exact);
  CHECK(test::all_close("out vs unsplit", got.out, out_unsplit, out_rel, out_abs));
  CHECK(test::all_close("lse vs unsplit", got.lse, lse_unsplit, lse_tol, lse_tol));
  CHECK(test::all_close("dqkv vs unsplit", got.dqkv, dqkv_unsplit, grad_rel, grad_abs));
  CHECK(test::all_close("out vs double", got.out, out_exact, out_rel, out_abs));
  CHECK(test::all_close("lse vs double", got.lse, lse_exact, lse_tol, lse_tol));
  CHECK(test::all_close("dqkv vs double", got.dqkv, dqkv_exact, grad_rel, grad_abs));

  const Result again = run_ring<T>(ring, cp, qkv_local, dout_local, s, stream.get());
  CHECK(test::same_bits(again.out, got.out));
  CHECK(test::same_bits(again.lse, got.lse));
  CHECK(test::same_bits(again.dqkv, got.dqkv));
}

// The CP groups to run: the whole launch, and at 4 ranks two groups of 2 with strided ranks
// ({0,2} {1,3}: a CP ring whose neighbours are not launch neighbours).
template <typename Body> void for_each_cp_group(Body&& body) {
  {
    Communicator cp(world(), 0, world().rank(), "context-parallel");
    body(cp);
  }
  if (world().world_size() == 4) {
    Communicator cp(world(), world().rank() % 2, world().rank(), "context-parallel");
    body(cp);
  }
  world().barrier();
}

}  // namespace

TEMPLATE_TEST_CASE("ring attention over the CP group equals unsplit causal attention (simple kernels)", "[cp]", float,
                   bf16) {
  // Chunks of 1 row (T = 2N), odd lengths; GQA NH 4 on NKV 2 and 1, MHA.
  const Shape shapes[] = {{2, 1, 4, 2, 16}, {2, 5, 4, 2, 16}, {1, 7, 3, 3, 8}, {2, 3, 4, 1, 32}};
  for_each_cp_group([&](Communicator& cp) {
    uint64_t seed = 100;
    for (const Shape& s : shapes) check_ring<TestType>(cp, AttentionKernel::simple, s, seed += 2);
  });
}

TEST_CASE("ring attention over the CP group equals unsplit causal attention (flash)", "[cp]") {
  const Shape shapes[] = {{2, 5, 4, 2, 16}, {1, 1, 2, 2, 16}, {1, 3, 2, 1, 32}, {1, 2, 2, 2, 64}, {1, 3, 2, 2, 128}};
  for_each_cp_group([&](Communicator& cp) {
    uint64_t seed = 500;
    for (const Shape& s : shapes) check_ring<bf16>(cp, AttentionKernel::flash, s, seed += 2);
  });
}

TEST_CASE("ContextAttention refuses shapes it cannot run, in one line naming them", "[cp]") {
  CudaStream stream("the test's stream");
  CHECK_THROWS_WITH((ContextAttention<float>(world(), AttentionKernel::simple, 2, 0, 64, 4, 2, stream.get())),
                    "ContextAttention: need B, chunk length >= 1, C divisible by NH, NH by NKV; got B=2 c=0 C=64 NH=4 "
                    "NKV=2");
  CHECK_THROWS_WITH((ContextAttention<bf16>(world(), AttentionKernel::flash, 1, 3, 66, 4, 2, stream.get())),
                    Catch::Contains("C=66 NH=4"));
  CHECK_THROWS_WITH((ContextAttention<float>(world(), AttentionKernel::simple, 1, 3, 64, 4, 3, stream.get())),
                    Catch::Contains("NH=4 NKV=3"));
}

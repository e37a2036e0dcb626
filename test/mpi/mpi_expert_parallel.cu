// Expert parallelism under mpirun (test/checks/distributed_nccl.sh, 2 and 4 ranks):
// src/model/expert_parallel.h's layer over an EP group (the whole launch; at 4 ranks also two groups
// of 2 with strided ranks {0,2} {1,3}). Every rank makes the same random weights and every rank's
// rows and output gradients; each rank holds its E/P experts, runs its own rows forward and
// backward through the group, and compares its output, input gradient and router gradient to the
// one-process layer (expert_mlp.h's, every expert local) on its rows, and its experts' weight
// gradients to the sum of the one-process gradients over every rank's rows. Softmax and sigmoid
// routers; random routing, every row's first choice on one expert of the last rank (the others'
// experts get few or no rows), top-k = E; odd row counts and a single row; fp32 and bf16; a
// second run gives the same bits; the rows travel on the EP communicator alone, the bytes each
// pass sends those of docs/MOE.md's table.
#include "test/test_util.h"
#include "src/dist/comm.h"
#include "src/model/expert_parallel.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <type_traits>
#include <vector>

namespace {

Communicator& world() {
  static Communicator instance{CommOptions{"", 60.0}};
  return instance;
}

struct Case {
  const char* name;
  int N, C, H, E, K;
  Router router;
  bool one_expert;  // every row's first choice: expert E - 1
};

ModelConfig config_of(const Case& k) {
  ModelConfig c;
  c.channels = k.C;
  c.hidden_size = k.H;
  c.mlp = Mlp::swiglu;
  c.norm = Norm::rmsnorm;
  c.num_experts = k.E;
  c.experts_per_token = k.K;
  c.router = k.router;
  return c;
}

// The layer's inputs: the whole model's expert weights (the same on every rank) and rank p's rows.
struct Inputs {
  std::vector<float> router, w1, w3, w2, bias, aux_grad;
  std::vector<std::vector<float>> x, dout;  // per rank (N × C)
};

Inputs make_inputs(const Case& k, int ranks) {
  const size_t C = k.C, H = k.H, E = k.E;
  Inputs in;
  in.router = test::random_floats(E * C, 11, 0.5f);
  if (k.one_expert)
    for (size_t i = 0; i < C; ++i) in.router[(E - 1) * C + i] = 4.0f;
  in.w1 = test::random_floats(E * H * C, 12, 0.2f);
  in.w3 = test::random_floats(E * H * C, 13, 0.2f);
  in.w2 = test::random_floats(E * C * H, 14, 0.2f);
  in.bias = test::random_floats(E, 15, 0.3f);
  in.aux_grad = test::random_floats(E, 16, 0.01f);
  for (int p = 0; p < ranks; ++p) {
    std::vector<float> x = test::random_floats(static_cast<size_t>(k.N) * C, 100 + p);
    if (k.one_expert)
      for (float& v : x) v = std::fabs(v) + 0.5f;  // router row E - 1 wins every row
    in.x.push_back(x);
    in.dout.push_back(test::random_floats(static_cast<size_t>(k.N) * C, 200 + p));
  }
  return in;
}

template <typename T>
struct Weights {
  test::DeviceBuffer<T> router, w1, w3, w2, bias;
  explicit Weights(const Inputs& in)
      : router(test::from_floats<T>(in.router)), w1(test::from_floats<T>(in.w1)), w3(test::from_floats<T>(in.w3)),
        w2(test::from_floats<T>(in.w2)), bias(test::from_floats<T>(in.bias)) {}
  // Experts [first, ...) of the whole model's.
  ExpertWeights<T> from(const ModelConfig& c, int first) const {
    const size_t HC = static_cast<size_t>(c.hidden()) * c.channels * first;
    return {router, w1.ptr + HC, w3.ptr + HC, w2.ptr + HC, c.router == Router::sigmoid ? bias.ptr : nullptr};
  }
};

template <typename T>
struct Gradients {
  test::DeviceBuffer<T> router, w1, w3, w2;
  Gradients(const ModelConfig& c, int experts)
      : router(std::vector<T>(static_cast<size_t>(c.num_experts) * c.channels, T(0.0f))),
        w1(std::vector<T>(static_cast<size_t>(experts) * c.hidden() * c.channels, T(0.0f))),
        w3(std::vector<T>(w1.count, T(0.0f))),
        w2(std::vector<T>(w1.count, T(0.0f))) {}
  ExpertGradients<T> get() const { return {router, w1, w3, w2}; }
};

struct Result {
  std::vector<float> out, dx, drouter, dw1, dw3, dw2;  // dw: the experts of the rank that ran it
  long long forward_bytes = 0, backward_bytes = 0;    // sent on the EP group: measured, and docs/MOE.md's
  long long forward_formula = 0, backward_formula = 0;
};

// The one-process layer (every expert local) on rank p's rows: out, dx and the router's gradient
// of those rows; every expert's weight gradients added into `dw`.
template <typename T>
Result one_process(const ModelConfig& c, const Inputs& in, const Weights<T>& wt, Gradients<T>& dw, int p,
                   cudaStream_t s) {
  const int N = static_cast<int>(in.x[p].size()) / c.channels, K = c.experts_per_token, M = N * K, C = c.channels;
  ExpertWork<T> work(c, N);
  const ExpertBuffers<T> b = work.buffers(c, N);
  test::DeviceBuffer<T> x(test::from_floats<T>(in.x[p])), dout(test::from_floats<T>(in.dout[p])), out(N * C),
      dx(N * C), rows(static_cast<size_t>(M) * C), drows(static_cast<size_t>(M) * C), dact(static_cast<size_t>(M) * c.hidden());
  test::DeviceBuffer<float> dgate(static_cast<size_t>(M)), aux(in.aux_grad),
      scratch(moe_router_input_backward_scratch_bytes(N, C, c.num_experts) / sizeof(float) + 1);
  const ExpertWeights<T> all = wt.from(c, 0);
  expert_mlp_forward(c, b, out.ptr, x.ptr, all, N, s);
  Gradients<T> router_only(c, 0);
  ExpertGradients<T> g = dw.get();
  g.router = router_only.router;
  moe_combine_backward(drows.ptr, dgate.ptr, dout.ptr, b.y, b.gate, b.slot, N, K, C, s);
  moe_permute(rows.ptr, x.ptr, b.token, M, C, s);
  expert_products_backward(c, drows.ptr, dact.ptr, b.fch, b.act, rows.ptr, b.host_offsets, c.num_experts, M, all, g,
                           false, s);
  expert_router_backward(c, dx.ptr, g.router, drows.ptr, dgate.ptr, b.probs, b.expert, b.gate, b.slot, aux.ptr,
                         b.logits, scratch.ptr, x.ptr, all.router, N, s);
  Result r;
  r.out = test::to_floats(out.download());
  r.dx = test::to_floats(dx.download());
  r.drouter = test::to_floats(router_only.router.download());
  return r;
}

// This rank's layer over the EP group `ep`.
template <typename T>
Result expert_parallel(const ModelConfig& c, const Inputs& in, const Weights<T>& wt, Communicator& ep, cudaStream_t s) {
  const int P = ep.world_size(), me = ep.rank(), E = c.num_experts, K = c.experts_per_token, C = c.channels,
            H = c.hidden(), El = E / P;
  const int N = static_cast<int>(in.x[me].size()) / C, M = N * K;
  const size_t most = static_cast<size_t>(P) * M;  // every rank's every row here
  test::DeviceBuffer<float> logits(static_cast<size_t>(N) * E), probs(static_cast<size_t>(N) * E), gate(M),
      dgate(M), aux(in.aux_grad), scratch(moe_router_input_backward_scratch_bytes(N, C, E) / sizeof(float) + 1);
  test::DeviceBuffer<int> expert(M), slot(M), token(M), offsets(E + 1);
  test::DeviceBuffer<T> y(static_cast<size_t>(M) * C), rows(static_cast<size_t>(M) * C), drows(2 * static_cast<size_t>(M) * C),
      got_rows(most * C), got_fch(2 * most * H), got_act(most * H), got_y(most * C), got_dact(most * H),
      x(test::from_floats<T>(in.x[me])), dout(test::from_floats<T>(in.dout[me])), out(static_cast<size_t>(N) * C),
      dx(static_cast<size_t>(N) * C);
  std::vector<int> host_offsets(E + 1);
  const ExpertBuffers<T> b{logits, probs, gate, expert, slot, token, offsets, nullptr, nullptr, y, rows, nullptr,
                           nullptr, host_offsets.data()};
  const ExpertReceived<T> got{got_rows, got_fch, got_act, got_y, got_dact};
  ExpertExchange<T> ex(&ep, E);
  const ExpertWeights<T> mine = wt.from(c, me * El);
  Gradients<T> dw(c, El);
  const long long before = ep.counts().send_bytes;
  const ExpertRoute r = expert_parallel_forward(c, b, got, ex, out.ptr, x.ptr, mine, N, s);
  const long long forwarded = ep.counts().send_bytes;
  CUDA_CHECK(cudaStreamSynchronize(s));
  got_rows.poison();  // work between the passes: other layers' forwards reuse it
  rows.poison();
  expert_parallel_backward(c, r, b, got, ex, dx.ptr, dw.get(), drows.ptr, dgate.ptr, aux.ptr, scratch.ptr, dout.ptr,
                           x.ptr, mine, N, false, s);
  Result result{test::to_floats(out.download()),      test::to_floats(dx.download()),
                test::to_floats(dw.router.download()), test::to_floats(dw.w1.download()),
                test::to_floats(dw.w3.download()),     test::to_floats(dw.w2.download())};
  // docs/MOE.md's table: R_out rows this rank routed to others' experts, R_in others' rows to its.
  long long out_rows = 0, in_rows = 0;
  for (int e = 0; e < E; ++e)
    if (e / El != me) out_rows += r.count(me, e);
  for (int p = 0; p < P; ++p)
    for (int l = 0; l < El; ++l)
      if (p != me) in_rows += r.count(p, me * El + l);
  const long long row = static_cast<long long>(C) * sizeof(T);
  result.forward_bytes = forwarded - before;
  result.backward_bytes = ep.counts().send_bytes - forwarded;
  result.forward_formula = P > 1 ? 4LL * (E + 1) * (P - 1) + (out_rows + in_rows) * row : 0;
  result.backward_formula = (2 * out_rows + in_rows) * row;
  return result;
}

std::vector<float> part(const std::vector<float>& v, size_t first, size_t n) {
  return std::vector<float>(v.begin() + first, v.begin() + first + n);
}

// A weight gradient: the one-process reference adds P products' sums, each rounded to T (bf16:
// a cancelling sum loses the ulps of its larger terms), so bf16 is compared to the tensor's scale.
template <typename T>
bool close_to_scale(const std::string& what, const std::vector<float>& got, const std::vector<float>& want) {
  if (std::is_same<T, float>::value) return test::all_close<T>(what, got, want);
  float scale = 0.0f;
  for (float v : want) scale = std::max(scale, std::fabs(v));
  return test::all_close(what, got, want, test::Tolerance<T>::rel, scale / 32);
}

template <typename T>
void check_group(Communicator& ep, const Case& k) {
  INFO(k.name << " over " << ep.world_size() << " ranks (EP rank " << ep.rank() << ")");
  matmul_init();
  const ModelConfig c = config_of(k);
  const int P = ep.world_size(), me = ep.rank(), El = k.E / P;
  const Inputs in = make_inputs(k, P);
  const Weights<T> wt(in);
  CudaStream stream("the test's stream");
  const cudaStream_t s = stream.get();
  Gradients<T> sum(c, k.E);
  Result want;
  for (int p = 0; p < P; ++p) {
    Result r = one_process(c, in, wt, sum, p, s);
    if (p == me) want = r;
  }
  const size_t slice = static_cast<size_t>(El) * k.H * k.C, first = slice * me;
  want.dw1 = part(test::to_floats(sum.w1.download()), first, slice);
  want.dw3 = part(test::to_floats(sum.w3.download()), first, slice);
  want.dw2 = part(test::to_floats(sum.w2.download()), first, slice);
  const long long world_sends = world().counts().send, ep_sends = ep.counts().send;
  const Result got = expert_parallel(c, in, wt, ep, s);
  CHECK(test::all_close<T>("out", got.out, want.out));
  CHECK(test::all_close<T>("dx", got.dx, want.dx));
  CHECK(test::all_close<T>("d router", got.drouter, want.drouter));
  CHECK(close_to_scale<T>("d w1", got.dw1, want.dw1));
  CHECK(close_to_scale<T>("d w3", got.dw3, want.dw3));
  CHECK(close_to_scale<T>("d w2", got.dw2, want.dw2));
  if (&ep != &world()) CHECK(world().counts().send == world_sends);
  if (P > 1) CHECK(ep.counts().send > ep_sends);
  CHECK(got.forward_bytes == got.forward_formula);
  CHECK(got.backward_bytes == got.backward_formula);
  const Result again = expert_parallel(c, in, wt, ep, s);
  CHECK(test::same_bits(again.out, got.out));
  CHECK(test::same_bits(again.dx, got.dx));
  CHECK(test::same_bits(again.dw1, got.dw1));
  CHECK(test::same_bits(again.dw2, got.dw2));
}

const Case kCases[] = {
    {"softmax, random routing, odd N", 13, 16, 24, 4, 2, Router::softmax, false},
    {"softmax, every first choice on the last rank's expert", 9, 16, 16, 8, 2, Router::softmax, true},
    {"softmax, top-k = E", 5, 8, 16, 4, 4, Router::softmax, false},
    {"sigmoid with bias, one row", 1, 16, 8, 8, 3, Router::sigmoid, false},
    {"sigmoid with bias, random routing", 11, 8, 16, 8, 2, Router::sigmoid, false},
};

template <typename T>
void check_every_group() {
  for (const Case& k : kCases) {
    check_group<T>(world(), k);
    if (world().world_size() == 4) {
      Communicator ep(world(), world().rank() % 2, world().rank(), "expert-parallel");
      check_group<T>(ep, k);
    }
    world().barrier();
  }
}

}  // namespace

TEMPLATE_TEST_CASE("the EP group's layer equals the one-process layer on each rank's rows", "[ep]", float, bf16) {
  check_every_group<TestType>();
}

TEST_CASE("ExpertExchange refuses experts the group cannot split, in one line naming --ep", "[ep]") {
  if (world().world_size() < 2) return;
  CHECK_THROWS_WITH(ExpertExchange<float>(&world(), 2 * world().world_size() + 1),
                    Catch::Contains("--ep " + std::to_string(world().world_size())) &&
                        Catch::Contains("must divide the experts E = "));
}

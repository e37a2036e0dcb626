// expert_mlp.h — a block's mixture-of-experts MLP (docs/MOE.md) on one activation set: the fp32
// router, the dropless dispatch of each row's K expert rows into expert order, the E SwiGLU
// experts as products over their own rows, and the gated combine; its backward pass, the
// load-balancing loss's gradient included; and the routing figures a step reports (ExpertStats).
//
// The experts' products need each expert's row count on the host (cuBLASLt takes its sizes from
// the host and has no grouped product): the slot offsets come back once per layer and forward,
// are kept for the backward (Activations::moe_host_offsets), and give the auxiliary loss its
// expert counts without another copy. An expert with no rows runs nothing.
//
// The auxiliary loss is Hugging Face Mixtral's load_balancing_loss_func: over the R = L·N rows of
// every layer of a micro-batch, aux = E · Σ_e f_e · P_e with f_e the share of (row, k) choices that
// went to expert e (counts_e / R: the K choices of a row each count) and P_e the mean router
// probability of e. f is a count and carries no gradient, so d aux / d prob[row][e] = E · f_e / R,
// the same for every row of every layer: one E-vector (moe_aux_grad) added in each layer's router
// backward. The objective is cross-entropy + coefficient · aux; the loss the run reports is the
// cross-entropy alone, and the auxiliary loss is reported beside it (metrics.jsonl).
//
// The sums are pooled over the whole model, but a pipeline stage holds only some of its layers, so
// they travel with the micro-batch (RoutingTail): each activation set's tail holds the counts and
// probability sums of every layer the micro-batch went through so far; a chunk that continues the
// model receives its predecessor's tail with its input, adds its own layers and sends it on with
// its output, so the head's chunk ends with the totals, which every backward gradient transfer
// carries back (pipeline_step.h). Every chunk's backward thus sees the whole micro-batch's totals.
#pragma once
#include "kernels/matmul.cuh"
#include "kernels/moe_dispatch.cuh"
#include "kernels/moe_router.cuh"
#include "src/base/device.h"
#include "src/config/model_config.h"
#include "src/dist/comm.h"
#include "src/model/activations.h"
#include "src/model/block_ops.h"

#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

// One layer's expert weights: the router (E × C), the E experts' w1 and w3 stacked (E·H × C each)
// and w2 stacked (E·C × H); the sigmoid router's balancing bias (E; nullptr for softmax routing).
template <typename Elem>
struct ExpertWeights {
  const Elem* router = nullptr;
  const Elem* w1 = nullptr;
  const Elem* w3 = nullptr;
  const Elem* w2 = nullptr;
  const Elem* bias = nullptr;
};
template <typename Elem>
struct ExpertGradients {
  Elem* router = nullptr;
  Elem* w1 = nullptr;
  Elem* w3 = nullptr;
  Elem* w2 = nullptr;
};

// The routing figures of one optimizer step on this rank: rows routed to each expert over every
// layer and micro-batch, and the auxiliary loss of each micro-batch.
struct ExpertStats {
  std::vector<int64_t> tokens;  // (E)
  double aux_sum = 0.0;
  int micro_batches = 0;
  void reset(int experts) {
    tokens.assign(experts, 0);
    aux_sum = 0.0;
    micro_batches = 0;
  }
  double aux_loss() const { return micro_batches > 0 ? aux_sum / micro_batches : 0.0; }
  // max / mean of tokens (1: perfectly balanced; 0 when nothing was routed).
  double imbalance() const {
    int64_t total = 0, largest = 0;
    for (int64_t t : tokens) {
      total += t;
      largest = std::max(largest, t);
    }
    return total > 0 ? static_cast<double>(largest) * static_cast<double>(tokens.size()) / static_cast<double>(total)
                     : 0.0;
  }
};

// `s` summed over the ranks of `groups` that routed other rows (the data-parallel, EP and TP
// groups; nullptr or one rank: none), so the step's figures are every rank's: a collective
// (blocking) every rank of those groups calls in turn. (A micro-batch's ranks report the same aux
// loss, so the mean over micro-batches is unchanged.)
inline ExpertStats pooled_expert_stats(const ExpertStats& s, std::initializer_list<Communicator*> groups) {
  std::vector<double> values(s.tokens.begin(), s.tokens.end());
  values.push_back(s.aux_sum);
  values.push_back(s.micro_batches);
  for (Communicator* group : groups)
    if (group != nullptr && group->world_size() > 1) group->sum(values);
  ExpertStats total;
  for (size_t e = 0; e < s.tokens.size(); ++e) total.tokens.push_back(static_cast<int64_t>(values[e]));
  total.aux_sum = values[s.tokens.size()];
  total.micro_batches = static_cast<int>(values[s.tokens.size() + 1]);
  return total;
}

// A mixture's state across one optimizer step: each local layer's rows per expert on the device
// (the sigmoid router's bias update reads them), and the step's figures on the host.
class ExpertStep {
 public:
  ExpertStep() = default;
  ExpertStep(int layers, int experts) : experts_(experts), counts_(static_cast<size_t>(layers) * experts, "expert counts") {}
  // A step starts (zero_grad): nothing routed yet.
  void reset(cudaStream_t s) {
    stats.reset(experts_);
    if (counts_.count() > 0) cuda_check(cudaMemsetAsync(counts_.get(), 0, counts_.bytes(), s), "zeroing expert counts");
  }
  int* counts(int layer) const { return counts_.get() + static_cast<size_t>(layer) * experts_; }
  ExpertStats stats;
  MoeChoice choice = MoeChoice::top_k;  // MoeChoice::balanced: --moe-balanced-routing (timing only)

 private:
  int experts_ = 0;
  DeviceArray<int> counts_;  // (local layers, E)
};

// Layer slice j's expert slot offsets on the host (E + 1).
template <typename Elem>
const int* expert_offsets(const Activations<Elem>& a, int E, int j) {
  return a.moe_host_offsets.data() + static_cast<size_t>(j) * (E + 1);
}

// An activation set's routing tail (Activations::moe_tail, 8·E bytes on the device): the (row, k)
// choices each expert got, E int32, then the router probabilities' column sums, E float, over the
// micro-batch's layers so far (the totals once its head's chunk has run). One buffer, so a
// pipeline transfer moves it whole: 8·E / sizeof(Elem) elements.
struct RoutingTail {
  int* counts;
  float* prob_sums;
};
template <typename Elem>
RoutingTail routing_tail(const Activations<Elem>& a, int E) {
  return {a.moe_tail.get(), reinterpret_cast<float*>(a.moe_tail.get() + E)};
}
template <typename Elem>
size_t routing_tail_elements(const ModelConfig& c) {
  return c.moe() ? 2 * static_cast<size_t>(c.num_experts) * sizeof(int) / sizeof(Elem) : 0;
}

// Before a chunk's forward in set a: a chunk that starts the model starts its tail at zero (one that
// continues it received its predecessor's with its input, or starts at zero: the forward pass alone).
template <typename Elem>
void routing_tail_begin(const Activations<Elem>& a, bool starts_model, cudaStream_t s) {
  if (starts_model) cuda_check(cudaMemsetAsync(a.moe_tail.get(), 0, a.moe_tail.bytes(), s), "zeroing the routing tail");
}

// After a chunk's forward of `layers` layers in set a (its probability sums added on the device as
// it ran): its layers' counts, from the host offsets, added to the tail's. Waits for the device.
template <typename Elem>
void routing_tail_end(const ModelConfig& c, const Activations<Elem>& a, int layers, bool starts_model,
                      cudaStream_t s) {
  const int E = c.num_experts;
  std::vector<int> counts(E, 0);
  const RoutingTail tail = routing_tail(a, E);
  if (!starts_model) copy_to_host(counts.data(), tail.counts, E * sizeof(int), s);
  for (int j = 0; j < layers; ++j) {
    const int* at = expert_offsets(a, E, j);
    for (int e = 0; e < E; ++e) counts[e] += at[e + 1] - at[e];
  }
  cuda_check(cudaMemcpyAsync(tail.counts, counts.data(), E * sizeof(int), cudaMemcpyHostToDevice, s),
             "adding the chunk's expert counts to the routing tail");
  cuda_check(cudaStreamSynchronize(s), "adding the chunk's expert counts to the routing tail");
}

// Where one layer's forward on N rows (M = N·K expert rows) writes: the router's logits (N × E, a
// work buffer), probabilities (N × E), gates, experts and slots (N × K), each slot's row (M), the
// experts' slot offsets (E + 1; on the host too), fch (w1's products, then w3's: 2 · M × H), the
// SwiGLU activations (M × H), the experts' outputs (M × C) and the rows in expert order (M × C, a
// work buffer). With counts (E; nullptr: none), the rows routed to each expert are added to
// counts and the probabilities' column sums to prob_sums (E).
template <typename Elem>
struct ExpertBuffers {
  float *logits, *probs, *gate;
  int *expert, *slot, *token, *offsets;
  Elem *fch, *act, *y, *rows;
  int* counts;
  float* prob_sums;
  int* host_offsets;
  MoeChoice choice = MoeChoice::top_k;
};

// Layer slice j's buffers in set a (w: the work set). counts: a training forward's (the step's
// counts of the layer; the probabilities go into the micro-batch's sums for the auxiliary loss);
// nullptr for a recomputation (the backward rerunning a block), which must not count again.
// With an EP group of `ep` ranks, fch and act hold the experts' side (ep·M rows: expert_parallel.h).
template <typename Elem>
ExpertBuffers<Elem> expert_buffers(const ModelConfig& c, Activations<Elem>& a, Activations<Elem>& w, int j, int N,
                                   int* counts, int ep, MoeChoice choice) {
  const int E = c.num_experts, M = N * c.experts_per_token;
  const size_t NE = static_cast<size_t>(N) * E, NK = static_cast<size_t>(M),
               MH = static_cast<size_t>(M) * ep * c.hidden();
  const size_t host_at = static_cast<size_t>(j) * (E + 1);
  if (a.moe_host_offsets.size() < host_at + E + 1) a.moe_host_offsets.resize(host_at + E + 1);
  return {w.moe_logits.get(),
          layer_slice(a.moe_probs, j, NE),
          layer_slice(a.moe_gate, j, NK),
          layer_slice(a.moe_expert, j, NK),
          layer_slice(a.moe_slot, j, NK),
          layer_slice(a.moe_token, j, NK),
          layer_slice(a.moe_offsets, j, static_cast<size_t>(E + 1)),
          layer_slice(a.fch, j, 2 * MH),
          layer_slice(a.fch_gelu, j, MH),
          layer_slice(a.moe_out, j, static_cast<size_t>(M) * c.channels),
          w.moe_rows.get(),
          counts,
          routing_tail(a, E).prob_sums,
          a.moe_host_offsets.data() + host_at,
          choice};
}

// The router's choices for N rows from b.logits: softmax top-K (b.probs the probabilities) or
// sigmoid top-K of score + wt.bias (b.probs the scores), b.expert and b.gate written.
template <typename Elem>
void expert_route(const ModelConfig& c, const ExpertBuffers<Elem>& b, const ExpertWeights<Elem>& wt, int N,
                  cudaStream_t s) {
  if (c.router == Router::sigmoid)
    moe_route_sigmoid_topk(b.probs, b.expert, b.gate, b.logits, wt.bias, N, c.num_experts, c.experts_per_token, s,
                           b.choice);
  else
    moe_route_softmax_topk(b.probs, b.expert, b.gate, b.logits, N, c.num_experts, c.experts_per_token, s, b.choice);
}

// The SwiGLU of `experts` experts (wt's w1, w3, w2 from its first expert on) on M rows in expert order,
// expert e's rows [at[e], at[e + 1]): fch (w1's products, then w3's: 2 · M × H), act (M × H) and
// y (M × C) written. An expert with no rows runs nothing.
template <typename Elem>
void expert_products_forward(const ModelConfig& c, Elem* fch, Elem* act, Elem* y, const Elem* rows, const int* at,
                             int experts, int M, const ExpertWeights<Elem>& wt, cudaStream_t s) {
  const int C = c.channels, H = c.hidden();
  const size_t MH = static_cast<size_t>(M) * H;
  if (M == 0) return;
  std::optional<ProfileLabel> site(std::in_place, "experts: w1, w3 products");
  for (int e = 0; e < experts; ++e) {
    const int first = at[e], n = at[e + 1] - at[e];
    if (n == 0) continue;
    const size_t eh = static_cast<size_t>(e) * H * C;
    matmul_forward(fch + static_cast<size_t>(first) * H, rows + static_cast<size_t>(first) * C, wt.w1 + eh, nullptr,
                   n, C, H, s);
    matmul_forward(fch + MH + static_cast<size_t>(first) * H, rows + static_cast<size_t>(first) * C, wt.w3 + eh,
                   nullptr, n, C, H, s);
  }
  site.reset();
  mlp_activation_forward(c, act, fch, M, H, s);
  site.emplace("experts: w2 products");
  for (int e = 0; e < experts; ++e) {
    const int first = at[e], n = at[e + 1] - at[e];
    if (n == 0) continue;
    matmul_forward(y + static_cast<size_t>(first) * C, act + static_cast<size_t>(first) * H,
                   wt.w2 + static_cast<size_t>(e) * C * H, nullptr, n, H, C, s);
  }
}

// Backward of expert_products_forward: drows holds d y (M × C) and is overwritten with d rows; fch
// with the products' gradients (as the dense SwiGLU's backward does); dact (M × H) is work; the
// experts' weight gradients (dw's from the same first expert) accumulated. rows: the forward's input
// rows; recompute_act: act is refilled from fch first.
template <typename Elem>
void expert_products_backward(const ModelConfig& c, Elem* drows, Elem* dact, Elem* fch, Elem* act, const Elem* rows,
                              const int* at, int experts, int M, const ExpertWeights<Elem>& wt,
                              const ExpertGradients<Elem>& dw, bool recompute_act, cudaStream_t s) {
  const int C = c.channels, H = c.hidden();
  const size_t MH = static_cast<size_t>(M) * H;
  if (M == 0) return;
  if (recompute_act) mlp_activation_forward(c, act, fch, M, H, s);
  std::optional<ProfileLabel> site(std::in_place, "experts: w2 backward products");
  for (int e = 0; e < experts; ++e) {
    const int first = at[e], n = at[e + 1] - at[e];
    if (n == 0) continue;
    matmul_backward(dact + static_cast<size_t>(first) * H, dw.w2 + static_cast<size_t>(e) * C * H, nullptr,
                    nullptr, drows + static_cast<size_t>(first) * C, act + static_cast<size_t>(first) * H,
                    wt.w2 + static_cast<size_t>(e) * C * H, nullptr, n, H, C, s);
  }
  site.reset();
  Elem* da = fch;
  Elem* db = fch + MH;
  swiglu_backward(da, db, dact, da, db, M, H, H, s);
  site.emplace("experts: w1, w3 backward products");
  for (int e = 0; e < experts; ++e) {
    const int first = at[e], n = at[e + 1] - at[e];
    if (n == 0) continue;
    const size_t eh = static_cast<size_t>(e) * H * C, r = static_cast<size_t>(first);
    matmul_backward(drows + r * C, dw.w1 + eh, nullptr, nullptr, da + r * H, rows + r * C, wt.w1 + eh, nullptr, n,
                    C, H, s);
    matmul_backward(drows + r * C, dw.w3 + eh, nullptr, nullptr, db + r * H, rows + r * C, wt.w3 + eh, nullptr, n,
                    C, H, s, nullptr, true);
  }
}

// The router on x (N × C) and its rows in expert order: b.logits, probs, expert, gate, slot, token,
// offsets (on the device) and rows (M × C) written, b.counts and prob_sums added to (when set).
template <typename Elem>
void expert_route_rows(const ModelConfig& c, const ExpertBuffers<Elem>& b, const Elem* x,
                       const ExpertWeights<Elem>& wt, int N, cudaStream_t s) {
  const int C = c.channels, E = c.num_experts, K = c.experts_per_token;
  moe_router_logits(b.logits, x, wt.router, N, C, E, s);
  expert_route(c, b, wt, N, s);
  if (b.counts != nullptr) moe_router_stats(b.counts, b.prob_sums, b.expert, b.probs, N, E, K, s);
  moe_dispatch_plan(b.offsets, b.slot, b.token, b.expert, N, E, K, s);
  moe_permute(b.rows, x, b.token, N * K, C, s);
}

// The router's backward from drows (d rows in expert order, M × C) and dgate (N × K): dx (N × C)
// written with the rows' sum and the router's input gradient, drouter accumulated; logits (N × E)
// and scratch are work. aux_grad: the auxiliary loss's gradient per probability (softmax router).
template <typename Elem>
void expert_router_backward(const ModelConfig& c, Elem* dx, Elem* drouter, const Elem* drows, float* dgate,
                            const float* probs, const int* expert, const float* gate, const int* slot,
                            const float* aux_grad, float* logits, float* scratch, const Elem* x, const Elem* router,
                            int N, cudaStream_t s) {
  const int C = c.channels, E = c.num_experts, K = c.experts_per_token;
  moe_unpermute_sum(dx, drows, slot, N, K, C, false, s);
  if (c.router == Router::sigmoid)  // no auxiliary loss: the bias balances (docs/MOE.md)
    moe_router_backward_sigmoid(logits, dgate, probs, expert, gate, N, E, K, s);
  else
    moe_router_backward_softmax(logits, dgate, probs, expert, gate, aux_grad, N, E, K, s);
  moe_router_input_backward(dx, drouter, scratch, logits, x, router, N, C, E, s);
}

// The forward on x (N × C, the ln2 output): out (N × C) = Σ_k gate · expert_k(x), everything the
// backward reads kept in b.
template <typename Elem>
void expert_mlp_forward(const ModelConfig& c, const ExpertBuffers<Elem>& b, Elem* out, const Elem* x,
                        const ExpertWeights<Elem>& wt, int N, cudaStream_t s) {
  const int C = c.channels, E = c.num_experts, K = c.experts_per_token, M = N * K;
  expert_route_rows(c, b, x, wt, N, s);
  copy_to_host(b.host_offsets, b.offsets, (E + 1) * sizeof(int), s);
  expert_products_forward(c, b.fch, b.act, b.y, b.rows, b.host_offsets, E, M, wt, s);
  moe_combine(out, b.y, b.gate, b.slot, N, K, C, s);
}

// Device buffers of expert_mlp_forward for up to `rows` rows, for a forward that keeps nothing
// (the decoder: generate.h).
template <typename Elem>
class ExpertWork {
 public:
  ExpertWork() = default;
  ExpertWork(const ModelConfig& c, size_t rows)
      : logits_(rows * c.num_experts, "the experts' router logits"),
        probs_(rows * c.num_experts, "the experts' router probabilities"),
        gate_(rows * c.experts_per_token, "the experts' gates"),
        routing_(3 * rows * c.experts_per_token + c.num_experts + 1, "the experts' routing"),
        fch_(3 * rows * c.experts_per_token * c.hidden(), "the experts' products"),
        rows_(2 * rows * c.experts_per_token * c.channels, "the experts' rows and outputs"),
        host_offsets_(c.num_experts + 1) {}
  ExpertBuffers<Elem> buffers(const ModelConfig& c, int N) {
    const size_t M = static_cast<size_t>(N) * c.experts_per_token, MH = M * c.hidden();
    int* r = routing_.get();
    return {logits_.get(), probs_.get(), gate_.get(), r, r + M, r + 2 * M, r + 3 * M, fch_.get(), fch_.get() + 2 * MH,
            rows_.get(), rows_.get() + M * c.channels, nullptr, nullptr, host_offsets_.data()};
  }
  size_t bytes() const {
    return logits_.bytes() + probs_.bytes() + gate_.bytes() + routing_.bytes() + fch_.bytes() + rows_.bytes();
  }

 private:
  DeviceArray<float> logits_, probs_, gate_;
  DeviceArray<int> routing_;  // experts, slots, slots' rows (M each), offsets (E + 1)
  DeviceArray<Elem> fch_;     // the products (2 · M × H), then the activations (M × H)
  DeviceArray<Elem> rows_;    // the experts' outputs, then the rows in expert order (M × C each)
  std::vector<int> host_offsets_;
};

// Before a chunk's backward in set a, whose tail holds the micro-batch's totals (routing_tail):
// the auxiliary loss's gradient per probability, scaled by coefficient · `scale` (the objective's
// weight of one micro-batch's mean), into w.moe_aux_grad, and with `stats` (once per micro-batch
// and rank) this rank's rows' expert counts and the micro-batch's auxiliary loss into it: the whole
// model's, on every pipeline stage. The tail holds this rank's rows; `row_groups` (nullptr: none), those whose ranks
// routed the micro-batch's other rows (--tp's sequence-parallel ranks, --cp's ranks), sum the
// totals first; N: the micro-batch's rows, all of them.
// With pipeline parallelism the (rank's) totals are also copied to w.moe_tail_out, which the
// backward's input gradient takes back to the previous stage. Waits for the device.
template <typename Elem>
void expert_aux_gradient(const ModelConfig& c, const Activations<Elem>& a, Activations<Elem>& w, int N, float scale,
                         ExpertStats* stats, std::initializer_list<Communicator*> row_groups, cudaStream_t s) {
  const int E = c.num_experts;
  const RoutingTail tail = routing_tail(a, E);
  if (w.moe_tail_out.count() > 0)
    cuda_check(cudaMemcpyAsync(w.moe_tail_out.get(), a.moe_tail.get(), a.moe_tail.bytes(), cudaMemcpyDeviceToDevice, s),
               "the routing totals an input gradient takes back");
  std::vector<int> tail_host(2 * E);  // the tail in one copy: E counts, then E probability sums' bits
  copy_to_host(tail_host.data(), tail.counts, 2 * E * sizeof(int), s);
  const int* counts = tail_host.data();
  std::vector<float> prob_sums(E);
  std::memcpy(prob_sums.data(), tail_host.data() + E, E * sizeof(float));
  std::vector<double> totals(counts, counts + E);  // counts, then probability sums
  totals.insert(totals.end(), prob_sums.begin(), prob_sums.end());
  for (Communicator* group : row_groups)
    if (group != nullptr && group->world_size() > 1) group->sum(totals);
  const double R = static_cast<double>(c.num_layers) * N;  // every layer's rows: the whole model's
  double aux = 0.0;
  std::vector<float> grad(E);
  for (int e = 0; e < E; ++e) {
    const double count = totals[e];
    aux += E * (count / R) * (totals[E + e] / R);
    grad[e] = static_cast<float>(c.aux_loss_coef * scale * E * count / (R * R));
  }
  if (stats != nullptr) {
    for (int e = 0; e < E; ++e) stats->tokens[e] += counts[e];  // this rank's rows (pooled_expert_stats)
    ++stats->micro_batches;
    if (c.router == Router::softmax) stats->aux_sum += aux;
  }
  if (c.router == Router::sigmoid) return;  // no auxiliary loss: the bias balances (docs/MOE.md)
  cuda_check(cudaMemcpyAsync(w.moe_aux_grad.get(), grad.data(), E * sizeof(float), cudaMemcpyHostToDevice, s),
             "uploading the auxiliary loss's gradient");
  cuda_check(cudaStreamSynchronize(s), "uploading the auxiliary loss's gradient");
}

// Backward of expert_mlp_forward for slice j from dout (N × C, d loss / d out): dx (N × C) written
// with d loss / d x through the experts and the router, the weight gradients accumulated. fch is
// overwritten with the products' gradients, as the dense SwiGLU's backward does. x: the forward's
// input (recomputed where the setting did not keep it); recompute_act: fch_gelu is refilled first.
template <typename Elem>
void expert_mlp_backward(const ModelConfig& c, Activations<Elem>& a, Activations<Elem>& w, int j, Elem* dx,
                         const ExpertGradients<Elem>& dw, const Elem* dout, const Elem* x,
                         const ExpertWeights<Elem>& wt, int N, bool recompute_act, cudaStream_t s) {
  const int C = c.channels, H = c.hidden(), E = c.num_experts, K = c.experts_per_token, M = N * K;
  const size_t NE = static_cast<size_t>(N) * E, NK = static_cast<size_t>(N) * K, MH = static_cast<size_t>(M) * H,
               MC = static_cast<size_t>(M) * C;
  const float* probs = layer_slice(a.moe_probs, j, NE);
  const float* gate = layer_slice(a.moe_gate, j, NK);
  const int* expert = layer_slice(a.moe_expert, j, NK);
  const int* slot = layer_slice(a.moe_slot, j, NK);
  const int* token = layer_slice(a.moe_token, j, NK);
  Elem* fch = layer_slice(a.fch, j, 2 * MH);
  Elem* act = layer_slice(a.fch_gelu, j, MH);
  const Elem* y = layer_slice(a.moe_out, j, MC);
  Elem* rows = w.moe_rows.get();      // x's rows in expert order
  Elem* drows = rows + MC;            // d y, then d rows
  const int* at = expert_offsets(a, E, j);
  moe_combine_backward(drows, w.moe_dgate.get(), dout, y, gate, slot, N, K, C, s);
  moe_permute(rows, x, token, M, C, s);
  expert_products_backward(c, drows, w.dwide.get(), fch, act, rows, at, E, M, wt, dw, recompute_act, s);
  expert_router_backward(c, dx, dw.router, drows, w.moe_dgate.get(), probs, expert, gate, slot, w.moe_aux_grad.get(),
                         w.moe_logits.get(), w.scratch.get(), x, wt.router, N, s);
}

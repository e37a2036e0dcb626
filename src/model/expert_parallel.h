// expert_parallel.h — expert parallelism for one mixture-of-experts layer (docs/MOE.md "Expert
// parallelism"): over an EP group of P ranks that read different rows, rank p holds experts
// [p·E/P, (p+1)·E/P) and routes its own rows; the rows it routed to another rank's experts travel
// there, the experts run on every row the group sent them, and their outputs travel back to be
// combined where the rows came from. The backward is the mirror. The router, the permutation, the
// products and the combine are expert_mlp.h's; this file adds the exchanges and their layout.
//
// Each exchange is one group of point-to-point transfers on the EP communicator (an all-to-all):
//   route     every rank's slot offsets (E + 1 ints) to every other: each rank then knows how many
//             rows each rank sends each expert, with no further size exchange;
//   dispatch  rank p's rows of rank q's expert e (contiguous in p's expert order) to q, one
//             transfer per expert with rows;
//   combine   the reverse of dispatch.
// A rank's received rows are in expert order, then source rank, then the source's slot order: the
// same rows in the same order whatever the timing, so the products (and every bit) are
// deterministic. A rank's own rows for its experts are copied on the model's stream, not sent.
#pragma once
#include "src/base/device.h"
#include "src/config/model_config.h"
#include "src/dist/comm.h"
#include "src/model/expert_mlp.h"

#include <stdexcept>
#include <string>
#include <vector>

// One layer's routing over the EP group, on the host: rank p's slot offsets (P × (E + 1)) and
// where each rank's rows land among this rank's received rows.
struct ExpertRoute {
  int ranks = 1, rank = 0, experts = 0;
  std::vector<int> offsets;  // (P, E + 1)
  std::vector<int> local;    // this rank's experts' offsets among the received rows (E/P + 1)
  int local_experts() const { return experts / ranks; }
  int first_expert() const { return rank * local_experts(); }
  // Rows rank p routed to expert e, and where they start in p's expert order.
  int count(int p, int e) const { return at(p, e + 1) - at(p, e); }
  int at(int p, int e) const { return offsets[static_cast<size_t>(p) * (experts + 1) + e]; }
  // Where rank p's rows of local expert l start among the received rows.
  int received_at(int p, int l) const {
    int r = local[l];
    for (int q = 0; q < p; ++q) r += count(q, first_expert() + l);
    return r;
  }
  int received() const { return local.back(); }
};

// The received side of one layer on the expert's rank, for up to P·N·K rows (the worst case: every
// rank's every row to this rank's experts): the rows, the experts' products (2 · rows × H, kept for
// the backward) and activations (rows × H), their outputs (rows × C; in the backward d y, then d rows),
// and the backward's d act (rows × H, work).
template <typename Elem>
struct ExpertReceived {
  Elem *rows, *fch, *act, *y, *dact;
};

template <typename Elem>
class ExpertExchange {
 public:
  // The EP group `ep` (nullptr: one rank, every expert local) splitting `experts` experts.
  ExpertExchange(Communicator* ep, int experts)
      : ep_(ep != nullptr && ep->world_size() > 1 ? ep : nullptr),
        ranks_(ep_ != nullptr ? ep_->world_size() : 1),
        rank_(ep_ != nullptr ? ep_->rank() : 0),
        experts_(experts),
        offsets_(static_cast<size_t>(ranks_) * (experts + 1), "the EP group's expert offsets") {
    if (experts % ranks_ != 0)
      throw std::runtime_error("--ep " + std::to_string(ranks_) + ": each rank holds whole experts, so it must divide "
                               "the experts E = " + std::to_string(experts));
  }
  int ranks() const { return ranks_; }
  int rank() const { return rank_; }

  // The group's routing from this rank's slot offsets (device, E + 1); waits for the device.
  ExpertRoute route(const int* offsets, cudaStream_t s) {
    const size_t n = static_cast<size_t>(experts_) + 1;
    int* all = offsets_.get();
    cuda_check(cudaMemcpyAsync(all + rank_ * n, offsets, n * sizeof(int), cudaMemcpyDeviceToDevice, s),
               "copying the expert offsets");
    if (ep_ != nullptr) {
      // Point-to-point moves bytes: the ints travel as floats of the same size, never added.
      static_assert(sizeof(int) == sizeof(float), "offsets travel as 4-byte words");
      std::vector<Transfer<float>> t;
      for (int q = 0; q < ranks_; ++q) {
        if (q == rank_) continue;
        t.push_back({reinterpret_cast<const float*>(offsets), nullptr, n, q});
        t.push_back({nullptr, reinterpret_cast<float*>(all + q * n), n, q});
      }
      ep_->ordered_with(s, [&] { ep_->exchange(t); });
    }
    ExpertRoute r;
    r.ranks = ranks_;
    r.rank = rank_;
    r.experts = experts_;
    r.offsets.resize(ranks_ * n);
    copy_to_host(r.offsets.data(), all, r.offsets.size() * sizeof(int), s);
    r.local.assign(r.local_experts() + 1, 0);
    for (int l = 0; l < r.local_experts(); ++l) {
      r.local[l + 1] = r.local[l];
      for (int p = 0; p < ranks_; ++p) r.local[l + 1] += r.count(p, r.first_expert() + l);
    }
    return r;
  }

  // Rows of `width` elements in this rank's expert order (rows) to their experts' ranks (received),
  // or back (combine: received to rows).
  void dispatch(const ExpertRoute& r, Elem* received, const Elem* rows, int width, cudaStream_t s) {
    move(r, received, rows, width, true, s);
  }
  void combine(const ExpertRoute& r, Elem* rows, const Elem* received, int width, cudaStream_t s) {
    move(r, const_cast<Elem*>(received), rows, width, false, s);
  }

 private:
  // out: rows → received (dispatch) or received → rows.
  void move(const ExpertRoute& r, Elem* received, const Elem* rows, int width, bool out, cudaStream_t s) {
    const size_t w = static_cast<size_t>(width);
    const int El = r.local_experts();
    std::vector<Transfer<Elem>> t;
    for (int q = 0; q < ranks_; ++q)  // this rank's rows of rank q's experts
      for (int l = 0; l < El; ++l) {
        const int e = q * El + l, n = r.count(rank_, e);
        if (n == 0) continue;
        Elem* mine = const_cast<Elem*>(rows) + static_cast<size_t>(r.at(rank_, e)) * w;
        if (q == rank_) {
          Elem* theirs = received + static_cast<size_t>(r.received_at(rank_, l)) * w;
          cuda_check(cudaMemcpyAsync(out ? theirs : mine, out ? mine : theirs, n * w * sizeof(Elem),
                                     cudaMemcpyDeviceToDevice, s),
                     "copying a rank's own expert rows");
          continue;
        }
        if (out) t.push_back({mine, nullptr, n * w, q});
        else t.push_back({nullptr, mine, n * w, q});
      }
    for (int p = 0; p < ranks_; ++p)  // rank p's rows of this rank's experts
      for (int l = 0; l < El; ++l) {
        const int n = r.count(p, r.first_expert() + l);
        if (n == 0 || p == rank_) continue;
        Elem* theirs = received + static_cast<size_t>(r.received_at(p, l)) * w;
        if (out) t.push_back({nullptr, theirs, n * w, p});
        else t.push_back({theirs, nullptr, n * w, p});
      }
    if (ep_ != nullptr && !t.empty()) ep_->ordered_with(s, [&] { ep_->exchange(t); });
  }

  Communicator* ep_;
  int ranks_, rank_, experts_;
  DeviceArray<int> offsets_;  // (P, E + 1)
};

// expert_mlp_forward over the EP group: b as there (its fch and act unused), the experts' side in
// `got`, wt's w1, w3 and w2 this rank's experts' (the router whole). Returns the layer's routing,
// which the backward needs; b.host_offsets gets this rank's offsets.
template <typename Elem>
ExpertRoute expert_parallel_forward(const ModelConfig& c, const ExpertBuffers<Elem>& b, const ExpertReceived<Elem>& got,
                                    ExpertExchange<Elem>& ex, Elem* out, const Elem* x, const ExpertWeights<Elem>& wt,
                                    int N, cudaStream_t s) {
  const int C = c.channels, E = c.num_experts, K = c.experts_per_token;
  expert_route_rows(c, b, x, wt, N, s);
  ExpertRoute r = ex.route(b.offsets, s);
  std::copy(r.offsets.begin() + r.rank * (E + 1), r.offsets.begin() + (r.rank + 1) * (E + 1), b.host_offsets);
  ex.dispatch(r, got.rows, b.rows, C, s);
  expert_products_forward(c, got.fch, got.act, got.y, got.rows, r.local.data(), r.local_experts(), r.received(), wt,
                          s);
  ex.combine(r, b.y, got.y, C, s);
  moe_combine(out, b.y, b.gate, b.slot, N, K, C, s);
  return r;
}

// expert_mlp_backward over the EP group, for the forward that returned `r` with the same b and got:
// dx (N × C) written, dw's router (whole) and this rank's experts' gradients accumulated (with every
// rank's rows). drows (2 · N·K × C: d y, then d rows; then x's rows), dgate (N × K), aux_grad (E),
// logits (N × E) and scratch as expert_router_backward's. x's rows travel again (not kept).
template <typename Elem>
void expert_parallel_backward(const ModelConfig& c, const ExpertRoute& r, const ExpertBuffers<Elem>& b,
                              const ExpertReceived<Elem>& got, ExpertExchange<Elem>& ex, Elem* dx,
                              const ExpertGradients<Elem>& dw, Elem* drows, float* dgate, const float* aux_grad,
                              float* scratch, const Elem* dout, const Elem* x, const ExpertWeights<Elem>& wt, int N,
                              bool recompute_act, cudaStream_t s) {
  const int C = c.channels, K = c.experts_per_token, M = N * K;
  Elem* rows = drows + static_cast<size_t>(M) * C;
  moe_combine_backward(drows, dgate, dout, b.y, b.gate, b.slot, N, K, C, s);
  moe_permute(rows, x, b.token, M, C, s);
  ex.dispatch(r, got.rows, rows, C, s);
  ex.dispatch(r, got.y, drows, C, s);
  expert_products_backward(c, got.y, got.dact, got.fch, got.act, got.rows, r.local.data(), r.local_experts(),
                           r.received(), wt, dw, recompute_act, s);
  ex.combine(r, drows, got.y, C, s);
  expert_router_backward(c, dx, dw.router, drows, dgate, b.probs, b.expert, b.gate, b.slot, aux_grad, b.logits,
                         scratch, x, wt.router, N, s);
}

// Every activation set's layer routes, from a layer's forward to its backward (a pipeline stage
// keeps several micro-batches in between: pipeline_step.h); routes[l]: layer l's in the set that
// the pass being queued runs in (select).
class ExpertRoutes {
 public:
  ExpertRoutes(int sets, int layers) : routes_(sets, std::vector<ExpertRoute>(layers)) {}
  void select(int set) { set_ = set; }
  ExpertRoute& operator[](int l) { return routes_[set_][l]; }

 private:
  std::vector<std::vector<ExpertRoute>> routes_;
  int set_ = 0;
};

// A model's expert parallelism: the EP group's exchange and each local layer's routing per
// activation set (the forward's, which its backward reads).
template <typename Elem>
struct ExpertParallelism {
  ExpertExchange<Elem> exchange;
  ExpertRoutes routes;
  ExpertParallelism(Communicator* ep, int experts, int sets, int layers) : exchange(ep, experts), routes(sets, layers) {}
  // The experts' side of buffers b (expert_buffers with this group's size) of a layer on N rows:
  // the received rows and outputs after the work set's own 2·M rows (`work_rows`, activations.h).
  ExpertReceived<Elem> received(const ModelConfig& c, const ExpertBuffers<Elem>& b, Elem* work_rows, Elem* dact,
                                int N) const {
    const size_t MC = static_cast<size_t>(N) * c.experts_per_token * c.channels;
    return {work_rows + 2 * MC, b.fch, b.act, work_rows + 2 * MC + exchange.ranks() * MC, dact};
  }
};

// transformer_passes.h — the transformer's forward and backward passes (TransformerPasses, a friend
// of Transformer in transformer.h): one micro-step's passes, the kernels of one chunk of a stage's
// layers queued on the model's stream, their activations in one activation set, the TP collectives between them. The
// ops that depend on where a row sits in its sequence (positions, attention) run per piece of
// the rank's rows (context_split.h: the whole (B, T) block, or a CP rank's two chunks).
#pragma once
#include "kernels/classifier.cuh"
#include "kernels/common.cuh"
#include "kernels/encoder.cuh"
#include "kernels/matmul.cuh"
#include "kernels/residual.cuh"
#include "kernels/rope.cuh"
#include "src/config/model_config.h"
#include "src/data/context_split.h"
#include "src/data/dataloader.h"
#include "src/model/activations.h"
#include "src/model/attention.h"
#include "src/model/block_ops.h"
#include "src/model/expert_mlp.h"
#include "src/model/expert_parallel.h"
#include "src/model/linear.h"

#include <cstddef>
#include <stdexcept>
#include <string>
#include <type_traits>

template <typename Elem>
class Transformer;

template <typename Elem>
struct TransformerPasses {
  // Slice j's input in activation set a (this rank's rows): the chunk's input (the embeddings or the
  // previous stage's output) for j = 0, else slice j-1's output.
  static const Elem* block_input(const Transformer<Elem>& m, const Activations<Elem>& a, int j);

  // ln (every row) from this rank's rows of `input`: the rank's rows normalized, then gathered
  // (`gather` false: the rank's rows alone, which the experts read). fp8: the norm's FP8 copy of
  // its output too (fp8_norm_output).
  static void norm_rows(Transformer<Elem>& m, Elem* ln, float* mean, float* rstd, const Elem* input, int l, int weight,
                        const Fp8Out& fp8 = {}, bool gather = true);
  // With --fp8: the FP8 copy of ln that its norm (this rank's rows) writes as layer l's product p's
  // input cast, where linear_input_cast fuses that cast; none otherwise.
  static Fp8Out fp8_norm_output(Transformer<Elem>& m, int l, Fp8Product p, const Elem* ln);

  // Local layer l's forward, its activations in slice j of set a, from its ln1 output (already in
  // place) to its MLP activation: everything the backward reads except ln1. The attention
  // projection's output is left in the work set's branch. Products and attention run on every row
  // with this rank's heads and hidden units; the row-parallel products' partial sums are summed
  // over the TP group (tp_collectives.h). With RoPE, q and k are rotated in place in the qkv
  // product's output, which the attention backward then reads. With experts the MLP runs here
  // whole, its output in the work set's branch (expert_mlp.h); `rerun`: the backward recomputing
  // the block (its router probabilities are not summed again).
  static void block_forward(Transformer<Elem>& m, Activations<Elem>& a, int l, int j, bool rerun = false);

  // One micro-step of forward_backward without pipeline parallelism: the tokens uploaded, the
  // forward, the head's loss and its gradient (of mean loss / grad_accum_steps), the backward with
  // the gradients' communication. `prepared`: the loader's batch the tokens come from, or nullptr.
  static void micro_step(Transformer<Elem>& m, const int* inputs, const int* targets, const TokenBatch* prepared,
                         int grad_accum_steps, bool last_micro_step);

  // Chunk c's forward in set a, from its input (embedded here when c embeds, else received into
  // a.encoded's rows) to its output: the head's lnf, or the last layer's residual3 for the next stage.
  static void queue_chunk_forward(Transformer<Elem>& m, Activations<Elem>& a, int c);

  // Chunk c's backward in set a (`slot`): from d lnf (the head left it in the work set's branch), or
  // from the received gradient of the chunk's output. Parameter gradients accumulate; dresidual holds
  // d loss / d (residual stream) at the current depth (this rank's rows): the skip connections pass
  // it through unchanged and each norm's backward adds its branch's share; it is gathered (sequence
  // parallel) where a row-parallel product's backward reads every row. The TP sums of d ln2 and
  // d ln1 run while the weight gradients' products do. Activations the recompute setting did not
  // keep are recomputed into their slice right before they are read. At the end dresidual holds the
  // gradient of the chunk's input: the embedding's backward takes it, or the previous stage.
  static void queue_chunk_backward(Transformer<Elem>& m, Activations<Elem>& a, int slot, int c);

  // zb-h1's weight backward of chunk c in set a: each product's weight gradient from the output
  // gradient its input backward kept (a.douts) and its input.
  static void queue_chunk_weight_gradients(Transformer<Elem>& m, Activations<Elem>& a, int c);

  // With --fp8: the weights' FP8 copies, remade if the weights changed since they were made.
  static void refresh_fp8_weights(Transformer<Elem>& m);

  // Layer l's expert weights and their gradients (expert_mlp.h).
  static ExpertWeights<Elem> expert_weights(const Transformer<Elem>& m, int l);
  static ExpertGradients<Elem> expert_gradients(const Transformer<Elem>& m, int l);

  // RoPE of q and k in place in qkv (every row), forward or backward (the gradient's inverse rotation).
  static void rotate(Transformer<Elem>& m, Elem* qkv, bool backward);
  // out, lse from qkv: causal attention over each sequence (with CP: the ring over the group).
  static void attention_forward(Transformer<Elem>& m, Elem* out, float* lse, const Elem* qkv);
  // dqkv from dout, given the forward's qkv, out and lse.
  static void attention_backward(Transformer<Elem>& m, Elem* dqkv, float* scratch, const Elem* dout, const Elem* qkv,
                                 const Elem* out, const float* lse);
};

template <typename Elem>
void TransformerPasses<Elem>::micro_step(Transformer<Elem>& m, const int* inputs, const int* targets,
                                         const TokenBatch* prepared, int grad_accum_steps, bool last_micro_step) {
  if (grad_accum_steps < 1)
    throw std::runtime_error("gradient accumulation: expected at least 1 micro-step, found " +
                             std::to_string(grad_accum_steps));
  Activations<Elem>& a = m.slots_[0];
  m.upload_tokens(a, 0, inputs, targets, true, prepared);
  queue_chunk_forward(m, a, 0);
  m.objective_scale_ = 1.0f / (static_cast<float>(grad_accum_steps) * m.grads_.ranks_summed());
  const float dloss = m.objective_scale_ / static_cast<float>(m.rows());
  m.grads_.begin_micro_step(last_micro_step);
  m.head_.queue(a, a, m.param(m.lm_head_tensor()), m.grad(m.lm_head_tensor()), m.tp_, m.rows(), m.cfg_.channels, true,
                dloss, true, m.stream_.get());
  classifier_loss_sum(m.totals_.loss_sum(), a.losses.get(), m.rows(), m.stream_.get());
  ++m.micro_steps_;
  queue_chunk_backward(m, a, 0, 0);
  m.grads_.end_micro_step();
}

template <typename Elem>
void TransformerPasses<Elem>::rotate(Transformer<Elem>& m, Elem* qkv, bool backward) {
  for (const ContextSplit::Piece& p : m.context_.pieces(m.B_)) {
    Elem* rows = qkv + static_cast<size_t>(p.row) * m.qkvl_;
    (backward ? rope_backward<Elem> : rope_forward<Elem>)(rows, rows, m.rope_table_.get(), m.context_.seq_len(), m.B_,
                                                          p.len, m.nhl_ + m.nkvl_, m.cfg_.head_size(), m.qkvl_, p.first,
                                                          m.stream_.get());
  }
}

template <typename Elem>
void TransformerPasses<Elem>::attention_forward(Transformer<Elem>& m, Elem* out, float* lse, const Elem* qkv) {
  if (m.ring_) return m.ring_->forward(out, lse, qkv);
  model_attention_forward(m.attention_, out, lse, qkv, m.B_, m.seq_len_, m.cl_, m.nhl_, m.nkvl_, m.stream_.get());
}

template <typename Elem>
void TransformerPasses<Elem>::attention_backward(Transformer<Elem>& m, Elem* dqkv, float* scratch, const Elem* dout,
                                                 const Elem* qkv, const Elem* out, const float* lse) {
  if (m.ring_) return m.ring_->backward(dqkv, dout, qkv, out, lse);
  model_attention_backward(m.attention_, dqkv, scratch, dout, qkv, out, lse, m.B_, m.seq_len_, m.cl_, m.nhl_, m.nkvl_,
                           m.stream_.get());
}

template <typename Elem>
void TransformerPasses<Elem>::refresh_fp8_weights(Transformer<Elem>& m) {
  if constexpr (std::is_same<Elem, bf16>::value) {
    Fp8State* fp8 = m.fp8_state();
    if (fp8 == nullptr) return;
    static constexpr int kWeights[kFp8Products] = {kQkvw, kAttprojw, kFcw, kFc2w, kFcprojw};
    fp8->refresh_weights([&](Fp8Product p, int l) { return m.param(kWeights[static_cast<int>(p)], l); });
  }
}

template <typename Elem>
ExpertWeights<Elem> TransformerPasses<Elem>::expert_weights(const Transformer<Elem>& m, int l) {
  return {m.param(kRouterw, l), m.param(kFcw, l), m.param(kFc2w, l), m.param(kFcprojw, l),
          m.cfg_.router == Router::sigmoid ? m.param(kExpertBias, l) : nullptr};
}

template <typename Elem>
ExpertGradients<Elem> TransformerPasses<Elem>::expert_gradients(const Transformer<Elem>& m, int l) {
  return {m.grad(kRouterw, l), m.grad(kFcw, l), m.grad(kFc2w, l), m.grad(kFcprojw, l)};
}

template <typename Elem>
const Elem* TransformerPasses<Elem>::block_input(const Transformer<Elem>& m, const Activations<Elem>& a, int j) {
  const size_t rows_c = static_cast<size_t>(m.tp_.local_rows()) * m.cfg_.channels;
  return j == 0 ? m.tp_.local(a.encoded.get(), m.cfg_.channels) : a.residual3.get() + (j - 1) * rows_c;
}

template <typename Elem>
void TransformerPasses<Elem>::norm_rows(Transformer<Elem>& m, Elem* ln, float* mean, float* rstd, const Elem* input,
                                        int l, int weight, const Fp8Out& fp8, bool gather) {
  norm_forward(m.cfg_, m.tp_.local(ln, m.cfg_.channels), mean, rstd, input, m.param(weight, l), m.param(weight + 1, l),
               m.tp_.local_rows(), m.stream_.get(), fp8);
  if (gather) m.tp_.gather(ln, m.cfg_.channels);
}

template <typename Elem>
Fp8Out TransformerPasses<Elem>::fp8_norm_output(Transformer<Elem>& m, int l, Fp8Product p, const Elem* ln) {
  return linear_input_cast(LinearSite{m.fp8_state(), l, p}, ln, m.tp_.local_rows());
}

template <typename Elem>
void TransformerPasses<Elem>::block_forward(Transformer<Elem>& m, Activations<Elem>& a, int l, int j, bool rerun) {
  const int N = m.rows(), C = m.cfg_.channels, Nl = m.tp_.local_rows();
  const size_t NC = static_cast<size_t>(N) * C, Ncl = static_cast<size_t>(N) * m.cl_,
               Nh = static_cast<size_t>(N) * m.hl_;
  Activations<Elem>& w = m.slots_[0];
  cudaStream_t s = m.stream_.get();
  Elem* qkv = layer_slice(a.qkv, j, static_cast<size_t>(N) * m.qkvl_);
  Elem* atty = layer_slice(a.atty, j, Ncl);
  Elem* ln2 = layer_slice(a.ln2, j, NC);
  Fp8State* fp8 = m.fp8_state();
  linear_forward({fp8, l, Fp8Product::qkv}, qkv, layer_slice(a.ln1, j, NC), m.param(kQkvw, l), m.param(kQkvb, l), N, C,
                 m.qkvl_, s);
  if (m.cfg_.positions == Positions::rope) rotate(m, qkv, false);
  attention_forward(m, atty, layer_slice(a.lse, j, static_cast<size_t>(N) * m.nhl_), qkv);
  linear_forward({fp8, l, Fp8Product::attproj}, w.branch.get(), atty, m.param(kAttprojw, l),
                 m.tp_.once(m.param(kAttprojb, l)), N, m.cl_, C, s);
  const Elem* attproj = m.tp_.reduce(w.branch.get(), C);
  residual_norm_forward(m.cfg_, layer_slice(a.residual2, j, static_cast<size_t>(Nl) * C), m.tp_.local(ln2, C),
                        layer_slice(a.ln2_mean, j, Nl), layer_slice(a.ln2_rstd, j, Nl), block_input(m, a, j), attproj,
                        m.param(kLn2w, l), m.param(kLn2b, l), Nl, s, fp8_norm_output(m, l, Fp8Product::fc, ln2));
  if (m.cfg_.moe()) {  // on this rank's rows (sequence parallel: its own; expert_mlp.h)
    const ExpertBuffers<Elem> b = expert_buffers(m.cfg_, a, w, j, Nl, rerun ? nullptr : m.experts_.counts(l),
                                                 m.split_.ep_size(), m.experts_.choice);
    Elem* out = m.tp_.local(w.branch.get(), C);
    const Elem* x = m.tp_.local(ln2, C);
    if (m.ep_ == nullptr) return expert_mlp_forward(m.cfg_, b, out, x, expert_weights(m, l), Nl, s);
    const ExpertReceived<Elem> got = m.ep_->received(m.cfg_, b, w.moe_rows.get(), w.dwide.get(), Nl);
    m.ep_->routes[l] = expert_parallel_forward(m.cfg_, b, got, m.ep_->exchange, out, x, expert_weights(m, l), Nl, s);
    return;
  }
  m.tp_.gather(ln2, C);
  mlp_up_forward(m.cfg_, layer_slice(a.fch, j, m.cfg_.mlp_products() * Nh), layer_slice(a.fch_gelu, j, Nh), ln2,
                 m.param(kFcw, l), m.param(kFcb, l), m.param(kFc2w, l), N, m.hl_, s, fp8, l);
}

template <typename Elem>
void TransformerPasses<Elem>::queue_chunk_forward(Transformer<Elem>& m, Activations<Elem>& a, int c) {
  const int N = m.rows(), C = m.cfg_.channels, Nl = m.tp_.local_rows(), first = m.chunk_first_[c],
            n = m.stage().chunks[c];
  const size_t NC = static_cast<size_t>(N) * C, NlC = static_cast<size_t>(Nl) * C;
  Activations<Elem>& w = m.slots_[0];
  cudaStream_t s = m.stream_.get();
  m.params_.use_model_bucket();
  m.params_.begin_pass(true);
  m.params_.enter_layer(first);
  refresh_fp8_weights(m);
  if (m.cfg_.moe()) routing_tail_begin(a, m.embeds_at(c), s);  // the auxiliary loss's sums (expert_mlp.h)
  if (m.embeds_at(c)) {
    // Each TP rank embeds the tokens of its vocabulary rows (zero for the others); the sum over
    // the group is the embedding, wpe (learned positions) added once: each piece's rows of it.
    const Elem* wpe = m.tp_.once(m.param(kWpe));
    for (const ContextSplit::Piece& p : m.context_.pieces(m.B_))
      encoder_forward(a.encoded.get() + static_cast<size_t>(p.row) * C, a.inputs.get() + p.row, m.param(kWte),
                      wpe != nullptr ? wpe + static_cast<size_t>(p.first) * C : nullptr, m.B_, p.len, C, s,
                      m.vocab_begin(), m.vl_);
    m.tp_.reduce(a.encoded.get(), C);
  }
  // The chunk's first layer normalizes its input; every later ln1 (and lnf) comes out of the
  // previous layer's fused residual add + norm.
  norm_rows(m, layer_slice(a.ln1, 0, NC), layer_slice(a.ln1_mean, 0, Nl), layer_slice(a.ln1_rstd, 0, Nl),
            block_input(m, a, 0), first, kLn1w, fp8_norm_output(m, first, Fp8Product::qkv, layer_slice(a.ln1, 0, NC)));
  for (int j = 0; j < n; ++j) {
    const int l = first + j;
    block_forward(m, a, l, j);
    if (!m.cfg_.moe())
      linear_forward({m.fp8_state(), l, Fp8Product::fcproj}, w.branch.get(),
                     layer_slice(a.fch_gelu, j, static_cast<size_t>(N) * m.hl_), m.param(kFcprojw, l),
                     m.tp_.once(m.param(kFcprojb, l)), N, m.hl_, C, s);
    // Experts leave this rank's rows whole; the products' partial sums are summed over the group.
    const Elem* fcproj = m.cfg_.moe() ? m.tp_.local(w.branch.get(), C) : m.tp_.reduce(w.branch.get(), C);
    Elem* residual3 = a.residual3.get() + j * NlC;
    const Elem* residual2 = layer_slice(a.residual2, j, NlC);
    if (j + 1 < n) {
      m.params_.enter_layer(l + 1);
      Elem* ln1 = layer_slice(a.ln1, j + 1, NC);
      residual_norm_forward(m.cfg_, residual3, m.tp_.local(ln1, C), layer_slice(a.ln1_mean, j + 1, Nl),
                            layer_slice(a.ln1_rstd, j + 1, Nl), residual2, fcproj, m.param(kLn1w, l + 1),
                            m.param(kLn1b, l + 1), Nl, s, fp8_norm_output(m, l + 1, Fp8Product::qkv, ln1));
      m.tp_.gather(ln1, C);
    } else if (m.head_at(c)) {
      residual_norm_forward(m.cfg_, residual3, m.tp_.local(a.lnf.get(), C), a.lnf_mean.get(), a.lnf_rstd.get(),
                            residual2, fcproj, m.param(kLnfw), m.param(kLnfb), Nl, s);
      m.tp_.gather(a.lnf.get(), C);
    } else {  // the next stage normalizes it: the same bits as the fused add (residual.cuh)
      residual_forward(residual3, residual2, fcproj, NlC, s);
    }
    m.params_.leave_layer(l);
  }
  if (m.cfg_.moe()) routing_tail_end(m.cfg_, a, n, m.embeds_at(c), s);
}

template <typename Elem>
void TransformerPasses<Elem>::queue_chunk_backward(Transformer<Elem>& m, Activations<Elem>& a, int slot, int c) {
  const int N = m.rows(), C = m.cfg_.channels, Nl = m.tp_.local_rows(), first = m.chunk_first_[c],
            n = m.stage().chunks[c];
  const size_t NC = static_cast<size_t>(N) * C, NlC = static_cast<size_t>(Nl) * C;
  const size_t Ncl = static_cast<size_t>(N) * m.cl_, Nh = static_cast<size_t>(N) * m.hl_;
  Activations<Elem>& w = m.slots_[0];
  cudaStream_t s = m.stream_.get();
  Elem* dresidual_rows = w.dresidual.get();  // every row, once gathered
  Elem* dresidual = m.tp_.local(dresidual_rows, C);
  Elem* dbranch = w.branch.get();
  Elem* dwide = w.dwide.get();
  float* scratch = w.scratch.get();
  cuda_check(cudaMemsetAsync(dresidual_rows, 0, w.dresidual.bytes(), s), "zeroing the residual gradient");
  if (m.head_at(c))
    norm_backward(m.cfg_, dresidual, m.grad(kLnfw), m.grad(kLnfb), scratch, m.tp_.local(dbranch, C),
                  a.residual3.get() + (n - 1) * NlC, m.param(kLnfw), a.lnf_mean.get(), a.lnf_rstd.get(), Nl, s);
  else
    cuda_check(cudaMemcpyAsync(dresidual, a.output_grad.get(), a.output_grad.bytes(), cudaMemcpyDeviceToDevice, s),
               "the chunk output's gradient");
  const bool rerun_block = !block_keeps(BlockTensor::other, m.recompute_);
  const bool recompute_act = !rerun_block && !block_keeps(BlockTensor::fch_gelu, m.recompute_);
  const bool recompute_ln = !rerun_block && !block_keeps(BlockTensor::ln_output, m.recompute_);
  // zb-h1: the products' weight gradients wait for queue_chunk_weight_gradients, their output
  // gradients kept for it.
  const bool defer = m.pipeline_.split_backward;
  const DeferredGradients kept = deferred_gradients(m.cfg_, m.B_, m.seq_len_, m.tp_.shape());
  auto keep = [&](int j, size_t at, const Elem* g, size_t n) {
    if (defer)
      cuda_check(
          cudaMemcpyAsync(a.douts.get() + j * kept.per_layer + at, g, n * sizeof(Elem), cudaMemcpyDeviceToDevice, s),
          "keeping an output gradient for the weight backward");
  };
  auto weight_grad = [&](int tensor, int l) { return defer ? nullptr : m.grad(tensor, l); };
  Fp8State* fp8 = m.fp8_state();
  // The rank's figures once per micro-batch: at its first chunk. A CP group's ranks hold parts of
  // one micro-batch (its B·T rows are CP·N) whose gradients the data-parallel group averages, so
  // the loss's gradient, the same for every row, is CP times its one-process value.
  const int cp = m.context_.ranks;
  if (m.cfg_.moe())
    expert_aux_gradient(m.cfg_, a, w, N * cp, m.objective_scale_ * static_cast<float>(cp),
                        c == 0 ? &m.experts_.stats : nullptr, {m.tp_.comm(), m.cp_}, s);
  m.params_.begin_pass(false);
  for (int j = n - 1; j >= 0; --j) {
    const int l = first + j;
    m.grads_.open_layer_gradients(l);  // gradient communication: grad_sync.h
    m.params_.enter_layer(l);          // ZeRO 3's gathered parameters: model_parameters.h
    const Elem* residual = block_input(m, a, j);
    Elem* ln1 = layer_slice(a.ln1, j, NC);
    float* ln1_mean = layer_slice(a.ln1_mean, j, Nl);
    float* ln1_rstd = layer_slice(a.ln1_rstd, j, Nl);
    Elem* ln2 = layer_slice(a.ln2, j, NC);
    float* ln2_mean = layer_slice(a.ln2_mean, j, Nl);
    float* ln2_rstd = layer_slice(a.ln2_rstd, j, Nl);
    const Elem* residual2 = layer_slice(a.residual2, j, NlC);
    const Elem* qkv = layer_slice(a.qkv, j, static_cast<size_t>(N) * m.qkvl_);
    const Elem* atty = layer_slice(a.atty, j, Ncl);
    Elem* fch = layer_slice(a.fch, j, m.cfg_.mlp_products() * Nh);
    Elem* fch_gelu = layer_slice(a.fch_gelu, j, Nh);
    // A recomputed ln1 or ln2 (norm_forward of the kept, rounded input) equals the forward's
    // fused residual norm output bit for bit, statistics included (kept statistics are
    // rewritten with the values they hold).
    if (rerun_block) {
      norm_rows(m, ln1, ln1_mean, ln1_rstd, residual, l, kLn1w, fp8_norm_output(m, l, Fp8Product::qkv, ln1));
      block_forward(m, a, l, j, true);
    }
    // MLP branch; dresidual = d/d residual3 = d/d fcproj (with experts: d/d the combined output,
    // of this rank's rows alone, as in the forward).
    const Elem* dln2 = nullptr;
    if (m.cfg_.moe()) {
      if (recompute_ln) norm_rows(m, ln2, ln2_mean, ln2_rstd, residual2, l, kLn2w, {}, false);
      Elem* dx = m.tp_.local(dbranch, C);
      const Elem* x = m.tp_.local(ln2, C);
      if (m.ep_ != nullptr) {
        const ExpertBuffers<Elem> b =
            expert_buffers(m.cfg_, a, w, j, Nl, nullptr, m.split_.ep_size(), m.experts_.choice);
        expert_parallel_backward(m.cfg_, m.ep_->routes[l], b, m.ep_->received(m.cfg_, b, w.moe_rows.get(), dwide, Nl),
                                 m.ep_->exchange, dx, expert_gradients(m, l), w.moe_rows.get(), w.moe_dgate.get(),
                                 w.moe_aux_grad.get(), w.scratch.get(), dresidual, x, expert_weights(m, l), Nl,
                                 recompute_act, s);
      } else {
        expert_mlp_backward(m.cfg_, a, w, j, dx, expert_gradients(m, l), dresidual, x, expert_weights(m, l), Nl,
                            recompute_act, s);
      }
      dln2 = dx;
    } else {
      m.tp_.gather(dresidual_rows, C);
      if (recompute_act)
        mlp_activation_recompute(m.cfg_, fch_gelu, fch, N, m.hl_, s,
                                 linear_input_cast_transposed(LinearSite{fp8, l, Fp8Product::fcproj}, fch_gelu, N));
      linear_backward({fp8, l, Fp8Product::fcproj}, dwide, weight_grad(kFcprojw, l),
                      m.tp_.replicated_grad(m.grad(kFcprojb, l)), nullptr, dresidual_rows, fch_gelu,
                      m.param(kFcprojw, l), nullptr, N, m.hl_, C, s);
      keep(j, kept.fcproj, dresidual_rows, NC);
      if (recompute_ln) norm_rows(m, ln2, ln2_mean, ln2_rstd, residual2, l, kLn2w);
      mlp_up_backward(m.cfg_, dbranch, weight_grad(kFcw, l), m.grad(kFcb, l), weight_grad(kFc2w, l), dwide, fch, ln2,
                      m.param(kFcw, l), m.param(kFc2w, l), N, m.hl_, s, [&] { m.tp_.start_reduce(dbranch, C); },
                      fp8, l);
      if (m.cfg_.mlp == Mlp::gelu) keep(j, kept.fc, dwide, Nh);  // GELU's g (SwiGLU's stay in fch)
      dln2 = m.tp_.finish_reduce(dbranch, C);
    }
    norm_backward(m.cfg_, dresidual, m.grad(kLn2w, l), m.grad(kLn2b, l), scratch, dln2, residual2,
                  m.param(kLn2w, l), ln2_mean, ln2_rstd, Nl, s);
    // Attention branch; dresidual = d/d residual2 = d/d attproj.
    m.tp_.gather(dresidual_rows, C);
    linear_backward({fp8, l, Fp8Product::attproj}, dbranch, weight_grad(kAttprojw, l),
                    m.tp_.replicated_grad(m.grad(kAttprojb, l)), nullptr, dresidual_rows, atty,
                    m.param(kAttprojw, l), nullptr, N, m.cl_, C, s);
    keep(j, kept.attproj, dresidual_rows, NC);
    attention_backward(m, dwide, scratch, dbranch, qkv, atty, layer_slice(a.lse, j, static_cast<size_t>(N) * m.nhl_));
    if (m.cfg_.positions == Positions::rope) rotate(m, dwide, true);  // d q, d k before the rotation: rotated back
    if (recompute_ln) norm_rows(m, ln1, ln1_mean, ln1_rstd, residual, l, kLn1w);
    linear_backward({fp8, l, Fp8Product::qkv}, dbranch, weight_grad(kQkvw, l), m.grad(kQkvb, l), nullptr, dwide, ln1,
                    m.param(kQkvw, l), nullptr, N, C, m.qkvl_, s, [&] { m.tp_.start_reduce(dbranch, C); });
    keep(j, kept.qkv, dwide, static_cast<size_t>(N) * m.qkvl_);
    norm_backward(m.cfg_, dresidual, m.grad(kLn1w, l), m.grad(kLn1b, l), scratch, m.tp_.finish_reduce(dbranch, C),
                  residual, m.param(kLn1w, l), ln1_mean, ln1_rstd, Nl, s);
    m.params_.leave_layer(l);
    m.grads_.send_finished_bucket(l);  // all-reduce / reduce-scatter once its bucket is done
  }
  if (!m.embeds_at(c)) return;
  m.tp_.gather(dresidual_rows, C);
  encoder_backward(m.grad(kWte), static_cast<Elem*>(nullptr), scratch, a.buckets.get(), m.bucket_segments_[slot],
                   dresidual_rows, m.B_, m.seq_len_, C, s);
  Elem* dwpe = m.tp_.replicated_grad(m.grad(kWpe));
  if (dwpe == nullptr) return;
  for (const ContextSplit::Piece& p : m.context_.pieces(m.B_))  // each position's rows, b ascending
    encoder_backward(static_cast<Elem*>(nullptr), dwpe + static_cast<size_t>(p.first) * C, scratch, nullptr, 0,
                     dresidual_rows + static_cast<size_t>(p.row) * C, m.B_, p.len, C, s);
}

template <typename Elem>
void TransformerPasses<Elem>::queue_chunk_weight_gradients(Transformer<Elem>& m, Activations<Elem>& a, int c) {
  const int N = m.rows(), C = m.cfg_.channels, first = m.chunk_first_[c];
  const size_t NC = static_cast<size_t>(N) * C, Nh = static_cast<size_t>(N) * m.hl_;
  const DeferredGradients kept = deferred_gradients(m.cfg_, m.B_, m.seq_len_, m.tp_.shape());
  cudaStream_t s = m.stream_.get();
  for (int j = m.stage().chunks[c] - 1; j >= 0; --j) {
    const int l = first + j;
    const Elem* g = a.douts.get() + j * kept.per_layer;
    const Elem* ln2 = layer_slice(a.ln2, j, NC);
    const Elem* fch = layer_slice(a.fch, j, m.cfg_.mlp_products() * Nh);  // SwiGLU: its two products' g
    if (!m.cfg_.moe()) {  // the experts' weight gradients are their input backward's (docs/MOE.md)
      matmul_weight_gradient(m.grad(kFcprojw, l), layer_slice(a.fch_gelu, j, Nh), g + kept.fcproj, N, m.hl_, C, s);
      matmul_weight_gradient(m.grad(kFcw, l), ln2, m.cfg_.mlp == Mlp::gelu ? g + kept.fc : fch, N, C, m.hl_, s);
      if (m.cfg_.mlp == Mlp::swiglu) matmul_weight_gradient(m.grad(kFc2w, l), ln2, fch + Nh, N, C, m.hl_, s);
    }
    matmul_weight_gradient(m.grad(kAttprojw, l), layer_slice(a.atty, j, static_cast<size_t>(N) * m.cl_),
                           g + kept.attproj, N, m.cl_, C, s);
    matmul_weight_gradient(m.grad(kQkvw, l), layer_slice(a.ln1, j, NC), g + kept.qkv, N, C, m.qkvl_, s);
  }
}

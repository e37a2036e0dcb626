// activations.h — the activation memory of one micro-batch: which tensors each --recompute setting
// keeps for the backward pass, their sizes (the source of truth for the start-up memory summary and
// any planner), and the device buffers themselves (Activations).
#pragma once
#include "kernels/attention.cuh"
#include "kernels/encoder.cuh"
#include "kernels/global_norm.cuh"
#include "kernels/layernorm.cuh"
#include "kernels/moe_router.cuh"
#include "kernels/rmsnorm.cuh"
#include "src/base/device.h"
#include "src/config/model_config.h"
#include "src/dist/tensor_split.h"

#include <algorithm>
#include <climits>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <vector>

// Activation recomputation and activation memory.
//
// --recompute trades compute for memory: the backward pass recomputes part of what the forward
// pass computed instead of keeping it for every layer.
//   0  every layer keeps everything its backward reads
//   1  the MLP activations fch_gelu (H per row: GELU's, or SwiGLU's silu(a)·b) are recomputed from
//      the kept products fch
//   2  also the norm outputs ln1 and ln2 (C each), from their kept inputs
//   3  only the residual stream (every block's input) is kept: the backward reruns a block's
//      forward from its input right before differentiating it
// A tensor not kept for every layer has one layer-sized slice that the forward and the
// recomputation reuse layer after layer. Recomputation runs the same deterministic kernels on the
// same bits (a LayerNorm output recomputed by layernorm_forward is bitwise the fused residual
// LayerNorm's: both round the residual to T first and share layernorm_row), so every setting
// gives bit-identical losses and gradients.
constexpr int kRecomputeMax = 3;
constexpr int kRecomputeDefault = 1;

inline void check_recompute(int recompute) {
  if (recompute < 0 || recompute > kRecomputeMax)
    throw std::runtime_error("recompute: expected 0, 1, 2 or 3, found " + std::to_string(recompute));
}

// Element counts of the activation buffers of one B×T micro-batch, N = B·T rows. A per-layer
// tensor holds L slices when kept for the backward pass, else 1 (block_keeps).
struct ActivationCounts {
  // T elements.
  size_t encoded = 0, residual3 = 0;                        // the residual stream: (N, C), (L, N, C)
  size_t ln1 = 0, atty = 0, residual2 = 0, ln2 = 0;         // (slices, N, C)
  size_t qkv = 0;                                           // (slices, N, (NH + 2·NKV)·HS)
  size_t fch = 0;                                           // (slices, N, H), SwiGLU: (slices, 2, N, H)
  size_t fch_gelu = 0;                                      // (slices, N, H)
  size_t lnf = 0, logits = 0, branch = 0, dresidual = 0, dwide = 0;
  size_t output_grad = 0;  // pipeline: the gradient of a chunk's output received from the next stage (N_l, C)
  size_t douts = 0;        // zb-h1: the products' output gradients kept for the weight backward (deferred_gradients)
  // Mixture of experts (expert_mlp.h), M = N·K expert rows: kept per layer, the experts' outputs
  // (slices, M, C); work buffers, the permuted rows and their gradients (M, C) each.
  size_t moe_out = 0, moe_rows = 0;
  // fp32 elements.
  size_t ln_stat = 0;  // each of ln1_rstd, ln2_rstd (and LayerNorm's ln1_mean, ln2_mean): (slices, N)
  size_t ln_mean = 0;  // ln_stat for LayerNorm, 0 for RMSNorm (no mean)
  size_t lse = 0;      // (slices, B, NH, T)
  size_t lnf_stat = 0, lnf_mean = 0, losses = 0, scratch = 0, norm_squared = 0;
  size_t classifier_stats = 0;  // tensor parallel: each lm-head chunk row's max and two sums
  // Mixture of experts, fp32: kept per layer, the router's probabilities (slices, N, E) and gates
  // (slices, N, K); work buffers, the logits and their gradient (N, E), the gates' gradient (N, K),
  // the auxiliary loss's gradient per probability (E).
  size_t moe_probs = 0, moe_gate = 0, moe_logits = 0, moe_dgate = 0, moe_aux_grad = 0;
  // int elements.
  size_t tokens = 0;  // each of inputs, targets
  size_t buckets = 0;
  // Mixture of experts, int: kept per layer, each row's experts, the slot each (row, k) goes to and
  // each slot's row (slices, N, K) each, and the experts' slot offsets (slices, E + 1); per set, the
  // micro-batch's routing tail (2·E 4-byte values: expert_mlp.h's RoutingTail), and with pipeline
  // parallelism the first set's copy of the totals a backward sends with its input gradient.
  size_t moe_expert = 0, moe_slot = 0, moe_token = 0, moe_offsets = 0, moe_tail = 0, moe_tail_out = 0;
};

// The configuration of a model that runs micro-batches of B×seq_len tokens at setting `recompute`,
// after every check that needs no allocation.
inline const ModelConfig& check_micro_batch(const ModelConfig& cfg, int B, int seq_len, int recompute) {
  check_model_config(cfg, "model configuration");
  check_recompute(recompute);
  if (B < 1) throw std::runtime_error("batch size: expected B >= 1, found " + std::to_string(B));
  if (seq_len < 1 || seq_len > cfg.max_seq_len)
    throw std::runtime_error("sequence length: expected 1 <= T <= max_seq_len (" + std::to_string(cfg.max_seq_len) +
                             "), found " + std::to_string(seq_len));
  // The kernels index rows (B·T) and attention rows (B·NH·T) with int.
  if (static_cast<size_t>(B) * seq_len * cfg.num_heads > static_cast<size_t>(INT_MAX))
    throw std::runtime_error("micro-batch: B*T*NH = " + std::to_string(B) + "*" + std::to_string(seq_len) + "*" +
                             std::to_string(cfg.num_heads) + " exceeds the kernels' int indexing");
  return cfg;
}

enum class BlockTensor { fch_gelu, ln_output, other };

// Whether setting `recompute` keeps a block tensor for every layer (see above): GELU outputs up
// to 0, LayerNorm outputs up to 1, everything else (qkv, attention output and lse, residual2, fch,
// LayerNorm statistics) up to 2. The residual stream is always kept.
inline bool block_keeps(BlockTensor tensor, int recompute) {
  switch (tensor) {
    case BlockTensor::fch_gelu: return recompute < 1;
    case BlockTensor::ln_output: return recompute < 2;
    case BlockTensor::other: return recompute < 3;
  }
  return true;
}

// The lm head and the classifier run over chunks of rows of the micro-batch, so the logits (Vp
// wide: the largest activation per row) need a (chunk, Vp) buffer, not (N, Vp). Every chunk's
// forward product re-reads wte and its weight-gradient product reads and writes the fp32 wte
// gradient, so larger chunks move less: at kLogitsChunkRows (the default; 8 chunks of a d12
// micro-batch at B = 64) those re-reads are a few per cent of the head's time, and more rows would
// only take memory from the batch. The memory plan picks fewer (lm_head_chunk_rows, at least
// kLogitsChunkRowsMin) where that many do not fit.
constexpr size_t kLogitsChunkRows = 8192;
constexpr size_t kLogitsChunkRowsMin = 1024;

// logits_rows: the lm head's chunk rows (the logits buffer holds min(B·seq_len, logits_rows) rows).
// With tensor parallelism (tensor_split.h, tp_collectives.h) the counts are one rank's: the
// block's products and attention hold its C/size channels, NH/size query and NKV/size K/V heads and
// H/size hidden units of every row, the logits its Vp/size columns; under sequence parallelism the residual
// stream, residual2 and the LayerNorm statistics hold its B·T/size rows, while the LayerNorm
// outputs, the branch and the residual gradient keep every row (they are gathered in place).
// With an EP group of `ep` ranks (expert_parallel.h) a rank's experts may receive every rank's
// rows: their products and activations hold ep·M rows, and the work set the received rows and
// outputs (2·ep·M × C) after its own (2·M × C).
inline ActivationCounts activation_counts(const ModelConfig& cfg, int B, int seq_len, int recompute,
                                               size_t logits_rows = kLogitsChunkRows,
                                               const TensorParallelism& tp = {}, int ep = 1) {
  check_recompute(recompute);
  const size_t L = cfg.num_layers, C = cfg.channels, N = static_cast<size_t>(B) * seq_len;
  const size_t ways = static_cast<size_t>(tp.size), Nl = tp.sequence_parallel ? N / ways : N;
  const size_t Cl = C / ways, NHl = cfg.num_heads / ways, Vl = cfg.padded_vocab_size / ways;
  const size_t QKVl = cfg.qkv_channels() / ways, Hl = cfg.hidden() / ways;
  auto slices = [&](BlockTensor t) { return block_keeps(t, recompute) ? L : 1; };
  ActivationCounts n;
  n.encoded = N * C;
  n.residual3 = L * Nl * C;
  n.ln1 = n.ln2 = slices(BlockTensor::ln_output) * N * C;
  n.atty = slices(BlockTensor::other) * N * Cl;
  n.residual2 = slices(BlockTensor::other) * Nl * C;
  n.qkv = slices(BlockTensor::other) * N * QKVl;
  // An MLP's rows: each token's once (H/size units), or with experts each of this rank's rows' K
  // expert rows (whole experts: under --tp a rank runs them on its own rows).
  const size_t K = cfg.moe() ? cfg.experts_per_token : 1, Nr = cfg.moe() ? Nl : N, M = Nr * K,
               Mx = M * static_cast<size_t>(ep), Hm = cfg.moe() ? cfg.hidden() : Hl;
  n.fch = slices(BlockTensor::other) * cfg.mlp_products() * Mx * Hm;
  n.fch_gelu = slices(BlockTensor::fch_gelu) * Mx * Hm;
  n.lnf = n.branch = n.dresidual = N * C;
  n.logits = std::min(N, logits_rows) * Vl;
  n.classifier_stats = ways > 1 ? 3 * std::min(N, logits_rows) : 0;
  n.dwide = std::max(Mx * Hm, N * QKVl);
  n.ln_stat = slices(BlockTensor::other) * Nl;
  n.ln_mean = cfg.norm == Norm::layernorm ? n.ln_stat : 0;
  n.lnf_mean = cfg.norm == Norm::layernorm ? Nl : 0;
  n.lse = slices(BlockTensor::other) * N * NHl;
  n.lnf_stat = Nl;
  n.losses = N;
  const size_t scratch_bytes =
      std::max({layernorm_backward_scratch_bytes(static_cast<int>(Nl), cfg.channels),
                rmsnorm_backward_scratch_bytes(static_cast<int>(Nl), cfg.channels),
                attention_backward_scratch_bytes(B, seq_len, static_cast<int>(NHl)),
                encoder_backward_scratch_bytes(B, seq_len, cfg.channels), global_norm_scratch_bytes(),
                cfg.moe() ? moe_router_input_backward_scratch_bytes(static_cast<int>(Nr), cfg.channels, cfg.num_experts)
                          : size_t{0}});
  n.scratch = ceil_div(scratch_bytes, sizeof(float));
  n.norm_squared = 1;
  n.tokens = N;
  n.buckets = encoder_backward_buckets_bytes(B, seq_len) / sizeof(int);
  if (cfg.moe()) {
    const size_t E = cfg.num_experts, kept = slices(BlockTensor::other);
    n.moe_out = kept * M * C;
    n.moe_rows = 2 * M * C + (ep > 1 ? 2 * Mx * C : 0);
    n.moe_probs = kept * Nr * E;
    n.moe_gate = kept * M;
    n.moe_tail = 2 * E;
    n.moe_logits = Nr * E;
    n.moe_dgate = M;
    n.moe_aux_grad = E;
    n.moe_expert = n.moe_slot = n.moe_token = kept * M;
    n.moe_offsets = kept * (E + 1);
  }
  return n;
}

// zb-h1 (pipeline_schedule.h) splits a pass's backward: the input backward leaves each product's
// output gradient for the weight backward, per layer: the two residual-branch projections' (N, C
// each), qkv's (N, QKV/size) and, with GELU, fc's (N, H/size) (SwiGLU's two stay in fch, where its
// backward writes them). In that order within a layer's (N, per_layer) block. With experts the MLP
// is not deferred (its weight gradients are the input backward's): no fcproj block.
struct DeferredGradients {
  size_t fcproj = 0, attproj = 0, qkv = 0, fc = 0;  // offsets within a layer's block
  size_t per_layer = 0;
};
inline DeferredGradients deferred_gradients(const ModelConfig& cfg, int B, int seq_len, const TensorParallelism& tp = {}) {
  const size_t N = static_cast<size_t>(B) * seq_len, C = cfg.channels;
  DeferredGradients d;
  d.attproj = cfg.moe() ? 0 : N * C;
  d.qkv = d.attproj + N * C;
  d.fc = d.qkv + N * (cfg.qkv_channels() / tp.size);
  d.per_layer = d.fc + (cfg.mlp == Mlp::gelu ? N * (cfg.hidden() / tp.size) : 0);
  return d;
}

// Pipeline parallelism keeps several micro-batches' activations at once (the schedule's in-flight
// chunk passes), each set's counts those of activation_counts for the rank's largest chunk (its
// cfg.num_layers), then these. The first set is whole; every further set holds what a pass keeps
// until its backward (the per-layer tensors, the chunk's input and output, lnf, losses, tokens,
// the received output gradient, the routing tail), while the buffers a pass only works in
// (branch, residual and wide gradients, scratch; the logits; the routing totals a backward sends)
// are the first set's alone. A stage without the head has no logits at all.
inline ActivationCounts pipeline_slot_counts(ActivationCounts n, bool first, bool head) {
  n.output_grad = n.lnf_stat * (n.lnf / n.losses);  // this rank's rows × C
  n.moe_tail_out = first ? n.moe_tail : 0;
  if (!first)
    n.branch = n.dresidual = n.dwide = n.scratch = n.norm_squared = n.moe_rows = n.moe_logits = n.moe_dgate =
        n.moe_aux_grad = 0;
  if (!first || !head) n.logits = n.classifier_stats = 0;
  return n;
}

// Device memory of the activations (everything that scales with the micro-batch) in two parts:
//   blocks: the transformer blocks' activations: the residual stream and what the blocks keep for
//           the backward pass, including the one-layer slices the recomputation refills. This is
//           what --recompute shrinks.
//   other:  final LayerNorm, logits (min(N, logits_rows)·Vp), losses, activation-gradient
//           buffers, scratch, tokens. The same at every setting.
struct ActivationBytes {
  size_t blocks = 0, other = 0;
  size_t total() const { return blocks + other; }
};

inline ActivationBytes activation_bytes(const ActivationCounts& n, DType dtype) {
  const size_t t = dtype == DType::fp32 ? sizeof(float) : sizeof(bf16), f = sizeof(float);
  ActivationBytes bytes;
  bytes.blocks = t * (n.encoded + n.residual3 + n.ln1 + n.atty + n.residual2 + n.ln2 + n.qkv + n.fch + n.fch_gelu +
                      n.moe_out) +
                 f * (2 * n.ln_stat + 2 * n.ln_mean + n.lse + n.moe_probs + n.moe_gate) +
                 sizeof(int) * (n.moe_expert + n.moe_slot + n.moe_token + n.moe_offsets);
  bytes.other = t * (n.lnf + n.logits + n.branch + n.dresidual + n.dwide + n.output_grad + n.douts + n.moe_rows) +
                f * (n.lnf_stat + n.lnf_mean + n.losses + n.scratch + n.norm_squared + n.classifier_stats +
                     n.moe_logits + n.moe_dgate + n.moe_aux_grad) +
                sizeof(int) * (2 * n.tokens + n.buckets + n.moe_tail + n.moe_tail_out);
  return bytes;
}
inline ActivationBytes model_activation_bytes(const ModelConfig& cfg, int B, int seq_len, int recompute, DType dtype,
                                             size_t logits_rows = kLogitsChunkRows,
                                             const TensorParallelism& tp = {}) {
  return activation_bytes(activation_counts(cfg, B, seq_len, recompute, logits_rows, tp, tp.experts), dtype);
}


// The activation buffers of one micro-batch, N = B·T rows, sized by activation_counts.
// Per-layer tensors hold L slices, or one slice reused by every layer when the recompute setting
// does not keep them (block_keeps; layer_slice()).
template <typename Elem>
struct Activations {
  DeviceArray<Elem> encoded;                    // (N, C) wte[token] + wpe[t]: layer 0's input
  DeviceArray<Elem> ln1, atty, residual2, ln2;  // (L|1, N, C)
  DeviceArray<Elem> residual3;                  // (L, N, C) residual2 + fcproj: the next layer's input
  DeviceArray<Elem> qkv;                        // (L|1, N, (NH + 2·NKV)·HS)
  DeviceArray<Elem> fch;                        // (L|1, N, H) before GELU; SwiGLU: (L|1, 2, N, H) w1·x, w3·x
  DeviceArray<Elem> fch_gelu;                   // (L|1, N, H) after GELU / SwiGLU
  DeviceArray<float> ln1_mean, ln1_rstd, ln2_mean, ln2_rstd;  // (L|1, N); no means for RMSNorm
  DeviceArray<float> lse;                       // (L|1, B, NH, T) attention log-sum-exp
  DeviceArray<Elem> lnf;                        // (N, C)
  DeviceArray<float> lnf_mean, lnf_rstd;        // (N); no mean for RMSNorm
  DeviceArray<Elem> logits;                     // (chunk, Vp); the classifier writes dlogits in place
  DeviceArray<float> losses;                    // (N)
  DeviceArray<float> classifier_stats;          // tensor parallel: (chunk) row maxima, (chunk, 2) sums
  // Forward: output of a residual branch's projection before the residual add. Backward: the
  // gradient of the input of the matmul / attention just differentiated.
  DeviceArray<Elem> branch;                     // (N, C)
  DeviceArray<Elem> dresidual;                  // (N, C) gradient of the residual stream
  DeviceArray<Elem> dwide;                      // (N, max(H, QKV)) gradient of fch_gelu/fch, then of qkv
  DeviceArray<Elem> output_grad;                // pipeline: (N_l, C) the chunk output's gradient, received
  DeviceArray<Elem> douts;                      // zb-h1: (L, deferred_gradients().per_layer)
  DeviceArray<float> scratch;                   // layernorm / attention / encoder backward, gradient norm
  DeviceArray<float> norm_squared;              // (1)
  DeviceArray<int> inputs, targets;             // (N)
  DeviceArray<int> buckets;                     // encoder-backward bucket list
  // Mixture of experts (ActivationCounts' moe_ fields; expert_mlp.h).
  DeviceArray<Elem> moe_out, moe_rows;
  DeviceArray<float> moe_probs, moe_gate, moe_logits, moe_dgate, moe_aux_grad;
  DeviceArray<int> moe_expert, moe_slot, moe_token, moe_offsets, moe_tail, moe_tail_out;
  // Every layer's expert slot offsets on the host (L, E + 1), whatever the recompute setting: the
  // per-expert products' row counts, and the auxiliary loss's expert counts.
  std::vector<int> moe_host_offsets;

  Activations() = default;
  explicit Activations(const ActivationCounts& n)
      : encoded(n.encoded, "activations (encoded)"),
        ln1(n.ln1, "activations (ln1)"),
        atty(n.atty, "activations (attention output)"),
        residual2(n.residual2, "activations (residual2)"),
        ln2(n.ln2, "activations (ln2)"),
        residual3(n.residual3, "activations (residual3)"),
        qkv(n.qkv, "activations (qkv)"),
        fch(n.fch, "activations (fch)"),
        fch_gelu(n.fch_gelu, "activations (fch_gelu)"),
        ln1_mean(n.ln_mean, "activations (ln1 mean)"),
        ln1_rstd(n.ln_stat, "activations (ln1 rstd)"),
        ln2_mean(n.ln_mean, "activations (ln2 mean)"),
        ln2_rstd(n.ln_stat, "activations (ln2 rstd)"),
        lse(n.lse, "activations (attention lse)"),
        lnf(n.lnf, "activations (lnf)"),
        lnf_mean(n.lnf_mean, "activations (lnf mean)"),
        lnf_rstd(n.lnf_stat, "activations (lnf rstd)"),
        logits(n.logits, "activations (logits)"),
        losses(n.losses, "activations (losses)"),
        classifier_stats(n.classifier_stats, "activations (vocabulary-parallel classifier statistics)"),
        branch(n.branch, "activations (branch output / input gradient)"),
        dresidual(n.dresidual, "activation gradients (residual)"),
        dwide(n.dwide, "activation gradients (fch / qkv)"),
        output_grad(n.output_grad, "activation gradients (a pipeline chunk's output, received)"),
        douts(n.douts, "products' output gradients kept for the weight backward (zb-h1)"),
        scratch(n.scratch, "scratch"),
        norm_squared(n.norm_squared, "gradient norm"),
        inputs(n.tokens, "input tokens"),
        targets(n.tokens, "target tokens"),
        buckets(n.buckets, "encoder-gradient buckets"),
        moe_out(n.moe_out, "activations (experts' outputs)"),
        moe_rows(n.moe_rows, "activations (expert rows and their gradients)"),
        moe_probs(n.moe_probs, "activations (router probabilities)"),
        moe_gate(n.moe_gate, "activations (expert gates)"),
        moe_logits(n.moe_logits, "router logits and their gradient"),
        moe_dgate(n.moe_dgate, "expert gates' gradient"),
        moe_aux_grad(n.moe_aux_grad, "the auxiliary loss's gradient"),
        moe_expert(n.moe_expert, "activations (routed experts)"),
        moe_slot(n.moe_slot, "activations (expert slots)"),
        moe_token(n.moe_token, "activations (expert slots' rows)"),
        moe_offsets(n.moe_offsets, "activations (expert slot offsets)"),
        moe_tail(n.moe_tail, "the micro-batch's routing counts and probability sums"),
        moe_tail_out(n.moe_tail_out, "the routing totals sent with an input gradient") {}

  // The sum of the buffers allocated, which model_activation_bytes(...).total() predicts.
  size_t bytes() const {
    size_t total = 0;
    for (size_t b : {encoded.bytes(), ln1.bytes(), atty.bytes(), residual2.bytes(), ln2.bytes(), residual3.bytes(),
                     qkv.bytes(), fch.bytes(), fch_gelu.bytes(), ln1_mean.bytes(), ln1_rstd.bytes(), ln2_mean.bytes(),
                     ln2_rstd.bytes(), lse.bytes(), lnf.bytes(), lnf_mean.bytes(), lnf_rstd.bytes(), logits.bytes(),
                     losses.bytes(), classifier_stats.bytes(), branch.bytes(), dresidual.bytes(), dwide.bytes(),
                     output_grad.bytes(), douts.bytes(), scratch.bytes(), norm_squared.bytes(), inputs.bytes(),
                     targets.bytes(), buckets.bytes(), moe_out.bytes(), moe_rows.bytes(), moe_probs.bytes(),
                     moe_gate.bytes(), moe_logits.bytes(), moe_dgate.bytes(), moe_aux_grad.bytes(),
                     moe_expert.bytes(), moe_slot.bytes(), moe_token.bytes(), moe_offsets.bytes(),
                     moe_tail.bytes(), moe_tail_out.bytes()})
      total += b;
    return total;
  }
};

// Layer l's slice of a per-layer activation of `slice` elements: its own slice when the tensor is
// kept for every layer, else the one slice all layers reuse.
template <typename Elem>
Elem* layer_slice(const DeviceArray<Elem>& a, int l, size_t slice) {
  return a.get() + (a.count() > slice ? static_cast<size_t>(l) * slice : 0);
}

// transformer_passes.h — Transformer's forward and backward passes (declared in transformer.h, whose
// comments say what each does): the kernels of a chunk of layers queued on the model's stream,
// their activations in one activation set, the TP collectives between them.
#pragma once
#include "src/model/transformer.h"

template <typename Elem>
const Elem* Transformer<Elem>::block_input(const Activations<Elem>& a, int j) const {
  const size_t rows_c = static_cast<size_t>(tp_.local_rows()) * cfg_.channels;
  return j == 0 ? tp_.local(a.encoded.get(), cfg_.channels) : a.residual3.get() + (j - 1) * rows_c;
}

template <typename Elem>
void Transformer<Elem>::norm_rows(Elem* ln, float* mean, float* rstd, const Elem* input, int l, int weight) {
  norm_forward(cfg_, tp_.local(ln, cfg_.channels), mean, rstd, input, param(weight, l), param(weight + 1, l),
               tp_.local_rows(), stream_.get());
  tp_.gather(ln, cfg_.channels);
}

template <typename Elem>
void Transformer<Elem>::block_forward(Activations<Elem>& a, int l, int j) {
  const int N = rows(), C = cfg_.channels, Nl = tp_.local_rows();
  const size_t NC = static_cast<size_t>(N) * C, Ncl = static_cast<size_t>(N) * cl_, Nh = static_cast<size_t>(N) * hl_;
  Activations<Elem>& w = slots_[0];
  cudaStream_t s = stream_.get();
  Elem* qkv = layer_slice(a.qkv, j, static_cast<size_t>(N) * qkvl_);
  Elem* atty = layer_slice(a.atty, j, Ncl);
  Elem* ln2 = layer_slice(a.ln2, j, NC);
  matmul_forward(qkv, layer_slice(a.ln1, j, NC), param(kQkvw, l), param(kQkvb, l), N, C, qkvl_, s);
  if (cfg_.positions == Positions::rope)
    rope_forward(qkv, qkv, rope_table_.get(), seq_len_, B_, seq_len_, nhl_ + nkvl_, cfg_.head_size(), qkvl_, 0, s);
  model_attention_forward(attention_, atty, layer_slice(a.lse, j, static_cast<size_t>(N) * nhl_), qkv, B_, seq_len_,
                          cl_, nhl_, nkvl_, s);
  matmul_forward(w.branch.get(), atty, param(kAttprojw, l), tp_.once(param(kAttprojb, l)), N, cl_, C, s);
  const Elem* attproj = tp_.reduce(w.branch.get(), C);
  residual_norm_forward(cfg_, layer_slice(a.residual2, j, static_cast<size_t>(Nl) * C), tp_.local(ln2, C),
                        layer_slice(a.ln2_mean, j, Nl), layer_slice(a.ln2_rstd, j, Nl), block_input(a, j), attproj,
                        param(kLn2w, l), param(kLn2b, l), Nl, s);
  tp_.gather(ln2, C);
  mlp_up_forward(cfg_, layer_slice(a.fch, j, cfg_.mlp_products() * Nh), layer_slice(a.fch_gelu, j, Nh), ln2,
                 param(kFcw, l), param(kFcb, l), param(kFc2w, l), N, hl_, s);
}

template <typename Elem>
void Transformer<Elem>::queue_chunk_forward(Activations<Elem>& a, int c) {
  const int N = rows(), C = cfg_.channels, Nl = tp_.local_rows(), first = chunk_first_[c], n = stage().chunks[c];
  const size_t NC = static_cast<size_t>(N) * C, NlC = static_cast<size_t>(Nl) * C;
  Activations<Elem>& w = slots_[0];
  cudaStream_t s = stream_.get();
  params_.use_model_bucket();
  params_.begin_pass(true);
  params_.enter_layer(first);
  if (embeds_at(c)) {
    // Each TP rank embeds the tokens of its vocabulary rows (zero for the others); the sum over
    // the group is the embedding, wpe (learned positions) added once.
    encoder_forward(a.encoded.get(), a.inputs.get(), param(kWte), tp_.once(param(kWpe)), B_, seq_len_, C, s,
                    vocab_begin(), vl_);
    tp_.reduce(a.encoded.get(), C);
  }
  // The chunk's first layer normalizes its input; every later ln1 (and lnf) comes out of the
  // previous layer's fused residual add + norm.
  norm_rows(layer_slice(a.ln1, 0, NC), layer_slice(a.ln1_mean, 0, Nl), layer_slice(a.ln1_rstd, 0, Nl),
            block_input(a, 0), first, kLn1w);
  for (int j = 0; j < n; ++j) {
    const int l = first + j;
    block_forward(a, l, j);
    matmul_forward(w.branch.get(), layer_slice(a.fch_gelu, j, static_cast<size_t>(N) * hl_), param(kFcprojw, l),
                   tp_.once(param(kFcprojb, l)), N, hl_, C, s);
    const Elem* fcproj = tp_.reduce(w.branch.get(), C);
    Elem* residual3 = a.residual3.get() + j * NlC;
    const Elem* residual2 = layer_slice(a.residual2, j, NlC);
    if (j + 1 < n) {
      params_.enter_layer(l + 1);
      Elem* ln1 = layer_slice(a.ln1, j + 1, NC);
      residual_norm_forward(cfg_, residual3, tp_.local(ln1, C), layer_slice(a.ln1_mean, j + 1, Nl),
                            layer_slice(a.ln1_rstd, j + 1, Nl), residual2, fcproj, param(kLn1w, l + 1),
                            param(kLn1b, l + 1), Nl, s);
      tp_.gather(ln1, C);
    } else if (head_at(c)) {
      residual_norm_forward(cfg_, residual3, tp_.local(a.lnf.get(), C), a.lnf_mean.get(), a.lnf_rstd.get(), residual2,
                            fcproj, param(kLnfw), param(kLnfb), Nl, s);
      tp_.gather(a.lnf.get(), C);
    } else {  // the next stage normalizes it: the same bits as the fused add (residual.cuh)
      residual_forward(residual3, residual2, fcproj, NlC, s);
    }
    params_.leave_layer(l);
  }
}

template <typename Elem>
void Transformer<Elem>::queue_chunk_backward(Activations<Elem>& a, int slot, int c) {
  const int N = rows(), C = cfg_.channels, Nl = tp_.local_rows(), first = chunk_first_[c], n = stage().chunks[c];
  const size_t NC = static_cast<size_t>(N) * C, NlC = static_cast<size_t>(Nl) * C;
  const size_t Ncl = static_cast<size_t>(N) * cl_, Nh = static_cast<size_t>(N) * hl_;
  Activations<Elem>& w = slots_[0];
  cudaStream_t s = stream_.get();
  Elem* dresidual_rows = w.dresidual.get();  // every row, once gathered
  Elem* dresidual = tp_.local(dresidual_rows, C);
  Elem* dbranch = w.branch.get();
  Elem* dwide = w.dwide.get();
  float* scratch = w.scratch.get();
  cuda_check(cudaMemsetAsync(dresidual_rows, 0, w.dresidual.bytes(), s), "zeroing the residual gradient");
  if (head_at(c))
    norm_backward(cfg_, dresidual, grad(kLnfw), grad(kLnfb), scratch, tp_.local(dbranch, C),
                  a.residual3.get() + (n - 1) * NlC, param(kLnfw), a.lnf_mean.get(), a.lnf_rstd.get(), Nl, s);
  else
    cuda_check(cudaMemcpyAsync(dresidual, a.output_grad.get(), a.output_grad.bytes(), cudaMemcpyDeviceToDevice, s),
               "the chunk output's gradient");
  const bool rerun_block = !block_keeps(BlockTensor::other, recompute_);
  const bool recompute_act = !rerun_block && !block_keeps(BlockTensor::fch_gelu, recompute_);
  const bool recompute_ln = !rerun_block && !block_keeps(BlockTensor::ln_output, recompute_);
  // zb-h1: the products' weight gradients wait for queue_chunk_weight_gradients, their output
  // gradients kept for it.
  const bool defer = pipeline_.split_backward;
  const DeferredGradients kept = deferred_gradients(cfg_, B_, seq_len_, tp_.shape());
  auto keep = [&](int j, size_t at, const Elem* g, size_t n) {
    if (defer)
      cuda_check(cudaMemcpyAsync(a.douts.get() + j * kept.per_layer + at, g, n * sizeof(Elem), cudaMemcpyDeviceToDevice, s),
                 "keeping an output gradient for the weight backward");
  };
  auto weight_grad = [&](int tensor, int l) { return defer ? nullptr : grad(tensor, l); };
  params_.begin_pass(false);
  for (int j = n - 1; j >= 0; --j) {
    const int l = first + j;
    grads_.open_layer_gradients(l);  // gradient communication: grad_sync.h
    params_.enter_layer(l);          // ZeRO 3's gathered parameters: model_parameters.h
    const Elem* residual = block_input(a, j);
    Elem* ln1 = layer_slice(a.ln1, j, NC);
    float* ln1_mean = layer_slice(a.ln1_mean, j, Nl);
    float* ln1_rstd = layer_slice(a.ln1_rstd, j, Nl);
    Elem* ln2 = layer_slice(a.ln2, j, NC);
    float* ln2_mean = layer_slice(a.ln2_mean, j, Nl);
    float* ln2_rstd = layer_slice(a.ln2_rstd, j, Nl);
    const Elem* residual2 = layer_slice(a.residual2, j, NlC);
    const Elem* qkv = layer_slice(a.qkv, j, static_cast<size_t>(N) * qkvl_);
    const Elem* atty = layer_slice(a.atty, j, Ncl);
    Elem* fch = layer_slice(a.fch, j, cfg_.mlp_products() * Nh);
    Elem* fch_gelu = layer_slice(a.fch_gelu, j, Nh);
    // A recomputed ln1 or ln2 (norm_forward of the kept, rounded input) equals the forward's
    // fused residual norm output bit for bit, statistics included (kept statistics are
    // rewritten with the values they hold).
    if (rerun_block) {
      norm_rows(ln1, ln1_mean, ln1_rstd, residual, l, kLn1w);
      block_forward(a, l, j);
    }
    if (recompute_act) mlp_activation_forward(cfg_, fch_gelu, fch, N, hl_, s);
    // MLP branch; dresidual = d/d residual3 = d/d fcproj.
    tp_.gather(dresidual_rows, C);
    matmul_backward(dwide, weight_grad(kFcprojw, l), tp_.replicated_grad(grad(kFcprojb, l)), nullptr, dresidual_rows,
                    fch_gelu, param(kFcprojw, l), nullptr, N, hl_, C, s);
    keep(j, kept.fcproj, dresidual_rows, NC);
    if (recompute_ln) norm_rows(ln2, ln2_mean, ln2_rstd, residual2, l, kLn2w);
    mlp_up_backward(cfg_, dbranch, weight_grad(kFcw, l), grad(kFcb, l), weight_grad(kFc2w, l), dwide, fch, ln2,
                    param(kFcw, l), param(kFc2w, l), N, hl_, s, [&] { tp_.start_reduce(dbranch, C); });
    if (cfg_.mlp == Mlp::gelu) keep(j, kept.fc, dwide, Nh);  // GELU's g (SwiGLU's stay in fch)
    norm_backward(cfg_, dresidual, grad(kLn2w, l), grad(kLn2b, l), scratch, tp_.finish_reduce(dbranch, C), residual2,
                  param(kLn2w, l), ln2_mean, ln2_rstd, Nl, s);
    // Attention branch; dresidual = d/d residual2 = d/d attproj.
    tp_.gather(dresidual_rows, C);
    matmul_backward(dbranch, weight_grad(kAttprojw, l), tp_.replicated_grad(grad(kAttprojb, l)), nullptr, dresidual_rows,
                    atty, param(kAttprojw, l), nullptr, N, cl_, C, s);
    keep(j, kept.attproj, dresidual_rows, NC);
    model_attention_backward(attention_, dwide, scratch, dbranch, qkv, atty,
                             layer_slice(a.lse, j, static_cast<size_t>(N) * nhl_), B_, seq_len_, cl_, nhl_, nkvl_, s);
    if (cfg_.positions == Positions::rope)  // d q, d k before the rotation: rotated back
      rope_backward(dwide, dwide, rope_table_.get(), seq_len_, B_, seq_len_, nhl_ + nkvl_, cfg_.head_size(), qkvl_, 0,
                    s);
    if (recompute_ln) norm_rows(ln1, ln1_mean, ln1_rstd, residual, l, kLn1w);
    matmul_backward(dbranch, weight_grad(kQkvw, l), grad(kQkvb, l), nullptr, dwide, ln1, param(kQkvw, l), nullptr, N, C,
                    qkvl_, s, [&] { tp_.start_reduce(dbranch, C); });
    keep(j, kept.qkv, dwide, static_cast<size_t>(N) * qkvl_);
    norm_backward(cfg_, dresidual, grad(kLn1w, l), grad(kLn1b, l), scratch, tp_.finish_reduce(dbranch, C), residual,
                  param(kLn1w, l), ln1_mean, ln1_rstd, Nl, s);
    params_.leave_layer(l);
    grads_.send_finished_bucket(l);  // all-reduce / reduce-scatter once its bucket is done
  }
  if (!embeds_at(c)) return;
  tp_.gather(dresidual_rows, C);
  encoder_backward(grad(kWte), tp_.replicated_grad(grad(kWpe)), scratch, a.buckets.get(), bucket_segments_[slot],
                   dresidual_rows, B_, seq_len_, C, s);
}

template <typename Elem>
void Transformer<Elem>::queue_chunk_weight_gradients(Activations<Elem>& a, int c) {
  const int N = rows(), C = cfg_.channels, first = chunk_first_[c];
  const size_t NC = static_cast<size_t>(N) * C, Nh = static_cast<size_t>(N) * hl_;
  const DeferredGradients kept = deferred_gradients(cfg_, B_, seq_len_, tp_.shape());
  cudaStream_t s = stream_.get();
  for (int j = stage().chunks[c] - 1; j >= 0; --j) {
    const int l = first + j;
    const Elem* g = a.douts.get() + j * kept.per_layer;
    const Elem* ln2 = layer_slice(a.ln2, j, NC);
    const Elem* fch = layer_slice(a.fch, j, cfg_.mlp_products() * Nh);  // SwiGLU: its two products' g
    matmul_weight_gradient(grad(kFcprojw, l), layer_slice(a.fch_gelu, j, Nh), g + kept.fcproj, N, hl_, C, s);
    matmul_weight_gradient(grad(kFcw, l), ln2, cfg_.mlp == Mlp::gelu ? g + kept.fc : fch, N, C, hl_, s);
    if (cfg_.mlp == Mlp::swiglu) matmul_weight_gradient(grad(kFc2w, l), ln2, fch + Nh, N, C, hl_, s);
    matmul_weight_gradient(grad(kAttprojw, l), layer_slice(a.atty, j, static_cast<size_t>(N) * cl_), g + kept.attproj, N,
                           cl_, C, s);
    matmul_weight_gradient(grad(kQkvw, l), layer_slice(a.ln1, j, NC), g + kept.qkv, N, C, qkvl_, s);
  }
}

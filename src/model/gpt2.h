// gpt2.h — the GPT-2 model on the GPU: parameters, AdamW state and activations in device memory,
// and the host code that runs kernels/ for the forward pass, the backward pass and the optimizer
// step. The architecture and parameter layout are gpt2_config.h's, the files model_file.h's, the
// per-micro-batch buffers activations.h's, the gradients and their communication grad_sync.h's.
// Parameters, gradients and activations are Elem (float: --dtype fp32, bf16: the default);
// LayerNorm statistics, attention log-sum-exps, losses, AdamW moments and master weights are fp32.
// Errors throw std::runtime_error: one line naming the file or setting, what was expected and found.
#pragma once
#include "kernels/classifier.cuh"
#include "kernels/common.cuh"
#include "kernels/encoder.cuh"
#include "kernels/gelu.cuh"
#include "kernels/global_norm.cuh"
#include "kernels/layernorm.cuh"
#include "kernels/matmul.cuh"
#include "src/model/activations.h"
#include "src/model/attention.h"
#include "src/dist/comm.h"
#include "src/base/device.h"
#include "src/config/gpt2_config.h"
#include "src/dist/grad_sync.h"
#include "src/model/model_file.h"
#include "src/model/model_parameters.h"
#include "src/model/optimizer.h"
#include "src/base/rng.h"
#include "src/data/upload_staging.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <numeric>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

template <typename Elem>
class GPT2 {
  static_assert(std::is_same<Elem, float>::value || std::is_same<Elem, bf16>::value, "GPT2<Elem>: float or bf16");

 public:
  static constexpr DType dtype = std::is_same<Elem, float>::value ? DType::fp32 : DType::bf16;

  // Allocates parameters, gradients, optimizer state and the activations of one B×seq_len
  // micro-batch (the sequence length is fixed for the model's lifetime) at activation
  // recomputation setting `recompute` (0..3, see kRecomputeMax). Parameters, gradients and
  // optimizer state start at zero: call init_random() or load(). With a communicator of several
  // ranks, gradients are synchronized at `zero_stage` in buckets of ~bucket_mib (grad_sync.h); at
  // stage 3 the parameters are sharded too, `zero3_prefetch` buckets gathered ahead of use
  // (model_parameters.h). The lm head runs in chunks of logits_rows rows (the memory plan's
  // lm_head_chunk_rows).
  GPT2(const GPT2Config& cfg, int B, int seq_len, int recompute = kRecomputeDefault, Communicator* comm = nullptr,
       int zero_stage = 0, const std::string& attention = "auto", double bucket_mib = kDefaultBucketMiB,
       size_t logits_rows = kLogitsChunkRows, int zero3_prefetch = kDefaultZero3Prefetch)
      : cfg_(gpt2_check_micro_batch(cfg, B, seq_len, recompute)),
        layout_(cfg),
        B_(B),
        seq_len_(seq_len),
        recompute_(recompute),
        attention_(choose_attention(attention, dtype, cfg)),
        stream_("creating the model's CUDA stream"),
        grads_(layout_, comm, zero_stage, layers_per_bucket(layout_, bucket_mib, sizeof(Elem)), stream_.get()),
        params_(layout_, grads_, comm, zero3_prefetch, dtype == DType::bf16, stream_.get()) {
    matmul_init();
    const size_t state = grads_.state_count();
    adam_m_ = DeviceArray<float>(state, "AdamW first moments");
    adam_v_ = DeviceArray<float>(state, "AdamW second moments");
    wte_grad_fp32_ = DeviceArray<float>(layout_[kWte].count, "the lm head's fp32 wte gradient");
    adamw_.emplace(layout_, grads_.segments(), [this](const OptimizerSegment& s) { return params_.owned_offset(s); },
                   [this](const OptimizerSegment& s) { return grads_.gradient_offset(s); }, params_.owned_base(),
                   params_.master(), grads_.owned_gradients(), adam_m_.get(), adam_v_.get());
    reset_training_state();
    const ActivationCounts counts = gpt2_activation_counts(cfg_, B_, seq_len_, recompute_, logits_rows);
    acts_ = Activations<Elem>(counts);
    logits_chunk_rows_ = static_cast<int>(counts.logits / cfg_.padded_vocab_size);
    staging_.emplace(counts.tokens, counts.buckets);
  }
  GPT2(const GPT2&) = delete;
  GPT2& operator=(const GPT2&) = delete;
  ~GPT2() {
    cudaStreamSynchronize(stream_.get());
    grads_.wait_idle();
  }

  const GPT2Config& config() const { return cfg_; }
  const ParameterLayout& layout() const { return layout_; }
  int batch_size() const { return B_; }
  int seq_len() const { return seq_len_; }
  int recompute() const { return recompute_; }
  AttentionKernel attention() const { return attention_; }
  cudaStream_t stream() const { return stream_.get(); }
  int zero_stage() const { return grads_.zero_stage(); }
  // The parameters whose optimizer state this rank holds (at ZeRO 0: all), in state order.
  const GradientSync<Elem>& gradient_sync() const { return grads_; }

  // Device buffers for checkpoints: the parameters in llm.c order (nullptr at ZeRO 3, where no rank
  // holds them all), the parameters of an optimizer segment, the state (master weights: nullptr
  // for Elem = float).
  Elem* params_device() const { return params_.full(); }
  Elem* owned_parameters(const OptimizerSegment& s) const { return params_.owned(s); }
  // Parameters written through owned_parameters() are in place: ZeRO 3's gathers read them from now on.
  void parameters_written() { params_.changed(); }
  float* adam_m_device() const { return adam_m_.get(); }
  float* adam_v_device() const { return adam_v_.get(); }
  float* master_device() const { return params_.master(); }

  // GPT-2's initialization from `seed` (gpt2_initial_values); bf16 parameters are the values
  // rounded to nearest, the master weights the fp32 values. Gradients and optimizer state are reset.
  void init_random(uint64_t seed) {
    NormalSampler normal(seed);
    for (int i = 0; i < kNumParameterTensors; ++i) params_.upload_tensor(i, gpt2_initial_values(layout_, i, normal));
    reset_training_state();
  }

  // Reads an llm.c model file: version 3 (fp32) or 5 (bf16) into either dtype. Its header must
  // describe this model's configuration. fp32 values load into bf16 parameters rounded to nearest
  // (the master weights keep the fp32 values); bf16 values load into fp32 exactly. Gradients and
  // optimizer state are reset.
  void load(const std::string& path) {
    const ModelFileInfo info = read_model_file_info(path);
    if (info.config != cfg_)
      throw std::runtime_error(path + ": model file has " + describe(info.config) + ", expected " + describe(cfg_) +
                               " (the configuration this model was built with)");
    read_model_tensors(path, info, [&](int i, const std::vector<float>& values) { params_.upload_tensor(i, values); });
    reset_training_state();
  }

  // Writes an llm.c model file of `file_dtype` values (version 3 fp32, 5 bf16) atomically
  // (durable_file.h), on the ranks that are `writer`s. At ZeRO 3 every rank calls it (the
  // parameters are gathered bucket by bucket).
  void save(const std::string& path, DType file_dtype = dtype, bool writer = true) const {
    params_.save(path, cfg_, file_dtype, writer);
  }
  // Every parameter in llm.c order into device memory `dst` (nullptr: take part only; at ZeRO 3
  // a collective).
  void gather_parameters(Elem* dst) const { params_.copy_all(dst, cudaMemcpyDeviceToDevice); }

  // Forward pass over one micro-batch of host tokens (B·T each, row-major [B][T]). Returns the
  // mean cross-entropy over the B·T positions and keeps the logits of the last chunk of rows
  // (logits()). targets may be nullptr (no loss: returns NaN).
  float forward(const int* inputs, const int* targets) {
    upload_tokens(inputs, targets, false);
    queue_forward();
    queue_head(targets != nullptr, 0.0f, false);
    if (targets == nullptr) {
      cuda_check(cudaStreamSynchronize(stream_.get()), "forward pass");
      return std::numeric_limits<float>::quiet_NaN();
    }
    return mean_loss();
  }

  // Forward pass, then the gradient of (mean loss / grad_accum_steps) ADDED to the parameter
  // gradients (call zero_grad() before the first micro-step of an optimizer step); the micro-batch's
  // losses are added to the step's, on the device (step_figures(); mean_loss() for this micro-batch
  // alone). Overwrites the logits with their gradient. With several ranks, the
  // micro-step with last_micro_step = true also averages the accumulated gradients over the ranks
  // (onto their owners at ZeRO stage 1), overlapped with its backward pass; earlier micro-steps
  // only accumulate locally (grad_sync.h).
  void forward_backward(const int* inputs, const int* targets, int grad_accum_steps, bool last_micro_step = true) {
    if (targets == nullptr) throw std::runtime_error("forward_backward: targets are required");
    micro_step(inputs, targets, nullptr, grad_accum_steps, last_micro_step);
  }
  // The same from a loader's batch: ids checked against this model's vocabulary and encoder
  // buckets built by batch_preparer() on the loader thread are not checked or built again.
  void forward_backward(const TokenBatch& batch, int grad_accum_steps, bool last_micro_step = true) {
    if (batch.inputs.size() != static_cast<size_t>(rows()) || batch.targets.size() != static_cast<size_t>(rows()))
      throw std::runtime_error("forward_backward: a batch of " + std::to_string(batch.inputs.size()) + " tokens, expected B*T = " +
                               std::to_string(rows()));
    micro_step(batch.inputs.data(), batch.targets.data(), &batch, grad_accum_steps, last_micro_step);
  }

  // The host work a micro-batch needs before its upload, for DataLoader::set_prepare.
  std::function<void(TokenBatch&)> batch_preparer() const {
    return encoder_buckets_preparer(B_, seq_len_, cfg_.vocab_size);
  }

  // Starts an optimizer step: gradients and the step's loss sum to zero.
  void zero_grad() {
    grads_.zero();
    cuda_check(cudaMemsetAsync(step_scalars_.get(), 0, step_scalars_.bytes(), stream_.get()), "zeroing the step's loss");
    micro_steps_ = 0;
  }

  // The figures of the optimizer step whose micro-steps are queued, copied to the host together:
  // the step's one host synchronisation. loss: the mean over every micro-step's tokens on every
  // rank; grad_norm: the global norm of the accumulated gradients; summed_with_loss: the caller's `with_loss` summed over the
  // ranks in the loss's all-reduce (the trainer's stop votes: every rank learns them without a
  // synchronisation of their own).
  struct StepFigures {
    double loss, summed_with_loss;  // adjacent: copied back together from step_scalars_
    float grad_norm;
  };
  StepFigures step_figures(double with_loss = 0.0) {
    queue_norm_squared();
    StepFigures* host = figures_host_.get();
    host->summed_with_loss = with_loss;
    cuda_check(cudaMemcpyAsync(step_scalars_.get() + 1, &host->summed_with_loss, sizeof(double),
                               cudaMemcpyHostToDevice, stream_.get()),
               "uploading the value summed with the loss");
    grads_.sum_over_ranks(step_scalars_.get(), kStepScalars);
    cuda_check(cudaMemcpyAsync(&host->loss, step_scalars_.get(), step_scalars_.bytes(), cudaMemcpyDeviceToHost,
                               stream_.get()),
               "copying the step's loss");
    cuda_check(cudaMemcpyAsync(&host->grad_norm, acts_.norm_squared.get(), sizeof(float), cudaMemcpyDeviceToHost,
                               stream_.get()),
               "copying the gradient norm");
    cuda_check(cudaStreamSynchronize(stream_.get()), "the step's figures");
    return {host->loss / (static_cast<double>(rows()) * micro_steps_ * grads_.world_size()), host->summed_with_loss,
            std::sqrt(host->grad_norm)};
  }

  // One optimizer step (step is 1-based) from the accumulated gradients: AdamW with clipping
  // (optimizer.h) given step_figures()' gradient norm. Data parallel: the update waits for the
  // gradient communication; with sharded optimizer state each rank updates its shard, then the
  // parameters are all-gathered (at ZeRO 3 they stay sharded: the next pass gathers them).
  void apply_update(const OptimizerSettings& opt, float lr, int step, float norm) {
    adamw_->step(opt, lr, step, norm, stream_.get());
    if (params_.sharded()) params_.changed();
    else grads_.gather_parameters(params_.full());
  }

  // The mean loss of the last forward() or forward_backward() micro-batch: its per-position losses
  // summed on the host in position order (double). Waits for the device.
  float mean_loss() const {
    const std::vector<float> losses = position_losses();
    return static_cast<float>(std::accumulate(losses.begin(), losses.end(), 0.0) / rows());
  }

  // The B·T per-position losses of the last forward() or forward_backward() (row-major [B][T]).
  // Waits for the device.
  std::vector<float> position_losses() const { return copy_floats_to_host(acts_.losses.get(), rows(), stream_.get()); }

  size_t num_parameters() const { return layout_.total; }
  // Device bytes of the parameters (at ZeRO 3: the shard and the gather windows) and master weights.
  size_t parameter_bytes() const { return params_.bytes(); }

  // Host copies as float, llm.c order (at ZeRO 3 a collective).
  std::vector<float> parameters() const { return params_.host_floats(); }
  // (At ZeRO stages 2 and 3 no rank holds them all: throws.)
  std::vector<float> gradients() const { return grads_.llmc_order(stream_.get()); }
  // The logits of the last forward(): rows [N - r, N) of the micro-batch, r = N mod the lm head's
  // chunk rows (or those rows), which is every row when B·T <= that.
  // After forward_backward() they hold the logits' gradients.
  std::vector<float> logits() const {
    const size_t chunk = static_cast<size_t>(logits_chunk_rows_);
    const size_t last_chunk = rows() - (rows() - 1) / chunk * chunk;
    return copy_floats_to_host(acts_.logits.get(), last_chunk * cfg_.padded_vocab_size, stream_.get());
  }

  // Replaces all parameters (llm.c order, as float; rounded to nearest for bf16, master weights get
  // the float values). Gradients and optimizer state are kept.
  void set_parameters(const std::vector<float>& values) { params_.upload_all(values); }

  // Device memory of the activations: gpt2_activation_bytes(...).total(). (All of it: memory_plan.h.)
  size_t activation_bytes() const { return acts_.bytes(); }

  // Rows per lm-head chunk (queue_head): the logits buffer's height (min(B·T, the constructor's
  // logits_rows)), or fewer: more chunks, the same results (tested).
  void set_logits_chunk_rows(int rows) {
    const size_t capacity = acts_.logits.count() / cfg_.padded_vocab_size;
    if (rows < 1 || static_cast<size_t>(rows) > capacity)
      throw std::runtime_error("set_logits_chunk_rows: " + std::to_string(rows) + " rows, expected 1.." +
                               std::to_string(capacity));
    logits_chunk_rows_ = rows;
  }
  int logits_chunk_rows() const { return logits_chunk_rows_; }
  // The lm head's chunks per micro-step: its products and classifier launches each run this often.
  int lm_head_chunks() const { return ceil_div(rows(), logits_chunk_rows_); }
  // Kernel launches of the encoder's backward per micro-step (encoder.cuh).
  int encoder_backward_launches() const { return ::encoder_backward_launches(B_, seq_len_); }

 private:
  int rows() const { return B_ * seq_len_; }

  void reset_training_state() {
    zero_grad();
    cuda_check(cudaMemsetAsync(adam_m_.get(), 0, adam_m_.bytes(), stream_.get()), "zeroing AdamW moments");
    cuda_check(cudaMemsetAsync(adam_v_.get(), 0, adam_v_.bytes(), stream_.get()), "zeroing AdamW moments");
    cuda_check(cudaStreamSynchronize(stream_.get()), "resetting training state");
  }

  // One micro-step of forward_backward; `prepared`: the loader's batch the tokens come from, or nullptr.
  void micro_step(const int* inputs, const int* targets, const TokenBatch* prepared, int grad_accum_steps,
                  bool last_micro_step) {
    if (grad_accum_steps < 1)
      throw std::runtime_error("gradient accumulation: expected at least 1 micro-step, found " +
                               std::to_string(grad_accum_steps));
    upload_tokens(inputs, targets, true, prepared);
    queue_forward();
    const float dloss = 1.0f / (static_cast<float>(rows()) * static_cast<float>(grad_accum_steps) * grads_.ranks_summed());
    grads_.begin_micro_step(last_micro_step);
    queue_head(true, dloss, true);
    classifier_loss_sum(step_scalars_.get(), acts_.losses.get(), rows(), stream_.get());
    ++micro_steps_;
    queue_backward();
    grads_.end_micro_step();
  }

  // Checks the micro-batch's tokens and queues their upload (with `buckets`, also the encoder-
  // backward buckets) from page-locked staging: the host does not wait. What the loader thread did
  // already (`prepared`) is not done again (upload_staging.h).
  void upload_tokens(const int* inputs, const int* targets, bool buckets, const TokenBatch* prepared = nullptr) {
    const int n = staging_->upload_micro_batch(inputs, targets, prepared, B_, seq_len_, cfg_.vocab_size,
                                               acts_.inputs.get(), acts_.targets.get(),
                                               buckets ? acts_.buckets.get() : nullptr, stream_.get());
    if (buckets) bucket_segments_ = n;
  }

  // The squared global norm of the accumulated gradients into acts_.norm_squared, on the device,
  // after the gradient communication (summed over ranks' shards when they are sharded).
  void queue_norm_squared() {
    grads_.wait_for_gradients();
    float* norm_squared = acts_.norm_squared.get();
    cuda_check(cudaMemsetAsync(norm_squared, 0, sizeof(float), stream_.get()), "gradient norm");
    for (const auto& [offset, count] : grads_.owned_gradient_ranges())
      global_norm_squared(norm_squared, acts_.scratch.get(), grads_.owned_gradients() + offset, count, stream_.get());
    grads_.sum_norm_squared(norm_squared);
  }

  // Tensor `tensor`'s parameters (layer `layer`'s slice of a per-layer tensor) and its gradient.
  const Elem* param(int tensor, int layer = 0) const { return params_.at(tensor, layer); }
  Elem* grad(int tensor, int layer = 0) const { return grads_.at(tensor, layer); }

  // Layer l's input: the embeddings for layer 0, else the previous layer's output.
  const Elem* block_input(int l) const {
    return l == 0 ? acts_.encoded.get() : acts_.residual3.get() + static_cast<size_t>(l - 1) * rows() * cfg_.channels;
  }

  // Layer l's forward from its ln1 output (already in place) to its GELU output: everything the
  // backward reads except ln1. The attention projection's output is left in a.branch.
  void block_forward(int l) {
    const int N = rows(), C = cfg_.channels, NH = cfg_.num_heads;
    const size_t NC = static_cast<size_t>(N) * C;
    Activations<Elem>& a = acts_;
    cudaStream_t s = stream_.get();
    Elem* qkv = layer_slice(a.qkv, l, 3 * NC);
    Elem* atty = layer_slice(a.atty, l, NC);
    Elem* fch = layer_slice(a.fch, l, 4 * NC);
    matmul_forward(qkv, layer_slice(a.ln1, l, NC), param(kQkvw, l), param(kQkvb, l), N, C, 3 * C, s);
    model_attention_forward(attention_, atty, layer_slice(a.lse, l, static_cast<size_t>(N) * NH), qkv, B_, seq_len_, C,
                            NH, s);
    matmul_forward(a.branch.get(), atty, param(kAttprojw, l), param(kAttprojb, l), N, C, C, s);
    residual_layernorm_forward(layer_slice(a.residual2, l, NC), layer_slice(a.ln2, l, NC),
                               layer_slice(a.ln2_mean, l, N), layer_slice(a.ln2_rstd, l, N), block_input(l),
                               a.branch.get(), param(kLn2w, l), param(kLn2b, l), N, C, s);
    // GELU as its own kernel on the rounded pre-activation (not cuBLASLt's GELU epilogue on the
    // fp32 product), so that recomputing it from the kept fch reproduces the same bits.
    matmul_forward(fch, layer_slice(a.ln2, l, NC), param(kFcw, l), param(kFcb, l), N, C, 4 * C, s);
    gelu_forward(layer_slice(a.fch_gelu, l, 4 * NC), fch, 4 * NC, s);
  }

  void queue_forward() {
    const int N = rows(), C = cfg_.channels, L = cfg_.num_layers;
    const size_t NC = static_cast<size_t>(N) * C;
    Activations<Elem>& a = acts_;
    cudaStream_t s = stream_.get();
    params_.use_model_bucket();
    params_.begin_pass(true);
    params_.enter_layer(0);
    encoder_forward(a.encoded.get(), a.inputs.get(), param(kWte), param(kWpe), B_, seq_len_, C, s);
    // Layer 0 normalizes the embeddings; every later ln1 (and lnf) comes out of the previous
    // layer's fused residual add + LayerNorm.
    layernorm_forward(layer_slice(a.ln1, 0, NC), layer_slice(a.ln1_mean, 0, N), layer_slice(a.ln1_rstd, 0, N),
                      a.encoded.get(), param(kLn1w), param(kLn1b), N, C, s);
    for (int l = 0; l < L; ++l) {
      block_forward(l);
      matmul_forward(a.branch.get(), layer_slice(a.fch_gelu, l, 4 * NC), param(kFcprojw, l), param(kFcprojb, l), N,
                     4 * C, C, s);
      Elem* residual3 = a.residual3.get() + l * NC;
      if (l + 1 < L) {
        params_.enter_layer(l + 1);
        residual_layernorm_forward(residual3, layer_slice(a.ln1, l + 1, NC), layer_slice(a.ln1_mean, l + 1, N),
                                   layer_slice(a.ln1_rstd, l + 1, N), layer_slice(a.residual2, l, NC), a.branch.get(),
                                   param(kLn1w, l + 1), param(kLn1b, l + 1), N, C, s);
      } else {
        residual_layernorm_forward(residual3, a.lnf.get(), a.lnf_mean.get(), a.lnf_rstd.get(),
                                   layer_slice(a.residual2, l, NC), a.branch.get(), param(kLnfw), param(kLnfb), N, C,
                                   s);
      }
      params_.leave_layer(l);
    }
  }

  // The tied lm head (over all Vp columns; the zero padding rows of wte give zero padding logits)
  // and the classifier, chunk by chunk of rows. With `losses`, each row's loss; with `train`, the
  // classifier leaves dloss·dlogits in the chunk, and the chunk's share of the lm-head backward
  // runs at once: its rows of d lnf (written into a.branch, which queue_backward reads) and its
  // product summed in fp32 over the chunks, then added to the wte gradient with one rounding
  // (so the gradient's precision does not depend on the number of chunks).
  void queue_head(bool losses, float dloss, bool train) {
    const int N = rows(), C = cfg_.channels, Vp = cfg_.padded_vocab_size;
    const int chunk = logits_chunk_rows_;
    Activations<Elem>& a = acts_;
    if (train) cuda_check(cudaMemsetAsync(wte_grad_fp32_.get(), 0, wte_grad_fp32_.bytes(), stream_.get()),
                          "zeroing the lm head's fp32 wte gradient");
    for (int r = 0; r < N; r += chunk) {
      const int n = std::min(chunk, N - r);
      const size_t offset = static_cast<size_t>(r) * C;
      matmul_forward(a.logits.get(), a.lnf.get() + offset, param(kWte), nullptr, n, C, Vp, stream_.get());
      if (!losses) continue;
      fused_classifier(a.logits.get(), a.losses.get() + r, a.targets.get() + r, n, cfg_.vocab_size, Vp, dloss, train,
                       stream_.get());
      if (train)
        matmul_backward<Elem, float>(a.branch.get() + offset, wte_grad_fp32_.get(), nullptr, nullptr, a.logits.get(),
                        a.lnf.get() + offset, param(kWte), nullptr, n, C, Vp, stream_.get());
    }
    if (train) matmul_add_weight_gradient(grad(kWte), wte_grad_fp32_.get(), wte_grad_fp32_.count(), stream_.get());
  }

  // Backward from d lnf, which queue_head left in a.branch. Parameter gradients accumulate;
  // dresidual holds d loss / d (residual stream) at the current depth: the skip connections pass
  // it through unchanged and each LayerNorm backward adds its branch's share. Activations the
  // recompute setting did not keep are recomputed into their layer slice right before they are
  // read (a.branch, a.dwide and the scratch are free at the start of each layer).
  void queue_backward() {
    const int N = rows(), C = cfg_.channels, NH = cfg_.num_heads, L = cfg_.num_layers;
    const size_t NC = static_cast<size_t>(N) * C;
    Activations<Elem>& a = acts_;
    cudaStream_t s = stream_.get();
    Elem* dresidual = a.dresidual.get();
    Elem* dbranch = a.branch.get();
    Elem* dwide = a.dwide.get();
    float* scratch = a.scratch.get();
    cuda_check(cudaMemsetAsync(dresidual, 0, a.dresidual.bytes(), s), "zeroing the residual gradient");

    layernorm_backward(dresidual, grad(kLnfw), grad(kLnfb), scratch, dbranch, a.residual3.get() + (L - 1) * NC,
                       param(kLnfw), a.lnf_mean.get(), a.lnf_rstd.get(), N, C, s);
    const bool rerun_block = !block_keeps(BlockTensor::other, recompute_);
    const bool recompute_gelu = !rerun_block && !block_keeps(BlockTensor::fch_gelu, recompute_);
    const bool recompute_ln = !rerun_block && !block_keeps(BlockTensor::ln_output, recompute_);
    params_.begin_pass(false);
    for (int l = L - 1; l >= 0; --l) {
      grads_.open_layer_gradients(l);  // gradient communication: grad_sync.h
      params_.enter_layer(l);          // ZeRO 3's gathered parameters: model_parameters.h
      const Elem* residual = block_input(l);
      Elem* ln1 = layer_slice(a.ln1, l, NC);
      float* ln1_mean = layer_slice(a.ln1_mean, l, N);
      float* ln1_rstd = layer_slice(a.ln1_rstd, l, N);
      Elem* ln2 = layer_slice(a.ln2, l, NC);
      float* ln2_mean = layer_slice(a.ln2_mean, l, N);
      float* ln2_rstd = layer_slice(a.ln2_rstd, l, N);
      const Elem* residual2 = layer_slice(a.residual2, l, NC);
      const Elem* qkv = layer_slice(a.qkv, l, 3 * NC);
      const Elem* atty = layer_slice(a.atty, l, NC);
      const Elem* fch = layer_slice(a.fch, l, 4 * NC);
      Elem* fch_gelu = layer_slice(a.fch_gelu, l, 4 * NC);
      // A recomputed ln1 or ln2 (layernorm_forward of the kept, rounded input) equals the forward's
      // fused residual LayerNorm output bit for bit, statistics included (kept statistics are
      // rewritten with the values they hold).
      if (rerun_block) {
        layernorm_forward(ln1, ln1_mean, ln1_rstd, residual, param(kLn1w, l), param(kLn1b, l), N, C, s);
        block_forward(l);
      }
      if (recompute_gelu) gelu_forward(fch_gelu, fch, 4 * NC, s);
      // MLP branch; dresidual = d/d residual3 = d/d fcproj.
      matmul_backward(dwide, grad(kFcprojw, l), grad(kFcprojb, l), nullptr, dresidual, fch_gelu, param(kFcprojw, l),
                      nullptr, N, 4 * C, C, s);
      if (recompute_ln)
        layernorm_forward(ln2, ln2_mean, ln2_rstd, residual2, param(kLn2w, l), param(kLn2b, l), N, C, s);
      matmul_backward(dbranch, grad(kFcw, l), grad(kFcb, l), dwide, dwide, ln2, param(kFcw, l), fch, N, C, 4 * C, s);
      layernorm_backward(dresidual, grad(kLn2w, l), grad(kLn2b, l), scratch, dbranch, residual2, param(kLn2w, l),
                         ln2_mean, ln2_rstd, N, C, s);
      // Attention branch; dresidual = d/d residual2 = d/d attproj.
      matmul_backward(dbranch, grad(kAttprojw, l), grad(kAttprojb, l), nullptr, dresidual, atty, param(kAttprojw, l),
                      nullptr, N, C, C, s);
      model_attention_backward(attention_, dwide, scratch, dbranch, qkv, atty,
                               layer_slice(a.lse, l, static_cast<size_t>(N) * NH), B_, seq_len_, C, NH, s);
      if (recompute_ln) layernorm_forward(ln1, ln1_mean, ln1_rstd, residual, param(kLn1w, l), param(kLn1b, l), N, C, s);
      matmul_backward(dbranch, grad(kQkvw, l), grad(kQkvb, l), nullptr, dwide, ln1, param(kQkvw, l), nullptr, N, C,
                      3 * C, s);
      layernorm_backward(dresidual, grad(kLn1w, l), grad(kLn1b, l), scratch, dbranch, residual, param(kLn1w, l),
                         ln1_mean, ln1_rstd, N, C, s);
      params_.leave_layer(l);
      grads_.send_finished_bucket(l);  // all-reduce / reduce-scatter once its bucket is done
    }
    encoder_backward(grad(kWte), grad(kWpe), scratch, a.buckets.get(), bucket_segments_, dresidual, B_, seq_len_, C,
                     s);
  }

  const GPT2Config cfg_;
  const ParameterLayout layout_;
  const int B_, seq_len_, recompute_;
  const AttentionKernel attention_;
  CudaStream stream_;
  GradientSync<Elem> grads_;
  ModelParameters<Elem> params_;
  DeviceArray<float> adam_m_, adam_v_, wte_grad_fp32_;  // wte's: the lm head's share, (Vp, C)
  std::optional<AdamWUpdate<Elem>> adamw_;  // emplaced once the buffers it updates exist
  int logits_chunk_rows_ = 0;  // set once the logits buffer is allocated
  Activations<Elem> acts_;
  std::optional<UploadStaging> staging_;  // emplaced once the activation counts are known
  int bucket_segments_ = 0;  // of the uploaded encoder-backward bucket list
  DeviceArray<double> step_scalars_{kStepScalars, "the step's loss sum and stop votes"};
  int micro_steps_ = 0;  // since zero_grad()
  PinnedArray<StepFigures> figures_host_{1, "allocating pinned memory for the step's figures"};
};

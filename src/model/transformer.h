// transformer.h — the model on the GPU, one transformer for GPT-2 and Llama 3: parameters, AdamW
// state and activations in device memory, and the host code that runs kernels/ for the forward
// pass, the backward pass and the optimizer step. The architecture and parameter layout are
// model_config.h's, the passes' kernels transformer_passes.h's, the architecture's norm and MLP
// block_ops.h's, the files model_file.h's, the per-micro-batch buffers activations.h's, the
// gradients and their communication grad_sync.h's, the lm head lm_head.h's; a tensor-parallel
// rank's part of each layer, and a pipeline stage's layers: tensor_split.h; a context-parallel
// rank's tokens of each sequence: context_split.h, its attention: context_attention.h. Parameters,
// gradients and activations are Elem (float: --dtype fp32, bf16: the default); norm statistics, the
// RoPE table, attention log-sum-exps, losses, AdamW moments and master weights are fp32. Errors
// throw std::runtime_error: one line naming the file or setting, what was expected and found.
#pragma once
#include "kernels/common.cuh"
#include "kernels/encoder.cuh"
#include "kernels/matmul.cuh"
#include "kernels/residual.cuh"
#include "kernels/rope.cuh"
#include "src/model/activations.h"
#include "src/model/attention.h"
#include "src/model/block_ops.h"
#include "src/model/fp8_state.h"
#include "src/model/context_attention.h"
#include "src/model/expert_bias.h"
#include "src/model/expert_parallel.h"
#include "src/model/lm_head.h"
#include "src/dist/comm.h"
#include "src/data/context_split.h"
#include "src/base/device.h"
#include "src/config/model_config.h"
#include "src/dist/grad_sync.h"
#include "src/dist/tensor_split.h"
#include "src/dist/tp_collectives.h"
#include "src/model/model_source.h"
#include "src/model/model_parameters.h"
#include "src/model/optimizer.h"
#include "src/model/step_totals.h"
#include "src/model/transformer_passes.h"
#include "src/base/rng.h"
#include "src/data/upload_staging.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <numeric>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

template <typename Elem>
class Transformer {
  static_assert(std::is_same<Elem, float>::value || std::is_same<Elem, bf16>::value, "Transformer<Elem>: float or bf16");

 public:
  static constexpr DType dtype = std::is_same<Elem, float>::value ? DType::fp32 : DType::bf16;

  // Allocates parameters, gradients, optimizer state and the activations of one B×seq_len
  // micro-batch (the sequence length is fixed for the model's lifetime) at activation
  // recomputation setting `recompute` (0..3, see kRecomputeMax). Parameters, gradients and
  // optimizer state start at zero: call init_random() or load(). With a communicator of several
  // ranks, gradients are synchronized at `zero_stage` in buckets of ~bucket_mib (grad_sync.h); at
  // stage 3 the parameters are sharded too, `zero3_prefetch` buckets gathered ahead of use
  // (model_parameters.h). The lm head runs in chunks of logits_rows rows (the memory plan's
  // lm_head_chunk_rows). With a tensor-parallel communicator `tp_comm` of several ranks, `comm` is
  // this rank's data-parallel group and each layer is split over the TP group (tensor_split.h,
  // tp_collectives.h), its LayerNorm/residual region too when `sequence_parallel`. With `pipeline`
  // (tensor_split.h's PipelineParts) the rank holds its stage's part and keeps pipeline.in_flight
  // activation sets, one per chunk pass between its forward and its backward (pipeline_step.h).
  // With a context-parallel communicator `cp_comm` of N ranks the rank holds its T/N tokens of each
  // sequence (context_split.h) and its attention passes K/V around the group (context_attention.h);
  // `comm` then includes the CP group's ranks (parallel_groups.h). The model still takes and gives
  // [B][T] micro-batches and losses: each rank uploads its tokens, and losses are gathered. With
  // `fp8` (bf16 only) the blocks' Linear products run in FP8 (fp8_state.h). With an expert-parallel
  // communicator `ep_comm` (--ep) the rank holds its E/size experts and `comm` is its expert-DP group
  // (parallel_groups.h); each mixture layer sends rows to their experts (expert_parallel.h).
  Transformer(const ModelConfig& cfg, int B, int seq_len, int recompute = kRecomputeDefault, Communicator* comm = nullptr,
       int zero_stage = 0, const std::string& attention = "auto", double bucket_mib = kDefaultBucketMiB,
       size_t logits_rows = kLogitsChunkRows, int zero3_prefetch = kDefaultZero3Prefetch,
       Communicator* tp_comm = nullptr, bool sequence_parallel = false, const PipelineParts& pipeline = {},
       Communicator* cp_comm = nullptr, const std::optional<Fp8Settings>& fp8 = std::nullopt,
       Communicator* ep_comm = nullptr)
      : cfg_(check_micro_batch(cfg, B, seq_len, recompute)),
        pipeline_(pipeline.stages.empty() ? PipelineParts::whole(cfg.num_layers) : pipeline),
        split_(tensor_split_of(cfg, tp_comm, pipeline_.mine(), ep_comm)),
        layout_(split_.local()),
        context_(cp_comm != nullptr ? cp_comm->world_size() : 1, cp_comm != nullptr ? cp_comm->rank() : 0, seq_len),
        cp_(context_.ranks > 1 ? cp_comm : nullptr),
        B_(B),
        seq_len_(context_.local_len()),
        recompute_(recompute),
        attention_(choose_attention(attention, dtype, cfg)),
        stream_("creating the model's CUDA stream"),
        tp_(tp_comm, sequence_parallel, B * context_.local_len(), stream_.get()),
        cl_(cfg.channels / split_.size()),
        nhl_(cfg.num_heads / split_.size()),
        nkvl_(cfg.kv_heads() / split_.size()),
        qkvl_(cfg.qkv_channels() / split_.size()),
        hl_(cfg.hidden() / split_.size()),
        vl_(cfg.padded_vocab_size / split_.size()),
        grads_(layout_, comm, zero_stage, layers_per_bucket(layout_, bucket_mib, sizeof(Elem)), stream_.get(),
               tp_comm, tp_.sequence_parallel(), {pipeline_.comm, pipeline_.tied, stage().embedding}, ep_comm),
        params_(split_, grads_, comm, tp_comm, ep_comm, pipeline_, zero3_prefetch,
                dtype == DType::bf16, stream_.get()) {
    matmul_init();
    const size_t state = grads_.state_count();
    adam_m_ = DeviceArray<float>(state, "AdamW first moments");
    adam_v_ = DeviceArray<float>(state, "AdamW second moments");
    adamw_.emplace(layout_, grads_.segments(), [this](const OptimizerSegment& s) { return params_.owned_offset(s); },
                   [this](const OptimizerSegment& s) { return grads_.gradient_offset(s); }, params_.owned_base(),
                   params_.master(), grads_.owned_gradients(), adam_m_.get(), adam_v_.get());
    if (fp8) {
      if (dtype != DType::bf16) throw std::runtime_error("--fp8 needs bf16 parameters and activations");
      fp8_.emplace(*fp8, std::accumulate(stage().chunks.begin(), stage().chunks.end(), 0), rows(),
                   fp8_product_shapes(cfg_, split_.size()), tp_comm, comm, stream_.get());
    }
    if (cfg_.moe()) experts_ = ExpertStep(static_cast<int>(stage().layers.size()), cfg_.num_experts);
    if (split_.ep_size() > 1)
      ep_ = std::make_unique<ExpertParallelism<Elem>>(ep_comm, cfg_.num_experts, pipeline_.in_flight, cfg_.num_layers);
    expert_bias_ = ExpertBiasUpdate<Elem>(cfg_, static_cast<int>(stage().layers.size()), layout_, grads_.segments(),
                                          params_, {comm, ep_comm, tp_.comm()});
    reset_training_state();
    for (int c = 0, first = 0; c < static_cast<int>(stage().chunks.size()); first += stage().chunks[c++])
      chunk_first_.push_back(first);
    ModelConfig chunk = cfg_;  // an activation set holds the rank's largest chunk's layers
    chunk.num_layers = *std::max_element(stage().chunks.begin(), stage().chunks.end());
    ActivationCounts counts = activation_counts(chunk, B_, seq_len_, recompute_, logits_rows, tp_.shape(), split_.ep_size());
    if (pipeline_.split_backward) {
      if (recompute_ != 0)
        throw std::runtime_error("zb-h1: the weight backward reads each product's input after the input backward; "
                                 "it needs --recompute 0");
      counts.douts = chunk.num_layers * deferred_gradients(cfg_, B_, seq_len_, tp_.shape()).per_layer;
    }
    const bool piped = pipeline_.comm != nullptr;
    for (int k = 0; k < (piped ? pipeline_.in_flight : 1); ++k)
      slots_.emplace_back(piped ? pipeline_slot_counts(counts, k == 0, stage().head) : counts);
    bucket_segments_.assign(slots_.size(), 0);
    head_ = LmHead<Elem>(slots_[0], cfg_.vocab_size, vocab_begin(), vl_, stage().head ? layout_[lm_head_tensor()].count : 0);
    staging_.emplace(counts.tokens, counts.buckets);
    if (cfg_.positions == Positions::rope) {
      rope_table_ = DeviceArray<float>(static_cast<size_t>(seq_len) * cfg_.head_size(), "the RoPE table");
      upload_floats(rope_table_.get(), rope_table(cfg_.rope, cfg_.head_size(), seq_len), "the RoPE table");
    }
    local_inputs_.resize(rows());
    local_targets_.resize(rows());
    if (cp_ != nullptr) {
      ring_.emplace(*cp_, attention_, B_, context_.chunk_len(), cl_, nhl_, nkvl_, stream_.get());
      gathered_losses_ = DeviceArray<float>(static_cast<size_t>(B_) * seq_len, "the context-parallel group's losses");
    }
  }
  Transformer(const Transformer&) = delete;
  Transformer& operator=(const Transformer&) = delete;
  ~Transformer() {
    cudaStreamSynchronize(stream_.get());
    grads_.wait_idle();
  }

  const ModelConfig& config() const { return cfg_; }
  // This rank's parameter layout (its tensor-parallel part: tensor_split.h).
  const ParameterLayout& layout() const { return layout_; }
  const TensorSplit& tensor_split() const { return split_; }
  const TensorParallelism& tensor_parallelism() const { return tp_.shape(); }
  int batch_size() const { return B_; }
  int seq_len() const { return context_.seq_len(); }  // the sequences' (this rank holds seq_len() / CP of each)
  const ContextSplit& context_split() const { return context_; }
  int recompute() const { return recompute_; }
  AttentionKernel attention() const { return attention_; }
  cudaStream_t stream() const { return stream_.get(); }
  int zero_stage() const { return grads_.zero_stage(); }
  // The parameters whose optimizer state this rank holds (at ZeRO 0: all), in state order.
  const GradientSync<Elem>& gradient_sync() const { return grads_; }

  // Device buffers for checkpoints: every parameter in llm.c order (nullptr at ZeRO 3 or with
  // tensor or pipeline parallelism, where no rank holds them all), the parameters of an optimizer segment, the
  // state (master weights: nullptr for Elem = float).
  Elem* params_device() const { return split_.whole() ? params_.full() : nullptr; }
  Elem* owned_parameters(const OptimizerSegment& s) const { return params_.owned(s); }
  // Parameters written through owned_parameters() are in place: ZeRO 3's gathers read them from now on.
  void parameters_written() {
    params_.changed();
    if (fp8_) fp8_->weights_changed();
  }
  // The FP8 state (nullptr without --fp8): its scales and histories are checkpointed.
  Fp8State* fp8_state() { return fp8_ ? &*fp8_ : nullptr; }
  const Fp8State* fp8_state() const { return fp8_ ? &*fp8_ : nullptr; }
  // With experts: the routing figures of the step since zero_grad() (expert_mlp.h).
  const ExpertStats& expert_stats() const { return experts_.stats; }
  void set_expert_choice(MoeChoice choice) { experts_.choice = choice; }  // --moe-balanced-routing
  float* adam_m_device() const { return adam_m_.get(); }
  float* adam_v_device() const { return adam_v_.get(); }
  float* master_device() const { return params_.master(); }

  // The initialization from `seed` (initial_values); bf16 parameters are the values
  // rounded to nearest, the master weights the fp32 values. Gradients and optimizer state are reset.
  void init_random(uint64_t seed) {
    NormalSampler normal(seed);
    for (int i = 0; i < kNumParameterTensors; ++i)
      params_.upload_tensor(i, initial_values(split_.global(), i, normal));
    reset_training_state();
  }

  // Reads an llm.c model file (version 3 fp32, 5 bf16) or a Hugging Face Llama directory
  // (model_source.h) into either dtype; its header or config.json must describe this model. fp32
  // values load into bf16 parameters rounded to nearest (the master weights keep the fp32 values);
  // bf16 values load into fp32 exactly. Gradients and optimizer state are reset.
  void load(const std::string& path) {
    const ModelConfig config = model_source_config(path);
    if (config != cfg_)
      throw std::runtime_error(path + ": model file has " + describe(config) + ", expected " + describe(cfg_) +
                               " (the configuration this model was built with)");
    read_model_source_tensors(path, config, [&](int i, const std::vector<float>& values) { params_.upload_tensor(i, values); });
    reset_training_state();
  }

  // Writes an llm.c model file of `file_dtype` values (version 3 fp32, 5 bf16) atomically
  // (durable_file.h), on the ranks that are `writer`s. At ZeRO 3 or with tensor or pipeline
  // parallelism every rank calls it (the parameters are gathered).
  void save(const std::string& path, DType file_dtype = dtype, bool writer = true) const {
    params_.save(path, cfg_, file_dtype, writer);
  }
  // Every parameter in llm.c order into device memory `dst` (nullptr: take part only; at ZeRO 3
  // or with tensor parallelism a collective).
  void gather_parameters(Elem* dst) const { params_.copy_all(dst, cudaMemcpyDeviceToDevice); }

  // Forward pass over one micro-batch of host tokens (B·T each, row-major [B][T]). Returns the
  // mean cross-entropy over the B·T positions and keeps the logits of the last chunk of rows
  // (logits()). targets may be nullptr (no loss: returns NaN).
  float forward(const int* inputs, const int* targets) {
    if (pipeline_.comm != nullptr) throw std::runtime_error("forward: a pipeline stage runs passes (pipeline_step.h)");
    upload_tokens(slots_[0], 0, inputs, targets, false);
    Passes::queue_chunk_forward(*this, slots_[0], 0);
    head_.queue(slots_[0], slots_[0], param(lm_head_tensor()), grad(lm_head_tensor()), tp_, rows(), cfg_.channels,
                targets != nullptr, 0.0f, false, stream_.get());
    if (targets != nullptr) return mean_loss();
    cuda_check(cudaStreamSynchronize(stream_.get()), "forward pass");
    return std::numeric_limits<float>::quiet_NaN();
  }

  // Forward pass, then the gradient of (mean loss / grad_accum_steps) ADDED to the parameter
  // gradients (call zero_grad() before an optimizer step's first micro-step); the losses are added
  // to the step's on the device (step_figures()). Overwrites the logits with their gradient. With
  // several ranks the gradients travel as grad_sync.h says, overlapped with the backward pass.
  void forward_backward(const int* inputs, const int* targets, int grad_accum_steps, bool last_micro_step = true) {
    if (targets == nullptr) throw std::runtime_error("forward_backward: targets are required");
    Passes::micro_step(*this, inputs, targets, nullptr, grad_accum_steps, last_micro_step);
  }
  // The same from a loader's batch: ids checked against this model's vocabulary and encoder
  // buckets built by batch_preparer() on the loader thread are not checked or built again.
  void forward_backward(const TokenBatch& batch, int grad_accum_steps, bool last_micro_step = true) {
    const size_t tokens = static_cast<size_t>(B_) * context_.seq_len();
    if (batch.inputs.size() != tokens || batch.targets.size() != tokens)
      throw std::runtime_error("forward_backward: a batch of " + std::to_string(batch.inputs.size()) + " tokens, expected B*T = " +
                               std::to_string(tokens));
    Passes::micro_step(*this, batch.inputs.data(), batch.targets.data(), &batch, grad_accum_steps, last_micro_step);
  }

  // The host work a micro-batch needs before its upload, for DataLoader::set_prepare.
  std::function<void(TokenBatch&)> batch_preparer() const {
    return encoder_buckets_preparer(B_, context_, cfg_.vocab_size, vocab_begin(), vocab_begin() + vl_);
  }

  // ---- Pipeline parallelism: pipeline_step.h runs a schedule's table with these. A chunk pass (a
  // micro-batch through local chunk c: stage().chunks) keeps its activations in set `slot` from its
  // forward to its backward. Transfers are this rank's rows × C (boundary_elements()).
  const StagePart& stage() const { return pipeline_.mine(); }
  const PipelineParts& pipeline() const { return pipeline_; }
  int in_flight() const { return static_cast<int>(slots_.size()); }
  size_t boundary_elements() const { return static_cast<size_t>(tp_.local_rows()) * cfg_.channels; }
  // The micro-batch's tokens for a pass of chunk c: inputs (and the encoder-backward buckets) where
  // c embeds, targets where it ends in the head.
  void upload_pass_tokens(int slot, int c, const TokenBatch& batch) {
    const bool embeds = embeds_at(c), head = head_at(c);
    if (!embeds && !head) return;
    upload_tokens(slots_[slot], slot, batch.inputs.data(), head ? batch.targets.data() : nullptr, embeds, &batch);
  }
  void forward_pass(int slot, int c) { Passes::queue_chunk_forward(*this, pass_set(slot), c); }
  // The forward pass's head and loss without gradients (validation): losses into the slot.
  void head_losses(int slot) {
    head_.queue(slots_[slot], slots_[0], param(lm_head_tensor()), nullptr, tp_, rows(), cfg_.channels, true, 0.0f, false,
                stream_.get());
  }
  // The pass's backward (at the head: the loss and its gradient, of mean loss / micro_steps, first),
  // gradients accumulated; the gradient of the chunk's input is then chunk_input_gradient(). With
  // split_backward (zb-h1) the products' weight gradients are left for weight_backward_pass.
  void backward_pass(int slot, int c, int micro_steps) {
    Activations<Elem>& a = pass_set(slot);
    grads_.begin_micro_step(false);
    objective_scale_ = 1.0f / (static_cast<float>(micro_steps) * grads_.ranks_summed());
    if (head_at(c)) {
      const float dloss = objective_scale_ / static_cast<float>(rows());
      head_.queue(a, slots_[0], param(lm_head_tensor()), grad(lm_head_tensor()), tp_, rows(), cfg_.channels, true,
                  dloss, true, stream_.get());
      classifier_loss_sum(totals_.loss_sum(), a.losses.get(), rows(), stream_.get());
    }
    Passes::queue_chunk_backward(*this, a, slot, c);
    grads_.end_micro_step();
  }
  void weight_backward_pass(int slot, int c) { Passes::queue_chunk_weight_gradients(*this, slots_[slot], c); }
  // After the schedule's last backward of `micro_steps` micro-batches: gradients summed and sent.
  void finish_pipeline_step(int micro_steps) {
    grads_.finish_pipeline_step();
    micro_steps_ = micro_steps;
  }
  Elem* chunk_input(int slot) { return tp_.local(slots_[slot].encoded.get(), cfg_.channels); }
  const Elem* chunk_output(int slot, int c) const {
    return slots_[slot].residual3.get() + (stage().chunks[c] - 1) * boundary_elements();
  }
  Elem* chunk_output_gradient(int slot) { return slots_[slot].output_grad.get(); }
  const Elem* chunk_input_gradient() const { return tp_.local(slots_[0].dresidual.get(), cfg_.channels); }
  // Set `slot`'s buffers: with experts, the routing tails that follow these transfers (expert_mlp.h).
  Activations<Elem>& activation_set(int slot) { return slots_[slot]; }
  // The pass's losses from pipeline rank `root` (the head's) to every stage.
  void share_pass_losses(int slot, int root) {
    Communicator& pp = *pipeline_.comm;
    pp.ordered_with(stream_.get(), [&] { pp.broadcast(slots_[slot].losses.get(), rows(), root); });
  }
  // Losses of the pass in `slot` (its B·T positions, [B][T]; the head's rank). With context
  // parallelism a collective: the CP group's rows are gathered.
  std::vector<float> pass_losses(int slot) const {
    const float* losses = slots_[slot].losses.get();
    if (cp_ == nullptr) return copy_floats_to_host(losses, rows(), stream_.get());
    cp_->set_purpose("the context-parallel group's losses", cp_->purpose_when());
    cp_->ordered_with(stream_.get(), [&] { cp_->all_gather(losses, gathered_losses_.get(), rows()); });
    const std::vector<float> gathered = copy_floats_to_host(gathered_losses_.get(), gathered_losses_.bytes() / sizeof(float), stream_.get());
    std::vector<float> whole(gathered.size());
    context_.place(whole.data(), gathered.data(), B_);
    return whole;
  }

  // Starts an optimizer step: gradients and the step's loss sum to zero; --fp8 records amaxes again.
  void zero_grad() {
    grads_.zero();
    if (fp8_) fp8_->begin_step();
    experts_.reset(stream_.get());
    totals_.zero(stream_.get());
    micro_steps_ = 0;
  }

  // The figures of the optimizer step whose micro-steps are queued (step_totals.h); with_loss is
  // summed over the ranks with the loss (the trainer's stop votes).
  StepFigures step_figures(double with_loss = 0.0) {
    return totals_.read(grads_, slots_[0].norm_squared.get(), slots_[0].scratch.get(), with_loss,
                        static_cast<double>(rows()) * micro_steps_, stream_.get());
  }

  // One optimizer step (step is 1-based) from the accumulated gradients: AdamW with clipping
  // (optimizer.h) given step_figures()' gradient norm, then the sigmoid router's bias update
  // (expert_bias.h). Data parallel: the update waits for the
  // gradient communication; with sharded optimizer state each rank updates its shard, then the
  // parameters are all-gathered (at ZeRO 3 they stay sharded: the next pass gathers them).
  void apply_update(const OptimizerSettings& opt, float lr, int step, float norm) {
    if (fp8_) fp8_->end_step();  // the scales for the next step, before its weights' copies
    adamw_->step(opt, lr, step, norm, stream_.get());
    expert_bias_.apply(experts_.counts(0), opt.expert_bias_rate, stream_.get());  // sigmoid router: after AdamW
    if (params_.sharded()) params_.changed();
    else grads_.gather_parameters(params_.full());
    if (fp8_) fp8_->weights_changed();
  }

  // The mean loss of the last forward() or forward_backward() micro-batch: its per-position losses
  // summed on the host in position order (double). Waits for the device.
  float mean_loss() const {
    const std::vector<float> losses = position_losses();
    return static_cast<float>(std::accumulate(losses.begin(), losses.end(), 0.0) / static_cast<double>(losses.size()));
  }

  // The B·T per-position losses of the last forward() or forward_backward() ([B][T]). Waits.
  std::vector<float> position_losses() const { return pass_losses(0); }

  // The whole model's (every tensor-parallel rank's parts).
  size_t num_parameters() const { return split_.global().total; }
  // Device bytes of the parameters (at ZeRO 3: the shard and the gather windows) and master weights.
  size_t parameter_bytes() const { return params_.bytes(); }

  // Host copies as float, the whole model's llm.c order (at ZeRO 3 or with TP or PP a collective).
  std::vector<float> parameters() const { return params_.host_floats(); }
  // In layout()'s order (at ZeRO stages 2 and 3 no rank holds them all: throws).
  std::vector<float> gradients() const { return grads_.llmc_order(stream_.get()); }
  // The logits of the last forward(): rows [N - r, N) of the micro-batch, r = N mod the lm head's
  // chunk rows (or those rows), which is every row when B·T <= that; after forward_backward()
  // their gradients. With tensor parallelism, this rank's Vp/size columns (its wte rows').
  std::vector<float> logits() const {
    const size_t chunk = static_cast<size_t>(head_.chunk_rows());
    const size_t last_chunk = rows() - (rows() - 1) / chunk * chunk;
    return copy_floats_to_host(slots_[0].logits.get(), last_chunk * vl_, stream_.get());
  }

  // Replaces all parameters (llm.c order, as float; rounded to nearest for bf16, master weights get
  // the float values). Gradients and optimizer state are kept.
  void set_parameters(const std::vector<float>& values) {
    params_.upload_all(values);
    if (fp8_) fp8_->weights_changed();
  }

  // Device memory of the activations: model_activation_bytes(...).total(). (All of it: memory_plan.h.)
  size_t activation_bytes() const {
    return std::accumulate(slots_.begin(), slots_.end(), size_t{0},
                           [](size_t total, const Activations<Elem>& a) { return total + a.bytes(); });
  }

  // Rows per lm-head chunk (lm_head.h): the logits buffer's height (min(B·T, the constructor's
  // logits_rows)), or fewer.
  void set_logits_chunk_rows(int rows) { head_.set_chunk_rows(rows); }
  int logits_chunk_rows() const { return head_.chunk_rows(); }
  // The lm head's chunks per micro-step: its products and classifier launches each run this often
  // (none on a pipeline stage without the head).
  int lm_head_chunks() const { return stage().head ? ceil_div(rows(), head_.chunk_rows()) : 0; }
  // Kernel launches of the encoder's backward per micro-step (encoder.cuh; wpe's where this rank computes it).
  int encoder_backward_launches() const {
    const int wpe_pieces = tp_.computes_replicated() ? static_cast<int>(context_.pieces(B_).size()) : 0;
    return ::encoder_backward_launches(B_, seq_len_, false) + wpe_pieces;
  }

 private:
  friend struct TransformerPasses<Elem>;
  using Passes = TransformerPasses<Elem>;

  int rows() const { return B_ * seq_len_; }
  Activations<Elem>& pass_set(int slot) {  // for a pass queued next in it: with EP its layers' routes selected
    if (ep_) ep_->routes.select(slot);
    return slots_[slot];
  }
  // Whether local chunk c starts with the embedding (the model's first chunk) or ends with the head.
  bool embeds_at(int c) const { return c == 0 && stage().embedding; }
  bool head_at(int c) const { return c + 1 == static_cast<int>(stage().chunks.size()) && stage().head; }
  // The first vocabulary row (token id) of this rank's part of wte.
  int vocab_begin() const { return split_.rank() * vl_; }

  void reset_training_state() {
    zero_grad();
    if (fp8_) fp8_->reset();
    cuda_check(cudaMemsetAsync(adam_m_.get(), 0, adam_m_.bytes(), stream_.get()), "zeroing AdamW moments");
    cuda_check(cudaMemsetAsync(adam_v_.get(), 0, adam_v_.bytes(), stream_.get()), "zeroing AdamW moments");
    cuda_check(cudaStreamSynchronize(stream_.get()), "resetting training state");
  }

  // Checks the micro-batch's [B][T] tokens (errors name their sequence and position) and queues the
  // upload of this rank's inputs and targets (with `buckets`, also the encoder-backward buckets)
  // from page-locked staging: the host does not wait. What the loader thread did already
  // (`prepared`) is not done again (upload_staging.h).
  void upload_tokens(Activations<Elem>& a, int slot, const int* inputs, const int* targets, bool buckets,
                     const TokenBatch* prepared = nullptr) {
    check_micro_batch_ids(inputs, targets, prepared, B_, context_.seq_len(), cfg_.vocab_size);  // [B][T] positions
    context_.select(local_inputs_.data(), inputs, B_);
    if (targets != nullptr) context_.select(local_targets_.data(), targets, B_);
    const int n = staging_->upload_micro_batch(local_inputs_.data(), targets != nullptr ? local_targets_.data() : nullptr,
                                               prepared, B_, seq_len_, cfg_.vocab_size, vocab_begin(),
                                               vocab_begin() + vl_, a.inputs.get(), a.targets.get(),
                                               buckets ? a.buckets.get() : nullptr, stream_.get());
    if (buckets) bucket_segments_[slot] = n;
  }

  // Tensor `tensor`'s parameters (layer `layer`'s slice of a per-layer tensor) and its gradient;
  // nullptr for a tensor the architecture lacks (a bias, wpe), which the kernels then skip.
  const Elem* param(int tensor, int layer = 0) const {
    return layout_[tensor].count == 0 ? nullptr : params_.at(tensor, layer);
  }
  Elem* grad(int tensor, int layer = 0) const { return layout_[tensor].count == 0 ? nullptr : grads_.at(tensor, layer); }
  // The lm head's weights: wte when tied, else lm_head.
  int lm_head_tensor() const { return cfg_.tied_embeddings ? kWte : kLmHead; }

  const ModelConfig cfg_;
  const PipelineParts pipeline_;  // one whole part without pipeline parallelism
  const TensorSplit split_;
  const ParameterLayout layout_;  // this rank's (split_.local())
  const ContextSplit context_;    // one rank without context parallelism
  Communicator* const cp_;        // the CP group (nullptr without context parallelism)
  const int B_, seq_len_, recompute_;  // seq_len_: this rank's tokens of each sequence
  const AttentionKernel attention_;
  CudaStream stream_;
  TensorParallelGroup<Elem> tp_;
  // This rank's channels (C/size), query and K/V heads, qkv columns, MLP hidden units, vocabulary columns.
  const int cl_, nhl_, nkvl_, qkvl_, hl_, vl_;
  GradientSync<Elem> grads_;
  ModelParameters<Elem> params_;
  DeviceArray<float> adam_m_, adam_v_;
  std::optional<AdamWUpdate<Elem>> adamw_;  // emplaced once the buffers it updates exist
  std::vector<int> chunk_first_;  // chunk c's first local layer
  // Activation sets: [0] is whole (the work buffers too); more with pipeline parallelism.
  std::vector<Activations<Elem>> slots_;
  LmHead<Elem> head_;  // set once the logits buffer is allocated
  std::optional<UploadStaging> staging_;  // emplaced once the activation counts are known
  std::vector<int> bucket_segments_;  // per set: of its uploaded encoder-backward bucket list
  StepTotals totals_;
  int micro_steps_ = 0;  // since zero_grad()
  DeviceArray<float> rope_table_;  // RoPE: (seq_len, HS) cos/sin pairs (rope.cuh)
  std::vector<int> local_inputs_, local_targets_;  // this rank's tokens of a micro-batch, in its row order
  std::optional<ContextAttention<Elem>> ring_;     // the attention with context parallelism
  DeviceArray<float> gathered_losses_;              // the CP group's losses (its ranks' rows in turn)
  std::optional<Fp8State> fp8_;                     // --fp8's scales, weight copies and casts
  float objective_scale_ = 0.0f;  // a micro-batch's mean loss's weight in the step's gradient
  ExpertStep experts_;            // with experts: the step's routing counts and figures
  ExpertBiasUpdate<Elem> expert_bias_;  // the sigmoid router's balancing bias update
  std::unique_ptr<ExpertParallelism<Elem>> ep_;  // with an EP group (expert_parallel.h)
};


// fp8_state.h — the FP8 state of a run with --fp8: per local layer, the scales, amax histories and
// running amaxes of the operands of the blocks' Linear products (kernels/fp8_scaling.cuh), the
// weights' FP8 copies (as stored and transposed, remade after every change of the weights), the work
// buffers the activation and gradient casts write, and the products themselves through them
// (kernels/matmul_fp8.cuh); the whole model's scaling state a checkpoint keeps, gathered from the
// pipeline's stages and restored into any other stages' layers. The LM head stays bf16: its softmax
// reads logits that FP8's 3 mantissa bits would blur, and at GPT-2's vocabulary the head is a small
// share of a large model's FLOPs.
//
// Scaled tensors, per layer and product (Fp8Product): its input (E4M3), its weight (E4M3) and its
// output gradient (E5M2). SwiGLU's fc and fc2 read one input (ln2): fc2 uses fc's input slot.
// Every amax is max-reduced over the tensor-parallel group before a scale comes from it, so a TP
// rank, which holds part of a weight or of a split activation (or the whole of a replicated one),
// uses the scale a TP 1 run would. Delayed scaling: casts record amaxes during the step; end_step()
// max-reduces them over the tensor-parallel and data-parallel groups (every rank then computes the
// same scales) and updates the scales from the histories. Current scaling: each cast measures its
// input, max-reduces that amax over the tensor-parallel group (one all-reduce of one value per
// cast) and takes the scale from it at once; not over the data-parallel group, whose ranks cast
// other data (a product decodes its operands with their own scales, so DP ranks need not agree).
//
// Casts fused into their producers: with delayed scaling the kernels that write a product's input
// write its cast too, as they write their bf16 output (producer_output()), which saves a kernel
// reading that output back: the norms the input casts of QKV (ln1) and of the MLP's up products
// (ln2), the MLP's activation (GELU, SwiGLU) that of its down product. Not fused: with current
// scaling (the amax must be known before the cast, so the output is measured, then cast); a
// norm's under sequence parallelism (a norm writes this rank's rows, the product reads them all
// once gathered); the backward's transposed casts of the norms' outputs and of a kept activation
// (a forward producer runs a warp or a thread per row piece and cannot write a transposed tile
// cheaply; an activation recomputed for the backward is recomputed straight into its transposed
// cast: producer_transposed_output()); the attention projection's input (the attention kernels,
// not yet). A gradient made or summed by a kernel is cast by it, as stored and transposed:
// SwiGLU's backward for its two up products (swiglu_backward()), the bias and GELU gradients'
// kernel (backward(), matmul_fp8_gradient); the others by fp8_cast, which reads each once and
// writes both layouts. The weights' copies are made once per optimizer step (refresh_weights()).
#pragma once
#include "kernels/common.cuh"
#include "kernels/fp8.cuh"
#include "kernels/fp8_cast.cuh"
#include "kernels/fp8_scaling.cuh"
#include "kernels/matmul.cuh"
#include "kernels/matmul_fp8.cuh"
#include "kernels/swiglu.cuh"
#include "src/base/device.h"
#include "src/config/config.h"
#include "src/config/model_config.h"
#include "src/dist/comm.h"
#include "src/dist/tensor_split.h"

#include <algorithm>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

// The blocks' Linear products, per layer.
enum class Fp8Product : int { qkv, attproj, fc, fc2, fcproj };
constexpr int kFp8Products = 5;
// The scaled operands of a product.
enum class Fp8Operand : int { input, weight, grad };
constexpr int kFp8Operands = 3;

// The scaling state of `layers` layers as one array, the device's and a checkpoint's layout alike:
// the M = layers · 5 · 3 tensors' scales, then their inverse scales, then their amax histories
// (M × H, row m tensor m's, newest first), tensor slot(l, p, o) = (l · 5 + p) · 3 + o. A layer's
// values are thus one run in each of the three sections: a stage's layers are placed into the whole
// model's state, and picked out of it, by copy_layer.
struct Fp8StateLayout {
  static constexpr int kPerLayer = kFp8Products * kFp8Operands;  // tensors per layer
  int layers = 0, history = 0;
  static int slot(int l, Fp8Product p, Fp8Operand o) {
    return (l * kFp8Products + static_cast<int>(p)) * kFp8Operands + static_cast<int>(o);
  }
  size_t tensors() const { return static_cast<size_t>(layers) * kPerLayer; }
  size_t count() const { return tensors() * (2 + static_cast<size_t>(history)); }
  // Layer `from_layer`'s values of `from` (laid out by `source`) into layer `to_layer` of `to` (laid
  // out by this), the same history length.
  void copy_layer(const Fp8StateLayout& source, const float* from, int from_layer, float* to, int to_layer) const {
    for (int section = 0; section < 3; ++section)
      std::copy_n(from + source.run_at(section, from_layer), run_length(section), to + run_at(section, to_layer));
  }

 private:
  // Where layer l's values start in section 0 (scales), 1 (inverse scales) or 2 (histories), and
  // how many there are.
  size_t run_length(int section) const { return kPerLayer * (section == 2 ? static_cast<size_t>(history) : 1); }
  size_t run_at(int section, int l) const {
    return (section == 2 ? 2 * tensors() : section * tensors()) + static_cast<size_t>(l) * run_length(section);
  }
};

struct Fp8Settings {
  bool delayed = true;  // --fp8-scaling delayed (else current)
  int history = 16;     // --fp8-amax-history
  int margin = 0;       // --fp8-margin
  // The producers write their products' input casts where producer_output() can (off: every
  // product casts its own input; the tests compare the two).
  bool producer_casts = true;
};

// --fp8's settings from the flags; none without --fp8.
inline std::optional<Fp8Settings> fp8_settings(const TrainConfig& cfg) {
  if (!cfg.fp8) return std::nullopt;
  return Fp8Settings{cfg.fp8_scaling == "delayed", cfg.fp8_amax_history, cfg.fp8_margin};
}

// One product's shape on this rank: in_features (the reduction) and out_features.
struct Fp8ProductShape {
  int in = 0, out = 0;  // out = 0: the architecture has no such product (fc2 without SwiGLU)
};

// The five products' shapes (Fp8Product order) on a rank of a TP group of `tp` ranks: the QKV and
// MLP-up products split by output (column-parallel), the attention and MLP-down ones by input.
inline std::vector<Fp8ProductShape> fp8_product_shapes(const ModelConfig& cfg, int tp) {
  const int C = cfg.channels, qkv = cfg.qkv_channels() / tp, att = C / tp, hidden = cfg.hidden() / tp;
  return {{C, qkv}, {att, C}, {C, hidden}, {C, cfg.mlp == Mlp::swiglu ? hidden : 0}, {hidden, C}};
}

// Refuses --fp8 on a device without FP8 tensor cores, naming it.
inline void require_fp8_device() {
  const cudaDeviceProp prop = device_properties();
  if (prop.major < 9)
    throw std::invalid_argument("--fp8 needs FP8 tensor cores (sm_90 and newer); " + std::string(prop.name) +
                                " is sm_" + std::to_string(prop.major * 10 + prop.minor));
}

// The sizes the products' shapes give (one place for the allocations and the plan): each
// product's weight offset within a layer's copies, a layer's weight elements, the widest
// product's input and output (the cast buffers' rows), and SwiGLU's second up product's output
// (its gradient's casts, made with the first's: Fp8State::swiglu_backward).
struct Fp8Sizes {
  std::vector<size_t> weight_offset;
  size_t per_layer_weights = 0, max_in = 0, max_out = 0, second_up_out = 0;
  explicit Fp8Sizes(const std::vector<Fp8ProductShape>& shapes)
      : second_up_out(shapes[static_cast<int>(Fp8Product::fc2)].out) {
    for (const Fp8ProductShape& p : shapes) {
      weight_offset.push_back(per_layer_weights);
      if (p.out == 0) continue;
      per_layer_weights += static_cast<size_t>(p.in) * p.out;
      max_in = std::max<size_t>(max_in, p.in);
      max_out = std::max<size_t>(max_out, p.out);
    }
  }
};

// Bytes of the FP8 weight copies and cast buffers of `layers` layers of these product shapes over
// `rows` rows (memory_plan.h's term), and the fp32 scaling state.
inline size_t fp8_state_bytes(const std::vector<Fp8ProductShape>& shapes, int layers, size_t rows, int history) {
  const Fp8Sizes sizes(shapes);
  const size_t tensors = static_cast<size_t>(layers) * kFp8Products * kFp8Operands;
  return 2 * layers * sizes.per_layer_weights + rows * (sizes.max_in + 2 * sizes.max_out + 2 * sizes.second_up_out) +
         tensors * (3 + kFp8ScaleInvStride + history) * sizeof(float);  // copies as stored and transposed; scale,
                                                                       // inverse (16 bytes), amax, max, history
}

class Fp8State {
 public:
  // `shapes`: the five products' shapes on this rank (Fp8Product order); `tp`, `dp`: the
  // tensor-parallel and data-parallel groups the amaxes are max-reduced over (nullptr or one rank:
  // none).
  Fp8State(const Fp8Settings& settings, int layers, int rows, std::vector<Fp8ProductShape> shapes, Communicator* tp,
           Communicator* dp, cudaStream_t stream)
      : settings_(settings), layout_{layers, settings.history}, rows_(rows), shapes_(std::move(shapes)), sizes_(shapes_),
        tp_(several(tp)), dp_(several(dp)), stream_(stream) {
    const int M = tensors();
    scale_ = DeviceArray<float>(M, "FP8 scales");
    scale_inv_ = DeviceArray<float>(static_cast<size_t>(M) * kFp8ScaleInvStride, "FP8 inverse scales");
    amax_ = DeviceArray<float>(M, "FP8 amaxes");
    history_ = DeviceArray<float>(static_cast<size_t>(M) * settings_.history, "FP8 amax histories");
    format_max_ = DeviceArray<float>(M, "FP8 format maxima");
    std::vector<float> format_max(M);
    for (int m = 0; m < M; ++m)
      format_max[m] = m % kFp8Operands == static_cast<int>(Fp8Operand::grad) ? kFp8E5M2Max : kFp8E4M3Max;
    upload_floats(format_max_.get(), format_max, "FP8 format maxima");
    weights8_ = DeviceArray<fp8e4m3>(layers * sizes_.per_layer_weights, "FP8 weight copies");
    weights8t_ = DeviceArray<fp8e4m3>(layers * sizes_.per_layer_weights, "FP8 transposed weight copies");
    act8_ = DeviceArray<fp8e4m3>(rows * sizes_.max_in, "the FP8 activation cast");
    grad8_ = DeviceArray<fp8e5m2>(rows * sizes_.max_out, "the FP8 gradient cast");
    grad8t_ = DeviceArray<fp8e5m2>(rows * sizes_.max_out, "the FP8 transposed gradient cast");
    grad8b_ = DeviceArray<fp8e5m2>(rows * sizes_.second_up_out, "the FP8 cast of SwiGLU's second gradient");
    grad8bt_ = DeviceArray<fp8e5m2>(rows * sizes_.second_up_out, "the FP8 transposed cast of SwiGLU's second gradient");
    reset();
  }

  // Scales 1, histories and amaxes 0 (the state before the first step); weights to be cast again.
  // Not recording until the next training step starts (begin_step()).
  void reset() {
    fp8_scaling_init(scale_.get(), scale_inv_.get(), history_.get(), amax_.get(), tensors(), settings_.history, stream_);
    weights_stale_ = true;
    recording_ = false;
    producer_cast_ = {};
  }

  // A training step starts: its activation and gradient casts record their amaxes (delayed
  // scaling) until its end_step(). A validation between steps casts with the step's scales and
  // records nothing, so it changes no later step, and the amaxes pending between steps are the
  // weights' alone, which a resume's first cast of the weights records again. A step that never
  // ended (a bad-step guard skipped its update) leaves amaxes no scale should come from: they are
  // dropped, and the weights' recorded again by casting the weights anew.
  void begin_step() {
    if (recording_) {
      cuda_check(cudaMemsetAsync(amax_.get(), 0, amax_.bytes(), stream_), "dropping a skipped step's FP8 amaxes");
      weights_stale_ = true;
    }
    recording_ = true;
  }

  // The weights changed (an optimizer step, an upload): their copies are remade before next use.
  void weights_changed() { weights_stale_ = true; }

  // Remakes the weights' FP8 copies when stale; weight(p, l) is layer l's weight of product p.
  void refresh_weights(const std::function<const bf16*(Fp8Product, int)>& weight) {
    if (!weights_stale_) return;
    for (int l = 0; l < layout_.layers; ++l)
      for (int p = 0; p < kFp8Products; ++p) {
        const Fp8ProductShape& sh = shapes_[p];
        if (sh.out == 0) continue;
        const size_t at = weight_at(l, static_cast<Fp8Product>(p));
        cast(weights8_.get() + at, weights8t_.get() + at, weight(static_cast<Fp8Product>(p), l), sh.out, sh.in,
             slot(l, static_cast<Fp8Product>(p), Fp8Operand::weight), Amax::weight);
      }
    weights_stale_ = false;
  }

  // The FP8 copy a kernel writing `in` makes of its output (Fp8Out: the norms', kernels/layernorm.cuh
  // and rmsnorm.cuh; the MLP activation's, gelu.cuh and swiglu.cuh) as layer l's product p's input
  // cast: act8_, the input's scale and, when this step records, its amax (cast()'s rule), for the
  // next forward() of p on `in`, which then casts nothing. `rows`: the rows of `in` the producer
  // writes. None (the product casts its input itself) with current scaling, which measures the
  // amax before it casts, or when the producer does not write the product's whole input (a norm
  // under sequence parallelism: this rank's rows, gathered after the norm).
  Fp8Out producer_output(int l, Fp8Product p, const bf16* in, int rows) {
    if (!settings_.delayed || !settings_.producer_casts || rows != rows_) return {};
    const int m = slot(l, input_product(p), Fp8Operand::input);
    producer_cast_ = {m, in, false};
    return {act8_.get(), scale_.get() + m, recording_ ? amax_.get() + m : nullptr};
  }

  // As producer_output(), the transposed cast the next backward() of p reads for its weight gradient
  // (Fp8Out::out: the (in_features × rows) codes), made by a kernel that recomputes `in` for the
  // backward (the MLP activation: gelu_forward_fp8, swiglu_forward_fp8) at the scale its forward
  // used; no amax (delayed scaling records it in the forward). None where producer_output() gives
  // none.
  Fp8Out producer_transposed_output(int l, Fp8Product p, const bf16* in, int rows) {
    if (!settings_.delayed || !settings_.producer_casts || rows != rows_) return {};
    const int m = slot(l, input_product(p), Fp8Operand::input);
    producer_cast_ = {m, in, true};
    return {act8_.get(), scale_.get() + m, nullptr};
  }

  // out (rows × out) = inp @ weight^T + bias for layer l's product p. same_input: inp is the one
  // the previous forward call cast (SwiGLU's fc2 after fc), which is not cast again; nor is an
  // input whose producer wrote its cast (producer_output()) with nothing else written to act8_ since.
  void forward(bf16* out, const bf16* inp, int l, Fp8Product p, const bf16* bias, bool same_input = false) {
    const Fp8ProductShape& sh = shapes_[static_cast<int>(p)];
    const int in_slot = slot(l, input_product(p), Fp8Operand::input);
    const bool produced = producer_cast_.made(in_slot, inp, false);
    producer_cast_ = {};
    if (!same_input && !produced) cast<fp8e4m3>(act8_.get(), nullptr, inp, rows_, sh.in, in_slot, Amax::activation);
    const int w = slot(l, p, Fp8Operand::weight);
    matmul_fp8_forward(out, act8_.get(), inverse(in_slot), weights8_.get() + weight_at(l, p),
                       inverse(w), bias, rows_, sh.in, sh.out, stream_);
  }

  // matmul_backward's contract for layer l's product p (dweight nullptr: no weight gradient), with
  // the input and weight gradients as FP8 products: g (bf16, with the bias and GELU gradients from
  // matmul_backward_bias) cast to E5M2 as stored and transposed, the input cast transposed with
  // the scale its forward used (current scaling: measured again, see Amax; not again where the
  // kernel recomputing the input made it: producer_transposed_output()). With delayed scaling,
  // a bias or GELU gradient is made by the cast (matmul_fp8_gradient: g never written in bf16, so
  // dpre_gelu is left as it was), with the same bits.
  void backward(bf16* dinp, bf16* dweight, bf16* dbias, bf16* dpre_gelu, const bf16* dout, const bf16* inp,
                const bf16* pre_gelu, int l, Fp8Product p, const std::function<void()>& after_input_gradient,
                bool accumulate_input_gradient) {
    const Fp8ProductShape& sh = shapes_[static_cast<int>(p)];
    const int g_slot = slot(l, p, Fp8Operand::grad), w = slot(l, p, Fp8Operand::weight);
    if (settings_.delayed && settings_.producer_casts && (dbias != nullptr || pre_gelu != nullptr) &&
        matmul_fp8_gradient_fits(rows_, sh.out, dbias != nullptr)) {
      matmul_fp8_gradient(grad8_.get(), grad8t_.get(), recording_ ? amax_.get() + g_slot : nullptr,
                          scale_.get() + g_slot, dbias, dout, pre_gelu, rows_, sh.out, stream_);
    } else {
      matmul_backward_bias(dbias, dpre_gelu, dout, pre_gelu, rows_, sh.out, stream_);
      cast(grad8_.get(), grad8t_.get(), pre_gelu != nullptr ? dpre_gelu : dout, rows_, sh.out, g_slot, Amax::activation);
    }
    matmul_fp8_input_gradient(dinp, grad8_.get(), inverse(g_slot), weights8t_.get() + weight_at(l, p),
                              inverse(w), rows_, sh.in, sh.out, accumulate_input_gradient, stream_);
    if (after_input_gradient) after_input_gradient();
    if (dweight == nullptr) return;
    const int in_slot = slot(l, input_product(p), Fp8Operand::input);
    const bool produced = producer_cast_.made(in_slot, inp, true);
    producer_cast_ = {};
    if (!produced) cast<fp8e4m3>(nullptr, act8_.get(), inp, rows_, sh.in, in_slot, Amax::again);
    matmul_fp8_weight_gradient(dweight, grad8t_.get(), inverse(g_slot), act8_.get(),
                               inverse(in_slot), rows_, sh.in, sh.out, stream_);
  }

  // SwiGLU's backward through its up products fc (a = w1·x) and fc2 (b = w3·x) of layer l, with
  // their gradients' casts fused into the activation's backward (kernels/swiglu.cuh,
  // swiglu_backward_fp8: never written in bf16): dx (rows × C) = both input gradients (fc's
  // written, fc2's added, then after_input_gradient), x's transposed cast made once for both
  // weight gradients (one input, one scale), dfcw and dfc2w accumulated: the bits of
  // swiglu_backward and two backward() calls. False, with nothing done, where the casts are not
  // fused: current scaling (the amaxes come before the casts), producer casts off, or weight
  // gradients left for later.
  bool swiglu_backward(bf16* dx, bf16* dfcw, bf16* dfc2w, const bf16* dact, const bf16* a, const bf16* b,
                       const bf16* x, int l, const std::function<void()>& after_input_gradient) {
    if (!settings_.delayed || !settings_.producer_casts || dfcw == nullptr || dfc2w == nullptr) return false;
    const Fp8ProductShape& sh = shapes_[static_cast<int>(Fp8Product::fc)];
    const int ga = slot(l, Fp8Product::fc, Fp8Operand::grad), gb = slot(l, Fp8Product::fc2, Fp8Operand::grad);
    auto amax = [&](int m) { return recording_ ? amax_.get() + m : nullptr; };
    swiglu_backward_fp8(grad8_.get(), grad8t_.get(), amax(ga), scale_.get() + ga, grad8b_.get(), grad8bt_.get(),
                        amax(gb), scale_.get() + gb, dact, a, b, rows_, sh.out, stream_);
    const Fp8Product products[2] = {Fp8Product::fc, Fp8Product::fc2};
    const fp8e5m2* stored[2] = {grad8_.get(), grad8b_.get()};
    const fp8e5m2* transposed[2] = {grad8t_.get(), grad8bt_.get()};
    const int grads[2] = {ga, gb};
    for (int k = 0; k < 2; ++k)
      matmul_fp8_input_gradient(dx, stored[k], inverse(grads[k]), weights8t_.get() + weight_at(l, products[k]),
                                inverse(slot(l, products[k], Fp8Operand::weight)), rows_, sh.in, sh.out, k == 1,
                                stream_);
    if (after_input_gradient) after_input_gradient();
    const int in_slot = slot(l, Fp8Product::fc, Fp8Operand::input);
    producer_cast_ = {};
    cast<fp8e4m3>(nullptr, act8_.get(), x, rows_, sh.in, in_slot, Amax::again);
    bf16* dweights[2] = {dfcw, dfc2w};
    for (int k = 0; k < 2; ++k)
      matmul_fp8_weight_gradient(dweights[k], transposed[k], inverse(grads[k]), act8_.get(), inverse(in_slot), rows_,
                                 sh.in, sh.out, stream_);
    return true;
  }

  // After the step's backward: delayed scaling's amaxes max-reduced over the TP and DP groups,
  // then every scale updated from its history (current scaling updated its scales at each cast).
  void end_step() {
    if (!settings_.delayed) return;
    for (Communicator* g : {tp_, dp_}) reduce_amaxes(g, 0, tensors());
    fp8_update_scales(scale_.get(), scale_inv_.get(), history_.get(), amax_.get(), format_max_.get(), tensors(),
                      settings_.history, settings_.margin, true, stream_);
    recording_ = false;
    producer_cast_ = {};  // cast with the old scales
  }

  // This rank's layers' scaling state as fp32 on the host (Fp8StateLayout of its local layers):
  // with delayed scaling, after end_step(), the same on every rank of the TP and DP groups; with
  // current scaling a record of the last casts (the next cast measures its own). Restored as it is (the amaxes
  // pending, the weights', are recorded again when the restored weights are cast), a resume
  // continues bit for bit.
  std::vector<float> saved_state() const {
    std::vector<float> out = copy_floats_to_host(scale_.get(), scale_.count(), stream_);
    const std::vector<float> inverses = copy_floats_to_host(scale_inv_.get(), scale_inv_.count(), stream_);
    for (size_t m = 0; m < scale_.count(); ++m) out.push_back(inverses[m * kFp8ScaleInvStride]);
    const std::vector<float> history = copy_floats_to_host(history_.get(), history_.count(), stream_);
    out.insert(out.end(), history.begin(), history.end());
    return out;
  }
  // Restores saved_state()'s values (a resume); the weights are cast again with the restored scales.
  void restore_state(const std::vector<float>& values) {
    if (values.size() != layout_.count())
      throw std::runtime_error("FP8 state: " + std::to_string(values.size()) + " values, expected " +
                               std::to_string(layout_.count()) + " (the same model and --fp8-amax-history)");
    const size_t M = scale_.count();
    upload_floats(scale_.get(), std::vector<float>(values.begin(), values.begin() + M), "FP8 scales");
    std::vector<float> inverses(scale_inv_.count(), 0.0f);
    for (size_t m = 0; m < M; ++m) inverses[m * kFp8ScaleInvStride] = values[M + m];
    upload_floats(scale_inv_.get(), inverses, "FP8 inverse scales");
    upload_floats(history_.get(), std::vector<float>(values.begin() + 2 * M, values.end()), "FP8 amax histories");
    cuda_check(cudaMemsetAsync(amax_.get(), 0, amax_.bytes(), stream_), "zeroing the FP8 amaxes");
    weights_stale_ = true;
    producer_cast_ = {};
  }

  // What a checkpoint keeps: the whole model's scaling state (Fp8StateLayout of `num_layers` layers,
  // global layer order) from every pipeline stage's (`pipeline`: each stage's layers, this rank's
  // place and the communicator): each stage's saved_state(), padded to the largest stage's, is
  // all-gathered on the device and its layers placed at their global indices. A collective over
  // the pipeline's communicator (named by the caller's purpose: the checkpoint); without a
  // pipeline, saved_state().
  std::vector<float> whole_model_state(const PipelineParts& pipeline, int num_layers) const {
    std::vector<float> mine = saved_state();
    if (pipeline.comm == nullptr) return mine;
    const int H = settings_.history;
    size_t largest = 0;
    for (const StagePart& part : pipeline.stages)
      largest = std::max(largest, Fp8StateLayout{static_cast<int>(part.layers.size()), H}.count());
    mine.resize(largest);
    Communicator& pp = *pipeline.comm;
    DeviceArray<float> staging(largest * pipeline.size(), "gathering the pipeline stages' FP8 state");
    float* own = staging.get() + pipeline.rank * largest;
    cuda_check(cudaMemcpyAsync(own, mine.data(), largest * sizeof(float), cudaMemcpyHostToDevice, stream_),
               "staging the FP8 state");
    pp.ordered_with(stream_, [&] { pp.all_gather(own, staging.get(), largest); });
    const std::vector<float> all = copy_floats_to_host(staging.get(), staging.count(), stream_);
    const Fp8StateLayout whole{num_layers, H};
    std::vector<float> out(whole.count());
    for (int r = 0; r < pipeline.size(); ++r) {
      const std::vector<int>& layers = pipeline.stages[r].layers;
      const Fp8StateLayout stage{static_cast<int>(layers.size()), H};
      for (int j = 0; j < stage.layers; ++j) whole.copy_layer(stage, all.data() + r * largest, j, out.data(), layers[j]);
    }
    return out;
  }
  // Restores this stage's layers (`stage`: their global indices) from the whole model's state of
  // `num_layers` layers, whole_model_state()'s at any pipeline layout (a resume).
  void restore_whole_model_state(const std::vector<float>& values, const StagePart& stage, int num_layers) {
    const Fp8StateLayout whole{num_layers, settings_.history};
    if (values.size() != whole.count())
      throw std::runtime_error("FP8 state: " + std::to_string(values.size()) + " values, the whole model's at " +
                               std::to_string(num_layers) + " layers and --fp8-amax-history " +
                               std::to_string(settings_.history) + " has " + std::to_string(whole.count()) +
                               " (another --fp8-amax-history, or an older build's pipeline run, which saved its "
                               "first stage's layers alone)");
    std::vector<float> mine(layout_.count());
    for (int j = 0; j < layout_.layers; ++j) layout_.copy_layer(whole, values.data(), stage.layers[j], mine.data(), j);
    restore_state(mine);
  }

  // Device bytes held: fp8_state_bytes() of its shapes.
  size_t bytes() const {
    return scale_.bytes() + scale_inv_.bytes() + amax_.bytes() + history_.bytes() + format_max_.bytes() +
           weights8_.bytes() + weights8t_.bytes() + act8_.bytes() + grad8_.bytes() + grad8t_.bytes() + grad8b_.bytes() +
           grad8bt_.bytes();
  }

  // Tensor m's scale (tests): slot(l, p, operand)'s.
  float scale(int l, Fp8Product p, Fp8Operand o) const {
    return copy_floats_to_host(scale_.get() + slot(l, p, o), 1, stream_)[0];
  }

 private:
  static Communicator* several(Communicator* g) { return g != nullptr && g->world_size() > 1 ? g : nullptr; }
  int tensors() const { return static_cast<int>(layout_.tensors()); }
  // Tensor m's inverse scale: a 16-byte aligned device scalar (cuBLASLt's FP8 scale pointers need it).
  float* inverse(int m) const { return scale_inv_.get() + static_cast<size_t>(m) * kFp8ScaleInvStride; }
  static int slot(int l, Fp8Product p, Fp8Operand o) { return Fp8StateLayout::slot(l, p, o); }
  // Tensors [first, first + n)'s amaxes max-reduced over group g (none: nothing to do), between the
  // stream's work that measured them and the work that reads them.
  void reduce_amaxes(Communicator* g, int first, int n) {
    if (g == nullptr) return;
    g->set_purpose("FP8 amaxes", g->purpose_when());
    g->ordered_with(stream_, [&] { g->all_reduce(amax_.get() + first, static_cast<size_t>(n), ncclMax); });
  }
  // SwiGLU's fc2 reads fc's input: one cast, one scale.
  static Fp8Product input_product(Fp8Product p) { return p == Fp8Product::fc2 ? Fp8Product::fc : p; }
  size_t weight_at(int l, Fp8Product p) const {
    return l * sizes_.per_layer_weights + sizes_.weight_offset[static_cast<int>(p)];
  }

  // What a cast's amax is for: an input its forward cast, cast again transposed (delayed scaling
  // records nothing: its forward did; current scaling measures it again, since another micro-batch's
  // forward, a pipeline schedule's, may have replaced the scale its forward used, and the same input
  // gives the same scale), an activation or gradient of a training step, or a weight (whose copies
  // may be made by a validation's forward: their amax counts for the next step all the same).
  enum class Amax { again, activation, weight };

  // in (rows × cols) cast with tensor m's scale into out and/or out_t. Delayed scaling records the
  // amax for end_step (see Amax and begin_step()); current scaling measures the input, max-reduces
  // the amax over the TP group and updates the scale from it first.
  template <typename F8>
  void cast(F8* out, F8* out_t, const bf16* in, int rows, int cols, int m, Amax amax) {
    const bool record = amax == Amax::weight || (amax == Amax::activation && recording_);
    if (!settings_.delayed) {
      fp8_amax(amax_.get() + m, in, static_cast<size_t>(rows) * cols, stream_);
      reduce_amaxes(tp_, m, 1);
      fp8_update_scales(scale_.get() + m, inverse(m), history_.get() + static_cast<size_t>(m) * settings_.history,
                        amax_.get() + m, format_max_.get() + m, 1, settings_.history, settings_.margin, false, stream_);
    }
    fp8_cast<bf16, F8>(out, out_t, record && settings_.delayed ? amax_.get() + m : nullptr, in, rows, cols,
                       scale_.get() + m, stream_);
  }

  const Fp8Settings settings_;
  const Fp8StateLayout layout_;  // this rank's layers
  const int rows_;
  const std::vector<Fp8ProductShape> shapes_;
  const Fp8Sizes sizes_;
  Communicator* const tp_;  // nullptr: no TP group of several ranks
  Communicator* const dp_;  // nullptr: no DP group of several ranks
  cudaStream_t stream_;
  DeviceArray<float> scale_, amax_, history_, format_max_;
  DeviceArray<float> scale_inv_;  // kFp8ScaleInvStride floats per tensor: each 16-byte aligned for cuBLASLt
  DeviceArray<fp8e4m3> weights8_, weights8t_;
  DeviceArray<fp8e4m3> act8_;  // the forward's input cast, or the backward's transposed input
  // The input whose cast its producer wrote into act8_ (producer_output(), or transposed:
  // producer_transposed_output()), until a product reads it or anything else is written there or
  // the scales change; slot -1: none.
  struct ProducerCast {
    int slot = -1;
    const bf16* in = nullptr;
    bool transposed = false;
    bool made(int s, const bf16* p, bool t) const { return slot == s && in == p && transposed == t; }
  } producer_cast_;
  DeviceArray<fp8e5m2> grad8_, grad8t_;
  DeviceArray<fp8e5m2> grad8b_, grad8bt_;  // SwiGLU's second up product's gradient (swiglu_backward())
  bool weights_stale_ = true;
  bool recording_ = false;
};

// generate.h — token generation with a key/value cache from either architecture the transformer
// runs (GPT-2's or Llama 3's, model_config.h): KvCacheDecoder runs the prompt through the model
// once (prefill: the training forward's kernels, filling every layer's cache), then each new token
// as one position through every layer, its attention reading the cached keys and values
// (kernels/attention_decode.cuh; one entry per K/V head, shared by its query heads) instead of
// recomputing the prefix; choose_token picks the next token greedily or by top-k sampling with
// temperature from the project's seeded RNG (rng.h), and generation ends at a stop token. Token
// ids only: text and which ids stop are sample_text.h's and vocabulary.h's.
#pragma once
#include "kernels/attention_decode.cuh"
#include "kernels/common.cuh"
#include "kernels/encoder.cuh"
#include "kernels/matmul.cuh"
#include "kernels/rope.cuh"
#include "src/model/attention.h"
#include "src/model/block_ops.h"
#include "src/model/expert_mlp.h"
#include "src/base/device.h"
#include "src/config/model_config.h"
#include "src/base/rng.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

// How the next token is chosen from the logits, and which tokens end the generation.
struct SamplingSettings {
  double temperature = 1.0;  // 0: greedy
  int top_k = 0;             // 0: every token of the vocabulary
  uint64_t seed = 0;         // of the SplitMix64 stream the draws come from
  std::vector<int> stop_tokens = {};  // generation ends after choosing one of these (vocabulary.h)
};

// The next token from `logits` over the vocabulary. Temperature 0: the largest logit (the lowest
// id among equal ones). Otherwise the top_k largest logits (ties: lower id first; 0: all) are
// weighted by exp((logit - max) / temperature) in double and one uniform number from rng picks a
// token in that order: the same logits, settings and rng state always give the same token.
inline int choose_token(const std::vector<float>& logits, const SamplingSettings& s, SplitMix64& rng) {
  if (logits.empty()) throw std::runtime_error("choose_token: no logits");
  const int V = static_cast<int>(logits.size());
  if (s.temperature == 0.0) return static_cast<int>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  std::vector<int> order(V);
  std::iota(order.begin(), order.end(), 0);
  const int k = s.top_k > 0 && s.top_k < V ? s.top_k : V;
  if (k < V)
    std::partial_sort(order.begin(), order.begin() + k, order.end(),
                      [&](int a, int b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
  order.resize(k);
  double max_logit = -INFINITY;
  for (int id : order) max_logit = std::max(max_logit, static_cast<double>(logits[id]));
  std::vector<double> cumulative(k);
  double total = 0.0;
  for (int i = 0; i < k; ++i) cumulative[i] = total += std::exp((logits[order[i]] - max_logit) / s.temperature);
  const double target = static_cast<double>(rng.next() >> 11) * 0x1.0p-53 * total;  // in [0, total)
  const int pick = static_cast<int>(std::upper_bound(cumulative.begin(), cumulative.end(), target) - cumulative.begin());
  return order[std::min(pick, k - 1)];
}

// Elements of the buffers a decoder of max_len positions allocates, by element type (also sizes
// the memory plan's sampling term, memory_plan.h).
struct KvDecoderCounts {
  size_t cache = 0;        // keys or values: (L, max_len, NKV·HS), Elem
  size_t activations = 0;  // the prefill's residual streams, norm, qkv, attention, MLP and logits, Elem
  size_t floats = 0;       // norm statistics, attention log-sum-exp and the RoPE table, float
  size_t tokens = 0;       // int
  size_t bytes(size_t elem) const { return elem * (2 * cache + activations) + 4 * floats + sizeof(int) * tokens; }
};
inline KvDecoderCounts kv_decoder_counts(const ModelConfig& cfg, int max_len) {
  const size_t rows = static_cast<size_t>(max_len), C = static_cast<size_t>(cfg.channels);
  const size_t H = static_cast<size_t>(cfg.hidden()), mlp_products = static_cast<size_t>(cfg.mlp_products());
  KvDecoderCounts n;
  n.cache = static_cast<size_t>(cfg.num_layers) * rows * static_cast<size_t>(cfg.kv_heads() * cfg.head_size());
  // x, residual2, ln, atty, branch (C each); qkv; the MLP's products and activation (with experts,
  // ExpertWork's: K rows per row, and the experts' outputs and rows); one row of logits.
  const size_t K = cfg.moe() ? cfg.experts_per_token : 0, E = cfg.num_experts;
  const size_t mlp = cfg.moe() ? rows * K * (3 * H + 2 * C) : rows * (mlp_products + 1) * H;
  n.activations = rows * (5 * C + static_cast<size_t>(cfg.qkv_channels())) + mlp +
                  static_cast<size_t>(cfg.padded_vocab_size);
  n.floats = rows * (2 + static_cast<size_t>(cfg.num_heads)) +
             (cfg.positions == Positions::rope ? rows * static_cast<size_t>(cfg.head_size()) : 0) +
             rows * (2 * E + K);  // the router's logits, probabilities and gates
  n.tokens = rows + (cfg.moe() ? 3 * rows * K + E + 1 : 0);  // and the experts' routing
  return n;
}

// Incremental decoding of one sequence. The parameters (llm.c order, ParameterLayout(cfg)) are
// read, never written, and must outlive the decoder; its work runs on `stream` (a training model's
// own stream keeps it ordered with that model's updates). Holds the keys and values of up to
// max_len positions per layer (NKV heads each) and the buffers of a max_len-token prefill.
template <typename Elem>
class KvCacheDecoder {
 public:
  KvCacheDecoder(const ModelConfig& cfg, const Elem* params, int max_len, AttentionKernel attention,
                 cudaStream_t stream)
      : cfg_(cfg), layout_(cfg), params_(params), max_len_(max_len), attention_(attention), stream_(stream) {
    if (max_len < 1 || max_len > cfg.max_seq_len)
      throw std::runtime_error("the decoder's cache: " + std::to_string(max_len) + " positions, expected 1.." +
                               std::to_string(cfg.max_seq_len) + " (the model's max_seq_len)");
    matmul_init();
    // Sized as kv_decoder_counts() counts them.
    const size_t rows = static_cast<size_t>(max_len), C = static_cast<size_t>(cfg.channels);
    const size_t H = static_cast<size_t>(cfg.hidden()), mlp_products = static_cast<size_t>(cfg.mlp_products());
    const size_t cache = kv_decoder_counts(cfg, max_len).cache;
    k_cache_ = DeviceArray<Elem>(cache, "the decoder's key cache");
    v_cache_ = DeviceArray<Elem>(cache, "the decoder's value cache");
    tokens_ = DeviceArray<int>(rows, "the decoder's tokens");
    x_ = DeviceArray<Elem>(rows * C, "the decoder's residual stream");
    residual2_ = DeviceArray<Elem>(rows * C, "the decoder's residual stream");
    ln_ = DeviceArray<Elem>(rows * C, "the decoder's norm output");
    qkv_ = DeviceArray<Elem>(rows * static_cast<size_t>(cfg.qkv_channels()), "the decoder's qkv");
    atty_ = DeviceArray<Elem>(rows * C, "the decoder's attention output");
    branch_ = DeviceArray<Elem>(rows * C, "the decoder's branch output");
    if (cfg.moe()) {
      experts_ = ExpertWork<Elem>(cfg, rows);
    } else {
      fch_ = DeviceArray<Elem>(rows * mlp_products * H, "the decoder's MLP products");
      fch_act_ = DeviceArray<Elem>(rows * H, "the decoder's MLP activations");
    }
    mean_ = DeviceArray<float>(rows, "the decoder's norm statistics");
    rstd_ = DeviceArray<float>(rows, "the decoder's norm statistics");
    lse_ = DeviceArray<float>(rows * static_cast<size_t>(cfg.num_heads), "the decoder's attention statistics");
    logits_ = DeviceArray<Elem>(static_cast<size_t>(cfg.padded_vocab_size), "the decoder's logits");
    if (cfg.positions == Positions::rope) {  // the training model's table, for the cache's positions
      rope_table_ = DeviceArray<float>(rows * static_cast<size_t>(cfg.head_size()), "the decoder's RoPE table");
      upload_floats(rope_table_.get(), rope_table(cfg.rope, cfg.head_size(), max_len), "the decoder's RoPE table");
    }
  }

  int length() const { return length_; }  // positions in the cache
  int max_len() const { return max_len_; }

  // Empties the cache, runs `tokens` (positions 0..n-1) through the model with the training
  // forward's attention, keeping every layer's keys and values; returns the logits of the last
  // position (vocab_size values).
  std::vector<float> prefill(const std::vector<int>& tokens) {
    length_ = 0;
    return run(tokens);
  }

  // The next position: `token` through every layer, attending over the cache; returns its logits.
  std::vector<float> append(int token) { return run({token}); }

 private:
  // Tensor `tensor`'s parameters (layer `layer`'s slice); nullptr for a tensor the architecture
  // lacks (wpe, a bias), which the kernels then skip.
  const Elem* param(int tensor, int layer = 0) const {
    return layout_[tensor].count == 0 ? nullptr : params_ + layout_.slice_offset(tensor, layer);
  }

  // Tokens at positions [length_, length_ + n): n = 1 decodes over the cache, n > 1 (an empty
  // cache only) is the prefill.
  std::vector<float> run(const std::vector<int>& tokens) {
    const int n = static_cast<int>(tokens.size()), pos = length_;
    if (n < 1 || n > max_len_ - pos)
      throw std::runtime_error("the decoder's cache holds " + std::to_string(max_len_) + " positions: " +
                               std::to_string(pos) + " used, " + std::to_string(n) + " more do not fit");
    if (n > 1 && pos > 0) throw std::runtime_error("the decoder prefills an empty cache only");
    for (int t : tokens)
      if (t < 0 || t >= cfg_.vocab_size)
        throw std::runtime_error("token " + std::to_string(t) + ": expected an id in [0, " +
                                 std::to_string(cfg_.vocab_size) + ") (the model's vocabulary)");
    const int C = cfg_.channels, NH = cfg_.num_heads, NKV = cfg_.kv_heads(), L = cfg_.num_layers;
    const int HS = cfg_.head_size(), QKV = cfg_.qkv_channels(), H = cfg_.hidden();
    const size_t layer_cache = static_cast<size_t>(max_len_) * NKV * HS;
    cudaStream_t s = stream_;
    cuda_check(cudaMemcpyAsync(tokens_.get(), tokens.data(), n * sizeof(int), cudaMemcpyHostToDevice, s),
               "uploading the decoder's tokens");
    // Learned positions: position pos's embedding row is wpe's row pos (none with RoPE).
    const Elem* wpe = param(kWpe);
    encoder_forward(x_.get(), tokens_.get(), param(kWte), wpe ? wpe + static_cast<size_t>(pos) * C : nullptr, 1, n, C, s);
    norm_forward(cfg_, ln_.get(), mean_.get(), rstd_.get(), x_.get(), param(kLn1w), param(kLn1b), n, s);
    for (int l = 0; l < L; ++l) {
      Elem* k_cache = k_cache_.get() + l * layer_cache;
      Elem* v_cache = v_cache_.get() + l * layer_cache;
      matmul_forward(qkv_.get(), ln_.get(), param(kQkvw, l), param(kQkvb, l), n, C, QKV, s);
      // RoPE: the new rows' q and k rotated at their positions pos.., before k enters the cache.
      if (cfg_.positions == Positions::rope)
        rope_forward(qkv_.get(), qkv_.get(), rope_table_.get(), max_len_, 1, n, NH + NKV, HS, QKV, pos, s);
      kv_cache_write(k_cache, v_cache, qkv_.get(), 1, n, pos, max_len_, C, NH, NKV, s);
      if (pos == 0) model_attention_forward(attention_, atty_.get(), lse_.get(), qkv_.get(), 1, n, C, NH, NKV, s);
      else attention_decode_forward(atty_.get(), qkv_.get(), k_cache, v_cache, 1, pos + 1, max_len_, C, NH, NKV, s);
      matmul_forward(branch_.get(), atty_.get(), param(kAttprojw, l), param(kAttprojb, l), n, C, C, s);
      residual_norm_forward(cfg_, residual2_.get(), ln_.get(), mean_.get(), rstd_.get(), x_.get(), branch_.get(),
                            param(kLn2w, l), param(kLn2b, l), n, s);
      if (cfg_.moe()) {
        expert_mlp_forward(cfg_, experts_.buffers(cfg_, n), branch_.get(), ln_.get(),
                           {param(kRouterw, l), param(kFcw, l), param(kFc2w, l), param(kFcprojw, l),
                            cfg_.router == Router::sigmoid ? param(kExpertBias, l) : nullptr},
                           n, s);
      } else {
        mlp_up_forward(cfg_, fch_.get(), fch_act_.get(), ln_.get(), param(kFcw, l), param(kFcb, l), param(kFc2w, l),
                       n, H, s);
        matmul_forward(branch_.get(), fch_act_.get(), param(kFcprojw, l), param(kFcprojb, l), n, H, C, s);
      }
      // The next layer's ln1, or after the last layer lnf.
      const bool last = l + 1 == L;
      residual_norm_forward(cfg_, x_.get(), ln_.get(), mean_.get(), rstd_.get(), residual2_.get(), branch_.get(),
                            last ? param(kLnfw) : param(kLn1w, l + 1), last ? param(kLnfb) : param(kLn1b, l + 1), n, s);
    }
    // The lm head (wte when tied, else lm_head) on the last position only.
    matmul_forward(logits_.get(), ln_.get() + static_cast<size_t>(n - 1) * C,
                   param(cfg_.tied_embeddings ? kWte : kLmHead), nullptr, 1, C, cfg_.padded_vocab_size, s);
    length_ = pos + n;
    return copy_floats_to_host(logits_.get(), static_cast<size_t>(cfg_.vocab_size), s);
  }

  const ModelConfig cfg_;
  const ParameterLayout layout_;
  const Elem* params_;
  const int max_len_;
  const AttentionKernel attention_;
  cudaStream_t stream_;
  int length_ = 0;
  DeviceArray<Elem> k_cache_, v_cache_;  // (L, max_len, NKV·HS) each
  DeviceArray<int> tokens_;
  DeviceArray<Elem> x_, residual2_, ln_, qkv_, atty_, branch_, fch_, fch_act_, logits_;
  DeviceArray<float> mean_, rstd_, lse_;
  DeviceArray<float> rope_table_;  // RoPE: (max_len, HS) cos/sin pairs (rope.cuh)
  ExpertWork<Elem> experts_;       // with experts: the mixture's buffers
};

// The tokens after `prompt`: prefill, then up to max_new_tokens tokens chosen by `settings`,
// each appended to the cache; a stop token (settings.stop_tokens) is the last one. on_token(id,
// logits) is called for each new token with the logits it was chosen from (may be empty).
template <typename Elem>
std::vector<int> generate_tokens(KvCacheDecoder<Elem>& decoder, const std::vector<int>& prompt, int max_new_tokens,
                                 const SamplingSettings& settings,
                                 const std::function<void(int, const std::vector<float>&)>& on_token = {}) {
  SplitMix64 rng{settings.seed};
  std::vector<int> generated;
  std::vector<float> logits = decoder.prefill(prompt);
  for (int i = 0; i < max_new_tokens; ++i) {
    const int token = choose_token(logits, settings, rng);
    generated.push_back(token);
    if (on_token) on_token(token, logits);
    if (std::find(settings.stop_tokens.begin(), settings.stop_tokens.end(), token) != settings.stop_tokens.end()) break;
    if (i + 1 < max_new_tokens) logits = decoder.append(token);
  }
  return generated;
}

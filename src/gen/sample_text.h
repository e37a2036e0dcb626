// sample_text.h — generated text around generate.h's tokens: the tokenizer of the model's
// vocabulary (vocabulary.h: GPT-2's src/tokenizer/gpt2_bpe.h or Llama 3's llama3_bpe.h, read from
// --vocab-dir) encoding --prompt and decoding tokens, the checks of --prompt, --max-new-tokens and
// --top-k against the model, and the sampling settings (with the vocabulary's stop tokens) of
// --generate and of the samples a training run logs every --sample-every steps.
#pragma once
#include "src/config/config.h"
#include "src/gen/generate.h"
#include "src/gen/vocabulary.h"
#include "src/config/model_config.h"
#include "src/base/rng.h"

#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

class TextSampler {
 public:
  // Reads the vocabulary of `model` (--vocab-dir, by default the vocabulary's own directory) and
  // encodes --prompt as the model's input (vocabulary.h: Llama 3's starts with BOS; GPT-2's empty
  // prompt is <|endoftext|>); the prompt and --max-new-tokens must fit the context of `model`
  // (from `model_source`): an error, not a silently shortened output. Errors are one line naming
  // the flag.
  TextSampler(const TrainConfig& cfg, const ModelConfig& model, const std::string& model_source)
      : max_new_tokens_(cfg.max_new_tokens), temperature_(cfg.temperature), top_k_(cfg.top_k),
        seed_(static_cast<uint64_t>(cfg.seed)),
        stop_tokens_(stop_tokens(text_vocabulary(model), model.vocab_size)) {
    const TextVocabulary vocabulary = text_vocabulary(model);
    const std::string vocab_dir = cfg.was_set("vocab-dir") ? cfg.vocab_dir : default_vocab_dir(vocabulary);
    try {
      bpe_ = load_tokenizer(vocabulary, vocab_dir);
    } catch (const std::exception& e) {
      throw std::runtime_error("--vocab-dir " + vocab_dir + ": " + e.what());
    }
    std::vector<uint32_t> ids;
    if (!cfg.prompt.empty()) PieceEncoder(*bpe_).encode(cfg.prompt, ids);
    prompt_ = prompt_tokens(vocabulary, std::vector<int>(ids.begin(), ids.end()));
    for (size_t i = 0; i < prompt_.size(); ++i)
      if (prompt_[i] >= model.vocab_size)
        throw std::runtime_error("--prompt: its token " + std::to_string(i) + " (id " + std::to_string(prompt_[i]) +
                                 ", '" + bpe_->token_bytes()[prompt_[i]] + "') is outside the vocabulary of " +
                                 model_source + " (" + std::to_string(model.vocab_size) + " tokens)");
    const long long prompt_len = static_cast<long long>(prompt_.size()), context = model.max_seq_len;
    if (prompt_len > context)
      throw std::runtime_error("--prompt: " + std::to_string(prompt_len) + " tokens, more than the context of " +
                               model_source + " (max_seq_len " + std::to_string(context) + ")");
    if (prompt_len + cfg.max_new_tokens > context)
      throw std::runtime_error("--max-new-tokens " + std::to_string(cfg.max_new_tokens) + ": the prompt's " +
                               std::to_string(prompt_len) + " token(s) and the new tokens exceed the context of " +
                               model_source + " (max_seq_len " + std::to_string(context) + "); at most " +
                               std::to_string(context - prompt_len) + " new token(s) fit");
    if (cfg.top_k > model.vocab_size)
      throw std::runtime_error("--top-k " + std::to_string(cfg.top_k) + ": more than the vocabulary of " +
                               model_source + " (" + std::to_string(model.vocab_size) +
                               " tokens; 0 samples from all of them)");
  }

  const std::vector<int>& prompt() const { return prompt_; }
  int max_new_tokens() const { return max_new_tokens_; }
  // Positions a decoder needs: the prompt and every new token but the last, which is never run.
  int cache_positions() const { return static_cast<int>(prompt_.size()) + max_new_tokens_ - 1; }

  // The bytes of `tokens` (a special token as its text, e.g. 50256 as "<|endoftext|>"); an id the
  // tokenizer lacks (a model with a larger vocabulary) as "<|id N|>".
  std::string decode(const std::vector<int>& tokens) const {
    const std::vector<std::string>& bytes = bpe_->token_bytes();
    std::string text;
    for (int id : tokens)
      text += id >= 0 && static_cast<size_t>(id) < bytes.size() ? bytes[id] : "<|id " + std::to_string(id) + "|>";
    return text;
  }

  // --temperature and --top-k with a draw stream from --seed, ending at the vocabulary's stop
  // tokens; `stream` > 0 gives another stream of the same seed (training: the step, so a resumed
  // run draws the same samples).
  SamplingSettings settings(uint64_t stream = 0) const {
    return {temperature_, top_k_, stream == 0 ? seed_ : splitmix64_mix(seed_ * kGoldenGamma + stream), stop_tokens_};
  }

  // "greedy" or "temperature 0.8, top-k 40, seed 1337".
  std::string describe_settings() const {
    if (temperature_ == 0.0) return "greedy";
    return "temperature " + config_detail::format_number(temperature_) + ", top-k " +
           (top_k_ == 0 ? std::string("all") : std::to_string(top_k_)) + ", seed " + std::to_string(seed_);
  }

 private:
  const int max_new_tokens_;
  const double temperature_;
  const int top_k_;
  const uint64_t seed_;
  const std::vector<int> stop_tokens_;
  std::unique_ptr<ByteBpe> bpe_;
  std::vector<int> prompt_;
};

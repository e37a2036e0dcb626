// vocabulary.h — which tokenizer a model's text goes through, told by its vocabulary size: Llama
// 3's (128,256 tokens) or else GPT-2's (50,257 tokens; a model with another size, such as a test
// model, is read and written with GPT-2's). Per vocabulary: the tokenizer and its default
// directory (--vocab-dir), the token a prompt starts with, and the tokens that end generation.
#pragma once
#include "src/config/model_config.h"
#include "src/tokenizer/gpt2_bpe.h"
#include "src/tokenizer/llama3_bpe.h"

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

enum class TextVocabulary { gpt2, llama3 };

inline TextVocabulary text_vocabulary(const ModelConfig& model) {
  return model.vocab_size == kLlama3VocabSize ? TextVocabulary::llama3 : TextVocabulary::gpt2;
}

// --vocab-dir's default for the vocabulary (scripts/install_deps.sh fetches both).
inline std::string default_vocab_dir(TextVocabulary v) {
  return v == TextVocabulary::llama3 ? "data/llama3_bpe" : "data/gpt2_bpe";
}

inline std::unique_ptr<ByteBpe> load_tokenizer(TextVocabulary v, const std::string& vocab_dir) {
  if (v == TextVocabulary::llama3) return std::make_unique<Llama3Bpe>(vocab_dir);
  return std::make_unique<Gpt2Bpe>(vocab_dir);
}

// The model's input for a prompt encoded as `text`: Llama 3 starts every sequence with BOS (as its
// training documents do); GPT-2 takes the text as it is, or <|endoftext|> alone for an empty one
// (the token that precedes its training documents).
inline std::vector<int> prompt_tokens(TextVocabulary v, const std::vector<int>& text) {
  const bool first = v == TextVocabulary::llama3 || text.empty();
  std::vector<int> tokens(text.size() + (first ? 1 : 0));
  if (first) tokens[0] = static_cast<int>(v == TextVocabulary::llama3 ? kLlama3BeginOfText : kEndOfText);
  std::copy(text.begin(), text.end(), tokens.begin() + (first ? 1 : 0));
  return tokens;
}

// The tokens after which generation stops, those of them inside a vocabulary of vocab_size ids:
// GPT-2's <|endoftext|>; Llama 3's <|end_of_text|> (EOS) and <|eot_id|> (end of a turn).
inline std::vector<int> stop_tokens(TextVocabulary v, int vocab_size) {
  const std::vector<uint32_t> ids = v == TextVocabulary::llama3
                                        ? std::vector<uint32_t>{kLlama3EndOfText, kLlama3EndOfTurn}
                                        : std::vector<uint32_t>{kEndOfText};
  std::vector<int> stops;
  for (uint32_t id : ids)
    if (id < static_cast<uint32_t>(vocab_size)) stops.push_back(static_cast<int>(id));
  return stops;
}

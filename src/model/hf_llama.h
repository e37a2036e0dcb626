// hf_llama.h — Hugging Face Llama checkpoints (docs/FORMATS.md, "Hugging Face Llama directory"):
// a directory's config.json as a ModelConfig, its model.safetensors (or the shards its
// model.safetensors.index.json names) as our tensors in llm.c order, and the directory written
// from them. Hugging Face stores q_proj and k_proj with the rows of each head permuted for its
// rotate-half RoPE (row j·HS/2 + i holds Meta's row 2i + j); our RoPE rotates Meta's adjacent
// pairs, so reading undoes the permutation and writing applies it. Everything we do not implement
// (another RoPE scaling, biases, experts, a tie flag the tensors contradict) is refused in one
// line naming the key, tensor or file. A Mixtral directory (model_type "mixtral": MixtralForCausalLM)
// is the same with each MLP a mixture of experts: block_sparse_moe.gate and experts.{j}.w1/w2/w3.
#pragma once
#include "src/config/model_config.h"

#include <functional>
#include <string>
#include <vector>

// Whether PATH names a directory (an --init-from of a Hugging Face checkpoint, not a model file).
bool is_directory(const std::string& path);

// DIR/config.json as a ModelConfig (checked: check_model_config). Vp is V rounded up to a multiple of 8.
ModelConfig read_hf_llama_config(const std::string& dir);

// DIR's tensors in llm.c order as float: tensor(i, values) for every tensor of `config`'s
// layout with elements, all layers of a per-layer tensor together (wte's padding rows zero).
void read_hf_llama_tensors(const std::string& dir, const ModelConfig& config,
                           const std::function<void(int, const std::vector<float>&)>& tensor);

// Throws unless `config` is a Llama (a Hugging Face directory holds no GPT-2 of ours) and DIR can be
// written: a directory (not one holding a sharded checkpoint's index), or a name in one; the
// message starts with DIR.
void check_hf_export(const ModelConfig& config, const std::string& dir);

// Writes DIR/config.json and DIR/model.safetensors (values as `dtype`: F32 or BF16) from
// tensor(i), our tensor i's values in llm.c order, asked for once each in order. DIR is created
// if missing; each file appears whole or not at all.
void write_hf_llama(const std::string& dir, const ModelConfig& config, DType dtype,
                    const std::function<std::vector<float>(int)>& tensor);

// The rows of one projection's weight (heads × HS rows of `columns` values) between Meta's
// adjacent-pair order and Hugging Face's rotate-half order.
std::vector<float> rotate_half_rows(const std::vector<float>& meta, int heads, int head_size, int columns);
std::vector<float> adjacent_pair_rows(const std::vector<float>& hf, int heads, int head_size, int columns);

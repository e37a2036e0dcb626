// hf_llama.cpp — Hugging Face Llama directories read into and written from our layout
#include "src/model/hf_llama.h"

#include "src/base/durable_file.h"
#include "src/model/safetensors.h"
#include "src/tokenizer/llama3_bpe.h"

#include <nlohmann/json.hpp>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <stdexcept>
#include <type_traits>

namespace {

using nlohmann::json;

constexpr char kConfigName[] = "config.json";
constexpr char kSingleFile[] = "model.safetensors";
constexpr char kIndexName[] = "model.safetensors.index.json";

json read_json(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw file_error(path, "cannot open", errno);
  std::stringstream text;
  text << in.rdbuf();
  try {
    return json::parse(text.str());
  } catch (const json::exception& e) {
    throw std::runtime_error(path + ": not valid JSON (" + e.what() + ")");
  }
}

// config.json's key `key` as T; `fallback` when absent (nullptr: the key is required).
template <typename T>
T config_value(const json& config, const std::string& path, const char* key, const T* fallback) {
  const auto it = config.find(key);
  if (it == config.end() || it->is_null()) {
    if (fallback == nullptr) throw std::runtime_error(path + ": key " + key + " is missing");
    return *fallback;
  }
  const bool fits = std::is_same<T, bool>::value ? it->is_boolean()
                    : std::is_integral<T>::value ? it->is_number_integer()
                                                  : it->is_number();
  if (!fits) throw std::runtime_error(path + ": key " + key + " is " + it->dump() + ", expected a " +
                                      (std::is_same<T, bool>::value ? "boolean" : "number"));
  return it->get<T>();
}

// The RoPE settings of config.json: rope_theta, and rope_scaling null (or "default") or Llama 3's.
RopeConfig read_rope(const json& config, const std::string& path) {
  const float default_theta = 10000.0f;
  RopeConfig rope{config_value<float>(config, path, "rope_theta", &default_theta)};
  const auto scaling = config.find("rope_scaling");
  if (scaling == config.end() || scaling->is_null()) return rope;
  if (!scaling->is_object()) throw std::runtime_error(path + ": key rope_scaling is not an object or null");
  const auto type = scaling->contains("rope_type") ? scaling->find("rope_type") : scaling->find("type");
  const std::string name = type != scaling->end() && type->is_string() ? type->get<std::string>() : "";
  if (name == "default") return rope;
  if (name != "llama3")
    throw std::runtime_error(path + ": key rope_scaling.rope_type is " + (name.empty() ? "missing" : name) +
                             "; train_gpt implements only Llama 3's (\"llama3\") or none");
  const std::string scaling_path = path + ": rope_scaling";
  rope.scaled = true;
  rope.factor = config_value<float>(*scaling, scaling_path, "factor", nullptr);
  rope.low_freq_factor = config_value<float>(*scaling, scaling_path, "low_freq_factor", nullptr);
  rope.high_freq_factor = config_value<float>(*scaling, scaling_path, "high_freq_factor", nullptr);
  rope.original_context = config_value<int>(*scaling, scaling_path, "original_max_position_embeddings", nullptr);
  return rope;
}

// What a Llama or Mixtral config.json may say that the transformer we train does not do: refused
// by key. Returns whether it is a Mixtral (a mixture of experts).
bool refuse_unsupported(const json& config, const std::string& path) {
  const std::string type = config.value("model_type", std::string());
  if (type != "llama" && type != "mixtral")
    throw std::runtime_error(path + ": key model_type is " + (type.empty() ? "missing" : "\"" + type + "\"") +
                             ", expected \"llama\" or \"mixtral\"");
  const bool mixtral = type == "mixtral";
  for (const char* key : {"attention_bias", "mlp_bias"}) {
    const bool no = false;
    if (config_value<bool>(config, path, key, &no))
      throw std::runtime_error(path + ": key " + std::string(key) + " is true; train_gpt's Llama has no biases");
  }
  for (const auto& item : config.items()) {
    const std::string& key = item.key();
    if (!mixtral && (key.find("expert") != std::string::npos || key.rfind("moe", 0) == 0) && !item.value().is_null())
      throw std::runtime_error(path + ": key " + key + " describes a mixture of experts, and model_type is \"llama\"");
  }
  if (mixtral) {
    const float no_noise = 0.0f;
    if (config_value<float>(config, path, "router_jitter_noise", &no_noise) != 0.0f)
      throw std::runtime_error(path + ": key router_jitter_noise is not 0; train_gpt's router adds no noise");
    const auto window = config.find("sliding_window");
    if (window != config.end() && !window->is_null())
      throw std::runtime_error(path + ": key sliding_window is " + window->dump() + "; train_gpt's attention is causal "
                               "over the whole sequence (null)");
  }
  const auto act = config.find("hidden_act");
  if (act != config.end() && *act != "silu")
    throw std::runtime_error(path + ": key hidden_act is " + act->dump() + ", expected \"silu\" (SwiGLU)");
  return mixtral;
}

// Meta's row 2i + j of a head is Hugging Face's row j·HS/2 + i (j in {0, 1}, i < HS/2).
std::vector<float> permute_rows(const std::vector<float>& in, int heads, int head_size, int columns, bool to_hf) {
  std::vector<float> out(in.size());
  const size_t C = static_cast<size_t>(columns), half = static_cast<size_t>(head_size) / 2;
  for (size_t h = 0; h < static_cast<size_t>(heads); ++h)
    for (size_t i = 0; i < half; ++i)
      for (size_t j = 0; j < 2; ++j) {
        const size_t meta = h * head_size + 2 * i + j, hf = h * head_size + j * half + i;
        const size_t from = to_hf ? meta : hf, to = to_hf ? hf : meta;
        std::copy_n(in.begin() + static_cast<std::ptrdiff_t>(from * C), C, out.begin() + static_cast<std::ptrdiff_t>(to * C));
      }
  return out;
}

// Hugging Face's name and shape of each piece of our tensor i in layer `layer`: qkvw is three.
struct HfPiece {
  std::string name;
  std::vector<int64_t> shape;
  int permuted_heads = 0;  // q_proj, k_proj: heads whose rows Hugging Face permutes
};

std::vector<HfPiece> hf_pieces(const ModelConfig& c, int i, int layer) {
  const int64_t C = c.channels, V = c.vocab_size, H = c.hidden(), HS = c.head_size();
  const std::string p = "model.layers." + std::to_string(layer) + ".";
  if (c.moe() && (i == kRouterw || i == kFcw || i == kFc2w || i == kFcprojw)) {  // Mixtral's names
    if (i == kRouterw) return {{p + "block_sparse_moe.gate.weight", {c.num_experts, C}}};
    std::vector<HfPiece> experts;
    for (int j = 0; j < c.num_experts; ++j) {
      const std::string e = p + "block_sparse_moe.experts." + std::to_string(j) + ".";
      if (i == kFcw) experts.push_back({e + "w1.weight", {H, C}});
      if (i == kFc2w) experts.push_back({e + "w3.weight", {H, C}});
      if (i == kFcprojw) experts.push_back({e + "w2.weight", {C, H}});
    }
    return experts;
  }
  switch (i) {
    case kWte: return {{"model.embed_tokens.weight", {V, C}}};
    case kLn1w: return {{p + "input_layernorm.weight", {C}}};
    case kQkvw:
      return {{p + "self_attn.q_proj.weight", {c.num_heads * HS, C}, c.num_heads},
              {p + "self_attn.k_proj.weight", {c.kv_heads() * HS, C}, c.kv_heads()},
              {p + "self_attn.v_proj.weight", {c.kv_heads() * HS, C}}};
    case kAttprojw: return {{p + "self_attn.o_proj.weight", {C, C}}};
    case kLn2w: return {{p + "post_attention_layernorm.weight", {C}}};
    case kFcw: return {{p + "mlp.gate_proj.weight", {H, C}}};
    case kFc2w: return {{p + "mlp.up_proj.weight", {H, C}}};
    case kFcprojw: return {{p + "mlp.down_proj.weight", {C, H}}};
    case kLnfw: return {{"model.norm.weight", {C}}};
    case kLmHead: return {{"lm_head.weight", {V, C}}};
    default: return {};
  }
}

std::string shape_text(const std::vector<int64_t>& shape) { return json(shape).dump(); }

// The tensors of a directory: model.safetensors, or the shards model.safetensors.index.json names.
class HfTensorFiles {
 public:
  explicit HfTensorFiles(const std::string& dir) {
    const std::string index = dir + "/" + kIndexName;
    struct stat st {};
    if (::stat(index.c_str(), &st) != 0) {
      const std::string single = dir + "/" + kSingleFile;
      if (::stat(single.c_str(), &st) != 0)
        throw std::runtime_error(dir + ": neither " + kSingleFile + " nor " + kIndexName + " (not a Hugging Face checkpoint?)");
      files_[kSingleFile] = std::make_unique<SafetensorsReader>(single);
      for (const auto& t : files_[kSingleFile]->tensors()) where_[t.first] = kSingleFile;
      return;
    }
    const json doc = read_json(index);
    const auto map = doc.find("weight_map");
    if (map == doc.end() || !map->is_object()) throw std::runtime_error(index + ": key weight_map is missing");
    for (const auto& item : map->items()) {
      if (!item.value().is_string()) throw std::runtime_error(index + ": weight_map." + item.key() + " is not a file name");
      const std::string file = item.value().get<std::string>();
      if (file.find('/') != std::string::npos)
        throw std::runtime_error(index + ": weight_map." + item.key() + " names " + file + ", outside the directory");
      if (!files_.count(file)) {
        const std::string path = dir + "/" + file;
        if (::stat(path.c_str(), &st) != 0) throw std::runtime_error(path + ": shard missing (named by " + index + ")");
        files_[file] = std::make_unique<SafetensorsReader>(path);
      }
      if (!files_[file]->has(item.key()))
        throw std::runtime_error(dir + "/" + file + ": no tensor " + item.key() + " (where " + kIndexName + " puts it)");
      where_[item.key()] = file;
    }
    for (const auto& f : files_)
      for (const auto& t : f.second->tensors())
        if (!where_.count(t.first))
          throw std::runtime_error(f.second->path() + ": tensor " + t.first + " is not in " + index + "'s weight_map");
  }

  bool has(const std::string& name) const { return where_.count(name) != 0; }
  const std::map<std::string, std::string>& names() const { return where_; }

  // Tensor `name` checked against `shape`, as float.
  std::vector<float> read(const std::string& dir, const std::string& name, const std::vector<int64_t>& shape) const {
    const auto it = where_.find(name);
    if (it == where_.end()) throw std::runtime_error(dir + ": tensor " + name + " is missing");
    const SafetensorsReader& file = *files_.at(it->second);
    if (file.tensor(name).shape != shape)
      throw std::runtime_error(file.path() + ": tensor " + name + " has shape " + shape_text(file.tensor(name).shape) +
                               ", config.json gives " + shape_text(shape));
    return file.read_floats(name);
  }

 private:
  std::map<std::string, std::unique_ptr<SafetensorsReader>> files_;
  std::map<std::string, std::string> where_;  // tensor name → file name
};

// A float's shortest decimal that reads back as the same float, as a JSON number (1e-05, not
// 9.999999747378752e-06).
double json_float(float v) {
  char text[32];
  for (int digits = 6; digits <= 9; ++digits) {
    std::snprintf(text, sizeof text, "%.*g", digits, static_cast<double>(v));
    if (std::strtof(text, nullptr) == v) break;
  }
  return std::strtod(text, nullptr);
}

}  // namespace

bool is_directory(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

std::vector<float> rotate_half_rows(const std::vector<float>& meta, int heads, int head_size, int columns) {
  return permute_rows(meta, heads, head_size, columns, true);
}

std::vector<float> adjacent_pair_rows(const std::vector<float>& hf, int heads, int head_size, int columns) {
  return permute_rows(hf, heads, head_size, columns, false);
}

ModelConfig read_hf_llama_config(const std::string& dir) {
  const std::string path = dir + "/" + kConfigName;
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    throw std::runtime_error(dir + ": is a directory without " + kConfigName + "; expected an llm.c model file or a "
                             "Hugging Face Llama directory");
  const json config = read_json(path);
  if (!config.is_object()) throw std::runtime_error(path + ": expected a JSON object");
  const bool mixtral = refuse_unsupported(config, path);
  const int channels = config_value<int>(config, path, "hidden_size", nullptr);
  const int heads = config_value<int>(config, path, "num_attention_heads", nullptr);
  const int default_context = 2048;
  const bool untied = false;
  const float default_eps = 1e-6f;
  ModelConfig c = llama3_config(config_value<int>(config, path, "max_position_embeddings", &default_context),
                                config_value<int>(config, path, "vocab_size", nullptr),
                                config_value<int>(config, path, "num_hidden_layers", nullptr), heads,
                                config_value<int>(config, path, "num_key_value_heads", &heads), channels,
                                config_value<int>(config, path, "intermediate_size", nullptr), read_rope(config, path),
                                config_value<bool>(config, path, "tie_word_embeddings", &untied));
  c.norm_eps = config_value<float>(config, path, "rms_norm_eps", &default_eps);
  c.padded_vocab_size = (c.vocab_size + 7) / 8 * 8;
  if (mixtral) {  // softmax top-K routing with gates renormalised over the K; Hugging Face's default coefficient
    const float default_coef = 0.001f;
    c = with_experts(c, config_value<int>(config, path, "num_local_experts", nullptr),
                     config_value<int>(config, path, "num_experts_per_tok", nullptr), Router::softmax,
                     config_value<float>(config, path, "router_aux_loss_coef", &default_coef));
  }
  if (heads > 0 && channels % heads == 0) {
    const int head_size = channels / heads;
    if (config_value<int>(config, path, "head_dim", &head_size) != head_size)
      throw std::runtime_error(path + ": key head_dim is not hidden_size / num_attention_heads = " +
                               std::to_string(head_size) + "; train_gpt's heads span the width");
  }
  check_model_config(c, path);
  return c;
}

void read_hf_llama_tensors(const std::string& dir, const ModelConfig& config,
                           const std::function<void(int, const std::vector<float>&)>& tensor) {
  const HfTensorFiles files(dir);
  const ParameterLayout layout(config);
  const std::string config_path = dir + "/" + kConfigName;
  if (config.tied_embeddings && files.has("lm_head.weight")) {
    // A file may store the tied head as well; it must then be the embedding.
    const std::vector<int64_t> shape{config.vocab_size, config.channels};
    if (files.read(dir, "lm_head.weight", shape) != files.read(dir, "model.embed_tokens.weight", shape))
      throw std::runtime_error(config_path + ": key tie_word_embeddings is true, but tensor lm_head.weight differs "
                               "from model.embed_tokens.weight");
  }
  if (!config.tied_embeddings && !files.has("lm_head.weight"))
    throw std::runtime_error(config_path + ": key tie_word_embeddings is false, but the checkpoint has no tensor "
                             "lm_head.weight (set it true if the head is the embedding)");
  std::set<std::string> used{"lm_head.weight"};
  for (int i = 0; i < kNumParameterTensors; ++i) {
    if (layout[i].count == 0) continue;
    std::vector<float> values;
    values.reserve(layout[i].count);
    const int layers = is_layer_tensor(i) ? config.num_layers : 1;
    for (int l = 0; l < layers; ++l)
      for (const HfPiece& piece : hf_pieces(config, i, l)) {
        std::vector<float> v = files.read(dir, piece.name, piece.shape);
        if (piece.permuted_heads > 0)
          v = adjacent_pair_rows(v, piece.permuted_heads, config.head_size(), config.channels);
        values.insert(values.end(), v.begin(), v.end());
        used.insert(piece.name);
      }
    if (values.size() > layout[i].count)
      throw std::runtime_error(dir + ": tensor " + layout[i].name + " holds more values than its layout");
    values.resize(layout[i].count, 0.0f);  // wte and lm_head: zero padding rows V..Vp-1
    tensor(i, values);
  }
  for (const auto& name : files.names()) {
    const bool derived = name.first.find("rotary_emb.inv_freq") != std::string::npos;  // a buffer, not a weight
    if (!used.count(name.first) && !derived)
      throw std::runtime_error(dir + ": tensor " + name.first + " is not part of train_gpt's Llama or Mixtral (a bias?)");
  }
}

void check_hf_export(const ModelConfig& c, const std::string& dir) {
  if (!c.is_llama())
    throw std::runtime_error(dir + ": a Hugging Face directory is written for Llama 3 models only; this one is GPT-2's (" +
                             describe(c) + "; dev/export_hf.py exports GPT-2)");
  if (c.moe() && c.router != Router::softmax)
    throw std::runtime_error(dir + ": a Hugging Face Mixtral routes by softmax; this model's router is " +
                             router_name(c.router));
  struct stat st {};
  if (::stat(dir.c_str(), &st) == 0 ? !S_ISDIR(st.st_mode) : !is_directory(parent_directory(dir)))
    throw std::runtime_error(dir + ": expected a directory, or a new name in an existing one");
  // Its index would still name the old shards, and a reader would take them over our model.safetensors.
  const std::string index = dir + "/" + kIndexName;
  if (::stat(index.c_str(), &st) == 0)
    throw std::runtime_error(index + ": the directory holds a sharded checkpoint, which the export's " + kSingleFile +
                             " would not replace; export into another directory");
}

void write_hf_llama(const std::string& dir, const ModelConfig& c, DType dtype,
                    const std::function<std::vector<float>(int)>& tensor) {
  check_hf_export(c, dir);
  if (!is_directory(dir) && ::mkdir(dir.c_str(), 0755) != 0) throw file_error(dir, "cannot create", errno);
  const ParameterLayout layout(c);
  const SafetensorsDType stored = dtype == DType::fp32 ? SafetensorsDType::f32 : SafetensorsDType::bf16;
  std::vector<SafetensorsEntry> entries;
  for (int i = 0; i < kNumParameterTensors; ++i)
    for (int l = 0; l < (is_layer_tensor(i) ? c.num_layers : 1) && layout[i].count > 0; ++l)
      for (const HfPiece& piece : hf_pieces(c, i, l)) entries.push_back({piece.name, stored, piece.shape});
  SafetensorsWriter out(dir + "/" + kSingleFile, entries, {{"format", "pt"}});
  for (int i = 0; i < kNumParameterTensors; ++i) {
    if (layout[i].count == 0) continue;
    const std::vector<float> values = tensor(i);
    size_t at = 0;
    for (int l = 0; l < (is_layer_tensor(i) ? c.num_layers : 1); ++l)
      for (const HfPiece& piece : hf_pieces(c, i, l)) {
        size_t n = 1;
        for (int64_t d : piece.shape) n *= static_cast<size_t>(d);
        std::vector<float> v(values.begin() + static_cast<std::ptrdiff_t>(at),
                             values.begin() + static_cast<std::ptrdiff_t>(at + n));
        if (piece.permuted_heads > 0) v = rotate_half_rows(v, piece.permuted_heads, c.head_size(), c.channels);
        out.write(v);
        at += n;
      }
  }
  json rope_scaling = nullptr;
  if (c.rope.scaled)
    rope_scaling = {{"rope_type", "llama3"}, {"factor", json_float(c.rope.factor)},
                    {"low_freq_factor", json_float(c.rope.low_freq_factor)},
                    {"high_freq_factor", json_float(c.rope.high_freq_factor)},
                    {"original_max_position_embeddings", c.rope.original_context}};
  nlohmann::ordered_json config = {
      {"architectures", {c.moe() ? "MixtralForCausalLM" : "LlamaForCausalLM"}},
      {"model_type", c.moe() ? "mixtral" : "llama"}, {"hidden_size", c.channels},
      {"intermediate_size", c.hidden()}, {"num_hidden_layers", c.num_layers}, {"num_attention_heads", c.num_heads},
      {"num_key_value_heads", c.kv_heads()}, {"head_dim", c.head_size()}, {"vocab_size", c.vocab_size},
      {"max_position_embeddings", c.max_seq_len}, {"rms_norm_eps", json_float(c.norm_eps)},
      {"rope_theta", json_float(c.rope.theta)}, {"rope_scaling", rope_scaling},
      {"tie_word_embeddings", c.tied_embeddings}, {"attention_bias", false}, {"mlp_bias", false},
      {"hidden_act", "silu"}, {"torch_dtype", dtype == DType::fp32 ? "float32" : "bfloat16"},
      {"initializer_range", 0.02}, {"pretraining_tp", 1}, {"use_cache", true}};
  if (c.moe()) {
    config["num_local_experts"] = c.num_experts;
    config["num_experts_per_tok"] = c.experts_per_token;
    config["router_aux_loss_coef"] = json_float(c.aux_loss_coef);
    config["router_jitter_noise"] = 0.0;
    config["output_router_logits"] = false;
    config["sliding_window"] = nullptr;
    config.erase("pretraining_tp");
    config.erase("mlp_bias");
  }
  if (c.vocab_size == kLlama3VocabSize) {  // Meta's vocabulary: its <|begin_of_text|> and <|end_of_text|>
    config["bos_token_id"] = kLlama3BeginOfText;
    config["eos_token_id"] = kLlama3EndOfText;
  }
  const std::string text = config.dump(2) + "\n";
  AtomicFileWriter config_file(dir + "/" + kConfigName);
  config_file.write(text.data(), text.size());
  out.commit();  // the tensors first: a config.json never describes tensors that are not there
  config_file.commit();
}

// tensor_split.cpp — which parts of the model's tensors a tensor-parallel rank holds
#include "src/dist/tensor_split.h"

#include "src/config/model_config.h"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

bool expert_tensor(int tensor) { return tensor == kFcw || tensor == kFc2w || tensor == kFcprojw; }

bool tp_replicated(int tensor, bool mixture) {
  if (mixture && expert_tensor(tensor)) return true;
  switch (tensor) {
    case kWpe: case kLn1w: case kLn1b: case kAttprojb: case kLn2w: case kLn2b: case kFcprojb: case kRouterw: case kExpertBias:
    case kLnfw: case kLnfb:
      return true;
    default:
      return false;
  }
}

void check_tensor_split(const ModelConfig& c, int size, const std::string& flag) {
  if (size < 1) throw std::runtime_error(flag + ": expected at least 1, found " + std::to_string(size));
  if (c.num_heads % size != 0)
    throw std::runtime_error(flag + " " + std::to_string(size) + ": each rank holds whole heads, so it must divide NH = " +
                             std::to_string(c.num_heads));
  if (c.kv_heads() % size != 0)
    throw std::runtime_error(flag + " " + std::to_string(size) + ": each rank holds whole K/V heads, so it must divide "
                             "NKV = " + std::to_string(c.kv_heads()));
  if (c.hidden() % (8 * size) != 0)
    throw std::runtime_error(flag + " " + std::to_string(size) + ": each rank holds H/" + std::to_string(size) +
                             " MLP hidden units, a multiple of 8, so 8*" + std::to_string(size) +
                             " must divide H = " + std::to_string(c.hidden()));
  if (c.padded_vocab_size % (8 * size) != 0)
    throw std::runtime_error(flag + " " + std::to_string(size) + ": each rank holds Vp/" + std::to_string(size) +
                             " vocabulary rows, a multiple of 8, so 8*" + std::to_string(size) +
                             " must divide the padded vocabulary Vp = " + std::to_string(c.padded_vocab_size));
}

StagePart StagePart::whole(int num_layers) {
  StagePart part;
  for (int l = 0; l < num_layers; ++l) part.layers.push_back(l);
  part.chunks = {num_layers};
  return part;
}

StagePart StagePart::of_rank(const std::vector<int>& chunk_layers, int p, int rank) {
  StagePart part;
  const int S = static_cast<int>(chunk_layers.size());
  for (int s = 0, first = 0; s < S; first += chunk_layers[s++]) {
    if (s % p != rank) continue;
    for (int l = first; l < first + chunk_layers[s]; ++l) part.layers.push_back(l);
    part.chunks.push_back(chunk_layers[s]);
  }
  part.embedding = rank == 0;
  part.head = (S - 1) % p == rank;
  return part;
}

std::vector<int> pipeline_chunk_layers(const PipelineParts& parts) {
  const int p = parts.size();
  std::vector<int> layers;
  for (size_t c = 0; c < parts.stages[0].chunks.size(); ++c)
    for (int r = 0; r < p; ++r) layers.push_back(parts.stages[r].chunks[c]);
  return layers;
}

bool stage_holds(const ModelConfig& c, const StagePart& part, int tensor) {
  if (is_layer_tensor(tensor)) return !part.layers.empty();
  switch (tensor) {
    case kWte: return part.embedding || (part.head && c.tied_embeddings);
    case kWpe: return part.embedding;
    default: return part.head;  // lnfw, lnfb, lm_head
  }
}

TensorSplit::TensorSplit(const ModelConfig& c, int size, int rank, const StagePart& stage, int ep_size, int ep_rank)
    : config_(c), size_(size), rank_(rank), stage_(stage), ep_size_(ep_size), ep_rank_(ep_rank), global_(c) {
  if (ep_size > 1 && (!c.moe() || c.num_experts % ep_size != 0))
    throw std::runtime_error("--ep " + std::to_string(ep_size) + ": needs experts and E divisible by it");
  for (int l : stage.layers)
    if (l < 0 || l >= c.num_layers)
      throw std::runtime_error("pipeline stage: layer " + std::to_string(l) + " outside the model's " +
                               std::to_string(c.num_layers));
  const size_t C = c.channels, HS = c.head_size(), H = c.hidden(), Fl = H / size;
  const size_t Vl = static_cast<size_t>(c.padded_vocab_size) / size, t = static_cast<size_t>(rank);
  // q, k and v: their rows in the fused product, and the rank's share of each (whole heads).
  const size_t part_rows[3] = {c.num_heads * HS, c.kv_heads() * HS, c.kv_heads() * HS};
  const size_t part_first[3] = {0, part_rows[0], part_rows[0] + part_rows[1]};
  for (int i = 0; i < kNumParameterTensors; ++i) {
    std::vector<SplitRun>& r = runs_[i];
    if (global_[i].count == 0 || !stage_holds(c, stage, i)) continue;
    size_t local = 0;
    // A mixture's experts are whole on every TP rank (each runs them on its own rows: docs/MOE.md);
    // an EP rank holds its experts' (each expert's w1, w3, w2 one contiguous block).
    const bool whole_experts = c.moe() && expert_tensor(i);
    if (whole_experts && ep_size > 1) {
      const size_t block = global_.slice_count(i) / ep_size;
      r.push_back({0, static_cast<size_t>(ep_rank) * block, block});
      continue;
    }
    switch (whole_experts ? -1 : i) {
      case kWte: case kLmHead: r.push_back({0, t * Vl * C, Vl * C}); break;
      case kQkvw: case kQkvb: {
        const size_t width = i == kQkvw ? C : 1;
        for (size_t p = 0; p < 3; ++p) {
          const size_t rows = part_rows[p] / size;
          r.push_back({local, (part_first[p] + t * rows) * width, rows * width});
          local += rows * width;
        }
        break;
      }
      case kAttprojw:
        for (size_t o = 0; o < C; ++o) r.push_back({o * (C / size), o * C + t * (C / size), C / size});
        break;
      case kFcw: case kFc2w: r.push_back({0, t * Fl * C, Fl * C}); break;
      case kFcb: r.push_back({0, t * Fl, Fl}); break;
      case kFcprojw:
        for (size_t o = 0; o < C; ++o) r.push_back({o * Fl, o * H + t * Fl, Fl});
        break;
      default: r.push_back({0, 0, global_.slice_count(i)}); break;
    }
  }
  // The local layout: llm.c's order with each tensor's part.
  local_ = global_;
  local_.num_layers = stage.layers.size();
  local_.total = 0;
  for (int i = 0; i < kNumParameterTensors; ++i) {
    size_t slice = 0;
    for (const SplitRun& run : runs_[i]) slice += run.count;
    local_.tensors[i].count = slice * (is_layer_tensor(i) ? local_.num_layers : 1);
    local_.tensors[i].offset = local_.total;
    local_.total += local_.tensors[i].count;
  }
}

size_t TensorSplit::to_global(size_t param, size_t* run_left) const {
  int i = kNumParameterTensors - 1;
  while (i > 0 && (local_[i].offset > param || local_[i].count == 0)) --i;
  const size_t within = param - local_[i].offset, slice = local_.slice_count(i);
  const size_t layer = is_layer_tensor(i) ? within / slice : 0, q = within - layer * slice;
  const size_t global_layer = is_layer_tensor(i) ? static_cast<size_t>(stage_.layers[layer]) : 0;
  const std::vector<SplitRun>& r = runs_[i];
  const auto run = std::prev(std::upper_bound(r.begin(), r.end(), q, [](size_t v, const SplitRun& s) { return v < s.local; }));
  *run_left = run->count - (q - run->local);
  return global_[i].offset + global_layer * global_.slice_count(i) + run->global + (q - run->local);
}

// pipeline_stages.h — which layers each pipeline chunk holds: the cut of a model's L layers into
// p·v contiguous chunks (p pipeline ranks, v chunks per rank), from --pp-layers or balanced by cost.
//
// Chunks are numbered 0..p·v-1 in model order and chunk s lives on pipeline rank s % p
// (pipeline_schedule.h's words). Chunk 0 also holds the embedding (wte, and wpe for GPT-2); chunk
// p·v-1 the final norm, the LM head and the loss.
//
// Cost model (forward + backward FLOPs per trained token, throughput.h's convention: 6 per
// parameter, attention's 6·C·T): a layer costs 6·(its parameters) + 6·C·T, every layer alike;
// the embedding is a lookup (0); the final norm's few parameters count 0 and the LM head 6·C·Vp
// (its product with the Vp-wide vocabulary, forward and backward), tied or untied alike.
//
// Balanced by cost: the cut that minimizes the largest chunk's cost (exactly, by dynamic
// programming), every chunk at least one layer. Ties are broken from the LAST chunk backwards:
// each chunk is the one that keeps that least largest cost, then leaves the chunks before it the
// least largest cost among themselves (the most balanced), then holds the most layers. Spare
// layers so go to later chunks, because under 1f1b pipeline rank r keeps p - r micro-batches'
// activations alive: the first ranks are the ones short of memory. (GPT-2 d12 at --pp 4, T 1024:
// the LM head costs about 4.9 layers, so the cut is 3, 4, 4, 1.)
//
// --pp-layers: one count per pipeline rank (first to last), summing to L, each a multiple of v;
// rank r's count is split into v equal chunks (chunks r, r + p, ...).
#pragma once
#include "src/config/config.h"
#include "src/config/model_config.h"

#include <vector>

struct PipelineStages {
  int stages = 1, virtual_stages = 1;  // p, v
  // Per chunk s in 0..p·v-1 (model order; chunk s lives on rank s % p): its first global layer and
  // its layer count (>= 1).
  std::vector<int> chunk_first, chunk_layers;
  // The global layers pipeline rank `rank` holds, in chunk order (chunks rank, rank + p, ...).
  std::vector<int> rank_layers(int rank) const;
  int chunks() const { return stages * virtual_stages; }
};

// The cost model above, per trained token: one layer's at sequence length `seq_len`, and what the
// last chunk adds (the LM head).
long long pipeline_layer_cost(const ModelConfig& model, int seq_len);
long long pipeline_head_cost(const ModelConfig& model);

// The chunks of `model` over `pp` ranks x `virtual_stages` chunks: --pp-layers's counts (each
// rank's split into v equal chunks), or balanced by cost when `pp_layers` is empty. `seq_len`
// is the attention term's T (0: the model's max_seq_len). Throws std::invalid_argument, one line
// naming the flag: pp < 1, v < 1, more chunks than layers, a --pp-layers count per rank that is
// not one per rank, below 1, not a multiple of --pp-virtual, or that does not sum to L.
PipelineStages plan_pipeline_stages(const ModelConfig& model, int pp, int virtual_stages,
                                    const std::vector<int>& pp_layers, int seq_len = 0);

// The model-dependent checks of --pp, --pp-virtual and --pp-layers (plan_pipeline_stages's
// errors), before anything is allocated.
void check_pipeline_split(const ModelConfig& model, const TrainConfig& cfg);

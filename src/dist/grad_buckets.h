// grad_buckets.h — where the parameter gradients live for communication and which elements each
// rank owns: the gradient buffer is a sequence of buckets in backward order (runs of consecutive
// layers from the top, ~--bucket-mib each, then wte/wpe/lnf), each bucket split into one equal
// chunk per rank; rank r owns chunk r of every bucket (its gradients, optimizer state and the
// parameters it updates). Host arithmetic only: the gradient buffers (grad_sync.h), the AdamW
// update (optimizer.h), checkpoints and their resharding (checkpoint.h) and the memory plan all
// read their sizes and offsets from here.
//
// Why this layout: a bucket completes as soon as its lowest layer's backward is queued, and its
// chunked form is exactly what ncclReduceScatter delivers and ncclAllGather collects, so ZeRO
// needs one collective per bucket. The parameters themselves stay in llm.c order; an optimizer
// segment maps a run of owned bucket elements to the parameters (one tensor slice) they belong to.
#pragma once
#include "src/config/model_config.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <vector>

// Layers per bucket for buckets of about `bucket_mib` MiB of `elem_bytes`-sized gradients (at least 1).
int layers_per_bucket(const ParameterLayout& layout, double bucket_mib, size_t elem_bytes);

// Bucket elements [begin, end).
struct BucketRange {
  size_t begin = 0, end = 0;
  size_t count() const { return end - begin; }
};

// One tensor slice (layer `layer`'s, or a whole model tensor: layer 0) at bucket element `at`.
struct GradientPiece {
  int tensor, layer;
  size_t at, count;
};

struct GradientBucket {
  std::vector<GradientPiece> pieces;
  int top_layer = -1, bottom_layer = -1;  // the layers it holds (top_layer >= bottom_layer); -1: wte/wpe/lnf
  size_t elements = 0;                    // n: the pieces' elements
  size_t chunk = 0;                       // c: each rank's part, ceil(n / ranks) rounded up to 8 elements
  size_t offset = 0;                      // where it starts in the full gradient buffer (ranks · c per bucket)
  size_t shard_offset = 0;                // where rank r's chunk starts in a gradient shard (c per bucket)
  // The elements of the tensors every rank of a split group holds (tensor_split.h): of the TP
  // group (a prefix) and of the EP group. Their gradients are the group's sum where its ranks
  // computed them from different rows.
  BucketRange tp_replicated, ep_replicated;
  bool holds_layers() const { return top_layer >= 0; }
};

// A run of owned elements: bucket elements [at, at + count) of bucket `bucket` are parameters
// [param, param + count) of tensor `tensor`, and this rank's optimizer state [state, state + count).
struct OptimizerSegment {
  int tensor;
  size_t bucket, at, param, state, count;
};

class GradientBuckets {
 public:
  GradientBuckets() = default;
  // The buckets of `layout` with `bucket_layers` layers each (the last layer bucket may hold fewer),
  // chunked for `ranks` owners (1: one rank owns everything). `tp_group`, `ep_group`: the layout is
  // a rank's of a TP group, of an EP group (tensor_split.h). Each bucket then orders its pieces so
  // that each group's replicated tensors are one range, which one collective over the group sums:
  // with one group its replicated tensors first; with both, the experts (TP-replicated only), the
  // tensors both replicate, then those TP splits (EP-replicated only).
  GradientBuckets(const ParameterLayout& layout, int bucket_layers, int ranks, bool tp_group = false,
                  bool ep_group = false);

  const std::vector<GradientBucket>& buckets() const { return buckets_; }
  int bucket_layers() const { return bucket_layers_; }
  int ranks() const { return ranks_; }
  // Elements of the whole chunked buffer (every bucket, every rank's chunk) and of one rank's chunks.
  size_t full_elements() const { return full_elements_; }
  size_t shard_elements() const { return shard_elements_; }
  // Elements of the largest layer bucket, chunked (a working window at ZeRO stage 2).
  size_t largest_layer_bucket() const { return largest_layer_bucket_; }
  const GradientBucket& model_bucket() const { return buckets_.back(); }
  // The bucket holding layer l's slices.
  size_t bucket_of_layer(int l) const {
    return static_cast<size_t>((static_cast<int>(layout_.num_layers) - 1 - l) / bucket_layers_);
  }
  // Where tensor i's slice for layer l (layer ignored for wte, wpe, lnf) starts within its bucket.
  size_t piece_at(int i, int l) const { return piece_at_[index(i, l)]; }
  // Where owned segment s of rank `owner` sits in that rank's shard (its chunks, bucket after
  // bucket): the layout of ZeRO 2's and 3's gradient shard and of ZeRO 3's parameter shard alike,
  // so AdamW reads both at the same offsets.
  size_t shard_offset(const OptimizerSegment& s, int owner) const {
    const GradientBucket& b = buckets_[s.bucket];
    return b.shard_offset + (s.at - static_cast<size_t>(owner) * b.chunk);
  }

  // Rank `rank`'s owned elements as optimizer segments, in its state order (bucket by bucket).
  std::vector<OptimizerSegment> segments(int rank) const;
  // Elements of optimizer state rank `rank` holds.
  size_t state_count(int rank) const;

 private:
  size_t index(int i, int l) const {
    return static_cast<size_t>(i) * std::max<size_t>(layout_.num_layers, 1) + (is_layer_tensor(i) ? l : 0);
  }
  void add_piece(GradientBucket& b, int i, int l);

  ParameterLayout layout_;
  int bucket_layers_ = 1, ranks_ = 1;
  std::vector<GradientBucket> buckets_;
  size_t full_elements_ = 0, shard_elements_ = 0, largest_layer_bucket_ = 0;
  std::vector<size_t> piece_at_;  // piece_at(i, l), by index(i, l)
};

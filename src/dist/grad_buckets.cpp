// grad_buckets.cpp — gradient buckets and each rank's owned chunks and optimizer segments
#include "src/dist/grad_buckets.h"

#include "src/config/model_config.h"
#include "src/dist/tensor_split.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <vector>

int layers_per_bucket(const ParameterLayout& layout, double bucket_mib, size_t elem_bytes) {
  size_t layer_elements = 0;
  for (int i = kFirstLayerTensor; i <= kLastLayerTensor; ++i) layer_elements += layout.slice_count(i);
  const double layers = std::floor(bucket_mib * 1048576.0 / static_cast<double>(layer_elements * elem_bytes));
  return static_cast<int>(std::clamp(layers, 1.0, static_cast<double>(std::max<size_t>(layout.num_layers, 1))));
}

GradientBuckets::GradientBuckets(const ParameterLayout& layout, int bucket_layers, int ranks, bool tp_group,
                                 bool ep_group)
    : layout_(layout), bucket_layers_(std::max(bucket_layers, 1)), ranks_(std::max(ranks, 1)) {
  const bool mixture = layout.mixture();
  const auto tp_whole = [&](int i) { return tp_group && tp_replicated(i, mixture); };
  const auto ep_whole = [&](int i) { return ep_group && !expert_tensor(i); };
  // A piece's place in its bucket's order (see the constructor's declaration).
  const auto order = [&](int i) {
    if (tp_group && ep_group) return !ep_whole(i) ? 0 : tp_whole(i) ? 1 : 2;
    return tp_whole(i) || ep_whole(i) ? 0 : 1;
  };
  // Layers top..bottom's pieces of `tensors` in that order, and the groups' ranges.
  const auto add_pieces = [&](GradientBucket& b, int top, int bottom, const std::vector<int>& tensors) {
    for (int k = 0; k < 3; ++k)
      for (int l = top; l >= bottom; --l)
        for (int i : tensors)
          if (order(i) == k) add_piece(b, i, l);
    const auto extend = [](BucketRange& r, const GradientPiece& p) {
      if (r.count() == 0) r.begin = p.at;
      r.end = p.at + p.count;
    };
    for (const GradientPiece& p : b.pieces) {
      if (tp_whole(p.tensor)) extend(b.tp_replicated, p);
      if (ep_whole(p.tensor)) extend(b.ep_replicated, p);
    }
  };
  std::vector<int> layer_tensors;
  for (int i = kFirstLayerTensor; i <= kLastLayerTensor; ++i) layer_tensors.push_back(i);
  const int L = static_cast<int>(layout.num_layers);
  piece_at_.assign(static_cast<size_t>(kNumParameterTensors) * std::max(L, 1), 0);
  for (int top = L - 1; top >= 0; top -= bucket_layers_) {
    GradientBucket b;
    b.top_layer = top;
    b.bottom_layer = std::max(0, top - bucket_layers_ + 1);
    add_pieces(b, top, b.bottom_layer, layer_tensors);
    buckets_.push_back(b);
  }
  GradientBucket model;
  add_pieces(model, 0, 0, {kWte, kWpe, kLnfw, kLnfb, kLmHead});
  buckets_.push_back(model);
  for (GradientBucket& b : buckets_) {
    b.chunk = (b.elements + ranks_ - 1) / ranks_;
    b.chunk = (b.chunk + 7) / 8 * 8;
    b.offset = full_elements_;
    b.shard_offset = shard_elements_;
    full_elements_ += b.chunk * ranks_;
    shard_elements_ += b.chunk;
    if (b.holds_layers()) largest_layer_bucket_ = std::max(largest_layer_bucket_, b.chunk * ranks_);
  }
}

std::vector<OptimizerSegment> GradientBuckets::segments(int rank) const {
  std::vector<OptimizerSegment> out;
  size_t state = 0;
  for (size_t bi = 0; bi < buckets_.size(); ++bi) {
    const GradientBucket& b = buckets_[bi];
    const size_t lo = std::min(b.elements, static_cast<size_t>(rank) * b.chunk);
    const size_t hi = std::min(b.elements, lo + b.chunk);
    for (const GradientPiece& p : b.pieces) {
      const size_t begin = std::max(lo, p.at), end = std::min(hi, p.at + p.count);
      if (begin >= end) continue;
      const size_t param = layout_.slice_offset(p.tensor, p.layer) + (begin - p.at);
      out.push_back(OptimizerSegment{p.tensor, bi, begin, param, state, end - begin});
      state += end - begin;
    }
  }
  return out;
}

size_t GradientBuckets::state_count(int rank) const {
  size_t n = 0;
  for (const GradientBucket& b : buckets_) {
    const size_t lo = std::min(b.elements, static_cast<size_t>(rank) * b.chunk);
    n += std::min(b.elements, lo + b.chunk) - lo;
  }
  return n;
}

void GradientBuckets::add_piece(GradientBucket& b, int i, int l) {
  piece_at_[index(i, l)] = b.elements;
  if (layout_.slice_count(i) == 0) return;  // a tensor this architecture lacks
  b.pieces.push_back(GradientPiece{i, l, b.elements, layout_.slice_count(i)});
  b.elements += layout_.slice_count(i);
}

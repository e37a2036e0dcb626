// Tensor parallelism's parameter split (src/dist/tensor_split.h) and the buckets of a TP rank's
// layout (grad_buckets.h, replicated_first): every element of the whole model is held by exactly
// the ranks the split names (each split element by one, each replicated one by all), at the
// place Megatron's scheme puts it (checked against plain index formulas), to_global agrees with
// place(), and a TP rank's buckets hold the replicated tensors first (a mixture's router and experts
// among them); an EP rank (--ep) holds its experts' blocks of fcw, fc2w, fcprojw and its TP rank's
// part of everything else, and its buckets each group's replicated tensors as one range.
#include "test/test_util.h"
#include "src/dist/grad_buckets.h"
#include "src/dist/tensor_split.h"

#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

const ModelConfig kModel{8, 50, 64, 2, 4, 16};  // maxT, V, Vp, L, NH, C

}  // namespace

TEST_CASE("Each element of the whole model is held by the ranks the split names", "[tensor_split]") {
  for (int size : {1, 2, 4}) {
    INFO("TP " << size);
    const ParameterLayout whole(kModel);
    std::vector<int> holders(whole.total, 0);
    for (int rank = 0; rank < size; ++rank) {
      const TensorSplit split(kModel, size, rank);
      const ParameterLayout& local = split.local();
      for (int i = 0; i < kNumParameterTensors; ++i) {
        INFO(whole[i].name);
        CHECK(local[i].count == (tp_replicated(i) ? whole[i].count : whole[i].count / size));
        // place(): local element k of tensor i lands at the whole tensor's element holding k's tag.
        std::vector<size_t> part(local[i].count), tensor(whole[i].count, ~size_t(0));
        std::iota(part.begin(), part.end(), size_t(0));
        split.place(i, part.data(), tensor.data());
        for (size_t g = 0; g < tensor.size(); ++g) {
          if (tensor[g] == ~size_t(0)) continue;
          ++holders[whole[i].offset + g];
          size_t left = 0;
          CHECK(split.to_global(local[i].offset + tensor[g], &left) == whole[i].offset + g);
          CHECK(left >= 1);
        }
        // split() is place()'s inverse.
        std::vector<size_t> values(whole[i].count);
        std::iota(values.begin(), values.end(), size_t(7));
        const std::vector<size_t> back = split.split(i, values.data());
        std::vector<size_t> again(whole[i].count, 0);
        split.place(i, back.data(), again.data());
        for (size_t k = 0; k < back.size(); ++k) CHECK(again[back[k] - 7] == back[k]);
      }
    }
    for (int i = 0; i < kNumParameterTensors; ++i)
      for (size_t g = 0; g < whole[i].count; ++g)
        if (holders[whole[i].offset + g] != (tp_replicated(i) ? size : 1)) {
          FAIL_CHECK(whole[i].name << " element " << g << " held by " << holders[whole[i].offset + g] << " ranks");
          break;
        }
  }
}

TEST_CASE("Megatron's places: heads, hidden units and vocabulary rows per rank", "[tensor_split]") {
  const int size = 2, C = kModel.channels, Cl = C / size, Fl = 4 * C / size, Vl = kModel.padded_vocab_size / size;
  const ParameterLayout whole(kModel);
  for (int t = 0; t < size; ++t) {
    const TensorSplit split(kModel, size, t);
    const ParameterLayout& local = split.local();
    const auto global_of = [&](int tensor, size_t k) {
      size_t left = 0;
      return split.to_global(local[tensor].offset + k, &left) - whole[tensor].offset;
    };
    for (int l = 0; l < kModel.num_layers; ++l)
      for (int p = 0; p < 3; ++p)  // q, k, v: rows [t·C/2, (t+1)·C/2) of each
        for (int r = 0; r < Cl; ++r)
          for (int c = 0; c < C; c += 5) {
            const size_t k = static_cast<size_t>(l) * 3 * Cl * C + (static_cast<size_t>(p) * Cl + r) * C + c;
            CHECK(global_of(kQkvw, k) == static_cast<size_t>(l) * 3 * C * C + (static_cast<size_t>(p) * C + t * Cl + r) * C + c);
          }
    for (int o = 0; o < C; ++o)  // attprojw (C, C): columns [t·C/2, ...) of every row; layer 1
      for (int j = 0; j < Cl; ++j)
        CHECK(global_of(kAttprojw, static_cast<size_t>(C) * Cl + o * Cl + j) ==
              static_cast<size_t>(C) * C + o * C + t * Cl + j);
    for (int o = 0; o < C; ++o)  // fcprojw (C, 4C): columns [t·2C, ...) of every row; layer 0
      for (int j = 0; j < Fl; j += 3) CHECK(global_of(kFcprojw, o * Fl + j) == static_cast<size_t>(o) * 4 * C + t * Fl + j);
    CHECK(global_of(kFcw, 0) == static_cast<size_t>(t) * Fl * C);
    CHECK(global_of(kFcb, static_cast<size_t>(Fl) + 1) == static_cast<size_t>(4 * C) + t * Fl + 1);  // layer 1
    CHECK(global_of(kWte, 3) == static_cast<size_t>(t) * Vl * C + 3);
    CHECK(global_of(kLn2w, 5) == 5u);
  }
}

TEST_CASE("A TP rank's buckets hold the replicated tensors first", "[tensor_split]") {
  const TensorSplit split(kModel, 2, 1);
  for (int ranks : {1, 3}) {
    const GradientBuckets buckets(split.local(), 1, ranks, true);
    size_t owned = 0;
    for (const GradientBucket& b : buckets.buckets()) {
      size_t replicated = 0;
      for (const GradientPiece& p : b.pieces) {
        CHECK(tp_replicated(p.tensor) == (p.at < b.tp_replicated.end));
        if (tp_replicated(p.tensor)) replicated += p.count;
      }
      CHECK(b.tp_replicated.begin == 0u);
      CHECK(b.tp_replicated.count() == replicated);
      CHECK(replicated > 0);
      CHECK(b.ep_replicated.count() == 0u);
    }
    for (int r = 0; r < ranks; ++r) owned += buckets.state_count(r);
    CHECK(owned == split.local().total);
  }
  // Without tensor parallelism the order is llm.c's within each layer.
  const GradientBuckets plain(ParameterLayout(kModel), 1, 1);
  CHECK(plain.buckets()[0].tp_replicated.count() == 0u);
  CHECK(plain.buckets()[0].pieces[0].tensor == kLn1w);
  CHECK(plain.buckets()[0].pieces[2].tensor == kQkvw);
}

TEST_CASE("A split the model cannot take is refused naming --tp", "[tensor_split]") {
  CHECK_THROWS_WITH(check_tensor_split(kModel, 3, "--tp"), Catch::Contains("must divide NH = 4"));
  CHECK_THROWS_WITH(check_tensor_split(ModelConfig{8, 50, 72, 2, 4, 16}, 2, "--tp"),
                    Catch::Contains("Vp = 72"));
  CHECK_NOTHROW(check_tensor_split(kModel, 4, "--tp"));
}

namespace {

ModelConfig mixture_model() {
  ModelConfig moe = kModel;
  moe.norm = Norm::rmsnorm;
  moe.positions = Positions::rope;
  moe.mlp = Mlp::swiglu;
  moe.biases = false;
  moe.hidden_size = 24;
  moe.num_experts = 8;
  moe.experts_per_token = 2;
  return moe;
}

}  // namespace

TEST_CASE("A TP rank of a mixture holds the router and the experts whole, first in its buckets", "[tensor_split]") {
  const ModelConfig moe = mixture_model();
  const ParameterLayout whole(moe);
  CHECK(whole.mixture());
  CHECK(!ParameterLayout(kModel).mixture());
  for (int rank = 0; rank < 2; ++rank) {
    const TensorSplit split(moe, 2, rank);
    for (int i = 0; i < kNumParameterTensors; ++i) {
      INFO(whole[i].name);
      const bool expert = i == kFcw || i == kFc2w || i == kFcprojw;
      CHECK(tp_replicated(i, true) == (expert || tp_replicated(i)));
      if (expert || i == kRouterw) CHECK(split.local()[i].count == whole[i].count);
      if (i == kQkvw || i == kAttprojw) CHECK(split.local()[i].count == whole[i].count / 2);
    }
    const GradientBuckets buckets(split.local(), 1, 1, true, false);
    size_t replicated = 0;
    for (const GradientBucket& b : buckets.buckets())
      for (const GradientPiece& p : b.pieces) {
        CHECK(tp_replicated(p.tensor, true) == (p.at < b.tp_replicated.end));
        if (p.at < b.tp_replicated.end) replicated += p.count;
      }
    size_t expected = 0;
    for (int i = 0; i < kNumParameterTensors; ++i) expected += tp_replicated(i, true) ? whole[i].count : 0;
    CHECK(replicated == expected);
  }
}

TEST_CASE("An EP rank holds its experts' blocks, its TP rank's part of the rest; its buckets order both groups' ranges",
          "[tensor_split]") {
  const ModelConfig moe = mixture_model();
  const ParameterLayout whole(moe);
  const size_t HC = static_cast<size_t>(moe.hidden()) * moe.channels;
  for (const auto& [tp, ep] : {std::pair{1, 2}, std::pair{1, 4}, std::pair{2, 2}}) {
    INFO("TP " << tp << " EP " << ep);
    const size_t El = moe.num_experts / ep;
    std::vector<int> holders(whole.total, 0);
    for (int t = 0; t < tp; ++t)
      for (int rank = 0; rank < ep; ++rank) {
        const TensorSplit split(moe, tp, t, StagePart::whole(moe.num_layers), ep, rank);
        CHECK(!split.whole());
        for (int i = 0; i < kNumParameterTensors; ++i) {
          INFO(whole[i].name);
          const bool expert = i == kFcw || i == kFc2w || i == kFcprojw;
          CHECK(expert_tensor(i) == expert);
          CHECK(split.ep_splits(i) == expert);
          CHECK(split.group_size(i) == (expert ? ep : tp));
          CHECK(split.group_rank(i) == (expert ? rank : t));
          const size_t parts = expert ? ep : tp_replicated(i, true) ? 1 : tp;
          CHECK(split.local()[i].count == whole[i].count / parts);
          std::vector<size_t> part(split.local()[i].count), tensor(whole[i].count, ~size_t(0));
          std::iota(part.begin(), part.end(), size_t(0));
          split.place(i, part.data(), tensor.data());
          for (size_t g = 0; g < tensor.size(); ++g) {
            if (tensor[g] == ~size_t(0)) continue;
            ++holders[whole[i].offset + g];
            // An expert tensor's layer slice is E blocks of H·C: this rank's are rank·El .. rank·El + El - 1.
            if (expert) {
              const size_t within = g % (whole[i].count / moe.num_layers), e = within / HC;
              CHECK((e >= rank * El && e < (rank + 1) * El));
            }
          }
        }
        // Each group's replicated tensors one range: the TP group's (a prefix), the EP group's.
        const GradientBuckets buckets(split.local(), 1, 1, tp > 1, true);
        for (const GradientBucket& b : buckets.buckets()) {
          CHECK(b.tp_replicated.begin == 0u);
          for (const GradientPiece& p : b.pieces) {
            INFO(whole[p.tensor].name);
            CHECK((tp > 1 && tp_replicated(p.tensor, true)) == (p.at < b.tp_replicated.end));
            CHECK(!expert_tensor(p.tensor) == (p.at >= b.ep_replicated.begin && p.at < b.ep_replicated.end));
          }
        }
      }
    // Experts: one EP rank, every TP rank; the rest: every EP rank, and every TP rank or one.
    for (int i = 0; i < kNumParameterTensors; ++i)
      for (size_t g = 0; g < whole[i].count; ++g) {
        const int expected = expert_tensor(i) ? tp : tp_replicated(i, true) ? tp * ep : ep;
        if (holders[whole[i].offset + g] != expected) {
          FAIL_CHECK(whole[i].name << " element " << g << " held by " << holders[whole[i].offset + g] << " ranks");
          break;
        }
      }
  }
  CHECK_THROWS_WITH(TensorSplit(moe, 1, 0, StagePart::whole(moe.num_layers), 3, 0), Catch::Contains("--ep 3"));
}

// parallel_groups.h — a run's ranks as a grid of data-parallel (DP) × context-parallel (CP) ×
// pipeline-parallel (PP) × tensor-parallel (TP) groups, each group its own communicator split from
// the world's (ncclCommSplit).
//
// With --tp T, --pp P and --cp N (T·P·N divides the world size W; R = W/(T·P) replicas of the
// model, D = R/N of them reading different data), world rank (r·P + s)·T + t is TP rank t of
// pipeline stage s of replica r = d·N + c, which is CP rank c of data-parallel index d: TP
// innermost — consecutive ranks, so under mpirun's and srun's usual block placement a TP group
// shares a node and its NVLink — then the pipeline stages, then the replicas. The groups:
//   TP group  the T ranks of the same (r, s), ranked by t: they split each layer's work
//             (tensor_split.h) and read the same micro-batches;
//   PP group  the P ranks of the same (r, t), ranked by s: stage s sends activations to s + 1 and
//             gradients to s - 1 (pipeline_schedule.h);
//   CP group  the N ranks of the same (d, s, t), ranked by c: they read the same micro-batches, each
//             its zigzag part of every sequence (context_split.h), and pass K/V around the group
//             (context_attention.h);
//   DP group  the R ranks of the same (s, t), ranked by r: they hold the same parameters and sum
//             their gradients at the ZeRO stage — the CP ranks with the data-parallel ones, as their
//             tokens are different tokens of the same loss. To everything but attention and the
//             data a CP rank is one more replica (ZeRO shards, checkpoints: --cp is not saved state).
//   tied-embedding group  the first and the last stage of the same (r, t) (--pp 2: the PP group):
//             both hold a tied wte and sum its gradient; the stages between have none.
//   EP group  with --ep E (docs/MOE.md): E consecutive ranks of the DP group, ranked by their DP
//             rank: they hold different experts of each mixture layer and send each other rows
//             (expert_parallel.h); the expert-DP group, the DP group's ranks of the same EP rank,
//             hold the same experts and sum their gradients (the EP group sums the rest first).
// Without TP there is no TP group, without PP no PP group and without CP no CP group (tp(), pp()
// and cp() are nullptr); with none of them, the DP group is the world's communicator itself.
#pragma once
#include "src/dist/comm.h"

#include <memory>
#include <stdexcept>
#include <string>
#include <utility>

class ParallelGroups {
 public:
  // Splits `world` into the grid above (checked: tp_size·pp_size·cp_size divides the world size).
  ParallelGroups(Communicator& world, int tp_size, int pp_size = 1, int cp_size = 1, int ep_size = 1)
      : world_(world), dp_(&world) {
    const int rank = world.rank();
    if (tp_size < 1 || pp_size < 1 || cp_size < 1 ||
        world.world_size() % (static_cast<long long>(tp_size) * pp_size * cp_size) != 0)
      throw std::runtime_error("--tp " + std::to_string(tp_size) + " x --pp " + std::to_string(pp_size) + " x --cp " +
                               std::to_string(cp_size) + ": must divide the number of ranks, " +
                               std::to_string(world.world_size()));
    if (tp_size > 1) {
      world.set_purpose("the tensor-parallel group's communicator", "during start-up");
      tp_owned_ = std::make_unique<Communicator>(world, rank / tp_size, rank, "tensor-parallel");
    }
    const int model_ranks = tp_size * pp_size;  // divides the world size: no overflow
    if (pp_size > 1) {
      world.set_purpose("the pipeline-parallel group's communicator", "during start-up");
      const int r = rank / model_ranks, s = rank / tp_size % pp_size, t = rank % tp_size;
      pp_owned_ = std::make_unique<Communicator>(world, r * tp_size + t, s, "pipeline-parallel");
      if (pp_size > 2) {
        // Colors of the ends' pairs are below W; every other rank gets one of its own (a group of one).
        world.set_purpose("the tied-embedding group's communicator", "during start-up");
        const bool end = s == 0 || s == pp_size - 1;
        tied_owned_ = std::make_unique<Communicator>(world, end ? r * tp_size + t : world.world_size() + rank, s,
                                                     "tied-embedding");
      }
    }
    if (cp_size > 1) {
      world.set_purpose("the context-parallel group's communicator", "during start-up");
      const int r = rank / model_ranks;
      cp_owned_ = std::make_unique<Communicator>(world, r / cp_size * model_ranks + rank % model_ranks, r % cp_size,
                                                 "context-parallel");
    }
    if (model_ranks > 1) {
      world.set_purpose("the data-parallel group's communicator", "during start-up");
      dp_owned_ = std::make_unique<Communicator>(world, rank % model_ranks, rank, "data-parallel");
      dp_ = dp_owned_.get();
    }
    if (ep_size > 1) {
      Communicator& dp = *dp_;
      if (dp.world_size() % ep_size != 0)
        throw std::runtime_error("--ep " + std::to_string(ep_size) + ": must divide the data-parallel ranks, " +
                                 std::to_string(dp.world_size()));
      world.set_purpose("the expert-parallel groups' communicators", "during start-up");
      ep_owned_ = std::make_unique<Communicator>(dp, dp.rank() / ep_size, dp.rank(), "expert-parallel");
      expert_dp_owned_ = std::make_unique<Communicator>(dp, dp.rank() % ep_size, dp.rank(), "expert-data-parallel");
    }
  }
  ParallelGroups(const ParallelGroups&) = delete;
  ParallelGroups& operator=(const ParallelGroups&) = delete;
  // The groups go before the world's communicator they were split from.
  ~ParallelGroups() {
    expert_dp_owned_.reset();
    ep_owned_.reset();
    dp_owned_.reset();
    cp_owned_.reset();
    tied_owned_.reset();
    pp_owned_.reset();
    tp_owned_.reset();
  }

  Communicator& world() const { return world_; }
  Communicator& dp() const { return *dp_; }
  Communicator* tp() const { return tp_owned_.get(); }  // nullptr without tensor parallelism
  int tp_size() const { return tp_owned_ ? tp_owned_->world_size() : 1; }
  Communicator* pp() const { return pp_owned_.get(); }  // nullptr without pipeline parallelism
  int pp_size() const { return pp_owned_ ? pp_owned_->world_size() : 1; }
  int pp_rank() const { return pp_owned_ ? pp_owned_->rank() : 0; }  // the stage s
  Communicator* cp() const { return cp_owned_.get(); }  // nullptr without context parallelism
  int cp_size() const { return cp_owned_ ? cp_owned_->world_size() : 1; }
  Communicator* ep() const { return ep_owned_.get(); }  // nullptr without expert parallelism
  int ep_size() const { return ep_owned_ ? ep_owned_->world_size() : 1; }
  // The ranks holding the same experts (the DP group without expert parallelism): they sum gradients.
  Communicator& expert_dp() const { return expert_dp_owned_ ? *expert_dp_owned_ : *dp_; }
  // The data-parallel index d and their count D: which micro-batches the rank reads (its CP group's).
  int data_rank() const { return dp_->rank() / cp_size(); }
  int data_ranks() const { return dp_->world_size() / cp_size(); }
  // The tied-embedding group on the first and the last stage (nullptr elsewhere and without PP).
  Communicator* tied_embedding() const {
    if (pp_size() == 1 || (pp_rank() != 0 && pp_rank() != pp_size() - 1)) return nullptr;
    return tied_owned_ ? tied_owned_.get() : pp();
  }

  // Names what the collectives of every group carry next (comm.h's set_purpose).
  void set_purpose(const std::string& what, const std::string& when) {
    world_.set_purpose(what, when);
    if (tp_owned_) tp_owned_->set_purpose(what, when);
    if (pp_owned_) pp_owned_->set_purpose(what, when);
    if (tied_owned_) tied_owned_->set_purpose(what, when);
    if (cp_owned_) cp_owned_->set_purpose(what, when);
    if (dp_owned_) dp_owned_->set_purpose(what, when);
    if (ep_owned_) ep_owned_->set_purpose(what, when);
    if (expert_dp_owned_) expert_dp_owned_->set_purpose(what, when);
  }

 private:
  Communicator& world_;
  Communicator* dp_;
  std::unique_ptr<Communicator> tp_owned_, pp_owned_, tied_owned_, cp_owned_, dp_owned_, ep_owned_, expert_dp_owned_;
};

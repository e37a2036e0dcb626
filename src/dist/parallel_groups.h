// parallel_groups.h — a run's ranks as a grid of data-parallel (DP) × tensor-parallel (TP)
// groups, each group its own communicator split from the world's (ncclCommSplit).
//
// With --tp N (N divides the world size W), ranks [k·N, (k+1)·N) form TP group k — consecutive
// ranks, so under mpirun's and srun's usual block placement a TP group shares a node and its
// NVLink — and TP rank t of every group forms DP group t (ranks t, t + N, t + 2N, ...). A TP group
// splits each layer's work (tensor_split.h) and reads the same micro-batches; the W/N DP groups'
// ranks read different ones and sum gradients at the ZeRO stage. Without tensor parallelism the
// DP group is the world's communicator itself and there is no TP group.
#pragma once
#include "src/dist/comm.h"

#include <memory>
#include <stdexcept>
#include <string>
#include <utility>

class ParallelGroups {
 public:
  // Splits `world` into groups of `tp_size` (checked: it divides the world size).
  ParallelGroups(Communicator& world, int tp_size) : world_(world), dp_(&world) {
    if (tp_size < 1 || world.world_size() % tp_size != 0)
      throw std::runtime_error("--tp " + std::to_string(tp_size) + ": must divide the number of ranks, " +
                               std::to_string(world.world_size()));
    if (tp_size == 1) return;
    world.set_purpose("the tensor-parallel group's communicator", "during start-up");
    tp_owned_ = std::make_unique<Communicator>(world, world.rank() / tp_size, world.rank(), "tensor-parallel");
    world.set_purpose("the data-parallel group's communicator", "during start-up");
    dp_owned_ = std::make_unique<Communicator>(world, world.rank() % tp_size, world.rank(), "data-parallel");
    dp_ = dp_owned_.get();
  }
  ParallelGroups(const ParallelGroups&) = delete;
  ParallelGroups& operator=(const ParallelGroups&) = delete;
  // The groups go before the world's communicator they were split from.
  ~ParallelGroups() {
    dp_owned_.reset();
    tp_owned_.reset();
  }

  Communicator& world() const { return world_; }
  Communicator& dp() const { return *dp_; }
  Communicator* tp() const { return tp_owned_.get(); }  // nullptr without tensor parallelism
  int tp_size() const { return tp_owned_ ? tp_owned_->world_size() : 1; }

  // Names what the collectives of every group carry next (comm.h's set_purpose).
  void set_purpose(const std::string& what, const std::string& when) {
    world_.set_purpose(what, when);
    if (tp_owned_) tp_owned_->set_purpose(what, when);
    if (dp_owned_) dp_owned_->set_purpose(what, when);
  }

 private:
  Communicator& world_;
  Communicator* dp_;
  std::unique_ptr<Communicator> tp_owned_, dp_owned_;
};

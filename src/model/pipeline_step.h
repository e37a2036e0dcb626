// pipeline_step.h — an optimizer step's micro-batches through the model: one after another on a
// whole model, or a pipeline rank's table of the schedule (src/dist/pipeline_schedule.h) with its
// transfers on the pipeline communicator; and the forward pass alone (validation, evaluation),
// through the stages in model order, its losses shared by every stage.
//
// A pipeline rank runs its table in order, each action queued on the model's stream or, for a
// transfer, on the pipeline communicator's stream between the work before it and the work after it
// (Communicator::ordered_with); the transfers that follow one another in the table go as one group
// (ncclGroupStart/End: e.g. 1f1b's steady state sends an activation forward and receives a gradient
// back at once). The table's global order is what rules out a deadlock (pipeline_check.h checks it
// under blocking sends; a group completes only when each of its transfers would have, in turn). A
// chunk pass takes an activation set when it
// first needs one (its input's receive, or its forward on the first chunk) and gives it back after
// its backward (zb-h1: after its weight backward); pipeline_schedule.h's pipeline_activation_sets
// counts the most a table holds at once, which the model allocates.
#pragma once
#include "src/data/dataloader.h"
#include "src/dist/comm.h"
#include "src/dist/pipeline_schedule.h"
#include "src/model/transformer.h"

#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

template <typename Elem>
class MicroBatchRunner {
 public:
  // `shape`: the pipeline's (stages 1: a whole model, micro-batches one after another).
  MicroBatchRunner(Transformer<Elem>& model, const PipelineShape& shape) : model_(model), shape_(shape) {
    if (piped()) table_ = build_pipeline_schedule(shape)[model.pipeline().rank];
  }

  // One optimizer step's forwards and backwards of `micro_steps` micro-batches, `next` filling
  // each in turn; the gradients accumulate (the caller zeroed them) and are sent.
  void run_step(int micro_steps, const std::function<void(TokenBatch&)>& next) {
    if (!piped()) {
      for (int micro = 0; micro < micro_steps; ++micro) {
        next(batch_);
        model_.forward_backward(batch_, micro_steps, micro + 1 == micro_steps);
      }
      return;
    }
    if (micro_steps != shape_.microbatches)
      throw std::logic_error("pipeline step: " + std::to_string(micro_steps) + " micro-batches, the schedule has " +
                             std::to_string(shape_.microbatches));
    batches_.resize(micro_steps);
    for (TokenBatch& b : batches_) next(b);
    slots_.clear();
    free_.clear();
    for (int k = model_.in_flight() - 1; k >= 0; --k) free_.push_back(k);
    const int p = shape_.stages;
    for (const PipelineAction& a : table_) {
      const int c = a.chunk / p;  // the chunk's index on its rank
      if (!is_computation(a.op)) {
        queue_transfer(a, c);
        continue;
      }
      send_transfers();
      switch (a.op) {
        case PipelineOp::forward: {
          const int slot = a.chunk == 0 ? take(a.microbatch, a.chunk) : slots_.at({a.microbatch, a.chunk});
          model_.upload_pass_tokens(slot, c, batches_[a.microbatch]);
          model_.forward_pass(slot, c);
          break;
        }
        case PipelineOp::backward:
        case PipelineOp::backward_input: {
          const int slot = slots_.at({a.microbatch, a.chunk});
          model_.backward_pass(slot, c, micro_steps);
          if (a.op == PipelineOp::backward) give_back(a);
          break;
        }
        default:  // backward_weight
          model_.weight_backward_pass(slots_.at({a.microbatch, a.chunk}), c);
          give_back(a);
          break;
      }
    }
    send_transfers();
    model_.finish_pipeline_step(micro_steps);
  }

  // The forward pass of one micro-batch (host tokens, B·T each): its per-position losses ([B][T]),
  // on every rank.
  std::vector<float> position_losses(const int* inputs, const int* targets) {
    if (!piped()) {
      model_.forward(inputs, targets);
      return model_.position_losses();
    }
    const int p = shape_.stages, rank = model_.pipeline().rank, last = shape_.chunks() - 1;
    batch_.inputs.assign(inputs, inputs + model_.batch_size() * model_.seq_len());
    batch_.targets.assign(targets, targets + batch_.inputs.size());
    batch_.ids_below = 0;  // checked on upload
    batch_.bucket_segments = 0;
    for (int chunk = 0; chunk <= last; ++chunk) {
      if (chunk % p != rank) continue;
      const std::string what = "activations of the forward pass";
      if (chunk > 0) {
        transfer(what, [&](Communicator& pp, size_t n) { pp.recv(model_.chunk_input(0), n, (chunk - 1) % p); });
        if (model_.config().moe())  // no routing tail travels (no backward reads it): it starts at zero
          routing_tail_begin(model_.activation_set(0), true, model_.stream());
      }
      model_.upload_pass_tokens(0, chunk / p, batch_);
      model_.forward_pass(0, chunk / p);
      if (chunk < last)
        transfer(what, [&](Communicator& pp, size_t n) { pp.send(model_.chunk_output(0, chunk / p), n, (chunk + 1) % p); });
      else
        model_.head_losses(0);
    }
    model_.share_pass_losses(0, last % p);
    return model_.pass_losses(0);
  }
  float mean_loss(const int* inputs, const int* targets) {
    const std::vector<float> losses = position_losses(inputs, targets);
    double sum = 0.0;
    for (float x : losses) sum += x;
    return static_cast<float>(sum / static_cast<double>(losses.size()));
  }

 private:
  bool piped() const { return shape_.stages > 1; }

  // A free activation set for the pass of `microbatch` through `chunk`.
  int take(int microbatch, int chunk) {
    if (free_.empty())
      throw std::logic_error("pipeline step: more chunk passes in flight than the " +
                             std::to_string(model_.in_flight()) + " activation sets allocated");
    const int slot = free_.back();
    free_.pop_back();
    slots_[{microbatch, chunk}] = slot;
    return slot;
  }

  // The pass's activation set is free again (after its backward: its weight backward for zb-h1).
  void give_back(const PipelineAction& a) {
    free_.push_back(slots_.at({a.microbatch, a.chunk}));
    slots_.erase({a.microbatch, a.chunk});
  }

  // Transfer `a` (of local chunk c) into the group sent next: its buffer (a receive of an
  // activation takes the consuming pass's activation set) and, for the watchdog's messages, what it
  // carries ("activations of micro-batch 3 from chunk 5").
  // With experts the pass's routing tail (expert_mlp.h) follows as a second transfer: both ends
  // queue theirs in the same order, and transfers between two ranks match in order.
  void queue_transfer(const PipelineAction& a, int c) {
    Transfer<Elem> t, tail;
    t.n = model_.boundary_elements();
    tail.n = routing_tail_elements<Elem>(model_.config());
    t.peer = tail.peer = a.peer;
    int slot = 0;
    switch (a.op) {
      case PipelineOp::recv_activation:
        slot = take(a.microbatch, a.chunk + 1);
        t.recv = model_.chunk_input(slot);
        tail.recv = tail_of(slot);
        break;
      case PipelineOp::send_activation:
        slot = slots_.at({a.microbatch, a.chunk});
        t.send = model_.chunk_output(slot, c);
        tail.send = tail_of(slot);
        break;
      case PipelineOp::recv_gradient:
        slot = slots_.at({a.microbatch, a.chunk - 1});
        t.recv = model_.chunk_output_gradient(slot);
        tail.recv = tail_of(slot);
        break;
      default:  // send_gradient: the pass's set may be taken again in this group, so the totals' copy
        t.send = model_.chunk_input_gradient();
        tail.send = reinterpret_cast<const Elem*>(model_.activation_set(0).moe_tail_out.get());
        break;
    }
    transfers_.push_back(t);
    if (tail.n > 0) transfers_.push_back(tail);
    group_what_ += std::string(group_what_.empty() ? "" : "; ") +
                   (is_activation_transfer(a.op) ? "activations" : "activation gradients") + " of micro-batch " +
                   std::to_string(a.microbatch) + " from chunk " + std::to_string(a.chunk);
  }
  // Set `slot`'s routing tail as transfer elements.
  Elem* tail_of(int slot) { return reinterpret_cast<Elem*>(model_.activation_set(slot).moe_tail.get()); }

  // The transfers queued since the last computation, as one group.
  void send_transfers() {
    if (transfers_.empty()) return;
    transfer(group_what_, [&](Communicator& pp, size_t) { pp.exchange(transfers_); });
    transfers_.clear();
    group_what_.clear();
  }

  // A transfer on the pipeline communicator, between the model stream's work before and after it;
  // the communicator's messages name `what` it carries (and still the step the caller set).
  template <typename Issue> void transfer(const std::string& what, Issue&& issue) {
    Communicator& pp = *model_.pipeline().comm;
    pp.set_purpose(what, pp.purpose_when());
    pp.ordered_with(model_.stream(), [&] { issue(pp, model_.boundary_elements()); });
  }

  Transformer<Elem>& model_;
  const PipelineShape shape_;
  PipelineTable table_;                    // this rank's (pipeline only)
  TokenBatch batch_;                       // a whole model's micro-batch, or the forward pass's
  std::vector<TokenBatch> batches_;        // a pipeline step's micro-batches
  std::map<std::pair<int, int>, int> slots_;  // (micro-batch, chunk) -> its activation set
  std::vector<int> free_;
  std::vector<Transfer<Elem>> transfers_;  // queued for the next group, and what they carry
  std::string group_what_;
};

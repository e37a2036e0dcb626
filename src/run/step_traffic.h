// step_traffic.h — what the run's communicators actually did per optimizer step: the collectives
// and bytes their own tallies (comm.h's CollectiveCounts) record over the steps after the run's
// first, printed at the end of training in --plan's terms (plan_report.h's format_traffic), so
// that each measured line compares with --plan's line for the same flags word for word.
//
// A step's own figures (the loss, gradient norm and stop votes summed over the ranks) are left
// out, as --plan leaves them out; so is everything between steps (validation, evaluation,
// samples, checkpoints). The first step is left out too where there are later ones (it is where
// one-time work would show); the figures are the mean over the rest. At ZeRO 3 a step after
// validation, evaluation or a sample gathers fewer parameters than --plan counts: that pass
// gathered them and left the last ones in the windows (src/dist/param_shards.h).
#pragma once
#include "src/dist/comm.h"
#include "src/dist/comm_plan.h"
#include "src/dist/parallel_groups.h"
#include "src/run/plan_report.h"

#include <string>

class StepTrafficMeter {
 public:
  StepTrafficMeter(ParallelGroups& groups, int micro_steps) : groups_(groups), micro_steps_(micro_steps) {}

  // Runs `step` (one optimizer step) and adds its collectives to the figures.
  template <typename Step> auto measure(Step&& step) {
    const Tally before = counted();
    auto result = step();
    Tally& into = steps_ == 0 ? first_ : rest_;
    into += counted() - before;
    ++steps_;
    return result;
  }
  // Runs `work` within a step with its collectives left out (the step's own figures).
  template <typename Work> auto left_out(Work&& work) {
    const Tally before = now();
    auto result = work();
    left_out_ += now() - before;
    return result;
  }

  // "measured communication per optimizer step (...), sent by each rank on NCCL's rings: ...",
  // "measured tensor-parallel communication ..." and "measured expert-parallel communication ...",
  // as --plan's lines (empty where a group has one rank, or before any step).
  std::string report() const {
    if (steps_ == 0) return "";
    const long long over = steps_ > 1 ? steps_ - 1 : 1;
    const Tally& t = steps_ > 1 ? rest_ : first_;
    const std::string per_step = " per optimizer step (" + std::to_string(micro_steps_) + " micro-step(s), mean of " +
                                 (steps_ > 1 ? std::to_string(over) + " step(s) after the first" : "the only step") +
                                 "), sent by each ";
    std::string out;
    const Communicator& dp = groups_.expert_dp();  // the gradients' group (the DP group without --ep)
    if (dp.world_size() > 1)
      out += "measured communication" + per_step + "rank on NCCL's rings:" +
             format_traffic(ring_traffic(t.dp, dp.world_size()), over) + "\n";
    if (const Communicator* tp = groups_.tp())
      out += "measured tensor-parallel communication" + per_step + "rank within its group of " +
             std::to_string(tp->world_size()) + ":" + format_traffic(ring_traffic(t.tp, tp->world_size()), over) +
             "\n";
    if (const Communicator* ep = groups_.ep())
      out += "measured expert-parallel communication" + per_step + "rank within its EP group of " +
             std::to_string(ep->world_size()) + ":" +
             format_traffic(ExpertTraffic{ring_traffic(t.ep, ep->world_size()).all_reduce,
                                          {t.ep.send, static_cast<double>(t.ep.send_bytes)}},
                            over) +
             "\n";
    return out;
  }

 private:
  // The data-parallel, tensor-parallel and expert-parallel groups' tallies.
  struct Tally {
    CollectiveCounts dp, tp, ep;
    Tally& operator+=(const Tally& o) {
      for (auto [a, b] : {std::pair{&dp, &o.dp}, std::pair{&tp, &o.tp}, std::pair{&ep, &o.ep}}) add(*a, *b, 1);
      return *this;
    }
    Tally operator-(const Tally& o) const {
      Tally d = *this;
      for (auto [a, b] : {std::pair{&d.dp, &o.dp}, std::pair{&d.tp, &o.tp}, std::pair{&d.ep, &o.ep}}) add(*a, *b, -1);
      return d;
    }
    static void add(CollectiveCounts& a, const CollectiveCounts& b, int sign) {
      a.all_reduce += sign * b.all_reduce, a.all_reduce_bytes += sign * b.all_reduce_bytes;
      a.reduce_scatter += sign * b.reduce_scatter, a.reduce_scatter_bytes += sign * b.reduce_scatter_bytes;
      a.all_gather += sign * b.all_gather, a.all_gather_bytes += sign * b.all_gather_bytes;
      a.broadcast += sign * b.broadcast, a.broadcast_bytes += sign * b.broadcast_bytes;
      a.send += sign * b.send, a.send_bytes += sign * b.send_bytes;
    }
  };

  Tally now() const {
    Tally t;
    t.dp = groups_.expert_dp().counts();
    if (groups_.tp() != nullptr) t.tp = groups_.tp()->counts();
    if (groups_.ep() != nullptr) t.ep = groups_.ep()->counts();
    return t;
  }
  // The tallies less what left_out() ran.
  Tally counted() const { return now() - left_out_; }

  // A group of `ranks`' tally as traffic on NCCL's rings (comm_plan.h).
  static StepTraffic ring_traffic(const CollectiveCounts& c, int ranks) {
    const auto sent = [&](long long calls, long long bytes, int passes) {
      return CollectiveTraffic{calls, ring_bytes_sent(static_cast<double>(bytes), ranks, passes)};
    };
    return {sent(c.all_reduce, c.all_reduce_bytes, 2), sent(c.reduce_scatter, c.reduce_scatter_bytes, 1),
            sent(c.all_gather, c.all_gather_bytes, 1)};
  }

  ParallelGroups& groups_;
  const int micro_steps_;
  long long steps_ = 0;
  Tally first_, rest_, left_out_;
};

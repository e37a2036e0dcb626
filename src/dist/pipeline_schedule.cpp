// pipeline_schedule.cpp — pipeline parallelism's schedules as data: each rank's order of
// computations per kind, their unit-cost timing, and the one global order of computations and
// transfers every rank's table is a view of (see the header).
#include "src/dist/pipeline_schedule.h"

#include <algorithm>
#include <deque>
#include <stdexcept>
#include <tuple>

const char* pipeline_kind_name(PipelineKind kind) {
  switch (kind) {
    case PipelineKind::gpipe: return "gpipe";
    case PipelineKind::one_f_one_b: return "1f1b";
    case PipelineKind::interleaved: return "interleaved";
    case PipelineKind::zb_h1: return "zb-h1";
  }
  return "?";
}

PipelineKind parse_pipeline_kind(const std::string& name) {
  for (PipelineKind kind : {PipelineKind::gpipe, PipelineKind::one_f_one_b,
                            PipelineKind::interleaved, PipelineKind::zb_h1}) {
    if (name == pipeline_kind_name(kind)) return kind;
  }
  throw std::invalid_argument("--pp-schedule: '" + name + "' is not one of gpipe, 1f1b, interleaved, zb-h1");
}

bool is_computation(PipelineOp op) {
  return op == PipelineOp::forward || op == PipelineOp::backward || op == PipelineOp::backward_input ||
         op == PipelineOp::backward_weight;
}
bool is_send(PipelineOp op) { return op == PipelineOp::send_activation || op == PipelineOp::send_gradient; }
bool is_activation_transfer(PipelineOp op) {
  return op == PipelineOp::send_activation || op == PipelineOp::recv_activation;
}

int pipeline_unit_cost(PipelineOp op) {
  switch (op) {
    case PipelineOp::forward: return 1;
    case PipelineOp::backward: return 2;
    case PipelineOp::backward_input: return 1;
    case PipelineOp::backward_weight: return 1;
    default: return 0;
  }
}

void check_pipeline_shape(const PipelineShape& shape) {
  if (shape.stages < 1) {
    throw std::invalid_argument("--pp: " + std::to_string(shape.stages) + " pipeline stages (need at least 1)");
  }
  if (shape.microbatches < shape.stages) {
    throw std::invalid_argument("--pp " + std::to_string(shape.stages) + ": " + std::to_string(shape.microbatches) +
                                " micro-batches per optimizer step (m: --total-batch-tokens / (--batch-size x "
                                "--seq-len x data-parallel ranks)); every schedule needs m >= --pp");
  }
  if (shape.virtual_stages < 1) {
    throw std::invalid_argument("--pp-virtual: " + std::to_string(shape.virtual_stages) +
                                " chunks per rank (need at least 1)");
  }
  if (shape.virtual_stages > 1 && shape.kind != PipelineKind::interleaved) {
    throw std::invalid_argument("--pp-virtual: " + std::to_string(shape.virtual_stages) +
                                " chunks per rank need --pp-schedule interleaved (not " +
                                pipeline_kind_name(shape.kind) + ")");
  }
}

int pipeline_warmup_forwards(const PipelineShape& shape, int rank) {
  const int p = shape.stages, m = shape.microbatches, v = shape.virtual_stages;
  switch (shape.kind) {
    case PipelineKind::gpipe: return m;
    case PipelineKind::one_f_one_b:
    case PipelineKind::zb_h1: return std::min(p - rank - 1, m);
    case PipelineKind::interleaved:
      if (v == 1) return std::min(p - rank - 1, m);
      return std::min(2 * (p - rank - 1) + (v - 1) * interleaved_groups(shape)[0], m * v);
  }
  return 0;
}

std::vector<int> interleaved_groups(const PipelineShape& shape) {
  // Groups of at least p keep rank 0 busy: the first chunk's output of the group's first
  // micro-batch comes back round the ring just as the rank finishes the group's first chunk.
  check_pipeline_shape(shape);  // n >= 1 below
  const int p = shape.stages, m = shape.microbatches, n = m / p;
  std::vector<int> groups(n, p);
  for (int i = 0; i < m % p; ++i) groups[i % n] += 1;
  return groups;
}

namespace {

struct Work {
  PipelineOp op;
  int microbatch;
  int chunk;
};

// The (micro-batch, chunk) order of a rank's forwards (or, with `reverse_chunks`, backwards): the
// micro-batch groups in turn, each group's micro-batches through the rank's chunks in turn (with
// one chunk per rank: micro-batches 0..m-1).
std::vector<Work> walk_order(const PipelineShape& shape, int rank, PipelineOp op, bool reverse_chunks) {
  const int p = shape.stages, v = shape.virtual_stages;
  std::vector<Work> order;
  const std::vector<int> groups = interleaved_groups(shape);
  for (int g = 0, first = 0; g < static_cast<int>(groups.size()); first += groups[g++]) {
    const int group = groups[g];
    for (int k = 0; k < v; ++k) {
      const int local = reverse_chunks ? v - 1 - k : k;
      for (int j = 0; j < group; ++j) order.push_back({op, first + j, local * p + rank});
    }
  }
  return order;
}

// The rank's forwards and backwards (input backwards for zb-h1) in the order it runs them; zb-h1's
// weight backwards are placed by the timing.
std::vector<Work> rank_plan(const PipelineShape& shape, int rank) {
  const PipelineOp backward =
      shape.kind == PipelineKind::zb_h1 ? PipelineOp::backward_input : PipelineOp::backward;
  const std::vector<Work> forwards = walk_order(shape, rank, PipelineOp::forward, false);
  const std::vector<Work> backwards = walk_order(shape, rank, backward, true);
  const int n = static_cast<int>(forwards.size());
  const int warmup = pipeline_warmup_forwards(shape, rank);
  std::vector<Work> plan(forwards.begin(), forwards.begin() + warmup);
  for (int i = 0; i + warmup < n; ++i) {
    plan.push_back(forwards[warmup + i]);
    plan.push_back(backwards[i]);
  }
  plan.insert(plan.end(), backwards.begin() + (n - warmup), backwards.end());
  return plan;
}

// One entry of the global order: a computation (rank, work) at its start, or a transfer at its
// producer's end. Transfers sort before computations at the same time; `sequence` keeps the rest
// in the order they were made.
struct Event {
  long time;
  bool computation;
  long sequence;
  int rank;  // the computation's rank, or the transfer's producer rank
  Work work;  // a transfer: send_activation or send_gradient, with the producer's micro-batch and chunk
};

}  // namespace

std::vector<PipelineTable> build_pipeline_schedule(const PipelineShape& shape) {
  check_pipeline_shape(shape);
  const int p = shape.stages, m = shape.microbatches, chunks = shape.chunks();
  const bool zero_bubble = shape.kind == PipelineKind::zb_h1;
  // End times of each (micro-batch, chunk)'s forward and (input) backward; -1: not started.
  std::vector<long> forward_end(size_t(m) * chunks, -1), backward_end(size_t(m) * chunks, -1);
  auto at = [chunks](int mb, int chunk) { return size_t(mb) * chunks + chunk; };
  auto done_by = [](long end, long t) { return end >= 0 && end <= t; };

  struct RankState {
    std::vector<Work> plan;
    size_t next = 0;
    long free_at = 0;
    std::deque<Work> weight_pending;  // zb-h1: input backwards done, weight backward not yet
    int holding = 0;                  // zb-h1: forwards whose weight backward has not run
  };
  std::vector<RankState> ranks(p);
  long total_work = 0;
  for (int r = 0; r < p; ++r) {
    ranks[r].plan = rank_plan(shape, r);
    // (zb-h1's weight backwards are not in the plan: one unit per planned action covers them.)
    for (const Work& w : ranks[r].plan) total_work += pipeline_unit_cost(w.op) + (zero_bubble ? 1 : 0);
  }

  std::vector<Event> events;
  auto start = [&](int r, const Work& w, long t) {
    const long end = t + pipeline_unit_cost(w.op);
    ranks[r].free_at = end;
    events.push_back({t, true, long(events.size()), r, w});
    if (w.op == PipelineOp::forward) {
      forward_end[at(w.microbatch, w.chunk)] = end;
      if (w.chunk + 1 < chunks && shape.rank_of(w.chunk + 1) != r) {
        events.push_back({end, false, long(events.size()), r, {PipelineOp::send_activation, w.microbatch, w.chunk}});
      }
    } else if (w.op != PipelineOp::backward_weight) {
      backward_end[at(w.microbatch, w.chunk)] = end;
      if (w.chunk > 0 && shape.rank_of(w.chunk - 1) != r) {
        events.push_back({end, false, long(events.size()), r, {PipelineOp::send_gradient, w.microbatch, w.chunk}});
      }
    }
  };
  auto ready = [&](const Work& w, long t) {
    if (w.op == PipelineOp::forward) return w.chunk == 0 || done_by(forward_end[at(w.microbatch, w.chunk - 1)], t);
    return done_by(forward_end[at(w.microbatch, w.chunk)], t) &&
           (w.chunk + 1 == chunks || done_by(backward_end[at(w.microbatch, w.chunk + 1)], t));
  };

  // Unit-cost time steps; every rank free at t starts its next computation if its inputs are there
  // (zb-h1: else a pending weight backward; also one first when the rank already holds p).
  int finished = 0;
  for (long t = 0; finished < p; ++t) {
    if (t > total_work + 1) throw std::logic_error("pipeline schedule stalls: a rank waits for work never done");
    for (int r = 0; r < p; ++r) {
      RankState& rank = ranks[r];
      if (rank.free_at > t || rank.free_at < 0) continue;
      const bool planned = rank.next < rank.plan.size();
      const Work* next = planned ? &rank.plan[rank.next] : nullptr;
      const bool go = next && ready(*next, t) &&
                      !(zero_bubble && next->op == PipelineOp::forward && rank.holding >= p &&
                        !rank.weight_pending.empty());
      if (go) {
        start(r, *next, t);
        if (next->op == PipelineOp::forward && zero_bubble) ++rank.holding;
        if (next->op == PipelineOp::backward_input) {
          rank.weight_pending.push_back({PipelineOp::backward_weight, next->microbatch, next->chunk});
        }
        ++rank.next;
      } else if (!rank.weight_pending.empty()) {  // not ready, or holding p already
        start(r, rank.weight_pending.front(), t);
        rank.weight_pending.pop_front();
        --rank.holding;
      } else if (!planned) {
        rank.free_at = -1;  // done
        ++finished;
      }
    }
  }

  std::stable_sort(events.begin(), events.end(), [](const Event& a, const Event& b) {
    return std::tie(a.time, a.computation, a.sequence) < std::tie(b.time, b.computation, b.sequence);
  });
  std::vector<PipelineTable> tables(p);
  for (const Event& e : events) {
    if (e.computation) {
      tables[e.rank].push_back({e.work.op, e.work.microbatch, e.work.chunk, -1});
      continue;
    }
    const bool activation = e.work.op == PipelineOp::send_activation;
    const int to = shape.rank_of(e.work.chunk + (activation ? 1 : -1));
    tables[e.rank].push_back({e.work.op, e.work.microbatch, e.work.chunk, to});
    tables[to].push_back({activation ? PipelineOp::recv_activation : PipelineOp::recv_gradient, e.work.microbatch,
                          e.work.chunk, e.rank});
  }
  return tables;
}

std::string action_label(const PipelineAction& a, const PipelineShape& shape) {
  static const char* const kNames[] = {"F", "B", "b", "W", "sA", "rA", "sG", "rG"};
  std::string label = kNames[static_cast<int>(a.op)] + std::to_string(a.microbatch);
  if (shape.virtual_stages > 1) label += "." + std::to_string(a.chunk);
  if (!is_computation(a.op)) label += (is_send(a.op) ? ">" : "<") + std::to_string(a.peer);
  return label;
}

int pipeline_activation_sets(const PipelineTable& table) {
  int held = 0, most = 1;
  for (const PipelineAction& a : table) {
    const bool takes = a.op == PipelineOp::recv_activation || (a.op == PipelineOp::forward && a.chunk == 0);
    if (takes) most = std::max(most, ++held);
    if (a.op == PipelineOp::backward || a.op == PipelineOp::backward_weight) --held;
  }
  return most;
}

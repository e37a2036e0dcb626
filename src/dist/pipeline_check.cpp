// pipeline_check.cpp — pipeline schedules checked (coverage, order, matched transfers, deadlock
// under blocking sends, in-flight activations) and timed at unit costs, and their timelines.
#include "src/dist/pipeline_check.h"

#include <algorithm>
#include <map>
#include <sstream>
#include <stdexcept>
#include <tuple>

namespace {

constexpr size_t kMaxErrors = 8;

// A transfer's identity: activation or gradient, micro-batch, producing chunk.
using TransferKey = std::tuple<bool, int, int>;
TransferKey key_of(const PipelineAction& a) { return {is_activation_transfer(a.op), a.microbatch, a.chunk}; }

}  // namespace

std::string PipelineCheck::report() const {
  std::string text;
  for (const std::string& e : errors) text += e + "\n";
  return text;
}

int pipeline_in_flight_bound(const PipelineShape& shape, int rank) {
  return std::min(pipeline_warmup_forwards(shape, rank) + 1, shape.microbatches * shape.virtual_stages);
}

PipelineCheck check_pipeline_schedule(const PipelineShape& shape, const std::vector<PipelineTable>& tables) {
  PipelineCheck check;
  auto fail = [&check](const std::string& line) {
    if (check.errors.size() < kMaxErrors) check.errors.push_back(line);
  };
  const int p = shape.stages, m = shape.microbatches, chunks = shape.chunks();
  if (static_cast<int>(tables.size()) != p) {
    fail(std::to_string(tables.size()) + " tables for " + std::to_string(p) + " ranks");
    return check;
  }
  const bool zero_bubble = shape.kind == PipelineKind::zb_h1;
  auto label = [&shape](const PipelineAction& a) { return action_label(a, shape); };

  // Positions in the rank's table of each (micro-batch, chunk)'s computations and transfers.
  enum Slot { kF, kB, kW, kSendA, kRecvA, kSendG, kRecvG, kSlots };
  std::vector<std::vector<int>> position(kSlots, std::vector<int>(size_t(m) * chunks, -1));
  std::vector<std::vector<int>> count(kSlots, std::vector<int>(size_t(m) * chunks, 0));
  auto slot_of = [](PipelineOp op) {
    switch (op) {
      case PipelineOp::forward: return kF;
      case PipelineOp::backward:
      case PipelineOp::backward_input: return kB;
      case PipelineOp::backward_weight: return kW;
      case PipelineOp::send_activation: return kSendA;
      case PipelineOp::recv_activation: return kRecvA;
      case PipelineOp::send_gradient: return kSendG;
      case PipelineOp::recv_gradient: return kRecvG;
    }
    return kSlots;
  };
  check.peak_activations.assign(p, 0);
  check.peak_held.assign(p, 0);
  for (int r = 0; r < p; ++r) {
    int activations = 0, held = 0;
    for (int i = 0; i < static_cast<int>(tables[r].size()); ++i) {
      const PipelineAction& a = tables[r][i];
      const std::string where = "rank " + std::to_string(r) + " action " + std::to_string(i) + " ";
      if (a.microbatch < 0 || a.microbatch >= m || a.chunk < 0 || a.chunk >= chunks) {
        fail(where + "names micro-batch " + std::to_string(a.microbatch) + ", chunk " + std::to_string(a.chunk));
        continue;
      }
      const bool split = a.op == PipelineOp::backward_input || a.op == PipelineOp::backward_weight;
      if ((a.op == PipelineOp::backward && zero_bubble) || (split && !zero_bubble)) {
        fail(where + label(a) + ": not a computation of " + pipeline_kind_name(shape.kind));
      }
      const size_t at = size_t(a.microbatch) * chunks + a.chunk;
      const Slot slot = slot_of(a.op);
      ++count[slot][at];
      position[slot][at] = i;
      if (is_computation(a.op)) {
        if (shape.rank_of(a.chunk) != r) fail(where + label(a) + ": chunk held by rank " + std::to_string(shape.rank_of(a.chunk)));
        if (a.op == PipelineOp::forward) {
          activations++, held++;
        } else if (a.op == PipelineOp::backward_weight) {
          held--;
        } else {
          activations--;
          if (!zero_bubble) held--;
        }
        check.peak_activations[r] = std::max(check.peak_activations[r], activations);
        check.peak_held[r] = std::max(check.peak_held[r], held);
      }
    }
  }

  // Coverage and order of the computations and the transfers between them.
  for (int mb = 0; mb < m; ++mb) {
    for (int s = 0; s < chunks; ++s) {
      const size_t at = size_t(mb) * chunks + s;
      const std::string what = "micro-batch " + std::to_string(mb) + " chunk " + std::to_string(s) + ": ";
      const int expected[kSlots] = {
          1, 1, zero_bubble ? 1 : 0,
          s + 1 < chunks && shape.rank_of(s + 1) != shape.rank_of(s) ? 1 : 0,
          s + 1 < chunks && shape.rank_of(s + 1) != shape.rank_of(s) ? 1 : 0,
          s > 0 && shape.rank_of(s - 1) != shape.rank_of(s) ? 1 : 0,
          s > 0 && shape.rank_of(s - 1) != shape.rank_of(s) ? 1 : 0};
      static const char* const kSlotNames[] = {"forward",         "backward",         "weight backward",
                                               "activation send", "activation receive", "gradient send",
                                               "gradient receive"};
      bool counts_ok = true;
      for (int k = 0; k < kSlots; ++k) {
        if (count[k][at] != expected[k]) {
          counts_ok = false;
          fail(what + std::to_string(count[k][at]) + " " + kSlotNames[k] + "s (expected " +
               std::to_string(expected[k]) + ")");
        }
      }
      if (!counts_ok) continue;
      if (position[kB][at] < position[kF][at]) fail(what + "backward before its forward");
      if (zero_bubble && position[kW][at] < position[kB][at]) fail(what + "weight backward before its input backward");
      if (expected[kSendA] && position[kSendA][at] < position[kF][at]) fail(what + "activation sent before the forward");
      if (expected[kSendG] && position[kSendG][at] < position[kB][at]) fail(what + "gradient sent before the backward");
      if (expected[kRecvA] && position[kF][at + 1] >= 0 && position[kRecvA][at] > position[kF][at + 1]) {
        fail(what + "next chunk's forward before the activation arrives");
      }
      if (expected[kRecvG] && position[kB][at - 1] >= 0 && position[kRecvG][at] > position[kB][at - 1]) {
        fail(what + "previous chunk's backward before the gradient arrives");
      }
    }
  }
  // Peers, and the order of the transfers between each pair of ranks.
  std::map<std::pair<int, int>, std::vector<TransferKey>> sent, received;
  for (int r = 0; r < p; ++r) {
    for (const PipelineAction& a : tables[r]) {
      if (is_computation(a.op) || a.chunk < 0 || a.chunk >= chunks) continue;
      const bool activation = is_activation_transfer(a.op);
      const int producer = shape.rank_of(a.chunk);
      const int consumer = shape.rank_of(a.chunk + (activation ? 1 : chunks - 1));  // chunk ± 1, mod p
      const bool sends = is_send(a.op);
      if (r != (sends ? producer : consumer) || a.peer != (sends ? consumer : producer)) {
        fail("rank " + std::to_string(r) + " " + label(a) + ": wrong rank or peer");
        continue;
      }
      (sends ? sent[{r, a.peer}] : received[{a.peer, r}]).push_back(key_of(a));
    }
  }
  for (const auto& [pair, keys] : sent) {
    if (received[pair] != keys) {
      fail("rank " + std::to_string(pair.first) + " sends to rank " + std::to_string(pair.second) +
           " in another order than it receives");
    }
  }
  if (!check.ok()) return check;

  // Deadlock: blocking rendezvous.
  std::vector<size_t> next(p, 0);
  for (bool moved = true; moved;) {
    moved = false;
    for (int r = 0; r < p; ++r) {
      while (next[r] < tables[r].size()) {
        const PipelineAction& a = tables[r][next[r]];
        if (is_computation(a.op)) {
          ++next[r], moved = true;
          continue;
        }
        if (!is_send(a.op) || next[a.peer] >= tables[a.peer].size()) break;
        const PipelineAction& other = tables[a.peer][next[a.peer]];
        if (is_computation(other.op) || is_send(other.op) || other.peer != r || key_of(other) != key_of(a)) break;
        ++next[r], ++next[a.peer], moved = true;
      }
    }
  }
  std::string stuck;
  for (int r = 0; r < p; ++r) {
    if (next[r] < tables[r].size()) stuck += " rank " + std::to_string(r) + " at " + label(tables[r][next[r]]);
  }
  if (!stuck.empty()) fail("deadlock:" + stuck);

  for (int r = 0; r < p; ++r) {
    const int bound = pipeline_in_flight_bound(shape, r);
    if (check.peak_activations[r] > bound) {
      fail("rank " + std::to_string(r) + " holds " + std::to_string(check.peak_activations[r]) +
           " activations (bound " + std::to_string(bound) + ")");
    }
    if (zero_bubble && check.peak_held[r] > p) {
      fail("rank " + std::to_string(r) + " holds " + std::to_string(check.peak_held[r]) +
           " micro-batches awaiting their weight gradient (bound " + std::to_string(p) + ")");
    }
  }
  return check;
}

double PipelineTiming::bubble() const {
  long idle_sum = 0;
  for (size_t r = 0; r < busy.size(); ++r) idle_sum += idle(int(r));
  return double(idle_sum) / (double(makespan) * double(busy.size()));
}

double PipelineTiming::bubble_over_ideal() const {
  long idle_sum = 0, busy_sum = 0;
  for (size_t r = 0; r < busy.size(); ++r) idle_sum += idle(int(r)), busy_sum += busy[r];
  return double(idle_sum) / double(busy_sum);
}

PipelineTiming time_pipeline_schedule(const PipelineShape& shape, const std::vector<PipelineTable>& tables) {
  const int p = static_cast<int>(tables.size());
  PipelineTiming timing;
  timing.busy.assign(p, 0);
  timing.computations.assign(p, {});
  std::vector<long> clock(p, 0);
  std::vector<size_t> next(p, 0);
  std::map<TransferKey, long> sent_at;
  for (bool moved = true; moved;) {
    moved = false;
    for (int r = 0; r < p; ++r) {
      for (; next[r] < tables[r].size(); ++next[r], moved = true) {
        const PipelineAction& a = tables[r][next[r]];
        if (is_computation(a.op)) {
          timing.computations[r].push_back({clock[r], a});
          clock[r] += pipeline_unit_cost(a.op);
          timing.busy[r] += pipeline_unit_cost(a.op);
        } else if (is_send(a.op)) {
          sent_at[key_of(a)] = clock[r];
        } else {
          const auto it = sent_at.find(key_of(a));
          if (it == sent_at.end()) break;
          clock[r] = std::max(clock[r], it->second);
        }
      }
    }
  }
  for (int r = 0; r < p; ++r) {
    if (next[r] < tables[r].size()) {
      throw std::logic_error("pipeline timing: rank " + std::to_string(r) + " never gets " +
                             action_label(tables[r][next[r]], shape));
    }
    timing.makespan = std::max(timing.makespan, clock[r]);
  }
  return timing;
}

std::string pipeline_timeline(const PipelineShape& shape, const PipelineTiming& timing) {
  size_t width = 1;
  for (const auto& rank : timing.computations) {
    for (const TimedAction& t : rank) width = std::max(width, action_label(t.action, shape).size());
  }
  auto cell = [width](const std::string& text) { return text + std::string(width + 1 - text.size(), ' '); };
  std::ostringstream out;
  for (size_t r = 0; r < timing.computations.size(); ++r) {
    std::string line = "r" + std::to_string(r) + " | ";
    long t = 0;
    for (const TimedAction& c : timing.computations[r]) {
      for (; t < c.start; ++t) line += cell(".");
      line += cell(action_label(c.action, shape));
      for (++t; t < c.start + pipeline_unit_cost(c.action.op); ++t) line += cell("~");
    }
    for (; t < timing.makespan; ++t) line += cell(".");
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out << line << "\n";
  }
  return out.str();
}

std::string pipeline_timeline_json(const PipelineShape& shape, const PipelineTiming& timing) {
  static const char* const kOps[] = {"F", "B", "BI", "W"};
  std::ostringstream out;
  out << "{\"kind\": \"" << pipeline_kind_name(shape.kind) << "\", \"stages\": " << shape.stages
      << ", \"microbatches\": " << shape.microbatches << ", \"virtual_stages\": " << shape.virtual_stages
      << ", \"makespan\": " << timing.makespan << ", \"ranks\": [";
  for (size_t r = 0; r < timing.computations.size(); ++r) {
    out << (r ? ", [" : "[");
    for (size_t i = 0; i < timing.computations[r].size(); ++i) {
      const TimedAction& c = timing.computations[r][i];
      out << (i ? ", " : "") << "{\"op\": \"" << kOps[static_cast<int>(c.action.op)]
          << "\", \"microbatch\": " << c.action.microbatch << ", \"chunk\": " << c.action.chunk
          << ", \"start\": " << c.start << ", \"cost\": " << pipeline_unit_cost(c.action.op) << "}";
    }
    out << "]";
  }
  out << "]}\n";
  return out.str();
}

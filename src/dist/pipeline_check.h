// pipeline_check.h — pipeline schedules checked and timed on the CPU: the validator (coverage,
// order, matched transfers, no deadlock under blocking sends, in-flight activations), the
// unit-cost simulator and its bubble, and the timeline as text or JSON (dev/pipeline_timeline.py
// draws the JSON). The tables come from pipeline_schedule.h or anywhere else.
//
// The validator knows nothing of how the tables were built. It checks, for tables of `shape`:
//   - each computation is of a kind the schedule uses (zb-h1: input and weight backwards; the
//     rest: whole backwards), names a micro-batch in [0, m) and a chunk in [0, p·v), and runs on
//     the rank that holds the chunk; each (micro-batch, chunk) is forwarded once and backwarded
//     once (zb-h1: one input and one weight backward), the backward after the forward in the
//     rank's table (zb-h1: the weight backward after the input backward);
//   - each transfer the computations need (chunk s to s+1 on another rank, and back) is sent once,
//     after its producer, and received once, before its consumer, between the right ranks; no
//     other transfer appears; the sends from rank a to rank b come in the order b receives them;
//   - no deadlock: every rank runs its table in order; a computation runs at once; a send waits
//     until the peer's next action is the matching receive, and both then complete together (the
//     strictest blocking rendezvous). If no rank can move before all tables end, it deadlocks;
//   - in flight (per rank, the most at any point of its table): activations = forwards whose
//     backward (zb-h1: input backward) has not run; held = forwards whose weight gradient has not
//     run (equal to activations but for zb-h1). Bounds (pipeline_in_flight_bound): gpipe m;
//     1f1b p - r; interleaved min(2(p-r-1) + (v-1)g + 1, m·v) chunk activations, g the first
//     micro-batch group's size (m a multiple of p: g = p, and rank 0 holds p·v + p - 1 chunks'
//     activations, 1 + (p-1)/(p·v) times 1f1b's p stages' worth; v = 1: 1f1b's);
//     zb-h1 activations p - r like 1f1b and held at most p on every rank (1f1b's rank-0 peak).
//
// The simulator runs the tables with pipeline_unit_cost's costs. Transfers cost 0 and never hold
// up their sender (they travel on the communication stream); a receive holds its rank until the
// matching send has been reached. All ranks start at 0. Definitions:
//   busy(r)   the sum of rank r's computation costs (3m per rank; 3m·v with v chunks)
//   total     the makespan T: when the last rank finishes (the optimizer step waits for it)
//   idle(r)   T - busy(r)
//   bubble    Σ idle / (p·T): the fraction of the ranks' time spent idle
//   bubble over ideal   Σ idle / Σ busy (the step's time over the no-bubble time, minus 1)
// With these costs: gpipe and 1f1b: bubble (p-1)/(m+p-1), over ideal (p-1)/m; interleaved: over
// ideal (p-1)/(v·m), i.e. bubble (p-1)/(v·m+p-1); zb-h1: over ideal (p-1)/(3m) (the weight
// backwards fill two thirds of 1f1b's bubble), bubble (p-1)/(3m+p-1).
#pragma once
#include "src/dist/pipeline_schedule.h"

#include <string>
#include <vector>

struct PipelineCheck {
  std::vector<std::string> errors;  // empty: valid (the first few found, one line each)
  std::vector<int> peak_activations;  // per rank
  std::vector<int> peak_held;         // per rank
  bool ok() const { return errors.empty(); }
  std::string report() const;  // the errors, one per line
};

PipelineCheck check_pipeline_schedule(const PipelineShape& shape, const std::vector<PipelineTable>& tables);

// The kind's bound on rank r's in-flight activations (above); zb-h1's bound on held is p.
int pipeline_in_flight_bound(const PipelineShape& shape, int rank);

struct TimedAction {
  long start;
  PipelineAction action;
};
struct PipelineTiming {
  long makespan = 0;
  std::vector<long> busy;                        // per rank
  std::vector<std::vector<TimedAction>> computations;  // per rank, in order
  long idle(int rank) const { return makespan - busy[rank]; }
  double bubble() const;             // Σ idle / (p·T)
  double bubble_over_ideal() const;  // Σ idle / Σ busy
};

// Throws std::logic_error when the tables cannot run to the end (check them first).
PipelineTiming time_pipeline_schedule(const PipelineShape& shape, const std::vector<PipelineTable>& tables);

// One line per rank: "r0 | F0 F1 .  .  B0 ~  ..." — one cell per time unit: the computation's
// label where it starts, "~" while it lasts, "." idle.
std::string pipeline_timeline(const PipelineShape& shape, const PipelineTiming& timing);

// The same as JSON: {"kind", "stages", "microbatches", "virtual_stages", "makespan", "ranks":
// [[{"op": "F", "microbatch", "chunk", "start", "cost"}, ...], ...]}.
std::string pipeline_timeline_json(const PipelineShape& shape, const PipelineTiming& timing);

// pipeline_schedule.h — pipeline parallelism's schedules as data: each pipeline rank's ordered
// table of actions (forwards, backwards, sends, receives) for gpipe, 1f1b, interleaved and zb-h1,
// and the one function that builds them. Checking and timing them: pipeline_check.h.
//
// Words. p ranks (stages), m micro-batches per optimizer step, v model chunks per rank (v > 1 only
// for interleaved). The model's layers are cut into S = p·v chunks, numbered 0..S-1 in model
// order; rank r holds chunks r, r+p, r+2p, ... (chunk s lives on rank s % p), so activations go
// round the ring v times. A chunk's output activation goes to chunk s+1, the gradient of its input
// to chunk s-1; a transfer names the micro-batch and the chunk that PRODUCED it.
//
// The kinds (each rank's order of computations; its transfers follow from them, below):
//   gpipe        every forward (micro-batch 0..m-1), then every backward (0..m-1).
//   1f1b         p-r-1 warm-up forwards, then forward/backward pairs, then the remaining backwards;
//                rank r never holds more than p-r micro-batches' activations.
//   interleaved  the forwards walk the micro-batches in groups: chunk r of the group's micro-batches,
//                then chunk r+p, ..., then the next group; the backwards walk the same groups with
//                the chunks in reverse. Warm-up: 2(p-r-1) + (v-1)·g forwards (g: the first
//                group's size; capped at m·v), then forward/backward pairs, then the rest (v = 1
//                is exactly 1f1b). Megatron's groups are p micro-batches, so it needs m to be a
//                multiple of p (and, in its older versions, p > 2). LIFTED here: m = n·p + k
//                (0 <= k < p) makes n groups of p and spreads the k left over one each over the
//                first groups (interleaved_groups), so any m >= p works, p = 2 included, with the
//                same bubble; a group larger than p costs rank 0 (v-1) more activations per extra
//                micro-batch in the first group.
//   zb-h1        zero bubble, handcrafted schedule 1 (Qi et al., 2023): each backward is split into
//                BackwardInput (the input gradient, on the critical path, sent upstream at once)
//                and BackwardWeight (the weight gradient, which nothing waits for). Forwards and
//                input backwards keep 1f1b's order; the weight backwards wait and run where the rank
//                would otherwise idle, or when the rank already holds p micro-batches whose weight
//                gradient is pending (1f1b's first-rank peak, on every rank).
//
// Transfers. The builder times the computations with unit costs (pipeline_check.h) and lists every
// computation and every transfer in one global order (by time; a transfer at the moment its
// producer ends, before any computation that starts then). Each rank's table is that order seen by
// the rank: a transfer is a Send on its producer's rank and a Recv on its consumer's. Because all
// tables are views of one order, they cannot deadlock even when a send blocks until its receive
// is posted (the validator checks it all the same).
//
// Bad input (std::invalid_argument, one line naming the flag): p < 1 (--pp), m < p (--pp and
// the flags that set m: --total-batch-tokens, --batch-size, --seq-len), v < 1, or v > 1 with a
// kind other than interleaved (--pp-virtual).
#pragma once
#include <string>
#include <vector>

enum class PipelineKind { gpipe, one_f_one_b, interleaved, zb_h1 };

// "gpipe", "1f1b", "interleaved", "zb-h1" (the --pp-schedule values) and back.
const char* pipeline_kind_name(PipelineKind kind);
PipelineKind parse_pipeline_kind(const std::string& name);  // throws naming --pp-schedule

enum class PipelineOp {
  forward,
  backward,        // input and weight gradients together (every kind but zb-h1)
  backward_input,   // zb-h1: the input gradient (what the previous chunk waits for)
  backward_weight,  // zb-h1: the weight gradient
  send_activation,  // the chunk's output, to the rank of chunk + 1
  recv_activation,  // chunk's output, from the rank of chunk (this rank holds chunk + 1)
  send_gradient,    // the gradient of the chunk's input, to the rank of chunk - 1
  recv_gradient,    // chunk's input gradient, from the rank of chunk (this rank holds chunk - 1)
};
bool is_computation(PipelineOp op);
bool is_send(PipelineOp op);
bool is_activation_transfer(PipelineOp op);  // send_activation or recv_activation

// Unit costs (the simulator's, and the builder's timing): forward 1, backward 2, zb-h1's input and
// weight backwards 1 each, transfers 0. With v > 1 the unit is one chunk's forward.
int pipeline_unit_cost(PipelineOp op);

struct PipelineAction {
  PipelineOp op;
  int microbatch;
  int chunk;      // the global chunk (0..p·v-1) computed, or that produced the transfer
  int peer = -1;  // the other rank of a transfer; -1 for a computation
  bool operator==(const PipelineAction& o) const {
    return op == o.op && microbatch == o.microbatch && chunk == o.chunk && peer == o.peer;
  }
};

struct PipelineShape {
  int stages = 1;          // p: --pp
  int microbatches = 1;    // m: the step's gradient accumulation steps (validate_config)
  int virtual_stages = 1;  // v: --pp-virtual
  PipelineKind kind = PipelineKind::one_f_one_b;
  int chunks() const { return stages * virtual_stages; }
  int rank_of(int chunk) const { return chunk % stages; }
};

// Throws std::invalid_argument (one line naming the flag) for a shape no schedule exists for.
void check_pipeline_shape(const PipelineShape& shape);

// Interleaved: the sizes of the micro-batch groups (above), in order; they sum to m.
std::vector<int> interleaved_groups(const PipelineShape& shape);

// Warm-up forwards rank `rank` runs before its first backward (the in-flight activations the
// kind plans for are this + 1, capped at the forwards there are).
int pipeline_warmup_forwards(const PipelineShape& shape, int rank);

using PipelineTable = std::vector<PipelineAction>;

// Every rank's table, index = rank.
std::vector<PipelineTable> build_pipeline_schedule(const PipelineShape& shape);

// The activation sets a rank running `table` in order holds at most at once: a chunk pass takes
// one at its input's receive (or its forward, on the model's first chunk) and gives it back after
// its backward (zb-h1: its weight backward). The model allocates this many (pipeline_step.h).
int pipeline_activation_sets(const PipelineTable& table);

// "F3", "B3", "b3" (input backward), "W3"; with v > 1 the chunk follows: "F3.5". Transfers:
// "sA3>1" (send activation of micro-batch 3 to rank 1), "rA3<0", "sG..", "rG..".
std::string action_label(const PipelineAction& action, const PipelineShape& shape);

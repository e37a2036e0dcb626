// tp_collectives.h — the tensor-parallel group's collectives on the compute path (tensor_split.h
// says what each rank holds): the all-gathers and reductions of activations between the
// column- and row-parallel products, each ordered after the model stream's work by an event and
// before its next work by another (comm.h's wait_for/order_before).
//
// A block's tensors are (rows, width) row-major. Column-parallel products read every row of their
// input; row-parallel products leave a partial sum of every row, which the group sums:
//   sequence parallel: the LayerNorm/residual region holds this rank's consecutive rows
//     [rank·rows/size, (rank+1)·rows/size) of the B·T token rows (for B = 1 exactly a slice of the
//     sequence; LayerNorm and the residual add are per token, so which tokens is immaterial, and
//     consecutive rows are what NCCL's chunked collectives deliver, with no permutation); a
//     column-parallel input is all-gathered in place from each rank's rows, a row-parallel
//     output reduce-scattered in place onto them.
//   otherwise: every rank holds every row; gathers do nothing and a partial sum is all-reduced.
// With a group of one rank every call does nothing.
#pragma once
#include "src/dist/comm.h"
#include "src/dist/tensor_split.h"

#include <cstddef>
#include <stdexcept>
#include <string>

// This rank's part of `cfg` in the TP group of `tp_comm` (nullptr: every TP part) of pipeline
// stage `stage`, checked; or its experts in the EP group of `ep_comm` (nullptr: all).
inline TensorSplit tensor_split_of(const ModelConfig& cfg, Communicator* tp_comm, const StagePart& stage,
                                   Communicator* ep_comm = nullptr) {
  const int size = tp_comm != nullptr ? tp_comm->world_size() : 1;
  check_tensor_split(cfg, size, "--tp");
  return TensorSplit(cfg, size, tp_comm != nullptr ? tp_comm->rank() : 0, stage,
                     ep_comm != nullptr ? ep_comm->world_size() : 1, ep_comm != nullptr ? ep_comm->rank() : 0);
}

template <typename Elem>
class TensorParallelGroup {
 public:
  TensorParallelGroup() = default;
  // The group of `comm` (nullptr: one rank) for micro-batches of `rows` token rows, collectives
  // ordered against `stream`.
  TensorParallelGroup(Communicator* comm, bool sequence_parallel, int rows, cudaStream_t stream)
      : comm_(comm != nullptr && comm->world_size() > 1 ? comm : nullptr), rows_(rows), stream_(stream) {
    tp_.size = comm_ != nullptr ? comm_->world_size() : 1;
    tp_.rank = comm_ != nullptr ? comm_->rank() : 0;
    tp_.sequence_parallel = sequence_parallel && tp_.size > 1;
    if (tp_.sequence_parallel && rows % tp_.size != 0)
      throw std::runtime_error("--sequence-parallel: the micro-batch's B*T = " + std::to_string(rows) +
                               " token rows must divide evenly over --tp " + std::to_string(tp_.size) + " ranks");
  }

  const TensorParallelism& shape() const { return tp_; }
  int size() const { return tp_.size; }
  int rank() const { return tp_.rank; }
  bool sequence_parallel() const { return tp_.sequence_parallel; }
  Communicator* comm() const { return comm_; }
  // Rows of the LayerNorm/residual region on this rank.
  int local_rows() const { return tp_.sequence_parallel ? rows_ / tp_.size : rows_; }
  // This rank's rows of a (rows, width) tensor.
  template <typename T> T* local(T* full, size_t width) const {
    return full + (tp_.sequence_parallel ? static_cast<size_t>(tp_.rank) * local_rows() * width : 0);
  }
  // A term the group adds once (a row-parallel bias, wpe): rank 0's, nullptr on the others.
  template <typename T> T* once(T* term) const { return tp_.rank == 0 ? term : nullptr; }
  // Where a replicated tensor's gradient computed from rows every rank holds goes: under sequence
  // parallelism rank 0 alone computes it (the group sums those gradients: grad_sync.h), otherwise
  // every rank computes the same value; nullptr where it is not computed.
  bool computes_replicated() const { return !tp_.sequence_parallel || tp_.rank == 0; }
  template <typename T> T* replicated_grad(T* gradient) const { return computes_replicated() ? gradient : nullptr; }

  // Sequence parallel: every rank's rows of `full` (rows, width) to every rank, in place.
  void gather(Elem* full, size_t width) {
    if (!tp_.sequence_parallel) return;
    const size_t n = static_cast<size_t>(local_rows()) * width;
    comm_->ordered_with(stream_, [&] { comm_->all_gather(full + tp_.rank * n, full, n); });
  }
  // The group's sum of the partial (rows, width) products in `partial`, in place; returns this
  // rank's rows of it (sequence parallel: a reduce-scatter; otherwise an all-reduce).
  Elem* reduce(Elem* partial, size_t width) {
    start_reduce(partial, width);
    return finish_reduce(partial, width);
  }
  // reduce() in two halves: the collective queued after the model stream's work so far, which the
  // model stream's next work (not reading `partial`) overlaps; then the model stream's work after
  // it. Returns this rank's rows of the sum.
  void start_reduce(Elem* partial, size_t width) {
    if (comm_ == nullptr) return;
    const size_t n = static_cast<size_t>(local_rows()) * width;
    comm_->wait_for(stream_);
    if (tp_.sequence_parallel) comm_->reduce_scatter(partial, partial + tp_.rank * n, n, ncclSum);
    else comm_->all_reduce(partial, static_cast<size_t>(rows_) * width, ncclSum);
  }
  Elem* finish_reduce(Elem* partial, size_t width) {
    if (comm_ != nullptr) comm_->order_before(stream_);
    return local(partial, width);
  }
  // n device values become their `op` over the group (the vocabulary-parallel classifier's row
  // statistics; the step's figures).
  template <typename T> void all_reduce(T* data, size_t n, ncclRedOp_t op) {
    if (comm_ != nullptr) comm_->ordered_with(stream_, [&] { comm_->all_reduce(data, n, op); });
  }

 private:
  Communicator* comm_ = nullptr;
  TensorParallelism tp_;
  int rows_ = 0;
  cudaStream_t stream_ = nullptr;
};

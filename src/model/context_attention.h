// context_attention.h — causal attention over a context-parallel group (issue 34): the ring that
// passes K/V chunks (and, backward, their fp32 dK/dV) around the CP ranks, the blockwise kernels
// (kernels/ring_attention.cuh) on each block pair, the merge in a fixed order, and its buffers.
//
// Local layout (zigzag, chunk-major): a CP group of N ranks splits each sequence of T tokens into 2N
// chunks of c = T/(2N); CP rank r holds chunks r and 2N-1-r. Its 2·B·c rows are chunk-major: rows
// [0, B·c) are chunk r of sequences 0..B-1 (B, c), rows [B·c, 2·B·c) chunk 2N-1-r (B, c). lse
// likewise: [chunk r: (B, NH, c)][chunk 2N-1-r: (B, NH, c)]. Each chunk is thus a (B, c, ·) block
// as the kernels take it.
//
// Rounds: in round i = 0..N-1 rank r holds the K/V (2 chunks) of rank (r − i) mod N, and runs its
// two query chunks against them (zigzag_block_mask: full, diagonal or skipped). The K/V for round
// i+1 are passed on (send to r+1, receive from r−1, one exchange) before round i's attention is
// queued, into the other of two buffers, so the transfer overlaps it. Forward: every block's fp32
// result is merged by log-sum-exp into the query chunk's running result in this fixed order (the
// same bits every run), rounded once to Elem at the end. Backward: K/V travel again; dq sums
// locally in fp32; each rank adds its share of the block's dK/dV into a zeroed fp32 buffer while
// the accumulator of the previous ranks is in flight, then adds that accumulator in and passes the
// sum on; the N-th hop brings every block's total back to its owner. Only the K/V heads travel (GQA).
// Ordering with the model's stream: Communicator::wait_for before each transfer (the buffers it
// sends are written, the one it receives into is no longer read) and order_before (what arrived
// is visible) before the stream reads it (src/dist/comm.h). Buffers are allocated once and
// reused by every layer (the model runs layers one after another on one stream).
// docs/ATTENTION.md, "Blockwise attention for context parallelism", has the ring and its bytes.
#pragma once
#include "kernels/ring_attention.cuh"
#include "src/base/device.h"
#include "src/dist/comm.h"
#include "src/model/attention.h"

#include <cstddef>
#include <stdexcept>
#include <string>
#include <type_traits>

template <typename Elem>  // float or bf16
class ContextAttention {
 public:
  // C, NH, NKV: this rank's (under tensor parallelism its heads). The model uses it with N >= 2
  // ranks; N = 1 runs the same blocks with no transfer.
  ContextAttention(Communicator& cp, AttentionKernel kernel, int B, int chunk_len, int C, int NH, int NKV,
                   cudaStream_t stream)
      : cp_(cp), B_(B), c_(chunk_len), C_(C), NH_(NH), NKV_(NKV), stream_(stream) {
    if (B < 1 || chunk_len < 1 || NH < 1 || NKV < 1 || C < NH || C % NH != 0 || NH % NKV != 0)
      throw std::invalid_argument("ContextAttention: need B, chunk length >= 1, C divisible by NH, NH by NKV; got B=" +
                                  std::to_string(B) + " c=" + std::to_string(chunk_len) + " C=" + std::to_string(C) +
                                  " NH=" + std::to_string(NH) + " NKV=" + std::to_string(NKV));
    flash_ = std::is_same<Elem, bf16>::value && kernel == AttentionKernel::flash && flash_attention_supports(C / NH);
    const Sizes s(B, chunk_len, C, NH, NKV);
    for (DeviceArray<Elem>& kv : kv_) kv = DeviceArray<Elem>(s.kv, "ring attention K/V");
    for (DeviceArray<float>& part : dkv_part_) part = DeviceArray<float>(s.kv, "ring attention dK/dV share");
    dkv_in_ = DeviceArray<float>(s.kv, "ring attention dK/dV accumulator");
    rows_fp32_ = DeviceArray<float>(s.rows_fp32, "ring attention fp32 out / dq");
    block_out_ = DeviceArray<float>(s.block_out, "ring attention block out");
    block_lse_ = DeviceArray<float>(s.block_lse, "ring attention block lse");
    scratch_ = DeviceArray<float>(s.scratch, "ring attention backward scratch");
  }
  ContextAttention(const ContextAttention&) = delete;
  ContextAttention& operator=(const ContextAttention&) = delete;

  // out (2·B·c, C) Elem and lse from this rank's qkv (2·B·c, (NH + 2·NKV)·C/NH): causal attention
  // over the whole sequence.
  void forward(Elem* out, float* lse, const Elem* qkv) {
    float* running = running_out(out);
    for (int q = 0; q < 2; ++q)
      ring_attention_merge_reset(running + q * chunk_out(), lse + q * chunk_lse(), B_, c_, C_, NH_, stream_);
    ring_attention_pack_kv<Elem>(kv_[0].get(), qkv, rows(), C_, kv_width(), stream_);
    const int N = cp_.world_size();
    for (int i = 0; i < N; ++i) {
      const Elem* kv = kv_[i % 2].get();
      if (i + 1 < N) pass("ring attention K/V", kv, kv_[(i + 1) % 2].get(), kv_[0].count());
      for_each_block(i, [&](int q, int k, AttentionBlockMask mask) {
        block_forward(q_chunk(qkv, q), kv + k * chunk_kv(), mask);
        ring_attention_merge<float>(running + q * chunk_out(), lse + q * chunk_lse(), block_out_.get(),
                                    block_lse_.get(), B_, c_, C_, NH_, stream_);
      });
      if (i + 1 < N) cp_.order_before(stream_);  // round i+1's K/V have arrived
    }
    if constexpr (!std::is_same<Elem, float>::value)
      ring_attention_round<Elem>(out, running, rows() * C_, stream_);
  }

  // dqkv (written, same layout as qkv) from dout, given the forward's qkv, out, lse.
  void backward(Elem* dqkv, const Elem* dout, const Elem* qkv, const Elem* out, const float* lse) {
    float* dq = rows_fp32_.get();
    cuda_check(cudaMemsetAsync(dq, 0, rows() * C_ * sizeof(float), stream_), "zeroing the ring's dq");
    ring_attention_pack_kv<Elem>(kv_[0].get(), qkv, rows(), C_, kv_width(), stream_);
    const int N = cp_.world_size();
    const size_t kv_n = kv_[0].count();
    for (int i = 0; i < N; ++i) {
      const Elem* kv = kv_[i % 2].get();
      if (i + 1 < N) pass("ring attention K/V", kv, kv_[(i + 1) % 2].get(), kv_n);
      float* part = dkv_part_[i % 2].get();  // this rank's share of the held block's dK/dV
      cuda_check(cudaMemsetAsync(part, 0, kv_n * sizeof(float), stream_), "zeroing the ring's dK/dV share");
      for_each_block(i, [&](int q, int k, AttentionBlockMask mask) {
        block_backward(dq + q * chunk_out(), part + k * chunk_kv(), dout + q * chunk_out(), q_chunk(qkv, q),
                       out + q * chunk_out(), lse + q * chunk_lse(), kv + k * chunk_kv(), mask);
      });
      if (N == 1) break;
      cp_.order_before(stream_);  // round i+1's K/V and the accumulator passed in round i-1 have arrived
      if (i > 0) ring_attention_add(part, dkv_in_.get(), kv_n, stream_);
      pass("ring attention dK/dV", static_cast<const float*>(part), dkv_in_.get(), kv_n);
    }
    if (N > 1) cp_.order_before(stream_);  // the last hop: this rank's own blocks' totals
    ring_attention_assemble_dqkv<Elem>(dqkv, dq, N > 1 ? dkv_in_.get() : dkv_part_[0].get(), rows(), C_, kv_width(),
                                       stream_);
  }

  // Device bytes it allocates (for --plan).
  static size_t workspace_bytes(int B, int chunk_len, int C, int NH, int NKV, size_t elem_size) {
    const Sizes s(B, chunk_len, C, NH, NKV);
    return 2 * s.kv * elem_size + (3 * s.kv + s.rows_fp32 + s.block_out + s.block_lse + s.scratch) * sizeof(float);
  }
  // Bytes each rank sends per forward (N − 1 K/V passes) and per backward (N − 1 K/V passes and N
  // fp32 dK/dV passes, the last one home) over a CP group of N ranks.
  static size_t forward_send_bytes(int N, int B, int chunk_len, int C, int NH, int NKV, size_t elem_size) {
    return static_cast<size_t>(N - 1) * Sizes(B, chunk_len, C, NH, NKV).kv * elem_size;
  }
  static size_t backward_send_bytes(int N, int B, int chunk_len, int C, int NH, int NKV, size_t elem_size) {
    const size_t dkv_passes = N > 1 ? static_cast<size_t>(N) : 0;
    return forward_send_bytes(N, B, chunk_len, C, NH, NKV, elem_size) +
           dkv_passes * Sizes(B, chunk_len, C, NH, NKV).kv * sizeof(float);
  }

 private:
  // Element counts of the buffers (one place for the constructor and workspace_bytes).
  struct Sizes {
    size_t kv, rows_fp32, block_out, block_lse, scratch;
    Sizes(int B, int c, int C, int NH, int NKV) {
      const size_t chunk_rows = static_cast<size_t>(B) * c;
      kv = 2 * chunk_rows * 2 * NKV * (C / NH);  // both chunks' K/V heads (or their fp32 gradients)
      rows_fp32 = 2 * chunk_rows * C;            // the forward's running out (bf16), the backward's dq
      block_out = chunk_rows * C;
      block_lse = chunk_rows * NH;
      scratch = ring_attention_backward_scratch_bytes(B, c, NH) / sizeof(float);
    }
  };

  size_t rows() const { return 2 * static_cast<size_t>(B_) * c_; }
  int kv_width() const { return 2 * NKV_ * (C_ / NH_); }
  size_t chunk_out() const { return static_cast<size_t>(B_) * c_ * C_; }
  size_t chunk_lse() const { return static_cast<size_t>(B_) * NH_ * c_; }
  size_t chunk_kv() const { return static_cast<size_t>(B_) * c_ * kv_width(); }
  const Elem* q_chunk(const Elem* qkv, int q) const { return qkv + q * static_cast<size_t>(B_) * c_ * (C_ + kv_width()); }
  // fp32 out is its own running result; bf16 needs an fp32 one.
  float* running_out(Elem* out) {
    if constexpr (std::is_same<Elem, float>::value) return out;
    else return rows_fp32_.get();
  }

  // f(query chunk 0|1, key chunk 0|1, mask) for the block pairs of round i, in a fixed order.
  template <typename F> void for_each_block(int round, F&& f) const {
    const int N = cp_.world_size(), r = cp_.rank(), src = (r - round + N) % N;
    const int mine[2] = {r, 2 * N - 1 - r}, theirs[2] = {src, 2 * N - 1 - src};
    for (int q = 0; q < 2; ++q)
      for (int k = 0; k < 2; ++k) {
        AttentionBlockMask mask;
        if (zigzag_block_mask(mine[q], theirs[k], &mask)) f(q, k, mask);
      }
  }

  // n elements of `send` to the next rank, and the previous rank's into `recv`, once the stream's
  // work so far (which wrote `send` and last read `recv`) is done.
  template <typename T> void pass(const char* what, const T* send, T* recv, size_t n) {
    const int N = cp_.world_size(), r = cp_.rank();
    cp_.set_purpose(what, cp_.purpose_when());
    cp_.wait_for(stream_);
    cp_.exchange<T>({{send, nullptr, n, (r + 1) % N}, {nullptr, recv, n, (r + N - 1) % N}});
  }

  void block_forward(const Elem* qkv, const Elem* kv, AttentionBlockMask mask) {
    if constexpr (std::is_same<Elem, bf16>::value) {
      if (flash_)
        return ring_flash_attention_forward(block_out_.get(), block_lse_.get(), qkv, kv, B_, c_, c_, C_, NH_, NKV_,
                                            mask, stream_);
    }
    ring_attention_forward<Elem, float>(block_out_.get(), block_lse_.get(), qkv, kv, B_, c_, c_, C_, NH_, NKV_, mask,
                                        stream_);
  }

  void block_backward(float* dq, float* dkv, const Elem* dout, const Elem* qkv, const Elem* out, const float* lse,
                      const Elem* kv, AttentionBlockMask mask) {
    if constexpr (std::is_same<Elem, bf16>::value) {
      if (flash_)
        return ring_flash_attention_backward(dq, dkv, scratch_.get(), dout, qkv, out, lse, kv, B_, c_, c_, C_, NH_,
                                             NKV_, mask, stream_);
    }
    ring_attention_backward<Elem>(dq, dkv, scratch_.get(), dout, qkv, out, lse, kv, B_, c_, c_, C_, NH_, NKV_, mask,
                                  stream_);
  }

  Communicator& cp_;
  int B_, c_, C_, NH_, NKV_;
  cudaStream_t stream_;
  bool flash_ = false;
  DeviceArray<Elem> kv_[2];          // the K/V held this round and the ones arriving for the next
  DeviceArray<float> dkv_part_[2];   // this rank's share of a block's dK/dV (one in flight while the next fills)
  DeviceArray<float> dkv_in_;        // the accumulator arriving from the previous rank (finally: this rank's totals)
  DeviceArray<float> rows_fp32_;     // (2·B·c, C): the forward's running out (bf16 only), the backward's dq
  DeviceArray<float> block_out_, block_lse_;  // one block pair's forward result
  DeviceArray<float> scratch_;       // the blockwise backward's D per query row
};

// context_split.h — which tokens of each sequence a context-parallel rank holds (the zigzag
// layout) and where they sit in its rows: the selection of its tokens from a [B][T] micro-batch,
// the positions of its rows (RoPE angles, GPT-2's wpe rows), and the way back from the group's
// rows to [B][T] order (per-position losses).
//
// A CP group of N ranks cuts each sequence of T tokens into 2N chunks of c = T/(2N); rank r holds
// chunks r and 2N-1-r, so under a causal mask every rank has the same attention work (an early
// chunk, which sees few keys, with a late one, which sees many). Its B·T/N rows are chunk-major:
// rows [0, B·c) are chunk r of sequences 0..B-1 ((B, c): the model's (B, T) layout with T = c),
// rows [B·c, 2·B·c) chunk 2N-1-r. So each of the two pieces is an ordinary (B, c) block whose
// row t sits at position first + t; the blockwise attention takes a piece as one query or key block
// (kernels/ring_attention.cuh). Without CP (N = 1) there is one piece, the whole (B, T) block at
// position 0, and the selection is the identity.
#pragma once
#include <cstddef>
#include <stdexcept>
#include <string>
#include <vector>

struct ContextSplit {
  // One (B, len) block of a rank's rows: from local row `row` (a multiple of len), positions
  // first..first+len-1 of every sequence.
  struct Piece {
    int row = 0;
    int first = 0;
    int len = 0;
  };

  int ranks = 1;  // N, the CP group's size
  int rank = 0;   // r

  // Checked: the sequence length is cut into 2N equal chunks.
  ContextSplit(int ranks_, int rank_, int seq_len) : ranks(ranks_), rank(rank_), seq_len_(seq_len) {
    if (ranks < 1 || rank < 0 || rank >= ranks || seq_len < 1 || (ranks > 1 && seq_len % (2 * ranks) != 0))
      throw std::runtime_error("context parallelism: sequence length " + std::to_string(seq_len) + " over " +
                               std::to_string(ranks) + " ranks (rank " + std::to_string(rank) +
                               "): 2 x the ranks must divide it");
  }
  ContextSplit() = default;

  int seq_len() const { return seq_len_; }                 // T, the whole sequence's
  int local_len() const { return seq_len_ / ranks; }       // T/N tokens of each sequence on this rank
  int chunk_len() const { return ranks == 1 ? seq_len_ : seq_len_ / (2 * ranks); }  // c

  // The rank's pieces in row order, for a micro-batch of B sequences.
  std::vector<Piece> pieces(int B) const {
    if (ranks == 1) return {Piece{0, 0, seq_len_}};
    const int c = chunk_len();
    return {Piece{0, rank * c, c}, Piece{B * c, (2 * ranks - 1 - rank) * c, c}};
  }

  // local (B·T/N) := this rank's tokens of `whole` ([B][T]) in its row order.
  void select(int* local, const int* whole, int B) const {
    size_t at = 0;
    for (const Piece& p : pieces(B))
      for (int b = 0; b < B; ++b)
        for (int t = 0; t < p.len; ++t) local[at++] = whole[static_cast<size_t>(b) * seq_len_ + p.first + t];
  }

  // whole ([B][T]) := the group's rows, `gathered` being rank 0's B·T/N values, then rank 1's, ...
  // (an all-gather over the CP group).
  template <typename T>
  void place(T* whole, const T* gathered, int B) const {
    for (int r = 0; r < ranks; ++r) {
      const ContextSplit of_r(ranks, r, seq_len_);
      const T* src = gathered + static_cast<size_t>(r) * B * local_len();
      for (const Piece& p : of_r.pieces(B))
        for (int b = 0; b < B; ++b)
          for (int t = 0; t < p.len; ++t) whole[static_cast<size_t>(b) * seq_len_ + p.first + t] = *src++;
    }
  }

 private:
  int seq_len_ = 1;
};

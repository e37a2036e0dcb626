// rope.cuh — rotary position embeddings (Llama's RoPE) on adjacent pairs, forward and backward,
// and the host-side table of their angles.
//
// Meta's layout: within each head of HS channels, pair i is channels (2i, 2i + 1), read as the
// complex number x[2i] + i·x[2i+1] and multiplied by e^{i·p·f_i} at position p:
//   y[2i] = x[2i]·cos − x[2i+1]·sin,  y[2i+1] = x[2i]·sin + x[2i+1]·cos
// (Hugging Face's checkpoints permute q and k into the rotate-half layout instead; the loader
// undoes that, the kernels never see it). f_i = θ^(−2i/HS), scaled by Llama 3.1's rule when the
// configuration says so (RopeConfig). The backward rotates by −p·f_i (the transpose).
//
// Tensors: rows of (B, T) positions, row_stride elements apart; each row's first `heads` heads of
// HS contiguous channels are rotated, the rest of the row is left alone. In the fused QKV layout
// (B, T, (NH + 2·NKV)·HS) one launch rotates q and k (heads = NH + NKV) and leaves v. Math is fp32,
// one rounding to T; 128-bit accesses, so HS and row_stride must be multiples of 16 / sizeof(T).
#pragma once
#include "common.cuh"
#include "rope_config.h"

#include <cmath>
#include <vector>

// The HS/2 frequencies f_i, in fp32 step by step as Meta's reference computes them (so the table
// matches it to the last bit where fp32 allows): f_i = 1/θ^(2i/HS); with scaling, wavelength
// λ = 2π/f: λ < original_context/high keeps f, λ > original_context/low gives f/factor, and in
// between s = (original_context/λ − low)/(high − low) gives (1 − s)·f/factor + s·f.
inline std::vector<float> rope_frequencies(const RopeConfig& rope, int head_size) {
  if (head_size < 2 || head_size % 2 != 0) throw_errorf("rope_frequencies: head size %d must be even", head_size);
  if (rope.scaled && !(rope.high_freq_factor > rope.low_freq_factor)) {
    throw_errorf("rope_frequencies: high_freq_factor %g must exceed low_freq_factor %g", rope.high_freq_factor,
                 rope.low_freq_factor);
  }
  const float two_pi = static_cast<float>(2.0 * 3.14159265358979323846);
  const float context = static_cast<float>(rope.original_context);
  std::vector<float> freqs(head_size / 2);
  for (int i = 0; i < head_size / 2; ++i) {
    float f = 1.0f / std::pow(rope.theta, static_cast<float>(2 * i) / static_cast<float>(head_size));
    if (rope.scaled) {
      const float wavelength = two_pi / f;
      if (wavelength > context / rope.low_freq_factor) {
        f = f / rope.factor;
      } else if (wavelength >= context / rope.high_freq_factor) {
        const float smooth =
            (context / wavelength - rope.low_freq_factor) / (rope.high_freq_factor - rope.low_freq_factor);
        f = (1.0f - smooth) * f / rope.factor + smooth * f;
      }
    }
    freqs[i] = f;
  }
  return freqs;
}

// The (cos, sin) table the kernels read: positions × HS floats, pair i of position p at
// [p·HS + 2i] = cos(a), [p·HS + 2i + 1] = sin(a), a = p·f_i. The angle is the fp32 product (as
// Meta's and Hugging Face's references form it); its cosine and sine are taken in double and
// rounded once. Built once per model on the host and uploaded.
inline std::vector<float> rope_table(const RopeConfig& rope, int head_size, int positions) {
  if (positions < 1) throw_errorf("rope_table: positions %d must be positive", positions);
  const std::vector<float> freqs = rope_frequencies(rope, head_size);
  std::vector<float> table(static_cast<size_t>(positions) * head_size);
  for (int p = 0; p < positions; ++p)
    for (int i = 0; i < head_size / 2; ++i) {
      const double angle = static_cast<float>(p) * freqs[i];
      table[static_cast<size_t>(p) * head_size + 2 * i] = static_cast<float>(std::cos(angle));
      table[static_cast<size_t>(p) * head_size + 2 * i + 1] = static_cast<float>(std::sin(angle));
    }
  return table;
}

constexpr int kRopeBlock = 256;

// One thread per 128-bit chunk of a rotated head: chunk → (row, head, chunk within the head).
// direction +1 rotates by +p·f (forward), −1 by −p·f (backward). Offsets are chunk counts times
// the chunk's width, so nvcc sees the 16-byte alignment. Each thread reads its chunk before
// writing it, so out may alias inp.
template <typename T>
__global__ void rope_kernel(T* out, const T* inp, const float* table, size_t chunks, int seq_len, int heads,
                            int head_size, int row_stride, int first_position, float direction) {
  constexpr int kVec = Vec128<T>::size;
  constexpr int kTableVec = Vec128<float>::size;
  const size_t chunk = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (chunk >= chunks) return;
  const int head_chunks = head_size / kVec;
  const size_t row_chunks = static_cast<size_t>(heads) * head_chunks;
  const size_t row = chunk / row_chunks;
  const int in_row = static_cast<int>(chunk % row_chunks);  // head·head_chunks + chunk within the head
  const int position = first_position + static_cast<int>(row % seq_len);
  const size_t offset = (row * static_cast<size_t>(row_stride / kVec) + in_row) * kVec;
  const size_t angles = (static_cast<size_t>(position) * head_chunks + in_row % head_chunks) * kVec;
  const Vec128<T> x = load128(inp + offset);
  Vec128<T> y;
  for (int t = 0; t < kVec / kTableVec; ++t) {
    const Vec128<float> cs = load128(table + angles + t * kTableVec);  // (cos, sin) of two pairs
    for (int q = 0; q < kTableVec / 2; ++q) {
      const int k = t * kTableVec + 2 * q;
      const float c = cs[2 * q], s = direction * cs[2 * q + 1];
      const float x0 = to_float(x[k]), x1 = to_float(x[k + 1]);
      y[k] = from_float<T>(x0 * c - x1 * s);
      y[k + 1] = from_float<T>(x0 * s + x1 * c);
    }
  }
  store128(out + offset, y);
}

template <typename T>
void rope_check_shape(const char* op, int B, int seq_len, int heads, int head_size, int row_stride,
                      int first_position, int table_positions) {
  constexpr int kVec = Vec128<T>::size;
  if (B < 1 || seq_len < 1 || heads < 1 || head_size < kVec || head_size % kVec != 0 || row_stride % kVec != 0 ||
      static_cast<long long>(heads) * head_size > row_stride) {
    throw_errorf("%s: need B, T, heads >= 1, HS a positive multiple of %d (128-bit accesses) and row_stride a "
                 "multiple of %d holding heads·HS; got B=%d T=%d heads=%d HS=%d row_stride=%d",
                 op, kVec, kVec, B, seq_len, heads, head_size, row_stride);
  }
  if (first_position < 0 || static_cast<long long>(first_position) + seq_len > table_positions) {
    throw_errorf("%s: positions [%d, %lld) outside the table's %d positions", op, first_position,
                 static_cast<long long>(first_position) + seq_len, table_positions);
  }
}

template <typename T>
void rope_launch(const char* op, T* out, const T* inp, const float* table, int table_positions, int B, int seq_len,
                 int heads, int head_size, int row_stride, int first_position, float direction,
                 cudaStream_t stream) {
  rope_check_shape<T>(op, B, seq_len, heads, head_size, row_stride, first_position, table_positions);
  const size_t chunks = static_cast<size_t>(B) * seq_len * heads * (head_size / Vec128<T>::size);
  launch(rope_kernel<T>, dim3(static_cast<unsigned>(ceil_div(chunks, static_cast<size_t>(kRopeBlock)))),
         dim3(kRopeBlock), 0, stream, out, inp, table, chunks, seq_len, heads, head_size, row_stride, first_position,
         direction);
  CUDA_CHECK(cudaGetLastError());
}

// out = RoPE(inp) on the first `heads` heads of each (B, T) row; the row at time t has position
// first_position + t (0 in training; the cache length when decoding). table: rope_table's
// table_positions × HS floats on the device. out may be inp (in place); other channels of out's
// rows are not written.
template <typename T>
void rope_forward(T* out, const T* inp, const float* table, int table_positions, int B, int seq_len, int heads,
                  int head_size, int row_stride, int first_position, cudaStream_t stream) {
  rope_launch("rope_forward", out, inp, table, table_positions, B, seq_len, heads, head_size, row_stride,
              first_position, 1.0f, stream);
}

// dinp = the gradient through rope_forward given dout (the inverse rotation; written, not
// accumulated). dinp may be dout (in place over the fused dqkv gradient).
template <typename T>
void rope_backward(T* dinp, const T* dout, const float* table, int table_positions, int B, int seq_len, int heads,
                   int head_size, int row_stride, int first_position, cudaStream_t stream) {
  rope_launch("rope_backward", dinp, dout, table, table_positions, B, seq_len, heads, head_size, row_stride,
              first_position, -1.0f, stream);
}

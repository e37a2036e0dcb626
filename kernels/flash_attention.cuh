// flash_attention.cuh — causal multi-head self-attention on tensor cores (FlashAttention-2
// style): forward, backward and their launchers; bf16 in and out, fp32 accumulation and
// softmax statistics.
//
// Same tensors and meaning as attention.cuh, so the two are interchangeable: q, k, v are read
// straight from qkv (B, T, (NH + 2·NKV)·HD): NH query heads, then NKV key heads, then NKV value
// heads, HD channels each (NKV = NH: multi-head attention, qkv (B, T, 3C); NKV < NH: grouped-query
// attention, query head h reading K/V head h / (NH / NKV)). C = NH·HD; out is (B, T, C), lse
// (B, NH, T) is the natural-log log-sum-exp of each row's scaled scores, and dqkv is written in
// qkv's layout. Head dims 16, 32, 64 and 128 (a template parameter), any B, NH, NKV dividing NH
// and T >= 1; tensors 16-byte aligned.
//
// Tiling (docs/ATTENTION.md has the numbers): every kernel runs 4 warps; a block owns 128 query
// rows (forward: 32 per warp) or 64 rows (backward: 16 per warp) of one (b, h) and streams tiles
// of the other operand, 64 rows (32 at HD 128), through double-buffered shared memory
// (cp.async). Blocks of one (b, h) are adjacent in launch order (L2 reuse of the streamed operand). Products run on mma.m16n8k16 (bf16 in,
// fp32 accumulate) with fragments loaded by ldmatrix; a product's result feeds the next one as
// an A fragment straight from registers.
//   forward        128 query rows per block; streams K and V; online softmax in registers.
//   key/value      64 keys of one K/V head per block, dK and dV in fp32 registers; streams Q and
//                  dO from the diagonal to the end, recomputing P from Q, K and lse, for each
//                  query head of the group in turn (h ascending): the group's sum in a fixed order.
//   query          64 query rows per block, dQ in fp32 registers; streams K and V up to the diagonal.
// Both backward kernels read D = rowsum(dO ∘ O) from a small kernel that runs first. Every
// output element is produced by exactly one thread in a fixed order: no atomics, so the
// results are bitwise reproducible.
//
// Shared memory rows are padded by 8 bf16 (16 bytes): consecutive rows then start 4 banks
// apart, so the 8 rows an ldmatrix phase reads and the 16-byte chunks a cp.async quarter-warp
// writes fall into distinct banks. Rows at or beyond T are zero-filled, never read, and never
// written back; keys at or beyond T are always causally masked for rows < T.
#pragma once
#include <initializer_list>

#include "common.cuh"

// Which keys a kernel sees: qkv's own under the causal mask (the model's attention), or a separate
// K/V block of ring attention (ring_attention.cuh) under its causal diagonal or in full. A template
// parameter, so that the causal kernels compile as they did without the blockwise code.
enum class FlashKeys { causal, block_diagonal, block_full };

template <int HD>
struct FlashTiles {
  static_assert(HD == 16 || HD == 32 || HD == 64 || HD == 128, "flash attention head dims: 16, 32, 64, 128");
  static constexpr int kWarps = 4;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kRows = 16 * kWarps;  // rows a backward block owns: keys (dK, dV) or queries (dQ)
  // The forward's warps own 16-row m-tiles kForwardMTiles each (FlashAttention-2's 4 warps x 32
  // rows): every K and V fragment read from shared memory feeds that many products, halving
  // shared-memory traffic per FLOP against one m-tile, for ~70 more registers (docs/ATTENTION.md).
  static constexpr int kForwardMTiles = 2;
  static constexpr int kForwardRows = 16 * kForwardMTiles * kWarps;  // query rows a forward block owns
  // The blockwise forward (ring_attention.cuh: K and V from a separate block) spills 4-24 bytes
  // with two m-tiles at HD 128 (CUDA 13.0, 255 registers): it keeps one there (64-row blocks,
  // ~130 registers, docs/ATTENTION.md's remedy for the causal kernel too).
  __host__ __device__ static constexpr int forward_m_tiles(FlashKeys keys) {
    return keys != FlashKeys::causal && HD == 128 ? 1 : kForwardMTiles;
  }
  __host__ __device__ static constexpr int forward_rows(FlashKeys keys) { return 16 * forward_m_tiles(keys) * kWarps; }
  // Blocks per SM the query kernel is built for (__launch_bounds__: ptxas keeps it at or below
  // 65536 / (128 · 3) = 168 registers; its shared memory allows 3 on sm_90). The key/value kernel
  // has no such bound: at HD 64 ptxas allocates 167-168 registers on its own (3 blocks on sm_90),
  // while the bound makes it spill 4-20 bytes (CUDA 13.0); test/checks/flash_attention_gpu.sh
  // holds it to 168. At HD 128 its 128 fp32 accumulators per thread (dK, dV) besides Pᵀ, dSᵀ
  // and their bf16 fragments need ~250 registers: 2 blocks (docs/ATTENTION.md).
  static constexpr int kQueryMinBlocks = 3;
  // Rows per streamed tile. 32 at HD 128 keeps the forward's registers for its 2 x 64 fp32
  // accumulators and the key/value kernel's for its 128.
  static constexpr int kStream = HD == 128 ? 32 : 64;
  static constexpr int kStride = HD + 8;     // shared-memory row pitch in bf16 (padding: see the top)
  static constexpr int kChunks = HD / 8;     // 16-byte chunks per row

  static constexpr size_t tile_bytes(int rows) { return static_cast<size_t>(rows) * kStride * sizeof(bf16); }
  // Q + two K and two V buffers.
  static constexpr size_t forward_smem(FlashKeys keys = FlashKeys::causal) {
    return tile_bytes(forward_rows(keys)) + 4 * tile_bytes(kStream);
  }
  // K, V + two Q and two dO buffers + two buffers of the streamed rows' lse and D.
  static constexpr size_t key_value_smem() {
    return 2 * tile_bytes(kRows) + 4 * tile_bytes(kStream) + 4 * kStream * sizeof(float);
  }
  // Q, dO + two K and two V buffers.
  static constexpr size_t query_smem() { return 2 * tile_bytes(kRows) + 4 * tile_bytes(kStream); }
};

constexpr float kFlashLog2e = 1.4426950408889634f;
constexpr float kFlashLn2 = 0.6931471805599453f;

__device__ __forceinline__ uint32_t flash_pack_bf16x2(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  uint32_t bits;
  memcpy(&bits, &v, sizeof bits);
  return bits;
}

// Rows [row0, row0 + ROWS) of one head into a padded shared tile, by cp.async (the caller
// commits and waits); src is row 0 of the head's HD channels, rows row_stride elements apart.
// Rows at or beyond seq_len are zero-filled instead of read.
template <int HD, int ROWS>
__device__ __forceinline__ void flash_load_tile(bf16* tile, const bf16* src, size_t row_stride, int row0,
                                                int seq_len) {
  using Tiles = FlashTiles<HD>;
  for (int c = threadIdx.x; c < ROWS * Tiles::kChunks; c += Tiles::kThreads) {
    const int r = c / Tiles::kChunks, col = (c % Tiles::kChunks) * 8;
    bf16* dst = tile + r * Tiles::kStride + col;
    if (row0 + r < seq_len) {
      cp_async_16(dst, src + static_cast<size_t>(row0 + r) * row_stride + col);
    } else {
      store_int4(dst, int4{0, 0, 0, 0});
    }
  }
}

// ldmatrix.x4 fragments; lane l gives row l % 8 of matrix l / 8. Fragment layouts per the PTX
// ISA ("Matrix Fragments for mma.m16n8k16"): g = lane / 4 indexes rows of A and columns of B.
//
// A (16 x 16, row-major) = tile rows row0.., columns k0..: matrices (rows +0, +8) x (columns +0, +8).
template <int HD>
__device__ __forceinline__ void flash_load_a(uint32_t a[4], const bf16* tile, int row0, int k0) {
  const int lane = threadIdx.x % 32, m = lane / 8;
  ldmatrix_x4(a, tile + (row0 + lane % 8 + 8 * (m % 2)) * FlashTiles<HD>::kStride + k0 + 8 * (m / 2));
}
// B = tileᵀ for two n-tiles: tile rows n0.. are B's columns, tile columns k0.. its rows.
// b[0..1] is n-tile n0, b[2..3] n-tile n0 + 8.
template <int HD>
__device__ __forceinline__ void flash_load_b_transposed(uint32_t b[4], const bf16* tile, int n0, int k0) {
  const int lane = threadIdx.x % 32, m = lane / 8;
  ldmatrix_x4(b, tile + (n0 + lane % 8 + 8 * (m / 2)) * FlashTiles<HD>::kStride + k0 + 8 * (m % 2));
}
// B = tile for two n-tiles: tile rows k0.. are B's rows, tile columns n0.. its columns, so the
// col-major fragment needs the transposing load. b[0..1] is n-tile n0, b[2..3] n-tile n0 + 8.
template <int HD>
__device__ __forceinline__ void flash_load_b(uint32_t b[4], const bf16* tile, int k0, int n0) {
  const int lane = threadIdx.x % 32, m = lane / 8;
  ldmatrix_x4_trans(b, tile + (k0 + lane % 8 + 8 * (m % 2)) * FlashTiles<HD>::kStride + n0 + 8 * (m / 2));
}

// acc[m] (16 x N) += A_m · Bᵀ for m < MT, A_m = 16 rows of a_tile from row0 + 16 m and B = the
// first N rows of b_tile, both HD wide: a score-like product (S = Q Kᵀ, dP = dO Vᵀ, ...). Each B
// fragment is loaded once for the MT products.
template <int HD, int N, int MT>
__device__ __forceinline__ void flash_mma_rows_by_rows(float (&acc)[MT][N / 8][4], const bf16* a_tile, int row0,
                                                       const bf16* b_tile) {
  for (int k0 = 0; k0 < HD; k0 += 16) {
    uint32_t a[MT][4];
    UNROLL
    for (int m = 0; m < MT; ++m) flash_load_a<HD>(a[m], a_tile, row0 + 16 * m, k0);
    for (int n = 0; n < N / 16; ++n) {
      uint32_t b[4];
      flash_load_b_transposed<HD>(b, b_tile, 16 * n, k0);
      UNROLL
      for (int m = 0; m < MT; ++m) {
        mma_m16n8k16_bf16(acc[m][2 * n], a[m], b, acc[m][2 * n]);
        mma_m16n8k16_bf16(acc[m][2 * n + 1], a[m], b + 2, acc[m][2 * n + 1]);
      }
    }
  }
}
// One m-tile: acc (16 x N).
template <int HD, int N>
__device__ __forceinline__ void flash_mma_rows_by_rows(float (&acc)[N / 8][4], const bf16* a_tile, int row0,
                                                       const bf16* b_tile) {
  flash_mma_rows_by_rows<HD, N, 1>(reinterpret_cast<float(&)[1][N / 8][4]>(acc), a_tile, row0, b_tile);
}

// acc[m] (16 x HD) += A_m · B for m < MT with A_m (16 x N) in registers (from flash_to_a) and
// B = the first N rows of b_tile: a value-like product (O += P V, dV += Pᵀ dO, ...). Each B
// fragment is loaded once for the MT products.
template <int HD, int N, int MT>
__device__ __forceinline__ void flash_mma_regs_by_rows(float (&acc)[MT][HD / 8][4], const uint32_t (&a)[MT][N / 16][4],
                                                       const bf16* b_tile) {
  for (int kk = 0; kk < N / 16; ++kk) {
    for (int n = 0; n < HD / 16; ++n) {
      uint32_t b[4];
      flash_load_b<HD>(b, b_tile, 16 * kk, 16 * n);
      UNROLL
      for (int m = 0; m < MT; ++m) {
        mma_m16n8k16_bf16(acc[m][2 * n], a[m][kk], b, acc[m][2 * n]);
        mma_m16n8k16_bf16(acc[m][2 * n + 1], a[m][kk], b + 2, acc[m][2 * n + 1]);
      }
    }
  }
}
// One m-tile: acc (16 x HD).
template <int HD, int N>
__device__ __forceinline__ void flash_mma_regs_by_rows(float (&acc)[HD / 8][4], const uint32_t (&a)[N / 16][4],
                                                       const bf16* b_tile) {
  flash_mma_regs_by_rows<HD, N, 1>(reinterpret_cast<float(&)[1][HD / 8][4]>(acc),
                                   reinterpret_cast<const uint32_t(&)[1][N / 16][4]>(a), b_tile);
}

// An fp32 accumulator (16 x N, C layout) as bf16 A fragments: the C layout of n-tiles 2kk and
// 2kk+1 holds exactly the elements the A layout of k-chunk kk wants in this lane.
template <int N>
__device__ __forceinline__ void flash_to_a(uint32_t a[N / 16][4], const float c[N / 8][4]) {
  for (int kk = 0; kk < N / 16; ++kk) {
    a[kk][0] = flash_pack_bf16x2(c[2 * kk][0], c[2 * kk][1]);
    a[kk][1] = flash_pack_bf16x2(c[2 * kk][2], c[2 * kk][3]);
    a[kk][2] = flash_pack_bf16x2(c[2 * kk + 1][0], c[2 * kk + 1][1]);
    a[kk][3] = flash_pack_bf16x2(c[2 * kk + 1][2], c[2 * kk + 1][3]);
  }
}

// Writes a warp's 16 x HD accumulator as bf16 rows row0..row0+15 of dst (rows row_stride
// apart), skipping rows at or beyond seq_len. The fragments go through the warp's own 16 rows
// of shared memory (stage) first, so global memory sees whole 16-byte chunks.
template <int HD>
__device__ __forceinline__ void flash_store_rows(bf16* dst, size_t row_stride, int row0, int seq_len, bf16* stage,
                                                 const float acc[HD / 8][4]) {
  using Tiles = FlashTiles<HD>;
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  for (int n = 0; n < HD / 8; ++n) {
    *reinterpret_cast<__nv_bfloat162*>(stage + g * Tiles::kStride + 8 * n + 2 * t) =
        __floats2bfloat162_rn(acc[n][0], acc[n][1]);
    *reinterpret_cast<__nv_bfloat162*>(stage + (g + 8) * Tiles::kStride + 8 * n + 2 * t) =
        __floats2bfloat162_rn(acc[n][2], acc[n][3]);
  }
  __syncwarp();
  for (int c = lane; c < 16 * Tiles::kChunks; c += 32) {
    const int r = c / Tiles::kChunks, col = (c % Tiles::kChunks) * 8;
    if (row0 + r < seq_len) {
      store128(dst + static_cast<size_t>(row0 + r) * row_stride + col, load128(stage + r * Tiles::kStride + col));
    }
  }
}

// A warp's 16 x HD accumulator as fp32 straight from the fragments (8-byte stores): this lane's
// rows `row` and row + 8, skipping rows at or beyond seq_len. With ACCUMULATE, added (+=) to what
// dst holds instead (every element has this one writer).
template <int HD, bool ACCUMULATE = false>
__device__ __forceinline__ void flash_store_rows_fp32(float* dst, size_t row_stride, int row, int seq_len,
                                                      const float acc[HD / 8][4]) {
  const int t = threadIdx.x % 4;
  for (int r = 0; r < 2; ++r) {
    if (row + 8 * r >= seq_len) continue;
    float* dst_row = dst + static_cast<size_t>(row + 8 * r) * row_stride + 2 * t;
    for (int n = 0; n < HD / 8; ++n) {
      float2 v = make_float2(acc[n][2 * r], acc[n][2 * r + 1]);
      if (ACCUMULATE) {
        const float2 was = *reinterpret_cast<const float2*>(dst_row + 8 * n);
        v.x += was.x;
        v.y += was.y;
      }
      *reinterpret_cast<float2*>(dst_row + 8 * n) = v;
    }
  }
}

// What every tile kernel derives from its block index. Blocks of one (b, h) are adjacent in
// launch order, so a head's streamed operand (K and V, or Q and dO) stays in L2 across its
// tiles; within a head, LAST_FIRST launches the last tile of rows first (the longest causal
// prefixes: forward and query kernels), otherwise the first (the keys with the most queries).
// Force-inlined and returned by value, with the head's pointers computed where they are used
// (qkv_head, io_head) by the same expressions each kernel had before the fold (a version that
// stored the 64-bit head offsets in the struct made the forward spill on sm_80). ptxas then
// allocates within a few registers of the unfolded code and no kernel at head dim 64 or 128
// loses blocks per SM (counts per kernel and architecture in the commit that folded it).
template <int HD>
struct FlashBlock {
  int row0;              // first of the block's rows (queries or keys)
  int bh, b, h;          // bh = b * NH + h: the head's row of lse and D (key/value blocks: the group's first)
  int kv_h;              // h's K/V head, h / (NH / NKV) (key/value blocks: the block's head)
  int seq_len, C, kv_C;  // T, NH * HD and NKV * HD
  size_t row_stride;     // C + 2 kv_C: qkv's row pitch
  int warp, g, t;        // warp; the lane's fragment row (lane / 4) and column pair (lane % 4)
  int row;               // the lane's first row, row0 + ROWS / 4 · warp + g (the other is row + 8)

  // Row 0 of the query head's channels in a (B, T, C + 2 kv_C) tensor (qkv, dqkv).
  template <typename E>
  __device__ __forceinline__ E* qkv_head(E* base) const {
    return base + static_cast<size_t>(b) * seq_len * row_stride + h * HD;
  }
  // Row 0 of the K/V head's k channels in the same tensor; its v channels are + kv_C.
  template <typename E>
  __device__ __forceinline__ E* k_head(E* base) const {
    return qkv_head(base) + k_offset();
  }
  // From the query head's channels to its K/V head's k channels (C when NKV = NH).
  __device__ __forceinline__ int k_offset() const { return C + (kv_h - h) * HD; }
  // Row 0 of the head's channels in a (B, T, C) tensor (out, dout).
  template <typename E>
  __device__ __forceinline__ E* io_head(E* base) const {
    return base + static_cast<size_t>(b) * seq_len * C + h * HD;
  }
};

// KV_BLOCKS: the grid enumerates (b, K/V head) (the key/value kernel), else (b, query head).
// The forward sits at the edge of spilling (255 registers at HD 128); with CUDA 13.0 these exact
// forms keep every kernel spill-free on sm_80 and sm_90a, while equivalent ones (kv_h as
// h / (NH / NKV), row_stride as C + 2·kv_C in 64 bits, bh recomputed) made the HD 16 or HD 128
// forward spill 8-28 bytes or the HD 64 key/value kernel exceed 168 registers.
template <int HD, int ROWS, bool LAST_FIRST, bool KV_BLOCKS = false>
__device__ __forceinline__ FlashBlock<HD> flash_block(int seq_len, int NH, int NKV) {
  FlashBlock<HD> blk;
  const int tiles = ceil_div(seq_len, ROWS), tile = static_cast<int>(blockIdx.x) % tiles;
  blk.row0 = (LAST_FIRST ? tiles - 1 - tile : tile) * ROWS;
  const int head_block = static_cast<int>(blockIdx.x) / tiles;
  if (KV_BLOCKS) {
    blk.b = head_block / NKV;
    blk.kv_h = head_block % NKV;
    blk.h = blk.kv_h * (NH / NKV);
  } else {
    blk.b = head_block / NH;
    blk.h = head_block % NH;
    blk.kv_h = blk.h * NKV / NH;  // h / (NH / NKV): NKV divides NH
  }
  blk.bh = KV_BLOCKS ? blk.b * NH + blk.h : head_block;
  blk.seq_len = seq_len;
  blk.C = NH * HD;
  blk.kv_C = NKV * HD;
  blk.row_stride = static_cast<size_t>(NH + 2 * NKV) * HD;
  const int lane = threadIdx.x % 32;
  blk.warp = threadIdx.x / 32;
  blk.g = lane / 4;
  blk.t = lane % 4;
  blk.row = blk.row0 + ROWS / FlashTiles<HD>::kWarps * blk.warp + blk.g;
  return blk;
}

// One block per (128 query rows, b, h), streaming K and V of h's K/V head, the longest causal
// prefixes first; each warp owns MT = kForwardMTiles m-tiles of 16 rows. Scores are kept in log2
// units (scaled by scale·log2 e) so the exponentials are exp2f.
// KEYS other than causal (ring_attention.cuh): K and V come from `kv`, a separate
// (B, kv_len, 2·NKV·HD) block, under the causal diagonal (block_diagonal, kv_len = seq_len) or with
// every key visible (block_full); the output goes to out_fp32, in fp32 (`out` is unused). For
// causal, those arguments are unused.
template <int HD, FlashKeys KEYS = FlashKeys::causal>
__global__ void __launch_bounds__(FlashTiles<HD>::kThreads)
    flash_attention_forward_kernel(bf16* out, float* lse, const bf16* qkv, int seq_len, int NH, int NKV,
                                   float scale_log2, const bf16* kv, int kv_len, float* out_fp32) {
  LAUNCH_BOUNDS_GUARD(FlashTiles<HD>::kThreads);
  constexpr bool BLOCKWISE = KEYS != FlashKeys::causal, full = KEYS == FlashKeys::block_full;
  using Tiles = FlashTiles<HD>;
  constexpr int BM = Tiles::forward_rows(KEYS), BN = Tiles::kStream, S = Tiles::kStride;
  constexpr int MT = Tiles::forward_m_tiles(KEYS);
  DYNAMIC_SHARED(bf16, smem);
  bf16* q_tile = smem;
  bf16* k_tiles = q_tile + BM * S;
  bf16* v_tiles = k_tiles + 2 * BN * S;

  const FlashBlock<HD> blk = flash_block<HD, BM, true>(seq_len, NH, NKV);
  const int q0 = blk.row0, bh = blk.bh, C = blk.C, t = blk.t;
  const int warp_row0 = q0 + 16 * MT * blk.warp;  // the warp's rows: warp_row0 .. + 16 MT - 1
  const int row = blk.row;                        // this lane's rows: row + 16 m and row + 16 m + 8
  const size_t row_stride = blk.row_stride;
  const bf16* q_src = blk.qkv_head(qkv);
  const bf16* k_src = q_src + blk.k_offset();
  size_t kv_stride = row_stride;
  int keys = seq_len;
  int kv_tiles = ceil_div(min(q0 + BM, seq_len), BN);  // keys up to the block's last valid row
  if constexpr (BLOCKWISE) {
    kv_stride = 2 * static_cast<size_t>(blk.kv_C);
    k_src = kv + (static_cast<size_t>(blk.b) * kv_len * (2 * NKV) + blk.kv_h) * HD;
    if (full) {  // block_diagonal: kv_len = seq_len
      keys = kv_len;
      kv_tiles = ceil_div(kv_len, BN);
    }
  }
  const bf16* v_src = k_src + blk.kv_C;

  flash_load_tile<HD, BM>(q_tile, q_src, row_stride, q0, seq_len);
  flash_load_tile<HD, BN>(k_tiles, k_src, kv_stride, 0, keys);
  flash_load_tile<HD, BN>(v_tiles, v_src, kv_stride, 0, keys);
  cp_async_commit();

  float o[MT][HD / 8][4] = {};
  float row_max[MT][2], row_sum[MT][2];  // row_sum: this lane's columns only
  UNROLL
  for (int m = 0; m < MT; ++m) {
    for (int r = 0; r < 2; ++r) {
      row_max[m][r] = -INFINITY;
      row_sum[m][r] = 0.0f;
    }
  }
  for (int j = 0; j < kv_tiles; ++j) {
    if (j + 1 < kv_tiles) {  // prefetch the next tile into the other buffer
      const int next = (j + 1) % 2;
      flash_load_tile<HD, BN>(k_tiles + next * BN * S, k_src, kv_stride, (j + 1) * BN, keys);
      flash_load_tile<HD, BN>(v_tiles + next * BN * S, v_src, kv_stride, (j + 1) * BN, keys);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const bf16* k_tile = k_tiles + (j % 2) * BN * S;
    const bf16* v_tile = v_tiles + (j % 2) * BN * S;

    float s[MT][BN / 8][4] = {};
    flash_mma_rows_by_rows<HD, BN, MT>(s, q_tile, warp_row0 - q0, k_tile);
    const int k0 = j * BN;
    const bool diagonal = k0 + BN - 1 > q0;  // some key of the tile lies after some row of the block
    const bool tail = full && k0 + BN > kv_len;  // full: the keys at or beyond kv_len
    uint32_t p[MT][BN / 16][4];
    UNROLL
    for (int m = 0; m < MT; ++m) {
      float tile_max[2] = {-INFINITY, -INFINITY};
      for (int n = 0; n < BN / 8; ++n) {
        for (int i = 0; i < 4; ++i) {
          float x = s[m][n][i] * scale_log2;
          if (full) {
            if (tail && k0 + 8 * n + 2 * t + i % 2 >= kv_len) x = -INFINITY;
          } else if (diagonal && k0 + 8 * n + 2 * t + i % 2 > row + 16 * m + 8 * (i / 2)) {
            x = -INFINITY;
          }
          s[m][n][i] = x;
          tile_max[i / 2] = fmaxf(tile_max[i / 2], x);
        }
      }
      // Every row sees key 0 in the first tile, so the running max is finite from then on.
      float correction[2];
      for (int r = 0; r < 2; ++r) {
        tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 1));
        tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 2));
        const float new_max = fmaxf(row_max[m][r], tile_max[r]);
        correction[r] = exp2f(row_max[m][r] - new_max);  // 0 on the first tile (row_max = -inf)
        row_max[m][r] = new_max;
        row_sum[m][r] *= correction[r];
      }
      for (int n = 0; n < BN / 8; ++n) {
        for (int i = 0; i < 4; ++i) {
          s[m][n][i] = exp2f(s[m][n][i] - row_max[m][i / 2]);
          row_sum[m][i / 2] += s[m][n][i];
        }
      }
      for (int n = 0; n < HD / 8; ++n) {
        for (int i = 0; i < 4; ++i) o[m][n][i] *= correction[i / 2];
      }
      flash_to_a<BN>(p[m], s[m]);
    }
    flash_mma_regs_by_rows<HD, BN, MT>(o, p, v_tile);
    __syncthreads();  // the next iteration's prefetch overwrites this tile's buffers
  }

  UNROLL
  for (int m = 0; m < MT; ++m) {
    for (int r = 0; r < 2; ++r) {
      row_sum[m][r] += __shfl_xor_sync(0xffffffffu, row_sum[m][r], 1);
      row_sum[m][r] += __shfl_xor_sync(0xffffffffu, row_sum[m][r], 2);
    }
    const float inv_sum[2] = {1.0f / row_sum[m][0], 1.0f / row_sum[m][1]};
    for (int n = 0; n < HD / 8; ++n) {
      for (int i = 0; i < 4; ++i) o[m][n][i] *= inv_sum[i / 2];
    }
    if (t == 0) {
      for (int r = 0; r < 2; ++r) {
        const int lse_row = row + 16 * m + 8 * r;
        if (lse_row < seq_len) {
          lse[static_cast<size_t>(bh) * seq_len + lse_row] = (row_max[m][r] + log2f(row_sum[m][r])) * kFlashLn2;
        }
      }
    }
    if constexpr (BLOCKWISE) {
      flash_store_rows_fp32<HD>(blk.io_head(out_fp32), C, row + 16 * m, seq_len, o[m]);
      continue;
    }
    // The warp's own Q rows are free now: they stage its output rows.
    flash_store_rows<HD>(blk.io_head(out), C, warp_row0 + 16 * m, seq_len, q_tile + (warp_row0 - q0 + 16 * m) * S,
                         o[m]);
  }
}

// D_t = dO_t · O_t per (b, h, t) into delta (B, NH, T), fp32. HD / 8 consecutive lanes share a
// row (one 16-byte chunk each) and sum it in a fixed butterfly order.
template <int HD>
__global__ void flash_attention_backward_delta_kernel(float* delta, const bf16* dout, const bf16* out, int B,
                                                      int seq_len, int NH) {
  constexpr int L = HD / 8;
  const size_t rows = static_cast<size_t>(B) * seq_len * NH;  // (b, t, h) rows, contiguous in out and dout
  const size_t index = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t row = index / L;
  const int chunk = static_cast<int>(index % L);
  float sum = 0.0f;
  if (row < rows) {
    const Vec128<bf16> d = load128(dout + row * HD + chunk * 8), o = load128(out + row * HD + chunk * 8);
    for (int i = 0; i < 8; ++i) sum += to_float(d[i]) * to_float(o[i]);
  }
  for (int offset = L / 2; offset > 0; offset >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  if (chunk == 0 && row < rows) {
    const size_t bt = row / NH;
    const int h = static_cast<int>(row % NH);
    const size_t b = bt / seq_len, t = bt % seq_len;
    delta[(b * NH + h) * seq_len + t] = sum;
  }
}

// One block per (64 keys, b, K/V head), the keys with the most queries first: dV = Σ_h Pᵀ dO and
// dK = scale · Σ_h dSᵀ Q, dS = P ∘ (dP − D), over the query heads h of the K/V head's group and,
// for each, the query tiles from the diagonal on. One step is one (head, query tile): heads in
// ascending order, each head's tiles in order, so the group's sum has a fixed order (and with
// NKV = NH it is multi-head attention's loop). The streamed rows' lse (in log2 units) and D sit
// in shared memory, +inf and 0 beyond T so those zero-filled queries contribute exactly 0.
// KEYS other than causal (ring_attention.cuh): the keys are those of `kv`, a separate
// (B, kv_len, 2·NKV·HD) block, seen by the seq_len queries under the causal diagonal
// (block_diagonal, kv_len = seq_len) or by all of them (block_full); dK and dV are added (+=) in
// fp32 into dkv_fp32 (kv's layout).
template <int HD, FlashKeys KEYS = FlashKeys::causal>
__global__ void __launch_bounds__(FlashTiles<HD>::kThreads)
    flash_attention_backward_key_value_kernel(bf16* dqkv, const float* delta, const bf16* dout, const bf16* qkv,
                                              const float* lse, int seq_len, int NH, int NKV, float scale,
                                              float scale_log2, const bf16* kv, int kv_len, float* dkv_fp32) {
  LAUNCH_BOUNDS_GUARD(FlashTiles<HD>::kThreads);
  constexpr bool BLOCKWISE = KEYS != FlashKeys::causal, full = KEYS == FlashKeys::block_full;
  using Tiles = FlashTiles<HD>;
  constexpr int BN = Tiles::kRows, BM = Tiles::kStream, S = Tiles::kStride;
  DYNAMIC_SHARED(bf16, smem);
  bf16* k_tile = smem;
  bf16* v_tile = k_tile + BN * S;
  bf16* q_tiles = v_tile + BN * S;
  bf16* do_tiles = q_tiles + 2 * BM * S;
  float* stats = reinterpret_cast<float*>(do_tiles + 2 * BM * S);  // per buffer: lse·log2 e [BM], then D [BM]

  const FlashBlock<HD> blk = flash_block<HD, BN, false, true>(BLOCKWISE ? kv_len : seq_len, NH, NKV);
  const int k0 = blk.row0, C = blk.C, warp = blk.warp, t = blk.t;
  const int key = blk.row;  // this lane's keys: key and key + 8
  const size_t row_stride = blk.row_stride;
  // The group's first query head; head h + g is g·HD channels further (and g·T rows of lse and D).
  const bf16* q_src = blk.qkv_head(qkv);
  const bf16* do_src = blk.io_head(dout);
  if constexpr (BLOCKWISE) {  // blk counts the key block's rows; the queries have seq_len
    q_src = qkv + static_cast<size_t>(blk.b) * seq_len * row_stride + blk.h * HD;
    do_src = dout + static_cast<size_t>(blk.b) * seq_len * C + blk.h * HD;
  }
  const float* lse_bh = lse + static_cast<size_t>(blk.bh) * seq_len;
  const float* delta_bh = delta + static_cast<size_t>(blk.bh) * seq_len;

  const int first_q0 = full ? 0 : k0 / BM * BM;  // the query tile holding the block's first key
  const int steps = NH / NKV * ceil_div(seq_len - first_q0, BM);
  // The step being loaded: query head h + load_head, query rows load_q0 .. load_q0 + BM - 1.
  int load_head = 0, load_q0 = first_q0;
  auto advance = [&] {
    load_q0 += BM;
    if (load_q0 >= seq_len) {
      load_q0 = first_q0;
      ++load_head;
    }
  };
  // Q and dO of the step being loaded into `buffer`, by cp.async (the caller commits).
  auto load_step = [&](int buffer) {
    flash_load_tile<HD, BM>(q_tiles + buffer * BM * S, q_src + load_head * HD, row_stride, load_q0, seq_len);
    flash_load_tile<HD, BM>(do_tiles + buffer * BM * S, do_src + load_head * HD, C, load_q0, seq_len);
  };
  // Of the step being loaded, thread i < BM holds lse of streamed row i, BM <= i < 2 BM D of row i - BM.
  auto query_stat = [&]() -> float {
    const size_t head_rows = static_cast<size_t>(load_head) * seq_len;
    const int q = load_q0 + static_cast<int>(threadIdx.x) % BM;
    if (static_cast<int>(threadIdx.x) < BM) return q < seq_len ? lse_bh[head_rows + q] * kFlashLog2e : INFINITY;
    return q < seq_len ? delta_bh[head_rows + q] : 0.0f;
  };
  const bool holds_stat = static_cast<int>(threadIdx.x) < 2 * BM;

  if constexpr (BLOCKWISE) {
    const size_t kv_stride = 2 * static_cast<size_t>(blk.kv_C);
    const bf16* k_src = kv + static_cast<size_t>(blk.b) * kv_len * kv_stride + blk.kv_h * HD;
    flash_load_tile<HD, BN>(k_tile, k_src, kv_stride, k0, kv_len);
    flash_load_tile<HD, BN>(v_tile, k_src + blk.kv_C, kv_stride, k0, kv_len);
  } else {
    const bf16* k_src = blk.k_head(qkv);
    flash_load_tile<HD, BN>(k_tile, k_src, row_stride, k0, seq_len);
    flash_load_tile<HD, BN>(v_tile, k_src + blk.kv_C, row_stride, k0, seq_len);
  }
  load_step(0);
  cp_async_commit();
  if (holds_stat) stats[threadIdx.x] = query_stat();

  float dk[HD / 8][4] = {}, dv[HD / 8][4] = {};
  for (int i = 0; i < steps; ++i) {
    const int q0 = load_q0, buffer = i % 2;
    advance();
    float next_stat = 0.0f;
    if (i + 1 < steps) {  // prefetch the next step; its statistics are stored after this step's work
      load_step(1 - buffer);
      cp_async_commit();
      if (holds_stat) next_stat = query_stat();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const bf16* q_tile = q_tiles + buffer * BM * S;
    const bf16* do_tile = do_tiles + buffer * BM * S;
    const float* lse_log2 = stats + buffer * 2 * BM;
    const float* row_delta = lse_log2 + BM;

    // Pᵀ (16 keys x BM queries): this lane holds keys key, key + 8 and queries q0 + 8n + 2t (+1).
    float p[BM / 8][4] = {};
    flash_mma_rows_by_rows<HD, BM>(p, k_tile, 16 * warp, q_tile);
    const bool diagonal = !full && k0 + BN - 1 > q0;
    for (int n = 0; n < BM / 8; ++n) {
      for (int e = 0; e < 4; ++e) {
        const int col = 8 * n + 2 * t + e % 2;
        const bool masked = diagonal && key + 8 * (e / 2) > q0 + col;
        p[n][e] = masked ? 0.0f : exp2f(p[n][e] * scale_log2 - lse_log2[col]);
      }
    }
    uint32_t a[BM / 16][4];
    flash_to_a<BM>(a, p);
    flash_mma_regs_by_rows<HD, BM>(dv, a, do_tile);

    float ds[BM / 8][4] = {};  // dPᵀ = V dOᵀ, then dSᵀ = Pᵀ ∘ (dPᵀ − D)
    flash_mma_rows_by_rows<HD, BM>(ds, v_tile, 16 * warp, do_tile);
    for (int n = 0; n < BM / 8; ++n) {
      for (int e = 0; e < 4; ++e) ds[n][e] = p[n][e] * (ds[n][e] - row_delta[8 * n + 2 * t + e % 2]);
    }
    flash_to_a<BM>(a, ds);
    flash_mma_regs_by_rows<HD, BM>(dk, a, q_tile);

    if (holds_stat && i + 1 < steps) stats[(1 - buffer) * 2 * BM + threadIdx.x] = next_stat;
    __syncthreads();  // the next iteration's prefetch overwrites this tile's buffers
  }

  for (int n = 0; n < HD / 8; ++n) {
    for (int e = 0; e < 4; ++e) dk[n][e] *= scale;
  }
  if constexpr (BLOCKWISE) {
    const size_t kv_stride = 2 * static_cast<size_t>(blk.kv_C);
    float* dk_dst = dkv_fp32 + static_cast<size_t>(blk.b) * kv_len * kv_stride + blk.kv_h * HD;
    flash_store_rows_fp32<HD, true>(dk_dst, kv_stride, key, kv_len, dk);
    flash_store_rows_fp32<HD, true>(dk_dst + blk.kv_C, kv_stride, key, kv_len, dv);
    return;
  }
  // The warp's own K and V rows are free now: they stage its dK and dV rows.
  bf16* dk_dst = blk.k_head(dqkv);
  flash_store_rows<HD>(dk_dst, row_stride, k0 + 16 * warp, seq_len, k_tile + 16 * warp * S, dk);
  flash_store_rows<HD>(dk_dst + blk.kv_C, row_stride, k0 + 16 * warp, seq_len, v_tile + 16 * warp * S, dv);
}

// One block per (64 query rows, b, h), the longest causal prefixes first:
// dQ = scale · dS K over the key tiles (of h's K/V head) up to the diagonal.
// KEYS other than causal (ring_attention.cuh): K and V come from `kv`, a separate
// (B, kv_len, 2·NKV·HD) block, under the causal diagonal (block_diagonal) or with every key
// visible (block_full); dQ is added (+=) in fp32 into dq_fp32 (B, seq_len, C).
template <int HD, FlashKeys KEYS = FlashKeys::causal>
__global__ void __launch_bounds__(FlashTiles<HD>::kThreads, FlashTiles<HD>::kQueryMinBlocks)
    flash_attention_backward_query_kernel(bf16* dqkv, const float* delta, const bf16* dout, const bf16* qkv,
                                          const float* lse, int seq_len, int NH, int NKV, float scale,
                                          float scale_log2, const bf16* kv, int kv_len, float* dq_fp32) {
  LAUNCH_BOUNDS_GUARD(FlashTiles<HD>::kThreads);
  constexpr bool BLOCKWISE = KEYS != FlashKeys::causal, full = KEYS == FlashKeys::block_full;
  using Tiles = FlashTiles<HD>;
  constexpr int BM = Tiles::kRows, BN = Tiles::kStream, S = Tiles::kStride;
  DYNAMIC_SHARED(bf16, smem);
  bf16* q_tile = smem;
  bf16* do_tile = q_tile + BM * S;
  bf16* k_tiles = do_tile + BM * S;
  bf16* v_tiles = k_tiles + 2 * BN * S;

  const FlashBlock<HD> blk = flash_block<HD, BM, true>(seq_len, NH, NKV);
  const int q0 = blk.row0, bh = blk.bh, C = blk.C, warp = blk.warp, t = blk.t;
  const int row = blk.row;  // this lane's rows: row and row + 8
  const size_t row_stride = blk.row_stride;
  const bf16* q_src = blk.qkv_head(qkv);
  const bf16* k_src = blk.k_head(qkv);
  size_t kv_stride = row_stride;
  int keys = seq_len;
  int kv_tiles = ceil_div(min(q0 + BM, seq_len), BN);
  if constexpr (BLOCKWISE) {
    kv_stride = 2 * static_cast<size_t>(blk.kv_C);
    k_src = kv + static_cast<size_t>(blk.b) * kv_len * kv_stride + blk.kv_h * HD;
    if (full) {  // block_diagonal: kv_len = seq_len
      keys = kv_len;
      kv_tiles = ceil_div(kv_len, BN);
    }
  }
  const bf16* v_src = k_src + blk.kv_C;

  flash_load_tile<HD, BM>(q_tile, q_src, row_stride, q0, seq_len);
  flash_load_tile<HD, BM>(do_tile, blk.io_head(dout), C, q0, seq_len);
  flash_load_tile<HD, BN>(k_tiles, k_src, kv_stride, 0, keys);
  flash_load_tile<HD, BN>(v_tiles, v_src, kv_stride, 0, keys);
  cp_async_commit();
  float lse_log2[2], row_delta[2];  // rows beyond T: P = 0 (their results are never written)
  for (int r = 0; r < 2; ++r) {
    const bool valid = row + 8 * r < seq_len;
    lse_log2[r] = valid ? lse[static_cast<size_t>(bh) * seq_len + row + 8 * r] * kFlashLog2e : INFINITY;
    row_delta[r] = valid ? delta[static_cast<size_t>(bh) * seq_len + row + 8 * r] : 0.0f;
  }

  float dq[HD / 8][4] = {};
  for (int j = 0; j < kv_tiles; ++j) {
    if (j + 1 < kv_tiles) {
      const int next = (j + 1) % 2;
      flash_load_tile<HD, BN>(k_tiles + next * BN * S, k_src, kv_stride, (j + 1) * BN, keys);
      flash_load_tile<HD, BN>(v_tiles + next * BN * S, v_src, kv_stride, (j + 1) * BN, keys);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const bf16* k_tile = k_tiles + (j % 2) * BN * S;
    const bf16* v_tile = v_tiles + (j % 2) * BN * S;

    float p[BN / 8][4] = {};
    flash_mma_rows_by_rows<HD, BN>(p, q_tile, 16 * warp, k_tile);
    const int k0 = j * BN;
    const bool diagonal = k0 + BN - 1 > q0;
    // full: only the zero-filled keys at or beyond kv_len (their p could overflow the 0 they multiply)
    const bool tail = full && k0 + BN > kv_len;
    for (int n = 0; n < BN / 8; ++n) {
      for (int e = 0; e < 4; ++e) {
        const int k = k0 + 8 * n + 2 * t + e % 2;
        const bool masked = full ? tail && k >= kv_len : diagonal && k > row + 8 * (e / 2);
        p[n][e] = masked ? 0.0f : exp2f(p[n][e] * scale_log2 - lse_log2[e / 2]);
      }
    }
    float ds[BN / 8][4] = {};  // dP = dO Vᵀ, then dS = P ∘ (dP − D)
    flash_mma_rows_by_rows<HD, BN>(ds, do_tile, 16 * warp, v_tile);
    for (int n = 0; n < BN / 8; ++n) {
      for (int e = 0; e < 4; ++e) ds[n][e] = p[n][e] * (ds[n][e] - row_delta[e / 2]);
    }
    uint32_t a[BN / 16][4];
    flash_to_a<BN>(a, ds);
    flash_mma_regs_by_rows<HD, BN>(dq, a, k_tile);
    __syncthreads();  // the next iteration's prefetch overwrites this tile's buffers
  }

  for (int n = 0; n < HD / 8; ++n) {
    for (int e = 0; e < 4; ++e) dq[n][e] *= scale;
  }
  if constexpr (BLOCKWISE) {
    flash_store_rows_fp32<HD, true>(blk.io_head(dq_fp32), C, row, seq_len, dq);
    return;
  }
  flash_store_rows<HD>(blk.qkv_head(dqkv), row_stride, q0 + 16 * warp, seq_len, q_tile + 16 * warp * S, dq);
}

// ---------------------------------------------------------------------------------------
// Launchers.

// 64 is GPT-2's head size at every size, 128 larger models'; 16 and 32 serve small models (the CPU
// build's test and demo configurations), so that they train with the same kernels.
inline bool flash_attention_supports(int head_size) {
  return head_size == 16 || head_size == 32 || head_size == 64 || head_size == 128;
}

// Validates shape, head size and alignment (cp.async and 128-bit accesses need 16-byte
// aligned rows); returns the head size.
inline int flash_attention_check(const char* who, int B, int seq_len, int C, int NH, int NKV,
                                 std::initializer_list<const void*> tensors) {
  if (B < 1 || seq_len < 1 || NH < 1 || C < 1 || C % NH != 0 || NKV < 1 || NH % NKV != 0) {
    throw_errorf("%s: need B, T, NH, NKV >= 1, C divisible by NH and NH by NKV; got B=%d T=%d C=%d NH=%d NKV=%d",
                 who, B, seq_len, C, NH, NKV);
  }
  const int head_size = C / NH;
  if (!flash_attention_supports(head_size)) {
    throw_errorf("%s: head size C/NH = %d/%d = %d is not supported (16, 32, 64 or 128)", who, C, NH,
                 head_size);
  }
  for (const void* p : tensors) {
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) {
      throw_errorf("%s: tensor %p is not 16-byte aligned (cp.async and 128-bit accesses)", who, p);
    }
  }
  return head_size;
}

// A kernel's dynamic shared memory beyond the default 48 KB needs an explicit opt-in.
template <typename... Params>
void flash_attention_allow_smem(void (*kernel)(Params...), size_t bytes) {
  if (bytes > 48 * 1024) {
    CUDA_CHECK(cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel),
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
  }
}

// One block per tile of `rows` rows (queries or keys) of every (b, h); a head's tiles are
// adjacent (flash_block).
inline dim3 flash_attention_grid(int B, int seq_len, int NH, int rows) {
  return dim3(static_cast<unsigned>(ceil_div(seq_len, rows) * B * NH));
}

template <int HD>
void flash_attention_forward_hd(bf16* out, float* lse, const bf16* qkv, int B, int seq_len, int NH, int NKV,
                                cudaStream_t stream) {
  using Tiles = FlashTiles<HD>;
  const float scale = 1.0f / sqrtf(static_cast<float>(HD));
  flash_attention_allow_smem(flash_attention_forward_kernel<HD>, Tiles::forward_smem());
  launch(flash_attention_forward_kernel<HD>, flash_attention_grid(B, seq_len, NH, Tiles::kForwardRows),
         dim3(Tiles::kThreads), Tiles::forward_smem(), stream, out, lse, qkv, seq_len, NH, NKV, scale * kFlashLog2e,
         nullptr, 0, nullptr);
  CUDA_CHECK(cudaGetLastError());
}

// The backward's first kernel: D_t = dout_t · out_t per (b, h, t) of a (B, T) block into delta
// (B, NH, T); both backward kernels read it (the whole sequence's, or a ring block's: ring_attention.cuh).
template <int HD>
void flash_attention_backward_delta(float* delta, const bf16* dout, const bf16* out, int B, int T, int NH,
                                    cudaStream_t stream) {
  const size_t threads = static_cast<size_t>(B) * T * NH * (HD / 8);
  launch(flash_attention_backward_delta_kernel<HD>, dim3(static_cast<unsigned>(ceil_div<size_t>(threads, 256))),
         dim3(256), 0, stream, delta, dout, out, B, T, NH);
  CUDA_CHECK(cudaGetLastError());
}

template <int HD>
void flash_attention_backward_hd(bf16* dqkv, float* delta, const bf16* dout, const bf16* qkv, const bf16* out,
                                 const float* lse, int B, int seq_len, int NH, int NKV, cudaStream_t stream) {
  using Tiles = FlashTiles<HD>;
  const float scale = 1.0f / sqrtf(static_cast<float>(HD));
  flash_attention_backward_delta<HD>(delta, dout, out, B, seq_len, NH, stream);
  // Both kernels read D of rows other blocks computed, so they follow the delta kernel. The
  // key/value kernel runs a block per K/V head's keys (the group's dK and dV), the query kernel
  // one per query head's rows.
  flash_attention_allow_smem(flash_attention_backward_key_value_kernel<HD>, Tiles::key_value_smem());
  launch(flash_attention_backward_key_value_kernel<HD>, flash_attention_grid(B, seq_len, NKV, Tiles::kRows),
         dim3(Tiles::kThreads), Tiles::key_value_smem(), stream, dqkv, delta, dout, qkv, lse, seq_len, NH, NKV, scale,
         scale * kFlashLog2e, nullptr, 0, nullptr);
  CUDA_CHECK(cudaGetLastError());
  flash_attention_allow_smem(flash_attention_backward_query_kernel<HD>, Tiles::query_smem());
  launch(flash_attention_backward_query_kernel<HD>, flash_attention_grid(B, seq_len, NH, Tiles::kRows),
         dim3(Tiles::kThreads), Tiles::query_smem(), stream, dqkv, delta, dout, qkv, lse, seq_len, NH, NKV, scale,
         scale * kFlashLog2e, nullptr, 0, nullptr);
  CUDA_CHECK(cudaGetLastError());
}

// out (B, T, C) and lse (B, NH, T) from qkv (B, T, C + 2·NKV·C/NH), C = NH·HD; see the top of this file.
inline void flash_attention_forward(bf16* out, float* lse, const bf16* qkv, int B, int seq_len, int C, int NH, int NKV,
                                    cudaStream_t stream) {
  const int head_size = flash_attention_check("flash_attention_forward", B, seq_len, C, NH, NKV, {out, qkv});
  switch (head_size) {
    case 16: flash_attention_forward_hd<16>(out, lse, qkv, B, seq_len, NH, NKV, stream); break;
    case 32: flash_attention_forward_hd<32>(out, lse, qkv, B, seq_len, NH, NKV, stream); break;
    case 64: flash_attention_forward_hd<64>(out, lse, qkv, B, seq_len, NH, NKV, stream); break;
    default: flash_attention_forward_hd<128>(out, lse, qkv, B, seq_len, NH, NKV, stream); break;
  }
}

// Scratch for flash_attention_backward: D_t = dout_t · out_t per (b, h, t), fp32.
inline size_t flash_attention_backward_scratch_bytes(int B, int seq_len, int NH) {
  return static_cast<size_t>(B) * NH * seq_len * sizeof(float);
}

// dqkv (qkv's shape) is overwritten (every element) with dL/dqkv given dout = dL/dout, the
// forward's inputs and outputs (qkv, out, lse) and flash_attention_backward_scratch_bytes of
// scratch; a K/V head's dK and dV sum its NH/NKV query heads' contributions.
inline void flash_attention_backward(bf16* dqkv, float* scratch, const bf16* dout, const bf16* qkv, const bf16* out,
                                     const float* lse, int B, int seq_len, int C, int NH, int NKV,
                                     cudaStream_t stream) {
  const int head_size =
      flash_attention_check("flash_attention_backward", B, seq_len, C, NH, NKV, {dqkv, dout, qkv, out});
  switch (head_size) {
    case 16: flash_attention_backward_hd<16>(dqkv, scratch, dout, qkv, out, lse, B, seq_len, NH, NKV, stream); break;
    case 32: flash_attention_backward_hd<32>(dqkv, scratch, dout, qkv, out, lse, B, seq_len, NH, NKV, stream); break;
    case 64: flash_attention_backward_hd<64>(dqkv, scratch, dout, qkv, out, lse, B, seq_len, NH, NKV, stream); break;
    default: flash_attention_backward_hd<128>(dqkv, scratch, dout, qkv, out, lse, B, seq_len, NH, NKV, stream); break;
  }
}

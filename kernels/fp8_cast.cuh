// fp8_cast.cuh — the casts that feed cuBLASLt's FP8 matrix products (kernels/fp8.cuh's formats):
// a bf16 or fp32 matrix times its per-tensor scale, rounded to E4M3 or E5M2 and written as stored,
// transposed, or both, with the amax of the input recorded on the way; the amax alone; and the
// pieces with which a producer kernel writes the same cast of its own output (Fp8Out: the norms,
// the MLP activations; the wide tile's pieces: the kernels that cast the gradients they make).
//
// Why a transpose: cuBLASLt's FP8 products take both operands with the reduction dimension
// contiguous ("TN" only, docs/SIMT.md "The FP8 oracle"). In the model's row-major terms the forward
// out(N,OC) = x(N,K)·W(OC,K)^T uses x and W as stored; the input gradient dx(N,K) = dy(N,OC)·W
// needs W^T (K,OC) in FP8, and the weight gradient dW(OC,K) = dy^T·x needs dy^T (OC,N) and x^T (K,N).
//
// What the cast guarantees, element by element: code = from_float<F8>(in · *scale), the product
// one fp32 multiply (rounded once, as any fp32 product) and then rounded once to F8: to nearest,
// ties to even, saturating (a product past the format's largest finite value, ±inf included,
// becomes ±largest finite; NaN becomes 0x7F). Never through bf16 or any other intermediate format.
//
// The amax (both kernels): *amax = max(*amax, max |in|) over the whole input, of the input itself,
// before the scale (the next scale is computed from it, fp8_scaling.cuh). NaN propagates: one NaN
// in the input makes *amax a NaN, so a bad step is visible in the amax, and fp8_update_scales keeps
// the previous scale rather than computing one from it. (For comparison: TransformerEngine's amax
// kernels reduce with fmaxf / __hmax, which drop a NaN operand; torchao takes
// torch.max(torch.abs(x)), which propagates it.) *amax must hold a non-negative float or a NaN
// (fp8_update_scales leaves it 0). The result is exact and its bits do not depend on the order of
// threads or blocks: magnitudes are compared as the integers of their bit patterns with the sign
// bit cleared, which order non-negative floats by value (+inf above every finite value, every NaN
// above +inf); an integer max is associative and commutative, and the blocks meet in one atomicMax
// on those integers.
#pragma once
#include "common.cuh"
#include "fp8.cuh"

#include <algorithm>

// |x| as the integer of its bit pattern, sign bit cleared: an order-preserving key for magnitudes.
__device__ __forceinline__ int fp8_magnitude_key(float x) {
  uint32_t bits;
  memcpy(&bits, &x, sizeof(bits));
  return static_cast<int>(bits & 0x7FFFFFFFu);
}
__device__ __forceinline__ int fp8_larger_key(int a, int b) { return a > b ? a : b; }

// One block's largest magnitude key folded into *amax (see the opening comment); called by every
// thread of a block of kThreads threads (a multiple of 32, laid out along x then y).
template <int kThreads>
__device__ __forceinline__ void fp8_record_amax(float* amax, int key) {
  static_assert(kThreads % 32 == 0 && kThreads <= 1024, "whole warps");
  __shared__ int warp_keys[kThreads / 32];
  for (int offset = 16; offset > 0; offset >>= 1) {
    key = fp8_larger_key(key, __shfl_xor_sync(0xffffffffu, key, offset));
  }
  const int thread = threadIdx.y * blockDim.x + threadIdx.x;
  if (thread % 32 == 0) warp_keys[thread / 32] = key;
  __syncthreads();
  if (thread == 0) {
    int block_key = warp_keys[0];
    for (int w = 1; w < kThreads / 32; ++w) block_key = fp8_larger_key(block_key, warp_keys[w]);
    atomicMax(reinterpret_cast<int*>(amax), block_key);
  }
}

// A producer kernel's FP8 copy of its output, written on the way (the norms and the MLP activations
// write the input cast of the product that reads their output, src/model/fp8_state.h): fp8_cast's
// stored output and amax, of the values the producer writes, already rounded to its output type,
// so the codes and the amax are those fp8_cast would give on that output. out (rows, cols)
// row-major as the producer's output; scale a device pointer; amax nullptr: not recorded. out
// nullptr: no copy.
struct Fp8Out {
  fp8e4m3* out = nullptr;
  const float* scale = nullptr;
  float* amax = nullptr;
};

// A producer launcher's check of its Fp8Out for outputs of 128-bit chunks of T: a scale with the
// codes, nothing without them, and `out` aligned for fp8_cast_chunk's stores.
template <typename T>
void fp8_out_check(const char* op, const Fp8Out& f8) {
  if (f8.out == nullptr && (f8.scale != nullptr || f8.amax != nullptr))
    throw_errorf("%s: an FP8 scale or amax without the FP8 output", op);
  if (f8.out != nullptr && f8.scale == nullptr) throw_errorf("%s: the FP8 output has no scale", op);
  if (reinterpret_cast<uintptr_t>(f8.out) % Vec128<T>::size != 0)
    throw_errorf("%s: the FP8 output must be %d-byte aligned", op, Vec128<T>::size);
}

// One 128-bit chunk v of a producer's output cast as fp8_cast casts it: the Vec128<T>::size codes
// from_float<E4M3>(v[i] · scale) written to out with one store (8 bytes for bf16, 4 for fp32; out
// aligned to that), and |v[i]| folded into a thread's magnitude key (fp8_record_amax's input).
template <typename T>
__device__ __forceinline__ int fp8_cast_chunk(fp8e4m3* out, const Vec128<T>& v, float scale, int key) {
  constexpr int kCodes = Vec128<T>::size;
  static_assert(kCodes == 4 || kCodes == 8, "one 32- or 64-bit store");
  uint32_t words[kCodes / 4] = {};
  UNROLL
  for (int i = 0; i < kCodes; ++i) {
    const float x = to_float(v[i]);
    key = fp8_larger_key(key, fp8_magnitude_key(x));
    words[i / 4] |= static_cast<uint32_t>(from_float<fp8e4m3>(x * scale).__x) << (8 * (i % 4));
  }
  if constexpr (kCodes == 8) *reinterpret_cast<uint2*>(out) = uint2{words[0], words[1]};
  else *reinterpret_cast<uint32_t*>(out) = words[0];
  return key;
}

// The scalar cast, for any shape and alignment (fp8_cast takes the wide kernel below where it
// can): a block of (32, 8) threads owns 32 columns of kFp8CastTilesPerBlock stacked 32×32
// tiles. Per tile, a warp reads 32 consecutive elements of a row and writes 32 consecutive bytes of
// `out`; with a transpose the codes go through shared memory (one 32-bit word each, rows padded to
// 33 words: conflict-free both ways) and a warp writes 32 consecutive bytes of a row of `out_t`.
// Several tiles per block keep the atomics to one per 4,096 elements.
constexpr int kFp8CastTile = 32;
constexpr int kFp8CastRowsPerPass = 8;
constexpr int kFp8CastThreads = kFp8CastTile * kFp8CastRowsPerPass;
constexpr int kFp8CastTilesPerBlock = 4;
constexpr int kFp8CastRowsPerBlock = kFp8CastTile * kFp8CastTilesPerBlock;

template <typename T, typename F8>
__global__ void __launch_bounds__(kFp8CastThreads)
    fp8_cast_kernel(F8* out, F8* out_t, float* amax, const T* in, int rows, int cols, const float* scale) {
  LAUNCH_BOUNDS_GUARD(kFp8CastThreads);
  __shared__ uint32_t tile[kFp8CastTile][kFp8CastTile + 1];
  const float s = *scale;
  const int col = blockIdx.y * kFp8CastTile + threadIdx.x;
  int key = 0;
  for (int t = 0; t < kFp8CastTilesPerBlock; ++t) {
    const int tile_row = blockIdx.x * kFp8CastRowsPerBlock + t * kFp8CastTile;
    if (tile_row >= rows) break;  // the same for every thread of the block
    UNROLL
    for (int k = 0; k < kFp8CastTile / kFp8CastRowsPerPass; ++k) {
      const int r = threadIdx.y + k * kFp8CastRowsPerPass;
      const int row = tile_row + r;
      if (row < rows && col < cols) {
        const size_t i = static_cast<size_t>(row) * cols + col;
        const float x = to_float(in[i]);
        key = fp8_larger_key(key, fp8_magnitude_key(x));
        const F8 code = from_float<F8>(x * s);
        if (out != nullptr) out[i] = code;
        tile[r][threadIdx.x] = code.__x;
      }
    }
    if (out_t == nullptr) continue;
    __syncthreads();
    // Transposed: thread x writes row r of the tile's column c, i.e. out_t[c][r].
    const int row_t = tile_row + threadIdx.x;
    UNROLL
    for (int k = 0; k < kFp8CastTile / kFp8CastRowsPerPass; ++k) {
      const int c = threadIdx.y + k * kFp8CastRowsPerPass;
      const int col_t = blockIdx.y * kFp8CastTile + c;
      if (row_t < rows && col_t < cols) {
        F8 code;
        code.__x = static_cast<__nv_fp8_storage_t>(tile[threadIdx.x][c]);
        out_t[static_cast<size_t>(col_t) * rows + row_t] = code;
      }
    }
    __syncthreads();  // the next tile overwrites this one
  }
  if (amax != nullptr) fp8_record_amax<kFp8CastThreads>(amax, key);
}

// The wide cast, for the shapes every model has: 16-byte loads and 8-byte stores, both ways. A block
// of (8, 32) threads owns a 64×64 tile; thread (j, y) casts the 8 columns [8j, 8j + 8) of tile rows
// y and y + 32 (a warp reads 4 rows of 128 bytes of bf16) and writes their 8 codes to `out` with one
// store. With a transpose the codes go to shared memory column-major (kFp8WidePitch bytes per
// column: 8-byte aligned, and 2-way bank conflicts at most), and each thread then writes 8
// consecutive codes of a column (8 rows) of the tile to a row of `out_t` with one store. A tile at
// the matrix's edge has whole chunks only: cols and (with a transpose) rows are multiples of 8.
// The codes and the amax are fp8_cast_kernel's, element by element (the amax is order-free).
//
// The values come from a Source: src.load(i, x) fills x with the 8 values of elements [i, i + 8) of
// the row-major (rows, cols) matrix, as floats. Fp8Stored reads a stored matrix (fp8_cast); a
// producer that makes its values from other tensors (an activation recomputed for the backward)
// passes its own, and writes the cast without ever writing the matrix (fp8_cast_wide).
constexpr int kFp8WideTile = 64;
constexpr int kFp8WideChunk = 8;                                     // elements per thread access
constexpr int kFp8WideChunksPerRow = kFp8WideTile / kFp8WideChunk;  // 8
constexpr int kFp8WideRowsPerPass = 32;
constexpr int kFp8WideThreads = kFp8WideChunksPerRow * kFp8WideRowsPerPass;
constexpr int kFp8WidePitch = kFp8WideTile + 8;

template <typename T>
struct Fp8Stored {
  static_assert(Vec128<T>::size == 8 || Vec128<T>::size == 4, "bf16 or float");
  const T* in;
  __device__ __forceinline__ void load(size_t i, float (&x)[kFp8WideChunk]) const {
    UNROLL
    for (int h = 0; h < kFp8WideChunk; h += Vec128<T>::size) {
      const Vec128<T> v = load128(in + i + h);
      UNROLL
      for (int k = 0; k < Vec128<T>::size; ++k) x[h + k] = to_float(v[k]);
    }
  }
};

// A wide tile's codes, [column][row] in shared memory (kFp8WidePitch bytes per column), read back
// as 8-byte words.
using Fp8WideTile = uint2[kFp8WideTile][kFp8WidePitch / 8];

// One thread's chunk x (8 values) of tile row r, columns [c, c + 8), cast at scale s: the codes
// into `words` (one 8-byte store's worth) and into tile column-major (nullptr: no transpose); the
// magnitudes folded into the thread's key (fp8_record_amax's input), which it returns.
template <typename F8>
__device__ __forceinline__ int fp8_wide_cast_chunk(const float (&x)[kFp8WideChunk], float s, int key,
                                                   uint32_t (&words)[2], Fp8WideTile* tile, int r, int c) {
  auto tile_t = reinterpret_cast<uint8_t (*)[kFp8WidePitch]>(tile);
  words[0] = words[1] = 0;
  UNROLL
  for (int k = 0; k < kFp8WideChunk; ++k) {
    key = fp8_larger_key(key, fp8_magnitude_key(x[k]));
    const uint8_t code = from_float<F8>(x[k] * s).__x;
    words[k / 4] |= static_cast<uint32_t>(code) << (8 * (k % 4));
    if (tile != nullptr) tile_t[c + k][r] = code;
  }
  return key;
}

// The tile at (row0, col0) of a (rows, cols) matrix written transposed into out_t (cols, rows):
// thread t of the block writes column t / 8 (+ 32 on the second pass), rows [8·(t % 8), +8), with
// one 8-byte store. After a __syncthreads() that follows the tile's last write.
__device__ __forceinline__ void fp8_wide_store_transposed(void* out_t, const Fp8WideTile& tile, int row0, int col0,
                                                          int rows, int cols) {
  const int t = threadIdx.y * kFp8WideChunksPerRow + threadIdx.x;
  const int r = kFp8WideChunk * (t % kFp8WideChunksPerRow);
  UNROLL
  for (int pass = 0; pass < kFp8WideTile / (kFp8WideThreads / kFp8WideChunksPerRow); ++pass) {
    const int col = t / kFp8WideChunksPerRow + pass * (kFp8WideThreads / kFp8WideChunksPerRow);
    if (col0 + col >= cols || row0 + r >= rows) continue;
    *reinterpret_cast<uint2*>(static_cast<uint8_t*>(out_t) + static_cast<size_t>(col0 + col) * rows + row0 + r) =
        tile[col][r / kFp8WideChunk];
  }
}

template <typename Source, typename F8>
__global__ void __launch_bounds__(kFp8WideThreads)
    fp8_cast_wide_kernel(F8* out, F8* out_t, float* amax, Source src, int rows, int cols, const float* scale) {
  LAUNCH_BOUNDS_GUARD(kFp8WideThreads);
  __shared__ Fp8WideTile tile;
  const float s = *scale;
  const int row0 = blockIdx.x * kFp8WideTile, col0 = blockIdx.y * kFp8WideTile;
  const int c = kFp8WideChunk * threadIdx.x;  // the thread's first column in the tile
  int key = 0;
  UNROLL
  for (int pass = 0; pass < kFp8WideTile / kFp8WideRowsPerPass; ++pass) {
    const int r = threadIdx.y + pass * kFp8WideRowsPerPass;
    if (row0 + r >= rows || col0 + c >= cols) continue;
    const size_t i = static_cast<size_t>(row0 + r) * cols + col0 + c;
    float x[kFp8WideChunk];
    src.load(i, x);
    uint32_t words[2];
    key = fp8_wide_cast_chunk<F8>(x, s, key, words, out_t != nullptr ? &tile : nullptr, r, c);
    if (out != nullptr) *reinterpret_cast<uint2*>(reinterpret_cast<uint8_t*>(out) + i) = uint2{words[0], words[1]};
  }
  if (out_t != nullptr) {
    __syncthreads();
    fp8_wide_store_transposed(out_t, tile, row0, col0, rows, cols);
  }
  if (amax != nullptr) fp8_record_amax<kFp8WideThreads>(amax, key);
}

// Whether p is aligned to `bytes` (the FP8 launchers' checks of their pointers).
inline bool fp8_aligned(const void* p, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

// The wide kernel on src's values: fp8_cast's contract, for whole chunks (cols, and rows for a
// transpose, multiples of 8) and outputs aligned to 8 bytes; a producer's entry (see above).
template <typename Source, typename F8>
void fp8_cast_wide(F8* out, F8* out_t, float* amax, const Source& src, int rows, int cols, const float* scale,
                   cudaStream_t stream) {
  if (rows < 0 || cols < 0 || cols % kFp8WideChunk != 0 || (out_t != nullptr && rows % kFp8WideChunk != 0))
    throw_errorf("fp8_cast_wide: rows=%d cols=%d: need whole chunks of %d", rows, cols, kFp8WideChunk);
  if (out == nullptr && out_t == nullptr) throw_error("fp8_cast_wide: no output (out and out_t are both null)");
  if (!fp8_aligned(out, kFp8WideChunk) || !fp8_aligned(out_t, kFp8WideChunk))
    throw_error("fp8_cast_wide: the codes must be 8-byte aligned");
  if (scale == nullptr) throw_error("fp8_cast_wide: scale is null (a device pointer to the tensor's scale)");
  if (rows == 0 || cols == 0) return;
  const dim3 grid(static_cast<unsigned>(ceil_div(rows, kFp8WideTile)), static_cast<unsigned>(ceil_div(cols, kFp8WideTile)));
  launch(fp8_cast_wide_kernel<Source, F8>, grid, dim3(kFp8WideChunksPerRow, kFp8WideRowsPerPass), 0, stream, out, out_t,
         amax, src, rows, cols, scale);
  CUDA_CHECK(cudaGetLastError());
}

// Whether fp8_cast can take the wide kernel: whole 8-element chunks (cols, and rows for a
// transpose, multiples of 8) and aligned pointers (in 16 bytes, the outputs 8).
template <typename T, typename F8>
bool fp8_cast_wide_fits(const F8* out, const F8* out_t, const T* in, int rows, int cols) {
  return cols % kFp8WideChunk == 0 && fp8_aligned(in, 16) && fp8_aligned(out, 8) &&
         (out_t == nullptr || (rows % kFp8WideChunk == 0 && fp8_aligned(out_t, 8)));
}

// out (rows, cols) = F8(in · *scale) and/or out_t (cols, rows) its transpose, row-major, from
// in (rows, cols) row-major; either output may be nullptr (not both: fp8_amax measures without
// casting). amax (nullptr: none) as in the opening comment. `scale` is a device pointer (delayed
// scaling keeps it on the device, fp8_scaling.cuh). Any rows, cols >= 0 (cols up to 65,535 · 32)
// and any alignment beyond the types': whole chunks of 8 and aligned pointers take the wide
// kernel, anything else the scalar one. Deterministic.
template <typename T, typename F8>
void fp8_cast(F8* out, F8* out_t, float* amax, const T* in, int rows, int cols, const float* scale,
              cudaStream_t stream) {
  if (rows < 0 || cols < 0) throw_errorf("fp8_cast: rows=%d cols=%d must not be negative", rows, cols);
  if (out == nullptr && out_t == nullptr) throw_error("fp8_cast: no output (out and out_t are both null)");
  if (scale == nullptr) throw_error("fp8_cast: scale is null (a device pointer to the tensor's scale)");
  const int column_tiles = ceil_div(cols, kFp8CastTile);
  if (column_tiles > 65535) throw_errorf("fp8_cast: cols=%d exceeds %d (the grid's y dimension)", cols, 65535 * kFp8CastTile);
  if (rows == 0 || cols == 0) return;
  if (fp8_cast_wide_fits(out, out_t, in, rows, cols))
    return fp8_cast_wide(out, out_t, amax, Fp8Stored<T>{in}, rows, cols, scale, stream);
  const dim3 grid(static_cast<unsigned>(ceil_div(rows, kFp8CastRowsPerBlock)), static_cast<unsigned>(column_tiles));
  launch(fp8_cast_kernel<T, F8>, grid, dim3(kFp8CastTile, kFp8CastRowsPerPass), 0, stream, out, out_t, amax, in, rows,
         cols, scale);
  CUDA_CHECK(cudaGetLastError());
}

// The amax alone (current scaling measures a tensor before it casts it): a grid-stride loop over
// 128-bit vectors, then the last n % (16 / sizeof(T)) elements one per thread.
constexpr int kFp8AmaxThreads = 256;
constexpr size_t kFp8AmaxMaxBlocks = 1024;

template <typename T>
__global__ void __launch_bounds__(kFp8AmaxThreads) fp8_amax_kernel(float* amax, const T* in, size_t n) {
  LAUNCH_BOUNDS_GUARD(kFp8AmaxThreads);
  constexpr int kVec = Vec128<T>::size;
  const size_t thread = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t vectors = n / kVec;
  int key = 0;
  for (size_t v = thread; v < vectors; v += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const Vec128<T> x = load128(in + v * kVec);
    for (int k = 0; k < kVec; ++k) key = fp8_larger_key(key, fp8_magnitude_key(to_float(x[k])));
  }
  if (thread < n - vectors * kVec) key = fp8_larger_key(key, fp8_magnitude_key(to_float(in[vectors * kVec + thread])));
  fp8_record_amax<kFp8AmaxThreads>(amax, key);
}

// *amax = max(*amax, max |in[i]|) for i < n, as fp8_cast records it (NaN propagates; exact,
// order-free). `in` 16-byte aligned; any n.
template <typename T>
void fp8_amax(float* amax, const T* in, size_t n, cudaStream_t stream) {
  if (amax == nullptr) throw_error("fp8_amax: amax is null");
  if (n == 0) return;
  const size_t vectors = n / Vec128<T>::size;
  const size_t blocks = std::min(std::max(ceil_div(vectors, static_cast<size_t>(kFp8AmaxThreads)), size_t{1}),
                                 kFp8AmaxMaxBlocks);
  launch(fp8_amax_kernel<T>, dim3(static_cast<unsigned>(blocks)), dim3(kFp8AmaxThreads), 0, stream, amax, in, n);
  CUDA_CHECK(cudaGetLastError());
}

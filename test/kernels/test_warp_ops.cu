// Warp-level building blocks the kernels rely on, checked against plain CPU loops:
// shuffles (all four kinds, with widths), ballot/any/all, partial warps, block barriers
// with shared memory, dynamic shared memory, atomics, cp.async, and the tensor-core
// wrappers (mma.m16n8k16, ldmatrix x1/x2/x4 with and without .trans) against an fp64
// matrix product. Runs in both builds: on a GPU it validates the fragment layouts simt
// emulates.
#include "test/test_util.h"

#include <cstdint>

// ---- shuffles: every lane records what each shuffle kind returns for a few deltas/widths.
// Cases 8 and 9 are xor shuffles below warp width whose partner lies outside the caller's
// segment. The CUDA C++ Programming Guide (warp shuffle functions, __shfl_xor_sync): "If width
// is less than warpSize then each group of width consecutive threads are able to access elements
// from earlier groups of threads, however if they attempt to access elements from later groups
// of threads their own value of var will be returned." (PTX shfl.sync.bfly: j = lane ^ b, taken
// when j <= the segment's last lane, else the caller's own lane.)
constexpr int kShuffleCases = 10;

__global__ void shuffle_kernel(int* out, int n) {
  const int tid = threadIdx.x;
  const int lane = tid % 32;
  const int value = 1000 + tid;
  int r[kShuffleCases];
  r[0] = __shfl_sync(0xffffffffu, value, 5);
  r[1] = __shfl_sync(0xffffffffu, value, lane + 3, 8);
  r[2] = __shfl_xor_sync(0xffffffffu, value, 1);
  r[3] = __shfl_xor_sync(0xffffffffu, value, 12, 16);
  r[4] = __shfl_down_sync(0xffffffffu, value, 3);
  r[5] = __shfl_down_sync(0xffffffffu, value, 2, 8);
  r[6] = __shfl_up_sync(0xffffffffu, value, 4);
  r[7] = __shfl_up_sync(0xffffffffu, value, 1, 4);
  r[8] = __shfl_xor_sync(0xffffffffu, value, 6, 4);    // bit 2 leaves the 4-lane segment
  r[9] = __shfl_xor_sync(0xffffffffu, value, 20, 16);  // bit 4 leaves the 16-lane segment
  if (tid < n)
    for (int i = 0; i < kShuffleCases; ++i) out[tid * kShuffleCases + i] = r[i];
}

static int expected_shuffle(int tid, int which) {
  const int lane = tid % 32, base = tid - lane;
  auto value = [&](int l) { return 1000 + base + l; };
  auto segment = [&](int width) { return lane & ~(width - 1); };
  switch (which) {
    case 0: return value(5);
    case 1: return value(segment(8) + ((lane + 3) & 7));
    case 2: return value(lane ^ 1);
    case 3: { int src = lane ^ 12; return (src & ~15) > segment(16) ? value(lane) : value(src); }
    case 4: return lane + 3 < 32 ? value(lane + 3) : value(lane);
    case 5: return (lane & 7) + 2 < 8 ? value(lane + 2) : value(lane);
    case 6: return lane >= 4 ? value(lane - 4) : value(lane);
    case 7: return (lane & 3) >= 1 ? value(lane - 1) : value(lane);
    // Partner in a later segment: the caller's own value; in an earlier one: the partner's.
    case 8: return (lane & 4) == 0 ? value(lane) : value(lane ^ 6);
    default: return (lane & 16) == 0 ? value(lane) : value(lane ^ 20);
  }
}

TEST_CASE("warp shuffles follow CUDA's lane, width and out-of-range rules", "[warp]") {
  const int threads = 64;
  test::DeviceBuffer<int> out(threads * kShuffleCases);
  launch(shuffle_kernel, dim3(2), dim3(threads), 0, nullptr, out.ptr, threads);
  test::require_no_cuda_error();
  std::vector<int> got = out.download();
  for (int tid = 0; tid < threads; ++tid)
    for (int k = 0; k < kShuffleCases; ++k) {
      INFO("thread " << tid << " case " << k);
      REQUIRE(got[tid * kShuffleCases + k] == expected_shuffle(tid, k));
    }
}

// ---- votes and a partial last warp (block of 40 threads: warp 1 has 8 lanes).
__global__ void vote_kernel(unsigned* out) {
  const int tid = threadIdx.x;
  const unsigned ballot = __ballot_sync(0xffffffffu, tid % 3 == 0);
  const int any = __any_sync(0xffffffffu, tid == 35);
  const int all = __all_sync(0xffffffffu, tid < 36);
  // A shuffle from a lane that does not exist is undefined in CUDA (simt stops it): only the full
  // warp sums.
  const float sum = tid < 32 ? warp_sum(static_cast<float>(tid)) : 0.0f;
  out[tid * 4 + 0] = ballot;
  out[tid * 4 + 1] = static_cast<unsigned>(any);
  out[tid * 4 + 2] = static_cast<unsigned>(all);
  out[tid * 4 + 3] = static_cast<unsigned>(sum);
}

TEST_CASE("ballot, any, all and warp_sum on full and partial warps", "[warp]") {
  const int threads = 40;
  test::DeviceBuffer<unsigned> out(threads * 4);
  launch(vote_kernel, dim3(1), dim3(threads), 0, nullptr, out.ptr);
  test::require_no_cuda_error();
  std::vector<unsigned> got = out.download();
  for (int tid = 0; tid < threads; ++tid) {
    const int warp = tid / 32, lanes = warp == 0 ? 32 : threads - 32;
    unsigned ballot = 0;
    float sum = 0;
    bool any = false, all = true;
    for (int l = 0; l < lanes; ++l) {
      const int t = warp * 32 + l;
      if (t % 3 == 0) ballot |= 1u << l;
      any |= t == 35;
      all &= t < 36;
      sum += static_cast<float>(t);
    }
    INFO("thread " << tid);
    CHECK(got[tid * 4 + 0] == ballot);
    CHECK(got[tid * 4 + 1] == static_cast<unsigned>(any));
    CHECK(got[tid * 4 + 2] == static_cast<unsigned>(all));
    if (lanes == 32) CHECK(got[tid * 4 + 3] == static_cast<unsigned>(sum));
  }
}

// ---- a block reduction through static shared memory and barriers, with early-exiting threads.
__global__ void block_sum_kernel(float* out, const float* in, int n) {
  __shared__ float warp_sums[32];
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  float v = i < n ? in[i] : 0.0f;
  v = warp_sum(v);
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = v;
  __syncthreads();
  if (threadIdx.x >= 32) return;  // exited threads must not hold the next barrier
  const int warps = blockDim.x / 32;
  float s = static_cast<int>(threadIdx.x) < warps ? warp_sums[threadIdx.x] : 0.0f;
  s = warp_sum(s);
  if (threadIdx.x == 0) out[blockIdx.x] = s;
}

TEST_CASE("block reduction with static shared memory, barriers and exited threads", "[block]") {
  const int n = 1000, threads = 128, blocks = ceil_div(n, threads);
  std::vector<float> host = test::random_floats(n, 7);
  test::DeviceBuffer<float> in(host);
  test::DeviceBuffer<float> out(blocks);
  launch(block_sum_kernel, dim3(blocks), dim3(threads), 0, nullptr, out.ptr, in.ptr, n);
  test::require_no_cuda_error();
  std::vector<float> got = out.download();
  std::vector<double> want(blocks, 0.0);
  for (int i = 0; i < n; ++i) want[i / threads] += host[i];
  REQUIRE(test::all_close<float>("block sums", got, want, 1e-5, 1e-5));
}

// ---- dynamic shared memory: a reversal through shared memory of a runtime-chosen size.
__global__ void reverse_kernel(float* out, const float* in, int n) {
  DYNAMIC_SHARED(float, buffer);
  const int i = threadIdx.x;
  if (i < n) buffer[i] = in[blockIdx.x * n + i];
  __syncthreads();
  if (i < n) out[blockIdx.x * n + i] = buffer[n - 1 - i];
}

TEST_CASE("dynamic shared memory, partial warps and several blocks", "[block]") {
  for (int n : {1, 33, 100}) {
    const int blocks = 3;
    std::vector<float> host = test::random_floats(static_cast<size_t>(n) * blocks, 11);
    test::DeviceBuffer<float> in(host);
    test::DeviceBuffer<float> out(host.size());
    launch(reverse_kernel, dim3(blocks), dim3(n), n * sizeof(float), nullptr, out.ptr, in.ptr, n);
    test::require_no_cuda_error();
    std::vector<float> got = out.download();
    for (int b = 0; b < blocks; ++b)
      for (int i = 0; i < n; ++i) REQUIRE(got[b * n + i] == host[b * n + n - 1 - i]);
  }
}

// ---- atomics: integer counts are exact whatever the order.
__global__ void histogram_kernel(int* bins, const int* values, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) atomicAdd(&bins[values[i]], 1);
}

TEST_CASE("integer atomics from many blocks", "[atomic]") {
  const int n = 5000, bins = 7;
  std::vector<int> values = test::random_tokens(n, bins, 3);
  test::DeviceBuffer<int> in(values);
  test::DeviceBuffer<int> out(bins);
  CUDA_CHECK(cudaMemset(out.ptr, 0, bins * sizeof(int)));
  launch(histogram_kernel, dim3(ceil_div(n, 256)), dim3(256), 0, nullptr, out.ptr, in.ptr, n);
  test::require_no_cuda_error();
  std::vector<int> want(bins, 0);
  for (int v : values) ++want[v];
  REQUIRE(out.download() == want);
}

// ---- cp.async: 16-byte copies become visible after the wait that covers their group.
__global__ void cp_async_kernel(float* out, const float* in) {
  alignas(16) __shared__ float tile[2][64];
  const int t = threadIdx.x;  // 16 threads, 4 floats each per tile
  cp_async_16(&tile[0][4 * t], in + 4 * t);
  cp_async_commit();
  cp_async_16(&tile[1][4 * t], in + 64 + 4 * t);
  cp_async_commit();
  cp_async_wait<1>();  // the first group is complete, the second may still be in flight
  __syncthreads();
  for (int k = 0; k < 4; ++k) out[4 * t + k] = tile[0][4 * t + k] * 2.0f;
  cp_async_wait<0>();
  __syncthreads();
  for (int k = 0; k < 4; ++k) out[64 + 4 * t + k] = tile[1][63 - (4 * t + k)];
}

TEST_CASE("cp.async copies complete by group", "[async]") {
  std::vector<float> host = test::random_floats(128, 5);
  test::DeviceBuffer<float> in(host);
  test::DeviceBuffer<float> out(128);
  launch(cp_async_kernel, dim3(1), dim3(16), 0, nullptr, out.ptr, in.ptr);
  test::require_no_cuda_error();
  std::vector<float> got = out.download();
  for (int i = 0; i < 64; ++i) REQUIRE(got[i] == host[i] * 2.0f);
  for (int i = 0; i < 64; ++i) REQUIRE(got[64 + i] == host[64 + 63 - i]);
}

// ---- tensor cores. A is M×K row-major, B is K×N stored column-major (each column's K values
// contiguous), C = A·B is M×N row-major; one warp computes one 16×8 tile per mma, K in steps of 16.
__global__ void mma_gemm_kernel(float* c, const bf16* a, const bf16* b_cols, int N, int K) {
  const int lane = threadIdx.x, g = lane / 4, t = lane % 4;
  const int tile_m = blockIdx.y * 16, tile_n = blockIdx.x * 8;
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  for (int k0 = 0; k0 < K; k0 += 16) {
    uint32_t af[4], bfrag[2];
    for (int r = 0; r < 4; ++r) {
      const int row = tile_m + g + 8 * (r % 2), col = k0 + 2 * t + 8 * (r / 2);
      memcpy(&af[r], &a[row * K + col], 4);
    }
    for (int r = 0; r < 2; ++r) {
      const int k = k0 + 2 * t + 8 * r, col = tile_n + g;
      memcpy(&bfrag[r], &b_cols[col * K + k], 4);
    }
    mma_m16n8k16_bf16(acc, af, bfrag, acc);
  }
  for (int i = 0; i < 4; ++i) c[(tile_m + g + 8 * (i / 2)) * N + tile_n + 2 * t + i % 2] = acc[i];
}

TEST_CASE("mma.m16n8k16 bf16 matches an fp64 matrix product", "[mma]") {
  const int M = 32, N = 24, K = 48;
  std::vector<float> a = test::round_to<bf16>(test::random_floats(M * K, 21));
  std::vector<float> b = test::round_to<bf16>(test::random_floats(K * N, 22));  // column-major
  test::DeviceBuffer<bf16> da(test::from_floats<bf16>(a));
  test::DeviceBuffer<bf16> db(test::from_floats<bf16>(b));
  test::DeviceBuffer<float> dc(M * N);
  launch(mma_gemm_kernel, dim3(N / 8, M / 16), dim3(32), 0, nullptr, dc.ptr, da.ptr, db.ptr, N, K);
  test::require_no_cuda_error();
  std::vector<double> want(M * N, 0.0);
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j)
      for (int k = 0; k < K; ++k) want[i * N + j] += static_cast<double>(a[i * K + k]) * b[j * K + k];
  // fp32 accumulation of 48 exact products: a few fp32 ulps of the sum's magnitude.
  REQUIRE(test::all_close<float>("mma C", dc.download(), want, 1e-5, 1e-5));
}

// ldmatrix: the warp loads NMAT 8×8 bf16 tiles from a 16-byte-aligned shared array; lane l
// gives the address of row (l % 8) of tile (l / 8); every lane writes its words out.
template <int NMAT, bool TRANSPOSE>
__global__ void ldmatrix_kernel(uint32_t* out, const bf16* in) {
  alignas(16) __shared__ bf16 tiles[4][8][8];
  const int lane = threadIdx.x;
  for (int i = lane; i < NMAT * 64; i += 32) (&tiles[0][0][0])[i] = in[i];
  __syncthreads();
  const int tile = (lane / 8) % NMAT, row = lane % 8;
  uint32_t r[NMAT];
  if (NMAT == 1) {
    if (TRANSPOSE) ldmatrix_x1_trans(r, &tiles[tile][row][0]); else ldmatrix_x1(r, &tiles[tile][row][0]);
  } else if (NMAT == 2) {
    if (TRANSPOSE) ldmatrix_x2_trans(r, &tiles[tile][row][0]); else ldmatrix_x2(r, &tiles[tile][row][0]);
  } else {
    if (TRANSPOSE) ldmatrix_x4_trans(r, &tiles[tile][row][0]); else ldmatrix_x4(r, &tiles[tile][row][0]);
  }
  for (int m = 0; m < NMAT; ++m) out[lane * NMAT + m] = r[m];
}

template <int NMAT, bool TRANSPOSE>
static void check_ldmatrix() {
  std::vector<uint16_t> bits(NMAT * 64);
  for (size_t i = 0; i < bits.size(); ++i) bits[i] = static_cast<uint16_t>(0x3F80 + i);  // distinct bf16 patterns
  std::vector<bf16> host(bits.size());
  std::memcpy(static_cast<void*>(host.data()), bits.data(), bits.size() * 2);
  test::DeviceBuffer<bf16> in(host);
  test::DeviceBuffer<uint32_t> out(32 * NMAT);
  launch(ldmatrix_kernel<NMAT, TRANSPOSE>, dim3(1), dim3(32), 0, nullptr, out.ptr, in.ptr);
  test::require_no_cuda_error();
  std::vector<uint32_t> got = out.download();
  for (int lane = 0; lane < 32; ++lane)
    for (int m = 0; m < NMAT; ++m) {
      const int r = lane / 4, c = 2 * (lane % 4);
      auto element = [&](int row, int col) {
        return TRANSPOSE ? bits[m * 64 + col * 8 + row] : bits[m * 64 + row * 8 + col];
      };
      const uint32_t want = element(r, c) | (static_cast<uint32_t>(element(r, c + 1)) << 16);
      INFO("lane " << lane << " matrix " << m << (TRANSPOSE ? " .trans" : ""));
      REQUIRE(got[lane * NMAT + m] == want);
    }
}

TEST_CASE("ldmatrix x1/x2/x4 with and without .trans follow the PTX fragment layout", "[mma]") {
  check_ldmatrix<1, false>();
  check_ldmatrix<2, false>();
  check_ldmatrix<4, false>();
  check_ldmatrix<1, true>();
  check_ldmatrix<2, true>();
  check_ldmatrix<4, true>();
}

// ---- 128-bit helpers round-trip, and the launch configuration limits a GPU enforces.
__global__ void copy128_kernel(bf16* out, const bf16* in, int n) {
  const int i = (blockIdx.x * blockDim.x + threadIdx.x) * Vec128<bf16>::size;
  if (i < n) store128(out + i, load128(in + i));
}

TEST_CASE("Vec128 loads and stores move 16 bytes", "[vec]") {
  const int n = 8 * 37;
  std::vector<bf16> host = test::from_floats<bf16>(test::random_floats(n, 9));
  test::DeviceBuffer<bf16> in(host);
  test::DeviceBuffer<bf16> out(n);
  launch(copy128_kernel, dim3(2), dim3(32), 0, nullptr, out.ptr, in.ptr, n);
  test::require_no_cuda_error();
  REQUIRE(test::to_floats(out.download()) == test::to_floats(host));
}

__global__ void noop_kernel(int* out) {
  if (out) out[0] = 1;
}

TEST_CASE("invalid launch configurations are reported, not run", "[launch]") {
  test::DeviceBuffer<int> out(1);
  CUDA_CHECK(cudaMemset(out.ptr, 0, sizeof(int)));
  launch(noop_kernel, dim3(1), dim3(1025), 0, nullptr, out.ptr);
  REQUIRE(cudaGetLastError() == cudaErrorInvalidConfiguration);
  launch(noop_kernel, dim3(1), dim3(32), 64 * 1024, nullptr, out.ptr);
  REQUIRE(cudaGetLastError() == cudaErrorInvalidValue);
  REQUIRE(out.download()[0] == 0);
  // Raising the limit makes the same launch legal.
  REQUIRE(cudaFuncSetAttribute(reinterpret_cast<const void*>(noop_kernel),
                               cudaFuncAttributeMaxDynamicSharedMemorySize, 64 * 1024) == cudaSuccess);
  launch(noop_kernel, dim3(1), dim3(32), 64 * 1024, nullptr, out.ptr);
  test::require_no_cuda_error();
  REQUIRE(out.download()[0] == 1);
}

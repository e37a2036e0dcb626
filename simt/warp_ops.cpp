// warp_ops.cpp — tensor-core and ldmatrix instructions, computed once per warp from the
// fragments every lane deposited. Fragment layouts follow the PTX ISA ("Matrix Fragments
// for mma.m16n8k16 with floating point type" and "ldmatrix"); g = lane / 4, t = lane % 4.
#include "simt.h"
#include "state.h"

#include <cstdio>
#include <string>

namespace simt {
namespace {

float bf16_low(uint32_t word) {
  uint32_t bits = word << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
float bf16_high(uint32_t word) {
  uint32_t bits = word & 0xFFFF0000u;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

[[noreturn]] void whole_warp_required(const WarpState& ws) {
  std::fprintf(stderr, "simt: %s needs all 32 lanes of the warp (arrived %08x)\n", ws.what, ws.arrived);
  std::abort();
}

}  // namespace

void mma_m16n8k16_bf16_fn(WarpState& ws) {
  if (ws.arrived != 0xFFFFFFFFu) whole_warp_required(ws);
  float a[16][16], b[16][8], c[16][8];
  for (int lane = 0; lane < kWarpSize; ++lane) {
    uint32_t in[10];
    std::memcpy(in, ws.in[lane], sizeof in);
    const int g = lane >> 2, t = lane & 3;
    for (int r = 0; r < 4; ++r) {  // A: a[r] holds row g + 8*(r%2), columns 2t + 8*(r/2) and +1
      const int row = g + 8 * (r % 2), col = 2 * t + 8 * (r / 2);
      a[row][col] = bf16_low(in[r]);
      a[row][col + 1] = bf16_high(in[r]);
    }
    for (int r = 0; r < 2; ++r) {  // B: b[r] holds rows k = 2t + 8r and +1 of column g
      const int k = 2 * t + 8 * r;
      b[k][g] = bf16_low(in[4 + r]);
      b[k + 1][g] = bf16_high(in[4 + r]);
    }
    for (int i = 0; i < 4; ++i) {  // C: c[i] is row g + 8*(i/2), column 2t + i%2
      float v;
      std::memcpy(&v, &in[6 + i], 4);
      c[g + 8 * (i / 2)][2 * t + i % 2] = v;
    }
  }
  for (int lane = 0; lane < kWarpSize; ++lane) {
    const int g = lane >> 2, t = lane & 3;
    float d[4];
    for (int i = 0; i < 4; ++i) {
      const int row = g + 8 * (i / 2), col = 2 * t + i % 2;
      float acc = c[row][col];
      // Products of two bf16 values are exact in fp32; only the sums round.
      for (int k = 0; k < 16; ++k) acc = std::fma(a[row][k], b[k][col], acc);
      d[i] = acc;
    }
    std::memcpy(ws.out[lane], d, sizeof d);
  }
}

void ldmatrix_fn(WarpState& ws) {
  if (ws.arrived != 0xFFFFFFFFu) whole_warp_required(ws);
  const int matrices = ws.param & 0xFF;
  const bool transpose = (ws.param >> 8) & 1;
  for (int m = 0; m < matrices; ++m) {
    uint16_t tile[8][8];
    for (int row = 0; row < 8; ++row) {  // lanes 8m..8m+7 give the rows of matrix m
      const void* address;
      std::memcpy(&address, ws.in[8 * m + row], sizeof address);
      if (!aligned16(address)) {
        report_kernel_fault(cudaErrorMisalignedAddress, ws.what, address, nullptr);
        std::memset(tile[row], 0, sizeof tile[row]);
        continue;
      }
      std::memcpy(tile[row], address, sizeof tile[row]);
    }
    for (int lane = 0; lane < kWarpSize; ++lane) {
      // Each lane receives elements (lane/4, 2*(lane%4)) and (lane/4, 2*(lane%4)+1), low half first;
      // .trans delivers the transposed tile.
      const int r = lane >> 2, c = 2 * (lane & 3);
      const uint16_t lo = transpose ? tile[c][r] : tile[r][c];
      const uint16_t hi = transpose ? tile[c + 1][r] : tile[r][c + 1];
      const uint32_t word = static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);
      std::memcpy(ws.out[lane] + 4 * m, &word, 4);
    }
  }
}

}  // namespace simt

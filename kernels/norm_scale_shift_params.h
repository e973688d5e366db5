// Launch parameters of the norm + scale/shift kernel. Plain data shared by the host op and the
// device code (built on the host, passed by value as a __grid_constant__ kernel argument).
#pragma once

namespace ditops {

// A broadcast operand of the row (scale, shift, gate): element (b, s, c) lives at
//   data + b*batch_stride + (s / frame_len)*frame_stride + s*token_stride + (vector ? c : 0).
// kind: 0 absent, 1 scalar (one element), 2 a [.., D] row per (b, frame, token) as the strides say.
struct NssOperandParams {
  const void* data;
  long long batch_stride;
  long long frame_stride;
  long long token_stride;
  long long frame_len;
  int kind;
};

// Field order: what a CTA's first loads need comes first. The parameters start at byte 0x210 of
// the constant bank on sm_90, so x .. r_token_stride share the 64-byte line at 0x200 with the
// global memory descriptor the loads use: each line's first touch is a constant-cache miss the
// warp waits for in order; before a row's first load there had been one for each of four lines,
// now two (with the division-free first row of eager_rows, H200 512 x 3072 rotated: plain 4.32 ->
// 4.20 us, fp8 5.14 -> 4.99, nvfp4 unchanged; docs/tuning/norm_scale_shift.md).
struct NormScaleShiftParams {
  const void* x;              // [B, S, D]
  const void* residual;       // [B, S, D] or null
  long long seq;              // S (rows of one batch)
  long long rows;             // B * S
  long long x_token_stride, r_token_stride;
  long long x_batch_stride, r_batch_stride;
  long long grid_rows;        // rows, or pad128(rows) for nvfp4 (padding rows write zero scales)
  const void* weight;         // [D] or null
  const void* bias;           // [D] or null
  const float* input_scale;   // fp8: one element
  const float* global_scale;  // nvfp4: one element
  void* y;                    // [B, S, D] or null (not stored)
  void* residual_out;         // [B, S, D] or null
  unsigned char* fp8;         // [B, S, D] or null
  unsigned char* fp4_packed;  // [rows, D/2]
  unsigned char* fp4_scales;  // [pad128(rows), D/16], 128x4 swizzled
  NssOperandParams scale, shift, gate;
  long long y_batch_stride, y_token_stride;
  long long ro_batch_stride, ro_token_stride;
  long long q_batch_stride, q_token_stride;
  float eps;
  int fp8_div_full;  // inv = div.full.f32(1, input_scale) (else IEEE division)
};

// A row's (batch, token) = (row / S, row % S), and its advance through a persistent loop that steps
// rows by `step` (the grid): a CTA divides its first row once and then adds step / S and step % S,
// carrying a token overflow into the batch (64-bit divisions per row had cost ~50 instructions of
// a plain row's ~700 per thread); rows of the first two batches need no division at all.
// Shared with the host so the CPU tests check it against division.
// (__host__ __device__ under nvcc and NVRTC: NVRTC rejects unannotated functions.)
struct NssRowPosition {
  long long b, s;
};
#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
__host__ __device__
#endif
inline NssRowPosition nss_row_position(long long row, long long seq) {
  // Rows of the first two batches (every row at B <= 2) without the division: a 64-bit division
  // is ~20 dependent uniform instructions with a MUFU.RCP in front of a CTA's first load.
  if (row < seq) return {0, row};
  if (row - seq < seq) return {1, row - seq};
  const long long b = row / seq;
  return {b, row - b * seq};
}
// `stride` is nss_row_position(step, seq): whole batches and the remaining tokens of one step.
#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
__host__ __device__
#endif
inline NssRowPosition nss_advance_row_position(NssRowPosition at, NssRowPosition stride, long long seq) {
  at.b += stride.b;
  at.s += stride.s;  // < 2 * seq
  if (at.s >= seq) {
    at.s -= seq;
    ++at.b;
  }
  return at;
}

}  // namespace ditops

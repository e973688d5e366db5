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

struct NormScaleShiftParams {
  const void* x;              // [B, S, D]
  const void* residual;       // [B, S, D] or null
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
  long long seq;  // S (rows of one batch)
  long long rows;  // B * S
  long long grid_rows;  // rows, or pad128(rows) for nvfp4 (padding rows write zero scales)
  long long x_batch_stride, x_token_stride;
  long long r_batch_stride, r_token_stride;
  long long y_batch_stride, y_token_stride;
  long long ro_batch_stride, ro_token_stride;
  long long q_batch_stride, q_token_stride;
  float eps;
  int fp8_div_full;  // inv = div.full.f32(1, input_scale) (else IEEE division)
};

}  // namespace ditops

// Launch parameters of the LayerNorm + modulate kernels. Plain data shared by the host op and
// the device code (passed by value as a __grid_constant__ kernel argument).
#pragma once

namespace ditops {

struct LayerNormModulateParams {
  const void* x;               // bf16 [B, S, D]
  void* out;                   // bf16 or fp8 e4m3 [B, S, D]
  const void* scale;           // bf16 [B, D], row stride scale_row_stride
  const void* shift;           // bf16 [B, D] or nullptr (then the kernel is built without it)
  const float* input_scale;    // fp8: one fp32 value
  float* stats;                // [rows, 2] (mean, rstd) or nullptr
  long long rows;              // B * S
  long long seq;               // S
  long long x_batch_stride;    // elements
  long long x_token_stride;
  long long out_batch_stride;
  long long out_token_stride;
  long long scale_row_stride;
  long long shift_row_stride;
  int n_vec;                   // D / 4
  float eps;
};

// Per-head LayerNorm of q and k: rows are (token, head), q's rows first, then k's.
struct QkHeadLayerNormParams {
  const void* q;
  void* q_out;
  const void* k;
  void* k_out;
  long long q_rows;            // tokens * Hq
  long long total_rows;        // q_rows + tokens * Hk
  long long q_token_stride, q_head_stride, q_out_token_stride, q_out_head_stride;
  long long k_token_stride, k_head_stride, k_out_token_stride, k_out_head_stride;
  int q_heads;
  int k_heads;
  int n_vec;                   // Dh / 4
  float eps;
};

// The GPU test's check of the shared primitives (rcp4, aten_rsqrtf).
struct AtenLnSelfcheckParams {
  float* rcp;              // [count]: rcp4(n) for n = 1..count
  const float* rsqrt_in;   // [rsqrt_count]
  float* rsqrt_out;        // [2 * rsqrt_count]: aten_rsqrtf, aten_rsqrtf_explicit
  int count;
  int rsqrt_count;
};

}  // namespace ditops

// Launch parameters of the fused QK RMSNorm + RoPE kernel. Plain data, shared by the host op and
// the device code (built by the host, passed by value as a __grid_constant__ kernel argument).
#pragma once

namespace ditops {

struct QkNormRopeParams {
  void* q;                      // [T, Hq, D]
  void* k_shifted;              // k base moved back by Hq head strides: head h >= Hq of the
                                // combined (q | k) head index addresses k[:, h - Hq]
  const void* q_weight;         // [D]
  const void* k_weight;         // [D]
  const void* cos_sin_cache;    // [P, width], row stride cache_row_stride
  const void* positions;        // [T], stride positions_stride
  long long num_tokens;
  long long q_token_stride;     // elements
  long long k_token_stride;     // elements
  long long head_stride;        // elements, shared by q and k
  long long cache_row_stride;   // elements
  long long positions_stride;   // elements
  int num_q_heads;
  int num_heads;                // Hq + Hk
  // Grid-stride advance of one head slot, pre-divided on the host so the loop has no division:
  // the slot's work index moves by work_stride = token_step * num_heads + head_step.
  long long token_step;
  int head_step;
  float eps;
};

}  // namespace ditops

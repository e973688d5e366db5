/* A C ABI over the facade, for FFI callers (Python ctypes, other languages). Tensors are DLPack
   DLTensors; errors come back as a non-zero return and the message in `error` (NUL-terminated,
   truncated to error_size). */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "ditops/dlpack.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
  int32_t is_neox;
  float eps;
  int32_t rope_dim;          /* 0: from the cache width */
  int32_t cache_full_width;
  int32_t rounding;          /* 0 rounded, 1 fp32 */
  int32_t norm_order;        /* 0 aten, 1 warp */
  int32_t use_pdl;
  const char* backend;       /* NULL or "kda"/"aot"/"jit"/"vendor"/"reference" */
  const char* quality;       /* NULL or "lossless"/"high"/"extra-high" */
} ditops_qknorm_rope_options;

/* Runs the op; writes the implementation name that ran into `impl` (may be NULL). */
int ditops_qknorm_rope(const DLTensor* q, const DLTensor* k, const DLTensor* q_weight,
                       const DLTensor* k_weight, const DLTensor* cos_sin_cache,
                       const DLTensor* positions, const ditops_qknorm_rope_options* options,
                       void* stream, char* impl, size_t impl_size, char* error, size_t error_size);

/* The dispatch table for the same call, without running it. */
int ditops_qknorm_rope_explain(const DLTensor* q, const DLTensor* k, const DLTensor* q_weight,
                               const DLTensor* k_weight, const DLTensor* cos_sin_cache,
                               const DLTensor* positions, const ditops_qknorm_rope_options* options,
                               char* report, size_t report_size, char* error, size_t error_size);

/* Registry listing as text (one line per implementation). */
int ditops_list_kernels(char* out, size_t out_size);

const char* ditops_version(void);

/* residual_gate_add: out = residual + update * gate (include/ditops/residual_gate_add.h). out is
   caller-allocated with residual's shape and strides and must not overlap any input. */
typedef struct {
  int32_t use_pdl;
  const char* backend;       /* NULL or "kda"/"aot"/"jit"/"vendor"/"reference" */
  const char* quality;       /* NULL or "lossless"/"high"/"extra-high" */
} ditops_residual_gate_add_options;

int ditops_residual_gate_add(const DLTensor* residual, const DLTensor* update, const DLTensor* gate,
                             const DLTensor* out, const ditops_residual_gate_add_options* options,
                             void* stream, char* impl, size_t impl_size, char* error, size_t error_size);

int ditops_residual_gate_add_explain(const DLTensor* residual, const DLTensor* update,
                                     const DLTensor* gate, const DLTensor* out,
                                     const ditops_residual_gate_add_options* options, char* report,
                                     size_t report_size, char* error, size_t error_size);

/* layernorm_modulate family (include/ditops/layernorm_modulate.h): LayerNorm without affine, then
   * (1 + scale) (+ shift), bit-exact with the eager PyTorch chain; the fp8 e4m3 output variant;
   per-head QK LayerNorm. Outputs are caller-allocated. shift may be NULL (no add). */
typedef struct {
  float eps;
  int32_t fp8_reciprocal;    /* 0 ieee (eager 1.0/input_scale), 1 div_full (SGLang's quantizer) */
  int32_t mapping;           /* 0 automatic, 1 warp per row, 2 CTA per row */
  int32_t use_pdl;
  const char* backend;       /* NULL or "kda"/"aot"/"jit"/"vendor"/"reference" */
  const char* quality;       /* NULL or "lossless"/"high"/"extra-high" */
} ditops_layernorm_modulate_options;

int ditops_layernorm_modulate(const DLTensor* x, const DLTensor* scale, const DLTensor* shift,
                              const DLTensor* out, const ditops_layernorm_modulate_options* options,
                              void* stream, char* impl, size_t impl_size, char* error, size_t error_size);

int ditops_layernorm_modulate_fp8(const DLTensor* x, const DLTensor* scale, const DLTensor* shift,
                                  const DLTensor* input_scale, const DLTensor* out,
                                  const ditops_layernorm_modulate_options* options, void* stream,
                                  char* impl, size_t impl_size, char* error, size_t error_size);

int ditops_qk_head_layernorm(const DLTensor* q, const DLTensor* k, const DLTensor* q_out,
                             const DLTensor* k_out, const ditops_layernorm_modulate_options* options,
                             void* stream, char* impl, size_t impl_size, char* error, size_t error_size);

/* Dispatch table without running: input_scale NULL explains layernorm_modulate, else the fp8 op. */
int ditops_layernorm_modulate_explain(const DLTensor* x, const DLTensor* scale, const DLTensor* shift,
                                      const DLTensor* input_scale, const DLTensor* out,
                                      const ditops_layernorm_modulate_options* options, char* report,
                                      size_t report_size, char* error, size_t error_size);

/* norm_scale_shift (include/ditops/norm_scale_shift.h): [gated residual +] LayerNorm/RMSNorm
   [+ affine] * (1 + scale) + shift [-> fp8 | nvfp4]. Every tensor pointer may be NULL where the
   op takes the tensor as optional; outputs are caller-allocated. */
typedef struct {
  const DLTensor* x;
  const DLTensor* residual;
  const DLTensor* gate;
  const DLTensor* weight;
  const DLTensor* bias;
  const DLTensor* scale;
  const DLTensor* shift;
  const DLTensor* input_scale;
  const DLTensor* global_scale;
  const DLTensor* y;
  const DLTensor* residual_out;
  const DLTensor* fp8;
  const DLTensor* nvfp4_packed;
  const DLTensor* nvfp4_scales;
} ditops_norm_scale_shift_tensors;

typedef struct {
  int32_t norm_type;         /* 0 layer, 1 rms */
  float eps;
  int32_t numerics;          /* 0 eager (PyTorch chain), 1 sglang (spec §2.3 chain) */
  int32_t fp8_reciprocal;    /* 0 ieee (eager 1.0/input_scale), 1 div_full (SGLang's quantizer) */
  int32_t e2m1;              /* 0 automatic, 1 software, 2 hardware */
  int32_t use_pdl;
  const char* backend;       /* NULL or "kda"/"aot"/"jit"/"vendor"/"reference" */
  const char* quality;       /* NULL or "lossless"/"high"/"extra-high" */
} ditops_norm_scale_shift_options;

int ditops_norm_scale_shift(const ditops_norm_scale_shift_tensors* tensors,
                            const ditops_norm_scale_shift_options* options, void* stream, char* impl,
                            size_t impl_size, char* error, size_t error_size);

int ditops_norm_scale_shift_explain(const ditops_norm_scale_shift_tensors* tensors,
                                    const ditops_norm_scale_shift_options* options, char* report,
                                    size_t report_size, char* error, size_t error_size);

#ifdef __cplusplus
}
#endif

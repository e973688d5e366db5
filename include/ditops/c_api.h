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

#ifdef __cplusplus
}
#endif

// cuBLASLt, loaded at run time with dlopen as the CUDA driver and NVRTC are (src/jit): libditops
// starts where the library is missing, and the vendor implementations then report why they are
// unavailable. Only the handful of entry points the FP8 matmul needs are resolved, through
// function pointers typed from the toolkit's cublasLt.h.
#pragma once

#include <cublasLt.h>
#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace ditops::vendor {

#define DITOPS_CUBLASLT_FUNCTIONS(X)                                                                       \
  X(cublasLtCreate) X(cublasLtGetVersion) X(cublasLtGetStatusName) X(cublasLtGetStatusString)              \
  X(cublasLtMatmulDescCreate) X(cublasLtMatmulDescDestroy) X(cublasLtMatmulDescSetAttribute)               \
  X(cublasLtMatrixLayoutCreate) X(cublasLtMatrixLayoutDestroy) X(cublasLtMatmulPreferenceCreate)           \
  X(cublasLtMatmulPreferenceDestroy) X(cublasLtMatmulPreferenceSetAttribute) X(cublasLtMatmulAlgoGetHeuristic) \
  X(cublasLtMatmul)

struct CublasLt {
#define DITOPS_DECLARE_CUBLASLT_FN(name) decltype(&::name) name = nullptr;
  DITOPS_CUBLASLT_FUNCTIONS(DITOPS_DECLARE_CUBLASLT_FN)
#undef DITOPS_DECLARE_CUBLASLT_FN
  size_t version = 0;   // cublasLtGetVersion(): major*10000 + minor*100 + patch
  std::string library;  // the name that loaded
};

// The names tried, in order: the CUDA 13 soname, the unversioned development link, and the
// toolkit's default location (as NVRTC is looked up).
const std::vector<std::string>& cublaslt_library_names();

// Loads the first of `names` that dlopen finds and resolves every entry point. False, with `why`
// naming each library tried and dlopen's message ("libcublasLt.so.13 not found: ..."), or the
// missing symbol, when it cannot. Not cached: each call dlopens again (tests use it with other
// names); the library stays loaded.
bool load_cublaslt(const std::vector<std::string>& names, CublasLt* out, std::string* why);

// The process-wide cuBLASLt from cublaslt_library_names(), loaded once (thread-safe), or nullptr
// with `why` ("cuBLASLt unavailable: ...").
const CublasLt* cublaslt(std::string* why = nullptr);

// Throws ditops::Error("<what>: CUBLAS_STATUS_xxx (text)") unless status is CUBLAS_STATUS_SUCCESS.
void check_cublaslt(cublasStatus_t status, const char* what);

// The FP8 product torch._scaled_mm computes for out = x @ w.T with per-tensor scales:
//   out[m, n] = bf16(x_scale * w_scale * sum_k x[m, k] * w[n, k] (+ bias[n]))
// x e4m3 [tokens, k] and w e4m3 [n, k], both row-major; out bf16 [tokens, n] row-major; bias
// bf16 [n] or nullptr; the scales are fp32 device pointers (read by the kernel, so a graph replay
// sees new values). Column-major cuBLASLt sees it transposed: D[n, tokens] = op(A) B with
// A = w (k x n, ld k, TRANSA = T), B = x (k x tokens, ld k, TRANSB = N), D ld n: the TN layout
// FP8 requires. Fast accumulation off, the bias through CUBLASLT_EPILOGUE_BIAS.
struct Fp8MatmulArgs {
  int device = 0;
  CUstream stream = nullptr;
  const void* x = nullptr;
  const void* w = nullptr;
  const float* x_scale = nullptr;
  const float* w_scale = nullptr;
  const void* bias = nullptr;
  void* out = nullptr;
  int64_t tokens = 0, n = 0, k = 0;
};

// Runs it on args.stream. The handle is created once per device, the workspace (and the scratch
// below) allocated once per (device, stream), the descriptors and the heuristic's algorithm once
// per (device, tokens, n, k, bias); a call then only sets the three pointer attributes (under the
// plan's lock) and enqueues: no allocation, no synchronization. The first call on a stream must
// not be inside a graph capture (it allocates). Throws Error on any cuBLASLt or driver failure.
void fp8_matmul(const Fp8MatmulArgs& args);

// Per (device, stream) device memory beside the workspace, for the quantized activations of a
// 16-bit x (kScratchBytes, allocated with the workspace on first use).
constexpr size_t kScratchBytes = size_t{4} << 20;
void* stream_scratch(int device, CUstream stream);

// The workspace cuBLASLt may use on a device of compute capability `sm`: 32 MiB from sm_90 on,
// 4 MiB before, the sizes the cuBLAS documentation recommends (cublasSetWorkspace) for Hopper and
// newer vs older GPUs; the heuristic only picks algorithms that fit it.
size_t workspace_bytes(int sm);

}  // namespace ditops::vendor

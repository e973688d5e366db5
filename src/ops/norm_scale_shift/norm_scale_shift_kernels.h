// The template key of the norm + scale/shift kernel and the kernel request it maps to. Pure data:
// shared by the op and the tests (NVRTC compile of every key for sm_90a / sm_100a / sm_120a).
#pragma once

#include <cstdint>
#include <string>

#include "ditops/norm_scale_shift.h"
#include "jit/kernel_request.h"

namespace ditops {

// The kernel's kQuant (kernels/norm_scale_shift.cuh: kQuantNone .. kQuantFp8Rowwise).
enum class NssKernelQuant : uint8_t { none, fp8, fp4_software, fp4_hardware, fp8_rowwise };

struct NssKernelKey {
  DType act = DType::bf16;
  int dim = 3072;
  NormType norm = NormType::layer;
  NssNumerics numerics = NssNumerics::eager;
  bool mean_order = false;  // norm=rms with norm_order=aten_mean
  bool residual = false;
  int affine = 0;  // 0 none, 1 weight, 2 weight + bias
  NssKernelQuant quant = NssKernelQuant::none;
  bool pdl = true;
  // numerics=float32: whether scale / shift are held and applied (false: y = norm(v) alone, e.g.
  // Wan's norm2). Always true for the other numerics (an absent scale is a 0 there).
  bool modulate = true;

  // "bf16,D=3072,layer,eager,residual,affine=0,fp4sw,pdl" / "bf16,D=5120,layer,float32,residual,affine=2,noquant,pdl,nomod";
  // the mean order adds ",mean" after the norm
  std::string to_string() const;
  uint64_t packed() const;  // unique small integer (memo key)
};

constexpr int kNssMaxThreads = 128;  // eager: one row per 128-thread CTA (unless split); sglang: up to 4 rows (warps)

// The eager kernel's persistent-loop knobs, a function of the key (measured; norm_scale_shift_op.cpp):
// load the next row before the current row's statistics, hold the scale / shift / gate rows in
// shared memory instead of registers, __launch_bounds__' minimum resident CTAs per SM (0: ptxas
// decides), and the threads per aten thread (split: a row on a CTA of 128 * split threads).
struct NssEagerSchedule {
  bool prefetch = false;
  bool shared_operands = false;
  int min_blocks = 0;
  int split = 1;
  bool stream_operands = false;  // the float32 chain's widest rows: operands loaded at each use
};
NssEagerSchedule nss_eager_schedule(const NssKernelKey& key);

KernelRequest nss_kernel_request(const NssKernelKey& key);

}  // namespace ditops

#include "ops/norm_scale_shift/norm_scale_shift_kernels.h"

namespace ditops {

const char* norm_type_name(NormType type) { return type == NormType::layer ? "layer" : "rms"; }

const char* nss_numerics_name(NssNumerics numerics) {
  return numerics == NssNumerics::eager ? "eager" : "sglang";
}

const char* nss_operand_kind_name(NssOperand::Kind kind) {
  switch (kind) {
    case NssOperand::Kind::absent: return "absent";
    case NssOperand::Kind::scalar: return "scalar";
    case NssOperand::Kind::channel: return "per-channel [D]";
    case NssOperand::Kind::batch: return "per-batch [B, D]";
    case NssOperand::Kind::token: return "per-token [B, S, D]";
    case NssOperand::Kind::frame: return "per-frame [B, F, 1, D]";
  }
  return "?";
}

namespace {
const char* quant_name(NssKernelQuant q) {
  switch (q) {
    case NssKernelQuant::none: return "noquant";
    case NssKernelQuant::fp8: return "fp8";
    case NssKernelQuant::fp4_software: return "fp4sw";
    case NssKernelQuant::fp4_hardware: return "fp4hw";
  }
  return "?";
}
}  // namespace

std::string NssKernelKey::to_string() const {
  return std::string(dtype_name(act)) + ",D=" + std::to_string(dim) + "," + norm_type_name(norm) + "," +
         nss_numerics_name(numerics) + (residual ? ",residual" : ",plain") + ",affine=" + std::to_string(affine) +
         "," + quant_name(quant) + (pdl ? ",pdl" : ",nopdl");
}

uint64_t NssKernelKey::packed() const {
  uint64_t v = static_cast<uint64_t>(act);
  v = v * 16384 + static_cast<uint64_t>(dim);
  v = v * 2 + (norm == NormType::rms);
  v = v * 2 + (numerics == NssNumerics::sglang);
  v = v * 2 + residual;
  v = v * 4 + static_cast<uint64_t>(affine);
  v = v * 4 + static_cast<uint64_t>(quant);
  v = v * 2 + pdl;
  return v;
}

NssEagerSchedule nss_eager_schedule(const NssKernelKey& key) {
  // Register words of a thread's vec4 slots: D/4 vectors over 128 threads, 2 words per bf16/f16
  // vector, 4 per fp32 one (counted here in 16-bit slots).
  const int slots = (key.dim / 4 + 127) / 128 * (key.act == DType::f32 ? 2 : 1);
  // bench/experiments/adaln_tune.cu on the H200 (2026-11-29, cold L2, % of a copy of the same
  // bytes; bench/results/2026-11-29-h200-runs/11-tune):
  //   Qwen CFG (2,6912,3072) residual, 6 slots: (128,6) no prefetch 90.1 %; prefetch at ptxas'
  //     190 registers 69.9 %, (128,4) 89.0 %, (128,6) spills 68.7 %; plain: (128,6) 83.3 %
  //     against 81.0 % with prefetch and 69.5 % at ptxas' choice (128 registers).
  //   Wan (1,32760,5120) residual, 10 slots: prefetch (128,3) 92.2 %; no prefetch at ptxas' 234
  //     registers 85.4 %, (128,6) spills 71.3 %; plain: no prefetch (128,6) 88.5 %, prefetch
  //     (128,4) 84.4 %.
  // Wider rows (fp32, D > 5120) are not measured: ptxas decides, no prefetch.
  // Run 33 (79b1330, operands loaded before conversion): ptxas took 80 registers at (128,6) for
  // plain D=3072, 6 CTAs per SM where it had taken 72 (7 CTAs), and Qwen CFG plain ran 51.36 us
  // against 48.69 in run 23; (128,7) fits plain and residual D=3072 in 72 registers without
  // spills (nvcc -Xptxas -v on the harness); fp8 keys keep 6 (not re-measured).
  // NVFP4 rows are issue-bound (the software block scale and E2M1 per element), so they trade
  // registers for occupancy differently (run 38 at 350fef5, residual rows, cold us): FLUX (128,5)
  // 39.39 against (128,6) 40.70, (128,7) 42.27 (spills) and (128,4) 43.42; Qwen CFG (128,5) 104.29 against
  // (128,6) 107.42; Wan (10 slots) no prefetch (128,4) 378.1 against prefetch (128,3) 418.0 and
  // (128,5) 455.3 (spills); 512 x 3072 (128,5) 10.62 against (128,6) 10.85. The hardware
  // conversion (sm_100a / sm_120a, compiled, not run) takes the same schedule, unmeasured.
  // Run 46 (dd9f6cd: E2M1 by one add, constant slot offsets; bench/results/2026-11-29-h200-runs/
  // 46-tune-dd9f6cd), the held scale / shift / gate rows in shared memory (72 registers at
  // (128,7), none spilled), cold us: a win only at 10 slots: Wan nvfp4 (128,5) shared 308.06
  // against (128,4) in registers 321.41 (shared (128,6) 320.16, (128,7) 366.50); Wan plain
  // shared + prefetch (128,5) 175.90 against 179.65 (rotated 176.58 against 185.79). Lost at 6
  // slots (FLUX nvfp4 best shared 36.16 against 34.82; FLUX plain 21.25 against 20.42) and for Wan
  // residual rows (355.39 against prefetch (128,3) 347.07). Measured for 16-bit rows only.
  // Run 50-51 (bench/results/2026-11-29-h200-runs/50-tune-split, 51-tune-split-ncu-source; cold
  // us, harness): the packed residual product (fcd8ab4) made (128,7) spill 24 bytes for residual
  // rows at D = 3072; split over 256 threads (aten_row_stats_cta_split), (256,4) 64 registers:
  // FLUX 35.33 -> 34.30, Qwen CFG 95.49 -> 90.98, 512 x 3072 rotated 7.24 -> 6.94; (128,6)
  // 34.85 / 92.13 / 6.89. Split lost for plain rows (512: 7.52 against 7.39) and NVFP4 rows (the
  // issue-bound rows gain nothing from shorter chains: FLUX 42.14 against 33.57, 512 10.56 against
  // 9.98; (256,2), (256,3), (384,x), (768,x) lost more), and fewer CTAs with more rows each lost
  // at 512 x 3072 (2 rows per CTA with prefetch: nvfp4 10.27 against 9.98).
  const bool nvfp4 = key.quant == NssKernelQuant::fp4_software || key.quant == NssKernelQuant::fp4_hardware;
  const bool half = key.act != DType::f32;
  NssEagerSchedule s;
  if (slots == 6 && half && key.residual && key.quant == NssKernelQuant::none && key.dim % 512 == 0) {
    s.split = 2;
    s.min_blocks = 4;
  } else if (slots <= 6) {
    s.min_blocks = nvfp4 ? 5 : key.quant == NssKernelQuant::none ? 7 : 6;
  } else if (slots <= 10) {
    if (nvfp4 || (half && key.quant == NssKernelQuant::none && !key.residual)) {  // NVFP4: 16-bit only
      s.shared_operands = true;
      s.prefetch = !nvfp4;
      s.min_blocks = 5;
    } else {
      s.prefetch = key.residual;
      s.min_blocks = key.residual ? 3 : 6;
    }
  }
  return s;
}

jit::KernelRequest nss_kernel_request(const NssKernelKey& key) {
  jit::KernelRequest r;
  r.header = "norm_scale_shift.cuh";
  r.function = "ditops::norm_scale_shift_body";
  r.template_args = std::string(jit::kernel_type_name(key.act)) + ", " + std::to_string(key.dim) + ", " +
                    jit::kernel_bool(key.norm == NormType::rms) + ", " + jit::kernel_bool(key.numerics == NssNumerics::sglang) + ", " +
                    jit::kernel_bool(key.residual) + ", " + std::to_string(key.affine) + ", " +
                    std::to_string(static_cast<int>(key.quant)) + ", " + jit::kernel_bool(key.pdl);
  r.params_type = "ditops::NormScaleShiftParams";
  r.max_threads = kNssMaxThreads;
  if (key.numerics == NssNumerics::eager) {
    const NssEagerSchedule schedule = nss_eager_schedule(key);
    r.template_args += std::string(", ") + jit::kernel_bool(schedule.prefetch) + ", " +
                       jit::kernel_bool(schedule.shared_operands) + ", " + std::to_string(schedule.split);
    r.min_blocks = schedule.min_blocks;
    r.max_threads = kNssMaxThreads * schedule.split;
  }
  r.template_key = "norm_scale_shift:" + key.to_string();
  return r;
}

}  // namespace ditops

#include "ops/norm_scale_shift/norm_scale_shift_kernels.h"

namespace ditops {

const char* norm_type_name(NormType type) { return type == NormType::layer ? "layer" : "rms"; }

const char* nss_numerics_name(NssNumerics numerics) {
  switch (numerics) {
    case NssNumerics::eager: return "eager";
    case NssNumerics::sglang: return "sglang";
    case NssNumerics::float32: return "float32";
  }
  return "?";
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
         "," + quant_name(quant) + (pdl ? ",pdl" : ",nopdl") + (modulate ? "" : ",nomod");
}

uint64_t NssKernelKey::packed() const {
  uint64_t v = static_cast<uint64_t>(act);
  v = v * 16384 + static_cast<uint64_t>(dim);
  v = v * 2 + (norm == NormType::rms);
  v = v * 4 + static_cast<uint64_t>(numerics);
  v = v * 2 + residual;
  v = v * 4 + static_cast<uint64_t>(affine);
  v = v * 4 + static_cast<uint64_t>(quant);
  v = v * 2 + pdl;
  v = v * 2 + modulate;
  return v;
}

namespace {

// The float32 chain (16-bit x, fp32 operands): the 16-bit rows' schedule where its fp32 operands
// fit, held in shared memory or not held where registers would not hold them. Not measured yet
// (no device run): chosen so that ptxas spills nothing for sm_90a at any width (nvcc -Xptxas -v;
// docs/tuning/norm_scale_shift.md has the register counts).
NssEagerSchedule float32_schedule(const NssKernelKey& key) {
  const int slots = (key.dim / 4 + 127) / 128;
  NssEagerSchedule s;
  if (slots <= 3) {  // Wan 1.3B (D = 1536): 64-80 registers
    s.min_blocks = key.residual && key.modulate ? 6 : 7;
  } else if (slots <= 6) {  // fp32 scale and shift take 8 registers a slot
    s.min_blocks = !key.modulate ? 7 : (key.residual ? 4 : 5) - (key.affine ? 1 : 0);
  } else if (slots <= 10) {
    // As the 16-bit rows (Wan 14B, D = 5120): plain rows hold scale and shift (2 x 20 KB fp32) in
    // shared memory and prefetch at (128,5); residual rows prefetch at (128,3) with the gate in
    // registers (168 registers), scale and shift in shared memory.
    s.prefetch = true;
    s.shared_operands = key.modulate;
    s.min_blocks = key.residual ? 3 : 5;
  } else {
    s.stream_operands = true;  // 16 slots of fp32 scale and shift would take 128 registers
  }
  return s;
}

}  // namespace

NssEagerSchedule nss_eager_schedule(const NssKernelKey& key) {
  if (key.numerics == NssNumerics::float32) return float32_schedule(key);
  // Register words of a thread's vec4 slots: D/4 vectors over 128 threads, 2 words per bf16/f16
  // vector, 4 per fp32 one (counted here in 16-bit slots).
  const int slots = (key.dim / 4 + 127) / 128 * (key.act == DType::f32 ? 2 : 1);
  // H200, cold, % of a copy (docs/tuning/norm_scale_shift.md has every alternative):
  //   6 slots: (128,7) plain / residual (72 registers, no spill), fp8 (128,6); Qwen CFG residual
  //     no prefetch 90.1 % against 89.0 % prefetched; residual D % 512 == 0 split over 256
  //     threads at (256,4): FLUX 34.30 us against 35.33 at (128,7), which spills 24 bytes.
  //   NVFP4 (issue-bound): (128,5), FLUX 39.39 us against 40.70 at (128,6).
  //   10 slots: residual prefetch (128,3) 92.2 % against 85.4 %; NVFP4 and plain 16-bit rows hold
  //     scale / shift / gate in shared memory at (128,5): Wan nvfp4 308.1 us against 321.4.
  //   Wider rows (fp32, D > 5120) are not measured: ptxas decides, no prefetch.
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
  if (key.numerics != NssNumerics::sglang) {
    const NssEagerSchedule schedule = nss_eager_schedule(key);
    r.template_args += std::string(", ") + jit::kernel_bool(schedule.prefetch) + ", " +
                       jit::kernel_bool(schedule.shared_operands) + ", " + std::to_string(schedule.split);
    if (key.numerics == NssNumerics::float32)
      r.template_args += std::string(", true, ") + jit::kernel_bool(key.modulate) + ", " +
                         jit::kernel_bool(schedule.stream_operands);
    r.min_blocks = schedule.min_blocks;
    r.max_threads = kNssMaxThreads * schedule.split;
  }
  r.template_key = "norm_scale_shift:" + key.to_string();
  return r;
}

}  // namespace ditops

// The shape whitelist of fp8_linear's specialized kernels: data only (docs/fp8_linear.md).
//
// An entry names the shapes to be measured against cuBLASLt (bench/fp8_linear_torch.py on the
// H200). `measured` stays nullptr until a committed benchmark record shows the kernel faster at
// that (K, N, M); dispatch chooses the kernels only for measured entries.
#include <vector>

#include "ditops/fp8_linear.h"

namespace ditops {

namespace {

constexpr uint32_t ms(std::initializer_list<int> list) {
  uint32_t mask = 0;
  for (int m : list) mask |= 1u << m;
  return mask;
}

// SGLang's FP8 decode shapes (its sm120_fp8 path's model table) at the M set, and the DiT adaLN modulation
// linears (with bias) at M in {1, 2}: one conditioning vector per sample, batch 1 or 2 (CFG).
constexpr uint32_t kDecodeM = ms({1, 2, 3, 4, 8, 9, 16});
constexpr uint32_t kAdalnM = ms({1, 2});

}  // namespace

const std::vector<Fp8LinearShape>& fp8_linear_whitelist() {
  static const std::vector<Fp8LinearShape> table = {
      {5120, 8192, kDecodeM, false, "Qwen3.8-27B attention qkv (SGLang sm120_fp8)", nullptr},
      {5120, 5120, kDecodeM, false, "Qwen3-14B attention o (SGLang sm120_fp8)", nullptr},
      {5120, 7168, kDecodeM, false, "Qwen3-14B attention qkv (SGLang sm120_fp8)", nullptr},
      {5120, 16384, kDecodeM, false, "Qwen3.8-27B GDN in-proj (SGLang sm120_fp8)", nullptr},
      {5120, 34816, kDecodeM, false, "Qwen3-14B / Qwen3.8 MLP gate-up (SGLang sm120_fp8)", nullptr},
      {6144, 5120, kDecodeM, false, "Qwen3.8-27B attention out-proj (SGLang sm120_fp8)", nullptr},
      {4096, 4096, kDecodeM, false, "Qwen3-8B / Llama-3.1-8B attention o (SGLang sm120_fp8)", nullptr},
      {4096, 5376, kDecodeM, false, "Nemotron-3-Super shared-up (SGLang sm120_fp8 skinny gate)", nullptr},
      {5376, 4096, kDecodeM, false, "Nemotron-3-Super (an SGLang test shape, a fallback there)", nullptr},
      {3072, 18432, kAdalnM, true, "FLUX.1 double-block / Qwen-Image adaLN modulation (6 x 3072)", nullptr},
      {3072, 9216, kAdalnM, true, "FLUX.1 single-block adaLN modulation (3 x 3072)", nullptr},
      {6144, 36864, kAdalnM, true, "FLUX.2 double-block adaLN modulation (6 x 6144)", nullptr},
      {6144, 18432, kAdalnM, true, "FLUX.2 single-block adaLN modulation (3 x 6144)", nullptr},
      {5120, 30720, kAdalnM, true, "Wan adaLN modulation (6 x 5120)", nullptr},
  };
  return table;
}

const Fp8LinearShape* fp8_linear_whitelisted(int64_t k, int64_t n, int64_t m) {
  if (m < 0 || m > 31) return nullptr;
  for (const Fp8LinearShape& s : fp8_linear_whitelist())
    if (s.k == k && s.n == n && (s.m_mask >> m & 1u)) return &s;
  return nullptr;
}

}  // namespace ditops

// The template key of the fused QK RMSNorm + RoPE kernel, the kernel request it maps to, and the
// keys prebuilt at build time, shared by the op and the AOT generator; the key and option rules
// of a call, shared with joint_qknorm_rope.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/matcher.h"
#include "ditops/qknorm_rope.h"
#include "jit/kernel_request.h"

namespace ditops {

struct QkKernelKey {
  DType act = DType::bf16;
  DType cache = DType::f32;
  DType pos = DType::i64;
  int head_dim = 128;
  int rope_dim = 128;
  bool neox = false;
  bool full_width = false;
  QkRounding rounding = QkRounding::rounded;
  QkNormOrder order = QkNormOrder::aten;
  QkNormWeightRounding weight_rounding = QkNormWeightRounding::once;
  bool complex_product = false;  // rope_product=complex
  bool pdl = true;
  bool aligned = true;  // 16-byte vector access

  // "bf16,cache=f32,pos=i64,D=128,R=128,interleaved,compact,rounded,aten,pdl,vec16"; a twice
  // weight rounding adds ",twice" after the order, the complex product ",complex" after that.
  std::string to_string() const;
  uint64_t packed() const;  // unique small integer (memo key)
};

KernelRequest qk_kernel_request(const QkKernelKey& key);

// The key of a call's options and tensors (shared with joint_qknorm_rope, which runs the same
// per-head code).
QkKernelKey qk_kernel_key(const QkNormRopeOptions& options, DType act, DType cache, DType pos, int head_dim,
                          int rope_dim, bool aligned16, const DeviceInfo& device);

// The option rules of a call with head_dim D and this cache (rope_dim against the cache width,
// the modes' combinations, eps): fails through `m`; returns the rope_dim the options give.
int qk_option_rules(const Matcher& m, const QkNormRopeOptions& options, int64_t D, const TensorView& cos_sin_cache);

// Keys compiled to cubins at build time (aot): the model shapes of the benchmark.
std::vector<QkKernelKey> qk_prebuilt_keys();

}  // namespace ditops

#include "ops/qknorm_rope/qknorm_rope_kernels.h"

namespace ditops {

const char* qk_rounding_name(QkRounding rounding) {
  return rounding == QkRounding::rounded ? "rounded" : "fp32";
}

const char* qk_norm_order_name(QkNormOrder order) {
  switch (order) {
    case QkNormOrder::aten: return "aten";
    case QkNormOrder::warp: return "warp";
    case QkNormOrder::aten_mean: return "aten_mean";
  }
  return "?";
}

const char* qk_norm_weight_rounding_name(QkNormWeightRounding rounding) {
  return rounding == QkNormWeightRounding::twice ? "twice" : "once";
}

namespace {
// The kernel's sum-of-squares constant (kernels/qknorm_rope_params.h) of an order.
const char* sum_order_constant(QkNormOrder order) {
  switch (order) {
    case QkNormOrder::aten: return "ditops::kQkSumAten";
    case QkNormOrder::warp: return "ditops::kQkSumWarp";
    case QkNormOrder::aten_mean: return "ditops::kQkSumAtenMean";
  }
  return "?";
}
}  // namespace

std::string QkKernelKey::to_string() const {
  return std::string(dtype_name(act)) + ",cache=" + dtype_name(cache) + ",pos=" + dtype_name(pos) +
         ",D=" + std::to_string(head_dim) + ",R=" + std::to_string(rope_dim) +
         (neox ? ",neox" : ",interleaved") + (full_width ? ",fullwidth" : ",compact") + "," +
         qk_rounding_name(rounding) + "," + qk_norm_order_name(order) +
         (weight_rounding == QkNormWeightRounding::twice ? ",twice" : "") + (pdl ? ",pdl" : ",nopdl") +
         (aligned ? ",vec16" : ",scalar");
}

uint64_t QkKernelKey::packed() const {
  uint64_t v = static_cast<uint64_t>(act);
  v = v * 16 + static_cast<uint64_t>(cache);
  v = v * 16 + static_cast<uint64_t>(pos);
  v = v * 512 + static_cast<uint64_t>(head_dim);
  v = v * 512 + static_cast<uint64_t>(rope_dim);
  v = v * 2 + neox;
  v = v * 2 + full_width;
  v = v * 2 + (rounding == QkRounding::rounded);
  v = v * 4 + static_cast<uint64_t>(order);
  v = v * 2 + (weight_rounding == QkNormWeightRounding::twice);
  v = v * 2 + pdl;
  v = v * 2 + aligned;
  return v;
}


jit::KernelRequest qk_kernel_request(const QkKernelKey& key) {
  jit::KernelRequest r;
  r.header = "qknorm_rope.cuh";
  r.function = "ditops::qknorm_rope_body";
  r.template_args = std::string(jit::kernel_type_name(key.act)) + ", " + jit::kernel_type_name(key.cache) + ", " +
                    jit::kernel_type_name(key.pos) + ", " + std::to_string(key.head_dim) + ", " +
                    std::to_string(key.rope_dim) + ", " + jit::kernel_bool(key.neox) + ", " +
                    jit::kernel_bool(key.full_width) + ", " + jit::kernel_bool(key.rounding == QkRounding::rounded) + ", " +
                    sum_order_constant(key.order) + ", " +
                    jit::kernel_bool(key.weight_rounding == QkNormWeightRounding::twice) + ", " + jit::kernel_bool(key.pdl) + ", " +
                    jit::kernel_bool(key.aligned);
  r.params_type = "ditops::QkNormRopeParams";
  r.max_threads = 256;
  // Four resident blocks (64 registers): H200, Qwen-Image NeoX 6912x24: 54.4 us
  // against 56.5 us with ptxas' own choice (80 registers, 3 blocks) despite 8 bytes of spill.
  r.min_blocks = 4;
  r.template_key = "qknorm_rope:" + key.to_string();
  return r;
}

std::vector<QkKernelKey> qk_prebuilt_keys() {
  std::vector<QkKernelKey> keys;
  // FLUX.1 / Z-Image (interleaved) and Qwen-Image / HunyuanVideo / Wan (NeoX), head_dim 128,
  // bf16 activations, fp32 [cos|sin] cache, int64 and int32 positions, both rounding modes.
  for (DType pos : {DType::i64, DType::i32})
    for (bool neox : {false, true})
      for (QkRounding rounding : {QkRounding::rounded, QkRounding::fp32}) {
        QkKernelKey k;
        k.pos = pos;
        k.neox = neox;
        k.rounding = rounding;
        keys.push_back(k);
      }
  QkKernelKey partial;  // partial rotary 128/64
  partial.neox = true;
  partial.rope_dim = 64;
  keys.push_back(partial);
  partial.neox = false;
  keys.push_back(partial);
  return keys;
}

}  // namespace ditops

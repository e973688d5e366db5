// CPU reference of fp8_rowwise_quant: the portable oracle every CUDA implementation is compared with.
//
// Per row (docs/fp8_rowwise_quant.md): the prefix's values, then act(x) rounded to the dtype
// (reference/fp8_rowwise.h gelu_tanh: ATen's fp32 operations, tanh in double rounded to fp32;
// swiglu: silu of the gate column rounded to the dtype, times the up column, rounded), the
// max of their magnitude patterns (NaN propagating), the scale, and each value's e4m3 byte by the
// IEEE division. Compiled without FP contraction: each operation is one IEEE binary32 operation.
// Written per row and column, independently of the kernel's units.
#include <algorithm>
#include <cstdint>
#include <thread>
#include <vector>

#include "ditops/fp8_rowwise_quant.h"
#include "reference/fp8_rowwise.h"
#include "reference/half.h"

namespace ditops {
namespace {

void run_rows(const Fp8RowwiseQuantCall& c, int64_t first, int64_t last) {
  const DType dtype = c.x.dtype;
  const int64_t Kp = c.prefix_width, W = Kp + c.act_width, up = c.width - c.act_width;
  const bool gelu = c.options.act == Fp8RowwiseAct::gelu_tanh;
  const bool swiglu = c.options.act == Fp8RowwiseAct::swiglu;
  std::vector<uint16_t> y(static_cast<size_t>(W));
  uint8_t* out = static_cast<uint8_t*>(c.out.data);
  float* out_scale = static_cast<float*>(c.out_scale.data);
  for (int64_t r = first; r < last; ++r) {
    const uint16_t* prefix = static_cast<const uint16_t*>(c.prefix.data) + (Kp ? r * c.prefix_row_stride : 0);
    const uint16_t* x = static_cast<const uint16_t*>(c.x.data) + r * c.x_row_stride;
    uint16_t amax = 0;
    for (int64_t j = 0; j < W; ++j) {
      uint16_t v = j < Kp ? prefix[j] : x[j - Kp];
      if (j >= Kp && gelu) v = ref::float_to_act_bits(ref::gelu_tanh(ref::act_bits_to_float(v, dtype)), dtype);
      if (j >= Kp && swiglu) v = ref::swiglu(v, x[j - Kp + up], dtype);
      y[static_cast<size_t>(j)] = v;
      amax = std::max(amax, ref::magnitude_bits(v));
    }
    const float s = ref::fp8_rowwise_scale(amax, dtype);
    out_scale[r] = s;
    for (int64_t j = 0; j < W; ++j)
      out[r * W + j] = ref::fp8_rowwise_e4m3(ref::act_bits_to_float(y[static_cast<size_t>(j)], dtype), s);
  }
}

}  // namespace

void fp8_rowwise_quant_reference(const Fp8RowwiseQuantCall& c) {
  for (const TensorView* t : {&c.x, &c.prefix, &c.out, &c.out_scale})
    if (t->data && t->device.kind != DeviceKind::cpu) throw Error("fp8_rowwise_quant reference: every tensor must be on the cpu");
  const int64_t work = c.rows * (c.prefix_width + c.width);  // elements read
  int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  threads = static_cast<int>(std::min<int64_t>({threads, std::max<int64_t>(1, work / (1 << 18)), std::max<int64_t>(c.rows, 1)}));
  if (threads <= 1) {
    run_rows(c, 0, c.rows);
    return;
  }
  std::vector<std::thread> pool;
  const int64_t per = (c.rows + threads - 1) / threads;
  for (int i = 0; i < threads; ++i) {
    const int64_t b = i * per, e = std::min(c.rows, b + per);
    if (b < e) pool.emplace_back([&c, b, e] { run_rows(c, b, e); });
  }
  for (auto& t : pool) t.join();
}

}  // namespace ditops

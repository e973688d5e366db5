// CPU reference of token_cat_fp8: the portable oracle every CUDA implementation is compared with.
//
// Contract (docs/token_cat_fp8.md): inv = 1.0f / input_scale (one IEEE binary32 division; also for
// fp8_reciprocal=div_full, whose GPU reciprocal may differ in its last bits: the stated gap of the
// reference's contract), then per element q = e4m3(clamp(float(x) * inv, -448, 448)) with one IEEE
// product (this file is compiled with -ffp-contract=off) and the exact RNE conversion of
// reference/fp8_fp4.h. A NaN product gives 0x7F, as on the GPU, whose arithmetic returns the
// canonical (positive) NaN: the host's multiply would keep a negative NaN's sign.
//
// The addressing is written per row and column, independently of the kernel's flat units.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <thread>
#include <vector>

#include "ditops/token_cat_fp8.h"
#include "reference/fp8_fp4.h"
#include "reference/half.h"

namespace ditops {
namespace {

uint8_t quantize(float x, float inv) {
  const float v = x * inv;
  if (std::isnan(v)) return 0x7F;
  return ref::float_to_e4m3_satfinite(std::clamp(v, -448.0f, 448.0f));
}

void run_rows(const TokenCatFp8Call& c, float inv, int64_t first, int64_t last) {
  const int64_t Da = c.attn_width, Dm = c.mlp_width, D = c.width;
  uint8_t* out = static_cast<uint8_t*>(c.out.data);
  for (int64_t r = first; r < last; ++r) {
    for (int64_t j = 0; j < Da; ++j)
      out[r * D + j] = quantize(ref::load_act(c.attn.data, r * Da + j, c.attn.dtype), inv);
    for (int64_t j = 0; j < Dm; ++j)
      out[r * D + Da + j] = quantize(ref::load_act(c.mlp.data, r * Dm + j, c.mlp.dtype), inv);
  }
}

}  // namespace

void token_cat_fp8_reference(const TokenCatFp8Call& c) {
  if (c.attn.device.kind != DeviceKind::cpu)
    throw Error("token_cat_fp8.reference: the tensors must be on the cpu but are on " + device_name(c.attn.device));
  if (c.rows * c.width == 0) return;
  const float scale = *static_cast<const float*>(c.input_scale.data);
  token_cat_fp8_reference_with_inverse(
      c, c.options.fp8_reciprocal == Fp8Reciprocal::div_full ? ref::div_full(1.0f, scale) : 1.0f / scale);
}

void token_cat_fp8_reference_with_inverse(const TokenCatFp8Call& c, float inv) {
  if (c.attn.device.kind != DeviceKind::cpu)
    throw Error("token_cat_fp8.reference: the tensors must be on the cpu but are on " + device_name(c.attn.device));
  if (c.rows * c.width == 0) return;
  // Threads over rows for the large test shapes (an element is a few ns).
  const int64_t work = c.rows * c.width;
  int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  threads = static_cast<int>(std::min<int64_t>({threads, std::max<int64_t>(1, work / (1 << 20)), c.rows}));
  if (threads <= 1) {
    run_rows(c, inv, 0, c.rows);
    return;
  }
  std::vector<std::thread> pool;
  const int64_t per = (c.rows + threads - 1) / threads;
  for (int i = 0; i < threads; ++i) {
    const int64_t first = i * per, last = std::min(c.rows, first + per);
    if (first < last) pool.emplace_back([&c, inv, first, last] { run_rows(c, inv, first, last); });
  }
  for (auto& t : pool) t.join();
}

}  // namespace ditops

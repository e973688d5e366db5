#include "ops/common/act_rows.h"

#include <algorithm>

namespace ditops {

namespace {
constexpr int64_t kMaxGrid = int64_t{1} << 20;  // CTAs; more pieces loop (the kernel's grid stride)
}  // namespace

KernelRequest act_rows_request(const std::string& op, const ActRowsKey& k) {
  return {.header = op + ".cuh",
          .function = "ditops::" + op + "_body",
          .template_args = jit::kernel_args(k.dtype, k.vector, k.pdl),
          .params_type = "ditops::ActRowsParams",
          .max_threads = kActRowsMaxThreads,
          .template_key = op + ":" + k.to_string()};
}

std::vector<ActRowsKey> act_rows_variant_keys() {
  std::vector<ActRowsKey> keys;
  for (DType dt : {DType::bf16, DType::f16, DType::f32})
    for (bool vector : {true, false}) keys.push_back({dt, vector, true});
  keys.push_back({DType::bf16, true, false});
  return keys;
}

void act_rows_launch(const ActRowsParams& params, DType dtype, bool vector, bool pdl, Stream stream,
                     const jit::LoadedKernel& kernel) {
  ActRowsParams p = params;
  const int64_t elems = vector ? 16 / static_cast<int64_t>(dtype_size(dtype)) : 1;
  p.prefix_units = p.prefix_width / elems;
  p.units = p.prefix_units + p.width / elems;
  const long long threads = std::min<long long>(kActRowsMaxThreads, (p.units + 31) / 32 * 32);
  p.blocks_per_row = (p.units + threads - 1) / threads;
  p.blocks = p.rows * p.blocks_per_row;
  const unsigned grid = static_cast<unsigned>(std::min<long long>(p.blocks, kMaxGrid));
  jit::launch(kernel, grid, static_cast<unsigned>(threads), &p, sizeof p, static_cast<CUstream>(stream), pdl);
}

}  // namespace ditops

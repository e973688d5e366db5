// What the activation ops share on the host (swiglu, gelu_tanh): out = act(x) row by row into the
// caller's out (kernels/common/act_rows.cuh's walk). The row rules (match_act_rows) are in rows.h.
// Each op's call struct has the members read here: x, out, prefix, options.use_pdl, rows, width,
// prefix_width, x_row_stride, out_row_stride, prefix_row_stride, aligned16, stream.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/implementation.h"
#include "jit/cuda_driver.h"
#include "jit/jit.h"
#include "jit/kernel_family.h"
#include "kernels/common/act_rows.cuh"
#include "ops/common/rows.h"

namespace ditops {

// The template key of <op>_body<T, kVector, kPdl>: exactly the kernel's template parameters.
struct ActRowsKey {
  DType dtype = DType::bf16;
  bool vector = true;
  bool pdl = true;

  std::string to_string() const {
    return std::string(dtype_name(dtype)) + (vector ? ",vec16" : ",scalar") + (pdl ? ",pdl" : ",nopdl");
  }
  uint64_t packed() const { return pack_key({dtype, vector, pdl}); }
};

// The kernel <op>.cuh's ditops::<op>_body.
KernelRequest act_rows_request(const std::string& op, const ActRowsKey& key);

// The compile test's keys: every dtype on both paths, and one without PDL.
std::vector<ActRowsKey> act_rows_variant_keys();

// A CTA per piece of a row, up to this many units (16 bytes each on the vector path), the threads
// rounded up to a warp: swiglu at 95-99.9 % of a device copy at FLUX.2's widths (H100, 1db554a).
constexpr int kActRowsMaxThreads = 256;

void act_rows_launch(const ActRowsParams& params, DType dtype, bool vector, bool pdl, Stream stream,
                     const jit::LoadedKernel& kernel);

template <class Call>
ActRowsKey act_rows_key(const Call& c, const DeviceInfo& device) {
  return {.dtype = c.x.dtype, .vector = c.aligned16, .pdl = c.options.use_pdl && (device.features & kFeaturePdl)};
}

template <class Call>
void act_rows_launch(const Call& c, const ActRowsKey& k, const jit::LoadedKernel& kernel) {
  ActRowsParams p{};
  p.x = c.x.data;
  p.prefix = c.prefix_width ? c.prefix.data : nullptr;
  p.out = c.out.data;
  p.rows = c.rows;
  p.x_row_stride = c.x_row_stride;
  p.prefix_row_stride = c.prefix_row_stride;
  p.out_row_stride = c.out_row_stride;
  p.width = c.width;
  p.prefix_width = c.prefix_width;
  act_rows_launch(p, k.dtype, k.vector, k.pdl, c.stream, kernel);
}

// The act ops' matching of x, out and prefix (match_act_rows) into the call's fields; call.width set.
template <class Call>
void complete_act_rows(Call& call, const Matcher& m, const std::string& n_rule) {
  const ActRows a = match_act_rows(m, call.x, call.out, call.prefix, call.width, n_rule);
  call.rows = a.rows;
  call.prefix_width = a.prefix_width;
  call.x_row_stride = a.x_row_stride;
  call.out_row_stride = a.out_row_stride;
  call.prefix_row_stride = a.prefix_row_stride;
  call.aligned16 = a.aligned16;
}

// The CPU references' row r of out: the prefix's columns copied in; returns where act(x) starts.
template <class T, class Call>
T* act_reference_row(const Call& c, int64_t r) {
  T* out = static_cast<T*>(c.out.data) + r * c.out_row_stride;
  const T* prefix = static_cast<const T*>(c.prefix.data) + r * c.prefix_row_stride;
  for (int64_t j = 0; j < c.prefix_width; ++j) out[j] = prefix[j];
  return out + c.prefix_width;
}

template <class Call>
bool act_rows_nothing_to_do(const Call& c) {
  return c.rows == 0 || c.width + c.prefix_width == 0;
}

}  // namespace ditops

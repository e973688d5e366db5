// The RoPE cos/sin tables of FLUX.1's FluxPosEmbed and FLUX.2's Flux2PosEmbed from their position
// ids, in one launch where eager PyTorch runs about 13 small kernels per axis:
//
//   for axis a (width d = axes_dim[a], columns [o_a, o_a + d) of the tables), pair k < d / 2:
//     e     = (double)(2k) * (1.0 / d)          eager's true-divide by a scalar: its reciprocal, then *
//     f     = 1.0 / pow(theta, e)               in double
//     angle = (double)ids[s, a] * f             torch.outer of float32 ids and float64 freqs
//     cos[s, o_a + 2k] = cos[s, o_a + 2k + 1] = (float)cos(angle), sin likewise with sin(angle)
//
// every step in double as PyTorch's CUDA kernels round it (docs/rope_tables.md derives each).
//
//   ids  [S, A] f32, any strides: column a is axis a's position (A >= the axes of axes_dim: FLUX.2
//        loops over its axes_dim, FLUX.1 over ids' columns, as many)
//   cos  [S, D] f32 contiguous, D = the sum of axes_dim; the caller's tensor, written in place
//   sin  [S, D] f32 contiguous, likewise
// axes_dim is four integer options (the op table's options are scalars): axes_dim0..axes_dim3,
// each even and positive, the first 0 ending the list (FLUX.1: 16, 56, 56, 0; FLUX.2: 32 each).
// Errors (ditops::Error naming the tensor or option, the dimension, the expected and the actual
// value, before anything is written): an odd, negative or missing (axes_dim0 = 0) width, a width
// after a 0, fewer ids columns than axes, cos or sin not [S, D], a dtype not f32, tensors on
// different devices, cos and sin sharing memory, either overlapping ids. S == 0 is a no-op.
#pragma once

#include <cstdint>
#include <string>

#include "ditops/op_function.h"
#include "ditops/registry.h"
#include "ditops/tensor.h"

namespace ditops {

constexpr int kRopeTablesMaxAxes = 4;

struct RopeTablesOptions {
  // The rotary width of ids' columns 0..3 (diffusers' axes_dim); 0 ends the list. FLUX.2's default.
  int64_t axes_dim0 = 32;
  int64_t axes_dim1 = 32;
  int64_t axes_dim2 = 32;
  int64_t axes_dim3 = 32;
  double theta = 2000.0;  // the RoPE base (FLUX.2: 2000, FLUX.1: 10000)
  bool use_pdl = true;    // programmatic dependent launch where the device has it
  DispatchOptions dispatch;
};

// The call as every implementation sees it: the tensors in call order, the options, and what
// matching derives from them.
struct RopeTablesCall {
  TensorView ids, cos, sin;
  RopeTablesOptions options;
  int64_t rows = 0;   // S
  int64_t width = 0;  // D
  int axes = 0;       // the axes of axes_dim (1..4)
  int64_t dims[kRopeTablesMaxAxes] = {};  // their widths
  int64_t ids_row_stride = 0, ids_col_stride = 0;  // elements
  Stream stream = nullptr;
};

// rope_tables(ids, cos, sin, options = {}, stream = nullptr): validates every argument (throws
// Error before anything is written), selects an implementation and runs it on `stream`. Returns
// the name of the implementation that ran.
extern const OpFunction<std::string, RopeTablesCall> rope_tables;

// match_rope_tables(the same arguments): validation alone: the call every implementation receives.
extern const OpFunction<RopeTablesCall, RopeTablesCall> match_rope_tables;

// The dispatch reasoning for one call, without running it.
DispatchReport explain_rope_tables(const RopeTablesCall& call);

// The CPU reference: the same double steps with the C library's pow, cos and sin (CUDA's double
// functions may differ from them in the last bit of a double, so a float32 value may be one ulp away).
void rope_tables_reference(const RopeTablesCall& call);

}  // namespace ditops

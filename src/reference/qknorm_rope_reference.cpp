// CPU reference of qknorm_rope: the portable oracle every CUDA implementation is compared with.
//
// Contract: docs/qknorm_rope.md, followed operation by operation. Every fp32 operation below is
// one IEEE binary32 operation (this file is compiled with -ffp-contract=off, and every FMA of the
// contract is an explicit std::fma), so the result is bit for bit what the doc specifies:
//   §1 sum of squares in aten, warp or aten_mean order, ms = total / D, factor = rsqrt(ms + eps)
//      (correctly rounded here: 1/sqrt in double, rounded once; the GPU's rsqrtf may differ by
//      1 fp32 ulp, the only legitimate reference/GPU difference);
//   §2 norm: rounded mode rne16(w * (factor * x)) or, weight rounding twice,
//      rne16(rne16(x * factor) * w); fp32 mode x * (factor * w);
//   §3 RoPE on channels [0, R), interleaved or NeoX, compact or full-width cache, fp32 or 16-bit
//      cache, with the per-mode arithmetic of `a*c -+ b*s`; channels >= R store rne16(n).
// The call is assumed validated by the facade (match_qknorm_rope); only what would make this
// code unsafe (device, head_dim, rope_dim) is re-checked.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "ditops/qknorm_rope.h"
#include "reference/half.h"

namespace ditops {
namespace {

constexpr int kMaxHeadDim = 256;
constexpr int kWarp = 32;

// Everything a row needs besides its own data, fixed for the whole call.
struct RowContext {
  DType act = DType::bf16;    // activation dtype (q, k, weights)
  DType cache = DType::f32;   // cos/sin cache dtype
  int head_dim = 0;           // D
  int rope_dim = 0;           // R
  bool neox = false;
  bool full_width = false;
  QkRounding rounding = QkRounding::rounded;
  QkNormOrder order = QkNormOrder::aten;
  QkNormWeightRounding weight_rounding = QkNormWeightRounding::once;
  bool complex_product = false;  // rope_product=complex
  float eps = 0.f;
};

// Sequential partial of one virtual thread: p = fma(x[i], x[i], p) from +0, in element order.
float thread_partial(const float* x, int count) {
  float p = 0.f;
  for (int i = 0; i < count; ++i) p = std::fma(x[i], x[i], p);
  return p;
}

// One warp's tree (shfl_down with offsets 16, 8, 4, 2, 1; the XOR butterfly leaves the same value
// in lane 0 since each add is commutative). Returns lane 0. Lanes past the row hold +0.
float warp_tree(float lanes[kWarp]) {
  for (int offset = kWarp / 2; offset >= 1; offset /= 2) {
    for (int lane = 0; lane < offset; ++lane) lanes[lane] = lanes[lane] + lanes[lane + offset];
  }
  return lanes[0];
}

// §1 aten order: virtual threads of 4 elements, virtual warps of 32 threads, then aten's
// inter-warp tree over 4 warps (offset 2, then offset 1).
float sum_of_squares_aten(const float* x, int head_dim) {
  constexpr int kGroup = 4;
  const int threads = head_dim / kGroup;
  float warps[4] = {0.f, 0.f, 0.f, 0.f};
  for (int w = 0; w * kWarp < threads; ++w) {
    float lanes[kWarp] = {};
    for (int lane = 0; lane < kWarp; ++lane) {
      const int v = w * kWarp + lane;
      if (v < threads) lanes[lane] = thread_partial(x + v * kGroup, kGroup);
    }
    warps[w] = warp_tree(lanes);
  }
  warps[0] = warps[0] + warps[2];
  warps[1] = warps[1] + warps[3];
  return warps[0] + warps[1];
}

// §1 warp order: 32 virtual threads of D/32 consecutive elements, one warp tree.
float sum_of_squares_warp(const float* x, int head_dim) {
  const int group = head_dim / kWarp;
  float lanes[kWarp];
  for (int lane = 0; lane < kWarp; ++lane) lanes[lane] = thread_partial(x + lane * group, group);
  return warp_tree(lanes);
}

// §1 aten_mean order (x.float().pow(2).mean(-1) on CUDA): squares rounded to fp32, then 32
// threads with 4 accumulators each, combined in order, then one warp tree. D >= 128: thread t's
// accumulator i adds element 4v + i of its vectors v = t, t + 32, ...; D = 64: accumulator j holds
// element t + 32 j.
float sum_of_squares_aten_mean(const float* x, int head_dim) {
  float square[kMaxHeadDim];
  for (int i = 0; i < head_dim; ++i) square[i] = x[i] * x[i];
  float lanes[kWarp];
  for (int lane = 0; lane < kWarp; ++lane) {
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    if (head_dim >= 128) {
      for (int v = lane; 4 * v + 3 < head_dim; v += kWarp)
        for (int i = 0; i < 4; ++i) acc[i] = acc[i] + square[4 * v + i];
    } else {
      for (int j = 0; j < 4 && lane + kWarp * j < head_dim; ++j) acc[j] = acc[j] + square[lane + kWarp * j];
    }
    lanes[lane] = ((acc[0] + acc[1]) + acc[2]) + acc[3];
  }
  return warp_tree(lanes);
}

// §1 + §2: factor = rsqrt(total / D + eps), then the normalized row n (fp32 values; in rounded
// mode already rounded to the activation dtype).
void rms_norm_row(const float* x, const float* w, const RowContext& ctx, float* n) {
  const int d = ctx.head_dim;
  const float total = ctx.order == QkNormOrder::aten   ? sum_of_squares_aten(x, d)
                      : ctx.order == QkNormOrder::warp ? sum_of_squares_warp(x, d)
                                                       : sum_of_squares_aten_mean(x, d);
  const float ms = total / static_cast<float>(d);
  const float ms_eps = ms + ctx.eps;
  const float factor = static_cast<float>(1.0 / std::sqrt(static_cast<double>(ms_eps)));
  if (ctx.rounding == QkRounding::rounded && ctx.weight_rounding == QkNormWeightRounding::twice) {
    for (int i = 0; i < d; ++i) n[i] = ref::round_to(ctx.act, ref::round_to(ctx.act, x[i] * factor) * w[i]);
  } else if (ctx.rounding == QkRounding::rounded) {
    for (int i = 0; i < d; ++i) {
      const float scaled = factor * x[i];
      n[i] = ref::round_to(ctx.act, w[i] * scaled);
    }
  } else {
    for (int i = 0; i < d; ++i) {
      const float scale = factor * w[i];
      n[i] = x[i] * scale;
    }
  }
}

// §3 `a*c - b*s` (minus) or `a*c + b*s` (plus), rounded to the activation dtype, per mode.
float rotate_term(float a, float c, float b, float s, bool minus, const RowContext& ctx) {
  if (ctx.rounding == QkRounding::fp32) {
    const float bs = b * s;
    return ref::round_to(ctx.act, std::fma(a, c, minus ? -bs : bs));
  }
  if (ctx.cache == DType::f32) {
    const float ac = a * c;
    const float bs = b * s;
    return ref::round_to(ctx.act, minus ? ac - bs : ac + bs);
  }
  const float p1 = ref::round_to(ctx.act, a * c);
  const float p2 = ref::round_to(ctx.act, b * s);
  return ref::round_to(ctx.act, minus ? p1 - p2 : p1 + p2);
}

// §3 RoPE of channels [0, R) of n in place; `cache_row` is the row of this token's position.
void rope_row(float* n, const void* cache_row, const RowContext& ctx) {
  const int half = ctx.rope_dim / 2;
  const int64_t sin_offset = ctx.full_width ? ctx.rope_dim : half;
  for (int j = 0; j < half; ++j) {
    const int i0 = ctx.neox ? j : 2 * j;         // the "minus" channel
    const int i1 = ctx.neox ? j + half : 2 * j + 1;  // the "plus" channel
    const int cs0 = ctx.full_width ? i0 : j;     // cos/sin index of each channel
    const int cs1 = ctx.full_width ? i1 : j;
    const float c0 = ref::load_act(cache_row, cs0, ctx.cache);
    const float s0 = ref::load_act(cache_row, sin_offset + cs0, ctx.cache);
    const float c1 = ref::load_act(cache_row, cs1, ctx.cache);
    const float s1 = ref::load_act(cache_row, sin_offset + cs1, ctx.cache);
    const float x0 = n[i0];
    const float x1 = n[i1];
    if (ctx.complex_product) {
      // (x0 + i x1)(c + i s) as aten's complex64 multiply rounds it: one FMA per component
      // (interleaved pairs, fp32 cache, rounded mode: the matcher's rule).
      n[i0] = ref::round_to(ctx.act, std::fma(x0, c0, -(x1 * s0)));
      n[i1] = ref::round_to(ctx.act, std::fma(x0, s1, x1 * c1));
      continue;
    }
    n[i0] = rotate_term(x0, c0, x1, s0, /*minus=*/true, ctx);
    n[i1] = rotate_term(x1, c1, x0, s1, /*minus=*/false, ctx);
  }
}

// One (token, head) row, in place: load, norm, RoPE, store (channels >= R store rne16(n)).
void process_row(void* row, const float* weight, const void* cache_row, const RowContext& ctx) {
  float x[kMaxHeadDim];
  float n[kMaxHeadDim];
  for (int i = 0; i < ctx.head_dim; ++i) x[i] = ref::load_act(row, i, ctx.act);
  rms_norm_row(x, weight, ctx, n);
  rope_row(n, cache_row, ctx);
  for (int i = 0; i < ctx.head_dim; ++i) ref::store_act(row, i, ctx.act, n[i]);
}

int64_t element_bytes(DType dtype) {
  switch (dtype) {
    case DType::f32:
    case DType::i32:
      return 4;
    case DType::i64:
      return 8;
    case DType::f16:
    case DType::bf16:
      return 2;
    default:
      throw Error("qknorm_rope reference: unsupported dtype code " +
                  std::to_string(static_cast<int>(dtype)));
  }
}

const char* byte_ptr(const TensorView& view, int64_t element_offset) {
  return static_cast<const char*>(view.data) + element_offset * element_bytes(view.dtype);
}

}  // namespace

void qknorm_rope_reference(const QkNormRopeCall& call) {
  const int64_t tokens = call.num_tokens;
  if (tokens <= 0) return;
  for (const TensorView* view : {&call.q, &call.k, &call.q_weight, &call.k_weight,
                                 &call.cos_sin_cache, &call.positions}) {
    if (view->device.kind != DeviceKind::cpu) {
      throw Error("qknorm_rope reference: every tensor must be on the CPU");
    }
  }
  // Dtypes the row code can read (checked here so nothing throws inside a worker thread).
  const auto is_16bit = [](DType t) { return t == DType::f16 || t == DType::bf16; };
  if (!is_16bit(call.q.dtype) || call.k.dtype != call.q.dtype ||
      call.q_weight.dtype != call.q.dtype || call.k_weight.dtype != call.q.dtype ||
      !(call.cos_sin_cache.dtype == DType::f32 || is_16bit(call.cos_sin_cache.dtype)) ||
      !(call.positions.dtype == DType::i32 || call.positions.dtype == DType::i64)) {
    throw Error("qknorm_rope reference: unsupported dtype combination");
  }
  const int d = call.head_dim;
  if (d != 64 && d != 128 && d != 256) {
    throw Error("qknorm_rope reference: head_dim must be 64, 128 or 256, got " +
                std::to_string(d));
  }
  if (call.rope_dim <= 0 || call.rope_dim > d || call.rope_dim % 2 != 0) {
    throw Error("qknorm_rope reference: rope_dim must be even and in (0, head_dim], got " +
                std::to_string(call.rope_dim));
  }

  // Positions are host memory here: every one must index a cache row before anything is
  // written (the CUDA path reads them on the device only; docs/qknorm_rope.md §3).
  const int64_t cache_rows = call.cos_sin_cache.rank == 2 ? call.cos_sin_cache.shape[0] : 0;
  for (int64_t t = 0; t < tokens; ++t) {
    const int64_t offset = t * call.positions.stride(0);
    const int64_t position = call.positions.dtype == DType::i64
                                 ? static_cast<const int64_t*>(call.positions.data)[offset]
                                 : static_cast<const int32_t*>(call.positions.data)[offset];
    if (position < 0 || position >= cache_rows)
      throw InvalidArgument("qknorm_rope: positions[" + std::to_string(t) + "] = " + std::to_string(position) +
                  " is outside the cos_sin_cache rows [0, " + std::to_string(cache_rows) + ")");
  }

  RowContext ctx;
  ctx.act = call.q.dtype;
  ctx.cache = call.cos_sin_cache.dtype;
  ctx.head_dim = d;
  ctx.rope_dim = call.rope_dim;
  ctx.neox = call.options.is_neox;
  ctx.full_width = call.options.cache_full_width;
  ctx.rounding = call.options.rounding;
  ctx.order = call.options.norm_order;
  ctx.weight_rounding = call.options.norm_weight_rounding;
  ctx.complex_product = call.options.rope_product == QkRopeProduct::complex;
  ctx.eps = call.options.eps;

  // Weights widened once (exact).
  std::vector<float> q_weight(d), k_weight(d);
  for (int i = 0; i < d; ++i) {
    q_weight[i] = ref::load_act(call.q_weight.data, i, call.q_weight.dtype);
    k_weight[i] = ref::load_act(call.k_weight.data, i, call.k_weight.dtype);
  }

  const int64_t q_heads = call.num_q_heads;
  const int64_t heads = q_heads + call.num_k_heads;
  const int64_t rows = tokens * heads;
  const int64_t cache_stride = call.cos_sin_cache.stride(0);
  const int64_t position_stride = call.positions.stride(0);

  // Rows in token-major order: row r is head r % heads of token r / heads (q heads first).
  auto run_rows = [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t t = r / heads;
      const int64_t h = r % heads;
      const int64_t position =
          call.positions.dtype == DType::i64
              ? static_cast<const int64_t*>(call.positions.data)[t * position_stride]
              : static_cast<int64_t>(
                    static_cast<const int32_t*>(call.positions.data)[t * position_stride]);
      const void* cache_row = byte_ptr(call.cos_sin_cache, position * cache_stride);
      const bool is_q = h < q_heads;
      const TensorView& x = is_q ? call.q : call.k;
      const int64_t head = is_q ? h : h - q_heads;
      void* row = const_cast<char*>(byte_ptr(x, t * x.stride(0) + head * x.stride(1)));
      process_row(row, is_q ? q_weight.data() : k_weight.data(), cache_row, ctx);
    }
  };

  constexpr int64_t kRowsPerThreadMin = 4096;
  const int64_t hardware = std::max<int64_t>(1, std::thread::hardware_concurrency());
  const int64_t workers = rows > kRowsPerThreadMin
                              ? std::min<int64_t>(hardware, (rows + kRowsPerThreadMin - 1) /
                                                                kRowsPerThreadMin)
                              : 1;
  if (workers <= 1) {
    run_rows(0, rows);
    return;
  }
  // Contiguous chunks of rows; chunk 0 runs on the calling thread. Rows are independent, so the
  // result does not depend on the split.
  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(workers - 1));
  const int64_t chunk = (rows + workers - 1) / workers;
  for (int64_t w = 1; w < workers; ++w) {
    const int64_t begin = std::min(rows, w * chunk);
    const int64_t end = std::min(rows, begin + chunk);
    try {
      threads.emplace_back(run_rows, begin, end);
    } catch (const std::system_error&) {
      run_rows(begin, end);  // no thread available: do this chunk here
    }
  }
  run_rows(0, std::min(rows, chunk));
  for (std::thread& thread : threads) thread.join();
}

}  // namespace ditops

// Per-token dynamic e4m3 of the rows of cat([prefix, act(x)], -1), in one pass:
//
//   y        = cat([prefix, act(x)], -1)        act: none, GELU(tanh) rounded to T, or SwiGLU:
//                                               silu(x[:N]) rounded to T, times x[N:], rounded to T
//   out      = e4m3 rows of y, out_scale = s    the rowwise recipe of common/fp8_rowwise.cuh
//
// Numerics contract (docs/fp8_rowwise_quant.md): bit_exact against the eager chain on CUDA,
// fp8_rowwise_eager(torch.cat([prefix, F.gelu(x, approximate="tanh")], -1)) (or act none, or
// F.silu(x[..., :N]) * x[..., N:] for swiglu).
// * GELU(tanh) is common/gelu.cuh's (the gelu_tanh op's): ATen's GeluCUDAKernelImpl in fp32,
//   rounded to T, with nvcc's contraction of `x + kKappa * x_cube` into one fma (eager's: read from
//   PyTorch's SASS, docs/gelu_tanh.md).
// * SwiGLU is common/swiglu.cuh's (the swiglu op's): ATen's silu in fp32, rounded to T, times the
//   up half in fp32, rounded to T.
// * kTable (bf16, the vector path, GELU): the GELU of common/gelu_table.cuh, each CTA's
//   shared-memory table of the evaluated form's results (built before the PDL wait, so it overlaps
//   the previous kernel), the units it does not hold evaluated as without it. Its CTAs also load
//   their next row while this one is looked up, reduced and stored. The grid is then a few CTAs per
//   SM, each taking many rows, so the table is built a few hundred times a call, not once per row.
// * The vector path loads every unit of the row before the first act: the act's branches (the IEEE
//   division's slow path, the table's lookup) keep the compiler from issuing a later unit's loads
//   early, and acting unit by unit waited out a memory round trip per slot.
// * The row is read once into registers, its amax reduced over the CTA, then quantized from the
//   registers: each input byte read once, each e4m3 byte written once. The division is the IEEE
//   one, by common/fp8_rowwise.cuh's fp8_rowwise_divide (the exact correction of y * (1 / s) on
//   rows of normal s, div.rn on the others).
//
// Layout: a unit is 16 consecutive columns of the output row (Kp + N columns, prefix first; N = K,
// or K / 2 for swiglu). The vector path (kVector: Kp % 16 == 0, N % 16 == 0, 16-byte aligned
// pointers and row strides) reads a unit as two 16-byte loads of one source row (swiglu: two of
// the gate half, two of the up half at column + N) and writes it as one 16-byte store; the scalar path
// reads and writes it element by element (any widths, strides, 2-byte alignment). CTA threads
// (blockDim.x, a multiple of 32 chosen by the host) own units t, t + blockDim.x, ... (kSlots of
// them); a CTA handles rows blockIdx.x, + gridDim.x, ...
#pragma once

namespace ditops {

// Launch parameters. Plain data, shared by the host op (src/ops/fp8_rowwise_quant) and the kernel.
struct Fp8RowwiseQuantParams {
  const void* x;             // T rows of K (2 N for swiglu), row stride x_row_stride (elements)
  const void* prefix;        // T rows of Kp, row stride prefix_row_stride; nullptr when Kp == 0
  void* out;                 // e4m3 [rows, Kp + K], contiguous
  float* out_scale;          // [rows] (the [rows, 1] output)
  long long rows;
  long long x_row_stride;
  long long prefix_row_stride;
  int width;                 // N: the output columns of act(x) (K; K / 2 for swiglu)
  int up_offset;             // swiglu: x's column of the up half (N); 0 otherwise
  int prefix_width;          // Kp
  int units;                 // ceil((Kp + N) / 16)
};

// The GELU table's check (tests/test_fp8_rowwise_quant.cpp, on a GPU): every bf16 value through
// the table's unit path against the evaluated GELU; `mismatches` counts the words that differ.
struct GeluTableCheckParams {
  unsigned* mismatches;
};

// The act codes of the kernel template (Fp8RowwiseAct on the host).
constexpr int kFp8RowwiseActNone = 0;
constexpr int kFp8RowwiseGelu = 1;    // GELU(tanh), rounded to T
constexpr int kFp8RowwiseSwiglu = 2;  // silu(x[:N]) * x[N:], each step rounded to T

}  // namespace ditops

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)

#include "common/gelu_table.cuh"
#include "common/fp8_rowwise.cuh"
#include "common/gelu.cuh"
#include "common/memory.cuh"
#include "common/swiglu.cuh"
#include "common/types.cuh"

namespace ditops {

namespace frq_detail {

using namespace ditops::kernel;

// A packed word of two T values through act, rounded back to T (not swiglu: swiglu_word).
template <typename T, int kAct>
__device__ __forceinline__ u32 act_word(u32 word) {
  if constexpr (kAct == kFp8RowwiseActNone || kAct == kFp8RowwiseSwiglu) {
    return word;
  } else {
    return gelu_tanh_word<T>(word);
  }
}

// One unit (16 columns) as 8 packed words: w[0..3] columns 0-7, w[4..7] columns 8-15. Columns past
// the row read as +0 (they neither raise the amax nor get stored).
struct Unit {
  Word<16> lo, hi;
};

__device__ __forceinline__ Unit unit_of(const u32 (&w)[8]) {
  Unit u;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    u.lo.w[i] = w[i];
    u.hi.w[i] = w[4 + i];
  }
  return u;
}

template <typename T, bool kVector, int kAct>
__device__ __forceinline__ Unit load_unit(const Fp8RowwiseQuantParams& p, const T* x_row, const T* prefix_row,
                                          int unit) {
  Unit u;
  if constexpr (kVector) {  // the raw unit: the vector path's act comes after every load (act_unit)
    static_assert(kAct == kFp8RowwiseActNone, "the vector path loads raw units");
    const int prefix_units = p.prefix_width / 16;
    const T* src = unit < prefix_units ? prefix_row + 16 * unit : x_row + 16 * (unit - prefix_units);
    u.lo = load_word<16, true>(src);
    u.hi = load_word<16, true>(src + 8);
  } else {
    unsigned short v[16], up[16];
    bool is_x[16];
#pragma unroll
    for (int e = 0; e < 16; ++e) {
      const int col = 16 * unit + e;
      is_x[e] = col >= p.prefix_width;
      v[e] = 0;
      up[e] = 0;
      if (col < p.prefix_width) {
        v[e] = prefix_row[col].bits;
      } else if (col < p.prefix_width + p.width) {
        v[e] = x_row[col - p.prefix_width].bits;
        if constexpr (kAct == kFp8RowwiseSwiglu) up[e] = x_row[col - p.prefix_width + p.up_offset].bits;
      }
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      u32 word = static_cast<u32>(v[2 * i]) | (static_cast<u32>(v[2 * i + 1]) << 16);
      u32 acted = word;
      if constexpr (kAct == kFp8RowwiseSwiglu)
        acted = swiglu_word<T>(word, static_cast<u32>(up[2 * i]) | (static_cast<u32>(up[2 * i + 1]) << 16));
      else
        acted = act_word<T, kAct>(word);
      // act on the x columns; a pair straddling the prefix boundary takes each half its own way.
      if (is_x[2 * i] && is_x[2 * i + 1]) {
        word = acted;
      } else if (is_x[2 * i + 1]) {
        word = (word & 0xFFFFu) | (acted & 0xFFFF0000u);
      }
      (i < 4 ? u.lo.w[i] : u.hi.w[i - 4]) = word;
    }
    // Columns past the row: +0 again (act of +0 is +0 for GELU and SwiGLU, but say so explicitly).
#pragma unroll
    for (int e = 0; e < 16; ++e)
      if (16 * unit + e >= p.prefix_width + p.width) {
        u32& w = e < 8 ? u.lo.w[e / 2] : u.hi.w[(e - 8) / 2];
        w &= (e & 1) ? 0x0000FFFFu : 0xFFFF0000u;
      }
  }
  return u;
}

template <typename T, bool kVector, bool kExact>
__device__ __forceinline__ void store_unit(const Fp8RowwiseQuantParams& p, unsigned char* out_row, int unit,
                                           const Unit& u, float s, float r) {
  Word<16> q;
  e4m3x8_of_words<T, kExact>(u.lo.w, s, r, &q.w[0], &q.w[1]);
  e4m3x8_of_words<T, kExact>(u.hi.w, s, r, &q.w[2], &q.w[3]);
  if constexpr (kVector) {
    store_word<16>(out_row + 16 * unit, q);
  } else {
    const int width = p.prefix_width + p.width;
#pragma unroll
    for (int e = 0; e < 16; ++e)
      if (16 * unit + e < width) out_row[16 * unit + e] = static_cast<unsigned char>(q.w[e / 4] >> (8 * (e % 4)));
  }
}

template <typename T, int kSlots, bool kVector, bool kExact>
__device__ __forceinline__ void store_row(const Fp8RowwiseQuantParams& p, unsigned char* out_row, const Unit (&u)[kSlots],
                                          float s, float r) {
  const int t = static_cast<int>(threadIdx.x), threads = static_cast<int>(blockDim.x);
#pragma unroll
  for (int j = 0; j < kSlots; ++j) {
    const int unit = t + j * threads;
    if (unit < p.units) store_unit<T, kVector, kExact>(p, out_row, unit, u[j], s, r);
  }
}

// Row `row`'s units as loaded (no act), every load in flight before any is used: the vector path's
// raw units.
template <typename T, int kSlots>
__device__ __forceinline__ void load_raw_row(const Fp8RowwiseQuantParams& p, long long row, Unit (&u)[kSlots]) {
  const T* x_row = static_cast<const T*>(p.x) + row * p.x_row_stride;
  const T* prefix_row = static_cast<const T*>(p.prefix) + (p.prefix ? row * p.prefix_row_stride : 0);
  const int t = static_cast<int>(threadIdx.x), threads = static_cast<int>(blockDim.x);
#pragma unroll
  for (int j = 0; j < kSlots; ++j) {
    const int unit = t + j * threads;
    if (unit < p.units) u[j] = load_unit<T, true, kFp8RowwiseActNone>(p, x_row, prefix_row, unit);
  }
}

// The up halves of row `row`'s x units (SwiGLU's vector path; prefix units load nothing).
template <typename T, int kSlots>
__device__ __forceinline__ void load_raw_up(const Fp8RowwiseQuantParams& p, long long row, Unit (&up)[kSlots]) {
  const T* up_row = static_cast<const T*>(p.x) + row * p.x_row_stride + p.up_offset;
  const int t = static_cast<int>(threadIdx.x), threads = static_cast<int>(blockDim.x);
  const int prefix_units = p.prefix_width / 16;
#pragma unroll
  for (int j = 0; j < kSlots; ++j) {
    const int unit = t + j * threads;
    if (unit < p.units && unit >= prefix_units) {
      const T* src = up_row + 16 * (unit - prefix_units);
      up[j].lo = load_word<16, true>(src);
      up[j].hi = load_word<16, true>(src + 8);
    }
  }
}

// The act of a raw x unit of the vector path (SwiGLU: the gate, its up half in `up`), evaluated or
// (kTable, GELU) by the table: the same words as the scalar path's load_unit.
template <typename T, int kAct, bool kTable>
__device__ __forceinline__ void act_unit(Unit& u, [[maybe_unused]] const Unit& up,
                                         [[maybe_unused]] const unsigned short* table) {
  if constexpr (kAct != kFp8RowwiseActNone) {
    u32 w[8] = {u.lo.w[0], u.lo.w[1], u.lo.w[2], u.lo.w[3], u.hi.w[0], u.hi.w[1], u.hi.w[2], u.hi.w[3]};
    if constexpr (kTable) {
      gelu_tanh_unit_tabled(w, table);
    } else {
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        if constexpr (kAct == kFp8RowwiseSwiglu)
          w[i] = swiglu_word<T>(w[i], i < 4 ? up.lo.w[i] : up.hi.w[i - 4]);
        else
          w[i] = act_word<T, kAct>(w[i]);
      }
    }
    u = unit_of(w);
  }
}

}  // namespace frq_detail

// T: kernel::bf16 or kernel::f16. kSlots: units per thread (blockDim.x * kSlots >= units). kVector:
// the 16-byte path. kAct: kFp8RowwiseActNone / Gelu / Swiglu. kTable: the GELU by
// common/gelu_table.cuh's table (bf16, kVector, GELU). kPdl: griddepcontrol.wait
// before the first read, launch_dependents after the last store.
template <typename T, int kSlots, bool kVector, int kAct, bool kTable, bool kPdl>
__device__ void fp8_rowwise_quant_body(const Fp8RowwiseQuantParams& p) {
  using namespace frq_detail;
  static_assert(sizeof(T) == 2, "bf16 or f16 rows");
  static_assert(!kTable || (kVector && kAct == kFp8RowwiseGelu && kIsBf16<T>),
                "the table is for bf16 GELU rows on the vector path");
  __shared__ u32 partials[2][32];
  __shared__ unsigned short table[kTable ? kGeluTableEntries : 1];
  const int t = static_cast<int>(threadIdx.x), threads = static_cast<int>(blockDim.x);
  if constexpr (kTable) {
    build_gelu_table(table);
    __syncthreads();
  }
  if constexpr (kPdl) pdl_wait();
  int parity = 0;
  // The table's CTAs walk rows and hold the next row's raw units while they finish this one (kTable:
  // its grid is a few CTAs per SM, which would otherwise load, look up, reduce and store in step
  // and leave memory idle between their rows' loads).
  [[maybe_unused]] Unit next[kSlots];
  if constexpr (kTable) {
    if (blockIdx.x < p.rows) load_raw_row<T, kSlots>(p, blockIdx.x, next);
  }
  for (long long row = blockIdx.x; row < p.rows; row += gridDim.x) {  // uniform per CTA
    Unit u[kSlots];
    u32 pairs = 0;
    if constexpr (kVector) {
      // Every unit's loads before the first act (the header says why).
      [[maybe_unused]] Unit up[kSlots];
      if constexpr (kTable) {
#pragma unroll
        for (int j = 0; j < kSlots; ++j) u[j] = next[j];
        if (row + gridDim.x < p.rows) load_raw_row<T, kSlots>(p, row + gridDim.x, next);
      } else {
        load_raw_row<T, kSlots>(p, row, u);
        if constexpr (kAct == kFp8RowwiseSwiglu) load_raw_up<T, kSlots>(p, row, up);
      }
#pragma unroll
      for (int j = 0; j < kSlots; ++j) {
        const int unit = t + j * threads;
        if (unit < p.units) {
          if (unit >= p.prefix_width / 16) act_unit<T, kAct, kTable>(u[j], up[j], table);  // x's units
#pragma unroll
          for (int i = 0; i < 4; ++i) pairs = abs_max_pairs(abs_max_pairs(pairs, u[j].lo.w[i]), u[j].hi.w[i]);
        }
      }
    } else {
      const T* x_row = static_cast<const T*>(p.x) + row * p.x_row_stride;
      const T* prefix_row = static_cast<const T*>(p.prefix) + (p.prefix ? row * p.prefix_row_stride : 0);
#pragma unroll
      for (int j = 0; j < kSlots; ++j) {
        const int unit = t + j * threads;
        if (unit < p.units) {
          u[j] = load_unit<T, kVector, kAct>(p, x_row, prefix_row, unit);
#pragma unroll
          for (int i = 0; i < 4; ++i) pairs = abs_max_pairs(abs_max_pairs(pairs, u[j].lo.w[i]), u[j].hi.w[i]);
        }
      }
    }
    const u32 amax = block_max_u32(fold_pairs(pairs), partials[parity]);
    parity ^= 1;
    const float s = fp8_rowwise_scale<T>(amax);
    if (t == 0) p.out_scale[row] = s;
    unsigned char* out_row = static_cast<unsigned char*>(p.out) + row * (p.prefix_width + p.width);
    const float r = __frcp_rn(s);
    if (fp8_rowwise_fast(s))  // uniform per CTA: s is the row's
      store_row<T, kSlots, kVector, false>(p, out_row, u, s, r);
    else
      store_row<T, kSlots, kVector, true>(p, out_row, u, s, r);
  }
  if constexpr (kPdl) pdl_launch_dependents();
}

// GeluTableCheckParams' kernel: each CTA builds the table, its threads take 16 consecutive bf16
// bit patterns a unit (the table's bounds are multiples of 16: every unit is wholly in the table,
// wholly large or wholly evaluated), through gelu_tanh_unit_tabled and through gelu_tanh_word;
// then every bf16 value again in a unit of mixed company (table values and finite |x| >= 8 of both
// signs), which takes the path of units holding both. T: kernel::bf16 (a template for the JIT's
// wrapper).
template <typename T>
__device__ void fp8_rowwise_gelu_table_check_body(const GeluTableCheckParams& p) {
  static_assert(kernel::kIsBf16<T>, "the table is bf16's");
  __shared__ unsigned short table[kernel::kGeluTableEntries];
  kernel::build_gelu_table(table);
  __syncthreads();
  const unsigned step = 16u * blockDim.x * gridDim.x;
  for (unsigned base = 16u * (blockIdx.x * blockDim.x + threadIdx.x); base < 65536u; base += step) {
    kernel::u32 w[8], tabled[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) tabled[i] = w[i] = (base + 2 * i) | ((base + 2 * i + 1) << 16);
    kernel::gelu_tanh_unit_tabled(tabled, table);
#pragma unroll
    for (int i = 0; i < 8; ++i)
      if (tabled[i] != kernel::gelu_tanh_word<T>(w[i])) atomicAdd(p.mismatches, 1u);
  }
  // 1, -1, 32, -32, 0.5, -3, 8, -8 (bf16 bits), then the value under test in the last half
  constexpr kernel::u32 kCompany[8] = {0xBF803F80u, 0xC2004200u, 0xC0403F00u, 0xC1004100u,
                                       0xBF803F80u, 0xC2004200u, 0xC0403F00u, 0xC1004100u};
  for (unsigned v = blockIdx.x * blockDim.x + threadIdx.x; v < 65536u; v += blockDim.x * gridDim.x) {
    kernel::u32 w[8], tabled[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) tabled[i] = w[i] = i == 7 ? (kCompany[i] & 0xFFFFu) | (v << 16) : kCompany[i];
    kernel::gelu_tanh_unit_tabled(tabled, table);
#pragma unroll
    for (int i = 0; i < 8; ++i)
      if (tabled[i] != kernel::gelu_tanh_word<T>(w[i])) atomicAdd(p.mismatches, 1u);
  }
}

}  // namespace ditops

#endif  // __CUDACC__ || __CUDACC_RTC__

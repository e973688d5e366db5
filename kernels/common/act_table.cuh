// GELU(tanh) of bf16 values by table (fp8_rowwise_quant's act=gelu, opt-in): each value read from a
// shared-memory table a CTA builds once instead of evaluated per element. Bit-exact with the
// evaluated form by construction: each entry is the evaluated function's own result for that input
// (common/gelu.cuh's gelu_tanh_word), and a unit (16 values) with any value outside the table and its
// large-value rule is evaluated as before.
//
// Why: fp8_rowwise_quant's GELU rows are issue-bound, not memory-bound (FLUX.1's FF-down input at
// 0.83 of a copy on an H100, act none at the copy): tanhf and its fp32 steps take ~30 instructions
// an element (sm_90 SASS), a lookup ~8. A bf16 input has 2^16 values; the table holds those with
// 2^-12 <= |x| < 2^(kExps - 12) (bf16 exponent fields 115 .. 115 + kExps - 1, both signs, 128
// mantissas each). Finite values past it need no table (kExps 15, |x| >= 8, 3840 entries, 7.5 KiB):
// |inner| >= 24.6, tanhf(inner) is +-1 exactly, so 0.5x * 2 = x (x > 0) or 0.5x * 0 = -0 (x < 0).
// Smaller values, Inf and NaN are evaluated. Why the large values: the model benches' random FLUX.1
// has 83 % of its FF-up outputs at |x| >= 8 (std 37 on the CPU, bench.build's model), so with the
// table alone no unit took it and the forward lost time. (A SiLU table for SwiGLU's gate, the same
// machinery, was removed once the evaluated SwiGLU rows reached the copy: docs/fp8_rowwise_quant.md.)
#pragma once

#include "common/gelu.cuh"
#include "common/types.cuh"

namespace ditops::kernel {

// Whether T is bf16 (no <type_traits> under NVRTC): the table's layout is bf16's.
template <typename T>
constexpr bool kIsBf16 = false;
template <>
constexpr bool kIsBf16<bf16> = true;

constexpr int kActTableExpLo = 115;                                     // |x| >= 2^-12
constexpr unsigned kActTableFirstBits = unsigned{kActTableExpLo} << 7;  // the smallest magnitude's bits

// The table: how many exponents it holds and the function it holds (a template parameter of the
// functions below).
struct GeluTable {
  static constexpr int kExps = 15;  // |x| < 2^3
  // GELU(tanh) of bf16 `bits`, rounded to bf16: gelu_tanh_word's low half of a word repeating it.
  static __device__ __forceinline__ unsigned short value(u32 bits) {
    return static_cast<unsigned short>(gelu_tanh_word<bf16>(bits | (bits << 16)));
  }
  static __device__ __forceinline__ u32 evaluate_word(u32 word) { return gelu_tanh_word<bf16>(word); }
};

template <typename Table>
constexpr int kActTableEntries = 2 * Table::kExps * 128;  // 7 mantissa bits, 2 signs

// Slots (below) from the table's entries up to here are the finite values past the table; Inf's slot
// ((0x7F80 << 1) in the rotated form) is the first past them.
constexpr unsigned kActLargeEnd = (0x7F80u << 1) - (kActTableFirstBits << 1);

// A word's two bf16 halves with each half's sign moved to its bit 0 (the magnitude up one bit):
// entry (magnitude - first) * 2 + sign is then the half minus (first << 1), and one unsigned
// compare tells whether the table holds it. One LOP3 for both halves: (w << 1) keeps the
// magnitudes, (w >> 15) brings bit 15 to bit 0 and bit 31 to bit 16.
__device__ __forceinline__ u32 act_table_rotate(u32 w) { return ((w << 1) & 0xFFFEFFFEu) | ((w >> 15) & 0x00010001u); }

// The bf16 bits of entry i's input.
__device__ __forceinline__ u32 act_table_input(int i) {
  return (kActTableFirstBits + static_cast<u32>(i >> 1)) | (static_cast<u32>(i & 1) << 15);
}

// Fills table[0, kActTableEntries<Table>) with the CTA's threads; the caller synchronizes before reading.
template <typename Table>
__device__ __forceinline__ void build_act_table(unsigned short* table) {
  for (int i = static_cast<int>(threadIdx.x); i < kActTableEntries<Table>; i += static_cast<int>(blockDim.x))
    table[i] = Table::value(act_table_input(i));
}

// One bf16 result of a unit that holds finite values past the table: its table entry, or x (x > 0) /
// -0 (x < 0) past the table. `half`: the input's bits, `slot` its slot.
template <typename Table>
__device__ __forceinline__ u32 act_table_or_large(u32 slot, u32 half, const unsigned short* table) {
  if (slot < static_cast<u32>(kActTableEntries<Table>)) return table[slot];
  return (half & 0x8000u) ? 0x8000u : half;
}

// The activation of a unit's 16 bf16 values (8 packed words) by the table (and, where the unit holds
// finite values past it, their rule), or false where any of them is below the table, Inf or NaN:
// the caller then evaluates the whole unit as before. One branch a unit (not one a word) for the
// common case, every value inside the table; a second for units with large values.
template <typename Table>
__device__ __forceinline__ bool act_table_unit(const u32 (&w)[8], const unsigned short* table, u32 (&out)[8]) {
  constexpr u32 kFirst = kActTableFirstBits << 1;
  u32 slots[16];
  u32 largest = 0;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const u32 r = act_table_rotate(w[i]);
    slots[2 * i] = (r & 0xFFFFu) - kFirst;  // wraps below the table
    slots[2 * i + 1] = (r >> 16) - kFirst;
    largest = largest > slots[2 * i] ? largest : slots[2 * i];
    largest = largest > slots[2 * i + 1] ? largest : slots[2 * i + 1];
  }
  if (largest < static_cast<u32>(kActTableEntries<Table>)) {
#pragma unroll
    for (int i = 0; i < 8; ++i)
      out[i] = static_cast<u32>(table[slots[2 * i]]) | (static_cast<u32>(table[slots[2 * i + 1]]) << 16);
    return true;
  }
  if (largest >= kActLargeEnd) return false;
#pragma unroll
  for (int i = 0; i < 8; ++i)
    out[i] = act_table_or_large<Table>(slots[2 * i], w[i] & 0xFFFFu, table) |
             (act_table_or_large<Table>(slots[2 * i + 1], w[i] >> 16, table) << 16);
  return true;
}

// Table::evaluate_word of a unit's 8 words, by table.
template <typename Table>
__device__ __forceinline__ void act_unit_tabled(u32 (&w)[8], const unsigned short* table) {
  u32 out[8];
  if (act_table_unit<Table>(w, table, out)) {
#pragma unroll
    for (int i = 0; i < 8; ++i) w[i] = out[i];
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i) w[i] = Table::evaluate_word(w[i]);
  }
}

}  // namespace ditops::kernel

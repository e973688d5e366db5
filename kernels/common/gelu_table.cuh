// GELU(tanh) of bf16 values by table: each value rounded to bf16, read from a shared-memory table
// a CTA builds once instead of evaluated per element. Bit-exact with the evaluated form by
// construction: each entry is common/gelu.cuh's gelu_tanh_word's own result for that input, and a
// unit (16 values) with any value outside the table is evaluated as before.
//
// Why: fp8_rowwise_quant's GELU(tanh) rows are issue-bound, not memory-bound (FLUX.1's FF-down
// input at 0.74 of a copy, its single block's cat at 0.80 on an H100, act none at the copy): tanhf
// and its fp32 steps take ~30 instructions an element (sm_90 SASS), the table's lookup ~8. A bf16 input has 2^16 values; the table holds those with
// 2^-12 <= |x| < 8 (bf16 exponent fields 115..129, both signs: 3840 entries, 7.5 KiB); finite
// |x| >= 8 needs no table: there |inner| >= 24.6, tanhf(inner) is +-1 exactly, so the result is
// 0.5x * 2 = x (x > 0) or 0.5x * 0 = -0 (x < 0). The rest (smaller, Inf, NaN) is evaluated. Why the
// large values: the model benches' random FLUX.1 has 83 % of its FF-up outputs at |x| >= 8 (std 37
// on the CPU, bench.build's model), so with the table alone no unit took it and the forward lost time.
#pragma once

#include "common/gelu.cuh"
#include "common/types.cuh"

namespace ditops::kernel {

// Whether T is bf16 (no <type_traits> under NVRTC): the table's layout is bf16's.
template <typename T>
constexpr bool kIsBf16 = false;
template <>
constexpr bool kIsBf16<bf16> = true;

constexpr int kGeluTableExpLo = 115;                                     // |x| >= 2^-12
constexpr int kGeluTableExps = 15;                                       // |x| < 2^3
constexpr int kGeluTableEntries = 2 * kGeluTableExps * 128;               // 7 mantissa bits, 2 signs
constexpr unsigned kGeluTableFirstBits = unsigned{kGeluTableExpLo} << 7;  // the smallest magnitude's bits
// Slots (below) from kGeluTableEntries up to here are the finite |x| >= 8: the table's end is 8's
// slot, and Inf's ((0x7F80 << 1) in the rotated form) is the first past them.
constexpr unsigned kGeluLargeEnd = (0x7F80u << 1) - (kGeluTableFirstBits << 1);

// A word's two bf16 halves with each half's sign moved to its bit 0 (the magnitude up one bit):
// entry (magnitude - first) * 2 + sign is then the half minus (first << 1), and one unsigned
// compare tells whether the table holds it. One LOP3 for both halves: (w << 1) keeps the
// magnitudes, (w >> 15) brings bit 15 to bit 0 and bit 31 to bit 16.
__device__ __forceinline__ u32 gelu_table_rotate(u32 w) { return ((w << 1) & 0xFFFEFFFEu) | ((w >> 15) & 0x00010001u); }

// The bf16 bits of entry i's input.
__device__ __forceinline__ u32 gelu_table_input(int i) {
  return (kGeluTableFirstBits + static_cast<u32>(i >> 1)) | (static_cast<u32>(i & 1) << 15);
}

// GELU(tanh) of bf16 `bits`, rounded to bf16: gelu_tanh_word's low half of a word repeating it.
__device__ __forceinline__ unsigned short gelu_table_value(u32 bits) {
  return static_cast<unsigned short>(gelu_tanh_word<bf16>(bits | (bits << 16)));
}

// Fills table[0, kGeluTableEntries) with the CTA's threads; the caller synchronizes before reading.
__device__ __forceinline__ void build_gelu_table(unsigned short* table) {
  for (int i = static_cast<int>(threadIdx.x); i < kGeluTableEntries; i += static_cast<int>(blockDim.x))
    table[i] = gelu_table_value(gelu_table_input(i));
}

// One bf16 result of a unit that holds finite |x| >= 8: its table entry, or x (x > 0) / -0 (x < 0)
// past the table. `half`: the input's bits, `slot` its slot.
__device__ __forceinline__ u32 gelu_table_or_large(u32 slot, u32 half, const unsigned short* table) {
  if (slot < static_cast<u32>(kGeluTableEntries)) return table[slot];
  return (half & 0x8000u) ? 0x8000u : half;
}

// The GELU of a unit's 16 bf16 values (8 packed words) by the table (and, where the unit holds
// finite |x| >= 8, their rule), or false where any of them is below the table, Inf or NaN: the
// caller then evaluates the whole unit as before. One branch a unit (not one a word) for the common
// case, every value inside the table; a second for units with large values.
__device__ __forceinline__ bool gelu_table_unit(const u32 (&w)[8], const unsigned short* table, u32 (&out)[8]) {
  constexpr u32 kFirst = kGeluTableFirstBits << 1;
  u32 slots[16];
  u32 largest = 0;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const u32 r = gelu_table_rotate(w[i]);
    slots[2 * i] = (r & 0xFFFFu) - kFirst;  // wraps below the table
    slots[2 * i + 1] = (r >> 16) - kFirst;
    largest = largest > slots[2 * i] ? largest : slots[2 * i];
    largest = largest > slots[2 * i + 1] ? largest : slots[2 * i + 1];
  }
  if (largest < static_cast<u32>(kGeluTableEntries)) {
#pragma unroll
    for (int i = 0; i < 8; ++i)
      out[i] = static_cast<u32>(table[slots[2 * i]]) | (static_cast<u32>(table[slots[2 * i + 1]]) << 16);
    return true;
  }
  if (largest >= kGeluLargeEnd) return false;
#pragma unroll
  for (int i = 0; i < 8; ++i)
    out[i] = gelu_table_or_large(slots[2 * i], w[i] & 0xFFFFu, table) |
             (gelu_table_or_large(slots[2 * i + 1], w[i] >> 16, table) << 16);
  return true;
}

// gelu_tanh_word<bf16> of a unit's 8 words, by table.
__device__ __forceinline__ void gelu_tanh_unit_tabled(u32 (&w)[8], const unsigned short* table) {
  u32 out[8];
  if (gelu_table_unit(w, table, out)) {
#pragma unroll
    for (int i = 0; i < 8; ++i) w[i] = out[i];
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i) w[i] = gelu_tanh_word<bf16>(w[i]);
  }
}

}  // namespace ditops::kernel

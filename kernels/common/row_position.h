// A row's (batch, token) = (row / S, row % S), and its advance through a persistent loop that steps
// rows by a fixed `step` (the grid): a CTA divides its first row once and then adds step / S and
// step % S, carrying a token overflow into the batch. A 64-bit division is ~20 dependent uniform
// instructions with a MUFU.RCP in front of the row's first load; per row it had cost ~50 of a plain
// norm_scale_shift row's ~700 instructions a thread. Rows of the first two batches need no division.
// Plain host/device code (nvcc and NVRTC), so the CPU tests check it against division
// (tests/test_norm_scale_shift.cpp).
#pragma once

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define DITOPS_ROW_POSITION_HD __host__ __device__
#else
#define DITOPS_ROW_POSITION_HD
#endif

namespace ditops {

struct RowPosition {
  long long b, s;
};

DITOPS_ROW_POSITION_HD inline RowPosition row_position(long long row, long long seq) {
  if (row < seq) return {0, row};
  if (row - seq < seq) return {1, row - seq};
  const long long b = row / seq;
  return {b, row - b * seq};
}

// `stride` is row_position(step, seq): whole batches and the remaining tokens of one step.
DITOPS_ROW_POSITION_HD inline RowPosition advance_row_position(RowPosition at, RowPosition stride, long long seq) {
  at.b += stride.b;
  at.s += stride.s;  // < 2 * seq
  if (at.s >= seq) {
    at.s -= seq;
    ++at.b;
  }
  return at;
}

}  // namespace ditops

#undef DITOPS_ROW_POSITION_HD

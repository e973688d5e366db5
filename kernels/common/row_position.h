// A row's (batch, token) = (row / S, row % S), and its advance through a persistent loop that steps
// rows by a fixed `step` (the grid): a CTA divides its first row once and then adds step / S and
// step % S, carrying a token overflow into the batch. A 64-bit division is ~20 dependent uniform
// instructions with a MUFU.RCP in front of the row's first load; per row it had cost ~50 of a plain
// norm_scale_shift row's ~700 instructions a thread. Rows of the first two batches need no division.
// Plain host/device code (nvcc and NVRTC), so the CPU tests check it against division
// (tests/test_norm_scale_shift.cpp), the offsets too.
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

// One step of the loop in place: adds `stride` (row_position(step, seq): whole batches and the
// remaining tokens of one step) and carries a token overflow into the batch. Returns whether it
// carried, i.e. which offset step (offset_at(wrapped)) the rows' pointers take.
DITOPS_ROW_POSITION_HD inline bool advance_row_position_wrapped(RowPosition& at, RowPosition stride, long long seq) {
  at.b += stride.b;
  at.s += stride.s;  // < 2 * seq
  const bool wrapped = at.s >= seq;
  if (wrapped) {
    at.s -= seq;
    ++at.b;
  }
  return wrapped;
}

DITOPS_ROW_POSITION_HD inline RowPosition advance_row_position(RowPosition at, RowPosition stride, long long seq) {
  advance_row_position_wrapped(at, stride, seq);
  return at;
}

// The same step as an offset into a tensor of (batch, token) strides: `step` elements where the
// token stays in its batch, `step + wrap` where it passes into the next one (offset_at), so a loop
// adds to its row pointers instead of computing b * batch_stride + s * token_stride a row.
struct OffsetStep {
  long long step, wrap;
};

DITOPS_ROW_POSITION_HD inline OffsetStep offset_step(RowPosition stride, long long seq, long long batch_stride,
                                                     long long token_stride) {
  return {stride.b * batch_stride + stride.s * token_stride, batch_stride - seq * token_stride};
}

DITOPS_ROW_POSITION_HD inline long long offset_at(OffsetStep st, bool wrapped) {
  return wrapped ? st.step + st.wrap : st.step;
}

}  // namespace ditops

#undef DITOPS_ROW_POSITION_HD

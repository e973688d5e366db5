// Host cost of one call through the C++ facade on the CPU path (an experiment, not a benchmark of
// the kernels): argument matching, dispatch and the CPU reference on a problem of one row, so
// that the reference's arithmetic is a small constant; every op of the library. Uses the public headers only, so the same
// file builds against any commit's library and two builds compare with one method
// (docs/tuning/host_overhead.md):
//   g++ -std=c++20 -O2 -I include bench/experiments/host_overhead_cpu.cpp -L BUILD -lditops \
//       -Wl,-rpath,BUILD -o /tmp/host_overhead && /tmp/host_overhead
// Prints, per op, the best of ROUNDS rounds of CALLS back-to-back calls, in us per call. On a
// shared machine count instructions instead (repeatable whatever else runs): `count OP N` makes
// N calls of one op and nothing else, so the difference of two callgrind totals over the
// difference of their N is the instructions of one call:
//   valgrind --tool=callgrind --callgrind-out-file=/dev/null /tmp/host_overhead count qknorm_rope 1000
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "ditops/causal_conv3d_cat_pad.h"
#include "ditops/cross_head_qknorm_rope.h"
#include "ditops/fp8_linear.h"
#include "ditops/fp8_rowwise_quant.h"
#include "ditops/fp8_static_quant.h"
#include "ditops/joint_qknorm_rope.h"
#include "ditops/layernorm_modulate.h"
#include "ditops/norm_scale_shift.h"
#include "ditops/qknorm_rope.h"
#include "ditops/residual_gate_add.h"
#include "ditops/token_cat_fp8.h"

using namespace ditops;

namespace {

const Device kCpu{DeviceKind::cpu, 0};

TensorView view(std::vector<uint16_t>& v, DType dtype, std::vector<int64_t> shape) {
  return TensorView::contiguous(v.data(), dtype, kCpu, shape);
}

double per_call_us(const std::function<void()>& call, int calls, int rounds) {
  for (int i = 0; i < calls / 10; ++i) call();
  double best = 1e30;
  for (int r = 0; r < rounds; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < calls; ++i) call();
    const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    best = std::min(best, us / calls);
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  const bool count = argc > 3 && std::string(argv[1]) == "count";
  const int calls = count ? std::atoi(argv[3]) : argc > 1 ? std::atoi(argv[1]) : 20000;
  const int rounds = !count && argc > 2 ? std::atoi(argv[2]) : 7;
  const uint16_t one_bf16 = 0x3f80;

  // qknorm_rope: 1 token, 1 + 1 heads of 64, interleaved RoPE over the whole head, fp32 cache.
  std::vector<uint16_t> q(64, one_bf16), k(64, one_bf16), wq(64, one_bf16), wk(64, one_bf16);
  std::vector<uint16_t> cache(2 * 64 * 2, 0), positions(4, 0);  // fp32 [2, 64], int64 [1]
  const TensorView vq = view(q, DType::bf16, {1, 1, 64}), vk = view(k, DType::bf16, {1, 1, 64});
  const TensorView vwq = view(wq, DType::bf16, {64}), vwk = view(wk, DType::bf16, {64});
  const TensorView vcache = view(cache, DType::f32, {2, 64}), vpos = view(positions, DType::i64, {1});

  // residual_gate_add: [1, 1, 64] with a row gate [1, 1, 64].
  std::vector<uint16_t> residual(64, one_bf16), update(64, one_bf16), gate(64, one_bf16), out(64, 0);
  const TensorView vres = view(residual, DType::bf16, {1, 1, 64}), vupd = view(update, DType::bf16, {1, 1, 64});
  const TensorView vgate = view(gate, DType::bf16, {1, 1, 64}), vout = view(out, DType::bf16, {1, 1, 64});

  // token_cat_fp8: [1, 1, 32] + [1, 1, 32] -> [1, 1, 64] e4m3, scale 1 (checked on the host).
  std::vector<uint16_t> attn(32, one_bf16), mlp(32, one_bf16), fp8_out(32, 0);
  std::vector<uint16_t> scale(2, 0);
  const float one = 1.0f;
  std::copy_n(reinterpret_cast<const uint16_t*>(&one), 2, scale.data());
  const TensorView vattn = view(attn, DType::bf16, {1, 1, 32}), vmlp = view(mlp, DType::bf16, {1, 1, 32});
  const TensorView vscale = view(scale, DType::f32, {1}), vfp8 = view(fp8_out, DType::f8e4m3fn, {1, 1, 64});

  // layernorm_modulate: x [1, 1, 64], scale and shift [1, 64].
  std::vector<uint16_t> x(64, one_bf16), mod_scale(64, 0), mod_shift(64, 0), ln_out(64, 0);
  const TensorView vx = view(x, DType::bf16, {1, 1, 64}), vlo = view(ln_out, DType::bf16, {1, 1, 64});
  const TensorView vms = view(mod_scale, DType::bf16, {1, 64}), vmh = view(mod_shift, DType::bf16, {1, 64});

  // layernorm_modulate_fp8: the same with a [1, 1, 64] e4m3 out; qk_head_layernorm: q, k [1, 1, 1, 64].
  std::vector<uint16_t> ln_fp8(32, 0), qo(64, 0), ko(64, 0);
  const TensorView vlf = view(ln_fp8, DType::f8e4m3fn, {1, 1, 64});
  const TensorView vq4 = view(q, DType::bf16, {1, 1, 1, 64}), vk4 = view(k, DType::bf16, {1, 1, 1, 64});
  const TensorView vqo = view(qo, DType::bf16, {1, 1, 1, 64}), vko = view(ko, DType::bf16, {1, 1, 1, 64});

  // fp8_static_quant: x [1, 64] -> e4m3 [1, 64].
  const TensorView vx2 = view(x, DType::bf16, {1, 64}), vsq = view(fp8_out, DType::f8e4m3fn, {1, 64});

  // norm_scale_shift: x [1, 1, 64], scale and shift [64], y [1, 1, 64].
  NormScaleShiftInputs nss_in;
  nss_in.x = vx;
  nss_in.scale = view(mod_scale, DType::bf16, {64});
  nss_in.shift = view(mod_shift, DType::bf16, {64});
  NormScaleShiftOutputs nss_out;
  nss_out.y = vlo;

  // cross_head_qknorm_rope: q, k [1, 1, 64] in place, one head of 64, no weights, no rotation.
  CrossHeadQkNormRopeOptions cross;
  cross.head_dim = 64;
  cross.rope = CrossHeadRope::none;

  // causal_conv3d_cat_pad: x [1, 1, 1, 2, 32] with a cache of one frame, padded by one frame.
  std::vector<uint16_t> conv_out(3 * 64, 0);
  const TensorView vcx = view(x, DType::bf16, {1, 1, 1, 2, 32}), vcc = view(mod_scale, DType::bf16, {1, 1, 1, 2, 32});
  const TensorView vco = view(conv_out, DType::bf16, {1, 1, 3, 2, 32});
  CausalConv3dCatPadOptions pad;
  pad.pad_t_left = 2;

  // fp8_linear: e4m3 x [1, 32] (the fp8_out bytes) against an e4m3 w [2, 32], bf16 out [1, 2].
  std::vector<uint16_t> w(32, 0), lin_out(2, 0);
  const TensorView vlx = view(fp8_out, DType::f8e4m3fn, {1, 32}), vw = view(w, DType::f8e4m3fn, {2, 32});
  const TensorView vlo2 = view(lin_out, DType::bf16, {1, 2});

  // fp8_rowwise_quant: x [1, 64] -> e4m3 [1, 64] and its fp32 scale [1, 1] (no prefix);
  // layernorm_modulate_fp8_rowwise: layernorm_modulate's inputs -> e4m3 [1, 1, 64], scale [1, 1, 1].
  std::vector<uint16_t> row_scale(2, 0);
  const TensorView vrs = view(row_scale, DType::f32, {1, 1}), vrs3 = view(row_scale, DType::f32, {1, 1, 1});

  // joint_qknorm_rope: one token of one head of 64 per stream (q, k, v of each the same buffers),
  // qknorm_rope's weights and fp32 cache, positions int64 [2], joint q, k, v [1, 2, 1, 64].
  std::vector<uint16_t> jq(128, 0), jk(128, 0), jv(128, 0), jpos(8, 0);
  const TensorView vj = view(q, DType::bf16, {1, 1, 1, 64});
  const TensorView vjq = view(jq, DType::bf16, {1, 2, 1, 64}), vjk = view(jk, DType::bf16, {1, 2, 1, 64});
  const TensorView vjv = view(jv, DType::bf16, {1, 2, 1, 64}), vjpos = view(jpos, DType::i64, {2});

  const std::pair<const char*, std::function<void()>> ops[] = {
      {"qknorm_rope", [&] { qknorm_rope(vq, vk, vwq, vwk, vcache, vpos); }},
      {"residual_gate_add", [&] { residual_gate_add(vres, vupd, vgate, vout); }},
      {"token_cat_fp8", [&] { token_cat_fp8(vattn, vmlp, vscale, vfp8); }},
      {"layernorm_modulate", [&] { layernorm_modulate(vx, vms, vmh, vlo); }},
      {"layernorm_modulate_fp8", [&] { layernorm_modulate_fp8(vx, vms, vmh, vscale, vlf); }},
      {"qk_head_layernorm", [&] { qk_head_layernorm(vq4, vk4, vqo, vko); }},
      {"fp8_static_quant", [&] { fp8_static_quant(vx2, vscale, vsq); }},
      {"norm_scale_shift", [&] { norm_scale_shift(nss_in, nss_out); }},
      {"cross_head_qknorm_rope", [&] { cross_head_qknorm_rope(vq, vk, {}, {}, {}, {}, {}, {}, cross); }},
      {"causal_conv3d_cat_pad", [&] { causal_conv3d_cat_pad(vcx, vcc, vco, pad); }},
      {"fp8_linear", [&] { fp8_linear(vlx, vscale, vw, vscale, {}, vlo2); }},
      {"fp8_rowwise_quant", [&] { fp8_rowwise_quant(vx2, {}, vsq, vrs); }},
      {"layernorm_modulate_fp8_rowwise", [&] { layernorm_modulate_fp8_rowwise(vx, vms, vmh, vlf, vrs3); }},
      {"joint_qknorm_rope",
       [&] { joint_qknorm_rope(vj, vj, vj, vj, vj, vj, vwq, vwk, vwq, vwk, vcache, vjpos, vjq, vjk, vjv); }},
  };
  if (count) {
    for (const auto& [name, call] : ops)
      if (name == std::string(argv[2]))
        for (int i = 0; i < calls; ++i) call();
    return 0;
  }
  std::printf("host overhead per call, CPU path (C++ facade: match + dispatch + reference, one row), best of %d x %d "
              "calls\n", rounds, calls);
  for (const auto& [name, call] : ops) std::printf("  %-31s %7.3f us\n", name, per_call_us(call, calls, rounds));
  return 0;
}

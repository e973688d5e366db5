// `ditops bench qknorm_rope` and `ditops demo`: CUDA events, L2 flushed between repetitions,
// median of many runs; GB/s by the byte model (each input read once, each output written once)
// and the fraction of a device-to-device copy of the same bytes measured in the same run.
#include "tools/bench_common.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>

#include "ditops/qknorm_rope.h"
#include "jit/cuda_driver.h"
#include "jit/jit.h"
#include "reference/half.h"

namespace ditops::cli {

namespace {

using jit::check_cu;

struct QkCase {
  std::string name;
  int64_t tokens;
  int hq, hk, head_dim, rope_dim;
  bool neox;
};

const std::vector<QkCase>& bench_cases() {
  static const std::vector<QkCase> cases = {
      {"FLUX.1 1024px (4608 tok, 24h)", 4608, 24, 24, 128, 128, false},
      {"Qwen-Image 1328px (6912 tok, 24h)", 6912, 24, 24, 128, 128, true},
      {"Z-Image (4096 tok, 30h)", 4096, 30, 30, 128, 128, false},
      {"HunyuanVideo 720p (~30k tok, 24h)", 30000, 24, 24, 128, 128, true},
      {"Wan-like 480p (32760 tok, 40h)", 32760, 40, 40, 128, 128, true},
      {"GQA 32q/8kv hd128 (8192 tok)", 8192, 32, 8, 128, 128, true},
      {"partial rope hd128 r64 (8192 tok)", 8192, 32, 8, 128, 64, true},
      {"small: 256 tok 24h", 256, 24, 24, 128, 128, false},
  };
  return cases;
}

// Host-side problem with random data (never zeros) in bf16, an fp32 compact cache, int64 positions.
struct HostProblem {
  QkCase c;
  int64_t cache_rows;
  std::vector<uint16_t> q, k, wq, wk;
  std::vector<float> cache;
  std::vector<int64_t> pos;
  explicit HostProblem(const QkCase& qc, uint32_t seed = 1) : c(qc) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::uniform_real_distribution<float> uni(0.5f, 1.5f);
    q.resize(c.tokens * c.hq * c.head_dim);
    k.resize(c.tokens * c.hk * c.head_dim);
    for (auto& v : q) v = ref::float_to_bf16_rne(normal(rng));
    for (auto& v : k) v = ref::float_to_bf16_rne(normal(rng));
    wq.resize(c.head_dim);
    wk.resize(c.head_dim);
    for (auto& v : wq) v = ref::float_to_bf16_rne(uni(rng));
    for (auto& v : wk) v = ref::float_to_bf16_rne(uni(rng));
    cache_rows = std::max<int64_t>(c.tokens, 4096);
    cache.resize(cache_rows * c.rope_dim);
    for (int64_t p = 0; p < cache_rows; ++p)
      for (int j = 0; j < c.rope_dim / 2; ++j) {
        const double theta = p * std::pow(10000.0, -2.0 * j / c.rope_dim);
        cache[p * c.rope_dim + j] = static_cast<float>(std::cos(theta));
        cache[p * c.rope_dim + c.rope_dim / 2 + j] = static_cast<float>(std::sin(theta));
      }
    pos.resize(c.tokens);
    for (int64_t t = 0; t < c.tokens; ++t) pos[t] = (t * 7919) % cache_rows;
  }
  int64_t model_bytes() const {
    return 2 * static_cast<int64_t>(q.size() + k.size()) * 2 + c.tokens * c.rope_dim * 4 + c.tokens * 8 +
           2 * c.head_dim * 2;
  }
};

struct DeviceProblem {
  DeviceBuffer q, k, wq, wk, cache, pos;
  explicit DeviceProblem(const HostProblem& h)
      : q(h.q.size() * 2), k(h.k.size() * 2), wq(h.wq.size() * 2), wk(h.wk.size() * 2),
        cache(h.cache.size() * 4), pos(h.pos.size() * 8) {
    q.upload(h.q.data());
    k.upload(h.k.data());
    wq.upload(h.wq.data());
    wk.upload(h.wk.data());
    cache.upload(h.cache.data());
    pos.upload(h.pos.data());
  }
};

struct Views {
  TensorView q, k, wq, wk, cache, pos;
};

Views views_of(const QkCase& c, int64_t cache_rows, Device dev, void* q, void* k, void* wq, void* wk,
               void* cache, void* pos) {
  return {TensorView::contiguous(q, DType::bf16, dev, {c.tokens, c.hq, c.head_dim}),
          TensorView::contiguous(k, DType::bf16, dev, {c.tokens, c.hk, c.head_dim}),
          TensorView::contiguous(wq, DType::bf16, dev, {c.head_dim}),
          TensorView::contiguous(wk, DType::bf16, dev, {c.head_dim}),
          TensorView::contiguous(cache, DType::f32, dev, {cache_rows, c.rope_dim}),
          TensorView::contiguous(pos, DType::i64, dev, {c.tokens})};
}

}  // namespace

int run_bench_qknorm_rope(const Args& args) {
  if (!BenchRun::gpu_available("qknorm_rope")) return kExitNoGpu;
  BenchRun run("qknorm_rope", args);
  const Device dev{DeviceKind::cuda, 0};
  // --host-only: just the per-call host cost below.
  for (const QkCase& c : args.has("--host-only") ? std::vector<QkCase>{} : bench_cases()) {
    HostProblem h(c);
    DeviceProblem p(h);
    const int64_t bytes = h.model_bytes();
    const double copy_us = run.copy_us(bytes);
    // q's and k's shapes [T, H, D].
    const std::string shape = shape_string({c.tokens, c.hq, c.head_dim}) + "," + shape_string({c.tokens, c.hk, c.head_dim});
    run.record(c.name, shape, "device_copy", kColdL2, copy_us, bytes, copy_us);
    const Views v = views_of(c, h.cache_rows, dev, p.q.get(), p.k.get(), p.wq.get(), p.wk.get(),
                             p.cache.get(), p.pos.get());
    for (Provenance backend : {Provenance::aot, Provenance::jit}) {
      for (QkRounding rounding : {QkRounding::rounded, QkRounding::fp32}) {
        QkNormRopeOptions opt;
        opt.is_neox = c.neox;
        opt.rounding = rounding;
        opt.dispatch.backend = backend;
        opt.dispatch.quality = Quality::high;
        const QkNormRopeCall call = match_qknorm_rope(v.q, v.k, v.wq, v.wk, v.cache, v.pos, opt);
        if (!explain_qknorm_rope(call).chosen) continue;  // e.g. no prebuilt key
        const double us = run.time_us([&] { qknorm_rope(v.q, v.k, v.wq, v.wk, v.cache, v.pos, opt); });
        run.record(c.name, shape, std::string("ditops:") + provenance_name(backend) +
                   (rounding == QkRounding::fp32 ? ":fp32" : ""), kColdL2, us, bytes, copy_us);
      }
    }
  }
  {
    // Host cost of one call through the facade (argument matching, dispatch, launch): wall clock
    // of many back-to-back calls on a tiny problem, divided by their number.
    const QkCase tiny{"host overhead (1 token, 24 heads)", 1, 24, 24, 128, 128, false};
    HostProblem h(tiny);
    DeviceProblem p(h);
    const Views v = views_of(tiny, h.cache_rows, dev, p.q.get(), p.k.get(), p.wq.get(), p.wk.get(),
                             p.cache.get(), p.pos.get());
    QkNormRopeOptions opt;
    for (int i = 0; i < 200; ++i) qknorm_rope(v.q, v.k, v.wq, v.wk, v.cache, v.pos, opt);
    check_cu(jit::require_cuda_driver().cuCtxSynchronize(), "sync");
    const int calls = 5000;
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < calls; ++i) qknorm_rope(v.q, v.k, v.wq, v.wk, v.cache, v.pos, opt);
    const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / calls;
    check_cu(jit::require_cuda_driver().cuCtxSynchronize(), "sync");
    run.record_time("host overhead per call (match + dispatch + launch)", "(1,24,128),(1,24,128)", "ditops:c++ facade", us);
  }
  run.write_json();
  return 0;
}

const BenchRegistration kRegistered("qknorm_rope", run_bench_qknorm_rope);

int run_demo(const Args& args) {
  const QkCase c{"FLUX.1 attention prep", 4608, 24, 24, 128, 128, false};
  HostProblem h(c, 7);
  std::string why;
  const bool gpu = jit::cuda_driver(&why) != nullptr;
  std::printf("ditops demo: FLUX.1 attention prep, QK RMSNorm + RoPE in place on %lld tokens x %d "
              "heads x %d (interleaved, bf16, fp32 [cos|sin] cache)\n",
              static_cast<long long>(c.tokens), c.hq, c.head_dim);
  // The reference on the host copy.
  std::vector<uint16_t> q_ref = h.q, k_ref = h.k;
  const Device cpu{DeviceKind::cpu, 0};
  const Views hv = views_of(c, h.cache_rows, cpu, q_ref.data(), k_ref.data(), h.wq.data(), h.wk.data(),
                            h.cache.data(), h.pos.data());
  QkNormRopeOptions opt;
  const auto t0 = std::chrono::steady_clock::now();
  const std::string ref_impl = qknorm_rope(hv.q, hv.k, hv.wq, hv.wk, hv.cache, hv.pos, opt);
  const double ref_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  if (!gpu) {
    std::printf("notice: %s -> only the CPU reference backend can run here.\n", why.c_str());
    std::printf("ran %s (the CPU reference) in %.2f ms (wall clock, host); nothing was checked: with a CUDA GPU "
                "the demo runs the best GPU backend and compares its output with this reference\n",
                ref_impl.c_str(), ref_ms);
    return 0;
  }
  const Device dev{DeviceKind::cuda, 0};
  jit::bind_primary_context(0);
  DeviceProblem p(h);
  const Views v = views_of(c, h.cache_rows, dev, p.q.get(), p.k.get(), p.wq.get(), p.wk.get(),
                           p.cache.get(), p.pos.get());
  const std::string impl = qknorm_rope(v.q, v.k, v.wq, v.wk, v.cache, v.pos, opt);
  std::vector<uint16_t> q_gpu(h.q.size()), k_gpu(h.k.size());
  p.q.download(q_gpu.data());
  p.k.download(k_gpu.data());
  int64_t differ = 0;
  for (size_t i = 0; i < q_gpu.size(); ++i) differ += q_gpu[i] != q_ref[i];
  for (size_t i = 0; i < k_gpu.size(); ++i) differ += k_gpu[i] != k_ref[i];
  // Time it (cold L2) on fresh inputs.
  p.q.upload(h.q.data());
  p.k.upload(h.k.data());
  DeviceBuffer flush(256u << 20);
  const double us = median_us([&] { qknorm_rope(v.q, v.k, v.wq, v.wk, v.cache, v.pos, opt); }, 20, flush);
  std::printf("ran %s on %s: %.2f us (median of 20, cold L2); %.1f GB/s by the byte model\n", impl.c_str(),
              device_info(dev).name.c_str(), us, h.model_bytes() / (us * 1e-6) / 1e9);
  std::printf("check against the CPU reference (%s, %.1f ms): %lld of %zu values differ "
              "(allowed: rsqrtf vs correctly rounded rsqrt, 1 ulp)\n",
              ref_impl.c_str(), ref_ms, static_cast<long long>(differ), q_gpu.size() + k_gpu.size());
  return 0;
}

}  // namespace ditops::cli

// Tuning experiment for the adaLN row kernels (not part of the library): times variants of
// kernels/layernorm_modulate.cuh (and, with -DDITOPS_TUNE_NSS, kernels/norm_scale_shift.cuh's
// eager numerics, the copy there timed cold only) on
// model shapes, cold L2 (256 MiB memset before each repetition) and with rotated buffers (24 input
// and output sets back to back, > 2x the L2), against a device copy of the same bytes. Every
// variant's output is compared byte for byte with the one-row-per-CTA variant (the schedule whose
// numerics the GPU tests and the torch.equal runs verified). Built and run by run_tune.sh.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "layernorm_modulate.cuh"
#include "tune_common.cuh"
#include "norm_scale_shift.cuh"
#include "residual_gate_add.cuh"

using ditops::LayerNormModulateParams;
using ditops::NormScaleShiftParams;
using ditops::kernel::bf16;

// kRowwise: the layernorm_modulate_fp8_rowwise body (e4m3 bytes and a scale per row). kStages: x
// through the body's shared-memory ring of that many rows (0: registers, kPrefetch as given).
template <int kSlots, bool kPrefetch, int kMinBlocks, bool kEven, bool kRowwise, int kStages>
__global__ void __launch_bounds__(128, kMinBlocks) lnm_variant(const __grid_constant__ LayerNormModulateParams p) {
  ditops::layernorm_modulate_body<kSlots, true, true, kRowwise, false, false, true, kEven, kPrefetch, kRowwise, kStages>(p);
}

// The bf16 bits of a finite float, rounded to nearest even (host inputs of the cases).
static unsigned short bf16_bits(float f) {
  unsigned u;
  std::memcpy(&u, &f, 4);
  return (unsigned short)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

static void* g_flush;
static const size_t kFlushBytes = 256u << 20;

float median_us(const std::function<void()>& f) { return median_us(f, g_flush, kFlushBytes); }

// Time per call of f(set) for sets 0..n-1 launched back to back (each set untouched since the
// previous round of n sets), median of 15 rounds.
float rotated_us(int n, const std::function<void(int)>& f) {
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  for (int i = 0; i < n; ++i) f(i);
  std::vector<float> t;
  for (int r = 0; r < 15; ++r) {
    CHECK(cudaEventRecord(a));
    for (int i = 0; i < n; ++i) f(i);
    CHECK(cudaEventRecord(b));
    CHECK(cudaEventSynchronize(b));
    float ms;
    CHECK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms * 1000 / n);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}


// A device copy as a kernel (16-byte words, grid-stride): the copy reference of rotated_graph_us.
__global__ void copy_words(const uint4* __restrict__ src, uint4* __restrict__ dst, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) dst[i] = src[i];
}

// "equal" / "DIFFERENT" against the first variant's output, or for the first variant
// "reference" and an FNV-1a hash of its bytes: equal hashes in two builds (run_tune.sh ab) mean
// equal outputs.
template <typename Out>
const char* compare_to_reference(const Out& out, Out& reference, char (&hashed)[40]) {
  if (!reference.empty()) return out == reference ? "equal" : "DIFFERENT";
  reference = out;
  unsigned long long h = 1469598103934665603ull;
  const unsigned char* bytes = reinterpret_cast<const unsigned char*>(out.data());
  for (size_t i = 0; i < out.size() * sizeof(out[0]); ++i) h = (h ^ bytes[i]) * 1099511628211ull;
  std::snprintf(hashed, sizeof hashed, "reference %016llx", h);
  return hashed;
}

// One variant's line: output compared with the case's first variant, cold and rotated times.
template <typename Kernel, typename Params, typename Out>
void report(const char* label, Kernel kernel, int per_sm, long long grid, const Params& p0, const std::vector<Params>& ps,
            const Out& out, Out& reference, double copy_cold, double copy_rot, int threads = 128) {
  cudaFuncAttributes attr;
  CHECK(cudaFuncGetAttributes(&attr, kernel));
  char hashed[40];
  const char* equal = compare_to_reference(out, reference, hashed);
  const float cold = median_us([&] { kernel<<<grid, threads>>>(p0); });
  const float rot = rotated_us((int)ps.size(), [&](int i) { kernel<<<grid, threads>>>(ps[i]); });
  CHECK(cudaGetLastError());
  std::printf("  %-26s regs %3d spill %4d  %2d/SM grid %6lld  cold %8.2f us (%5.1f%%)  rotated %8.2f us (%5.1f%%)  %s\n",
              label, attr.numRegs, (int)attr.localSizeBytes, per_sm, grid, cold, 100.0 * copy_cold / cold, rot,
              100.0 * copy_rot / rot, equal);
}

struct Case {
  const char* name;
  long long batch, seq;
  int dim;
};

struct Buffers {
  void *x, *out, *scale, *shift;
  float* row_scales;  // the rowwise variants' per-row scales
};

std::vector<unsigned char> g_reference;  // output bytes of the first variant of the case (rowwise: + scales)

template <int kSlots, bool kPrefetch, int kMinBlocks, bool kEven = true, bool kRowwise = false, int kStages = 0>
void run_variant(const char* label, const Case& c, const std::vector<Buffers>& sets, bool persistent,
                 double copy_cold, double copy_rot) {
  auto kernel = lnm_variant<kSlots, kPrefetch, kMinBlocks, kEven, kRowwise, kStages>;
  int per_sm = 0, sms = 0;
  CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, 128, 0));
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const long long rows = c.batch * c.seq;
  long long grid = rows;
  if (persistent) {
    const long long resident = (long long)per_sm * sms;
    const long long per_cta = (rows + resident - 1) / resident;
    grid = (rows + per_cta - 1) / per_cta;
  }
  auto params = [&](const Buffers& b) {
    LayerNormModulateParams p{};
    p.x = b.x;
    p.out = b.out;
    p.scale = b.scale;
    p.shift = b.shift;
    p.rows = rows;
    p.seq = c.seq;
    p.x_batch_stride = c.seq * c.dim;
    p.x_token_stride = c.dim;
    p.out_batch_stride = c.seq * c.dim;
    p.out_token_stride = c.dim;
    p.scale_row_stride = 6 * c.dim;  // a chunk of a [B, 6D] adaLN projection
    p.shift_row_stride = 6 * c.dim;
    p.n_vec = c.dim / 4;
    p.eps = 1e-6f;
    if (kRowwise) p.out_scale = b.row_scales;
    return p;
  };
  const LayerNormModulateParams p0 = params(sets[0]);
  const size_t out_bytes = rows * c.dim * (kRowwise ? 1 : 2);
  CHECK(cudaMemset(sets[0].out, 0xff, out_bytes));
  kernel<<<grid, 128>>>(p0);
  CHECK(cudaDeviceSynchronize());
  std::vector<unsigned char> out(out_bytes + (kRowwise ? rows * 4 : 0));
  CHECK(cudaMemcpy(out.data(), sets[0].out, out_bytes, cudaMemcpyDeviceToHost));
  if (kRowwise) CHECK(cudaMemcpy(out.data() + out_bytes, sets[0].row_scales, rows * 4, cudaMemcpyDeviceToHost));
  std::vector<LayerNormModulateParams> ps;
  for (const Buffers& b : sets) ps.push_back(params(b));
  report(label, kernel, per_sm, grid, p0, ps, out, g_reference, copy_cold, copy_rot);
}

// kRowwise: the fp8_rowwise body's variants, against a copy of the bytes it moves (2 read + 1
// written per element: a copy of 1.5 bytes per element).
template <int kSlots, bool kRowwise = false>
void run_case(const Case& c) {
  const long long rows = c.batch * c.seq;
  const size_t xbytes = rows * c.dim * 2;
  // Enough sets that one round moves > 2x the L2 (50 MB), at least 2.
  const int nsets = (int)std::min<long long>(24, std::max<long long>(2, (long long)(120e6 / (2.0 * xbytes)) + 1));
  std::vector<Buffers> sets(nsets);
  std::vector<unsigned short> hx(rows * c.dim), hm(c.batch * 6 * c.dim);
  std::mt19937 rng(7);
  std::normal_distribution<float> nd;
  for (size_t i = 0; i < hx.size(); ++i) hx[i] = bf16_bits(nd(rng) * (i % 97 == 0 ? 30.f : 1.f) + 0.25f);
  for (auto& v : hm) v = bf16_bits(0.3f * nd(rng));
  for (auto& s : sets) {
    CHECK(cudaMalloc(&s.x, xbytes));
    CHECK(cudaMalloc(&s.out, xbytes));
    CHECK(cudaMalloc(&s.row_scales, rows * 4));
    void* mod;
    CHECK(cudaMalloc(&mod, hm.size() * 2));
    CHECK(cudaMemcpy(s.x, hx.data(), xbytes, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(mod, hm.data(), hm.size() * 2, cudaMemcpyHostToDevice));
    s.scale = static_cast<char*>(mod) + 2 * c.dim;  // chunk 1 scale, chunk 0 shift (as FLUX)
    s.shift = mod;
  }
  const size_t copied = kRowwise ? xbytes / 4 * 3 : xbytes;
  const double copy_cold = median_us([&] { CHECK(cudaMemcpyAsync(sets[0].out, sets[0].x, copied, cudaMemcpyDeviceToDevice)); });
  const double copy_rot = rotated_us(nsets, [&](int i) { CHECK(cudaMemcpyAsync(sets[i].out, sets[i].x, copied, cudaMemcpyDeviceToDevice)); });
  std::printf("%s%s: copy of %zu bytes cold %.2f us, rotated %.2f us (%d sets)\n", c.name, kRowwise ? " fp8_rowwise" : "",
              copied, copy_cold, copy_rot, nsets);
  g_reference.clear();
  if constexpr (kRowwise) {  // the library: persistent, prefetch up to 10 slots, 6 CTAs per SM up to 6 slots
    run_variant<kSlots, kSlots <= 10, (kSlots <= 6 ? 6 : 1), true, true>("library schedule", c, sets, true, copy_cold, copy_rot);
    run_variant<kSlots, false, 1, true, true>("one row per CTA", c, sets, false, copy_cold, copy_rot);
    run_variant<kSlots, false, 1, true, true>("persistent", c, sets, true, copy_cold, copy_rot);
    run_variant<kSlots, false, 6, true, true>("persistent mb6", c, sets, true, copy_cold, copy_rot);
    run_variant<kSlots, false, 8, true, true>("persistent mb8", c, sets, true, copy_cold, copy_rot);
    run_variant<kSlots, true, 4, true, true>("persistent+prefetch mb4", c, sets, true, copy_cold, copy_rot);
    run_variant<kSlots, true, 5, true, true>("persistent+prefetch mb5", c, sets, true, copy_cold, copy_rot);
    run_variant<kSlots, true, 8, true, true>("persistent+prefetch mb8", c, sets, true, copy_cold, copy_rot);
    // The shared-memory ring (kStages rows, kStages - 1 ahead of the one computed): rows in flight
    // per SM without a prefetched row's registers.
    run_variant<kSlots, false, 6, true, true, 2>("ring2 mb6", c, sets, true, copy_cold, copy_rot);
    run_variant<kSlots, false, 6, true, true, 3>("ring3 mb6", c, sets, true, copy_cold, copy_rot);
    run_variant<kSlots, false, 8, true, true, 3>("ring3 mb8", c, sets, true, copy_cold, copy_rot);
    run_variant<kSlots, false, 6, true, true, 4>("ring4 mb6", c, sets, true, copy_cold, copy_rot);
    run_variant<kSlots, false, 4, true, true, 4>("ring4 mb4", c, sets, true, copy_cold, copy_rot);
    for (auto& s : sets) {
      cudaFree(s.x);
      cudaFree(s.out);
      cudaFree(s.shift);
      cudaFree(s.row_scales);
    }
    return;
  }
  run_variant<kSlots, false, 1, false>("one row per CTA, general", c, sets, false, copy_cold, copy_rot);
  run_variant<kSlots, false, 1>("one row per CTA", c, sets, false, copy_cold, copy_rot);
  run_variant<kSlots, false, 1>("persistent", c, sets, true, copy_cold, copy_rot);
  run_variant<kSlots, false, 8>("persistent mb8", c, sets, true, copy_cold, copy_rot);
  run_variant<kSlots, false, 12>("persistent mb12", c, sets, true, copy_cold, copy_rot);
  run_variant<kSlots, true, 1>("persistent+prefetch", c, sets, true, copy_cold, copy_rot);
  run_variant<kSlots, true, 6>("persistent+prefetch mb6", c, sets, true, copy_cold, copy_rot);
  run_variant<kSlots, true, 8>("persistent+prefetch mb8", c, sets, true, copy_cold, copy_rot);
  for (auto& s : sets) {
    cudaFree(s.x);
    cudaFree(s.out);
    cudaFree(s.shift);
    cudaFree(s.row_scales);
  }
}

// ---------------------------------------------------------------- norm_scale_shift (eager numerics)

template <int D, bool kResidual, int kQuant, bool kPrefetch, int kMinBlocks, bool kShared, int kSplit>
__global__ void __launch_bounds__(128 * kSplit, kMinBlocks) nss_variant(const __grid_constant__ NormScaleShiftParams p) {
  ditops::norm_scale_shift_body<bf16, D, false, false, kResidual, 0, kQuant, false, kPrefetch, kShared, kSplit>(p);
}

struct NssBuffers {
  void *x, *r, *y, *ro, *mod, *fp4, *sf;
  float* gs;
};

void free_nss_buffers(std::vector<NssBuffers>& sets) {
  for (auto& s : sets) {
    cudaFree(s.x); cudaFree(s.r); cudaFree(s.y); cudaFree(s.ro); cudaFree(s.mod); cudaFree(s.fp4); cudaFree(s.sf); cudaFree(s.gs);
  }
}

std::vector<unsigned char> g_nss_reference;
// Part `profile`: each case runs the library's schedule once (for ncu), nothing timed.
static bool g_profile_only = false;
// Part `split`: the library's schedule against rows split over 128 * kSplit threads and against
// fewer CTAs, each looping over more rows (g_rows_per_cta: at least that many rows per CTA).
static bool g_split = false;
static int g_rows_per_cta = 1;

template <int D, bool kResidual, int kQuant, bool kPrefetch, int kMinBlocks, bool kShared = false, int kSplit = 1>
void run_nss_variant(const char* label, const Case& c, const std::vector<NssBuffers>& sets, double copy_cold,
                     double copy_rot) {
  auto kernel = nss_variant<D, kResidual, kQuant, kPrefetch, kMinBlocks, kShared, kSplit>;
  constexpr int kThreads = 128 * kSplit;
  int per_sm = 0, sms = 0;
  CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, 0));
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const long long rows = c.batch * c.seq;
  const long long grid_rows = kQuant >= 2 ? (rows + 127) / 128 * 128 : rows;
  const long long resident = (long long)per_sm * sms;
  const long long per_cta = std::max<long long>(g_rows_per_cta, (grid_rows + resident - 1) / resident);
  const long long grid = (grid_rows + per_cta - 1) / per_cta;
  auto params = [&](const NssBuffers& b) {
    NormScaleShiftParams p{};
    p.x = b.x;
    p.residual = kResidual ? b.r : nullptr;
    p.y = kQuant >= 2 ? nullptr : b.y;
    p.residual_out = kResidual ? b.ro : nullptr;
    p.fp4_packed = static_cast<unsigned char*>(b.fp4);
    p.fp4_scales = static_cast<unsigned char*>(b.sf);
    p.global_scale = b.gs;
    auto operand = [&](int chunk) {
      ditops::NssOperandParams o{};
      o.data = static_cast<char*>(b.mod) + 2 * chunk * D;
      o.batch_stride = 6LL * D;
      o.frame_len = c.seq;
      o.kind = 2;
      return o;
    };
    p.shift = operand(0);
    p.scale = operand(1);
    p.gate = operand(2);
    p.seq = c.seq;
    p.rows = rows;
    p.grid_rows = grid_rows;
    p.x_batch_stride = p.r_batch_stride = p.y_batch_stride = p.ro_batch_stride = c.seq * D;
    p.x_token_stride = p.r_token_stride = p.y_token_stride = p.ro_token_stride = D;
    p.eps = 1e-6f;
    return p;
  };
  const NormScaleShiftParams p0 = params(sets[0]);
  kernel<<<grid, kThreads>>>(p0);
  CHECK(cudaDeviceSynchronize());
  if (g_profile_only) {
    std::printf("nss %s %s: one launch, grid %lld, %d CTAs per SM\n", c.name, label, grid, per_sm);
    return;
  }
  const size_t ybytes = rows * D * 2;
  std::vector<unsigned char> out(kQuant >= 2 ? rows * D / 2 + grid_rows * D / 16 : 2 * ybytes);
  if (kQuant >= 2) {
    CHECK(cudaMemcpy(out.data(), sets[0].fp4, rows * D / 2, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(out.data() + rows * D / 2, sets[0].sf, grid_rows * D / 16, cudaMemcpyDeviceToHost));
  } else {
    CHECK(cudaMemcpy(out.data(), sets[0].y, ybytes, cudaMemcpyDeviceToHost));
    if (kResidual) CHECK(cudaMemcpy(out.data() + ybytes, sets[0].ro, ybytes, cudaMemcpyDeviceToHost));
  }
  std::vector<NormScaleShiftParams> ps;
  for (const NssBuffers& b : sets) ps.push_back(params(b));
  report(label, kernel, per_sm, grid, p0, ps, out, g_nss_reference, copy_cold, copy_rot, kThreads);
}

// The library's schedule (nss_eager_schedule) for the cases measured here (16-bit rows, no fp8).
template <int D, bool kResidual, int kQuant>
void run_nss_library_schedule(const Case& c, const std::vector<NssBuffers>& sets, double copy_cold, double copy_rot) {
  if constexpr (kQuant >= 2)
    run_nss_variant<D, kResidual, kQuant, false, 5, (D > 3072)>("library schedule", c, sets, copy_cold, copy_rot);
  else if constexpr (D == 3072 && kResidual)
    run_nss_variant<D, kResidual, kQuant, false, 4, false, 2>("library schedule", c, sets, copy_cold, copy_rot);
  else if constexpr (D <= 3072)
    run_nss_variant<D, kResidual, kQuant, false, 7>("library schedule", c, sets, copy_cold, copy_rot);
  else if constexpr (kResidual)
    run_nss_variant<D, kResidual, kQuant, true, 3>("library schedule", c, sets, copy_cold, copy_rot);
  else
    run_nss_variant<D, kResidual, kQuant, true, 5, true>("library schedule", c, sets, copy_cold, copy_rot);
}

template <int D, bool kResidual, int kQuant>
void run_nss_case(const Case& c) {
  const long long rows = c.batch * c.seq;
  const size_t xbytes = rows * D * 2;
  // bytes moved: x (+ residual) read, y (+ residual_out) written; nvfp4: 1/4 + 1/16 written
  const double in_bytes = (kResidual ? 2.0 : 1.0) * xbytes;
  const double out_bytes = kQuant >= 2 ? xbytes / 4.0 + rows * D / 16.0 : (kResidual ? 2.0 : 1.0) * xbytes;
  const size_t copy_bytes = (size_t)((in_bytes + out_bytes) / 2);
  const int nsets = (int)std::min<long long>(12, std::max<long long>(2, (long long)(120e6 / (in_bytes + out_bytes)) + 1));
  std::vector<NssBuffers> sets(nsets);
  std::vector<unsigned short> hx(rows * D), hm(c.batch * 6 * D);
  std::mt19937 rng(11);
  std::normal_distribution<float> nd;
  for (size_t i = 0; i < hx.size(); ++i) hx[i] = bf16_bits(nd(rng) * (i % 89 == 0 ? 20.f : 1.f) - 0.125f);
  for (auto& v : hm) v = bf16_bits(0.3f * nd(rng));
  const long long grid_rows = (rows + 127) / 128 * 128;
  for (auto& s : sets) {
    CHECK(cudaMalloc(&s.x, xbytes));
    CHECK(cudaMalloc(&s.r, xbytes));
    CHECK(cudaMalloc(&s.y, xbytes));
    CHECK(cudaMalloc(&s.ro, xbytes));
    CHECK(cudaMalloc(&s.mod, hm.size() * 2));
    CHECK(cudaMalloc(&s.fp4, rows * D / 2));
    CHECK(cudaMalloc(&s.sf, grid_rows * D / 16));
    CHECK(cudaMalloc(&s.gs, 4));
    const float gs = 448.0f * 6.0f / 20.0f;
    CHECK(cudaMemcpy(s.gs, &gs, 4, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(s.x, hx.data(), xbytes, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(s.r, hx.data() + 7, xbytes - 14, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(s.mod, hm.data(), hm.size() * 2, cudaMemcpyHostToDevice));
  }
  if (g_profile_only) {  // the library's schedule only
    run_nss_library_schedule<D, kResidual, kQuant>(c, sets, 0, 0);
    free_nss_buffers(sets);
    return;
  }
  void *src, *dst;
  CHECK(cudaMalloc(&src, copy_bytes));
  CHECK(cudaMalloc(&dst, copy_bytes));
  const double copy_cold = median_us([&] { CHECK(cudaMemcpyAsync(dst, src, copy_bytes, cudaMemcpyDeviceToDevice)); });
  const double copy_rot = copy_cold;  // (the copy is not rotated here: compare the cold columns)
  std::printf("nss %s%s%s: copy of the same bytes cold %.2f us\n", c.name, kResidual ? " residual" : " plain",
              kQuant >= 2 ? " nvfp4" : "", copy_cold);
  g_nss_reference.clear();
  if (g_split) {
    run_nss_library_schedule<D, kResidual, kQuant>(c, sets, copy_cold, copy_rot);
    run_nss_variant<D, kResidual, kQuant, false, 7>("(128,7)", c, sets, copy_cold, copy_rot);
    run_nss_variant<D, kResidual, kQuant, false, 4, false, 2>("split 2 (256,4)", c, sets, copy_cold, copy_rot);
    if constexpr (kQuant < 2) run_nss_variant<D, kResidual, kQuant, false, 6>("(128,6)", c, sets, copy_cold, copy_rot);
    if (c.batch * c.seq <= 1024) {  // fewer CTAs, more rows each (the next row's load overlapping)
      for (int rows_per_cta : {2, 4}) {
        g_rows_per_cta = rows_per_cta;
        char label[64];
        std::snprintf(label, sizeof label, "%d rows/CTA prefetch", rows_per_cta);
        if constexpr (kQuant >= 2) run_nss_variant<D, kResidual, kQuant, true, 4>(label, c, sets, copy_cold, copy_rot);
        else run_nss_variant<D, kResidual, kQuant, true, 5>(label, c, sets, copy_cold, copy_rot);
        std::snprintf(label, sizeof label, "%d rows/CTA", rows_per_cta);
        if constexpr (kQuant >= 2) run_nss_variant<D, kResidual, kQuant, false, 5>(label, c, sets, copy_cold, copy_rot);
        else run_nss_variant<D, kResidual, kQuant, false, 7>(label, c, sets, copy_cold, copy_rot);
      }
      g_rows_per_cta = 1;
    }
  } else if constexpr (kQuant >= 2) {  // issue-bound rows: occupancy against registers, no spills wanted
    // Run 38: prefetch and (128,3), (128,6), (128,7) lose to (128,5) / (128,4) in registers (listed
    // second); run 46: shared (128,5) wins at D = 5120 (the library's since), not at 3072.
    // Shared: the held scale / shift / gate rows in shared memory (kSharedOperands).
    run_nss_variant<D, kResidual, kQuant, false, 1>("no prefetch", c, sets, copy_cold, copy_rot);
    run_nss_variant<D, kResidual, kQuant, false, D <= 3072 ? 5 : 4>("no prefetch, mb5 / mb4", c, sets, copy_cold, copy_rot);
    run_nss_variant<D, kResidual, kQuant, false, 5, true>("shared mb5", c, sets, copy_cold, copy_rot);
    run_nss_variant<D, kResidual, kQuant, false, 6, true>("shared mb6", c, sets, copy_cold, copy_rot);
    run_nss_variant<D, kResidual, kQuant, false, 7, true>("shared mb7", c, sets, copy_cold, copy_rot);
    if constexpr (D <= 3072) {
      run_nss_variant<D, kResidual, kQuant, false, 8, true>("shared mb8", c, sets, copy_cold, copy_rot);
      run_nss_variant<D, kResidual, kQuant, true, 5, true>("shared prefetch mb5", c, sets, copy_cold, copy_rot);
      run_nss_variant<D, kResidual, kQuant, true, 6, true>("shared prefetch mb6", c, sets, copy_cold, copy_rot);
    }
  } else {
    // Run 11 / 33 / 46: D = 3072 no prefetch (128,7) (the library's), (128,6); D = 5120 residual
    // prefetch (128,3) (the library's); D = 5120 plain no prefetch (128,6) (the library's before
    // run 46, which chose shared prefetch (128,5)).
    run_nss_variant<D, kResidual, kQuant, false, 1>("no prefetch", c, sets, copy_cold, copy_rot);
    if constexpr (D <= 3072) {
      run_nss_variant<D, kResidual, kQuant, false, 7>("no prefetch mb7", c, sets, copy_cold, copy_rot);
      run_nss_variant<D, kResidual, kQuant, false, 6>("no prefetch mb6", c, sets, copy_cold, copy_rot);
    } else if constexpr (kResidual) {
      run_nss_variant<D, kResidual, kQuant, true, 3>("prefetch mb3", c, sets, copy_cold, copy_rot);
    } else {
      run_nss_variant<D, kResidual, kQuant, false, 6>("no prefetch mb6", c, sets, copy_cold, copy_rot);
    }
    run_nss_variant<D, kResidual, kQuant, false, 7, true>("shared mb7", c, sets, copy_cold, copy_rot);
    run_nss_variant<D, kResidual, kQuant, false, 8, true>("shared mb8", c, sets, copy_cold, copy_rot);
    run_nss_variant<D, kResidual, kQuant, true, 5, true>("shared prefetch mb5", c, sets, copy_cold, copy_rot);
    run_nss_variant<D, kResidual, kQuant, true, 6, true>("shared prefetch mb6", c, sets, copy_cold, copy_rot);
  }
  free_nss_buffers(sets);
  cudaFree(src);
  cudaFree(dst);
}

// ---------------------------------------------------------------- qk_head_layernorm, Dh = 128

template <int kRows>
__global__ void __launch_bounds__(128) qk_generic(const __grid_constant__ ditops::QkHeadLayerNormParams p) {
  ditops::qk_head_layernorm_body<kRows, false, true>(p);
}
template <int kIterations>
__global__ void __launch_bounds__(128) qk_d128(const __grid_constant__ ditops::QkHeadLayerNormParams p) {
  ditops::qk_head_layernorm_d128_body<kIterations, false>(p);
}

// The second buffer set of the rotated timing (q, k, q_out, k_out of their own: together with the
// first set over 3x the L2).
static ditops::QkHeadLayerNormParams g_qk_second;

template <typename Kernel>
void run_qk_variant(const char* label, Kernel kernel, int rows_per_warp, const ditops::QkHeadLayerNormParams& p,
                    void* qo, void* ko, size_t bytes, std::vector<unsigned short>& reference, double copy) {
  const long long warps = (p.q_rows + rows_per_warp - 1) / rows_per_warp +
                          (p.total_rows - p.q_rows + rows_per_warp - 1) / rows_per_warp;
  const long long grid = (warps + 3) / 4;
  CHECK(cudaMemset(qo, 0xff, bytes));
  CHECK(cudaMemset(ko, 0xff, bytes));
  kernel<<<grid, 128>>>(p);
  CHECK(cudaDeviceSynchronize());
  std::vector<unsigned short> out(bytes);  // q_out then k_out (bytes/2 elements each)
  CHECK(cudaMemcpy(out.data(), qo, bytes, cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpy(out.data() + bytes / 2, ko, bytes, cudaMemcpyDeviceToHost));
  char hashed[40];
  const char* equal = compare_to_reference(out, reference, hashed);
  cudaFuncAttributes attr;
  CHECK(cudaFuncGetAttributes(&attr, kernel));
  const float us = median_us([&] { kernel<<<grid, 128>>>(p); });
  const float rotated = rotated_graph_us(2, [&](int i) { kernel<<<grid, 128>>>(i ? g_qk_second : p); });
  std::printf("  %-26s regs %3d  cold %8.2f us (%5.1f%%)  rotated %8.2f us  %s\n", label, attr.numRegs, us, 100.0 * copy / us,
              rotated, equal);
}

void run_qk_case() {
  const long long tokens = 4360, heads = 32;
  const size_t n = tokens * heads * 128, bytes = n * 2;
  std::vector<unsigned short> hx(n);
  std::mt19937 rng(5);
  std::normal_distribution<float> nd;
  for (auto& v : hx) v = bf16_bits(2.0f * nd(rng) + 0.5f);
  void *q, *k, *qo, *ko;
  CHECK(cudaMalloc(&q, bytes));
  CHECK(cudaMalloc(&k, bytes));
  CHECK(cudaMalloc(&qo, bytes));
  CHECK(cudaMalloc(&ko, bytes));
  CHECK(cudaMemcpy(q, hx.data(), bytes, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(k, hx.data() + 3, bytes - 6, cudaMemcpyHostToDevice));
  ditops::QkHeadLayerNormParams p{};
  p.q = q; p.k = k; p.q_out = qo; p.k_out = ko;
  p.q_rows = tokens * heads;
  p.total_rows = 2 * tokens * heads;
  p.q_token_stride = p.k_token_stride = p.q_out_token_stride = p.k_out_token_stride = heads * 128;
  p.q_head_stride = p.k_head_stride = p.q_out_head_stride = p.k_out_head_stride = 128;
  p.q_heads = p.k_heads = heads;
  p.n_vec = 32;
  p.eps = 1e-6f;
  void *src, *dst;
  CHECK(cudaMalloc(&src, 2 * bytes));
  CHECK(cudaMalloc(&dst, 2 * bytes));
  const double copy = median_us([&] { CHECK(cudaMemcpyAsync(dst, src, 2 * bytes, cudaMemcpyDeviceToDevice)); });
  g_qk_second = p;
  CHECK(cudaMalloc(&g_qk_second.q, bytes));
  CHECK(cudaMalloc(&g_qk_second.k, bytes));
  CHECK(cudaMalloc(&g_qk_second.q_out, bytes));
  CHECK(cudaMalloc(&g_qk_second.k_out, bytes));
  CHECK(cudaMemcpy((void*)g_qk_second.q, q, bytes, cudaMemcpyDeviceToDevice));
  CHECK(cudaMemcpy((void*)g_qk_second.k, k, bytes, cudaMemcpyDeviceToDevice));
  const size_t words = 2 * bytes / 16;
  void *src2, *dst2;
  CHECK(cudaMalloc(&src2, 2 * bytes));
  CHECK(cudaMalloc(&dst2, 2 * bytes));
  const double copy_rotated = rotated_graph_us(2, [&](int i) {
    copy_words<<<132 * 8, 256>>>((const uint4*)(i ? src2 : src), (uint4*)(i ? dst2 : dst), words);
  });
  std::printf("qk-head GLM (1,4360,32,128): copy cold %.2f us, rotated %.2f us (copy kernel)\n", copy, copy_rotated);
  std::vector<unsigned short> reference;
  run_qk_variant("generic, 4 rows/warp", qk_generic<4>, 4, p, qo, ko, bytes, reference, copy);
  run_qk_variant("d128, 1 round", qk_d128<1>, 4, p, qo, ko, bytes, reference, copy);
  run_qk_variant("d128, 2 rounds", qk_d128<2>, 8, p, qo, ko, bytes, reference, copy);
  run_qk_variant("d128, 4 rounds", qk_d128<4>, 16, p, qo, ko, bytes, reference, copy);
  cudaFree(q); cudaFree(k); cudaFree(qo); cudaFree(ko); cudaFree(src); cudaFree(dst); cudaFree(src2); cudaFree(dst2);
  cudaFree((void*)g_qk_second.q); cudaFree((void*)g_qk_second.k); cudaFree(g_qk_second.q_out); cudaFree(g_qk_second.k_out);
}

// ---------------------------------------------------------------- residual_gate_add

template <typename T, int kUnits, bool kStreaming, int kBlock = 256, bool kIndex64 = false>
__global__ void __launch_bounds__(kBlock) rga_flat(const __grid_constant__ ditops::ResidualGateAddParams p) {
  ditops::residual_gate_add_flat<T, ditops::kRgaGateRow, true, false, kUnits, kStreaming, kIndex64>(p);
}
// p with the 32-bit kernels' sizes and divisors filled in (as the host op does).
ditops::ResidualGateAddParams with_divisors(ditops::ResidualGateAddParams p) {
  ditops::rga_set_flat_sizes(p, p.units, p.row_units, p.units_per_gate_row);
  return p;
}
template <int kUnits, int kBlock>
__global__ void __launch_bounds__(kBlock) rga_flat_scalar(const __grid_constant__ ditops::ResidualGateAddParams p) {
  ditops::residual_gate_add_flat<bf16, ditops::kRgaGateRow, false, false, kUnits, false>(p);
}
__device__ __forceinline__ bf16 rga_detail_gated(bf16 r, bf16 u, bf16 g) { return ditops::rga_detail::gated_sum(r, u, g); }

template <typename T, int kTile, bool kChannelTilesFastest, bool kVector, bool kVectorUpdate, bool kChunked,
          int kMinBlocks = 0, int kTokenTile = kTile>
__global__ void __launch_bounds__(256 * (kTokenTile / kTile), kMinBlocks)
    rga_transposed(const __grid_constant__ ditops::ResidualGateAddParams p) {
  ditops::residual_gate_add_transposed<T, ditops::kRgaGateRow, kVector, kTile, false, kVectorUpdate, kChunked,
                                       kChannelTilesFastest, kTokenTile>(p);
}

// Buffer sets of one residual_gate_add case (residual, update, out each `bytes`; one gate of
// `gate_bytes` shared): enough sets that together they are over 3x the L2, for rotated timing,
// and a copy of the same bytes (half read, half written) per set.
struct RgaSets {
  std::vector<ditops::ResidualGateAddParams> params;
  std::vector<void*> copy_src, copy_dst;
  std::vector<void*> owned;
  size_t bytes = 0, copy_bytes = 0;
  double copy_cold = 0, copy_rotated = 0;

  RgaSets(size_t bytes_, size_t gate_bytes, int seed) : bytes(bytes_) {
    int l2 = 0;
    CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, 0));
    const size_t model = 3 * bytes + gate_bytes;
    const int n = (int)std::max<size_t>(2, std::min<size_t>(64, 3 * (size_t)l2 / model + 1));
    copy_bytes = model / 2;
    std::vector<unsigned short> h(bytes / 2 + 16);
    std::mt19937 rng(seed);
    for (auto& v : h) v = (unsigned short)(0x3c00 + (rng() & 0x3ff) - 0x200);  // finite bf16 and f16
    void* gate = alloc(gate_bytes);
    CHECK(cudaMemcpy(gate, h.data() + 7, gate_bytes, cudaMemcpyHostToDevice));
    for (int i = 0; i < n; ++i) {
      ditops::ResidualGateAddParams p{};
      void *r = alloc(bytes), *u = alloc(bytes);
      CHECK(cudaMemcpy(r, h.data() + i % 5, bytes, cudaMemcpyHostToDevice));
      CHECK(cudaMemcpy(u, h.data() + 3 + i % 7, bytes, cudaMemcpyHostToDevice));
      p.residual = r; p.update = u; p.gate = gate; p.out = alloc(bytes);
      params.push_back(p);
      copy_src.push_back(alloc(copy_bytes));
      copy_dst.push_back(alloc(copy_bytes));
    }
    copy_cold = median_us([&] { CHECK(cudaMemcpyAsync(copy_dst[0], copy_src[0], copy_bytes, cudaMemcpyDeviceToDevice)); });
    const size_t words = copy_bytes / 16;
    copy_rotated = rotated_graph_us(n, [&](int i) {
      copy_words<<<(unsigned)std::min<size_t>((words + 255) / 256, 132 * 8), 256>>>((const uint4*)copy_src[i], (uint4*)copy_dst[i], words);
    });
  }
  ~RgaSets() { for (void* p : owned) cudaFree(p); }
  void* alloc(size_t n) { void* p; CHECK(cudaMalloc(&p, n)); owned.push_back(p); return p; }
  int size() const { return (int)params.size(); }

  // One variant: launch(params) on every set; output of set 0 compared with the first variant's.
  void run(const char* label, const std::function<void(const ditops::ResidualGateAddParams&)>& launch,
           std::vector<unsigned short>& reference) {
    CHECK(cudaMemset(params[0].out, 0xff, bytes));
    launch(params[0]);
    CHECK(cudaDeviceSynchronize());
    std::vector<unsigned short> o(bytes / 2);
    CHECK(cudaMemcpy(o.data(), params[0].out, bytes, cudaMemcpyDeviceToHost));
    const char* equal = "reference";
    if (reference.empty()) reference = o;
    else equal = o == reference ? "equal" : "DIFFERENT";
    const float cold = median_us([&] { launch(params[0]); });
    const float rotated = rotated_graph_us(size(), [&](int i) { launch(params[i]); });
    CHECK(cudaGetLastError());
    std::printf("  %-40s cold %8.2f us (%5.1f%%)  rotated %8.2f us (%5.1f%%)  %s\n", label, cold, 100.0 * copy_cold / cold,
                rotated, 100.0 * copy_rotated / rotated, equal);
  }
};

// A flat variant: kUnits per thread on a full grid (or the resident grid), 32- or 64-bit indices.
template <typename T, int kUnits, bool kStreaming = false, int kBlock = 256>
std::function<void(const ditops::ResidualGateAddParams&)> rga_flat_launch(bool resident_grid, bool index32) {
  return [=](const ditops::ResidualGateAddParams& p0) {
    static int per_sm = 0, sms = 0;
    if (per_sm == 0) {
      CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, rga_flat<T, kUnits, kStreaming, kBlock>, kBlock, 0));
      CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    }
    const ditops::ResidualGateAddParams p = with_divisors(p0);
    long long grid = (p.units + (long long)kBlock * kUnits - 1) / ((long long)kBlock * kUnits);
    if (resident_grid) grid = std::min<long long>(grid, (long long)per_sm * sms);
    if (index32)
      rga_flat<T, kUnits, kStreaming, kBlock, false><<<grid, kBlock>>>(p);
    else
      rga_flat<T, kUnits, kStreaming, kBlock, true><<<grid, kBlock>>>(p);
  };
}

template <typename T, int kTile, bool kChannelTilesFastest, bool kVector = true, bool kVectorUpdate = kVector,
          bool kChunked = false, int kMinBlocks = 0, int kTokenTile = kTile>
std::function<void(const ditops::ResidualGateAddParams&)> rga_transposed_launch(long long batch) {
  return [=](const ditops::ResidualGateAddParams& p0) {
    ditops::ResidualGateAddParams p = p0;
    p.tiles_t = (p.tokens + (kChunked ? 16 / sizeof(T) - 1 : 0) + kTokenTile - 1) / kTokenTile;
    p.tiles_h = (p.hidden + kTile - 1) / kTile;
    constexpr int kThreads = ditops::rga_transposed_threads(kTile, kVector ? 16 / sizeof(T) : 1, kTokenTile);
    rga_transposed<T, kTile, kChannelTilesFastest, kVector, kVectorUpdate, kChunked, kMinBlocks, kTokenTile>
        <<<batch * p.tiles_t * p.tiles_h, kThreads>>>(p);
  };
}

template <typename T>
void run_rga_transposed_case(const char* name, long long B, long long T_, long long H) {
  RgaSets sets(B * T_ * H * 2, H * 2, 5);
  for (auto& p : sets.params) {
    p.tokens = T_;
    p.hidden = H;
  }
  std::printf("rga transposed %s, %d sets: copy cold %.2f us (cudaMemcpy), rotated %.2f us (copy kernel)\n", name, sets.size(), sets.copy_cold,
              sets.copy_rotated);
  std::vector<unsigned short> reference;
  if (T_ % 8 == 0 && H % 8 == 0) {  // 16-byte rows: the vector path
    sets.run("tile 64, token tiles fastest", rga_transposed_launch<T, 64, false>(B), reference);
    sets.run("tile 64, channel tiles fastest", rga_transposed_launch<T, 64, true>(B), reference);
    sets.run("tile 32, token tiles fastest", rga_transposed_launch<T, 32, false>(B), reference);
  }
  sets.run("scalar, tile 32", rga_transposed_launch<T, 32, false, false>(B), reference);
  sets.run("scalar, tile 16", rga_transposed_launch<T, 16, false, false>(B), reference);
  sets.run("scalar, tile 64", rga_transposed_launch<T, 64, false, false>(B), reference);
  if (H % 8 == 0) {  // 16-byte update rows: the update side vectorized alone
    sets.run("update16, tile 32", rga_transposed_launch<T, 32, false, false, true>(B), reference);
    sets.run("update16, tile 16", rga_transposed_launch<T, 16, false, false, true>(B), reference);
    sets.run("update16, tile 64", rga_transposed_launch<T, 64, false, false, true>(B), reference);
    // The residual side by aligned 16-byte chunks whatever T (kChunkedResidual).
    sets.run("chunk16, tile 64", rga_transposed_launch<T, 64, false, true, true, true>(B), reference);
    sets.run("chunk16, tile 32", rga_transposed_launch<T, 32, false, true, true, true>(B), reference);
    sets.run("chunk16, tile 64, 5 blocks/SM", rga_transposed_launch<T, 64, false, true, true, true, 5>(B), reference);
    sets.run("chunk16, tile 64, 6 blocks/SM", rga_transposed_launch<T, 64, false, true, true, true, 6>(B), reference);

  }
}

// Rectangular tiles for the aligned transposed layout (16-byte units on both sides, row gate,
// batch 1; not in the library): kTileT tokens x kTileH channels per block, so residual / out lines
// run kTileT * 2 bytes and update rows kTileH * 2 bytes (the library's square 64-tile: 128 and 128).
// kStreaming: ld/st.global.cs. The products' row stride is kTileH + pad, pad chosen below for the
// fewest bank conflicts of the transposed read.
__host__ __device__ constexpr int rect_conflicts(int tile_t, int tile_h, int pad, int elems, int bytes = 4) {
  // The most lanes of a warp on one bank in the residual side's read of product element e = 0.
  int worst = 0;
  const int line_units = tile_t / elems, stride = tile_h + pad;
  for (int bank = 0; bank < 32; ++bank) {
    int n = 0;
    for (int lane = 0; lane < 32; ++lane) {
      const int line = lane / line_units, offset = (lane % line_units) * elems;
      if ((offset * stride + line) * bytes / 4 % 32 == bank) ++n;
    }
    worst = n > worst ? n : worst;
  }
  return worst;
}
__host__ __device__ constexpr int rect_pad(int tile_t, int tile_h, int elems, int bytes = 4) {
  int best = 1;
  for (int pad = 1; pad <= 8; ++pad)
    if (rect_conflicts(tile_t, tile_h, pad, elems, bytes) < rect_conflicts(tile_t, tile_h, best, elems, bytes)) best = pad;
  return best;
}
template <typename T, int kTileT, int kTileH, int kThreads, bool kStreaming, bool kProductT>
__global__ void __launch_bounds__(kThreads) rga_rect(const __grid_constant__ ditops::ResidualGateAddParams p) {
  using namespace ditops::kernel;
  constexpr int E = 16 / static_cast<int>(sizeof(T));
  constexpr int kRowUnitsU = kTileH / E, kLineUnitsR = kTileT / E;
  static_assert(kThreads % kRowUnitsU == 0 && kThreads % kLineUnitsR == 0, "whole rows per pass");
  constexpr int kPerU = kTileT * kRowUnitsU / kThreads, kPerR = kTileH * kLineUnitsR / kThreads;
  static_assert(kPerU * kThreads == kTileT * kRowUnitsU && kPerR * kThreads == kTileH * kLineUnitsR, "whole passes");
  // kProductT: the products kept as T (exact: they are rounded to T), half the shared memory.
  using P = typename std::conditional<kProductT, T, float>::type;
  constexpr int kStride = kTileH + rect_pad(kTileT, kTileH, E, static_cast<int>(sizeof(P)));
  __shared__ P product[kTileT * kStride];
  const long long T_ = p.tokens, H = p.hidden;
  const unsigned tiles_t = static_cast<unsigned>(p.tiles_t);
  const unsigned h_tile = blockIdx.x / tiles_t, t_tile = blockIdx.x - h_tile * tiles_t;
  const long long h0 = static_cast<long long>(h_tile) * kTileH, t0 = static_cast<long long>(t_tile) * kTileT;
  const T* residual = static_cast<const T*>(p.residual);
  const T* update = static_cast<const T*>(p.update);
  T* out = static_cast<T*>(p.out);
  const int tid = threadIdx.x;
  // Update side: row (token) u_row0 + k * kRowsPerPass, channel offset u_off.
  constexpr int kRowsPerPass = kThreads / kRowUnitsU;
  const int u_row0 = tid / kRowUnitsU, u_off = (tid % kRowUnitsU) * E;
  const bool u_h_inside = h0 + u_off < H;
  Word<16> u[kPerU], g;
  if (u_h_inside) g = load_word<16, true>(static_cast<const T*>(p.gate) + h0 + u_off);
#pragma unroll
  for (int k = 0; k < kPerU; ++k) {
    const long long t = t0 + u_row0 + k * kRowsPerPass;
    if (u_h_inside && t < T_) {
      const T* at = update + t * H + h0 + u_off;
      u[k] = kStreaming ? load_word_streaming(at) : load_word<16, false>(at);
    }
  }
  // Residual side: line (channel) r_line0 + k * kLinesPerPass, token offset r_off.
  constexpr int kLinesPerPass = kThreads / kLineUnitsR;
  const int r_line0 = tid / kLineUnitsR, r_off = (tid % kLineUnitsR) * E;
  const bool r_t_inside = t0 + r_off < T_;
  Word<16> r[kPerR];
#pragma unroll
  for (int k = 0; k < kPerR; ++k) {
    const long long h = h0 + r_line0 + k * kLinesPerPass;
    if (r_t_inside && h < H) {
      const T* at = residual + h * T_ + t0 + r_off;
      r[k] = kStreaming ? load_word_streaming(at) : load_word<16, false>(at);
    }
  }
#pragma unroll
  for (int k = 0; k < kPerU; ++k) {
    const long long t = t0 + u_row0 + k * kRowsPerPass;
    if (u_h_inside && t < T_) {
#pragma unroll
      for (int e = 0; e < E; ++e)
        if constexpr (kProductT)
          product[(u_row0 + k * kRowsPerPass) * kStride + u_off + e] =
              from_float<T>(__fmul_rn(to_float(word_element<T>(u[k], e)), to_float(word_element<T>(g, e))));
        else
          product[(u_row0 + k * kRowsPerPass) * kStride + u_off + e] =
              round_to<T>(__fmul_rn(to_float(word_element<T>(u[k], e)), to_float(word_element<T>(g, e))));
    }
  }
  __syncthreads();
#pragma unroll
  for (int k = 0; k < kPerR; ++k) {
    const int line = r_line0 + k * kLinesPerPass;
    const long long h = h0 + line;
    if (r_t_inside && h < H) {
      T o[E];
#pragma unroll
      for (int e = 0; e < E; ++e)
        o[e] = from_float<T>(__fadd_rn(to_float(word_element<T>(r[k], e)), to_float(product[(r_off + e) * kStride + line])));
      Word<16> w;
      elements_to_word(o, w);
      T* at = out + h * T_ + t0 + r_off;
      if (kStreaming) store_word_streaming(at, w);
      else store_word<16>(at, w);
    }
  }
}

template <typename T, int kTileT, int kTileH, int kThreads, bool kStreaming = false, bool kProductT = false>
std::function<void(const ditops::ResidualGateAddParams&)> rga_rect_launch() {
  return [=](const ditops::ResidualGateAddParams& p0) {
    ditops::ResidualGateAddParams p = p0;
    p.tiles_t = (p.tokens + kTileT - 1) / kTileT;
    p.tiles_h = (p.hidden + kTileH - 1) / kTileH;
    rga_rect<T, kTileT, kTileH, kThreads, kStreaming, kProductT><<<p.tiles_t * p.tiles_h, kThreads>>>(p);
  };
}

// SANA's aligned transposed layout: the library's 64-tile against rectangular tiles (bf16, fp16).
template <typename T>
void run_rga_rect_case(const char* name, long long T_, long long H) {
  RgaSets sets(T_ * H * 2, H * 2, 5);
  for (auto& p : sets.params) {
    p.tokens = T_;
    p.hidden = H;
  }
  std::printf("rga rect %s, %d sets: copy cold %.2f us (cudaMemcpy), rotated %.2f us (copy kernel)\n", name, sets.size(),
              sets.copy_cold, sets.copy_rotated);
  std::vector<unsigned short> reference;
  sets.run("library tile 64", rga_transposed_launch<T, 64, false>(1), reference);
  sets.run("rect 128x64, 256 thr", rga_rect_launch<T, 128, 64, 256>(), reference);
  sets.run("rect 128x64, 512 thr", rga_rect_launch<T, 128, 64, 512>(), reference);
  sets.run("rect 128x64, 512 thr, T products", rga_rect_launch<T, 128, 64, 512, false, true>(), reference);
  sets.run("rect 128x64, 256 thr, T products", rga_rect_launch<T, 128, 64, 256, false, true>(), reference);
  sets.run("rect 256x64, 512 thr, T products", rga_rect_launch<T, 256, 64, 512, false, true>(), reference);
  sets.run("rect 256x64, 1024 thr, T products", rga_rect_launch<T, 256, 64, 1024, false, true>(), reference);
  sets.run("rect 192x64, 384 thr, T products", rga_rect_launch<T, 192, 64, 384, false, true>(), reference);
  sets.run("rect 128x96, 384 thr, T products", rga_rect_launch<T, 128, 96, 384, false, true>(), reference);
  sets.run("rect 64x64, T products", rga_rect_launch<T, 64, 64, 256, false, true>(), reference);
  sets.run("library tile 128 x 64", rga_transposed_launch<T, 64, false, true, true, false, 0, 128>(1), reference);
  sets.run("library tile 64 (again)", rga_transposed_launch<T, 64, false>(1), reference);
}

// The floor of a tiny launch: the same arithmetic with int indices, four pointers and two ints
// as parameters, one element per thread, no index-width branch (not a library candidate: it knows
// only the row gate and the transposed layout by a flag).
template <bool kTransposed>
__global__ void __launch_bounds__(256) rga_minimal(const bf16* __restrict__ r, const bf16* __restrict__ u,
                                                   const bf16* __restrict__ g, bf16* __restrict__ o, int n, int H, int T) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;  // logical [B, T, H] index, h fastest
  if (i >= n) return;
  const int h = i % H;
  int at = i;
  if (kTransposed) {
    const int bt = i / H, b = bt / T, t = bt - b * T;
    at = (b * H + h) * T + t;
  }
  o[at] = rga_detail_gated(r[at], u[i], g[h]);
}

void run_rga_tiny_cases() {
  {
    const long long B = 2, S = 33, D = 65;
    RgaSets sets(B * S * D * 2, D * 2, 7);
    for (auto& p : sets.params) {
      p.units = B * S * D;
      p.row_units = D;
      p.units_per_gate_row = p.units;
    }
    std::printf("rga odd width (2,33,65) row gate bf16 (scalar path), %d sets: copy rotated %.2f us\n", sets.size(),
                sets.copy_rotated);
    std::vector<unsigned short> reference;
    auto scalar = [](auto kernel, int block, int units_per_thread) {
      return [=](const ditops::ResidualGateAddParams& p0) {
        const ditops::ResidualGateAddParams p = with_divisors(p0);
        kernel<<<(p.units + (long long)block * units_per_thread - 1) / ((long long)block * units_per_thread), block>>>(p);
      };
    };
    sets.run("scalar 8 units, 256 threads (library)", scalar(rga_flat_scalar<8, 256>, 256, 8), reference);
    sets.run("scalar 1 unit, 256 threads", scalar(rga_flat_scalar<1, 256>, 256, 1), reference);
    sets.run("scalar 1 unit, 128 threads", scalar(rga_flat_scalar<1, 128>, 128, 1), reference);
    sets.run("scalar 2 units, 128 threads", scalar(rga_flat_scalar<2, 128>, 128, 2), reference);
    sets.run("minimal kernel", [&](const ditops::ResidualGateAddParams& p) {
      const int n = (int)p.units;
      rga_minimal<false><<<(n + 255) / 256, 256>>>((const bf16*)p.residual, (const bf16*)p.update, (const bf16*)p.gate,
                                                   (bf16*)p.out, n, (int)D, (int)S);
    }, reference);
  }
  {
    const long long B = 1, T_ = 17, H = 65;
    RgaSets sets(B * T_ * H * 2, H * 2, 9);
    for (auto& p : sets.params) {
      p.tokens = T_;
      p.hidden = H;
    }
    std::printf("rga transposed small (1,17,65) bf16 (scalar path), %d sets: copy rotated %.2f us\n", sets.size(),
                sets.copy_rotated);
    std::vector<unsigned short> reference;
    sets.run("scalar, tile 32 (library)", rga_transposed_launch<bf16, 32, false, false>(B), reference);
    sets.run("scalar, tile 16", rga_transposed_launch<bf16, 16, false, false>(B), reference);
    sets.run("minimal kernel (no tile)", [&](const ditops::ResidualGateAddParams& p) {
      const int n = (int)(B * T_ * H);
      rga_minimal<true><<<(n + 255) / 256, 256>>>((const bf16*)p.residual, (const bf16*)p.update, (const bf16*)p.gate,
                                                  (bf16*)p.out, n, (int)H, (int)T_);
    }, reference);
  }
}

void run_rga_cases() {
  {
    const long long rows = 4608, D = 3072;
    RgaSets sets(rows * D * 2, D * 2, 3);
    for (auto& p : sets.params) {
      p.units = rows * D / 8;
      p.row_units = D / 8;
      p.units_per_gate_row = p.units;
    }
    std::printf("rga FLUX joint (1,4608,3072) row gate bf16, %d sets: copy cold %.2f us (cudaMemcpy), rotated %.2f us (copy kernel)\n", sets.size(),
                sets.copy_cold, sets.copy_rotated);
    // Run 13: units per thread x grid x cache hints; run 17: block size (128/256/512), fp16, the
    // gate through ld.global.nc: every variant within 0.5 % cold. Run 21: 32- against 64-bit indices.
    std::vector<unsigned short> reference, ref16;
    sets.run("1 unit, full grid, 32-bit", rga_flat_launch<bf16, 1>(false, true), reference);
    sets.run("1 unit, full grid, 64-bit", rga_flat_launch<bf16, 1>(false, false), reference);
    sets.run("2 units, resident grid, 32-bit", rga_flat_launch<bf16, 2>(true, true), reference);
    sets.run("2 units, resident grid, 64-bit", rga_flat_launch<bf16, 2>(true, false), reference);
    sets.run("1 unit, 128 threads, 32-bit", rga_flat_launch<bf16, 1, false, 128>(false, true), reference);
    sets.run("1 unit, streaming, 32-bit", rga_flat_launch<bf16, 1, true>(false, true), reference);
    sets.run("fp16 1 unit, full grid, 32-bit", rga_flat_launch<ditops::kernel::f16, 1>(false, true), ref16);
  }
  // SANA-Video transposed: residual/out [B, T, H] stored [B, H, T], update [B, T, H].
  run_rga_transposed_case<bf16>("SANA (1,32760,2240) bf16", 1, 32760, 2240);
  run_rga_transposed_case<bf16>("(2,513,256) bf16", 2, 513, 256);
}

// Where the flat kernel's single launch from a cleared L2 loses to Inductor's (bench/results run
// 79, cold_graph: FLUX (1,4096,3072) 25.06 against 24.29 us, (1,512,3072) 8.13 against 8.00, while
// back to back it is ahead): the library's flat vector kernel against minimal 16-byte kernels with
// six parameters in one constant line, the row length at run time or (kRowUnits > 0) a compile-time
// constant, as Inductor specializes it. Cold = memset clear before each direct launch.
template <int kRowUnits>
__global__ void __launch_bounds__(256) rga_minimal_vec(const bf16* __restrict__ r, const bf16* __restrict__ u,
                                                       const bf16* __restrict__ g, bf16* __restrict__ o, int units,
                                                       int row_units) {
  using namespace ditops::kernel;
  const int i = blockIdx.x * 256 + threadIdx.x;
  if (i >= units) return;
  const int gate_unit = kRowUnits > 0 ? i % kRowUnits : i % row_units;
  const Word<16> rw = load_word<16, false>(r + 8 * static_cast<long long>(i));
  const Word<16> uw = load_word<16, false>(u + 8 * static_cast<long long>(i));
  const Word<16> gw = load_word<16, true>(g + 8 * gate_unit);
  bf16 out[8];
#pragma unroll
  for (int e = 0; e < 8; ++e)
    out[e] = rga_detail_gated(word_element<bf16>(rw, e), word_element<bf16>(uw, e), word_element<bf16>(gw, e));
  Word<16> w;
  elements_to_word(out, w);
  store_word<16>(o + 8 * static_cast<long long>(i), w);
}

void run_rga_cold_cases() {
  for (const long long rows : {4096LL, 512LL}) {
    const long long D = 3072;
    RgaSets sets(rows * D * 2, D * 2, 11);
    for (auto& p : sets.params) {
      p.units = rows * D / 8;
      p.row_units = D / 8;
      p.units_per_gate_row = p.units;
    }
    std::printf("rga (1,%lld,3072) row gate bf16, %d sets: copy cold %.2f us (cudaMemcpy), rotated %.2f us (copy kernel)\n",
                rows, sets.size(), sets.copy_cold, sets.copy_rotated);
    std::vector<unsigned short> reference;
    auto minimal = [](auto kernel) {
      return [=](const ditops::ResidualGateAddParams& p) {
        kernel<<<(unsigned)((p.units + 255) / 256), 256>>>((const bf16*)p.residual, (const bf16*)p.update,
                                                            (const bf16*)p.gate, (bf16*)p.out, (int)p.units,
                                                            (int)p.row_units);
      };
    };
    sets.run("library flat, 1 unit, 32-bit", rga_flat_launch<bf16, 1>(false, true), reference);
    sets.run("minimal, row length a parameter", minimal(rga_minimal_vec<0>), reference);
    sets.run("minimal, row length 384 constant", minimal(rga_minimal_vec<384>), reference);
    sets.run("library flat, 1 unit, 32-bit (again)", rga_flat_launch<bf16, 1>(false, true), reference);
  }
}

void run_rga_odd_tokens_cases() {
  run_rga_transposed_case<bf16>("(2,513,256) bf16", 2, 513, 256);
  run_rga_transposed_case<bf16>("SANA odd T (1,32761,2240) bf16", 1, 32761, 2240);
  run_rga_transposed_case<bf16>("SANA (1,32760,2240) bf16", 1, 32760, 2240);  // chunks on aligned lines
}

int main(int argc, char** argv) {
  CHECK(cudaMalloc(&g_flush, kFlushBytes));
  // all (default) | qk | rga | rga_tiny | rga_odd | rga_rect | rga_cold | lnm | lnmrow | nss | nssflux | nss512 | nssfp4 |
  // profile | split
  // (nss*: -DDITOPS_TUNE_NSS)
  const std::string only = argc > 1 ? argv[1] : "";
  const bool all = only.empty();
  const Case flux{"FLUX (1,4608,3072)", 1, 4608, 3072}, qwen{"Qwen CFG (2,6912,3072)", 2, 6912, 3072},
      wan{"Wan (1,32760,5120)", 1, 32760, 5120}, tokens512{"(1,512,3072)", 1, 512, 3072};
  if (all || only == "qk") run_qk_case();
  if (all || only == "rga") run_rga_cases();
  if (all || only == "rga" || only == "rga_tiny") run_rga_tiny_cases();
  if (all || only == "rga_odd") run_rga_odd_tokens_cases();
  if (only == "rga_cold") run_rga_cold_cases();
  if (only == "rga_rect") {
    run_rga_rect_case<bf16>("SANA (1,32760,2240) bf16", 32760, 2240);
    run_rga_rect_case<ditops::kernel::f16>("SANA (1,32760,2240) fp16", 32760, 2240);
  }
  if (only == "lnmrow") {  // layernorm_modulate_fp8_rowwise's schedules
    run_case<6>(flux);  // the bf16 body beside it, same shapes
    run_case<6, true>(flux);
    run_case<6, true>(qwen);
    run_case<10, true>(wan);
    run_case<6, true>(tokens512);
  }
  if (all || only == "lnm") {
    run_case<6>(flux);
    run_case<6>(qwen);
    run_case<10>(wan);
    run_case<6>(tokens512);
  }
#ifdef DITOPS_TUNE_NSS
  if (all || only == "nss") {
    run_nss_case<3072, true, 0>(qwen);
    run_nss_case<3072, false, 0>(qwen);
    run_nss_case<5120, true, 0>(wan);
    run_nss_case<5120, false, 0>(wan);
  }
  if (all || only == "nss" || only == "nssfp4") {
    run_nss_case<3072, true, 2>(flux);
    run_nss_case<3072, true, 2>(qwen);
    run_nss_case<5120, true, 2>(wan);
    run_nss_case<3072, true, 2>(tokens512);
  }
  if (all || only == "nss" || only == "nssflux") {
    run_nss_case<3072, false, 0>(flux);
    run_nss_case<3072, true, 0>(flux);
  }
  if (only == "profile") {  // for ncu: one launch of the library's schedule per case
    g_profile_only = true;
    run_nss_case<3072, false, 0>(flux);
    run_nss_case<3072, true, 0>(flux);
    run_nss_case<3072, true, 2>(flux);
    run_nss_case<5120, true, 2>(wan);
    run_nss_case<3072, true, 0>(tokens512);
    run_nss_case<3072, true, 2>(tokens512);
  }
  if (only == "split") {  // rows split over 128 * kSplit threads
    g_split = true;
    run_nss_case<3072, true, 2>(tokens512);
    run_nss_case<3072, true, 0>(tokens512);
    run_nss_case<3072, false, 0>(tokens512);
    run_nss_case<3072, true, 0>(flux);
    run_nss_case<3072, true, 0>(qwen);
  }
  if (all || only == "nss" || only == "nss512") {
    run_nss_case<3072, false, 0>(tokens512);
    run_nss_case<3072, true, 0>(tokens512);
  }
#endif
  return 0;
}

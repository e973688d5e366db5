// Tuning experiment for causal_conv3d_cat_pad (not part of the library): times builds of
// kernels/causal_conv3d_cat_pad.cuh at the issue's shapes, cold L2, against a device copy of the
// same bytes, and checks every output byte against an element-per-thread reference kernel. The
// knobs are compile-time (bench/experiments/run_tune.sh ccp builds the variants in parallel):
//   -DDITOPS_CCP_UNROLL_GENERAL=N  windows per lane and step of the general kernel
//   -DDITOPS_CCP_UNROLL_ALIGNED=N  the same for the aligned kernel
//   -DDITOPS_CCP_STEP_ORDER=0|1    a contiguous range of steps per warp, or a grid-stride walk
//   -DDITOPS_CCP_UNROLL_PARTS=N    the same for the parts kernel
//   -DDITOPS_CCP_UNROLL_CHUNKS=N   windows per lane (a chunk) of the chunks kernel
//   -DCCP_TUNE_MIN_BLOCKS_GENERAL=N  the general kernel's __launch_bounds__ minimum blocks
//   -DCCP_TUNE_MIN_BLOCKS_PARTS=N    the parts kernel's
//   -DCCP_TUNE_MIN_BLOCKS_CHUNKS=N   the chunks kernel's
// The kernels are declared as the op's JIT wrapper declares them (256 threads, minimum resident
// blocks 4 general / 5 aligned / 3 parts / 4 chunks). Each unaligned case with rows of 16
// bytes or more runs the parts and the general kernel, and the chunks kernel where
// ccp_chunks_fit (the NCTHW cases), whichever ccp_path picks (their A/B in one process), each on
// the resident grid and on one step per warp (the op launches general resident, the others one-step),
// and where the one-step grid is 4 waves or fewer also in blocks of 128 and 64 threads.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "causal_conv3d_cat_pad.cuh"
#include "tune_common.cuh"

using ditops::CausalConv3dCatPadParams;

// Minimum resident blocks of the general kernel (the op's kCcpMinBlocksGeneral): 5 fits one window
// per lane and step (51 registers).
#ifndef CCP_TUNE_MIN_BLOCKS_GENERAL
#define CCP_TUNE_MIN_BLOCKS_GENERAL 4
#endif
#ifndef CCP_TUNE_MIN_BLOCKS_PARTS
#define CCP_TUNE_MIN_BLOCKS_PARTS 3
#endif
#ifndef CCP_TUNE_MIN_BLOCKS_CHUNKS
#define CCP_TUNE_MIN_BLOCKS_CHUNKS 4
#endif

template <int kBytes, int kPath>
__global__ void __launch_bounds__(256, kPath == ditops::kCcpAligned ? 5
                                       : kPath == ditops::kCcpParts ? CCP_TUNE_MIN_BLOCKS_PARTS
                                       : kPath == ditops::kCcpChunks ? CCP_TUNE_MIN_BLOCKS_CHUNKS
                                                                    : CCP_TUNE_MIN_BLOCKS_GENERAL)
    ccp_variant(const __grid_constant__ CausalConv3dCatPadParams p) {
  ditops::causal_conv3d_cat_pad<kBytes, kPath, false, false>(p);
}

template <int kBytes>
const void* variant_for(int path) {
  return path == ditops::kCcpAligned ? (const void*)ccp_variant<kBytes, ditops::kCcpAligned>
         : path == ditops::kCcpParts ? (const void*)ccp_variant<kBytes, ditops::kCcpParts>
         : path == ditops::kCcpChunks ? (const void*)ccp_variant<kBytes, ditops::kCcpChunks>
                                     : (const void*)ccp_variant<kBytes, ditops::kCcpGeneral>;
}
const char* path_name(int path) {
  return path == ditops::kCcpAligned  ? "aligned"
         : path == ditops::kCcpParts  ? "parts"
         : path == ditops::kCcpChunks ? "chunks"
                                      : "general";
}

// The reference: one thread per output element, its source by plain 64-bit index arithmetic.
struct Shape {
  long long B, C, T, H, W, ct;
  int es;
  bool cl;
};
__global__ void reference(Shape s, const unsigned char* x, const unsigned char* cache, unsigned char* out) {
  const long long To = s.T + s.ct, Ho = s.H + 2, Wo = s.W + 2;  // padding (1, 1, 1, 1, ct, 0)
  const long long n = s.B * s.C * To * Ho * Wo;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
    long long r = i, b, c, t, h, w;  // i in out's storage order
    if (s.cl) {
      c = r % s.C, r /= s.C, w = r % Wo, r /= Wo, h = r % Ho, r /= Ho, t = r % To, b = r / To;
    } else {
      w = r % Wo, r /= Wo, h = r % Ho, r /= Ho, t = r % To, r /= To, c = r % s.C, b = r / s.C;
    }
    const long long ih = h - 1, iw = w - 1;
    unsigned char v[4] = {0, 0, 0, 0};
    if (ih >= 0 && ih < s.H && iw >= 0 && iw < s.W) {
      const bool from_cache = t < s.ct;
      const long long T = from_cache ? s.ct : s.T, tt = from_cache ? t : t - s.ct;
      const long long at = s.cl ? (((b * T + tt) * s.H + ih) * s.W + iw) * s.C + c
                                : (((b * s.C + c) * T + tt) * s.H + ih) * s.W + iw;
      for (int k = 0; k < s.es; ++k) v[k] = (from_cache ? cache : x)[at * s.es + k];
    }
    for (int k = 0; k < s.es; ++k) out[i * s.es + k] = v[k];
  }
}

__global__ void fill_bits(unsigned* p, size_t n, unsigned seed) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    unsigned v = (unsigned)i * 2654435761u ^ seed;
    v ^= v >> 13, v *= 0x5bd1e995u, v ^= v >> 15;
    p[i] = v;
  }
}

__global__ void count_differences(const unsigned char* a, const unsigned char* b, size_t n, unsigned long long* d) {
  unsigned long long local = 0;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    local += a[i] != b[i];
  if (local) atomicAdd(d, local);
}

__global__ void copy_words(const uint4* __restrict__ src, uint4* __restrict__ dst, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) dst[i] = src[i];
}

struct Case {
  const char* name;
  Shape s;
};

int main() {
  const Case cases[] = {{"sglang [1,192,2,360,640] ct2 bf16", {1, 192, 2, 360, 640, 2, 2, false}},
                        {"sglang channels_last bf16", {1, 192, 2, 360, 640, 2, 2, true}},
                        {"sglang fp32", {1, 192, 2, 360, 640, 2, 4, false}},
                        {"C256 T4 240x416 ct2 bf16", {1, 256, 4, 240, 416, 2, 2, false}},
                        {"C512 T4 120x208 ct2 bf16", {1, 512, 4, 120, 208, 2, 2, false}},
                        {"C1024 T2 60x104 ct2 bf16", {1, 1024, 2, 60, 104, 2, 2, false}},
                        {"C1024 T2 60x104 ct2 fp32 channels_last", {1, 1024, 2, 60, 104, 2, 4, true}},
                        {"C1024 T1 30x52 ct1 bf16", {1, 1024, 1, 30, 52, 1, 2, false}},
                        {"C1024 T1 30x52 ct1 fp32", {1, 1024, 1, 30, 52, 1, 4, false}},
                        {"C1024 T1 30x52 ct1 bf16 channels_last", {1, 1024, 1, 30, 52, 1, 2, true}},
                        {"C512 T4 120x208 ct2 fp32", {1, 512, 4, 120, 208, 2, 4, false}}};
  const size_t fb = 256u << 20;
  void* flush;
  CHECK(cudaMalloc(&flush, fb));
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  unsigned long long* diff;
  CHECK(cudaMalloc(&diff, 8));
  std::printf("variant: unroll general %d (min blocks %d), aligned %d, parts %d (min blocks %d), chunks %d (min blocks "
              "%d), step order %d\n",
              DITOPS_CCP_UNROLL_GENERAL, CCP_TUNE_MIN_BLOCKS_GENERAL, DITOPS_CCP_UNROLL_ALIGNED, DITOPS_CCP_UNROLL_PARTS,
              CCP_TUNE_MIN_BLOCKS_PARTS, DITOPS_CCP_UNROLL_CHUNKS, CCP_TUNE_MIN_BLOCKS_CHUNKS, DITOPS_CCP_STEP_ORDER);
  std::printf("%-40s %-8s %4s %6s %-9s %4s %9s %9s %6s %s\n", "case", "kernel", "regs", "blocks", "grid", "thr", "us",
              "copy us", "copy%", "bytes differing from the reference");
  for (const Case& c : cases) {
    const Shape& s = c.s;
    const long long To = s.T + s.ct, Ho = s.H + 2, Wo = s.W + 2;
    const size_t xb = s.B * s.C * s.T * s.H * s.W * s.es, cb = s.B * s.C * s.ct * s.H * s.W * s.es;
    const size_t ob = s.B * s.C * To * Ho * Wo * s.es;
    unsigned char *x, *cache, *out, *want, *src, *dst;
    CHECK(cudaMalloc(&x, xb));
    CHECK(cudaMalloc(&cache, cb));
    CHECK(cudaMalloc(&out, ob));
    CHECK(cudaMalloc(&want, ob));
    const size_t half = (xb + cb + ob) / 2 / 16 * 16;  // the copy moves the op's bytes, half each way
    CHECK(cudaMalloc(&src, half));
    CHECK(cudaMalloc(&dst, half));
    fill_bits<<<1024, 256>>>((unsigned*)x, xb / 4, 1);
    fill_bits<<<1024, 256>>>((unsigned*)cache, cb / 4, 2);
    reference<<<4096, 256>>>(s, x, cache, want);
    CHECK(cudaDeviceSynchronize());
    // The row model, as the op fills it.
    CausalConv3dCatPadParams p{};
    const long long inner = (s.cl ? s.C : 1) * s.es;
    p.x = x, p.cache = cache, p.out = out;
    p.row_bytes = Wo * inner, p.head_bytes = inner, p.run_bytes = s.W * inner;
    p.rows_out = Ho, p.frames_out = To, p.src_rows = s.H, p.x_frames = s.T, p.cache_frames = s.ct;
    p.frame_offset = 0, p.row_offset = 1;
    ditops::ccp_finish_params(p, (s.cl ? s.B : s.B * s.C) * To * Ho, false);
    const int picked = ditops::ccp_path(p);
    const float copy = median_us([&] { copy_words<<<sms * 8, 256>>>((const uint4*)src, (uint4*)dst, half / 16); }, flush, fb);
    // Unaligned rows of 16 bytes or more: every unaligned kernel that serves them (chunks where
    // ccp_chunks_fit), whatever kCcpPartsMaxRowBytes says.
    const bool both = picked != ditops::kCcpAligned && p.row_bytes >= ditops::kCcpPartsMinRowBytes;
    for (int path : {ditops::kCcpChunks, ditops::kCcpParts, ditops::kCcpGeneral, ditops::kCcpAligned}) {
      if (both ? path == ditops::kCcpAligned || (path == ditops::kCcpChunks && !ditops::ccp_chunks_fit(p))
               : path != picked)
        continue;
      const void* fn = s.es == 2 ? variant_for<2>(path) : variant_for<4>(path);
      cudaFuncAttributes attr;
      CHECK(cudaFuncGetAttributes(&attr, fn));
      int per_sm = 0;
      CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, fn, 256, 0));
      const long long step = 32 * ditops::ccp_unroll(path);
      const long long warps = (p.windows + step - 1) / step;
      const long long cover = (warps + 7) / 8;
      // The resident grid (at most the resident blocks, warps looping over steps) and one step per warp,
      // in blocks of 256 threads (the op's) and, where one-step grids are a few waves at most (the
      // smallest cases), of 128 and 64: the same warps spread over the SMs in finer pieces.
      const unsigned resident = (unsigned)std::max(1LL, std::min(cover, (long long)per_sm * sms));
      struct Launch { unsigned grid; int threads; };
      std::vector<Launch> launches = {{resident, 256}};
      if (cover != (long long)resident) launches.push_back({(unsigned)cover, 256});
      if (cover <= 4LL * per_sm * sms)
        for (int threads : {128, 64}) launches.push_back({(unsigned)((warps + threads / 32 - 1) / (threads / 32)), threads});
      for (const Launch& l : launches) {
        const unsigned grid = l.grid;
        const int threads = l.threads;
        auto run = [&] {
          void* args[] = {&p};
          CHECK(cudaLaunchKernel(fn, grid, threads, args, 0, 0));
        };
        CHECK(cudaMemset(out, 0xA5, ob));
        run();
        CHECK(cudaMemset(diff, 0, 8));
        count_differences<<<1024, 256>>>(out, want, ob, diff);
        unsigned long long d = 0;
        CHECK(cudaMemcpy(&d, diff, 8, cudaMemcpyDeviceToHost));
        const float us = median_us(run, flush, fb);
        std::printf("%-40s %-8s %4d %6u %-9s %4d %9.2f %9.2f %5.1f%% %llu\n", c.name, path_name(path), attr.numRegs,
                    grid, threads == 256 && grid == resident ? "resident" : "one-step", threads, us, copy,
                    100.0 * copy / us, d);
      }
    }
    CHECK(cudaFree(x));
    CHECK(cudaFree(cache));
    CHECK(cudaFree(out));
    CHECK(cudaFree(want));
    CHECK(cudaFree(src));
    CHECK(cudaFree(dst));
  }
  return 0;
}

// Experiment (not part of the library): residual_gate_add's flat kernel launched alone from a
// cleared L2, against kernels shaped like Inductor's (bench/results run 83: in a CUDA graph after
// the clear, a Triton kernel of Inductor's shape into the same buffers read 0.2-0.35 us less at
// FLUX (1,4096,3072) than the library's, and 128-thread blocks or a leaner prologue did not
// change the library's). Every variant writes the same bytes (checked against the library's
// output); each is timed three ways: cold direct launch (memset clear, then the launch), cold
// graph (the launch alone in a CUDA graph, replayed after the clear, as the Python benchmark's
// cold_graph reading) and rotated (buffer sets > 3x the L2, back to back in one graph).
// Build and run on the GPU machine:
//   nvcc -O3 -std=c++17 -arch=sm_90a --default-stream per-thread -I../../kernels rga_cold_variants.cu -o /tmp/rga_cv
#include <cstring>
#include <random>
#include <string>

#include "residual_gate_add.cuh"
#include "tune_common.cuh"

using ditops::kernel::bf16;
using namespace ditops::kernel;

static void* g_flush;
static const size_t kFlushBytes = 256u << 20;

float cold_us(const std::function<void()>& f) { return median_us(f, g_flush, kFlushBytes); }

// f's launches captured once into a graph; the graph replayed after each clear.
float cold_graph_us(const std::function<void()>& f) {
  f();
  CHECK(cudaStreamSynchronize(cudaStreamPerThread));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CHECK(cudaStreamBeginCapture(cudaStreamPerThread, cudaStreamCaptureModeThreadLocal));
  f();
  CHECK(cudaStreamEndCapture(cudaStreamPerThread, &graph));
  CHECK(cudaGraphInstantiate(&exec, graph, 0));
  const float us = cold_us([&] { CHECK(cudaGraphLaunch(exec, cudaStreamPerThread)); });
  CHECK(cudaGraphExecDestroy(exec));
  CHECK(cudaGraphDestroy(graph));
  return us;
}


__global__ void __launch_bounds__(256) library_flat(const __grid_constant__ ditops::ResidualGateAddParams p) {
  ditops::residual_gate_add_flat<bf16, ditops::kRgaGateRow, true, false, 1, false>(p);
}

// The gate's 16 bytes with an L2 evict-last policy (what Inductor asks for on broadcast loads).
__device__ __forceinline__ Word<16> load_evict_last(const void* p) {
  Word<16> out;
  asm volatile(
      "{ .reg .b64 policy; createpolicy.fractional.L2::evict_last.b64 policy, 1.0;\n"
      "  ld.global.L2::cache_hint.v4.u32 {%0,%1,%2,%3}, [%4], policy; }"
      : "=r"(out.w[0]), "=r"(out.w[1]), "=r"(out.w[2]), "=r"(out.w[3])
      : "l"(p));
  return out;
}

// The 8 gated sums of one 16-byte unit (the library's rounding).
__device__ __forceinline__ Word<16> gated_word(const Word<16>& rw, const Word<16>& uw, const Word<16>& gw) {
  bf16 out[8];
#pragma unroll
  for (int e = 0; e < 8; ++e)
    out[e] = ditops::rga_detail::gated_sum(word_element<bf16>(rw, e), word_element<bf16>(uw, e), word_element<bf16>(gw, e));
  Word<16> w;
  elements_to_word(out, w);
  return w;
}

// Inductor's shape: kThreads threads, one 16-byte unit each, the row length a compile-time
// constant (kRowUnits), no bounds check (the grid is exact), plain pointers.
template <int kThreads, int kRowUnits, bool kEvictLast, bool kBoundsCheck>
__global__ void __launch_bounds__(kThreads) inductor_like(const bf16* r, const bf16* u, const bf16* g, bf16* o,
                                                          int units) {
  const int i = blockIdx.x * kThreads + threadIdx.x;
  if (kBoundsCheck && i >= units) return;
  const Word<16> rw = load_word<16, false>(r + 8 * static_cast<long long>(i));
  const Word<16> uw = load_word<16, false>(u + 8 * static_cast<long long>(i));
  const bf16* gp = g + 8 * (i % kRowUnits);
  const Word<16> gw = kEvictLast ? load_evict_last(gp) : load_word<16, false>(gp);
  store_word<16>(o + 8 * static_cast<long long>(i), gated_word(rw, uw, gw));
}

// The library's parameters (__grid_constant__ struct, run-time row length through the FastDivisor)
// on Inductor's shape: one unit per thread, no loop.
template <int kThreads>
__global__ void __launch_bounds__(kThreads) struct_no_loop(const __grid_constant__ ditops::ResidualGateAddParams p) {
  const unsigned i = blockIdx.x * kThreads + threadIdx.x;
  if (i >= static_cast<unsigned>(p.units)) return;
  const unsigned row = ditops::fast_quotient(i, p.row_units_divisor);
  const unsigned column = i - row * static_cast<unsigned>(p.row_units);
  const Word<16> rw = load_word<16, false>(static_cast<const bf16*>(p.residual) + 8 * static_cast<unsigned long long>(i));
  const Word<16> uw = load_word<16, false>(static_cast<const bf16*>(p.update) + 8 * static_cast<unsigned long long>(i));
  const Word<16> gw = load_word<16, false>(static_cast<const bf16*>(p.gate) + 8 * static_cast<unsigned long long>(column));
  store_word<16>(static_cast<bf16*>(p.out) + 8 * static_cast<unsigned long long>(i), gated_word(rw, uw, gw));
}

__global__ void __launch_bounds__(256) library_flat_pdl(const __grid_constant__ ditops::ResidualGateAddParams p) {
  ditops::residual_gate_add_flat<bf16, ditops::kRgaGateRow, true, true, 1, false>(p);
}

struct Sets {
  std::vector<ditops::ResidualGateAddParams> params;
  std::vector<void*> owned;
  size_t bytes;
  explicit Sets(long long rows) : bytes(rows * 3072 * 2) {
    int l2 = 0;
    CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, 0));
    const int n = (int)std::max<size_t>(2, std::min<size_t>(64, 3 * (size_t)l2 / (3 * bytes) + 1));
    std::vector<unsigned short> h(bytes / 2 + 16);
    std::mt19937 rng(5);
    for (auto& v : h) v = (unsigned short)(0x3c00 + (rng() & 0x3ff) - 0x200);
    void* gate = alloc(3072 * 2);
    CHECK(cudaMemcpy(gate, h.data() + 7, 3072 * 2, cudaMemcpyHostToDevice));
    for (int i = 0; i < n; ++i) {
      ditops::ResidualGateAddParams p{};
      p.residual = alloc(bytes);
      p.update = alloc(bytes);
      p.out = alloc(bytes);
      p.gate = gate;
      CHECK(cudaMemcpy((void*)p.residual, h.data() + i % 5, bytes, cudaMemcpyHostToDevice));
      CHECK(cudaMemcpy((void*)p.update, h.data() + 3 + i % 7, bytes, cudaMemcpyHostToDevice));
      ditops::rga_set_flat_sizes(p, rows * 3072 / 8, 3072 / 8, rows * 3072 / 8);
      params.push_back(p);
    }
  }
  ~Sets() {
    for (void* p : owned) cudaFree(p);
  }
  void* alloc(size_t n) {
    void* p;
    CHECK(cudaMalloc(&p, n));
    owned.push_back(p);
    return p;
  }
};

int main() {
  CHECK(cudaMalloc(&g_flush, kFlushBytes));
  for (long long rows : {4096LL, 512LL, 4608LL}) {
    Sets sets(rows);
    const int n = (int)sets.params.size();
    const unsigned units = (unsigned)(rows * 384);
    std::vector<unsigned short> reference;
    auto run = [&](const char* label, const std::function<void(const ditops::ResidualGateAddParams&)>& launch) {
      CHECK(cudaMemset(sets.params[0].out, 0xff, sets.bytes));
      launch(sets.params[0]);
      CHECK(cudaDeviceSynchronize());
      std::vector<unsigned short> o(sets.bytes / 2);
      CHECK(cudaMemcpy(o.data(), sets.params[0].out, sets.bytes, cudaMemcpyDeviceToHost));
      const char* same = "reference";
      if (reference.empty()) reference = o;
      else same = o == reference ? "equal" : "DIFFERENT";
      const float c = cold_us([&] { launch(sets.params[0]); });
      const float cg = cold_graph_us([&] { launch(sets.params[0]); });
      const float rot = rotated_graph_us(n, [&](int i) { launch(sets.params[i]); });
      std::printf("  %-44s cold %7.2f  cold graph %7.2f  rotated %7.2f us  %s\n", label, c, cg, rot, same);
    };
    std::printf("(1,%lld,3072) bf16 row gate, %d sets\n", rows, n);
    auto lib = [&](const ditops::ResidualGateAddParams& p) {
      library_flat<<<(units + 255) / 256, 256>>>(p);
    };
    auto like = [&](auto kernel, int threads) {
      return [=](const ditops::ResidualGateAddParams& p) {
        kernel<<<(units + threads - 1) / threads, threads>>>((const bf16*)p.residual, (const bf16*)p.update,
                                                             (const bf16*)p.gate, (bf16*)p.out, (int)units);
      };
    };
    for (int round = 0; round < 2; ++round) {
      run("library flat (256 threads)", lib);
      run("inductor-like 128, evict_last, no check", like(inductor_like<128, 384, true, false>, 128));
      run("inductor-like 128, plain gate, no check", like(inductor_like<128, 384, false, false>, 128));
      run("inductor-like 256, evict_last, no check", like(inductor_like<256, 384, true, false>, 256));
      run("inductor-like 128, evict_last, bounds check", like(inductor_like<128, 384, true, true>, 128));
      run("inductor-like 256, plain gate, bounds check", like(inductor_like<256, 384, false, true>, 256));
      run("params struct, fast divide, no loop, 256", [&](const ditops::ResidualGateAddParams& p) {
        struct_no_loop<256><<<(units + 255) / 256, 256>>>(p);
      });
      run("params struct, fast divide, no loop, 128", [&](const ditops::ResidualGateAddParams& p) {
        struct_no_loop<128><<<(units + 127) / 128, 128>>>(p);
      });
      run("library flat, PDL kernel (no attribute)", [&](const ditops::ResidualGateAddParams& p) {
        library_flat_pdl<<<(units + 255) / 256, 256>>>(p);
      });
    }
  }
  return 0;
}

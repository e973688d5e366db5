// norm_scale_shift on the GPU, what a driver case cannot express (every CUDA implementation against
// the reference over the grid of shapes, norms, numerics, classes and quantized outputs is the
// driver's: tests/cases/norm_scale_shift_cases.cpp). The NVFP4 bytes exactly against the GPU's own
// y: its block factors computed on the device by the kernel's nvfp4_block_scale (the approximate
// reciprocals included), the E2M1 codes on the host by the reference conversion, and the padding
// rows of the block scales zero; the kernel's E2M1 conversion over all 2^32 fp32 patterns and the
// packed 16-bit products over every pair, on the device; the hardware E2M1 refused where the device
// lacks it. Skipped without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <string>

#include "ditops/norm_scale_shift.h"
#include "jit/cuda_driver.h"
#include "jit/jit.h"
#include "jit/nvrtc.h"
#include "reference/fp8_fp4.h"
#include "reference/half.h"

namespace ditops {
namespace {

using jit::check_cu;

bool have_gpu() { return jit::cuda_driver() != nullptr; }

// A tensor held on the host and the device with the same shape and strides.
struct Twin {
  std::vector<uint8_t> host;
  CUdeviceptr dev = 0;
  TensorView hv, dv;
  Twin() = default;
  Twin(DType dt, std::vector<int64_t> shape) {
    int64_t n = 1;
    for (int64_t s : shape) n *= s;
    host.assign(static_cast<size_t>(n) * dtype_size(dt) + 16, 0);
    check_cu(jit::require_cuda_driver().cuMemAlloc(&dev, host.size()), "alloc");
    hv = TensorView::contiguous(host.data(), dt, Device{DeviceKind::cpu, 0}, shape);
    dv = hv;
    dv.data = reinterpret_cast<void*>(dev);
    dv.device = {DeviceKind::cuda, 0};
  }
  Twin(const Twin&) = delete;
  Twin& operator=(const Twin&) = delete;
  ~Twin() {
    if (dev) jit::require_cuda_driver().cuMemFree(dev);
  }
  void upload() { check_cu(jit::require_cuda_driver().cuMemcpyHtoD(dev, host.data(), host.size()), "h2d"); }
  std::vector<uint8_t> download() const {
    std::vector<uint8_t> out(host.size());
    check_cu(jit::require_cuda_driver().cuMemcpyDtoH(out.data(), dev, host.size()), "d2h");
    return out;
  }
  float get(int64_t i) const { return ref::load_act(host.data(), i, hv.dtype); }
  void set(int64_t i, float v) { ref::store_act(host.data(), i, hv.dtype, v); }
};

struct GpuCase {
  int64_t B, S, D;
  DType dt;
  NormType norm;
  NssNumerics numerics;
  bool residual;
  int affine;
  NssQuant quant;
  int scale_class;  // 0 scalar, 1 [D], 2 [B,1,D], 3 [B,S,D], 4 [B,F,1,D]
  float amplitude, eps;
  bool without_y = false;  // quantized outputs only (the kernels skip y's stores)
};

std::vector<int64_t> operand_shape(int cls, int64_t B, int64_t S, int64_t D) {
  switch (cls) {
    case 0: return {};
    case 1: return {D};
    case 2: return {B, 1, D};
    case 3: return {B, S, D};
    default: return {B, S % 3 == 0 ? 3 : 1, 1, D};
  }
}

// A check kernel (`source`, kernel `name`) compiled with NVRTC for device 0 once per process; its
// module stays loaded.
const jit::LoadedKernel& device_check_kernel(const char* source, const char* name) {
  static std::map<std::string, jit::LoadedKernel> kernels;
  const auto found = kernels.find(name);
  if (found != kernels.end()) return found->second;
  const DeviceInfo& info = device_info({DeviceKind::cuda, 0});
  const std::vector<uint8_t> cubin = jit::nvrtc_compile(source, std::string(name) + ".cu", jit::arch_for_sm(info.sm),
                                                        jit::embedded_sources());
  const auto& d = jit::require_cuda_driver();
  CUmodule module = nullptr;
  check_cu(d.cuModuleLoadData(&module, cubin.data()), "load");
  jit::LoadedKernel kernel;
  check_cu(d.cuModuleGetFunction(&kernel.function, module, name), "function");
  return kernels.emplace(name, kernel).first->second;
}

// Runs check kernel `name` on 16 CTAs of 256 threads per multiprocessor (grid-stride over its
// inputs) with `params`, waits.
template <typename Params>
void run_device_check(const char* source, const char* name, const Params& params) {
  const DeviceInfo& info = device_info({DeviceKind::cuda, 0});
  jit::launch(device_check_kernel(source, name), static_cast<unsigned>(info.multiprocessors) * 16, 256, &params,
              sizeof params, nullptr, false);
  check_cu(jit::require_cuda_driver().cuCtxSynchronize(), "sync");
}

// The factor each NVFP4 block of a 16-bit y is multiplied by before its E2M1 conversion, and the
// block's E4M3 scale byte, from the kernel's own nvfp4_block_scale (rcp.approx included) and the
// block's amax. With the GPU's y, the host then knows every NVFP4 byte the kernel must write.
constexpr const char* kNvfp4FactorSource = R"(
#include "norm_scale_shift.cuh"
struct Nvfp4FactorParams {
  const unsigned short* y;  // rows x D values of y, contiguous
  long long blocks;         // rows * D / 16
  float global_scale;
  int f16;                  // y's dtype: 1 f16, 0 bf16
  float* factors;
  unsigned char* scale_bytes;
};
extern "C" __global__ void nvfp4_factors(const __grid_constant__ Nvfp4FactorParams p) {
  using namespace ditops::nss_detail;
  const long long threads = static_cast<long long>(gridDim.x) * blockDim.x;
  for (long long b = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; b < p.blocks; b += threads) {
    float amax = 0.0f;
    for (int i = 0; i < 16; ++i) {
      const unsigned short bits = p.y[16 * b + i];
      amax = fmaxf(amax, fabsf(p.f16 ? to_float(f16{bits}) : to_float(bf16{bits})));
    }
    u32 sf8;
    p.factors[b] = nvfp4_block_scale(amax, p.global_scale, &sf8);
    p.scale_bytes[b] = static_cast<unsigned char>(sf8);
  }
}
)";

struct Nvfp4FactorParams {
  CUdeviceptr y;
  long long blocks;
  float global_scale;
  int f16;
  CUdeviceptr factors, scale_bytes;
};

struct Stats {
  // NVFP4 bytes against those of the GPU's own y (exact: must stay 0).
  int64_t own_y_q_differ = 0, own_y_sf_differ = 0, own_y_blocks = 0;
};

// Runs the case on the GPU (explicit jit backend); checks its NVFP4 bytes against its own y.
std::string run_case(const GpuCase& c, E2m1Conversion e2m1, Stats* st) {
  std::mt19937 rng(static_cast<uint32_t>(c.B * 1000 + c.S * 10 + c.D + c.residual));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int64_t n = c.B * c.S * c.D, rows = c.B * c.S;
  Twin x(c.dt, {c.B, c.S, c.D}), y(c.dt, {c.B, c.S, c.D});
  for (int64_t i = 0; i < n; ++i) x.set(i, c.amplitude * (normal(rng) + 0.25f));
  for (int64_t i = 0; i < n; i += 97) x.set(i, (i / 97) % 2 ? -0.0f : 0.0f);  // signed zeros
  Twin scale(c.dt, operand_shape(c.scale_class, c.B, c.S, c.D)), shift(c.dt, {c.B, 1, c.D});
  for (int64_t i = 0; i < scale.hv.numel(); ++i) scale.set(i, 0.3f * normal(rng));
  for (int64_t i = 0; i < shift.hv.numel(); ++i) shift.set(i, 0.3f * normal(rng));
  if (scale.hv.numel() > 2) {
    scale.set(0, -1.0f);  // special modulation values
    scale.set(1, 0.0f);
    scale.set(2, -0.0f);
  }
  Twin residual(c.dt, {c.B, c.S, c.D}), residual_out(c.dt, {c.B, c.S, c.D}),
      gate(c.dt, operand_shape((c.scale_class + 2) % 5, c.B, c.S, c.D));
  for (int64_t i = 0; i < n; ++i) residual.set(i, c.amplitude * normal(rng));
  for (int64_t i = 0; i < gate.hv.numel(); ++i) gate.set(i, normal(rng));
  Twin weight(c.dt, {c.D}), bias(c.dt, {c.D});
  for (int64_t i = 0; i < c.D; ++i) {
    weight.set(i, 1.0f + 0.2f * normal(rng));
    bias.set(i, 0.1f * normal(rng));
  }
  Twin fp8(DType::u8, {c.B, c.S, c.D}), input_scale(DType::f32, {1}), global_scale(DType::f32, {1});
  input_scale.set(0, 0.4754464328289032f);
  global_scale.set(0, 0.625f);
  const int64_t padded = (rows + 127) / 128 * 128;
  Twin packed(DType::u8, {rows, c.D / 2}), scales(DType::u8, {padded, std::max<int64_t>(c.D / 16, 1)});
  std::memset(scales.host.data(), 0x77, scales.host.size());

  for (Twin* t : {&x, &y, &scale, &shift, &residual, &residual_out, &gate, &weight, &bias, &fp8, &input_scale,
                  &global_scale, &packed, &scales})
    t->upload();
  auto build = [&](bool device, NormScaleShiftInputs* in, NormScaleShiftOutputs* out) {
    auto v = [&](Twin& t) { return device ? t.dv : t.hv; };
    in->x = v(x);
    in->scale = v(scale);
    in->shift = v(shift);
    if (c.residual) {
      in->residual = v(residual);
      in->gate = v(gate);
      out->residual_out = v(residual_out);
    }
    if (c.affine >= 1) in->weight = v(weight);
    if (c.affine == 2) in->bias = v(bias);
    if (!c.without_y) out->y = v(y);
    if (c.quant == NssQuant::fp8) {
      in->input_scale = v(input_scale);
      out->fp8 = v(fp8);
    }
    if (c.quant == NssQuant::nvfp4) {
      in->global_scale = v(global_scale);
      out->nvfp4_packed = v(packed);
      out->nvfp4_scales = v(scales);
    }
  };
  NormScaleShiftOptions o;
  o.norm = c.norm;
  o.eps = c.eps;
  o.numerics = c.numerics;
  o.e2m1 = e2m1;
  NormScaleShiftInputs din;
  NormScaleShiftOutputs dout;
  build(true, &din, &dout);
  o.dispatch.backend = Provenance::jit;
  jit::bind_primary_context(0);
  const std::string impl = norm_scale_shift(din, dout, o);
  check_cu(jit::require_cuda_driver().cuCtxSynchronize(), "sync");

  const auto gy = y.download();
  if (c.quant == NssQuant::nvfp4) {
    const auto gp = packed.download(), gs = scales.download();
    // Padding rows, located through the swizzle (a linear index says nothing about the row).
    for (int64_t m = rows; m < padded; ++m)
      for (int64_t k = 0; k < c.D / 16; ++k)
        EXPECT_EQ(gs[nvfp4_scale_offset(m, k, c.D / 16)], 0) << "padding scale row " << m << " column " << k;
    // Exactly: the bytes the GPU's own y quantizes to.
    if (!c.without_y) {
      const int64_t cols = c.D / 16, blocks = rows * cols;
      Twin factors(DType::f32, {blocks}), scale_bytes(DType::u8, {blocks});
      run_device_check(kNvfp4FactorSource, "nvfp4_factors",
                       Nvfp4FactorParams{y.dev, blocks, global_scale.get(0), c.dt == DType::f16 ? 1 : 0, factors.dev,
                                         scale_bytes.dev});
      const auto f = factors.download(), sb = scale_bytes.download();
      for (int64_t b = 0; b < blocks; ++b) {
        st->own_y_blocks++;
        const int64_t m = b / cols, k = b % cols;
        const uint8_t got_sf = gs[nvfp4_scale_offset(m, k, cols)];
        if (got_sf != sb[b] && st->own_y_sf_differ++ == 0)
          ADD_FAILURE() << "nvfp4 scale byte of row " << m << " block " << k << ": 0x" << std::hex << int{got_sf}
                        << " against 0x" << int{sb[b]};
        float factor;
        std::memcpy(&factor, f.data() + 4 * b, sizeof factor);
        for (int64_t e = 16 * b; e < 16 * b + 16; ++e) {
          const float value = ref::load_act(gy.data(), e, c.dt);
          const uint8_t want = ref::float_to_e2m1_satfinite(value * factor);
          const uint8_t got = (gp[e / 2] >> (4 * (e % 2))) & 0xF;
          if (got != want && st->own_y_q_differ++ == 0)
            ADD_FAILURE() << "nvfp4 nibble of row " << m << " value " << e % c.D << ": " << int{got} << " against "
                          << int{want} << " (y " << value << ", factor " << factor << ")";
        }
      }
    }
  }
  return impl;
}

class NormScaleShiftGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!have_gpu()) GTEST_SKIP() << "no CUDA device: the GPU implementations are checked on the device run";
    jit::bind_primary_context(0);  // the buffers below are allocated before any op call binds it
  }
};

// The NVFP4 configurations of the driver's grid (both numerics, more rows than resident CTAs,
// without y, block scales shared over a quad's lanes: 5 slots and 1), both E2M1 conversions.
TEST_F(NormScaleShiftGpu, Nvfp4BytesFollowTheDevicesOwnY) {
  std::vector<GpuCase> cases;
  int k = 16;
  for (NssNumerics numerics : {NssNumerics::eager, NssNumerics::sglang})
    for (auto [B, S] : {std::pair<int64_t, int64_t>{1, 127}, {2, 65}})
      cases.push_back({B, S, 3072, DType::bf16, NormType::layer, numerics, true, 0, NssQuant::nvfp4, ++k % 5, 1.0f,
                       1e-6f});
  cases.push_back({3, 700, 3072, DType::bf16, NormType::layer, NssNumerics::eager, false, 0, NssQuant::nvfp4, 3,
                   1.0f, 1e-6f});
  cases.push_back({1, 127, 3072, DType::bf16, NormType::layer, NssNumerics::eager, true, 0, NssQuant::nvfp4, 2,
                   1.0f, 1e-6f, true});
  cases.push_back({3, 700, 3072, DType::bf16, NormType::layer, NssNumerics::eager, true, 0, NssQuant::nvfp4, 4,
                   0.01f, 1e-5f, true});
  cases.push_back({2, 65, 1088, DType::f16, NormType::layer, NssNumerics::eager, false, 2, NssQuant::nvfp4, 1,
                   100.0f, 1e-6f, true});
  cases.push_back({2, 65, 2304, DType::bf16, NormType::layer, NssNumerics::eager, true, 0, NssQuant::nvfp4, 1,
                   1.0f, 1e-6f});
  cases.push_back({1, 33, 256, DType::bf16, NormType::layer, NssNumerics::eager, false, 1, NssQuant::nvfp4, 0,
                   1.0f, 1e-5f, true});
  Stats st;
  for (const auto& c : cases)
    for (E2m1Conversion e2m1 : {E2m1Conversion::software, E2m1Conversion::automatic}) run_case(c, e2m1, &st);
  std::printf("nvfp4 against the GPU's own y: %lld blocks, scale bytes differ in %lld, nibbles in %lld\n",
              static_cast<long long>(st.own_y_blocks), static_cast<long long>(st.own_y_sf_differ),
              static_cast<long long>(st.own_y_q_differ));
  EXPECT_GT(st.own_y_blocks, 0);
  EXPECT_EQ(st.own_y_sf_differ, 0);
  EXPECT_EQ(st.own_y_q_differ, 0);
}

// The kernel's NVFP4 conversions checked exhaustively on the device: the software E2M1
// conversion of products (kernels/norm_scale_shift.cuh e2m1x4<false>, fed `x * one` as the kernel
// feeds it y * scale) against the compare ladder that defines it (the reference's
// float_to_e2m1_satfinite, written here as device code) for all 2^32 fp32 bit patterns, four
// neighbouring patterns per call; that the device's fp32 product of a NaN is the canonical NaN
// 0x7FFFFFFF, which the conversion relies on; and the hardware E4M3 decode against the reference
// for all 256 bytes. The grid test above checks NVFP4 bytes exactly only for the products its
// cases happen to produce, so it could miss a conversion that is wrong at a few inputs; this test
// cannot.
constexpr const char* kConversionCheckSource = R"(
#include "norm_scale_shift.cuh"
struct ConversionCheckParams {
  unsigned long long* e2m1_mismatches;
  unsigned* e2m1_first_mismatch;
  unsigned long long* noncanonical_nans;
  float* e4m3_decoded;
  float one;
};
__device__ unsigned e2m1_by_compares(float x) {
  const unsigned bits = __float_as_uint(x);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return 7u;
  const float a = fabsf(x);
  const unsigned code = (a > 0.25f) + (a >= 0.75f) + (a > 1.25f) + (a >= 1.75f) + (a > 2.5f) + (a >= 3.5f) + (a > 5.0f);
  return code | ((bits >> 28) & 8u);
}
extern "C" __global__ void conversion_check(const __grid_constant__ ConversionCheckParams p) {
  const unsigned long long threads = static_cast<unsigned long long>(gridDim.x) * blockDim.x;
  unsigned long long mismatches = 0, noncanonical = 0;
  for (unsigned long long i = (static_cast<unsigned long long>(blockIdx.x) * blockDim.x + threadIdx.x) * 4;
       i < (1ull << 32); i += 4 * threads) {
    float products[4];
    unsigned want = 0;
    for (int k = 0; k < 4; ++k) {
      const float x = __uint_as_float(static_cast<unsigned>(i + k));
      products[k] = __fmul_rn(x, p.one);
      want |= e2m1_by_compares(x) << (4 * k);
      if (x != x && __float_as_uint(products[k]) != 0x7FFFFFFFu) ++noncanonical;
    }
    const unsigned got = ditops::nss_detail::e2m1x4<false>(products);
    if (got != want) {
      for (int k = 0; k < 4; ++k)
        if (((got ^ want) >> (4 * k)) & 0xFu) {
          ++mismatches;
          atomicMin(p.e2m1_first_mismatch, static_cast<unsigned>(i + k));
        }
    }
  }
  if (mismatches) atomicAdd(p.e2m1_mismatches, mismatches);
  if (noncanonical) atomicAdd(p.noncanonical_nans, noncanonical);
  if (blockIdx.x == 0) p.e4m3_decoded[threadIdx.x] = ditops::nss_detail::e4m3_to_float(threadIdx.x);
}
)";

struct ConversionCheckParams {
  CUdeviceptr e2m1_mismatches, e2m1_first_mismatch, noncanonical_nans, e4m3_decoded;
  float one;
};

TEST_F(NormScaleShiftGpu, Nvfp4ConversionsMatchTheReferenceForEveryInput) {
  Twin mismatches(DType::u8, {8}), first(DType::u8, {4}), noncanonical(DType::u8, {8}), decoded(DType::f32, {256});
  std::memset(first.host.data(), 0xff, 4);
  mismatches.upload();
  first.upload();
  noncanonical.upload();
  run_device_check(kConversionCheckSource, "conversion_check",
                   ConversionCheckParams{mismatches.dev, first.dev, noncanonical.dev, decoded.dev, 1.0f});
  unsigned long long count = 0, noncanonical_count = 0;
  uint32_t first_bad = 0;
  std::memcpy(&count, mismatches.download().data(), sizeof count);
  std::memcpy(&noncanonical_count, noncanonical.download().data(), sizeof noncanonical_count);
  std::memcpy(&first_bad, first.download().data(), sizeof first_bad);
  float bad_value;
  std::memcpy(&bad_value, &first_bad, sizeof bad_value);
  EXPECT_EQ(noncanonical_count, 0u) << "products of NaN that are not the canonical NaN";
  EXPECT_EQ(count, 0u) << "E2M1 differs from the compare ladder at " << count << " inputs, first 0x" << std::hex
                       << first_bad << " (" << bad_value << ")";
  const std::vector<uint8_t> raw = decoded.download();
  for (int byte = 0; byte < 256; ++byte) {
    if ((byte & 0x7F) == 0x7F) continue;  // NaN codes: satfinite conversions never produce them
    float got;
    std::memcpy(&got, raw.data() + 4 * byte, sizeof got);
    const float want = ref::e4m3_to_float(static_cast<uint8_t>(byte));
    EXPECT_EQ(ref::float_bits(got), ref::float_bits(want)) << "E4M3 byte 0x" << std::hex << byte;
  }
}

// The eager residual step multiplies x by the gate with the packed 16-bit instruction (one
// rounding of the exact product) where eager PyTorch rounds the fp32 product to the dtype; the
// kernel argues they agree (kernels/norm_scale_shift.cuh, eager_rows). Checked for every pair of
// bf16 values and every pair of f16 values, in both lanes, bit for bit (NaNs included).
constexpr const char* kPackedProductSource = R"(
#include "common/types.cuh"
struct PackedProductParams {
  unsigned long long* mismatches;  // [bf16, f16]
  unsigned* first_mismatch;        // [bf16, f16]: x | g << 16
};
extern "C" __global__ void packed_product_check(const __grid_constant__ PackedProductParams p) {
  using namespace ditops::kernel;
  const unsigned long long threads = static_cast<unsigned long long>(gridDim.x) * blockDim.x;
  unsigned long long bad_bf16 = 0, bad_f16 = 0;
  for (unsigned long long i = static_cast<unsigned long long>(blockIdx.x) * blockDim.x + threadIdx.x; i < (1ull << 32);
       i += threads) {
    const unsigned x = static_cast<unsigned>(i) & 0xFFFFu, g = static_cast<unsigned>(i >> 16);
    const unsigned a = x | (g << 16), b = g | (x << 16);  // x * g in the low lane, g * x in the high
    const unsigned bf16_want = bf16x2_from_floats(__fmul_rn(bf16x2_lo(a), bf16x2_lo(b)), __fmul_rn(bf16x2_hi(a), bf16x2_hi(b)));
    if (mul_rn_bf16x2(a, b) != bf16_want) {
      ++bad_bf16;
      atomicMin(p.first_mismatch, static_cast<unsigned>(i));
    }
    const float xl = to_float(f16{static_cast<unsigned short>(x)});
    const float gl = to_float(f16{static_cast<unsigned short>(g)});
    const unsigned f16_want = f16x2_from_floats(__fmul_rn(xl, gl), __fmul_rn(gl, xl));
    if (mul_rn_f16x2(a, b) != f16_want) {
      ++bad_f16;
      atomicMin(p.first_mismatch + 1, static_cast<unsigned>(i));
    }
  }
  if (bad_bf16) atomicAdd(p.mismatches, bad_bf16);
  if (bad_f16) atomicAdd(p.mismatches + 1, bad_f16);
}
)";

struct PackedProductParams {
  CUdeviceptr mismatches, first_mismatch;
};

TEST_F(NormScaleShiftGpu, PackedProductsEqualTheFp32ProductRounded) {
  Twin mismatches(DType::u8, {16}), first(DType::u8, {8});
  std::memset(first.host.data(), 0xff, 8);
  mismatches.upload();
  first.upload();
  run_device_check(kPackedProductSource, "packed_product_check", PackedProductParams{mismatches.dev, first.dev});
  unsigned long long count[2];
  uint32_t first_bad[2];
  std::memcpy(count, mismatches.download().data(), sizeof count);
  std::memcpy(first_bad, first.download().data(), sizeof first_bad);
  EXPECT_EQ(count[0], 0u) << "bf16: packed product differs at " << count[0] << " pairs, first x | g << 16 = 0x"
                          << std::hex << first_bad[0];
  EXPECT_EQ(count[1], 0u) << "f16: packed product differs at " << count[1] << " pairs, first x | g << 16 = 0x"
                          << std::hex << first_bad[1];
}

TEST_F(NormScaleShiftGpu, HardwareE2m1IsRefusedWhereTheDeviceLacksIt) {
  const DeviceInfo& info = device_info({DeviceKind::cuda, 0});
  if (info.features & kFeatureFp4Convert) GTEST_SKIP() << "this device has the hardware conversion";
  Twin x(DType::bf16, {1, 4, 64}), s(DType::bf16, {64}), packed(DType::u8, {4, 32}), sc(DType::u8, {128, 4}),
      gs(DType::f32, {1});
  NormScaleShiftInputs in;
  in.x = x.dv;
  in.scale = s.dv;
  in.global_scale = gs.dv;
  NormScaleShiftOutputs out;
  out.nvfp4_packed = packed.dv;
  out.nvfp4_scales = sc.dv;
  NormScaleShiftOptions o;
  o.e2m1 = E2m1Conversion::hardware;
  o.dispatch.backend = Provenance::jit;
  try {
    norm_scale_shift(in, out, o);
    FAIL() << "expected a refusal";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("e2m1=hardware needs"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace ditops

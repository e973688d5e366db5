// residual_gate_add on the GPU, what a driver case cannot express (every CUDA implementation
// against the reference over the shapes, layouts, dtypes and misaligned pointers is the driver's:
// tests/cases/residual_gate_add_cases.cpp): kernels launched directly with their own grids (both
// index widths and a grid that loops, the chunked residual side and the tall tile at shapes the
// op gives to other kernels), the schedule each shape's kernel key takes, and a call captured
// into a CUDA graph replaying on new inputs. Skipped without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "ditops/residual_gate_add.h"
#include "jit/cuda_driver.h"
#include "jit/jit.h"
#include "kernels/residual_gate_add.cuh"
#include "ops/residual_gate_add/residual_gate_add_kernels.h"
#include "reference/half.h"

namespace ditops {
namespace {

using jit::check_cu;

constexpr size_t kGuard = 256;         // bytes of sentinel before and after every device tensor
constexpr unsigned char kSentinel = 0xA5;

struct Buffer {
  CUdeviceptr ptr = 0;
  size_t bytes;
  explicit Buffer(size_t n) : bytes(n) { check_cu(jit::require_cuda_driver().cuMemAlloc(&ptr, n ? n : 16), "alloc"); }
  ~Buffer() { jit::require_cuda_driver().cuMemFree(ptr); }
};

bool have_gpu() { return jit::cuda_driver() != nullptr; }

struct GpuCase {
  std::vector<int64_t> shape, gate;
  DType dtype = DType::bf16;
  bool transposed = false;  // residual/out [B, T, H] with strides (T*H, 1, T)
  int misalign = 0;         // elements every pointer is moved off 16-byte alignment
  int residual_misalign = 0;  // elements residual and out alone are moved (after misalign)
  std::string describe() const {
    std::string s = dtype_name(dtype);
    s += " [";
    for (size_t i = 0; i < shape.size(); ++i) s += (i ? "," : "") + std::to_string(shape[i]);
    s += "] gate [";
    for (size_t i = 0; i < gate.size(); ++i) s += (i ? "," : "") + std::to_string(gate[i]);
    s += "]";
    if (transposed) s += " transposed";
    if (misalign) s += " misaligned by " + std::to_string(misalign);
    if (residual_misalign) s += " residual and out misaligned by " + std::to_string(residual_misalign);
    return s;
  }
};

int64_t product(const std::vector<int64_t>& v) {
  int64_t n = 1;
  for (int64_t x : v) n *= x;
  return n;
}

TensorView view_of(void* data, const GpuCase& c, const std::vector<int64_t>& shape, Device dev, bool transposed) {
  TensorView v = TensorView::contiguous(data, c.dtype, dev, shape);
  if (transposed) {
    v.strides[0] = shape[1] * shape[2];
    v.strides[1] = 1;
    v.strides[2] = shape[1];
  }
  return v;
}

// Host inputs of one case (storage order = physical order).
struct HostInputs {
  std::vector<uint8_t> residual, update, gate;
};

HostInputs make_inputs(const GpuCase& c, uint32_t seed) {
  const size_t es = dtype_size(c.dtype);
  const int64_t n = product(c.shape), gn = product(c.gate);
  HostInputs h;
  h.residual.resize(n * es);
  h.update.resize(n * es);
  h.gate.resize(gn * es);
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  auto fill = [&](std::vector<uint8_t>& b, int64_t count, float scale) {
    for (int64_t i = 0; i < count; ++i) {
      float v = normal(rng) * scale;
      if (i % 97 == 0) v = (i % 2) ? -0.0f : 0.0f;  // signed zeros
      ref::store_act(b.data(), i, c.dtype, v);
    }
  };
  fill(h.residual, n, 4.0f);
  fill(h.update, n, 1.0f);
  fill(h.gate, gn, 0.5f);
  return h;
}

struct DeviceTensor {
  Buffer buffer;
  size_t offset;  // bytes from the buffer start to the tensor
  size_t bytes;
  DeviceTensor(size_t tensor_bytes, int misalign_bytes)
      : buffer(tensor_bytes + 2 * kGuard + 16), offset(kGuard + misalign_bytes), bytes(tensor_bytes) {
    check_cu(jit::require_cuda_driver().cuMemsetD8(buffer.ptr, kSentinel, buffer.bytes), "memset");
  }
  void* data() const { return reinterpret_cast<void*>(buffer.ptr + offset); }
  void upload(const std::vector<uint8_t>& host) {
    check_cu(jit::require_cuda_driver().cuMemcpyHtoD(buffer.ptr + offset, host.data(), host.size()), "h2d");
  }
  std::vector<uint8_t> download_all() const {
    std::vector<uint8_t> all(buffer.bytes);
    check_cu(jit::require_cuda_driver().cuMemcpyDtoH(all.data(), buffer.ptr, all.size()), "d2h");
    return all;
  }
};

// Compares the device out (with its guards) against the reference bytes; returns "" or a failure.
std::string compare(const DeviceTensor& out, const std::vector<uint8_t>& want, size_t es) {
  const std::vector<uint8_t> all = out.download_all();
  for (size_t i = 0; i < all.size(); ++i) {
    if (i >= out.offset && i < out.offset + out.bytes) continue;
    if (all[i] != kSentinel) return "byte " + std::to_string(i) + " outside out was written";
  }
  int64_t differ = 0, first = -1;
  for (size_t e = 0; e < want.size() / es; ++e)
    if (std::memcmp(all.data() + out.offset + e * es, want.data() + e * es, es) != 0) {
      ++differ;
      if (first < 0) first = static_cast<int64_t>(e);
    }
  if (differ) return std::to_string(differ) + " elements differ, first at storage index " + std::to_string(first);
  return "";
}

// The CPU reference's output for a case's inputs (storage order of out = residual's).
std::vector<uint8_t> reference_of(const GpuCase& c, const HostInputs& h) {
  const Device cpu{DeviceKind::cpu, 0};
  std::vector<uint8_t> want(product(c.shape) * dtype_size(c.dtype));
  residual_gate_add(view_of(const_cast<uint8_t*>(h.residual.data()), c, c.shape, cpu, c.transposed),
                    view_of(const_cast<uint8_t*>(h.update.data()), c, c.shape, cpu, false),
                    view_of(const_cast<uint8_t*>(h.gate.data()), c, c.gate, cpu, false),
                    view_of(want.data(), c, c.shape, cpu, c.transposed));
  return want;
}

// The inputs on the device: residual `residual_bytes` and the others `bytes` off 16 bytes.
struct DeviceInputs {
  DeviceTensor r, u, g;
  DeviceInputs(const HostInputs& h, int residual_bytes, int bytes)
      : r(h.residual.size(), residual_bytes), u(h.update.size(), bytes), g(h.gate.size(), bytes) {
    r.upload(h.residual);
    u.upload(h.update);
    g.upload(h.gate);
  }
};

class ResidualGateAddGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!have_gpu()) GTEST_SKIP() << "no CUDA device: the GPU implementations are checked on the device run";
    jit::bind_primary_context(0);
  }
};

// The flat kernels launched directly: 32- and 64-bit indices (the op takes 64-bit only from 2^31
// units, so the tests above never reach it), on a grid that covers the tensor and on a 3-block
// grid that loops (the kernels that loop: 64-bit, and the scalar path's 8 units per thread; the
// 32-bit kernel of one unit per thread runs one round by design); every gate mode, vector (bf16)
// and scalar (fp32) path, against the reference.
TEST_F(ResidualGateAddGpu, FlatKernelIndexWidthsAndGridStrideLoopAgree) {
  struct ModeCase {
    GateMode mode;
    std::vector<int64_t> gate;
    int64_t rows_per_gate_row;
  };
  const std::vector<int64_t> shape = {2, 33, 128};
  const std::vector<ModeCase> modes = {{GateMode::row, {1, 1, 128}, 66},
                                       {GateMode::batch, {2, 1, 128}, 33},
                                       {GateMode::token, {2, 33, 1}, 1},
                                       {GateMode::full, {2, 33, 128}, 1}};
  uint32_t seed = 400;
  for (DType dt : {DType::bf16, DType::f32})
    for (const ModeCase& m : modes) {
      const GpuCase c{shape, m.gate, dt};
      SCOPED_TRACE(c.describe());
      const size_t es = dtype_size(dt);
      const int64_t n = product(shape);
      const HostInputs h = make_inputs(c, seed++);
      const std::vector<uint8_t> want = reference_of(c, h);
      const DeviceInputs in(h, 0, 0);
      const DeviceTensor &r = in.r, &u = in.u, &g = in.g;
      RgaKernelKey key;
      key.dtype = dt;
      key.mode = m.mode;
      key.vector = dt != DType::f32;  // fp32 here exercises the scalar path
      key.pdl = false;
      const int64_t elems = key.vector ? 16 / static_cast<int64_t>(es) : 1;
      for (bool index64 : {false, true})
        for (int64_t grid : {int64_t{0}, int64_t{3}}) {
          key.index64 = index64;
          if (grid != 0 && !index64 && rga_flat_units(key) == 1) continue;
          const jit::LoadedKernel& kernel = jit::jit_kernel(rga_kernel_request(key), 0);
          DeviceTensor o(n * es, 0);
          ResidualGateAddParams p{};
          p.residual = r.data();
          p.update = u.data();
          p.gate = g.data();
          p.out = o.data();
          rga_set_flat_sizes(p, n / elems, shape[2] / elems, m.rows_per_gate_row * (shape[2] / elems));
          const int64_t blocks = grid ? grid : (p.units + kRgaThreads - 1) / kRgaThreads;
          jit::launch(kernel, static_cast<unsigned>(blocks), kRgaThreads, &p, sizeof p, nullptr, false);
          check_cu(jit::require_cuda_driver().cuCtxSynchronize(), "sync");
          EXPECT_EQ(compare(o, want, es), "") << (index64 ? "64" : "32") << "-bit indices, " << blocks << " blocks, "
                                              << key.to_string();
        }
    }
}

// The transposed kernel of `key` launched directly on residual [B, H, T] / update [B, T, H] of
// `shape` = [B, T, H] (no schedule of the op's), `lead` token rows before each tile (chunked
// lines), and synchronized.
void launch_transposed_directly(const RgaKernelKey& key, const std::vector<int64_t>& shape, const DeviceInputs& in,
                                DeviceTensor& o, int64_t lead) {
  const jit::LoadedKernel& kernel = jit::jit_kernel(rga_kernel_request(key), 0);
  ResidualGateAddParams p{};
  p.residual = in.r.data();
  p.update = in.u.data();
  p.gate = in.g.data();
  p.out = o.data();
  p.tokens = shape[1];
  p.hidden = shape[2];
  p.tiles_t = (p.tokens + lead + key.tokens_per_tile() - 1) / key.tokens_per_tile();
  p.tiles_h = (p.hidden + key.tile - 1) / key.tile;
  const int64_t blocks = shape[0] * p.tiles_t * p.tiles_h;
  jit::launch(kernel, static_cast<unsigned>(blocks), static_cast<unsigned>(rga_block_threads(key)), &p, sizeof p,
              nullptr, false);
  check_cu(jit::require_cuda_driver().cuCtxSynchronize(), "sync");
}

// The chunked transposed kernel launched directly at shapes the op gives to other tiles (small
// calls): both tile sizes, every gate mode, T below, at and across a tile, batches whose lines
// start at every offset, residual and out off 16 bytes; against the reference, nothing written
// outside out.
TEST_F(ResidualGateAddGpu, ChunkedResidualKernelAgreesAtEveryLineOffset) {
  struct Shape {
    std::vector<int64_t> shape, gate;
    GateMode mode;
    int residual_misalign;
  };
  const std::vector<Shape> shapes = {{{2, 33, 128}, {1, 1, 128}, GateMode::row, 0},
                                     {{3, 7, 64}, {3, 7, 1}, GateMode::token, 1},
                                     {{2, 64, 72}, {2, 1, 72}, GateMode::batch, 3},
                                     {{1, 131, 136}, {1, 131, 136}, GateMode::full, 0},
                                     {{2, 515, 256}, {1, 1, 256}, GateMode::row, 7}};
  uint32_t seed = 500;
  for (DType dt : {DType::bf16, DType::f16, DType::f32})
    for (const Shape& s : shapes)
      for (int tile : {32, 64}) {
        GpuCase c{s.shape, s.gate, dt, true};
        c.residual_misalign = s.residual_misalign;
        SCOPED_TRACE(c.describe() + ", tile " + std::to_string(tile));
        const size_t es = dtype_size(dt);
        const int64_t n = product(s.shape);
        const HostInputs h = make_inputs(c, seed++);
        const std::vector<uint8_t> want = reference_of(c, h);
        const int r_mis = s.residual_misalign * static_cast<int>(es);
        const DeviceInputs in(h, r_mis, 0);
        DeviceTensor o(n * es, r_mis);
        RgaKernelKey key;
        key.dtype = dt;
        key.mode = s.mode;
        key.transposed = true;
        key.vector = false;
        key.vector_update = true;
        key.chunked_residual = true;
        key.tile = tile;
        key.pdl = false;
        const int64_t lead = 16 / static_cast<int64_t>(es) - 1;  // a line reaches this far before its tile
        launch_transposed_directly(key, s.shape, in, o, lead);
        EXPECT_EQ(compare(o, want, es), "") << key.to_string();
      }
}

// The tall transposed tile (128 tokens x 64 channels, products kept as T) launched directly at
// shapes the op gives to smaller tiles: every gate mode, T below, at and across 128 tokens, H
// across 64 channels, batches; against the reference, nothing written outside out.
TEST_F(ResidualGateAddGpu, TallTileKernelAgreesBelowAtAndAcrossItsEdges) {
  struct Shape {
    std::vector<int64_t> shape, gate;
    GateMode mode;
  };
  const std::vector<Shape> shapes = {{{1, 8, 64}, {1, 1, 64}, GateMode::row},
                                     {{2, 128, 72}, {2, 128, 1}, GateMode::token},
                                     {{3, 136, 128}, {3, 1, 128}, GateMode::batch},
                                     {{1, 264, 200}, {1, 264, 200}, GateMode::full},
                                     {{2, 384, 8}, {1, 1, 8}, GateMode::row}};
  uint32_t seed = 700;
  for (DType dt : {DType::bf16, DType::f16})
    for (const Shape& s : shapes) {
      const GpuCase c{s.shape, s.gate, dt, true};
      SCOPED_TRACE(c.describe());
      const size_t es = dtype_size(dt);
      const int64_t n = product(s.shape);
      const HostInputs h = make_inputs(c, seed++);
      const std::vector<uint8_t> want = reference_of(c, h);
      const DeviceInputs in(h, 0, 0);
      DeviceTensor o(n * es, 0);
      RgaKernelKey key;
      key.dtype = dt;
      key.mode = s.mode;
      key.transposed = true;
      key.vector = true;
      key.vector_update = true;
      key.tile = 64;
      key.token_tile = 128;
      key.pdl = false;
      ASSERT_EQ(rga_block_threads(key), 512);
      launch_transposed_directly(key, s.shape, in, o, 0);
      EXPECT_EQ(compare(o, want, es), "") << key.to_string();
    }
}

// The measured schedules reach the kernel key: small scalar calls take one element per thread
// (flat) or 16-tiles (transposed); large ones keep 8 units per thread and 32-tiles; an odd T
// keeps a 16-byte update side, and walks the residual side by aligned 16-byte chunks in 64-tiles
// where there are two 64-tiles per SM. (Run by
// the driver's cases for their results; here only the choice.)
TEST_F(ResidualGateAddGpu, SmallScalarCallsTakeTheirMeasuredSchedule) {
  const Device gpu{DeviceKind::cuda, 0};
  auto key_of = [&](const GpuCase& c) {
    const size_t es = dtype_size(c.dtype);
    const int mis = c.misalign * static_cast<int>(es);  // every tensor
    DeviceTensor r(product(c.shape) * es, mis), u(product(c.shape) * es, mis), g(product(c.gate) * es, mis),
        o(product(c.shape) * es, mis);
    const ResidualGateAddCall call = match_residual_gate_add(
        view_of(r.data(), c, c.shape, gpu, c.transposed), view_of(u.data(), c, c.shape, gpu, false),
        view_of(g.data(), c, c.gate, gpu, false), view_of(o.data(), c, c.shape, gpu, c.transposed));
    return explain_residual_gate_add(call).template_key;
  };
  const std::string odd = key_of({{2, 33, 65}, {1, 1, 65}, DType::bf16});
  EXPECT_NE(odd.find("flat,scalar,one_wave"), std::string::npos) << odd;
  const std::string big = key_of({{1, 1024, 4096}, {1, 1, 4096}, DType::bf16, false, 1});
  EXPECT_NE(big.find("flat,scalar,"), std::string::npos) << big;
  EXPECT_EQ(big.find("one_wave"), std::string::npos) << big;
  const std::string small_t = key_of({{1, 17, 65}, {1, 1, 65}, DType::bf16, true});
  EXPECT_NE(small_t.find("transposed16,scalar"), std::string::npos) << small_t;
  const std::string medium_t = key_of({{2, 513, 256}, {1, 1, 256}, DType::bf16, true});
  EXPECT_NE(medium_t.find("transposed32,update16"), std::string::npos)
      << medium_t << ": T = 513 in fewer than two 64-tiles per SM keeps a scalar residual side";
  const std::string odd_t = key_of({{1, 7801, 2240}, {1, 1, 2240}, DType::bf16, true});
  EXPECT_NE(odd_t.find("transposed64,chunk16"), std::string::npos) << odd_t;
  const std::string medium_off = key_of({{2, 513, 256}, {1, 1, 256}, DType::bf16, true, 1});
  EXPECT_NE(medium_off.find("transposed32,scalar"), std::string::npos) << medium_off;
  // Aligned 16-bit lines: 128-token tiles where there are two of them per SM, else 64-tiles;
  // fp32 keeps 64-tiles.
  const std::string sana = key_of({{1, 32760, 2240}, {1, 1, 2240}, DType::bf16, true});
  EXPECT_NE(sana.find("transposed128x64,vec16"), std::string::npos) << sana;
  const std::string sana_f32 = key_of({{1, 32760, 2240}, {1, 1, 2240}, DType::f32, true});
  EXPECT_NE(sana_f32.find("transposed64,vec16"), std::string::npos) << sana_f32;
  const std::string mid_t = key_of({{1, 4096, 512}, {1, 1, 512}, DType::f16, true});
  EXPECT_NE(mid_t.find("transposed64,vec16"), std::string::npos)
      << mid_t << ": 256 tall tiles are fewer than two per SM of an H200";
}

TEST_F(ResidualGateAddGpu, CapturedInACudaGraphReplaysOnNewInputs) {
  const auto& d = jit::require_cuda_driver();
  const GpuCase c{{1, 4608, 3072}, {1, 1, 3072}, DType::bf16};
  const size_t es = 2;
  const int64_t n = product(c.shape);
  const Device cpu{DeviceKind::cpu, 0}, gpu{DeviceKind::cuda, 0};
  DeviceTensor r(n * es, 0), u(n * es, 0), g(c.gate[2] * es, 0), o(n * es, 0);
  const TensorView rv = view_of(r.data(), c, c.shape, gpu, false), uv = view_of(u.data(), c, c.shape, gpu, false),
                   gv = view_of(g.data(), c, c.gate, gpu, false), ov = view_of(o.data(), c, c.shape, gpu, false);
  HostInputs first = make_inputs(c, 1);
  r.upload(first.residual);
  u.upload(first.update);
  g.upload(first.gate);
  CUstream stream;
  check_cu(d.cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), "stream");
  residual_gate_add(rv, uv, gv, ov, {}, stream);  // resolve (compile, load) outside the capture
  check_cu(d.cuStreamSynchronize(stream), "sync");
  // Global capture mode: any synchronizing or otherwise illegal call inside the op fails the capture.
  check_cu(d.cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_GLOBAL), "begin capture");
  std::string impl;
  try {
    impl = residual_gate_add(rv, uv, gv, ov, {}, stream);
  } catch (...) {
    CUgraph broken;
    d.cuStreamEndCapture(stream, &broken);
    throw;
  }
  CUgraph graph;
  check_cu(d.cuStreamEndCapture(stream, &graph), "end capture");
  CUgraphExec exec;
  check_cu(d.cuGraphInstantiate(&exec, graph, 0), "instantiate");
  EXPECT_NE(impl, "residual_gate_add.reference");
  for (uint32_t trial = 2; trial < 5; ++trial) {
    HostInputs h = make_inputs(c, trial);
    r.upload(h.residual);
    u.upload(h.update);
    g.upload(h.gate);
    check_cu(d.cuGraphLaunch(exec, stream), "graph launch");
    check_cu(d.cuStreamSynchronize(stream), "sync");
    std::vector<uint8_t> want(n * es);
    residual_gate_add(view_of(h.residual.data(), c, c.shape, cpu, false), view_of(h.update.data(), c, c.shape, cpu, false),
                      view_of(h.gate.data(), c, c.gate, cpu, false), view_of(want.data(), c, c.shape, cpu, false));
    EXPECT_EQ(compare(o, want, es), "") << "replay " << trial;
  }
  d.cuGraphExecDestroy(exec);
  d.cuGraphDestroy(graph);
  d.cuStreamDestroy(stream);
}

}  // namespace
}  // namespace ditops

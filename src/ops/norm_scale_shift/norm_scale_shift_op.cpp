// norm_scale_shift: argument matching (broadcast classes, layouts, aliasing), the registry entries
// (provenance, capability, contract, predicate) and the launch of the fused kernel.
#include <algorithm>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "core/enum_name.h"
#include "core/builtin_ops.h"
#include "core/implementation.h"
#include "core/matcher.h"
#include "core/op_builder.h"
#include "ditops/norm_scale_shift.h"
#include "jit/cuda_driver.h"
#include "jit/jit.h"
#include "jit/kernel_family.h"
#include "kernels/norm_scale_shift.cuh"
#include "ops/common/fp8.h"
#include "ops/norm_scale_shift/norm_scale_shift_kernels.h"

namespace ditops {

// ---------------------------------------------------------------- the kernel key and its request

const char* norm_type_name(NormType type) { return enumerator_name(type); }
const char* nss_norm_order_name(NssNormOrder order) { return enumerator_name(order); }
const char* nss_numerics_name(NssNumerics numerics) { return enumerator_name(numerics); }

const char* nss_operand_kind_name(NssOperand::Kind kind) {
  using K = NssOperand::Kind;
  static constexpr auto kNames = enum_texts<K>({{K::absent, "absent"}, {K::scalar, "scalar"},
                                                {K::channel, "per-channel [D]"}, {K::batch, "per-batch [B, D]"},
                                                {K::token, "per-token [B, S, D]"}, {K::frame, "per-frame [B, F, 1, D]"}});
  return kNames(kind);
}

namespace {
// The template key's word for the kernel's output quantization.
constexpr auto kQuantNames = enum_texts<NssKernelQuant>(
    {{NssKernelQuant::none, "noquant"}, {NssKernelQuant::fp8, "fp8"}, {NssKernelQuant::fp4_software, "fp4sw"},
     {NssKernelQuant::fp4_hardware, "fp4hw"}, {NssKernelQuant::fp8_rowwise, "fp8_rowwise"}});
}  // namespace

std::string NssKernelKey::to_string() const {
  return std::string(dtype_name(act)) + ",D=" + std::to_string(dim) + "," + norm_type_name(norm) +
         (mean_order ? ",mean," : ",") +
         nss_numerics_name(numerics) + (residual ? ",residual" : ",plain") + ",affine=" + std::to_string(affine) +
         "," + kQuantNames(quant) + (pdl ? ",pdl" : ",nopdl") + (modulate ? "" : ",nomod");
}

uint64_t NssKernelKey::packed() const {
  return pack_key({act, {dim, 16384}, norm == NormType::rms, mean_order, {numerics, 4}, residual, {affine, 3},
                   {quant, 8}, pdl, modulate});
}

namespace {

// The float32 chain (16-bit x, fp32 operands): the 16-bit rows' schedule where its fp32 operands
// fit, held in shared memory or not held where registers would not hold them. Not measured yet
// (no device run): chosen so that ptxas spills nothing for sm_90a at any width (nvcc -Xptxas -v;
// docs/tuning/norm_scale_shift.md has the register counts).
NssEagerSchedule float32_schedule(const NssKernelKey& key) {
  const int slots = (key.dim / 4 + 127) / 128;
  NssEagerSchedule s;
  if (slots <= 3) {  // Wan 1.3B (D = 1536): 64-80 registers
    s.min_blocks = key.residual && key.modulate ? 6 : 7;
  } else if (slots <= 6) {  // fp32 scale and shift take 8 registers a slot
    s.min_blocks = !key.modulate ? 7 : (key.residual ? 4 : 5) - (key.affine ? 1 : 0);
  } else if (slots <= 10) {
    // As the 16-bit rows (Wan 14B, D = 5120): plain rows hold scale and shift (2 x 20 KB fp32) in
    // shared memory and prefetch at (128,5); residual rows prefetch at (128,3) with the gate in
    // registers (168 registers), scale and shift in shared memory.
    s.prefetch = true;
    s.shared_operands = key.modulate;
    s.min_blocks = key.residual ? 3 : 5;
  } else {
    s.stream_operands = true;  // 16 slots of fp32 scale and shift would take 128 registers
  }
  return s;
}

}  // namespace

NssEagerSchedule nss_eager_schedule(const NssKernelKey& key) {
  if (key.numerics == NssNumerics::float32) return float32_schedule(key);
  // Register words of a thread's vec4 slots: D/4 vectors over 128 threads, 2 words per bf16/f16
  // vector, 4 per fp32 one (counted here in 16-bit slots).
  const int slots = (key.dim / 4 + 127) / 128 * (key.act == DType::f32 ? 2 : 1);
  // Each the fastest measured (docs/tuning/norm_scale_shift.md has every alternative):
  //   6 slots: (128,7) plain / residual (72 registers, no spill), fp8 (128,6), no prefetch; a
  //     residual row with D % 512 == 0 split over 256 threads at (256,4) ((128,7) spills there).
  //   NVFP4 (issue-bound): (128,5).
  //   10 slots: residual prefetched at (128,3); NVFP4 and plain 16-bit rows hold scale / shift /
  //     gate in shared memory at (128,5).
  //   Wider rows (fp32, D > 5120) are not measured: ptxas decides, no prefetch.
  const bool nvfp4 = key.quant == NssKernelQuant::fp4_software || key.quant == NssKernelQuant::fp4_hardware;
  const bool half = key.act != DType::f32;
  NssEagerSchedule s;
  if (key.mean_order) {
    // The squares take D * 4 bytes of shared memory: operands stay in registers, one thread per
    // aten thread; ptxas decides the rest (not measured).
    s.prefetch = slots > 6 && key.residual;
    return s;
  }
  if (slots == 6 && half && key.residual && key.quant == NssKernelQuant::none && key.dim % 512 == 0) {
    s.split = 2;
    s.min_blocks = 4;
  } else if (slots <= 6) {
    s.min_blocks = nvfp4 ? 5 : key.quant == NssKernelQuant::none ? 7 : 6;
  } else if (slots <= 10) {
    if (nvfp4 || (half && key.quant == NssKernelQuant::none && !key.residual)) {  // NVFP4: 16-bit only
      s.shared_operands = true;
      s.prefetch = !nvfp4;
      s.min_blocks = 5;
    } else {
      s.prefetch = key.residual;
      s.min_blocks = key.residual ? 3 : 6;
    }
  }
  return s;
}

KernelRequest nss_kernel_request(const NssKernelKey& key) {
  const char* norm = key.norm == NormType::layer ? "ditops::kNssLayerNorm"
                     : key.mean_order           ? "ditops::kNssRmsMean"
                                                : "ditops::kNssRms";
  KernelRequest r{.header = "norm_scale_shift.cuh",
                  .function = "ditops::norm_scale_shift_body",
                  .template_args = jit::kernel_args(key.act, key.dim, norm, key.numerics == NssNumerics::sglang,
                                                    key.residual, key.affine, static_cast<int>(key.quant), key.pdl),
                  .params_type = "ditops::NormScaleShiftParams",
                  .max_threads = kNssMaxThreads,
                  .template_key = "norm_scale_shift:" + key.to_string()};
  if (key.numerics != NssNumerics::sglang) {
    const NssEagerSchedule schedule = nss_eager_schedule(key);
    r.template_args += ", " + jit::kernel_args(schedule.prefetch, schedule.shared_operands, schedule.split);
    if (key.numerics == NssNumerics::float32)
      r.template_args += ", " + jit::kernel_args(true, key.modulate, schedule.stream_operands);
    r.min_blocks = schedule.min_blocks;
    r.max_threads = kNssMaxThreads * schedule.split;
  }
  return r;
}

namespace {

constexpr const char* kOp = "norm_scale_shift";

bool present(const TensorView& t) { return t.data != nullptr; }
std::string num(int64_t v) { return std::to_string(v); }
int64_t pad128(int64_t rows) { return (rows + 127) / 128 * 128; }

// The element count every vector access of the kernel moves (and so the alignment it needs).
int vector_elems(NssNumerics numerics) { return numerics == NssNumerics::sglang ? 8 : 4; }

void check_aligned(const Matcher& m, const std::string& name, const TensorView& t, int64_t bytes,
                   std::initializer_list<int> stride_dims, int64_t stride_multiple, const char* why) {
  if (reinterpret_cast<uintptr_t>(t.data) % bytes != 0)
    m.fail(name + ".data must be " + num(bytes) + "-byte aligned (" + why + ") but is at offset " +
           num(static_cast<int64_t>(reinterpret_cast<uintptr_t>(t.data) % bytes)));
  for (int d : stride_dims)
    if (t.shape[d] > 1 && t.strides[d] % stride_multiple != 0)
      m.fail(name + ".strides[" + num(d) + "] must be a multiple of " + num(stride_multiple) + " (" + why +
             ") but is " + num(t.strides[d]));
}

// An operand's dtype (scale, shift, gate, weight, bias): x's, or f32 with numerics=float32.
void match_operand_dtype(const Matcher& m, const std::string& name, const TensorView& t, DType act, bool float32) {
  if (float32) {
    if (t.dtype != DType::f32)
      m.fail(name + ".dtype must be f32 (numerics=float32: every operand of the chain is float32) but is " +
             dtype_name(t.dtype));
  } else if (t.dtype != act) {
    m.fail(name + ".dtype must be " + dtype_name(act) + " (as x" +
           (t.dtype == DType::f32 ? std::string("; f32 operands beside a 16-bit x: numerics=float32") : "") +
           ") but is " + dtype_name(t.dtype));
  }
}

// One broadcast operand (scale, shift, gate): its class from its shape (docs/norm_scale_shift.md §1).
NssOperand match_operand(Matcher& m, const std::string& name, const TensorView& t, int64_t B, int64_t S, int64_t D,
                         bool required, int vec, const char* role, DType act, bool float32) {
  NssOperand op;
  if (!present(t)) {
    if (required) m.fail(name + " is required (" + role + ")");
    return op;
  }
  match_operand_dtype(m, name, t, act, float32);
  m.require_nonnegative_strides(t, name);
  op.data = t.data;
  bool all_one = true;
  for (int d = 0; d < t.rank; ++d) all_one = all_one && t.shape[d] == 1;
  if (t.rank == 0 || (all_one && D != 1 && t.rank <= 4)) {
    op.kind = NssOperand::Kind::scalar;
    return op;
  }
  const int r = t.rank;
  if (r > 4)
    m.fail(name + " must have rank <= 4 ([D], [B, D], [B, S, D] or [B, F, 1, D]) but has rank " + num(r));
  if (t.shape[r - 1] != D)
    m.fail(name + ".shape[" + num(r - 1) + "] must equal D=" + num(D) + " (bound by x.shape[2]) but is " +
           num(t.shape[r - 1]));
  if (t.strides[r - 1] != 1)
    m.fail(name + ".strides[" + num(r - 1) + "] must be 1 but is " + num(t.strides[r - 1]));
  auto batch_dim = [&](int d) {
    if (t.shape[d] != B && t.shape[d] != 1)
      m.fail(name + ".shape[" + num(d) + "] must equal B=" + num(B) + " or 1 (broadcast) but is " + num(t.shape[d]));
    return t.shape[d] == B && B > 1 ? t.strides[d] : int64_t{0};
  };
  op.kind = NssOperand::Kind::channel;
  if (r == 2) {
    op.batch_stride = batch_dim(0);
    if (t.shape[0] == B && B > 1) op.kind = NssOperand::Kind::batch;
  } else if (r == 3) {
    op.batch_stride = batch_dim(0);
    if (t.shape[1] != S && t.shape[1] != 1)
      m.fail(name + ".shape[1] must equal S=" + num(S) + " (per token) or 1 (per batch) but is " + num(t.shape[1]));
    if (t.shape[1] == S && S > 1) {
      op.kind = NssOperand::Kind::token;
      op.token_stride = t.strides[1];
    } else if (t.shape[0] == B && B > 1) {
      op.kind = NssOperand::Kind::batch;
    }
  } else if (r == 4) {
    op.batch_stride = batch_dim(0);
    if (t.shape[2] != 1)
      m.fail(name + ".shape[2] must be 1 (per frame [B, F, 1, D]) but is " + num(t.shape[2]));
    const int64_t F = t.shape[1];
    if (F < 1 || S % F != 0)
      m.fail(name + ".shape[1] (frames F) must divide S=" + num(S) + " but is " + num(F));
    if (F > 1) {
      op.kind = NssOperand::Kind::frame;
      op.frame_len = S / F;
      op.frame_stride = t.strides[1];
    } else if (t.shape[0] == B && B > 1) {
      op.kind = NssOperand::Kind::batch;
    }
  }
  const int64_t esize = static_cast<int64_t>(dtype_size(t.dtype));
  if (reinterpret_cast<uintptr_t>(t.data) % (vec * esize) != 0)
    m.fail(name + ".data must be " + num(vec * esize) + "-byte aligned (" + num(vec) +
           "-element vector access) but is at offset " +
           num(static_cast<int64_t>(reinterpret_cast<uintptr_t>(t.data) % (vec * esize))));
  for (int64_t s : {op.batch_stride, op.frame_stride, op.token_stride})
    if (s % vec != 0)
      m.fail(name + " strides must be multiples of " + num(vec) + " (" + num(vec) +
             "-element vector access) but " + t.describe() + " has one that is not");
  return op;
}

struct Range {
  const char* name;
  const TensorView* t;
  uintptr_t lo, hi;
};

Range range_of(const char* name, const TensorView& t) {
  const ByteRange r = byte_range(t);
  return {name, &t, r.lo, r.hi};
}

void complete(NormScaleShiftCall& call, Matcher& m);  // the op's own rules, after the slots'

// The op described once: its slots state the checks every call gets (core/op_builder.h).
OpBuilder<NormScaleShiftCall> describe() {
  using C = NormScaleShiftCall;
  using In = NormScaleShiftInputs;
  using Out = NormScaleShiftOutputs;
  using O = NormScaleShiftOptions;
  OpBuilder<C> b(kOp, "adaLN pre-norm: [residual + x * gate ->] norm * (1 + scale) + shift [-> fp8 | nvfp4]",
                 "x [B, S, D]; scale, shift, gate: scalar, [D], [B, D], [B, 1, D], [1|B, S, D] or [B|1, F, 1, D]; "
                 "weight/bias [D]; operands of x's dtype, or f32 with numerics=float32 (Wan). "
                 "include/ditops/norm_scale_shift.h, docs/norm_scale_shift.md");
  b.dims("B=1,S=4608,D=3072");
  // The broadcast operands' classes, the dtypes numerics=float32 allows, the quantized outputs'
  // extents and in place (an output may be x or residual) are the op's own rules.
  b.tensor<&C::in, &In::x>({.dtypes = "bf16|f16|f32", .shape = "B,S,D", .layout = "*,*,1"});
  b.dim_rule("D", [](int64_t D, const C& c) {
    const DType act = c.in.x.dtype;
    const int64_t max_d = act == DType::f32 ? 4096 : 8192;
    if (D % 4 == 0 && D >= 16 && D <= max_d) return std::string();
    return "x.shape[2] (D) must be a multiple of 4 in [16, " + num(max_d) + "] for " + dtype_name(act) +
           " (aten's vectorized kernel; the row lives in registers) but is " + num(D);
  });
  b.tensor<&C::in, &In::scale>({.optional = true, .dtypes = "=x|f32", .shape = "B,D", .own = "shape,dtype"});
  b.tensor<&C::in, &In::shift>({.optional = true, .dtypes = "=x|f32", .shape = "B,D", .own = "shape,dtype"});
  b.tensor<&C::in, &In::residual>({.optional = true, .keyword = true, .dtypes = "=x", .shape = "B,S,D",
                                   .layout = "*,*,1"});
  b.tensor<&C::in, &In::gate>({.optional = true, .keyword = true, .dtypes = "=x|f32", .shape = "B,D",
                               .own = "shape,dtype"});
  b.tensor<&C::in, &In::weight>({.optional = true, .keyword = true, .dtypes = "=x|f32", .shape = "D", .layout = "1",
                                 .own = "dtype"});
  b.tensor<&C::in, &In::bias>({.optional = true, .keyword = true, .dtypes = "=x|f32", .shape = "D", .layout = "1",
                               .own = "dtype"});
  b.tensor<&C::in, &In::input_scale>({.optional = true, .keyword = true, .dtypes = "f32", .shape = "1"});
  b.tensor<&C::in, &In::global_scale>({.optional = true, .keyword = true, .dtypes = "f32", .shape = "1"});
  b.tensor<&C::out, &Out::y>({.role = TensorRole::out, .optional = true, .keyword = true, .dtypes = "=x",
                              .shape = "B,S,D", .alloc = "like:x",
                              .present = "flag:store_y;absent:input_scale,global_scale,rowwise_fp8,fp8_rowwise",
                              .layout = "*,*,1", .own = "overlap"});
  b.tensor<&C::out, &Out::residual_out>({.role = TensorRole::out, .optional = true, .keyword = true, .dtypes = "=x",
                                         .shape = "B,S,D", .alloc = "like:x", .present = "given:residual",
                                         .layout = "*,*,1", .own = "overlap"});
  b.tensor<&C::out, &Out::fp8>({.role = TensorRole::out, .optional = true, .keyword = true, .dtypes = "f8e4m3fn|u8",
                                .shape = "B,S,D", .alloc = "like:x", .alloc_dtype = "f8e4m3fn",
                                .present = "given:input_scale", .layout = "*,*,1", .own = "overlap"});
  b.tensor<&C::out, &Out::nvfp4_packed>({.role = TensorRole::out, .optional = true, .keyword = true, .dtypes = "u8",
                                         .shape = "B*S,D/2", .alloc = "rows(x),last(x)/2", .alloc_dtype = "u8",
                                         .present = "given:global_scale", .own = "shape,dtype,overlap"});
  b.tensor<&C::out, &Out::nvfp4_scales>({.role = TensorRole::out, .optional = true, .keyword = true, .dtypes = "u8",
                                         .shape = "up128(B*S),D/16", .alloc = "up128(rows(x)),last(x)/16",
                                         .alloc_dtype = "u8", .present = "given:global_scale",
                                         .doc = "E4M3 block scales in the 128x4 swizzled layout",
                                         .own = "shape,overlap"});
  b.tensor<&C::out, &Out::fp8_rowwise>({.role = TensorRole::out, .optional = true, .keyword = true,
                                        .dtypes = "f8e4m3fn", .shape = "B,S,D", .alloc = "like:x",
                                        .alloc_dtype = "f8e4m3fn", .present = "given:rowwise_fp8,fp8_scale",
                                        .doc = "y's per-token dynamic e4m3 (torchao's rowwise recipe)",
                                        .layout = "*,*,1", .own = "overlap"});
  b.tensor<&C::out, &Out::fp8_scale>({.role = TensorRole::out, .optional = true, .keyword = true, .dtypes = "f32",
                                      .shape = "B,S,1", .alloc = "dim(x,0),dim(x,1),1", .alloc_dtype = "f32",
                                      .present = "given:rowwise_fp8,fp8_rowwise",
                                      .doc = "fp8_rowwise's per-row fp32 scales", .layout = "contiguous",
                                      .own = "overlap"});
  b.binding_option({.name = "store_y", .kind = OptionKind::optional_boolean, .default_text = "none",
                    .doc = "write y (default: only when no quantized output is requested)"});
  b.binding_option({.name = "rowwise_fp8", .kind = OptionKind::boolean, .default_text = "false",
                    .doc = "produce fp8_rowwise and fp8_scale, y's per-token dynamic e4m3 (numerics eager, "
                           "float32)"});
  b.choice<&O::norm>({NormType::layer, NormType::rms}, "LayerNorm or RMSNorm");
  b.option<&O::eps>("norm epsilon");
  b.choice<&O::norm_order>(
      {NssNormOrder::aten, NssNormOrder::aten_mean},
      "RMSNorm's sum of squares: aten (F.rms_norm) or aten_mean (x.float().pow(2).mean(-1), diffusers' "
      "RMSNorm without a weight; 128 <= D < 8192)");
  b.choice<&O::numerics>(
      {NssNumerics::eager, NssNumerics::sglang, NssNumerics::float32},
      "which chain the result is bit-exact with (float32: Wan's FP32LayerNorm chain, f32 operands)");
  describe_fp8_reciprocal<&O::fp8_reciprocal>(b, "input_scale");
  b.choice<&O::e2m1>(
      {E2m1Conversion::automatic, E2m1Conversion::software, E2m1Conversion::hardware},
      "the NVFP4 E2M1 conversion");
  b.pdl_option<&O::use_pdl>();
  b.before_slots([](const C& c) {
    if (!present(c.in.x)) throw InvalidArgument(std::string(kOp) + ": x is required");
  });
  b.complete(complete);
  return b;
}

void complete(NormScaleShiftCall& call, Matcher& m) {
  const NormScaleShiftInputs& in = call.in;
  const NormScaleShiftOutputs& out = call.out;
  const NormScaleShiftOptions& options = call.options;
  m.require_nonnegative_strides(in.x, "x");
  const int64_t B = *m.value("B"), S = *m.value("S"), D = *m.value("D");
  const DType act = in.x.dtype;
  const bool sglang = options.numerics == NssNumerics::sglang;
  const bool float32 = options.numerics == NssNumerics::float32;
  const int vec = vector_elems(options.numerics);
  const int64_t esize = static_cast<int64_t>(dtype_size(act));

  // The numerics/norm combinations the kernels implement.
  if (!(options.eps >= 0.0f)) m.fail("eps must be >= 0 but is " + std::to_string(options.eps));
  if (sglang) {
    if (options.norm != NormType::layer) m.fail("numerics=sglang implements LayerNorm only (norm=rms requested)");
    if (act == DType::f32) m.fail("numerics=sglang needs a 16-bit dtype (bf16/f16) but x.dtype is f32");
    if (D % 16 != 0) m.fail("numerics=sglang needs D % 16 == 0 (16 elements per thread) but D is " + num(D));
    if (present(in.weight) || present(in.bias))
      m.fail("numerics=sglang has no affine weight/bias (SGLang's native kernel has none)");
  }
  if (options.norm_order == NssNormOrder::aten_mean) {
    if (options.norm != NormType::rms) m.fail("norm_order=aten_mean is an RMSNorm order (norm=layer requested)");
    if (options.numerics != NssNumerics::eager)
      m.fail(std::string("norm_order=aten_mean needs numerics=eager but numerics is ") + nss_numerics_name(options.numerics));
    if (present(in.weight))
      m.fail("norm_order=aten_mean takes no weight (diffusers' RMSNorm with a weight rounds twice: not implemented)");
    if (D < 128 || D >= 8192)
      m.fail("norm_order=aten_mean needs 128 <= D < 8192 (the reduction order derived for those) but D is " + num(D));
  }
  if (float32 && options.norm != NormType::layer)
    m.fail("numerics=float32 implements LayerNorm only (Wan's FP32LayerNorm chain; norm=rms requested)");

  call.batch = B;
  call.seq = S;
  call.rows = B * S;
  call.dim = static_cast<int>(D);
  check_aligned(m, "x", in.x, vec * esize, {0, 1}, vec, "vector access");

  // Gated residual.
  call.residual = present(in.residual);
  if (call.residual) {
    m.require_nonnegative_strides(in.residual, "residual");
    check_aligned(m, "residual", in.residual, vec * esize, {0, 1}, vec, "vector access");
    if (!present(out.residual_out)) m.fail("residual_out is required with residual (the gated-residual variant)");
  } else {
    if (present(in.gate)) m.fail("gate is given without residual (gate scales x in residual + x * gate)");
    if (present(out.residual_out)) m.fail("residual_out is given without residual");
  }
  call.gate = match_operand(m, "gate", in.gate, B, S, D, false, vec, "", act, float32);
  // Eager's x * gate with a 0-dim f32 gate stays in x's dtype (a 0-dim tensor promotes like a Python
  // scalar): a product rounded to 16 bits, not the float32 chain's.
  if (float32 && act != DType::f32 && present(in.gate) && in.gate.rank == 0)
    m.fail("gate must have a dim with numerics=float32 beside a 16-bit x (a 0-dim f32 gate does not promote x * "
           "gate to float32 in eager PyTorch: pass it as [1]) but is 0-dim");
  call.scale = match_operand(m, "scale", in.scale, B, S, D, sglang, vec, "numerics=sglang: y = norm(v) * (1 + scale) + shift",
                             act, float32);
  call.shift = match_operand(m, "shift", in.shift, B, S, D, false, vec, "", act, float32);
  call.modulate = !float32 || present(in.scale) || present(in.shift);

  // Affine.
  if (present(in.bias) && !present(in.weight)) m.fail("bias is given without weight (affine is weight [+ bias])");
  if (present(in.bias) && options.norm == NormType::rms) m.fail("bias is given with norm=rms (F.rms_norm has no bias)");
  for (const auto& [name, t] : {std::pair<const char*, const TensorView*>{"weight", &in.weight}, {"bias", &in.bias}}) {
    if (!present(*t)) continue;
    match_operand_dtype(m, name, *t, act, float32);
    check_aligned(m, name, *t, vec * static_cast<int64_t>(dtype_size(t->dtype)), {}, 1, "vector access");
  }
  call.affine = present(in.bias) ? 2 : present(in.weight) ? 1 : 0;

  // Outputs.
  const bool rowwise = present(out.fp8_rowwise) || present(out.fp8_scale);
  if (int{present(out.fp8)} + int{rowwise} + int{present(out.nvfp4_packed) || present(out.nvfp4_scales)} > 1)
    m.fail("request at most one quantized output (fp8, fp8_rowwise or nvfp4), not two");
  call.store_y = present(out.y);
  if (call.store_y) {
    m.require_nonnegative_strides(out.y, "y");
    check_aligned(m, "y", out.y, vec * esize, {0, 1}, vec, "vector access");
  }
  if (call.residual) {
    m.require_nonnegative_strides(out.residual_out, "residual_out");
    check_aligned(m, "residual_out", out.residual_out, vec * esize, {0, 1}, vec, "vector access");
  }
  auto require_scalar = [&](const char* name, const TensorView& t, const char* role) {
    if (!present(t)) m.fail(std::string(name) + " is required with " + role);
  };
  if (present(out.fp8)) {
    call.quant = NssQuant::fp8;
    m.require_nonnegative_strides(out.fp8, "fp8");
    check_aligned(m, "fp8", out.fp8, vec, {0, 1}, vec, "vector store of the fp8 row");
    require_scalar("input_scale", in.input_scale, "the fp8 output");
  }
  if (present(out.nvfp4_packed) || present(out.nvfp4_scales)) {
    call.quant = NssQuant::nvfp4;
    if (!present(out.nvfp4_packed) || !present(out.nvfp4_scales))
      m.fail("nvfp4 needs both nvfp4_packed and nvfp4_scales");
    if (act == DType::f32) m.fail("nvfp4 needs a 16-bit dtype (bf16/f16) but x.dtype is f32");
    if (D % 64 != 0) m.fail("nvfp4 needs D % 64 == 0 (whole 4-column groups of 16-element blocks) but D is " + num(D));
    const int64_t rows = B * S;
    m.tensor("nvfp4_packed", out.nvfp4_packed).shape({rows, D / 2}).dtype({DType::u8, DType::fp4e2m1x2}).contiguous();
    m.tensor("nvfp4_scales", out.nvfp4_scales).shape({pad128(rows), D / 16}).contiguous();
    check_aligned(m, "nvfp4_packed", out.nvfp4_packed, 8, {}, 1, "8-byte stores");
    require_scalar("global_scale", in.global_scale, "the nvfp4 output");
  }
  if (rowwise) {
    call.quant = NssQuant::fp8_rowwise;
    if (!present(out.fp8_rowwise) || !present(out.fp8_scale))
      m.fail("fp8_rowwise needs both fp8_rowwise and fp8_scale");
    if (act == DType::f32)
      m.fail("fp8_rowwise needs a 16-bit x (bf16/f16: the recipe's amax / 448 rounds to y's dtype) but x.dtype is f32");
    if (sglang) m.fail("fp8_rowwise is computed for numerics=eager and numerics=float32 (numerics=sglang requested)");
    m.require_nonnegative_strides(out.fp8_rowwise, "fp8_rowwise");
    check_aligned(m, "fp8_rowwise", out.fp8_rowwise, vec, {0, 1}, vec, "4-byte stores of the e4m3 row");
  }
  if (float32 && (call.quant == NssQuant::fp8 || call.quant == NssQuant::nvfp4))
    m.fail(std::string("numerics=float32 has no ") + (call.quant == NssQuant::fp8 ? "fp8" : "nvfp4") +
           " output (its quantized output is fp8_rowwise)");
  if (!call.store_y && call.quant == NssQuant::none)
    m.fail("y is required unless fp8, fp8_rowwise or nvfp4 is requested");
  if (present(in.input_scale) && call.quant != NssQuant::fp8)
    m.fail("input_scale is given without the fp8 output");
  if (present(in.global_scale) && call.quant != NssQuant::nvfp4) m.fail("global_scale is given without the nvfp4 output");
  if (B * S > (int64_t{1} << 40)) m.fail("too many rows: " + num(B * S));

  // Written tensors: rows disjoint, no overlap with each other, no overlap with an input unless
  // they are that input (x or residual, in place).
  std::vector<Range> outputs, inputs;
  for (const auto& [name, t] : {std::pair<const char*, const TensorView*>{"y", &out.y},
                                {"residual_out", &out.residual_out}, {"fp8", &out.fp8},
                                {"nvfp4_packed", &out.nvfp4_packed}, {"nvfp4_scales", &out.nvfp4_scales},
                                {"fp8_rowwise", &out.fp8_rowwise}, {"fp8_scale", &out.fp8_scale}}) {
    if (!present(*t)) continue;
    if (t->rank == 3 && t != &out.fp8_scale) m.require_disjoint_rows(*t, name, t->shape[2], "D");
    if (t->numel() > 0) outputs.push_back(range_of(name, *t));
  }
  for (const auto& [name, t] : {std::pair<const char*, const TensorView*>{"x", &in.x}, {"residual", &in.residual},
                                {"gate", &in.gate}, {"weight", &in.weight}, {"bias", &in.bias},
                                {"scale", &in.scale}, {"shift", &in.shift}, {"input_scale", &in.input_scale},
                                {"global_scale", &in.global_scale}}) {
    if (present(*t) && t->numel() > 0) inputs.push_back(range_of(name, *t));
  }
  auto overlap = [](const Range& a, const Range& b) { return a.lo < b.hi && b.lo < a.hi; };
  for (size_t i = 0; i < outputs.size(); ++i) {
    for (size_t j = i + 1; j < outputs.size(); ++j)
      if (overlap(outputs[i], outputs[j]))
        m.fail(std::string(outputs[i].name) + " and " + outputs[j].name + " overlap (outputs must be disjoint)");
    for (const Range& input : inputs) {
      if (!overlap(outputs[i], input)) continue;
      const bool in_place = (input.t == &in.x || input.t == &in.residual) && same_view(*outputs[i].t, *input.t);
      if (!in_place)
        m.fail(std::string(outputs[i].name) + " overlaps " + input.name +
               " (an output may only be x or residual itself, same data and strides, for in place)");
    }
  }
}

bool wants_hardware_e2m1(const NormScaleShiftCall& c, const DeviceInfo& device) {
  if (c.quant != NssQuant::nvfp4) return false;
  if (c.options.e2m1 == E2m1Conversion::software) return false;
  if (c.options.e2m1 == E2m1Conversion::hardware) return true;
  return (device.features & kFeatureFp4Convert) != 0;
}

NssKernelKey key_for(const NormScaleShiftCall& c, const DeviceInfo& device) {
  NssKernelKey key;
  key.act = c.in.x.dtype;
  key.dim = c.dim;
  key.norm = c.options.norm;
  key.mean_order = c.options.norm == NormType::rms && c.options.norm_order == NssNormOrder::aten_mean;
  // An f32 x makes the float32 chain eager's own fp32 chain: the same kernel.
  key.numerics = c.options.numerics == NssNumerics::float32 && c.in.x.dtype == DType::f32 ? NssNumerics::eager
                                                                                          : c.options.numerics;
  key.modulate = key.numerics != NssNumerics::float32 || c.modulate;
  key.residual = c.residual;
  key.affine = c.affine;
  key.quant = c.quant == NssQuant::fp8           ? NssKernelQuant::fp8
              : c.quant == NssQuant::fp8_rowwise ? NssKernelQuant::fp8_rowwise
              : c.quant == NssQuant::nvfp4       ? (wants_hardware_e2m1(c, device) ? NssKernelQuant::fp4_hardware
                                                                                   : NssKernelQuant::fp4_software)
                                                 : NssKernelQuant::none;
  key.pdl = c.options.use_pdl && (device.features & kFeaturePdl);
  return key;
}

NssOperandParams operand_params(const NssOperand& op) {
  NssOperandParams p{};
  p.data = op.data;
  p.batch_stride = op.batch_stride;
  p.frame_stride = op.frame_stride;
  p.token_stride = op.token_stride;
  p.frame_len = op.frame_len;
  p.kind = op.kind == NssOperand::Kind::absent ? 0 : op.kind == NssOperand::Kind::scalar ? 1 : 2;
  return p;
}

void launch_norm_scale_shift(const NormScaleShiftCall& c, const NssKernelKey& key, const jit::LoadedKernel& kernel) {
  const bool pdl = key.pdl;
  if (c.rows == 0) return;
  NormScaleShiftParams p{};
  p.x = c.in.x.data;
  p.residual = c.in.residual.data;
  p.weight = c.in.weight.data;
  p.bias = c.in.bias.data;
  p.input_scale = static_cast<const float*>(c.in.input_scale.data);
  p.global_scale = static_cast<const float*>(c.in.global_scale.data);
  p.y = c.out.y.data;
  p.residual_out = c.out.residual_out.data;
  const TensorView& q = c.quant == NssQuant::fp8_rowwise ? c.out.fp8_rowwise : c.out.fp8;  // one at most
  p.fp8 = static_cast<unsigned char*>(q.data);
  p.fp8_scale = static_cast<float*>(c.out.fp8_scale.data);
  p.fp4_packed = static_cast<unsigned char*>(c.out.nvfp4_packed.data);
  p.fp4_scales = static_cast<unsigned char*>(c.out.nvfp4_scales.data);
  p.scale = operand_params(c.scale);
  p.shift = operand_params(c.shift);
  p.gate = operand_params(c.gate);
  p.seq = c.seq;
  p.rows = c.rows;
  p.grid_rows = c.quant == NssQuant::nvfp4 ? pad128(c.rows) : c.rows;
  p.x_batch_stride = c.in.x.strides[0];
  p.x_token_stride = c.in.x.strides[1];
  if (c.residual) {
    p.r_batch_stride = c.in.residual.strides[0];
    p.r_token_stride = c.in.residual.strides[1];
    p.ro_batch_stride = c.out.residual_out.strides[0];
    p.ro_token_stride = c.out.residual_out.strides[1];
  }
  if (c.store_y) {
    p.y_batch_stride = c.out.y.strides[0];
    p.y_token_stride = c.out.y.strides[1];
  }
  if (c.quant == NssQuant::fp8 || c.quant == NssQuant::fp8_rowwise) {
    p.q_batch_stride = q.strides[0];
    p.q_token_stride = q.strides[1];
  }
  p.eps = c.options.eps;
  p.fp8_div_full = c.options.fp8_reciprocal == Fp8Reciprocal::div_full;
  if (c.options.numerics != NssNumerics::sglang) {
    // A CTA per row at a time (128 threads, 128 * split for a split schedule: the request's
    // bound), as many CTAs as are resident, every one looping over the same number of rows (a last
    // partial round would leave most SMs idle).
    const int64_t resident = std::max<int64_t>(1, int64_t{kernel.blocks_per_sm} * kernel.multiprocessors);
    const int64_t rows_per_cta = (p.grid_rows + resident - 1) / resident;
    const int64_t blocks = (p.grid_rows + rows_per_cta - 1) / rows_per_cta;
    jit::launch(kernel, static_cast<unsigned>(blocks), static_cast<unsigned>(kernel.max_threads), &p, sizeof p,
                static_cast<CUstream>(c.stream), pdl);
    return;
  }
  // sglang: one warp per row. Small problems take 2 rows per block so more SMs share them (512
  // rows: 256 blocks over 132 SMs); large ones 4.
  const int warps = p.grid_rows >= 4096 ? 4 : 2;
  const int64_t blocks = (p.grid_rows + warps - 1) / warps;
  jit::launch(kernel, static_cast<unsigned>(blocks), static_cast<unsigned>(32 * warps), &p, sizeof p,
              static_cast<CUstream>(c.stream), pdl);
}

// An explicit e2m1=hardware on a device without the conversion is refused, not emulated.
std::string e2m1_refusal(const NormScaleShiftCall& c) {
  const DeviceInfo& device = device_info(c.in.x.device);
  if (c.quant == NssQuant::nvfp4 && c.options.e2m1 == E2m1Conversion::hardware && !(device.features & kFeatureFp4Convert))
    return "e2m1=hardware needs cvt.rn.satfinite.e2m1x2.f32 (sm_100a / sm_103a / sm_120a); this device is sm_" +
           std::to_string(device.sm);
  return "";
}

// The compile test's keys (NVRTC for every target arch, no GPU): the float32 chain at Wan's widths
// (1.3B: 3 slots, 14B: 10 slots: shared-memory operands, prefetch) and the widest rows, with and
// without modulation, residual and affine; the mean order; tests/test_norm_scale_shift.cpp
// compiles the others.
std::vector<NssKernelKey> nss_variant_keys() {
  std::vector<NssKernelKey> keys;
  const auto key = [&](DType act, int dim, bool residual, int affine, bool modulate) {
    NssKernelKey k;
    k.act = act;
    k.dim = dim;
    k.numerics = NssNumerics::float32;
    k.residual = residual;
    k.affine = affine;
    k.modulate = modulate;
    keys.push_back(k);
  };
  for (int dim : {1536, 5120}) {
    key(DType::bf16, dim, false, 0, true);  // norm1 / norm3
    key(DType::bf16, dim, true, 2, false);  // the gated residual and norm2
  }
  key(DType::bf16, 5120, true, 0, true);   // the cross-attention residual and norm3
  key(DType::bf16, 5120, false, 2, false);  // norm2 alone
  key(DType::bf16, 8192, false, 0, true);
  key(DType::f16, 3072, true, 1, true);
  keys.back().pdl = false;
  // diffusers' RMSNorm (norm_order=aten_mean): LTX-2's video and audio widths, a residual row, fp8.
  for (int dim : {4096, 2048, 128, 8188}) {
    NssKernelKey k;
    k.dim = dim;
    k.norm = NormType::rms;
    k.mean_order = true;
    k.residual = dim == 2048;
    k.quant = dim == 128 ? NssKernelQuant::fp8 : NssKernelQuant::none;
    k.act = dim == 8188 ? DType::f16 : DType::bf16;
    keys.push_back(k);
  }
  // fp8_rowwise: Wan's float32 norm1 / norm3 (and behind the cross-attention residual) at 14B and
  // 1.3B, LTX-2's mean order (video, audio, behind a residual), the eager LayerNorm and RMSNorm rows
  // at 3072 / 5120 (staged, prefetched), f16, a partial last slot.
  const auto rowwise = [&](NssKernelKey k) {
    k.quant = NssKernelQuant::fp8_rowwise;
    keys.push_back(k);
  };
  for (int dim : {5120, 1536})
    for (bool residual : {false, true}) {
      NssKernelKey k;
      k.dim = dim;
      k.numerics = NssNumerics::float32;
      k.residual = residual;
      rowwise(k);
    }
  for (int dim : {4096, 2048}) {
    NssKernelKey k;
    k.dim = dim;
    k.norm = NormType::rms;
    k.mean_order = true;
    k.residual = dim == 2048;
    rowwise(k);
  }
  for (int dim : {3072, 5120}) {
    NssKernelKey k;
    k.dim = dim;
    k.residual = dim == 5120;
    rowwise(k);
    k.norm = NormType::rms;
    k.affine = 1;
    k.act = DType::f16;
    k.pdl = false;
    rowwise(k);
  }
  NssKernelKey tail;
  tail.dim = 2240;  // 5 slots, the last partly idle
  tail.affine = 2;
  rowwise(tail);
  return keys;
}

constexpr KernelFunctions<NormScaleShiftCall, NssKernelKey> kKernels{
    .key = key_for, .request = nss_kernel_request, .launch = launch_norm_scale_shift,
    .refusal = e2m1_refusal,
    .variant_keys = nss_variant_keys,
    .extra_signature = [](const NormScaleShiftCall& c) { return static_cast<uint64_t>(c.options.e2m1); },
    .extra_radix = 4};
using Kernels = OpKernels<describe, kKernels>;

void register_norm_scale_shift(Registry& registry) {
  // sm_90+: the fp8 conversion (cvt e4m3x2, sm_89+) and PDL; nvfp4 runs everywhere there with the
  // software E2M1 conversion and takes the hardware one where the device has it (the predicate
  // refuses an explicit e2m1=hardware elsewhere).
  struct Variant {
    NssNumerics numerics;
    const char* variant;
    Contract contract;
    bool rowwise = false;  // the fp8_rowwise output (numerics eager and float32), which no other implementation takes
  };
  const Variant variants[] = {
      {NssNumerics::eager, "jit",
       Contract::bit_exact("PyTorch 2.11 eager chain on CUDA: residual + x * gate, F.layer_norm / F.rms_norm "
                           "(aten vectorized kernel), y * (1 + scale) + shift; fp8/nvfp4 of that bf16 y "
                           "(SGLang static_quant_fp8 / TRT-LLM fp4_quantize recipe); norm_order=aten_mean: diffusers' "
                           "RMSNorm without a weight ((x * rsqrt(x.float().pow(2).mean(-1) + eps)).to(x.dtype))")
           .verified("H200 (sm_90), scripts/device_run.sh verify at cbc736f"
                     ": y, residual_out and fp8 torch.equal on 54 of 54 cases; the nvfp4 outputs were compared with "
                     "the CPU reference only (no device run of TRT-LLM's fp4_quantize); norm_order=aten_mean: y "
                     "torch.equal on 33 of 33 cases of bench/norm_scale_shift_torch.py's VERIFY_MEAN (LTX-2's shapes, "
                     "1 to 24576 rows; bench/results/h200/checks/norm_scale_shift_checks.json) and on every aten_mean "
                     "case of tests/python/test_ops_eager.py")},
      {NssNumerics::sglang, "jit_sglang",
       Contract::bit_exact("SGLang native Qwen-Image norm_scale_shift chain as docs/norm_scale_shift.md §3 states it "
                           "(checked against the CPU reference only; the chain itself is not available)")
           .unverified("SGLang's chain was never run beside it on a device; it matches the CPU reference of that "
                       "chain on the GPU test cases")},
      {NssNumerics::float32, "jit_float32",
       Contract::bit_exact("diffusers 0.42.1 Wan's eager chain on CUDA, PyTorch 2.11: v = (residual.float() + x * "
                           "gate).type_as(residual) (no gate: residual + x), (F.layer_norm(v.float(), (D,), weight, "
                           "bias, eps) * (1 + scale) + shift).type_as(x) (FP32LayerNorm: aten vectorized kernel on the "
                           "float32 row) with f32 operands, one rounding of y to x's dtype")
           .verified("H200 (sm_90): bench/norm_scale_shift_torch.py's VERIFY_FLOAT32 (every Wan site "
                     "at 14B / 1.3B / batch 2 / TI2V) at ee9c29e; every float32 case of tests/python/test_ops_eager.py "
                     "and the Wan sites of ditops.diffusers (bench/results/h200/models/wan.json) at 64c434f")},
      {NssNumerics::eager, "jit_fp8_rowwise",
       Contract::bit_exact("the eager chain of the call's numerics on CUDA (eager: norm_scale_shift.jit's; float32: "
                           "norm_scale_shift.jit_float32's; its y in x's dtype), then ditops.eager.fp8_rowwise_eager "
                           "(torchao 0.18's float8 rowwise recipe: amax / 448.0 in y's dtype, 1 for a zero scale, "
                           "(y.float() / s).clamp(-448, 448).to(torch.float8_e4m3fn))")
           .verified("H200 (sm_90), scripts/device_run.sh verify at bf0f87e: torch.equal (e4m3 bytes, scales, y and residual_out where "
                     "written) in 26 of 26 cases of bench/norm_scale_shift_torch.py's VERIFY_FP8_ROWWISE"),
       true},
  };
  for (const Variant& v : variants) {
    Implementation<NormScaleShiftCall, Kernels::Key> impl = jit_implementation<Kernels>(
        {.variant = v.variant,
         .sm_min = 90,
         .contract = v.contract,
         .description =
             std::string(v.numerics != NssNumerics::sglang ? "a persistent 128-thread CTA per row (aten's layout)"
                                                           : "one warp per row") +
             ", NVRTC-compiled per (dtype, D, norm, residual, affine, quant, pdl); " +
             (v.rowwise ? std::string("the fp8_rowwise output (numerics eager and float32): y's words held "
                                      "in registers, their amax reduced over the CTA, then quantized")
                        : std::string("numerics=") + nss_numerics_name(v.numerics))});
    impl.predicate = [numerics = v.numerics, rowwise = v.rowwise, cuda = impl.predicate](
                         const NormScaleShiftCall& c, const NssKernelKey& key) -> std::string {
      if ((c.quant == NssQuant::fp8_rowwise) != rowwise)
        return rowwise ? "the fp8_rowwise output only" : "the fp8_rowwise output is norm_scale_shift.jit_fp8_rowwise's";
      if (rowwise) return cuda(c, key);  // matching admits numerics eager and float32 only
      // numerics=float32 on an f32 x is eager's own fp32 chain: the eager implementation's kernel.
      const bool f32_chain_of_f32 = c.options.numerics == NssNumerics::float32 && c.in.x.dtype == DType::f32;
      const NssNumerics wanted = f32_chain_of_f32 ? NssNumerics::eager : c.options.numerics;
      if (c.in.x.device.kind == DeviceKind::cuda && wanted != numerics)
        return f32_chain_of_f32 ? std::string("an f32 x makes numerics=float32 eager's own fp32 chain, which "
                                              "norm_scale_shift.jit runs")
                                : std::string("handles numerics=") + nss_numerics_name(numerics) + " only";
      return cuda(c, key);
    };
    // The family's variant keys are compiled once, under the first implementation.
    if (v.numerics != NssNumerics::eager || v.rowwise) impl.variants = nullptr;
    add_implementation(registry, kOp, std::move(impl));
  }

  add_reference<Kernels>(
      registry, norm_scale_shift_reference,
      Contract::bit_exact("docs/norm_scale_shift.md operation order, all three numerics (the portable oracle; "
                          "rsqrt, rcp.approx and div.full correctly rounded)")
          .verified("on every CI run (CPU) by the op's tests; on the GPU every CUDA implementation matched it "
                    "within each case's bound (H200 (sm_90), scripts/device_run.sh ops at 8dea671)"),
      "CPU reference, multithreaded over rows; every numerics, both norms, every output");
}

}  // namespace

DITOPS_OP_ENTRIES(norm_scale_shift, Kernels, register_norm_scale_shift, NormScaleShiftInputs, NormScaleShiftOutputs);

}  // namespace ditops

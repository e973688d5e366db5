#include "vendor/cublaslt.h"

#include <dlfcn.h>

#include <map>
#include <memory>
#include <mutex>
#include <tuple>

#include "core/device.h"
#include "ditops/tensor.h"
#include "jit/cuda_driver.h"
#include "jit/first_use.h"

#define DITOPS_STR(x) #x
#define DITOPS_XSTR(x) DITOPS_STR(x)

namespace ditops::vendor {

const std::vector<std::string>& cublaslt_library_names() {
  static const std::vector<std::string> names = {"libcublasLt.so.13", "libcublasLt.so",
                                                 "/usr/local/cuda/lib64/libcublasLt.so.13"};
  return names;
}

bool load_cublaslt(const std::vector<std::string>& names, CublasLt* out, std::string* why) {
  void* lib = nullptr;
  std::string tried;
  for (const std::string& name : names) {
    lib = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (lib) {
      out->library = name;
      break;
    }
    const char* error = dlerror();
    tried += (tried.empty() ? "" : "; ") + name + " not found: " + (error ? error : "dlopen failed");
  }
  if (!lib) {
    if (why) *why = tried.empty() ? "no library name to load" : tried;
    return false;
  }
#define DITOPS_LOAD_CUBLASLT_FN(name)                                                                      \
  out->name = reinterpret_cast<decltype(out->name)>(dlsym(lib, DITOPS_XSTR(name)));                        \
  if (!out->name) {                                                                                        \
    if (why) *why = out->library + " lacks " DITOPS_XSTR(name) " (a cuBLASLt older than CUDA 13's)";       \
    return false;                                                                                          \
  }
  DITOPS_CUBLASLT_FUNCTIONS(DITOPS_LOAD_CUBLASLT_FN)
#undef DITOPS_LOAD_CUBLASLT_FN
  out->version = out->cublasLtGetVersion();
  return true;
}

const CublasLt* cublaslt(std::string* why) {
  struct Loaded {
    CublasLt api;
    bool ok = false;
    std::string why;
  };
  static const Loaded* loaded = [] {
    auto* l = new Loaded();  // never freed: the function pointers live as long as the process
    std::string reason;
    l->ok = load_cublaslt(cublaslt_library_names(), &l->api, &reason);
    if (!l->ok) l->why = "cuBLASLt unavailable: " + reason;
    return l;
  }();
  if (!loaded->ok) {
    if (why) *why = loaded->why;
    return nullptr;
  }
  return &loaded->api;
}

void check_cublaslt(cublasStatus_t status, const char* what) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  const CublasLt* lt = cublaslt();
  const char* name = lt ? lt->cublasLtGetStatusName(status) : nullptr;
  const char* text = lt ? lt->cublasLtGetStatusString(status) : nullptr;
  throw Error(std::string(what) + ": " + (name ? name : "cuBLAS status " + std::to_string(status)) +
              (text ? std::string(" (") + text + ")" : ""));
}

size_t workspace_bytes(int sm) { return (sm >= 90 ? size_t{32} : size_t{4}) << 20; }

namespace {

const CublasLt& require_cublaslt() {
  std::string why;
  const CublasLt* lt = cublaslt(&why);
  if (!lt) throw Error(why);
  return *lt;
}

// One handle per device (cuBLASLt handles are not tied to a stream), created on first use with
// the device's primary context current, and device memory per (device, stream): the workspace
// followed by the scratch. Neither is ever released: a process keeps what its streams used, as
// PyTorch keeps a workspace per (handle, stream). Sharing one workspace between two streams of a
// device would let overlapping split-K algorithms overwrite each other's partial sums.
struct StreamMemory {
  CUdeviceptr base = 0;
  size_t workspace = 0;  // bytes at base; the scratch follows
};

struct DeviceState {
  std::mutex mutex;
  std::map<int, cublasLtHandle_t> handles;
  std::map<std::pair<int, CUstream>, StreamMemory> memory;
};

DeviceState& device_state() {
  static DeviceState* s = new DeviceState();
  return *s;
}

// The first call on a device or stream may be inside a graph capture on a stream never seen before:
// what is made here is made capture-safe (jit/first_use.h), once.
cublasLtHandle_t handle_for(int device, CUstream stream) {
  const CublasLt& lt = require_cublaslt();
  DeviceState& s = device_state();
  std::lock_guard<std::mutex> lock(s.mutex);
  auto it = s.handles.find(device);
  if (it != s.handles.end()) return it->second;
  cublasLtHandle_t handle = nullptr;
  jit::first_use(stream, "cublasLtCreate", [&] { check_cublaslt(lt.cublasLtCreate(&handle), "cublasLtCreate"); });
  s.handles.emplace(device, handle);
  return handle;
}

const StreamMemory& memory_for(int device, CUstream stream) {
  DeviceState& s = device_state();
  std::lock_guard<std::mutex> lock(s.mutex);
  auto it = s.memory.find({device, stream});
  if (it != s.memory.end()) return it->second;
  const jit::CudaDriver& d = jit::require_cuda_driver();
  StreamMemory m;
  m.workspace = workspace_bytes(device_info({DeviceKind::cuda, device}).sm);
  jit::first_use(stream, "the cuBLASLt workspace of a stream", [&] {
    jit::check_cu(d.cuMemAlloc(&m.base, m.workspace + kScratchBytes), "cuMemAlloc (cuBLASLt workspace)");
  });
  return s.memory.emplace(std::make_pair(device, stream), m).first->second;
}

// The descriptors and the chosen algorithm of one problem on one device. The pointer attributes
// change per call, so a call holds the plan's lock from setting them until cublasLtMatmul has
// read them (it copies the descriptor's state when it enqueues).
struct Plan {
  std::mutex mutex;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
};

using PlanKey = std::tuple<int, int64_t, int64_t, int64_t, bool>;  // device, tokens, n, k, bias

template <typename T>
void set_desc(const CublasLt& lt, cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const T& value,
              const char* what) {
  check_cublaslt(lt.cublasLtMatmulDescSetAttribute(desc, attr, &value, sizeof value), what);
}

void set_pointers(const CublasLt& lt, Plan& plan, const Fp8MatmulArgs& a) {
  // A is the weight, B the activation (the transposed view): their scales follow.
  set_desc(lt, plan.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, a.w_scale, "A_SCALE_POINTER");
  set_desc(lt, plan.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, a.x_scale, "B_SCALE_POINTER");
  if (a.bias) set_desc(lt, plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, a.bias, "BIAS_POINTER");
}

std::unique_ptr<Plan> make_plan(const CublasLt& lt, cublasLtHandle_t handle, const Fp8MatmulArgs& a, size_t workspace);

Plan& plan_for(const CublasLt& lt, cublasLtHandle_t handle, const Fp8MatmulArgs& a, size_t workspace) {
  static std::mutex mutex;
  static auto* plans = new std::map<PlanKey, std::unique_ptr<Plan>>();
  const PlanKey key{a.device, a.tokens, a.n, a.k, a.bias != nullptr};
  std::lock_guard<std::mutex> lock(mutex);
  auto it = plans->find(key);
  if (it != plans->end()) return *it->second;
  return jit::first_use(a.stream, "the cuBLASLt plan of an FP8 matmul", [&]() -> Plan& {
    return *plans->emplace(key, make_plan(lt, handle, a, workspace)).first->second;
  });
}

std::unique_ptr<Plan> make_plan(const CublasLt& lt, cublasLtHandle_t handle, const Fp8MatmulArgs& a, size_t workspace) {

  auto plan = std::make_unique<Plan>();
  check_cublaslt(lt.cublasLtMatmulDescCreate(&plan->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
  const cublasOperation_t transa = CUBLAS_OP_T, transb = CUBLAS_OP_N;
  set_desc(lt, plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, transa, "TRANSA");
  set_desc(lt, plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, transb, "TRANSB");
  const int8_t fast_accumulation = 0;  // torch._scaled_mm's default (use_fast_accum=False)
  set_desc(lt, plan->desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, fast_accumulation, "FAST_ACCUM");
  if (a.bias) {
    const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
    const cudaDataType_t bias_type = CUDA_R_16BF;
    set_desc(lt, plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, epilogue, "EPILOGUE");
    set_desc(lt, plan->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, bias_type, "BIAS_DATA_TYPE");
  }
  set_pointers(lt, *plan, a);
  const auto n = static_cast<uint64_t>(a.n), t = static_cast<uint64_t>(a.tokens), k = static_cast<uint64_t>(a.k);
  check_cublaslt(lt.cublasLtMatrixLayoutCreate(&plan->a, CUDA_R_8F_E4M3, k, n, a.k), "MatrixLayoutCreate(A)");
  check_cublaslt(lt.cublasLtMatrixLayoutCreate(&plan->b, CUDA_R_8F_E4M3, k, t, a.k), "MatrixLayoutCreate(B)");
  check_cublaslt(lt.cublasLtMatrixLayoutCreate(&plan->c, CUDA_R_16BF, n, t, a.n), "MatrixLayoutCreate(C)");
  check_cublaslt(lt.cublasLtMatrixLayoutCreate(&plan->d, CUDA_R_16BF, n, t, a.n), "MatrixLayoutCreate(D)");

  cublasLtMatmulPreference_t preference = nullptr;
  check_cublaslt(lt.cublasLtMatmulPreferenceCreate(&preference), "cublasLtMatmulPreferenceCreate");
  const uint64_t max_workspace = workspace;
  cublasStatus_t status = lt.cublasLtMatmulPreferenceSetAttribute(
      preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &max_workspace, sizeof max_workspace);
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  if (status == CUBLAS_STATUS_SUCCESS)
    status = lt.cublasLtMatmulAlgoGetHeuristic(handle, plan->desc, plan->a, plan->b, plan->c, plan->d, preference, 1,
                                               &result, &found);
  lt.cublasLtMatmulPreferenceDestroy(preference);
  check_cublaslt(status, "cublasLtMatmulAlgoGetHeuristic");
  if (found == 0)
    throw Error("cuBLASLt has no FP8 algorithm for tokens=" + std::to_string(a.tokens) + ", n=" +
                std::to_string(a.n) + ", k=" + std::to_string(a.k) + " within a " + std::to_string(workspace >> 20) +
                " MiB workspace");
  plan->algo = result.algo;
  return plan;
}

}  // namespace

void* stream_scratch(int device, CUstream stream) {
  const StreamMemory& m = memory_for(device, stream);
  return reinterpret_cast<void*>(m.base + m.workspace);
}

void fp8_matmul(const Fp8MatmulArgs& a) {
  const CublasLt& lt = require_cublaslt();
  jit::bind_primary_context(a.device);
  const cublasLtHandle_t handle = handle_for(a.device, a.stream);
  const StreamMemory& memory = memory_for(a.device, a.stream);
  Plan& plan = plan_for(lt, handle, a, memory.workspace);
  const float one = 1.0f, zero = 0.0f;  // alpha and beta: the scales come from the pointers
  std::lock_guard<std::mutex> lock(plan.mutex);
  set_pointers(lt, plan, a);
  check_cublaslt(lt.cublasLtMatmul(handle, plan.desc, &one, a.w, plan.a, a.x, plan.b, &zero, nullptr, plan.c, a.out,
                                   plan.d, &plan.algo, reinterpret_cast<void*>(memory.base), memory.workspace,
                                   reinterpret_cast<cudaStream_t>(a.stream)),
                 "cublasLtMatmul");
}

}  // namespace ditops::vendor

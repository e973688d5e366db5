#include "jit/index_check.h"

#include <algorithm>
#include <mutex>

#include "ditops/registry.h"
#include "jit/cuda_driver.h"
#include "jit/jit.h"
#include "kernels/index_check.cuh"

namespace ditops::jit {

namespace {

constexpr int kThreads = 256;
constexpr int kMaxBlocks = 1024;  // a debugging mode: no occupancy sizing

// One 8-byte result word per device, allocated at the first checked call on it and kept.
CUdeviceptr result_word(int device_index) {
  static std::mutex mutex;
  static std::vector<CUdeviceptr> words;
  std::lock_guard<std::mutex> lock(mutex);
  if (device_index >= static_cast<int>(words.size())) words.resize(device_index + 1, 0);
  if (!words[device_index]) {
    const CudaDriver& cu = require_cuda_driver();
    check_cu(cu.cuMemAlloc(&words[device_index], sizeof(unsigned long long)), "DITOPS_CHECK: cuMemAlloc");
  }
  return words[device_index];
}

}  // namespace

bool checked_mode() { return config().checked; }

KernelRequest index_check_request(DType index_dtype) {
  KernelRequest r;
  r.header = "index_check.cuh";
  r.function = "ditops::index_check_body";
  r.template_args = kernel_type_name(index_dtype);
  r.params_type = "ditops::IndexCheckParams";
  r.max_threads = kThreads;
  r.template_key = std::string("index_check:") + dtype_name(index_dtype);
  return r;
}

std::vector<KernelRequest> index_check_requests() {
  return {index_check_request(DType::i32), index_check_request(DType::i64)};
}

void check_indices_on_device(const std::string& op, const std::string& name, const TensorView& indices,
                             int64_t limit, const std::string& limit_what, Stream stream) {
  if (indices.rank != 1 || (indices.dtype != DType::i32 && indices.dtype != DType::i64) ||
      indices.device.kind != DeviceKind::cuda)
    throw Error(op + ": DITOPS_CHECK: " + name + " must be a rank-1 i32 or i64 CUDA tensor (" +
                indices.describe() + ")");
  if (indices.shape[0] == 0) return;
  const CudaDriver& cu = require_cuda_driver();
  const CUstream s = static_cast<CUstream>(stream);
  CUstreamCaptureStatus capturing = CU_STREAM_CAPTURE_STATUS_NONE;
  check_cu(cu.cuStreamIsCapturing(s, &capturing), "DITOPS_CHECK: cuStreamIsCapturing");
  if (capturing != CU_STREAM_CAPTURE_STATUS_NONE)
    throw Error(op + ": DITOPS_CHECK=1 reads " + name + " back with a stream synchronization, which CUDA-graph "
                "capture forbids: capture with DITOPS_CHECK unset (or 0)");
  const int device = indices.device.index;
  bind_primary_context(device);
  const CUdeviceptr word = result_word(device);
  static KernelMemo memo;
  const LoadedKernel& kernel =
      memo.get(static_cast<uint64_t>(indices.dtype) * 64 + static_cast<uint64_t>(device),
               [&]() -> const LoadedKernel& { return jit_kernel(index_check_request(indices.dtype), device); });
  check_cu(cu.cuMemsetD8Async(word, 0xff, sizeof(unsigned long long), s), "DITOPS_CHECK: cuMemsetD8Async");
  IndexCheckParams p{};
  p.indices = indices.data;
  p.count = indices.shape[0];
  p.stride = indices.strides[0];
  p.limit = limit;
  p.first_bad = reinterpret_cast<unsigned long long*>(word);
  const int64_t blocks = std::min<int64_t>(kMaxBlocks, (p.count + kThreads - 1) / kThreads);
  launch(kernel, static_cast<unsigned>(blocks), kThreads, &p, sizeof p, s, false);
  check_cu(cu.cuStreamSynchronize(s), "DITOPS_CHECK: cuStreamSynchronize");
  unsigned long long first_bad = 0;
  check_cu(cu.cuMemcpyDtoH(&first_bad, word, sizeof first_bad), "DITOPS_CHECK: cuMemcpyDtoH");
  if (first_bad == ~0ull) return;
  const int64_t es = static_cast<int64_t>(dtype_size(indices.dtype));
  int64_t value = 0;
  const CUdeviceptr at = reinterpret_cast<CUdeviceptr>(indices.data) +
                         static_cast<CUdeviceptr>(static_cast<int64_t>(first_bad) * indices.strides[0] * es);
  if (indices.dtype == DType::i32) {
    int32_t v = 0;
    check_cu(cu.cuMemcpyDtoH(&v, at, sizeof v), "DITOPS_CHECK: cuMemcpyDtoH");
    value = v;
  } else {
    check_cu(cu.cuMemcpyDtoH(&value, at, sizeof value), "DITOPS_CHECK: cuMemcpyDtoH");
  }
  throw InvalidArgument(op + ": " + name + "[" + std::to_string(first_bad) + "] = " + std::to_string(value) +
                        " is outside [0, " + std::to_string(limit) + ") (" + limit_what +
                        "); found by DITOPS_CHECK=1");
}

}  // namespace ditops::jit

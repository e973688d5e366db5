// First-use work under CUDA-graph capture. The first call of a kernel or of the cuBLASLt path does
// work no later call repeats: an NVRTC compile, a module load, a workspace allocation, a library
// plan. None of it is enqueued on a stream, but the driver counts module loads and allocations as
// "potentially unsafe" while any capture in global mode is open (torch.cuda.graph's default), and
// such a call fails and invalidates the caller's capture. So first-use work runs with this
// thread's capture mode relaxed, as PyTorch's allocator makes its own allocations during capture:
// the graph never sees them and replays do not repeat them. If the work fails while the caller's
// stream is capturing, the error (an InvalidArgument: not the implementation's fault, no fallback)
// says to make one call outside the capture first; nothing was enqueued and the capture stays valid.
#pragma once

#include <cuda.h>

#include <exception>
#include <string>
#include <utility>

#include "ditops/tensor.h"

namespace ditops::jit {

// This thread's stream-capture mode set to relaxed for the scope's life (a no-op without a driver).
class RelaxedCaptureMode {
 public:
  RelaxedCaptureMode();
  ~RelaxedCaptureMode();
  RelaxedCaptureMode(const RelaxedCaptureMode&) = delete;
  RelaxedCaptureMode& operator=(const RelaxedCaptureMode&) = delete;

 private:
  CUstreamCaptureMode saved_ = CU_STREAM_CAPTURE_MODE_RELAXED;
  bool exchanged_ = false;
};

// True while `stream` is capturing a graph (false without a driver or on a query error).
bool stream_capturing(CUstream stream);

// The message of a first use that failed during a capture on `stream`.
std::string capture_first_use_message(const std::string& what, const std::string& error);

// Runs `work` (the first use of `what` for a call on `stream`) in relaxed capture mode; see above.
template <typename Work>
decltype(auto) first_use(CUstream stream, const std::string& what, Work&& work) {
  RelaxedCaptureMode relaxed;
  try {
    return std::forward<Work>(work)();
  } catch (const InvalidArgument&) {
    throw;
  } catch (const std::exception& e) {
    if (stream_capturing(stream)) throw InvalidArgument(capture_first_use_message(what, e.what()));
    throw;
  }
}

}  // namespace ditops::jit

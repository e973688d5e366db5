#include "jit/first_use.h"

#include "jit/cuda_driver.h"

namespace ditops::jit {

RelaxedCaptureMode::RelaxedCaptureMode() {
  const CudaDriver* d = cuda_driver();
  if (d && d->cuThreadExchangeStreamCaptureMode(&saved_) == CUDA_SUCCESS) exchanged_ = true;
}

RelaxedCaptureMode::~RelaxedCaptureMode() {
  if (!exchanged_) return;
  if (const CudaDriver* d = cuda_driver()) d->cuThreadExchangeStreamCaptureMode(&saved_);
}

bool stream_capturing(CUstream stream) {
  const CudaDriver* d = cuda_driver();
  if (!d) return false;
  RelaxedCaptureMode relaxed;  // the query itself must not count against a global-mode capture
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  if (d->cuStreamIsCapturing(stream, &status) != CUDA_SUCCESS) return false;
  return status != CU_STREAM_CAPTURE_STATUS_NONE;
}

std::string capture_first_use_message(const std::string& what, const std::string& error) {
  return what + " failed inside a CUDA graph capture (" + error +
         "); nothing was enqueued and the capture is still valid: make one call with these arguments outside "
         "the capture first";
}

}  // namespace ditops::jit

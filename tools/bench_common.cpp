#include "tools/bench_common.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <memory>

#include "jit/jit.h"
#include "kernels/read_bandwidth.cuh"
#include "tools/read_bandwidth.h"

namespace ditops::cli {

using jit::check_cu;

DeviceBuffer::DeviceBuffer(size_t n) : bytes(n) {
  if (n) check_cu(jit::require_cuda_driver().cuMemAlloc(&ptr, n), "cuMemAlloc");
}
DeviceBuffer::~DeviceBuffer() {
  if (ptr) jit::require_cuda_driver().cuMemFree(ptr);
}
void DeviceBuffer::upload(const void* host) {
  check_cu(jit::require_cuda_driver().cuMemcpyHtoD(ptr, host, bytes), "cuMemcpyHtoD");
}
void DeviceBuffer::download(void* host) const {
  check_cu(jit::require_cuda_driver().cuMemcpyDtoH(host, ptr, bytes), "cuMemcpyDtoH");
}

double median_us(const std::function<void()>& fn, int reps, DeviceBuffer& flush) {
  const auto& d = jit::require_cuda_driver();
  CUevent start, stop;
  check_cu(d.cuEventCreate(&start, CU_EVENT_DEFAULT), "cuEventCreate");
  check_cu(d.cuEventCreate(&stop, CU_EVENT_DEFAULT), "cuEventCreate");
  for (int i = 0; i < 3; ++i) fn();
  std::vector<double> times;
  for (int i = 0; i < reps; ++i) {
    check_cu(d.cuMemsetD8Async(flush.ptr, static_cast<unsigned char>(i), flush.bytes, nullptr), "flush");
    check_cu(d.cuEventRecord(start, nullptr), "cuEventRecord");
    fn();
    check_cu(d.cuEventRecord(stop, nullptr), "cuEventRecord");
    check_cu(d.cuEventSynchronize(stop), "cuEventSynchronize");
    float ms = 0;
    check_cu(d.cuEventElapsedTime(&ms, start, stop), "cuEventElapsedTime");
    times.push_back(ms * 1000.0);
  }
  d.cuEventDestroy(start);
  d.cuEventDestroy(stop);
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

int bench_reps(const Args& args, const std::string& op) {
  return static_cast<int>(int_flag(args, "bench " + op, "--reps", 50, 1, 100000, "repetitions per case"));
}

bool BenchRun::gpu_available(const char* op) {
  std::string why;
  if (jit::cuda_driver(&why)) return true;
  std::fprintf(stderr, "ditops bench %s: %s; the benchmark needs a CUDA GPU (nothing measured, exit code %d)\n", op,
               why.c_str(), kExitNoGpu);
  return false;
}

BenchRun::BenchRun(const char* op, const Args& args, const char* roof_column)
    : op_(op),
      json_path_(args.get("--json", "")),
      commit_(args.get("--commit", "unknown")),
      date_(today()),
      reps_(bench_reps(args, op)),
      flush_((jit::bind_primary_context(0), size_t{256} << 20)) {  // 256 MiB > the H200's 60 MB L2
  device_name_ = device_info(Device{DeviceKind::cuda, 0}).name;
  std::printf("%-40s %-24s %10s %10s %8s\n", "case", "impl", "us", "GB/s", roof_column);
}

double BenchRun::rotated_us(int sets, const std::function<void(int, Stream)>& fn) {
  const auto& d = jit::require_cuda_driver();
  CUstream stream;
  check_cu(d.cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
  for (int i = 0; i < sets; ++i) fn(i, stream);  // first use (JIT, module load) outside the capture
  check_cu(d.cuStreamSynchronize(stream), "cuStreamSynchronize");
  CUgraph graph;
  CUgraphExec exec;
  check_cu(d.cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_GLOBAL), "cuStreamBeginCapture");
  for (int i = 0; i < sets; ++i) fn(i, stream);
  check_cu(d.cuStreamEndCapture(stream, &graph), "cuStreamEndCapture");
  check_cu(d.cuGraphInstantiate(&exec, graph, 0), "cuGraphInstantiate");
  CUevent start, stop;
  check_cu(d.cuEventCreate(&start, CU_EVENT_DEFAULT), "cuEventCreate");
  check_cu(d.cuEventCreate(&stop, CU_EVENT_DEFAULT), "cuEventCreate");
  check_cu(d.cuGraphLaunch(exec, stream), "cuGraphLaunch");  // warm-up replay
  std::vector<double> times;
  const int rounds = std::max(5, reps_ / 4);
  for (int r = 0; r < rounds; ++r) {
    check_cu(d.cuEventRecord(start, stream), "cuEventRecord");
    check_cu(d.cuGraphLaunch(exec, stream), "cuGraphLaunch");
    check_cu(d.cuEventRecord(stop, stream), "cuEventRecord");
    check_cu(d.cuEventSynchronize(stop), "cuEventSynchronize");
    float ms = 0;
    check_cu(d.cuEventElapsedTime(&ms, start, stop), "cuEventElapsedTime");
    times.push_back(ms * 1000.0 / sets);
  }
  d.cuEventDestroy(start);
  d.cuEventDestroy(stop);
  d.cuGraphExecDestroy(exec);
  d.cuGraphDestroy(graph);
  d.cuStreamDestroy(stream);
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

int BenchRun::rotation_sets(int64_t bytes) {
  const int64_t round = int64_t{128} << 20;
  return static_cast<int>(std::max<int64_t>(2, (round + bytes - 1) / std::max<int64_t>(bytes, 1)));
}

double BenchRun::copy_rotated_us(int64_t bytes) {
  const int sets = rotation_sets(bytes);
  std::vector<std::unique_ptr<DeviceBuffer>> src, dst;
  for (int i = 0; i < sets; ++i) {
    src.push_back(std::make_unique<DeviceBuffer>(bytes / 2));
    dst.push_back(std::make_unique<DeviceBuffer>(bytes / 2));
  }
  const auto& d = jit::require_cuda_driver();
  return rotated_us(sets, [&](int i, Stream stream) {
    check_cu(d.cuMemcpyDtoDAsync(dst[i]->ptr, src[i]->ptr, bytes / 2, static_cast<CUstream>(stream)), "copy");
  });
}

double BenchRun::read_bandwidth_gbs() {
  if (read_gbs_ > 0) return read_gbs_;
  const size_t bytes = size_t{1} << 30;  // far past any L2: every word from DRAM
  DeviceBuffer data(bytes), sink(sizeof(unsigned long long));
  const auto& d = jit::require_cuda_driver();
  check_cu(d.cuMemsetD8(data.ptr, 1, bytes), "cuMemsetD8");
  check_cu(d.cuMemsetD8(sink.ptr, 0, sink.bytes), "cuMemsetD8");
  const jit::LoadedKernel& kernel = jit::jit_kernel(read_bandwidth_request(), 0);
  ReadBandwidthParams p{};
  p.data = data.get();
  p.words = static_cast<long long>(bytes / 16);
  p.sink = reinterpret_cast<unsigned long long*>(sink.ptr);
  const unsigned grid = static_cast<unsigned>(kernel.multiprocessors * std::max(1, kernel.blocks_per_sm));
  const double us = time_us([&] { jit::launch(kernel, grid, kReadBandwidthThreads, &p, sizeof p, nullptr, false); });
  read_gbs_ = static_cast<double>(bytes) / (us * 1e-6) / 1e9;
  std::printf("read bandwidth: %.0f GB/s (%zu MiB read by kernels/read_bandwidth.cuh in %.1f us, median of %d)\n",
              read_gbs_, bytes >> 20, us, reps_);
  return read_gbs_;
}

double BenchRun::copy_us(int64_t bytes) {
  DeviceBuffer src(bytes / 2), dst(bytes / 2);
  const auto& d = jit::require_cuda_driver();
  return time_us([&] { check_cu(d.cuMemcpyDtoDAsync(dst.ptr, src.ptr, bytes / 2, nullptr), "copy"); });
}

std::string shape_string(const std::vector<int64_t>& dims) {
  std::string s = "(";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? "," : "") + std::to_string(dims[i]);
  return s + ")";
}

void BenchRun::record(const std::string& case_name, const std::string& shape, const std::string& impl,
                      const char* method, double us, int64_t bytes, double copy_us, double read_roof_us) {
  const double gbs = bytes / (us * 1e-6) / 1e9;
  const double roof_us = read_roof_us > 0 ? read_roof_us : copy_us;
  std::printf("%-40s %-24s %10.2f %10.1f %7.1f%%%s\n", case_name.c_str(), impl.c_str(), us, gbs,
              roof_us > 0 ? 100.0 * roof_us / us : 0.0, std::string(method) == kColdL2 ? "" : "  (rotated)");
  char fraction[32] = "null", read_fraction[32] = "null";
  if (copy_us > 0) std::snprintf(fraction, sizeof fraction, "%.4f", copy_us / us);
  if (read_roof_us > 0) std::snprintf(read_fraction, sizeof read_fraction, "%.4f", read_roof_us / us);
  char buf[2048];
  std::snprintf(buf, sizeof buf,
                "{\"op\": \"%s\", \"case\": \"%s\", \"shape\": \"%s\", \"impl\": \"%s\", \"method\": \"%s\", "
                "\"us\": %.3f, \"bytes\": %lld, \"gb_per_s\": %.1f, \"copy_fraction\": %s, \"read_roof_fraction\": %s, "
                "\"device\": \"%s\", \"date\": \"%s\", \"commit\": \"%s\"}",
                op_.c_str(), case_name.c_str(), shape.c_str(), impl.c_str(), method, us,
                static_cast<long long>(bytes), gbs, fraction, read_fraction, device_name_.c_str(), date_.c_str(),
                commit_.c_str());
  records_.push_back(buf);
}

void BenchRun::record_time(const std::string& case_name, const std::string& shape, const std::string& impl,
                           double us) {
  std::printf("%-40s %-24s %10.2f\n", case_name.c_str(), impl.c_str(), us);
  char buf[2048];
  std::snprintf(buf, sizeof buf,
                "{\"op\": \"%s\", \"case\": \"%s\", \"shape\": \"%s\", \"impl\": \"%s\", \"method\": \"%s\", "
                "\"us\": %.3f, \"bytes\": null, \"gb_per_s\": null, \"copy_fraction\": null, \"read_roof_fraction\": null, "
                "\"device\": \"%s\", "
                "\"date\": \"%s\", \"commit\": \"%s\"}",
                op_.c_str(), case_name.c_str(), shape.c_str(), impl.c_str(), kHostTime, us, device_name_.c_str(),
                date_.c_str(), commit_.c_str());
  records_.push_back(buf);
}

void BenchRun::write_json() const {
  if (json_path_.empty()) return;
  std::ofstream out(json_path_);
  out << "[\n";
  for (size_t i = 0; i < records_.size(); ++i) out << "  " << records_[i] << (i + 1 < records_.size() ? ",\n" : "\n");
  out << "]\n";
  std::printf("wrote %s\n", json_path_.c_str());
}

namespace {
std::vector<std::pair<std::string, BenchFunction>>& mutable_bench_commands() {
  static std::vector<std::pair<std::string, BenchFunction>> commands;
  return commands;
}
}  // namespace

BenchRegistration::BenchRegistration(const char* op, BenchFunction fn) {
  mutable_bench_commands().emplace_back(op, fn);
}
const std::vector<std::pair<std::string, BenchFunction>>& bench_commands() { return mutable_bench_commands(); }

}  // namespace ditops::cli

// Shared plumbing of the `ditops bench <op>` commands: device buffers, cold-L2 timing with CUDA
// events, the same-size device copy as the ceiling (for a GEMM or GEMV the read roof: the bytes it
// must read at the read bandwidth measured in the same run), and the JSON records of bench/results/
// (op, case, shape, impl, method, us, bytes, gb_per_s, copy_fraction, read_roof_fraction, device,
// date, commit; the format is described in bench/results/README.md and read by bench/records.py).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "ditops/op.h"
#include "ditops/tensor.h"
#include "jit/cuda_driver.h"
#include "tools/cli_common.h"

namespace ditops::cli {

struct DeviceBuffer {
  CUdeviceptr ptr = 0;
  size_t bytes = 0;
  explicit DeviceBuffer(size_t n);
  ~DeviceBuffer();
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* get() const { return reinterpret_cast<void*>(ptr); }
  void upload(const void* host);
  void download(void* host) const;
};

// Median time in microseconds of `fn` on the default stream; the L2 is flushed (a 256 MiB memset)
// before each repetition, and 3 warm-up calls run first (module load, JIT, first touch).
double median_us(const std::function<void()>& fn, int reps, DeviceBuffer& flush);

// Timing methods of a record (bench/results/README.md): each call after a 256 MiB memset of the L2
// (median_us); buffer sets over 2x the L2 replayed back to back from one CUDA graph (rotated_us);
// host wall clock per call (record_time).
inline constexpr const char* kColdL2 = "cold_l2";
inline constexpr const char* kRotatedGraph = "rotated_graph";
inline constexpr const char* kHostTime = "host";

// "(1,4608,3072)": the shape field of a record.
std::string shape_string(const std::vector<int64_t>& dims);

// --reps: an integer in [1, 100000], default 50; throws Error naming the flag and the value.
int bench_reps(const Args& args, const std::string& op);

// One benchmark run: parses --reps/--json/--commit, holds the flush buffer, prints one table
// row per record and writes the JSON list at the end.
class BenchRun {
 public:
  // Returns false (after printing why on stderr) when no CUDA GPU is usable: the caller returns
  // kExitNoGpu.
  static bool gpu_available(const char* op);
  // roof_column: the header of the printed fraction ("copy%", or "read%" for a GEMM/GEMV).
  BenchRun(const char* op, const Args& args, const char* roof_column = "copy%");
  int reps() const { return reps_; }
  const std::string& device_name() const { return device_name_; }
  // Median time of a device-to-device copy of bytes/2 (the ceiling for a kernel that reads
  // bytes/2 and writes bytes/2).
  double copy_us(int64_t bytes);
  double time_us(const std::function<void()>& fn) { return median_us(fn, reps_, flush_); }
  // The other cold-L2 method, for calls too short for the memset flush (whose write-back of
  // 256 MiB of dirty lines overlaps a short kernel): `sets` independent buffer sets, together
  // more than 2x the L2. fn(set, stream) is captured once per set into one CUDA graph on a
  // stream of its own, so replays time the GPU alone (a back-to-back host loop would time the
  // facade's host cost per call instead); the result is the median over replays of the time per call.
  // No set is touched again until the others have passed through the L2.
  double rotated_us(int sets, const std::function<void(int, Stream)>& fn);
  // Sets needed so that one round moves >= 128 MiB when one set moves `bytes`.
  static int rotation_sets(int64_t bytes);
  // A device copy of bytes/2 timed the same way.
  double copy_rotated_us(int64_t bytes);
  // The device's read bandwidth in GB/s: a 1 GiB buffer read by kernels/read_bandwidth.cuh
  // (median of the run's reps), measured once per run and printed.
  double read_bandwidth_gbs();
  // Prints and stores one record; `method` is kColdL2 or kRotatedGraph; copy_us <= 0 leaves
  // copy_fraction null, read_roof_us <= 0 read_roof_fraction (the read roof's time over this
  // record's).
  void record(const std::string& case_name, const std::string& shape, const std::string& impl, const char* method,
              double us, int64_t bytes, double copy_us, double read_roof_us = 0);
  // A record with only a time (host overheads, compile times): method "host".
  void record_time(const std::string& case_name, const std::string& shape, const std::string& impl, double us);
  void write_json() const;  // to --json PATH when given

 private:
  std::string op_, json_path_, commit_, date_, device_name_;
  int reps_ = 50;
  double read_gbs_ = 0;
  DeviceBuffer flush_;
  std::vector<std::string> records_;
};

// `ditops bench <op>` commands register themselves from their own file:
//   static const BenchRegistration kRegistered("residual_gate_add", run_bench_residual_gate_add);
using BenchFunction = int (*)(const Args&);
struct BenchRegistration {
  BenchRegistration(const char* op, BenchFunction fn);
};
const std::vector<std::pair<std::string, BenchFunction>>& bench_commands();

// Any other described op: one call from the op table timed for every CUDA implementation
// (tools/bench_table.cpp).
int run_table_bench(const OpDescription& op, const Args& args);

}  // namespace ditops::cli

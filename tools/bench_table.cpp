// `ditops bench <op>` for an op without a benchmark of its own: one call built from the op table
// (tools/table_call.h: the example dims, or --shape/--dims/--dtype/--<option>), its tensors zero-
// filled on cuda:0, every CUDA implementation timed cold L2 and as rotated graph replays beside a
// device copy of the same bytes; a GEMM or GEMV (OpDescription::gemm) beside its read roof instead:
// the bytes of its inputs at the read bandwidth measured in the same run (a copy would move the
// weight twice). Byte model: inputs read once, outputs written once, in-place tensors both. Zero
// data: no implementation here branches on values, and an index tensor stays in range.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "ditops/registry.h"
#include "jit/cuda_driver.h"
#include "tools/bench_common.h"
#include "tools/table_call.h"

namespace ditops::cli {

int run_table_bench(const OpDescription& d, const Args& a) {
  // The sizing flags are checked first, on any machine (no memory is touched).
  table_call(d, a, Device{DeviceKind::cuda, 0}, [](size_t, int64_t) { return reinterpret_cast<void*>(uintptr_t{1} << 40); });
  if (!BenchRun::gpu_available(d.name.c_str())) return kExitNoGpu;
  BenchRun run(d.name.c_str(), a, d.gemm ? "read%" : "copy%");
  const auto& driver = jit::require_cuda_driver();
  const Device cuda{DeviceKind::cuda, 0};

  // One set of buffers per rotation slot; set 0 also serves the cold-L2 timing.
  std::vector<std::vector<std::unique_ptr<DeviceBuffer>>> sets(1);
  auto place_in = [&](size_t set) {
    return [&, set](size_t, int64_t bytes) -> void* {
      sets[set].push_back(std::make_unique<DeviceBuffer>(static_cast<size_t>(bytes) + 256));
      jit::check_cu(driver.cuMemsetD8(sets[set].back()->ptr, 0, sets[set].back()->bytes), "cuMemsetD8");
      return sets[set].back()->get();
    };
  };
  const TableCall first = table_call(d, a, cuda, place_in(0));
  int64_t bytes = 0, read_bytes = 0;
  for (size_t i = 0; i < d.tensors.size(); ++i) {
    bytes += first.bytes[i] * (d.tensors[i].role == TensorRole::inout ? 2 : 1);
    if (d.tensors[i].role != TensorRole::out) read_bytes += first.bytes[i];
  }
  std::vector<int64_t> dims;
  std::string case_name = "table";
  for (const auto& [name, value] : first.dims) {
    dims.push_back(value);
    case_name += " " + name + "=" + std::to_string(value);
  }
  const int rotation = BenchRun::rotation_sets(bytes);
  std::vector<GenericCall> calls = {first.call};
  for (int s = 1; s < rotation; ++s) {
    sets.emplace_back();
    calls.push_back(table_call(d, a, cuda, place_in(static_cast<size_t>(s))).call);
  }
  double copy_cold = 0, copy_rotated = 0, roof = 0;
  if (d.gemm) {  // one roof for both methods: a bandwidth, not a timed call
    roof = static_cast<double>(read_bytes) / (run.read_bandwidth_gbs() * 1e3);
    run.record(case_name, shape_string(dims), "read_roof", kColdL2, roof, read_bytes, 0, roof);
    run.record(case_name, shape_string(dims), "read_roof", kRotatedGraph, roof, read_bytes, 0, roof);
  } else {
    copy_cold = run.copy_us(bytes);
    copy_rotated = run.copy_rotated_us(bytes);
    run.record(case_name, shape_string(dims), "device_copy", kColdL2, copy_cold, bytes, copy_cold);
    run.record(case_name, shape_string(dims), "device_copy", kRotatedGraph, copy_rotated, bytes, copy_rotated);
  }

  int timed = 0;
  for (const KernelSpec* spec : Registry::global().list(d.name)) {
    bool on_cuda = false;
    for (const Capability& cap : spec->capabilities) on_cuda = on_cuda || cap.kind == DeviceKind::cuda;
    if (!on_cuda) continue;
    for (GenericCall& c : calls) {
      c.dispatch.backend = spec->provenance;
      c.dispatch.quality = Quality::high;
    }
    const DispatchReport report = d.explain(calls[0]);
    if (report.chosen != spec) {
      std::string why = "another implementation of its provenance takes this call";
      for (const auto& cand : report.candidates)
        if (cand.name == spec->name && !cand.eligible) why = cand.reason;
      std::printf("%-40s %-24s not timed: %s\n", case_name.c_str(), spec->name.c_str(), why.c_str());
      continue;
    }
    const double cold = run.time_us([&] { d.run(calls[0], nullptr); });
    run.record(case_name, shape_string(dims), spec->name, kColdL2, cold, bytes, copy_cold, roof);
    const double rotated = run.rotated_us(rotation, [&](int s, Stream stream) { d.run(calls[s], stream); });
    run.record(case_name, shape_string(dims), spec->name, kRotatedGraph, rotated, bytes, copy_rotated, roof);
    ++timed;
  }
  if (!timed) std::printf("no CUDA implementation of %s takes this call on this device\n", d.name.c_str());
  run.write_json();
  return 0;
}

}  // namespace ditops::cli

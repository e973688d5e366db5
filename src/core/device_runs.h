// The device runs that verified the ops' contracts, named once (bench/results/README.md has what
// each run printed). A contract cites one in Contract::verified; a contract no run checked says
// Contract::unverified and why.
#pragma once

namespace ditops::device_runs {

// scripts/device_run.sh verify: torch.equal of every CUDA implementation's default mode against
// its eager chain over each bench/<op>_torch.py verify grid.
inline constexpr const char* kVerifyCbc736f = "H200 (sm_90), scripts/device_run.sh verify, 2026-12-01 at cbc736f";
// scripts/device_run.sh ops: the op test driver's cases on the GPU (every CUDA implementation
// against the CPU reference within the case's bound) and the new ops' torch.equal checks.
inline constexpr const char* kOps8dea671 = "H200 (sm_90), scripts/device_run.sh ops, 2026-12-01 at 8dea671";

// The H200 report of main at 563ceb6 (the project's device report of that round): the whole verify run, the op test
// driver and bench/<op>_torch.py's checks.
inline constexpr const char* kReport563ceb6 = "H200 (sm_90), the device report of main at 563ceb6, 2026-12-02";

}  // namespace ditops::device_runs

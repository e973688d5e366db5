// Host stand-in for kernels/common/types.cuh: the integer names the kernel uses.
#pragma once
namespace ditops::kernel {
using i32 = int;
using i64 = long long;
using u32 = unsigned int;
using u64 = unsigned long long;
}  // namespace ditops::kernel

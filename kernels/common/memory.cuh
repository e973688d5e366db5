// Loads and stores of N consecutive elements: one vector access of N*sizeof(T) bytes (<= 16)
// when the caller has proven the alignment, element by element otherwise. Written in PTX so the
// access width does not depend on what the compiler infers from types.
#pragma once

#include "common/types.cuh"

namespace ditops::kernel {

template <int Bytes>
struct alignas(Bytes) Word {
  u32 w[Bytes / 4];
};

// kReadOnly: the data is never written during the kernel (weights, caches), so the
// non-coherent read-only path may serve it.
template <int Bytes, bool kReadOnly>
__device__ __forceinline__ Word<Bytes> load_word(const void* p) {
  Word<Bytes> out;
  if constexpr (Bytes == 16) {
    if constexpr (kReadOnly)
      asm volatile("ld.global.nc.v4.u32 {%0,%1,%2,%3}, [%4];"
                   : "=r"(out.w[0]), "=r"(out.w[1]), "=r"(out.w[2]), "=r"(out.w[3]) : "l"(p));
    else
      asm volatile("ld.global.v4.u32 {%0,%1,%2,%3}, [%4];"
                   : "=r"(out.w[0]), "=r"(out.w[1]), "=r"(out.w[2]), "=r"(out.w[3]) : "l"(p));
  } else if constexpr (Bytes == 8) {
    if constexpr (kReadOnly)
      asm volatile("ld.global.nc.v2.u32 {%0,%1}, [%2];" : "=r"(out.w[0]), "=r"(out.w[1]) : "l"(p));
    else
      asm volatile("ld.global.v2.u32 {%0,%1}, [%2];" : "=r"(out.w[0]), "=r"(out.w[1]) : "l"(p));
  } else {
    static_assert(Bytes == 4, "vector access of 4, 8 or 16 bytes");
    if constexpr (kReadOnly)
      asm volatile("ld.global.nc.u32 %0, [%1];" : "=r"(out.w[0]) : "l"(p));
    else
      asm volatile("ld.global.u32 %0, [%1];" : "=r"(out.w[0]) : "l"(p));
  }
  return out;
}

template <int Bytes>
__device__ __forceinline__ void store_word(void* p, const Word<Bytes>& v) {
  if constexpr (Bytes == 16)
    asm volatile("st.global.v4.u32 [%0], {%1,%2,%3,%4};" ::"l"(p), "r"(v.w[0]), "r"(v.w[1]),
                 "r"(v.w[2]), "r"(v.w[3])
                 : "memory");
  else if constexpr (Bytes == 8)
    asm volatile("st.global.v2.u32 [%0], {%1,%2};" ::"l"(p), "r"(v.w[0]), "r"(v.w[1]) : "memory");
  else
    asm volatile("st.global.u32 [%0], %1;" ::"l"(p), "r"(v.w[0]) : "memory");
}

// 16 bytes read once and never again by this grid: ld.global.cs (evict-first in L1 and L2).
__device__ __forceinline__ Word<16> load_word_streaming(const void* p) {
  Word<16> out;
  asm volatile("ld.global.cs.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(out.w[0]), "=r"(out.w[1]), "=r"(out.w[2]), "=r"(out.w[3]) : "l"(p));
  return out;
}

// An L2 policy that marks every line a load brings in as first to evict (weights streamed once
// per call), for load_word_l2_hint; created once per thread (sm_80+).
__device__ __forceinline__ u64 l2_evict_first_policy() {
  u64 policy;
  asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}

// 16 read-only bytes through the non-coherent path, not allocated in L1 and placed in L2 under
// `policy` (l2_evict_first_policy: a weight matrix larger than L2 read once per call).
__device__ __forceinline__ Word<16> load_word_l2_hint(const void* p, u64 policy) {
  Word<16> out;
  asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0,%1,%2,%3}, [%4], %5;"
               : "=r"(out.w[0]), "=r"(out.w[1]), "=r"(out.w[2]), "=r"(out.w[3]) : "l"(p), "l"(policy));
  return out;
}

// 16 bytes not read again by this grid: st.global.cs (evict-first).
__device__ __forceinline__ void store_word_streaming(void* p, const Word<16>& v) {
  asm volatile("st.global.cs.v4.u32 [%0], {%1,%2,%3,%4};" ::"l"(p), "r"(v.w[0]), "r"(v.w[1]), "r"(v.w[2]),
               "r"(v.w[3])
               : "memory");
}

// Element i of a vector word, and back (T is a 2-byte storage type or float).
template <typename T, int Bytes>
__device__ __forceinline__ T word_element(const Word<Bytes>& w, int i) {
  if constexpr (sizeof(T) == 4) {
    return __uint_as_float(w.w[i]);
  } else {
    static_assert(sizeof(T) == 2, "2- or 4-byte elements");
    T out;
    out.bits = static_cast<unsigned short>(w.w[i / 2] >> (16 * (i % 2)));
    return out;
  }
}

template <typename T, int N>
__device__ __forceinline__ void elements_to_word(const T (&src)[N], Word<N * sizeof(T)>& w) {
  if constexpr (sizeof(T) == 4) {
#pragma unroll
    for (int i = 0; i < N; ++i) w.w[i] = __float_as_uint(src[i]);
  } else {
#pragma unroll
    for (int i = 0; i < N / 2; ++i)
      w.w[i] = static_cast<u32>(src[2 * i].bits) | (static_cast<u32>(src[2 * i + 1].bits) << 16);
  }
}

template <typename T, int N, bool kAligned, bool kReadOnly>
__device__ __forceinline__ void load_elements(const T* src, T (&dst)[N]) {
  constexpr int kBytes = N * static_cast<int>(sizeof(T));
  static_assert(kBytes <= 16, "one access moves at most 16 bytes");
  if constexpr (kAligned && kBytes >= 4) {
    const Word<kBytes> word = load_word<kBytes, kReadOnly>(src);
#pragma unroll
    for (int i = 0; i < N; ++i) dst[i] = word_element<T>(word, i);
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) dst[i] = src[i];
  }
}

template <typename T, int N, bool kAligned>
__device__ __forceinline__ void store_elements(T* dst, const T (&src)[N]) {
  constexpr int kBytes = N * static_cast<int>(sizeof(T));
  static_assert(kBytes <= 16, "one access moves at most 16 bytes");
  if constexpr (kAligned && kBytes >= 4) {
    Word<kBytes> word;
    elements_to_word(src, word);
    store_word<kBytes>(dst, word);
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) dst[i] = src[i];
  }
}

// 16 bytes of 2-byte elements as four packed words (8 elements in 4 registers): one vector
// access when aligned, element by element otherwise.
template <typename T, bool kAligned, bool kReadOnly>
__device__ __forceinline__ void load_packed(const T* src, Word<16>& out) {
  static_assert(sizeof(T) == 2, "8 elements of 2 bytes");
  if constexpr (kAligned) {
    out = load_word<16, kReadOnly>(src);
  } else {
#pragma unroll
    for (int i = 0; i < 4; ++i)
      out.w[i] = static_cast<u32>(src[2 * i].bits) | (static_cast<u32>(src[2 * i + 1].bits) << 16);
  }
}

// Asynchronous copies from global to shared memory (cp.async, sm_80+) in commit groups: a thread
// waits for its own older groups with copy_async_wait<N>() (all but the N newest complete) and
// may then read what they wrote. Bytes: 4, 8 or 16 (cached in L1 on the way: .ca).
__device__ __forceinline__ unsigned shared_address(const void* p) {
  unsigned a;
  asm("{\n .reg .u64 g;\n cvta.to.shared.u64 g, %1;\n cvt.u32.u64 %0, g;\n}" : "=r"(a) : "l"(p));
  return a;
}
template <int Bytes>
__device__ __forceinline__ void copy_async(unsigned shared, const void* global) {
  static_assert(Bytes == 4 || Bytes == 8 || Bytes == 16, "cp.async moves 4, 8 or 16 bytes");
  asm volatile("cp.async.ca.shared.global [%0], [%1], %2;" ::"r"(shared), "l"(global), "n"(Bytes) : "memory");
}
__device__ __forceinline__ void copy_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void copy_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}
// copy_async_wait<n>() for an n known only after unrolling (0 <= n <= kMax): the branches fold.
template <int kMax>
__device__ __forceinline__ void copy_async_wait_upto(int n) {
  if constexpr (kMax > 0) {
    if (n < kMax) {
      copy_async_wait_upto<kMax - 1>(n);
      return;
    }
  }
  copy_async_wait<kMax>();
}

// Programmatic dependent launch: wait for the grid this one depends on before the first read of
// its outputs, and let the next grid start its prologue once our last store is issued. Both are
// no-ops when the launch did not enable PDL.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
// pdl_wait once `a` and `b` are computed: parameter reads and address arithmetic are not memory
// operations to the compiler, which sinks them past the wait to their first use (where the first
// touch of a parameter line then misses the constant cache after the wait). ptxas still places
// part of it after the wait (norm_scale_shift at 512 tokens, sm_90a: 5 instructions between the
// wait and the first load; 30 before its parameters were reordered, 53 with pdl_wait). Forcing
// every parameter line's first touch before the wait (a shared-memory store of their xor) left
// nothing after it but ran the 512-token rows slower: the extra misses then delay the first load,
// where after it they overlap the load (docs/tuning/norm_scale_shift.md).
__device__ __forceinline__ void pdl_wait_after(const void* a, const void* b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::"l"(a), "l"(b) : "memory");
#endif
}
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}


}  // namespace ditops::kernel

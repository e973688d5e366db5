// token_cat_fp8's kernel from the host: its template key, request and launch. fp8_static_quant
// runs the same kernel with one input (Dm = 0), so both ops share one compile and cache entry.
#pragma once

#include <cstdint>
#include <string>

#include "ditops/registry.h"
#include "ditops/token_cat_fp8.h"
#include "jit/jit.h"
#include "jit/kernel_request.h"

namespace ditops {

// The template key: exactly the kernel's template parameters.
struct TokenCatFp8Key {
  DType dtype = DType::bf16;
  bool vector = true;     // 16-byte units (Da, Dm multiples of 16, aligned pointers)
  bool div_full = false;  // fp8_reciprocal=div_full
  bool index64 = false;   // 2^31 units or more
  bool pdl = true;

  // "bf16,vec16,ieee,pdl" / "f16,scalar,div_full,index64,nopdl"
  std::string to_string() const;
  uint64_t packed() const;  // unique small integer (memo key)
};

TokenCatFp8Key token_cat_fp8_key(const TokenCatFp8Call& call, const DeviceInfo& device);
KernelRequest token_cat_fp8_request(const TokenCatFp8Key& key);
void token_cat_fp8_launch(const TokenCatFp8Call& call, const TokenCatFp8Key& key, const jit::LoadedKernel& kernel);

// The contract of the CPU reference both ops run (token_cat_fp8_reference): byte-equal to the eager
// chain `eager` with fp8_reciprocal=ieee, within one e4m3 code of SGLang's `sglang` with div_full
// (1/`scale` as an IEEE division).
Contract token_cat_fp8_reference_contract(const std::string& eager, const std::string& sglang, const std::string& scale);

}  // namespace ditops

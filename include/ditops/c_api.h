/* The C ABI, derived from the op table: one entry runs any op, one explains it, one exports the
   table (ditops/op.h). Tensors are DLPack DLTensors in the op's slot order (`ditops_op_table`
   lists the slots; NULL for an absent optional tensor); options are name/value text pairs
   ("eps" = "1e-5", "rounding" = "fp32"), plus "backend" and "quality". Errors come back as a
   non-zero return and the message in `error` (NUL-terminated, truncated to error_size). Valid C11
   and C++. */
#ifndef DITOPS_C_API_H
#define DITOPS_C_API_H

#include <stddef.h>
#include <stdint.h>

#include "ditops/dlpack.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
  const char* name;
  const char* value;
} ditops_option;

/* Runs `op`; writes the implementation that ran into `impl` (may be NULL). */
int ditops_call(const char* op, const DLTensor* const* tensors, size_t num_tensors,
                const ditops_option* options, size_t num_options, void* stream, char* impl,
                size_t impl_size, char* error, size_t error_size);

/* The dispatch table for the same call, without running it. */
int ditops_explain(const char* op, const DLTensor* const* tensors, size_t num_tensors,
                   const ditops_option* options, size_t num_options, char* report,
                   size_t report_size, char* error, size_t error_size);

/* The op table as JSON. Returns the length of the whole text (excluding the NUL); the text is
   truncated to out_size - 1 characters, so a caller can ask with out_size 0 first. */
size_t ditops_op_table(char* out, size_t out_size);

/* Registry listing as text (one line per implementation); returns the length like
   ditops_op_table. */
size_t ditops_list_kernels(char* out, size_t out_size);

const char* ditops_version(void);

#ifdef __cplusplus
}
#endif

#endif /* DITOPS_C_API_H */

/* A C11 consumer of the installed package (tests/install_consumer.cmake): the C ABI's version,
   op table, one residual_gate_add on host buffers checked value by value, and refused calls that
   must return an error with a message and leave the output untouched. */
#include <ditops/c_api.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures = 0;

static void expect(int ok, const char* what) {
  if (!ok) {
    fprintf(stderr, "c_consumer: FAILED: %s\n", what);
    ++failures;
  }
}

static DLTensor f32_tensor(float* data, int32_t ndim, int64_t* shape) {
  DLTensor t;
  memset(&t, 0, sizeof t);
  t.data = data;
  t.device.device_type = kDLCPU;
  t.device.device_id = 0;
  t.ndim = ndim;
  t.dtype.code = kDLFloat;
  t.dtype.bits = 32;
  t.dtype.lanes = 1;
  t.shape = shape;
  t.strides = NULL;
  t.byte_offset = 0;
  return t;
}

int main(void) {
  enum { B = 1, S = 3, D = 4 };
  float residual[B * S * D], update[B * S * D], gate[B * D], out[B * S * D];
  int64_t full_shape[3] = {B, S, D}, gate_shape[3] = {B, 1, D}, bad_gate_shape[3] = {B, 1, D - 1};
  DLTensor t_residual = f32_tensor(residual, 3, full_shape), t_update = f32_tensor(update, 3, full_shape);
  DLTensor t_gate = f32_tensor(gate, 3, gate_shape), t_out = f32_tensor(out, 3, full_shape);
  const DLTensor* tensors[4];
  char impl[64] = "", error[512] = "";
  size_t table_size;
  char* table;
  int i, rc;

  const char* version = ditops_version();
  expect(version != NULL && version[0] != '\0', "ditops_version is a non-empty string");

  table_size = ditops_op_table(NULL, 0);
  expect(table_size > 0, "ditops_op_table reports its length");
  table = (char*)malloc(table_size + 1);
  expect(table != NULL && ditops_op_table(table, table_size + 1) == table_size, "ditops_op_table fills the buffer");
  expect(table != NULL && strlen(table) == table_size, "the op table is NUL-terminated at its length");
  expect(table != NULL && strstr(table, "\"residual_gate_add\"") != NULL, "the op table lists residual_gate_add");
  free(table);

  /* Small integers and halves: every product and sum is exact in f32. */
  for (i = 0; i < B * S * D; ++i) {
    residual[i] = (float)i;
    update[i] = (float)(i % 5) - 2.0f;
    out[i] = -1000.0f;
  }
  for (i = 0; i < B * D; ++i) gate[i] = 0.5f * (float)(i + 1);
  tensors[0] = &t_residual;
  tensors[1] = &t_update;
  tensors[2] = &t_gate;
  tensors[3] = &t_out;
  rc = ditops_call("residual_gate_add", tensors, 4, NULL, 0, NULL, impl, sizeof impl, error, sizeof error);
  if (rc != 0) fprintf(stderr, "c_consumer: residual_gate_add: %s\n", error);
  expect(rc == 0, "residual_gate_add on host tensors runs");
  expect(strcmp(impl, "residual_gate_add.reference") == 0, "the CPU call ran the reference");
  for (i = 0; i < B * S * D; ++i) expect(out[i] == residual[i] + update[i] * gate[i % D], "out = residual + update * gate");

  /* A gate of the wrong width: refused with a message naming it, out untouched. */
  for (i = 0; i < B * S * D; ++i) out[i] = -1000.0f;
  t_gate.shape = bad_gate_shape;
  error[0] = '\0';
  rc = ditops_call("residual_gate_add", tensors, 4, NULL, 0, NULL, impl, sizeof impl, error, sizeof error);
  expect(rc != 0, "a gate of the wrong width is refused");
  expect(strstr(error, "gate") != NULL, "the message names the gate");
  for (i = 0; i < B * S * D; ++i) expect(out[i] == -1000.0f, "a refused call writes nothing");
  printf("c_consumer: refused as expected: %s\n", error);
  t_gate.shape = gate_shape;

  /* NULL data with elements, a NULL tensor array, an unknown op, an option of the wrong kind. */
  t_update.data = NULL;
  rc = ditops_call("residual_gate_add", tensors, 4, NULL, 0, NULL, NULL, 0, error, sizeof error);
  expect(rc != 0 && strstr(error, "NULL") != NULL, "NULL data with elements is refused");
  t_update.data = update;
  rc = ditops_call("residual_gate_add", NULL, 4, NULL, 0, NULL, NULL, 0, error, sizeof error);
  expect(rc != 0 && error[0] != '\0', "a NULL tensor array is refused");
  rc = ditops_call("no_such_op", tensors, 4, NULL, 0, NULL, NULL, 0, error, sizeof error);
  expect(rc != 0 && strstr(error, "no_such_op") != NULL, "an unknown op is refused by name");
  {
    ditops_option pdl = {"use_pdl", "maybe"};
    rc = ditops_call("residual_gate_add", tensors, 4, &pdl, 1, NULL, NULL, 0, error, sizeof error);
    expect(rc != 0 && strstr(error, "use_pdl") != NULL, "an option value of the wrong kind is refused");
  }
  /* A message longer than the buffer is truncated and still NUL-terminated. */
  memset(error, 'x', sizeof error);
  rc = ditops_call("no_such_op", tensors, 4, NULL, 0, NULL, NULL, 0, error, 8);
  expect(rc != 0 && strlen(error) == 7, "the message is truncated to the buffer");

  printf("c_consumer: ditops %s, %d failure(s)\n", version ? version : "?", failures);
  return failures == 0 ? 0 : 1;
}

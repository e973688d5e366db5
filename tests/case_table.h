// An op's test cases as table rows (docs/testing.md): a row states the op's dims at their sizes and
// what makes it special (a dtype, options, a fill of special values, strides, a view, an offset);
// every tensor comes from its slot in the op's description, its extents from the slot's symbolic
// shape at the row's dims and its dtype from the slot's rule. The op's oracles (OracleSet) check
// every row, so a new op's cases are a table and no code:
//
//   const Row table{.dims = {{"M", 16}, {"K", 5120}}, .tensors = {{.name = "x", .fill = Fill::normal(4.0)}}};
//   std::vector<OpCase> cases = table_cases("scale_add", table, {
//       {.dims = {{"M", 1}}},                                           // a model shape
//       {.dims = {{"M", 7}, {"K", 5}}, .kind = CaseKind::odd},          // the scalar path
//       {.tensors = {{.name = "x", .fill = Fill::special()}}},          // NaN, Inf, subnormals
//       {.tensors = {{.name = "out", .storage = "x"}}, .invalid = {"x overlaps out"}},
//   });
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "op_test_driver.h"

namespace ditops::optest {

// One tensor of a row: what differs from what its slot gives (an optional slot a row names is given).
struct RowTensor {
  std::string name;
  std::optional<DType> dtype;
  std::optional<std::vector<int64_t>> shape;
  std::vector<int64_t> strides;  // elements; empty: contiguous
  std::string storage;           // views this tensor's buffer
  int64_t offset = 0;            // elements from its buffer's start
  std::optional<Fill> fill;
};

struct Row {
  std::vector<std::pair<std::string, int64_t>> dims;  // the op's symbols; a row's override the table's
  std::optional<DType> dtype;  // of the slots whose dtype rule takes it (and those that say "=<slot>")
  std::optional<CaseKind> kind;  // default: model
  std::vector<std::pair<std::string, std::string>> options;  // a row's override the table's by name
  std::vector<RowTensor> tensors;  // merged with the table's by name, field by field
  std::string name;                // "": derived from the dtype, the dims, the options and the tensors
  std::vector<std::string> invalid;
  std::vector<std::pair<std::string, std::string>> unsupported;  // (implementation, reason) explain gives
  std::optional<Tolerance> tolerance;
  std::optional<bool> large;
  std::optional<uint32_t> seed;  // default: the next of the table's
};

// The cases of `rows` over `table` (what every row shares), in order; their seeds count up from
// `seed`. Throws Error naming the op and the row when a slot's extents cannot be derived, or two
// rows have one name.
std::vector<OpCase> table_cases(const std::string& op, const Row& table, const std::vector<Row>& rows,
                                uint32_t& seed);

}  // namespace ditops::optest

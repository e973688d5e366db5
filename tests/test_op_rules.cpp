// The op table's output rules (include/ditops/op.h): the alloc shape grammar an op states once
// and every binding evaluates (C++ here; Python evaluates the same rules in _codegen); and a check
// matching derives from a slot (core/op_builder.h).
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "core/op_builder.h"
#include "ditops/op.h"

namespace ditops {
namespace {

OpDescription padded_op() {
  OpDescription op;
  op.name = "pad_like";
  op.tensors = {{.name = "x", .dtypes = "f32"},
                {.name = "out", .role = TensorRole::out, .dtypes = "=x", .alloc = ""}};
  op.options = {{.name = "left", .kind = OptionKind::integer, .default_text = "0"},
                {.name = "flag", .kind = OptionKind::boolean, .default_text = "false"}};
  return op;
}

std::vector<int64_t> shape_of(const std::string& rule, int64_t left, std::vector<int64_t> x_shape) {
  OpDescription op = padded_op();
  op.tensors[1].alloc = rule;
  GenericCall c;
  static float storage[1];
  c.tensors = {TensorView::contiguous(storage, DType::f32, Device{}, x_shape), TensorView{}};
  c.given = {true, false};
  c.options = {OptionValue(left), OptionValue(false)};
  return alloc_shape(op, op.tensors[1], c);
}

TEST(OpRules, AllocRulesAddSubtractIndexDimsAndReadIntegerOptions) {
  EXPECT_EQ(shape_of("dim(x,0),dim(x,2)+left+1,last(x)-left", 3, {2, 5, 7, 11}),
            (std::vector<int64_t>{2, 11, 8}));
  EXPECT_EQ(shape_of("rows(x),last(x)/2", 0, {2, 3, 8}), (std::vector<int64_t>{6, 4}));
  // '*' and '/' bind tighter than '+' and '-'; parentheses group.
  EXPECT_EQ(shape_of("1+dim(x,0)*3,(1+dim(x,0))*3,10-4-3", 0, {2}), (std::vector<int64_t>{7, 9, 3}));
  EXPECT_EQ(shape_of("up128(rows(x)+left)", 1, {127, 4}), (std::vector<int64_t>{128}));
}

TEST(OpRules, BadAllocRulesNameTheProblem) {
  auto message = [](const std::string& rule) {
    try {
      shape_of(rule, 1, {2, 3});
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message("dim(x,2)").find("dim index 2 is out of range for a rank-2 tensor"), std::string::npos);
  EXPECT_NE(message("dim(x)").find("needs an index"), std::string::npos);
  EXPECT_NE(message("flag+1").find("option 'flag' is not an integer"), std::string::npos);
  EXPECT_NE(message("nope").find("unknown dim 'nope'"), std::string::npos);
  EXPECT_NE(message("dim(y,0)").find("no tensor 'y'"), std::string::npos);
}

// An absent optional tensor is an empty TensorView; a rank-0 view with data in a slot of stated
// dims is refused with a message that says so, for every op.
TEST(OpRules, AnOptionalSlotIsAbsentOnlyAsAnEmptyView) {
  std::vector<SlotRule> rules;
  rules.push_back(compile_slot_rule("op", {.name = "x", .dtypes = "f32", .shape = "B,D"}, rules));
  rules.push_back(compile_slot_rule("op", {.name = "shift", .optional = true, .dtypes = "=x", .shape = "B,D"}, rules));
  static float storage[8];
  const TensorView x = TensorView::contiguous(storage, DType::f32, Device{}, {2, 4});
  auto message = [&](const TensorView& shift) {
    Matcher m("op");
    const TensorView* views[] = {&x, &shift};
    try {
      match_slots(m, rules, views);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(message(TensorView{}), "no error");
  EXPECT_EQ(message(x), "no error");
  TensorView rank0;
  rank0.data = storage;
  EXPECT_EQ(message(rank0),
            "op: shift has rank 0 but a data pointer: pass an empty TensorView (no shift) or a [B, D] view");
}

}  // namespace
}  // namespace ditops

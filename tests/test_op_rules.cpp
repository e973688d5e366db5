// The op table's output rules (include/ditops/op.h): the alloc shape grammar an op states once
// and every binding evaluates (C++ here; Python evaluates the same rules in _codegen); a check
// matching derives from a slot; and what a description derives from its call struct
// (core/op_builder.h, include/ditops/op_function.h): names, order, the filling, the entries.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "core/op_builder.h"
#include "ditops/op.h"
#include "ditops/op_function.h"

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

struct ToyOptions {
  float eps = 0.5f;
  bool flag = true;
  DispatchOptions dispatch;
};
struct ToyCall {
  TensorView x, scale, out;
  ToyOptions options;
  int64_t rows = 0;  // filled by matching
  Stream stream = nullptr;
};
static_assert(op_function_detail::leading_views<ToyCall>() == 3, "the call struct's leading TensorViews");

const OpBuilder<ToyCall>& toy_description() {
  static const OpBuilder<ToyCall> b = [] {
    OpBuilder<ToyCall> b("toy", "summary", "doc");
    b.tensor<&ToyCall::x>({.dtypes = "f32", .shape = "M,K"});
    b.tensor<&ToyCall::scale>({.dtypes = "=x", .shape = "K"});
    b.tensor<&ToyCall::out>({.role = TensorRole::out, .dtypes = "=x", .shape = "M,K"});
    b.option<&ToyOptions::eps>("an epsilon");
    b.option<&ToyOptions::flag>("a flag");
    b.before_slots([](const ToyCall& c) {
      if (c.options.eps < 0) throw InvalidArgument("toy: eps first");
    });
    b.complete([](ToyCall& c, Matcher& m) {
      c.rows = *m.value("M");
      if (c.rows == 3) m.fail("three rows");
    });
    return b;
  }();
  return b;
}

void toy_match(ToyCall& c, Stream s) { toy_description().match_in_place(c, s); }
const OpFunction<ToyCall, ToyCall> match_toy{toy_match};

// A slot and an option are named after their members, in the order the description gives them; the
// entry fills the call struct from its arguments by position, and matching is the slots' checks,
// then the op's own (complete), with before_slots first.
TEST(OpRules, TheDescriptionNamesItsSlotsAndOptionsAfterTheMembers) {
  const OpDescription d = toy_description().build(
      [](ToyCall&, Stream) { return std::string("ran"); }, [](ToyCall&) { return DispatchReport{}; });
  ASSERT_EQ(d.tensors.size(), 3u);
  EXPECT_EQ(d.tensors[0].name, "x");
  EXPECT_EQ(d.tensors[1].name, "scale");
  EXPECT_EQ(d.tensors[2].name, "out");
  ASSERT_EQ(d.options.size(), 2u);
  EXPECT_EQ(d.options[0].name, "eps");
  EXPECT_EQ(d.options[0].default_text, "0.5");
  EXPECT_EQ(d.options[1].name, "flag");
  EXPECT_EQ(d.options[1].default_text, "true");
  EXPECT_EQ(toy_description().tensor_name(1), std::string("scale"));

  static float x[8], scale[4], out[8];
  const TensorView vx = TensorView::contiguous(x, DType::f32, Device{}, {2, 4});
  const TensorView vs = TensorView::contiguous(scale, DType::f32, Device{}, {4});
  const TensorView vo = TensorView::contiguous(out, DType::f32, Device{}, {2, 4});
  int tag = 0;
  const ToyCall c = match_toy(vx, vs, vo, {.eps = 0.25f}, &tag);
  EXPECT_EQ(c.x.data, x);
  EXPECT_EQ(c.scale.data, scale);
  EXPECT_EQ(c.out.data, out);
  EXPECT_EQ(c.options.eps, 0.25f);
  EXPECT_EQ(c.rows, 2);
  EXPECT_EQ(c.stream, &tag);
  EXPECT_EQ(&toy_description().tensor(c, 2), &c.out);
  auto message = [&](const TensorView& a, const TensorView& b, float eps, const TensorView& o = TensorView{}) {
    try {
      match_toy(a, b, o.data ? o : vo, {.eps = eps});
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(message(vx, vx, 0.5f), "toy: scale must have rank 1 but has rank 2 (" + vx.describe() + ")");
  EXPECT_EQ(message(vo, vs, -1.0f), "toy: eps first");  // before the slots
  static float three[12], three_out[12];
  EXPECT_EQ(message(TensorView::contiguous(three, DType::f32, Device{}, {3, 4}), vs, 0.5f,
                    TensorView::contiguous(three_out, DType::f32, Device{}, {3, 4})),
            "toy: three rows");
  // The generic call fills the same members by slot.
  GenericCall g = generic_call(d);
  g.tensors = {vx, vs, vo};
  g.given = {true, true, true};
  g.options = {OptionValue(0.125), OptionValue(false)};
  EXPECT_EQ(d.run(g, nullptr), "ran");
}

// A slot's name is its member's: a description that also spells it is refused.
TEST(OpRules, ASlotNameBesideItsMemberIsRefused) {
  OpBuilder<ToyCall> b("toy", "summary", "doc");
  EXPECT_THROW(b.tensor<&ToyCall::x>({.name = "x", .dtypes = "f32", .shape = "M"}), Error);
}

}  // namespace
}  // namespace ditops

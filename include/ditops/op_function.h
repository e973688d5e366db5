// An op's C++ entry points, `<op>(...)` and `match_<op>(...)`, as constant objects of one template:
// they take the leading members of the op's call struct (its tensors, in declaration order), then
// its options and the stream, and fill the struct by aggregate initialization. So an op's header
// writes its tensor list once, as the call struct's members:
//
//   struct ScaleAddCall {
//     TensorView x, scale, bias, out;  // the tensors, in call order
//     ScaleAddOptions options;
//     int64_t rows = 0;                // filled by matching
//     Stream stream = nullptr;
//   };
//   extern const OpFunction<std::string, ScaleAddCall> scale_add;          // scale_add(x, scale, bias, out,
//   extern const OpFunction<ScaleAddCall, ScaleAddCall> match_scale_add;   //   options = {}, stream = nullptr)
//
// and the op's description (src/core/op_builder.h) defines them. The leading members are
// TensorViews unless listed (`OpFunction<std::string, NormScaleShiftCall, NormScaleShiftInputs,
// NormScaleShiftOutputs>`); an op whose implementations see another struct than its callers fill
// (four layernorm ops sharing one call) names both: `OpFunction<std::string, QkHeadLayerNormArgs>`.
#pragma once

#include <cstddef>
#include <string>
#include <type_traits>
#include <utility>

#include "ditops/tensor.h"

namespace ditops {

namespace op_function_detail {

template <typename... T>
struct Types {};
template <size_t>
using View = TensorView;

template <typename Args>
using OptionsOf = std::remove_cvref_t<decltype(std::declval<Args&>().options)>;

template <typename Args, typename Seq>
struct TakesViews;
template <typename Args, size_t... I>
struct TakesViews<Args, std::index_sequence<I...>> {
  static constexpr bool value = requires(const View<I>&... t, const OptionsOf<Args>& o) { Args{t..., o}; };
};

// How many TensorViews lead the struct: the one count N for which Args{view x N, options} is an
// aggregate initialization (with fewer, options would initialize a view; with more, a view the
// options).
template <typename Args, size_t N = 1>
constexpr size_t leading_views() {
  static_assert(N <= 16, "an op's call struct starts with its TensorViews, then `options`");
  if constexpr (TakesViews<Args, std::make_index_sequence<N>>::value) return N;
  else return leading_views<Args, N + 1>();
}

template <typename Seq>
struct ViewTypes;
template <size_t... I>
struct ViewTypes<std::index_sequence<I...>> {
  using type = Types<View<I>...>;
};

template <typename Result, typename Args, typename Leading>
class Function;

template <typename Result, typename Args, typename... Leading>
class Function<Result, Args, Types<Leading...>> {
 public:
  using Options = OptionsOf<Args>;
  // Completes `args` in place when it is the result (match), else returns the result of it.
  using Body = std::conditional_t<std::is_same_v<Result, Args>, void (*)(Args&, Stream), Result (*)(Args&, Stream)>;

  constexpr explicit Function(Body body) : body_(body) {}

  Result operator()(const Leading&... leading, const Options& options = {}, Stream stream = nullptr) const {
    if constexpr (std::is_same_v<Result, Args>) {
      Result r{leading..., options};
      body_(r, stream);
      return r;
    } else {
      Args a{leading..., options};
      return body_(a, stream);
    }
  }

 private:
  Body body_;
};

template <typename Args, typename... Leading>
struct LeadingOf {
  using type = Types<Leading...>;
};
template <typename Args>
struct LeadingOf<Args> {
  using type = typename ViewTypes<std::make_index_sequence<leading_views<Args>()>>::type;
};

}  // namespace op_function_detail

template <typename Result, typename Args, typename... Leading>
using OpFunction =
    op_function_detail::Function<Result, Args, typename op_function_detail::LeadingOf<Args, Leading...>::type>;

}  // namespace ditops

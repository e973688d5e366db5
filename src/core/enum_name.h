// An enumerator's name, written once: in its enum's declaration. As member_name (core/op_builder.h)
// reads a member's name, enumerator_name reads the compiler's spelling of a value template
// argument (GCC: "[with auto V = ditops::QkNormOrder::aten; ...]", Clang: "[V =
// ditops::QkNormOrder::aten]"; a value no enumerator names is spelled as a cast,
// "(ditops::QkNormOrder)3"). Where an enumerator's text is not its name (a kernel constant, a
// label), enum_texts states one for each and fails to compile when one is missing.
#pragma once

#include <array>
#include <cstddef>
#include <string_view>
#include <type_traits>
#include <utility>

namespace ditops {

namespace enum_detail {

// Enumerators are looked for among the values [0, kValues).
constexpr size_t kValues = 32;

template <auto V>
constexpr std::string_view spelled() {
  constexpr std::string_view f = __PRETTY_FUNCTION__;
  constexpr size_t at = f.find("V = ");
  static_assert(at != std::string_view::npos, "enumerator_name: unexpected signature");
  constexpr size_t end = f.find_first_of(";]", at);
  static_assert(end != std::string_view::npos, "enumerator_name: unexpected signature");
  return f.substr(at + 4, end - at - 4);
}

// "aten" for QkNormOrder::aten, "" for a value no enumerator names.
template <auto V>
constexpr std::string_view name() {
  constexpr std::string_view s = spelled<V>();
  if constexpr (s.empty() || s.front() == '(' || s.front() == '-' || (s.front() >= '0' && s.front() <= '9'))
    return {};
  else if constexpr (s.rfind("::") == std::string_view::npos)
    return s;
  else
    return s.substr(s.rfind("::") + 2);
}

// The name as a C string.
template <auto V>
inline constexpr auto kName = [] {
  constexpr std::string_view n = name<V>();
  std::array<char, n.size() + 1> text{};
  for (size_t i = 0; i < n.size(); ++i) text[i] = n[i];
  return text;
}();

template <typename E, size_t... I>
constexpr std::array<const char*, sizeof...(I)> names(std::index_sequence<I...>) {
  return {(name<static_cast<E>(I)>().empty() ? nullptr : kName<static_cast<E>(I)>.data())...};
}

// Every value's name, nullptr where no enumerator names it.
template <typename E>
inline constexpr auto kNames = names<E>(std::make_index_sequence<kValues>());

template <typename E>
constexpr size_t index(E value) {
  return static_cast<size_t>(static_cast<std::make_unsigned_t<std::underlying_type_t<E>>>(value));
}

}  // namespace enum_detail

// The name of `value` ("aten" for QkNormOrder::aten); "?" for a value no enumerator names.
template <typename E>
  requires std::is_enum_v<E>
constexpr const char* enumerator_name(E value) {
  const size_t i = enum_detail::index(value);
  return i < enum_detail::kValues && enum_detail::kNames<E>[i] ? enum_detail::kNames<E>[i] : "?";
}

// The enumerator named `name`: false when none is.
template <typename E>
  requires std::is_enum_v<E>
constexpr bool parse_enumerator(std::string_view name, E* out) {
  for (size_t i = 0; i < enum_detail::kValues; ++i)
    if (enum_detail::kNames<E>[i] && name == enum_detail::kNames<E>[i]) {
      *out = static_cast<E>(i);
      return true;
    }
  return false;
}

// A text for each enumerator of E, where it is not the name (a kernel constant, a label):
//   static constexpr auto kConstants = enum_texts<GateMode>({{GateMode::full, "ditops::kRgaGateFull"}, ...});
//   kConstants(mode)
// Every enumerator must have exactly one text: a missing or repeated one does not compile.
template <typename E, size_t N>
class EnumTexts {
 public:
  consteval explicit EnumTexts(const std::pair<E, const char*> (&texts)[N]) {
    size_t enumerators = 0;
    for (size_t i = 0; i < enum_detail::kValues; ++i) enumerators += enum_detail::kNames<E>[i] != nullptr;
    if (enumerators != N) throw "enum_texts: one text for every enumerator of the enum";
    for (size_t i = 0; i < N; ++i) {
      const size_t v = enum_detail::index(texts[i].first);
      if (v >= enum_detail::kValues || !enum_detail::kNames<E>[v] || texts_[v])
        throw "enum_texts: each enumerator once";
      texts_[v] = texts[i].second;
    }
  }
  constexpr const char* operator()(E value) const {
    const size_t i = enum_detail::index(value);
    return i < enum_detail::kValues && texts_[i] ? texts_[i] : "?";
  }

 private:
  std::array<const char*, enum_detail::kValues> texts_{};
};

template <typename E, size_t N>
consteval EnumTexts<E, N> enum_texts(const std::pair<E, const char*> (&texts)[N]) {
  return EnumTexts<E, N>(texts);
}

}  // namespace ditops

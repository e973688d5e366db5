// An op described once: its tensors' rules, its options and its own matching rules, attached to
// the members of its call struct (include/ditops/<op>.h), whose names and order are the tensors'
// and options' (the C++ defaults are the only ones). From it come the argument checks, the call
// every implementation receives, the C++ entries (`<op>(...)`, `match_<op>(...)`,
// include/ditops/op_function.h), the generic call every binding makes and the op table:
//
//   OpBuilder<ScaleAddCall> b("scale_add", "out = x * scale + bias", doc);
//   b.tensor<&ScaleAddCall::x>({.dtypes = "bf16", .shape = "M,N", .layout = "contiguous"});
//   b.option<&QkNormRopeOptions::eps>("RMSNorm epsilon");
//   b.pdl_option<&ScaleAddOptions::use_pdl>();  // "programmatic dependent launch where the device has it"
//   b.choice<&QkNormRopeOptions::rounding>({QkRounding::rounded, QkRounding::fp32}, "...");
//   b.complete(complete_scale_add);  // the op's own rules and the fields they derive
//
// and, with the op's kernel family (jit/kernel_family.h: op_run, op_match, describe_op), its
// entries and registration. Args (what callers fill) is the call struct itself, or a struct the op
// turns into its Call in `complete` (four layernorm ops share one call); it has a member
// `options` whose type has a `dispatch` (DispatchOptions) member, and a Call has `stream`.
#pragma once

#include <cstddef>
#include <initializer_list>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/enum_name.h"
#include "core/matcher.h"
#include "ditops/op.h"

namespace ditops {

// What matching derives from one slot (TensorSlot: shape, dtypes, layout, own), compiled once when
// the op is described.
struct SlotRule {
  std::string name;
  bool optional = false;
  bool written = false;
  enum class Shape : uint8_t { own, dims, one_element } shape = Shape::own;
  std::vector<Dim> dims;
  bool dtype = false;         // the dtype is one of `dtypes` or the one `dtype_of` bound
  std::vector<DType> dtypes;
  std::string dtype_of;       // "=x": x's
  enum class Layout : uint8_t { any, contiguous, strides } layout = Layout::any;
  std::vector<Dim> strides;
  bool disjoint = false;      // written: no read tensor of the call overlaps it
};
// Throws Error naming the op and the slot when its shape, dtypes, layout or own do not parse.
SlotRule compile_slot_rule(const std::string& op, const TensorSlot& slot, const std::vector<SlotRule>& earlier);
// The derived checks, slot by slot (after each, `after_slot(context, m)` when given), then the
// overlaps; views[i] is rule i's tensor (an optional one that is absent, rank 0 without data, is
// skipped).
void match_slots(Matcher& m, const std::vector<SlotRule>& rules, const TensorView* const* views,
                 void (*after_slot)(const void* context, Matcher& m) = nullptr, const void* context = nullptr);
inline bool slot_absent(const TensorView& t) { return t.rank == 0 && t.data == nullptr; }

std::string option_default_text(bool value);
std::string option_default_text(int64_t value);
std::string option_default_text(double value, bool single_precision);
// "op: option 'name' must be <expected> but is <actual kind>".
[[noreturn]] void option_type_error(const std::string& op, const std::string& option, const char* expected,
                                    const OptionValue& value);

// The name of the data member `Member` points to ("x" for &ScaleAddCall::x): the one place the
// compiler spells it is a template's signature (GCC: "[with auto Member = &ditops::C::x; ...]",
// Clang: "[Member = &ditops::C::x]").
template <auto Member>
constexpr std::string_view member_name() {
  constexpr std::string_view f = __PRETTY_FUNCTION__;
  constexpr size_t end = f.find_first_of(";]", f.find("Member = "));
  constexpr size_t start = f.rfind("::", end) + 2;
  static_assert(end != std::string_view::npos && start > 2 && start < end, "member_name: unexpected signature");
  return f.substr(start, end - start);
}

template <typename M>
struct member_traits;
template <typename T, typename C>
struct member_traits<T C::*> {
  using type = T;
  using owner = C;
};

template <typename Args, typename Call = Args>
class OpBuilder {
 public:
  using Options = std::remove_cvref_t<decltype(std::declval<Args&>().options)>;
  using ArgsType = Args;
  using CallType = Call;
  // Args is the Call: matching completes it in place; else it makes the Call.
  static constexpr bool kInPlace = std::is_same_v<Args, Call>;
  using Complete = std::conditional_t<kInPlace, void (*)(Call&, Matcher&), Call (*)(const Args&, Matcher&)>;

  OpBuilder(std::string name, std::string summary, std::string doc) {
    desc_.name = std::move(name);
    desc_.summary = std::move(summary);
    desc_.doc = std::move(doc);
  }

  // Example sizes of the symbolic dims (OpDescription::dims).
  OpBuilder& dims(std::string dims) {
    desc_.dims = std::move(dims);
    return *this;
  }

  // The op is a GEMM or GEMV (OpDescription::gemm: benchmarks report the read roof).
  OpBuilder& gemm() {
    desc_.gemm = true;
    return *this;
  }

  // A tensor slot: the member of Args it is (a path for a nested one: &Call::in, &Inputs::x), named
  // after the last member; slot.name stays empty.
  template <auto... Path>
  OpBuilder& tensor(TensorSlot slot) {
    static_assert(sizeof...(Path) > 0, "tensor<&Args::member>(...)");
    if (!slot.name.empty()) throw Error(desc_.name + ": slot " + slot.name + ": the name is the member's");
    slot.name = std::string(member_name<(Path, ...)>());
    static const Args probe{};
    const auto at = [](const Args& a) -> const TensorView& { return (a .* ... .* Path); };
    add_slot(std::move(slot), &at(probe), &probe);
    return *this;
  }

  // A rule of the op on one dim's value, checked as soon as a slot binds the dim, so that later
  // slots are not matched against a value the op refuses: "" or the failure (without the op's name).
  OpBuilder& dim_rule(std::string symbol, std::string (*rule)(int64_t value, const Args& call)) {
    dim_rules_.push_back({std::move(symbol), rule});
    return *this;
  }

  // The op's own rules after the slots' (broadcast classes, alignment, in place) and the fields of
  // the call they derive: match_<op> is the slots' checks, then this.
  OpBuilder& complete(Complete complete) {
    complete_ = complete;
    return *this;
  }

  // A rule checked before the slots', where it names a caller's mistake better than a slot's check
  // would (a transposed weight view, an absent required tensor).
  OpBuilder& before_slots(void (*check)(const Args&)) {
    before_slots_ = check;
    return *this;
  }

  // What a run checks before dispatch and matching does not: a value read from host memory, the
  // device-side index check of the checked mode.
  OpBuilder& check_before_run(void (*check)(const Call&)) {
    check_before_run_ = check;
    return *this;
  }

  const std::string& name() const { return desc_.name; }
  const char* tensor_name(size_t i) const { return desc_.tensors[i].name.c_str(); }
  // Slot i's tensor of a call.
  const TensorView& tensor(const Args& a, size_t i) const {
    return *reinterpret_cast<const TensorView*>(reinterpret_cast<const char*>(&a) + offsets_[i]);
  }

  // The checks the slots state, run over a call's tensors: what every match_<op> does first.
  Matcher match(const Args& a) const {
    if (before_slots_) before_slots_(a);
    Matcher m(desc_.name);
    const TensorView* views[kMaxSlots];
    for (size_t i = 0; i < offsets_.size(); ++i)
      views[i] = reinterpret_cast<const TensorView*>(reinterpret_cast<const char*>(&a) + offsets_[i]);
    if (dim_rules_.empty()) {
      match_slots(m, rules_, views);
      return m;
    }
    struct Context {
      const OpBuilder& b;
      const Args& a;
      uint32_t done;
    } context{*this, a, 0};
    match_slots(m, rules_, views, [](const void* p, Matcher& m) {
      auto& c = *static_cast<Context*>(const_cast<void*>(p));
      for (size_t i = 0; i < c.b.dim_rules_.size(); ++i) {
        if (c.done & (1u << i)) continue;
        const std::optional<int64_t> value = m.value(c.b.dim_rules_[i].symbol);
        if (!value) continue;
        c.done |= 1u << i;
        if (std::string why = c.b.dim_rules_[i].rule(*value, c.a); !why.empty()) m.fail(why);
      }
    }, &context);
    return m;
  }

  // match_<op>: the call every implementation receives (Args completed in place, or the Call made
  // from it), validated, on `stream`.
  void match_in_place(Call& c, Stream stream) const requires kInPlace {
    c.stream = stream;
    Matcher m = match(c);
    if (complete_) complete_(c, m);
  }
  Call matched(const Args& a, Stream stream) const {
    if constexpr (kInPlace) {
      Call c = a;
      match_in_place(c, stream);
      return c;
    } else {
      Matcher m = match(a);
      Call c = complete_(a, m);
      c.stream = stream;
      return c;
    }
  }
  void run_checks(const Call& c) const {
    if (check_before_run_) check_before_run_(c);
  }

  // A bool, integer or floating-point option, named after its member; the default is the struct's.
  template <auto Member>
  OpBuilder& option(std::string doc) {
    static_assert(std::is_same_v<typename member_traits<decltype(Member)>::owner, Options>,
                  "an option is a member of Options");
    add_option(std::string(member_name<Member>()), Member, std::move(doc));
    return *this;
  }

  // The use_pdl option of an op whose kernels take programmatic dependent launch.
  template <auto Member>
  OpBuilder& pdl_option() {
    return option<Member>("programmatic dependent launch where the device has it");
  }

  // An enum option given by name, named after its member: the values it takes, in the order the
  // bindings list them, each by its enumerator's name (core/enum_name.h). The default is the
  // struct's.
  template <auto Member>
  OpBuilder& choice(std::initializer_list<typename member_traits<decltype(Member)>::type> values, std::string doc) {
    static_assert(std::is_same_v<typename member_traits<decltype(Member)>::owner, Options>,
                  "a choice is a member of Options");
    std::vector<std::pair<std::string, typename member_traits<decltype(Member)>::type>> names;
    for (const auto v : values) names.emplace_back(enumerator_name(v), v);
    add_choice(std::string(member_name<Member>()), Member, std::move(names), std::move(doc));
    return *this;
  }

  // An option the bindings read (e.g. whether to allocate an output) and the op ignores.
  OpBuilder& binding_option(OptionSlot slot) {
    slot.binding_only = true;
    desc_.options.push_back(std::move(slot));
    option_setters_.push_back([](Args&, const OptionValue&) {});
    return *this;
  }

  // The op table's entry: a generic call becomes Args (tensor slots by member, options by name),
  // which `run` (match, check, dispatch) and `explain` take (jit/kernel_family.h: describe_op).
  OpDescription build(std::string (*run)(Args&, Stream), DispatchReport (*explain)(Args&)) const {
    OpDescription desc = desc_;
    desc.run = [to_args = args_of(), run](const GenericCall& c, Stream s) {
      Args a = to_args(c);
      return run(a, s);
    };
    desc.explain = [to_args = args_of(), explain](const GenericCall& c) {
      Args a = to_args(c);
      return explain(a);
    };
    return desc;
  }

 private:
  template <typename T>
  static T convert(const std::string& op, const std::string& name, const OptionValue& v) {
    if constexpr (std::is_same_v<T, bool>) {
      if (const bool* b = std::get_if<bool>(&v)) return *b;
      option_type_error(op, name, "a bool", v);
    } else if constexpr (std::is_integral_v<T>) {
      const int64_t* i = std::get_if<int64_t>(&v);
      if (!i) option_type_error(op, name, "an integer", v);
      if (*i < static_cast<int64_t>(std::numeric_limits<T>::min()) ||
          *i > static_cast<int64_t>(std::numeric_limits<T>::max()))
        throw InvalidArgument(op + ": option '" + name + "' must fit " + std::to_string(sizeof(T) * 8) +
                              " bits but is " + std::to_string(*i));
      return static_cast<T>(*i);
    } else {
      if (const double* d = std::get_if<double>(&v)) return static_cast<T>(*d);
      if (const int64_t* i = std::get_if<int64_t>(&v)) return static_cast<T>(*i);
      option_type_error(op, name, "a number", v);
    }
  }

  static constexpr size_t kMaxSlots = 16;
  // `at` is the slot's TensorView in `probe`.
  void add_slot(TensorSlot slot, const TensorView* at, const Args* probe) {
    if (rules_.size() == kMaxSlots) throw Error(desc_.name + ": more than 16 tensor slots");
    rules_.push_back(compile_slot_rule(desc_.name, slot, rules_));
    desc_.tensors.push_back(std::move(slot));
    offsets_.push_back(static_cast<size_t>(reinterpret_cast<const char*>(at) - reinterpret_cast<const char*>(probe)));
  }

  template <typename T>
  void add_option(std::string name, T Options::*member, std::string doc) {
    static_assert(std::is_arithmetic_v<T>, "option() takes bool, integer and floating-point members");
    const T initial = Options{}.*member;
    OptionSlot slot;
    slot.name = name;
    slot.doc = std::move(doc);
    if constexpr (std::is_same_v<T, bool>) {
      slot.kind = OptionKind::boolean;
      slot.default_text = option_default_text(initial);
    } else if constexpr (std::is_integral_v<T>) {
      slot.kind = OptionKind::integer;
      slot.default_text = option_default_text(static_cast<int64_t>(initial));
    } else {
      slot.kind = OptionKind::real;
      slot.default_text = option_default_text(static_cast<double>(initial), std::is_same_v<T, float>);
    }
    desc_.options.push_back(std::move(slot));
    option_setters_.push_back([member, op = desc_.name, name](Args& a, const OptionValue& v) {
      a.options.*member = convert<T>(op, name, v);
    });
  }

  template <typename E>
  void add_choice(std::string name, E Options::*member, std::vector<std::pair<std::string, E>> names, std::string doc) {
    OptionSlot slot;
    slot.name = name;
    slot.kind = OptionKind::choice;
    slot.doc = std::move(doc);
    const E initial = Options{}.*member;
    for (const auto& [n, e] : names) {
      slot.choices.push_back(n);
      if (e == initial && slot.default_text.empty()) slot.default_text = n;
    }
    desc_.options.push_back(std::move(slot));
    auto table = std::make_shared<std::vector<std::pair<std::string, E>>>(std::move(names));
    option_setters_.push_back([member, op = desc_.name, name, table](Args& a, const OptionValue& v) {
      const std::string* s = std::get_if<std::string>(&v);
      if (!s) option_type_error(op, name, "a string", v);
      for (const auto& [n, e] : *table)
        if (n == *s) {
          a.options.*member = e;
          return;
        }
      std::string expected;
      for (const auto& [n, e] : *table) expected += (expected.empty() ? "" : " or ") + n;
      throw InvalidArgument(op + ": unknown " + name + " '" + *s + "' (expected " + expected + ")");
    });
  }

  // Turns a generic call into Args (copies of the slots and setters: the description may go).
  std::function<Args(const GenericCall&)> args_of() const {
    return [offsets = offsets_, options = option_setters_, name = desc_.name, tensors = desc_.tensors,
            option_count = desc_.options.size()](const GenericCall& c) {
      if (c.tensors.size() != tensors.size() || c.given.size() != tensors.size())
        throw InvalidArgument(name + ": expected " + std::to_string(tensors.size()) + " tensor slots but got " +
                              std::to_string(c.tensors.size()));
      if (c.options.size() != option_count)
        throw InvalidArgument(name + ": expected " + std::to_string(option_count) + " option slots but got " +
                              std::to_string(c.options.size()));
      Args a{};
      for (size_t i = 0; i < offsets.size(); ++i) {
        if (!c.given[i]) {
          if (!tensors[i].optional) throw InvalidArgument(name + ": tensor '" + tensors[i].name + "' is required");
          continue;
        }
        *reinterpret_cast<TensorView*>(reinterpret_cast<char*>(&a) + offsets[i]) = c.tensors[i];
      }
      for (size_t i = 0; i < options.size(); ++i)
        if (!std::holds_alternative<std::monostate>(c.options[i])) options[i](a, c.options[i]);
      a.options.dispatch = c.dispatch;
      return a;
    };
  }

  struct DimRule {
    std::string symbol;
    std::string (*rule)(int64_t, const Args&);
  };

  OpDescription desc_;
  std::vector<SlotRule> rules_;
  std::vector<DimRule> dim_rules_;
  std::vector<size_t> offsets_;  // of each slot's TensorView in Args
  void (*before_slots_)(const Args&) = nullptr;
  Complete complete_ = nullptr;
  void (*check_before_run_)(const Call&) = nullptr;
  std::vector<std::function<void(Args&, const OptionValue&)>> option_setters_;
};

}  // namespace ditops

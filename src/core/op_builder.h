// Builds an OpDescription from an op's typed argument struct: each slot is declared once with
// the member it fills, option defaults are read from a default-constructed struct (the C++
// defaults are the only ones), and the generic call is turned back into the typed one.
//
//   OpBuilder<QkNormRopeCall> b("qknorm_rope", "in-place per-head QK RMSNorm + RoPE", doc);
//   b.tensor({"q", TensorRole::inout, ...}, &QkNormRopeCall::q);
//   b.option("eps", &QkNormRopeOptions::eps, "RMSNorm epsilon");
//   b.choice("rounding", &QkNormRopeOptions::rounding, {{"rounded", ...}, {"fp32", ...}}, "...");
//   registry.describe(b.build(run, explain));
//
// Args needs a member `options` whose type has a `dispatch` (DispatchOptions) member.
#pragma once

#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

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

template <typename Args>
class OpBuilder {
 public:
  using Options = std::remove_cvref_t<decltype(std::declval<Args&>().options)>;

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

  // A tensor slot and the member it fills (a member pointer, or a function for nested members).
  OpBuilder& tensor(TensorSlot slot, TensorView Args::*member) {
    add_rule(slot);
    desc_.tensors.push_back(std::move(slot));
    tensor_setters_.push_back([member](Args& a, const TensorView& t) { a.*member = t; });
    members_.push_back({member, nullptr});
    return *this;
  }
  OpBuilder& tensor(TensorSlot slot, TensorView& (*access)(Args&)) {
    add_rule(slot);
    desc_.tensors.push_back(std::move(slot));
    tensor_setters_.push_back([access](Args& a, const TensorView& t) { access(a) = t; });
    members_.push_back({nullptr, access});
    return *this;
  }

  // A rule of the op on one dim's value, checked as soon as a slot binds the dim, so that later
  // slots are not matched against a value the op refuses: "" or the failure (without the op's name).
  OpBuilder& dim_rule(std::string symbol, std::string (*rule)(int64_t value, const Args& call)) {
    dim_rules_.push_back({std::move(symbol), rule});
    return *this;
  }

  // The checks the slots state, run over a call's tensors: what every match_<op> does first.
  Matcher match(const Args& a) const {
    Matcher m(desc_.name);
    const TensorView* views[kMaxSlots];
    for (size_t i = 0; i < members_.size(); ++i)
      views[i] = members_[i].member ? &(a.*members_[i].member) : &members_[i].access(const_cast<Args&>(a));
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

  // A bool, integer or floating-point option; the default is the struct's.
  template <typename T>
  OpBuilder& option(std::string name, T Options::*member, std::string doc) {
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
    const std::string op = desc_.name;
    option_setters_.push_back([member, op, name](Args& a, const OptionValue& v) {
      a.options.*member = convert<T>(op, name, v);
    });
    return *this;
  }

  // An enum option given by name; the first pair whose value equals the default is the default.
  template <typename E>
  OpBuilder& choice(std::string name, E Options::*member, std::vector<std::pair<std::string, E>> names,
                    std::string doc) {
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
    const std::string op = desc_.name;
    auto table = std::make_shared<std::vector<std::pair<std::string, E>>>(std::move(names));
    option_setters_.push_back([member, op, name, table](Args& a, const OptionValue& v) {
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
    return *this;
  }

  // An option the bindings read (e.g. whether to allocate an output) and the op ignores.
  OpBuilder& binding_option(OptionSlot slot) {
    slot.binding_only = true;
    desc_.options.push_back(std::move(slot));
    option_setters_.push_back([](Args&, const OptionValue&) {});
    return *this;
  }

  OpDescription build(std::function<std::string(const Args&, Stream)> run,
                      std::function<DispatchReport(const Args&)> explain) const {
    auto to_args = [tensors = tensor_setters_, options = option_setters_, desc = desc_](const GenericCall& c) {
      if (c.tensors.size() != desc.tensors.size() || c.given.size() != desc.tensors.size())
        throw InvalidArgument(desc.name + ": expected " + std::to_string(desc.tensors.size()) + " tensor slots but got " +
                    std::to_string(c.tensors.size()));
      if (c.options.size() != desc.options.size())
        throw InvalidArgument(desc.name + ": expected " + std::to_string(desc.options.size()) + " option slots but got " +
                    std::to_string(c.options.size()));
      Args a{};
      for (size_t i = 0; i < tensors.size(); ++i) {
        if (!c.given[i]) {
          if (!desc.tensors[i].optional) throw InvalidArgument(desc.name + ": tensor '" + desc.tensors[i].name + "' is required");
          continue;
        }
        tensors[i](a, c.tensors[i]);
      }
      for (size_t i = 0; i < options.size(); ++i)
        if (!std::holds_alternative<std::monostate>(c.options[i])) options[i](a, c.options[i]);
      a.options.dispatch = c.dispatch;
      return a;
    };
    OpDescription desc = desc_;
    desc.run = [to_args, run = std::move(run)](const GenericCall& c, Stream s) { return run(to_args(c), s); };
    desc.explain = [to_args, explain = std::move(explain)](const GenericCall& c) { return explain(to_args(c)); };
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
  void add_rule(const TensorSlot& slot) {
    if (rules_.size() == kMaxSlots) throw Error(desc_.name + ": more than 16 tensor slots");
    rules_.push_back(compile_slot_rule(desc_.name, slot, rules_));
  }
  struct Member {
    TensorView Args::*member;
    TensorView& (*access)(Args&);
  };

  struct DimRule {
    std::string symbol;
    std::string (*rule)(int64_t, const Args&);
  };

  OpDescription desc_;
  std::vector<SlotRule> rules_;
  std::vector<DimRule> dim_rules_;
  std::vector<Member> members_;
  std::vector<std::function<void(Args&, const TensorView&)>> tensor_setters_;
  std::vector<std::function<void(Args&, const OptionValue&)>> option_setters_;
};

}  // namespace ditops

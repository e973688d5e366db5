// The op table: lookup, generic calls, option parsing, output-shape rules and the JSON export
// the Python package builds its functions from.
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <sstream>

#include "core/enum_name.h"
#include "core/device.h"
#include "core/op_builder.h"
#include "ditops/op.h"

namespace ditops {

const char* tensor_role_name(TensorRole role) { return enumerator_name(role); }

const char* option_kind_name(OptionKind kind) {
  static constexpr auto kNames =
      enum_texts<OptionKind>({{OptionKind::boolean, "bool"}, {OptionKind::integer, "int"}, {OptionKind::real, "float"},
                              {OptionKind::choice, "choice"}, {OptionKind::optional_boolean, "optional_bool"}});
  return kNames(kind);
}

std::string option_default_text(bool value) { return value ? "true" : "false"; }
std::string option_default_text(int64_t value) { return std::to_string(value); }

// The shortest text that reads back as the same value (1e-6f prints as "1e-06").
std::string option_default_text(double value, bool single_precision) {
  char buf[64];
  for (int digits = 1; digits <= 17; ++digits) {
    std::snprintf(buf, sizeof buf, "%.*g", digits, value);
    const double back = std::strtod(buf, nullptr);
    if (single_precision ? static_cast<float>(back) == static_cast<float>(value) : back == value) break;
  }
  return buf;
}

namespace {
const char* value_kind(const OptionValue& v) {
  switch (v.index()) {
    case 0: return "unset";
    case 1: return "a bool";
    case 2: return "an integer";
    case 3: return "a float";
    default: return "a string";
  }
}
}  // namespace

void option_type_error(const std::string& op, const std::string& option, const char* expected,
                       const OptionValue& value) {
  throw InvalidArgument(op + ": option '" + option + "' must be " + expected + " but is " + value_kind(value));
}

int OpDescription::tensor_index(const std::string& tensor) const {
  for (size_t i = 0; i < tensors.size(); ++i)
    if (tensors[i].name == tensor) return static_cast<int>(i);
  return -1;
}

int OpDescription::option_index(const std::string& option) const {
  for (size_t i = 0; i < options.size(); ++i)
    if (options[i].name == option) return static_cast<int>(i);
  return -1;
}

std::vector<const OpDescription*> op_descriptions() { return Registry::global().descriptions(); }

const OpDescription& op(const std::string& name) {
  if (const OpDescription* d = Registry::global().description(name)) return *d;
  std::string known;
  for (const OpDescription* d : op_descriptions()) known += (known.empty() ? "" : ", ") + d->name;
  throw InvalidArgument("unknown op '" + name + "' (known: " + known + ")");
}

OptionValue parse_option(const OpDescription& op, const OptionSlot& option, const std::string& text) {
  auto fail = [&](const std::string& expected) -> OptionValue {
    throw InvalidArgument(op.name + ": option '" + option.name + "' must be " + expected + " but is '" + text + "'");
  };
  switch (option.kind) {
    case OptionKind::boolean:
    case OptionKind::optional_boolean:
      if (text == "1" || text == "true") return true;
      if (text == "0" || text == "false") return false;
      if (option.kind == OptionKind::optional_boolean && (text == "none" || text.empty())) return std::monostate{};
      return fail(option.kind == OptionKind::boolean ? "true/false (or 1/0)" : "true/false/none");
    case OptionKind::integer: {
      errno = 0;
      char* end = nullptr;
      const long long v = std::strtoll(text.c_str(), &end, 10);
      if (text.empty() || *end != '\0' || errno == ERANGE) return fail("an integer");
      return static_cast<int64_t>(v);
    }
    case OptionKind::real: {
      errno = 0;
      char* end = nullptr;
      const double v = std::strtod(text.c_str(), &end);
      if (text.empty() || *end != '\0' || errno == ERANGE || !std::isfinite(v)) return fail("a finite number");
      return v;
    }
    case OptionKind::choice: {
      std::string expected;
      for (const auto& c : option.choices) {
        if (c == text) return text;
        expected += (expected.empty() ? "" : " or ") + c;
      }
      throw InvalidArgument(op.name + ": unknown " + option.name + " '" + text + "' (expected " + expected + ")");
    }
  }
  return fail("valid");
}

GenericCall generic_call(const OpDescription& op) {
  GenericCall c;
  c.tensors.resize(op.tensors.size());
  c.given.assign(op.tensors.size(), false);
  c.options.resize(op.options.size());
  return c;
}

std::string call(const std::string& op_name, const GenericCall& c, Stream stream) {
  return op(op_name).run(c, stream);
}

DispatchReport explain(const std::string& op_name, const GenericCall& c) { return op(op_name).explain(c); }

std::string can_use(const std::string& op_name, const GenericCall& c) {
  const DispatchReport report = op(op_name).explain(c);
  if (report.chosen) return "";
  std::string why = op_name + ": no eligible implementation on " + report.device;
  for (const auto& cand : report.candidates) why += "; " + cand.name + ": " + cand.reason;
  return why;
}

std::string try_call(const std::string& op_name, const GenericCall& c, Stream stream) {
  const OpDescription& d = op(op_name);
  if (c.dispatch.backend) return d.run(c, stream);
  if (!d.explain(c).chosen) return "";
  try {
    return d.run(c, stream);
  } catch (const NoImplementation&) {
    return "";  // every eligible implementation failed; the registry recorded and warned
  }
}

DispatchReport explain(const std::string& op_name, const GenericCall& c, const DeviceInfo& simulated) {
  const OpDescription& d = op(op_name);
  if (simulated.device.kind != DeviceKind::cuda)
    throw Error(d.name + ": a simulated device must be a CUDA device but is " + device_name(simulated.device));
  for (size_t i = 0; i < c.tensors.size() && i < c.given.size(); ++i)
    if (c.given[i] && c.tensors[i].device.kind != DeviceKind::cuda)
      throw Error(d.name + ": explain on a simulated sm_" + std::to_string(simulated.sm) + " needs CUDA tensors but " +
                  (i < d.tensors.size() ? d.tensors[i].name : std::to_string(i)) + " is on " +
                  device_name(c.tensors[i].device));
  DispatchReport report;
  {
    SimulatedDeviceScope scope(simulated);
    report = d.explain(c);
  }
  report.device += " simulated, " + std::to_string(simulated.multiprocessors) + " SMs, features " +
                   (simulated.features ? feature_names(simulated.features) : std::string("none"));
  return report;
}

// ---------------------------------------------------------------- output shapes

namespace {

// expr := term (('*' | '/') term)*;  term := INT | rows(t) | last(t) | up128(expr) | is(option,choice) | '(' expr ')'
class ShapeExpr {
 public:
  ShapeExpr(const OpDescription* op, const GenericCall* call, const std::vector<std::pair<std::string, int64_t>>* dims,
            std::string text)
      : op_(op), call_(call), dims_(dims), text_(std::move(text)) {}

  int64_t evaluate() {
    const int64_t v = expr();
    skip();
    if (pos_ != text_.size()) fail("unexpected '" + text_.substr(pos_) + "'");
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& why) const {
    throw Error((op_ ? op_->name + ": output shape rule '" : std::string("shape '")) + text_ + "': " + why);
  }
  void skip() {
    while (pos_ < text_.size() && text_[pos_] == ' ') ++pos_;
  }
  bool eat(char c) {
    skip();
    if (pos_ < text_.size() && text_[pos_] == c) return ++pos_, true;
    return false;
  }
  std::string word() {
    skip();
    const size_t start = pos_;
    while (pos_ < text_.size() && (std::isalnum(static_cast<unsigned char>(text_[pos_])) || text_[pos_] == '_')) ++pos_;
    return text_.substr(start, pos_ - start);
  }
  const TensorView& named(const std::string& name) const {
    const int i = op_ ? op_->tensor_index(name) : -1;
    if (i < 0) fail("no tensor '" + name + "'");
    if (!call_->given[i]) fail("tensor '" + name + "' is not given");
    return call_->tensors[i];
  }
  int64_t expr() {
    int64_t v = product();
    for (;;) {
      if (eat('+')) {
        v += product();
      } else if (eat('-')) {
        v -= product();
      } else {
        return v;
      }
    }
  }
  int64_t product() {
    int64_t v = term();
    for (;;) {
      if (eat('*')) {
        const int64_t w = term();
        if (__builtin_mul_overflow(v, w, &v)) fail("the product overflows int64");
      } else if (eat('/')) {
        const int64_t d = term();
        if (d == 0) fail("division by zero");
        if (d == -1 && v == std::numeric_limits<int64_t>::min()) fail("the quotient overflows int64");
        v /= d;
      } else {
        return v;
      }
    }
  }
  int64_t term() {
    if (eat('(')) {
      const int64_t v = expr();
      if (!eat(')')) fail("missing ')'");
      return v;
    }
    const std::string w = word();
    if (w.empty()) fail("expected a number or a function at " + std::to_string(pos_));
    if (std::isdigit(static_cast<unsigned char>(w[0]))) {
      for (char ch : w)
        if (!std::isdigit(static_cast<unsigned char>(ch))) fail("'" + w + "' is not a number");
      if (w.size() > 18) fail("'" + w + "' is too large");
      return std::stoll(w);
    }
    skip();
    if (pos_ >= text_.size() || text_[pos_] != '(') {
      if (dims_)
        for (const auto& [name, value] : *dims_)
          if (name == w) return value;
      if (op_ && call_)
        if (const int o = op_->option_index(w); o >= 0) {
          if (const int64_t* v = std::get_if<int64_t>(&call_->options[o])) return *v;
          // An option the call leaves unset (monostate) has its default.
          if (std::holds_alternative<std::monostate>(call_->options[o]))
            if (const OptionSlot& slot = op_->options[o]; slot.kind == OptionKind::integer)
              return std::get<int64_t>(parse_option(*op_, slot, slot.default_text));
          fail("option '" + w + "' is not an integer");
        }
      fail("unknown dim '" + w + "'");
    }
    eat('(');
    int64_t v = 0;
    if (w == "up128") {
      v = expr();
      if (v > std::numeric_limits<int64_t>::max() - 127) fail("up128 overflows int64");
      v = (v + 127) / 128 * 128;
    } else if (w == "is") {  // is(option,choice): 1 where the choice option has that value (or default), else 0
      const std::string option = word();
      if (!eat(',')) fail("is(option, choice) needs a choice");
      const std::string choice = word();
      const int o = op_ ? op_->option_index(option) : -1;
      if (o < 0 || op_->options[o].kind != OptionKind::choice) fail("no choice option '" + option + "'");
      const OptionValue& given = call_->options[o];
      const std::string* text = std::get_if<std::string>(&given);
      if (!text && !std::holds_alternative<std::monostate>(given)) fail("option '" + option + "' is not a choice");
      v = (text ? *text : op_->options[o].default_text) == choice ? 1 : 0;
    } else if (w == "last_or_0") {  // an optional tensor's last extent, 0 where it is absent
      const std::string tensor = word();
      const int i = op_ ? op_->tensor_index(tensor) : -1;
      if (i < 0) fail("no tensor '" + tensor + "'");
      if (call_->given[i]) {
        const TensorView& t = call_->tensors[i];
        if (t.rank == 0) fail("tensor has rank 0");
        v = t.shape[t.rank - 1];
      }
    } else {
      const std::string tensor = word();
      const TensorView& t = named(tensor);
      if (t.rank == 0) fail("tensor has rank 0");
      if (w == "last") {
        v = t.shape[t.rank - 1];
      } else if (w == "dim") {
        if (!eat(',')) fail("dim(tensor, index) needs an index");
        const std::string index = word();
        if (index.empty() || index.size() > 2 || !std::isdigit(static_cast<unsigned char>(index[0])))
          fail("dim index '" + index + "' is not a small number");
        const int d = std::stoi(index);
        if (d >= t.rank) fail("dim index " + index + " is out of range for a rank-" + std::to_string(t.rank) + " tensor");
        v = t.shape[d];
      } else if (w == "rows") {
        v = 1;
        for (int d = 0; d + 1 < t.rank; ++d)
          if (__builtin_mul_overflow(v, t.shape[d], &v)) fail("rows(" + tensor + ") overflows int64");
      } else {
        fail("unknown function " + w);
      }
    }
    if (!eat(')')) fail("missing ')'");
    return v;
  }

  const OpDescription* op_;
  const GenericCall* call_;
  const std::vector<std::pair<std::string, int64_t>>* dims_;
  std::string text_;
  size_t pos_ = 0;
};

}  // namespace

// The comma-separated extents of a rule, commas inside parentheses (dim(x,i)) kept.
static std::vector<std::string> split_extents(const std::string& rule) {
  std::vector<std::string> out(1);
  int depth = 0;
  for (char ch : rule) {
    depth += ch == '(' ? 1 : ch == ')' ? -1 : 0;
    if (ch == ',' && depth == 0)
      out.emplace_back();
    else
      out.back() += ch;
  }
  return out;
}

std::vector<int64_t> alloc_shape(const OpDescription& op, const TensorSlot& output, const GenericCall& c) {
  const std::string& rule = output.alloc;
  for (const char* prefix : {"like:", "strided:"}) {
    const std::string p = prefix;
    if (rule.compare(0, p.size(), p) == 0) {
      const int i = op.tensor_index(rule.substr(p.size()));
      if (i < 0 || !c.given[i]) throw Error(op.name + ": output " + output.name + " is shaped like " +
                                            rule.substr(p.size()) + ", which is not given");
      const TensorView& t = c.tensors[i];
      return std::vector<int64_t>(t.shape, t.shape + t.rank);
    }
  }
  std::vector<int64_t> out;
  for (const std::string& item : split_extents(rule)) out.push_back(ShapeExpr(&op, &c, nullptr, item).evaluate());
  return out;
}

std::vector<int64_t> symbolic_shape(const std::string& shape, const std::vector<std::pair<std::string, int64_t>>& dims) {
  std::vector<int64_t> out;
  for (const std::string& item : split_extents(shape)) out.push_back(ShapeExpr(nullptr, nullptr, &dims, item).evaluate());
  return out;
}

bool output_present(const OpDescription& op, const TensorSlot& output, const GenericCall& c) {
  const int self = op.tensor_index(output.name);
  if (self >= 0 && c.given[self]) return true;
  const std::string& rule = output.present;
  auto given = [&](const std::string& name) {
    const int t = op.tensor_index(name);
    if (t >= 0) return static_cast<bool>(c.given[t]);
    const int o = op.option_index(name);
    if (o < 0) throw Error(op.name + ": output " + output.name + "'s rule names '" + name + "', neither tensor nor option");
    const bool* b = std::get_if<bool>(&c.options[o]);
    return b && *b;
  };
  auto any_given = [&](const std::string& list) {
    std::stringstream items(list);
    for (std::string item; std::getline(items, item, ',');)
      if (given(item)) return true;
    return false;
  };
  if (rule == "always") return true;
  if (rule == "caller") return false;
  if (rule.rfind("given:", 0) == 0) return any_given(rule.substr(6));
  const size_t semi = rule.find(";absent:");
  if (rule.rfind("flag:", 0) == 0 && semi != std::string::npos) {
    const int o = op.option_index(rule.substr(5, semi - 5));
    if (o >= 0)
      if (const bool* b = std::get_if<bool>(&c.options[o])) return *b;
    return !any_given(rule.substr(semi + 8));
  }
  throw Error(op.name + ": output " + output.name + " has an unknown presence rule '" + rule + "'");
}

// ---------------------------------------------------------------- JSON export

namespace {

std::string quoted(const std::string& s) {
  std::string out = "\"";
  for (char ch : s) {
    switch (ch) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(ch) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", ch);
          out += buf;
        } else {
          out += ch;
        }
    }
  }
  return out + "\"";
}

}  // namespace

std::string op_table_json() {
  std::string out = "[";
  bool first_op = true;
  for (const OpDescription* d : op_descriptions()) {
    out += first_op ? "\n" : ",\n";
    first_op = false;
    out += "{\"name\": " + quoted(d->name) + ", \"summary\": " + quoted(d->summary) + ", \"doc\": " + quoted(d->doc) +
           ", \"dims\": " + quoted(d->dims) + ", \"gemm\": " + (d->gemm ? "true" : "false") +
           ",\n \"tensors\": [";
    for (size_t i = 0; i < d->tensors.size(); ++i) {
      const TensorSlot& t = d->tensors[i];
      out += std::string(i ? ",\n  " : "\n  ") + "{\"name\": " + quoted(t.name) + ", \"role\": " +
             quoted(tensor_role_name(t.role)) + ", \"optional\": " + (t.optional ? "true" : "false") +
             ", \"keyword\": " + (t.keyword ? "true" : "false") + ", \"dtypes\": " + quoted(t.dtypes) +
             ", \"shape\": " + quoted(t.shape) + ", \"alloc\": " + quoted(t.alloc) + ", \"alloc_dtype\": " +
             quoted(t.alloc_dtype) + ", \"alloc_format\": " + quoted(t.alloc_format) + ", \"present\": " + quoted(t.present) + ", \"doc\": " + quoted(t.doc) + "}";
    }
    out += "],\n \"options\": [";
    for (size_t i = 0; i < d->options.size(); ++i) {
      const OptionSlot& o = d->options[i];
      std::string choices = "[";
      for (size_t j = 0; j < o.choices.size(); ++j) choices += (j ? ", " : "") + quoted(o.choices[j]);
      out += std::string(i ? ",\n  " : "\n  ") + "{\"name\": " + quoted(o.name) + ", \"kind\": " +
             quoted(option_kind_name(o.kind)) + ", \"default\": " + quoted(o.default_text) + ", \"choices\": " +
             choices + "], \"binding_only\": " + (o.binding_only ? "true" : "false") + ", \"doc\": " + quoted(o.doc) +
             "}";
    }
    out += "]}";
  }
  return out + "\n]\n";
}

// ---------------------------------------------------------------- the slots' matching rules

namespace {
std::vector<std::string> split_list(const std::string& text, char separator) {
  std::vector<std::string> out;
  if (text.empty()) return out;
  size_t start = 0;
  for (size_t at; (at = text.find(separator, start)) != std::string::npos; start = at + 1)
    out.push_back(text.substr(start, at - start));
  out.push_back(text.substr(start));
  return out;
}
}  // namespace

SlotRule compile_slot_rule(const std::string& op, const TensorSlot& slot, const std::vector<SlotRule>& earlier) {
  auto bad = [&](const std::string& what) -> Error {
    return Error(op + ": slot " + slot.name + ": " + what);
  };
  SlotRule r;
  r.name = slot.name;
  r.optional = slot.optional;
  r.written = slot.written();
  bool own_shape = false, own_dtype = false, own_overlap = false;
  for (const std::string& item : split_list(slot.own, ',')) {
    if (item == "shape") own_shape = true;
    else if (item == "dtype") own_dtype = true;
    else if (item == "overlap") own_overlap = true;
    else throw bad("own '" + item + "' is not shape, dtype or overlap");
  }
  if (!own_shape && slot.shape.empty()) throw bad("no shape to check (own: \"shape\" when the op checks it)");
  if (!own_shape && slot.shape == "1") {
    r.shape = SlotRule::Shape::one_element;
  } else if (!own_shape) {
    r.shape = SlotRule::Shape::dims;
    for (const std::string& d : split_list(slot.shape, ',')) {
      if (d.empty() || d.find_first_of("*/()-.") != std::string::npos)
        throw bad("shape entry '" + d + "' is not a literal, a symbol or a sum of symbols");
      r.dims.push_back(Dim::parse(d));
    }
  }
  if (!own_dtype) {
    r.dtype = true;
    for (const std::string& d : split_list(slot.dtypes, '|')) {
      if (!d.empty() && d[0] == '=') {
        r.dtype_of = d.substr(1);
        const SlotRule* of = nullptr;
        for (const SlotRule& e : earlier)
          if (e.name == r.dtype_of) of = &e;
        if (!of || !of->dtype)
          throw bad("dtypes '" + slot.dtypes + "' names " + r.dtype_of +
                    ", which is no earlier slot with a checked dtype (own: \"dtype\")");
        continue;
      }
      DType t;
      if (!parse_dtype(d, &t)) throw bad("dtypes entry '" + d + "' is not a dtype");
      r.dtypes.push_back(t);
    }
  }
  if (slot.layout == "contiguous") {
    r.layout = SlotRule::Layout::contiguous;
  } else if (!slot.layout.empty()) {
    r.layout = SlotRule::Layout::strides;
    for (const std::string& d : split_list(slot.layout, ',')) r.strides.push_back(Dim::parse(d));
  }
  r.disjoint = r.written && !own_overlap;
  return r;
}

void match_slots(Matcher& m, const std::vector<SlotRule>& rules, const TensorView* const* views,
                 void (*after_slot)(const void* context, Matcher& m), const void* context) {
  for (size_t i = 0; i < rules.size(); ++i) {
    const SlotRule& r = rules[i];
    const TensorView& t = *views[i];
    if (r.optional && slot_absent(t)) continue;
    // An absent optional tensor is an empty TensorView; a rank-0 view with data is neither that
    // nor the shape the slot states.
    if (r.optional && t.rank == 0 && r.shape == SlotRule::Shape::dims && !r.dims.empty()) {
      std::string dims;
      for (const Dim& d : r.dims)
        dims += (dims.empty() ? "" : ", ") + (d.kind == Dim::Kind::literal ? std::to_string(d.value)
                                              : d.kind == Dim::Kind::any ? std::string("*") : d.symbol);
      m.fail(r.name + " has rank 0 but a data pointer: pass an empty TensorView (no " + r.name + ") or a [" + dims +
             "] view");
    }
    TensorMatch tm = m.tensor(r.name, t);
    if (r.shape == SlotRule::Shape::dims) tm.shape(r.dims);
    else if (r.shape == SlotRule::Shape::one_element) tm.one_element();
    if (r.layout == SlotRule::Layout::strides) tm.strides(r.strides);
    if (r.dtype) {
      // A slot with a dtype list binds its own name, for the slots that say "=name".
      if (r.dtype_of.empty()) tm.dtype_as(r.name, r.dtypes);
      else if (r.dtypes.empty()) tm.dtype_as(r.dtype_of);
      else tm.dtype_in_or_as(r.dtypes, r.dtype_of);
    }
    static const std::string device = "device";  // every tensor of an op on one device
    tm.same_device(device);
    if (r.layout == SlotRule::Layout::contiguous) tm.contiguous();
    if (after_slot) after_slot(context, m);
  }
  for (size_t w = 0; w < rules.size(); ++w) {
    if (!rules[w].disjoint || (rules[w].optional && slot_absent(*views[w]))) continue;
    for (size_t i = 0; i < rules.size(); ++i)
      if (!rules[i].written && !(rules[i].optional && slot_absent(*views[i])))
        m.require_disjoint(*views[w], rules[w].name, *views[i], rules[i].name);
  }
}

}  // namespace ditops

// An op, described once: its name, its tensors (role, dtype rule, shape), its options (kind,
// default, choices) and how bindings allocate its outputs. Every binding is derived from the
// description: the C ABI (ditops_call), the TVM-FFI entry and the Python functions built from
// the exported table, the torch.library schemas and fakes, and the CLI's explain and bench.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <variant>
#include <vector>

#include "ditops/registry.h"
#include "ditops/tensor.h"

namespace ditops {

enum class TensorRole : uint8_t { in, out, inout };
const char* tensor_role_name(TensorRole role);

struct TensorSlot {
  std::string name;
  TensorRole role = TensorRole::in;
  bool optional = false;  // may be absent (Python None, a NULL DLTensor)
  bool keyword = false;   // keyword-only in Python and torch (positional otherwise)
  // Accepted dtypes: "bf16|f16"; "=q" means q's dtype; "f32|=q" either.
  std::string dtypes;
  // Symbolic extents for documentation and the CLI, e.g. "T,Hq,D"; a leading "..." stands for
  // any leading dims; "" when the rule is in the op's doc (broadcast classes).
  std::string shape;
  // Outputs: how a binding allocates one the caller did not pass.
  //   like:x          x's shape, contiguous       strided:x   x's shape and strides
  //   E1,E2           extents from expressions of rows(x) (product of all but the last dim),
  //                   last(x), dim(x,i) (extent i), last_or_0(x) (last(x), 0 when the optional x is
  //                   absent), is(o,c) (1 where the choice option o is c, else 0),
  //                   integer options by name, integers, '+',
  //                   '-', '*', '/', up128(e) (rounded up to 128)
  std::string alloc;
  std::string alloc_dtype;   // "" takes the dtype of the tensor `alloc` names
  std::string alloc_format;  // "x": dense in x's dimension order (channels-last stays so); "": contiguous
  // Outputs: when a binding produces it. "always"; "caller" (only when passed: functional
  // bindings leave it out); "given:a,b" when any of those tensors is given or options is true;
  // "flag:o;absent:a,b" the optional-bool option o decides, and when unset, none of a, b given.
  std::string present = "always";
  std::string doc;
  // Matching derives its checks from the slot, slot by slot, before the op's own rules: `shape`
  // (symbols bind at first use, literals and sums of bound symbols "Da+Dm" must equal, "1" is one
  // element of any rank), `dtypes` ("=x": x's dtype), one device for every tensor, `layout`, and for
  // a written tensor that no read one overlaps it. `own` names what the op checks itself instead
  // (broadcast classes, an in-place rule): any of "shape", "dtype", "overlap", comma-separated.
  //   layout: "" any strides; "contiguous" (row-major dense); or one entry per dim, a literal, a
  //   symbol (equal wherever it appears) or '*' (any): "q_token_stride,head_stride,1".
  std::string layout;
  std::string own;

  bool written() const { return role != TensorRole::in; }
};

enum class OptionKind : uint8_t { boolean, integer, real, choice, optional_boolean };
const char* option_kind_name(OptionKind kind);

struct OptionSlot {
  std::string name;
  OptionKind kind = OptionKind::boolean;
  std::string default_text;          // "true", "0", "1e-06", "rounded", "none"
  std::vector<std::string> choices;  // OptionKind::choice
  bool binding_only = false;         // read by bindings (output presence), not by the C++ op
  std::string doc;
};

// An option value as a binding passes it; monostate takes the default.
using OptionValue = std::variant<std::monostate, bool, int64_t, double, std::string>;

// A call in generic form: one tensor per slot (absent optional ones have data == nullptr and
// given[i] == false), one value per option slot, and the dispatch options.
struct GenericCall {
  std::vector<TensorView> tensors;
  std::vector<bool> given;
  std::vector<OptionValue> options;
  DispatchOptions dispatch;
};

struct OpDescription {
  std::string name;
  std::string summary;  // one line
  std::string doc;      // shapes, broadcast rules, numerics: where to read more
  // The symbolic dims of the tensors' shapes with example sizes (the CLI's defaults), in the
  // order `--shape` takes them; a size may use earlier dims: "T=4608,Hq=24,Hk=24,D=128,P=T,R=D".
  std::string dims;
  // A GEMM or GEMV: its roof is reading its operands once (a weight-streaming GEMV never comes
  // near a copy's bytes), so benchmarks report the fraction of the read roof, not of a copy.
  bool gemm = false;
  std::vector<TensorSlot> tensors;
  std::vector<OptionSlot> options;
  // Matches, dispatches and runs; returns the implementation that ran.
  std::function<std::string(const GenericCall&, Stream)> run;
  // Matches and selects without running.
  std::function<DispatchReport(const GenericCall&)> explain;

  int tensor_index(const std::string& tensor) const;  // -1 when absent
  int option_index(const std::string& option) const;  // -1 when absent
};

// Every described op (in registration order) and one by name; op() throws Error naming the
// known ops.
std::vector<const OpDescription*> op_descriptions();
const OpDescription& op(const std::string& name);

// An option value from text (C ABI, CLI, environment): throws Error naming the op, the option,
// the expected form and the value.
OptionValue parse_option(const OpDescription& op, const OptionSlot& option, const std::string& text);

// An empty generic call of `op`: every tensor absent, every option at its default.
GenericCall generic_call(const OpDescription& op);

// The derived entries every binding calls.
std::string call(const std::string& op_name, const GenericCall& call, Stream stream = nullptr);
DispatchReport explain(const std::string& op_name, const GenericCall& call);

// Whether an implementation takes this call: "" when one does, else every candidate's refusal.
// Runs nothing and compiles nothing; bad input still throws InvalidArgument (a user error is never
// an answer of "no").
std::string can_use(const std::string& op_name, const GenericCall& call);
// Runs the call where an implementation takes it and returns its name; returns "" and writes
// nothing when none is eligible, or when every eligible one failed (each failure recorded and
// warned about once, as dispatch does). Bad input throws; an explicit backend (call.dispatch
// .backend) stays strict and throws as call() does.
std::string try_call(const std::string& op_name, const GenericCall& call, Stream stream = nullptr);
// The dispatch reasoning for `call` as it would be on a CUDA device described by `simulated` (any
// SM, features, multiprocessors; e.g. from `ditops explain --sm 90`), on any machine, GPU or not.
// The tensors must be on a CUDA device; they are matched as usual and never read. The CUDA driver
// is taken as present, NVRTC and the prebuilt kernels are this machine's. The report's device
// says "simulated".
DispatchReport explain(const std::string& op_name, const GenericCall& call, const DeviceInfo& simulated);

// The table as JSON (what the Python package reads: one object per op with its slots).
std::string op_table_json();

// An output's extents from its `alloc` rule, given the call's input tensors; throws Error when
// the rule names an absent tensor. Used by the CLI and tests (Python evaluates the same rules).
std::vector<int64_t> alloc_shape(const OpDescription& op, const TensorSlot& output, const GenericCall& call);

// Whether a binding produces `output` for this call (its `present` rule; "caller" outputs only
// when given).
bool output_present(const OpDescription& op, const TensorSlot& output, const GenericCall& call);

// Extents of a symbolic shape ("T,Hq,D", "up128(B*S),D/16") under named dims.
std::vector<int64_t> symbolic_shape(const std::string& shape, const std::vector<std::pair<std::string, int64_t>>& dims);

}  // namespace ditops

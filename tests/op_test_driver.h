// The op test driver, in the spirit of ggml's test-backend-ops: an op declares its cases once
// (tests/cases/<op>_cases.cpp); the driver runs the reference on host buffers and every other
// implementation Registry::list(op) returns, on a device where one is present, on the same bytes,
// and compares. It goes through the op table only (ditops::op, generic_call, call, explain), so a
// new op needs no driver code. docs/testing.md says what it checks.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ditops/op.h"

namespace ditops::optest {

// How a tensor's values are generated: deterministic from the case seed and the tensor's name.
struct Fill {
  enum class Kind : uint8_t { normal, positive, index, wave, constant, sentinel, special, bits };
  Kind kind = Kind::normal;
  double scale = 1.0;   // normal: scale * (N(0,1) + offset), signed zeros sprinkled in
  double offset = 0.0;  // positive: offset + scale * |N(0,1)|; constant: scale
  int64_t modulo = 1;   // index: (7 i + 3) mod modulo (row indices such as positions)
  // bits: the elements' raw patterns, cycled; special: every `modulo`-th element one of the
  // dtype's special values (special_patterns), the others normal(scale).
  std::vector<uint64_t> patterns;

  static Fill normal(double scale = 1.0, double offset = 0.0) { return {Kind::normal, scale, offset, 1}; }
  static Fill positive(double offset = 0.5, double scale = 1.0) { return {Kind::positive, scale, offset, 1}; }
  static Fill index(int64_t modulo) { return {Kind::index, 1.0, 0.0, modulo}; }
  static Fill wave() { return {Kind::wave, 1.0, 0.0, 1}; }  // sin(0.37 i): a cos/sin cache
  static Fill constant(double value) { return {Kind::constant, value, 0.0, 1}; }
  static Fill sentinel() { return {Kind::sentinel, 1.0, 0.0, 1}; }  // an output's prior contents
  static Fill special(double scale = 1.0, int64_t every = 3) { return {Kind::special, scale, 0.0, every}; }
  static Fill bits(std::vector<uint64_t> patterns) { return {Kind::bits, 1.0, 0.0, 1, std::move(patterns)}; }
};

// A dtype's special values as raw patterns: +-0, +-Inf, NaN of both signs, the smallest and largest
// subnormals, the smallest normal, +-the largest finite, 1 and its neighbour, -1 (fp8: its own; an
// integer dtype: 0, 1, -1 and its extremes).
std::vector<uint64_t> special_patterns(DType dtype);
int64_t numel(const std::vector<int64_t>& shape);  // the elements of a shape
// The strides of a [lead..., W] tensor whose rows are `row` elements apart, its leading dims
// collapsing into one row stride (a padded row, a column slice of a wider buffer).
std::vector<int64_t> row_strides(const std::vector<int64_t>& lead, int64_t row);

// One tensor of a case. A tensor the case leaves out is absent, except outputs that a binding
// would produce (the op table's `present` rule): the driver adds those, contiguous, shaped by
// their `alloc` rule.
struct TensorCase {
  std::string name;  // the op's tensor slot
  DType dtype = DType::bf16;
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;  // elements; empty: contiguous
  std::string storage;           // "": a buffer of its own; else a tensor whose buffer it views
  int64_t offset = 0;            // elements from its buffer's start (views, misalignment)
  std::optional<Fill> fill;      // default: normal for inputs, sentinel for outputs
};

// What a case is about, for the coverage counts.
enum class CaseKind : uint8_t { model, odd, strided, view, misaligned, empty, aliased, invalid };
const char* case_kind_name(CaseKind kind);

// How far an implementation's written elements may be from the reference's. Bytes outside the
// written tensors (guards, padding, inputs) must always be equal.
struct Tolerance {
  double max_ulp = 0;       // 0: equal bytes; else |a - b| in ulps of the dtype at max(|a|, |b|, floor)
  double floor = 0;         // magnitudes below it are compared at its ulp (cancellation near zero)
  double max_fraction = 0;  // of the elements that may differ at all, plus `slack`
  int64_t slack = 0;
};

struct OpCase {
  std::string op;
  std::string name;  // unique within the op; says the shape and what is special
  CaseKind kind = CaseKind::model;
  std::vector<TensorCase> tensors;
  std::vector<std::pair<std::string, std::string>> options;  // parsed by the op table
  uint32_t seed = 1;
  // Non-empty: the call must fail (every implementation) with a message holding each fragment,
  // and write nothing.
  std::vector<std::string> invalid;
  // (implementation, reason fragment): explain must refuse that implementation here with that
  // reason. Any other error of an eligible implementation is a failure.
  std::vector<std::pair<std::string, std::string>> unsupported;
  Tolerance tolerance;                                       // written tensors against the reference
  std::vector<std::pair<std::string, Tolerance>> tolerance_for;  // per tensor, overriding it
  // Per implementation (its contract's own bound against the reference), overriding both.
  std::vector<std::pair<std::string, Tolerance>> tolerance_for_impl;
  // Too slow for the CPU reference alone to be worth it: run only where a device compares.
  bool large = false;
  // Each implementation runs a second time, its outputs pre-filled differently, and must give the
  // same bytes (run to run; nothing left unwritten). Large cases run once.
  bool run_twice = true;
  // Other cases of the op run on the same logical input values (inputs of the same name, shape and
  // dtype copied element by element): `same_as` ones must write the same bytes (the reference,
  // and each implementation on a device), `differs_from` ones must differ somewhere (the
  // reference: an option that is not silently another's).
  std::vector<std::string> same_as, differs_from;

  const Tolerance& tolerance_of(const std::string& tensor, const std::string& impl = "") const;
  // The case's tensor of that name; throws Error when it has none.
  TensorCase& tensor(const std::string& name);
};

// What an oracle reads and writes: the case's tensors by logical index (row-major over the shape),
// its options, and the values it expects of the written tensors.
class OracleIo {
 public:
  int id(const std::string& tensor) const;  // -1 when the case has no such tensor
  bool has(const std::string& tensor) const { return id(tensor) >= 0; }
  DType dtype(int t) const;
  const std::vector<int64_t>& shape(int t) const;
  int64_t numel(int t) const;
  // An element's value before the call (fp8 decoded, integers as they are) and its raw bits.
  double in(int t, int64_t index) const;
  uint64_t bits(int t, int64_t index) const;
  // A written element as the run under check wrote it (the reference's; an implementation's for an
  // oracle on_own_outputs): relations between outputs, fp8 = quant(y).
  double out(int t, int64_t index) const;
  // The case's option text, or the op's default.
  std::string option(const std::string& name) const;
  double number(const std::string& name) const;
  bool flag(const std::string& name) const { return option(name) == "true"; }
  // The oracle's value for element `index` of written tensor `t`, within `bound` (absolute; < 0:
  // the oracle's `ulps`). NaN expects a NaN.
  void expect(int t, int64_t index, double value, double bound = -1);
  // The element's exact raw bits (a copy: NaN payloads and signed zeros included).
  void expect_bits(int t, int64_t index, uint64_t bits);

  struct Slot;  // one tensor of the case (op_test_driver.cpp)
  explicit OracleIo(std::vector<Slot>* slots, const std::vector<std::pair<std::string, std::string>>* options,
                    const OpDescription* op)
      : slots_(slots), options_(options), op_(op) {}

 private:
  std::vector<Slot>* slots_;
  const std::vector<std::pair<std::string, std::string>>* options_;
  const OpDescription* op_;
};

// An independent computation of an op's written tensors (in double, written without the
// reference's code), checked against the reference on every machine: it keeps the reference itself
// tested. Elements it leaves out are not compared.
struct Oracle {
  std::string name;  // what it computes, for the failure messages
  std::function<void(OracleIo&)> expect;
  double ulps = 0;  // the default bound, in ulps of the written dtype at the value; 0: the same value
                    // (signed zeros apart, any NaN for a NaN)
  bool bounds_implementations = false;  // also every implementation on a device (a contract's bound)
  // The implementations whose contract the bound is (default: every one); one with a bound of its
  // own (its own oracle) is held to that instead.
  std::function<bool(const std::string& impl)> bounds_implementation;
  // Computed again from each implementation's own outputs (io.out) and checked against them: a
  // relation between outputs (out follows from stats_out, fp8 is the quantized y) on every device.
  bool on_own_outputs = false;
  std::function<bool(const OpCase&)> applies;  // default: every valid case that is not large
};
// Registers an oracle of `op` (an op may have several).
struct OracleSet {
  OracleSet(std::string op, Oracle oracle);
};
std::vector<const Oracle*> oracles(const std::string& op);

// Variants of a case, derived by the driver: the same call with every buffer holding one of
// `tensors` moved `by` elements off its alignment (its views move with it; kind misaligned); with
// `tensors` (contiguous, buffers of their own) given rows `pad` elements longer (kind strided); with
// other option values (e.g. {{"use_pdl", "false"}}). Names gain a suffix saying which.
OpCase misaligned_variant(const OpCase& c, const std::vector<std::string>& tensors, int64_t by = 1);
OpCase padded_variant(const OpCase& c, const std::vector<std::string>& tensors, int64_t pad = 8);
OpCase option_variant(const OpCase& c, const std::vector<std::pair<std::string, std::string>>& options,
                      const std::string& suffix);
// A case's call up to its name and seed (the op, its tensors with their layout, views and fills, its
// options, and the refusal it expects): two cases with one key check one configuration.
std::string call_key(const OpCase& c);
// Appends the variants of every case `of` selects (default: valid model cases that are not large),
// except a variant that repeats a call the list holds already (the same tensors, views, fills and
// options; the seed apart).
struct Variants {
  std::vector<std::string> misalign;  // misaligned_variant's tensors (none: no such variant)
  int64_t misalign_by = 1;
  std::vector<std::string> pad_rows;  // padded_variant's
  int64_t pad = 8;
  std::vector<std::pair<std::vector<std::pair<std::string, std::string>>, std::string>> options;  // (options, suffix)
  std::function<bool(const OpCase&)> of;
  // A variant of a call with a tensor of more elements is large (run where a device compares it):
  // the smaller variants and the declared cases take the reference through the same layouts.
  int64_t device_only_above = int64_t{1} << 20;
};
void add_variants(std::vector<OpCase>& cases, const Variants& v);

// Where a run's buffers live: host memory (the reference; and a stand-in device that tests the
// device path's logic without a GPU), or a CUDA device through the driver API.
class Memory {
 public:
  virtual ~Memory() = default;
  virtual Device device() const = 0;
  virtual void* allocate(size_t bytes) = 0;  // 256-byte aligned
  virtual void release(void* data) = 0;
  virtual void upload(void* dst, const std::vector<uint8_t>& src) = 0;
  // Into `dst`, `bytes` long: the caller keeps one host buffer for every run of a case (a Wan-sized
  // case's buffers are gigabytes, and fresh pages cost the kernel's zeroing each time).
  virtual void download(const void* src, uint8_t* dst, size_t bytes) = 0;
  virtual void synchronize() = 0;
};
std::unique_ptr<Memory> host_memory();
std::unique_ptr<Memory> cuda_memory();  // nullptr without a CUDA device

// Per implementation: the cases it ran and why it refused the others (reasons counted).
struct ImplTally {
  int ran = 0;
  int refused_invalid = 0;  // invalid cases it refused as it should
  std::map<std::string, int> ineligible;
};
struct Summary {
  std::map<std::string, ImplTally> impls;        // by implementation name
  std::map<std::string, int> cases_by_kind;      // by case_kind_name
  std::string format(const std::string& op) const;
};

struct DriverOptions {
  Memory* device = nullptr;  // where the non-reference implementations run; nullptr: reference only
  // Which implementations of the op the device run covers (default: those whose capabilities
  // name the device's kind, the reference excluded unless the device is the host).
  std::function<bool(const KernelSpec&)> covers;
  // Called on an implementation's downloaded buffers before they are compared: the driver's
  // self-test corrupts them here to see that the comparison catches it.
  std::function<void(const std::string& impl, std::vector<std::vector<uint8_t>>& buffers)> tamper;
  // The same for the reference's buffers before the oracles compare them (their self-test).
  std::function<void(std::vector<std::vector<uint8_t>>& buffers)> tamper_reference;
  // false: the reference runs only as what the implementations are compared with (and what the
  // bounding oracles read); its own invariants are another test's (test_ops.cpp's CPU test).
  bool check_reference = true;
};

// Runs one case: the reference and its invariants, then every covered implementation against
// the reference. Returns the failures ("" lines never); tallies into `summary`.
std::vector<std::string> run_case(const OpCase& c, const DriverOptions& options, Summary* summary);

// What the driver checks for one case, one name per property (docs/testing.md: the count of
// distinct checked cases): on every machine for the reference, and where a device is present for
// every implementation. A large case's reference runs only where a device compares it.
struct CheckedProperty {
  std::string name;
  bool on_cpu;  // checked without a device too
};
std::vector<CheckedProperty> checked_properties(const OpCase& c);

// Every declared case of `op` ("" for all), in declaration order.
std::vector<OpCase> cases(const std::string& op = "");
// One case by op and name (declared cases, made once per process); nullptr when there is none.
const OpCase* find_case(const std::string& op, const std::string& name);
std::vector<std::string> ops_with_cases();

// Cases as JSON (the eager PyTorch test reads them), with each implicit output made explicit.
std::string cases_json();

// A case file registers its cases with one static object:
//   static const optest::CaseSet kCases("residual_gate_add", [] { std::vector<OpCase> out; ...; return out; });
struct CaseSet {
  CaseSet(std::string op, std::function<std::vector<OpCase>()> make);
};

}  // namespace ditops::optest

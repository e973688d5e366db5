#include "tools/table_call.h"

#include <algorithm>
#include <sstream>

#include "ditops/registry.h"

namespace ditops::cli {

namespace {

// The largest size a flag takes: 15 digits, far past any tensor (the facade refuses a call whose
// tensors would pass 2^56 bytes) and short of int64 overflow in the products of a few sizes.
constexpr int64_t kMaxSize = 999'999'999'999'999;

int64_t parse_size(const std::string& flag, const std::string& name, const std::string& text) {
  if (text.empty() || text.find_first_not_of("0123456789") != std::string::npos)
    throw Error(flag + ": " + name + " must be a non-negative integer but is '" + text + "'");
  const size_t first = std::min(text.find_first_not_of('0'), text.size() - 1);  // leading zeros
  if (text.size() - first > 15)
    throw Error(flag + ": " + name + " is too large: at most " + std::to_string(kMaxSize) + " but is " + text);
  return std::stoll(text);
}

std::string sizes(const std::vector<int64_t>& shape) {
  std::string list;
  for (int64_t e : shape) list += (list.empty() ? "" : ",") + std::to_string(e);
  return list;
}

}  // namespace

std::string option_flag(const OptionSlot& o) {
  std::string flag = "--" + o.name;
  std::replace(flag.begin(), flag.end(), '_', '-');
  return flag;
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, sep);) out.push_back(item);
  return out;
}

std::vector<std::string> table_call_flags(const OpDescription& op) {
  std::vector<std::string> known = {"--shape", "--dims", "--dtype", "--with", "--without", "--backend", "--quality"};
  for (const auto& o : op.options) known.push_back(option_flag(o));
  return known;
}

TableCall table_call(const OpDescription& d, const Args& a, Device dev,
                     const std::function<void*(size_t slot, int64_t bytes)>& place) {
  TableCall out;
  // Dims: the example sizes, then --shape (in the order of d.dims), then --dims NAME=N.
  std::vector<std::pair<std::string, int64_t>>& dims = out.dims;
  std::vector<std::string> given_shape = a.has("--shape") ? split(a.get("--shape", ""), ',') : std::vector<std::string>{};
  const auto examples = split(d.dims, ',');
  // --shape gives every dim whose example is a plain size; trailing dims defined by earlier ones
  // (qknorm_rope's P=T, R=D) may be left out, since they follow the given sizes.
  size_t required = 0;
  for (size_t i = 0; i < examples.size(); ++i) {
    const std::string value = examples[i].substr(examples[i].find('=') + 1);
    if (!value.empty() && value.find_first_not_of("0123456789") == std::string::npos) required = i + 1;
  }
  std::string names;  // "T,Hq,Hk,D[,P,R]"
  for (size_t i = 0; i < examples.size(); ++i)
    names += std::string(i == required ? "[" : "") + (i ? "," : "") + examples[i].substr(0, examples[i].find('='));
  if (required < examples.size()) names += "]";
  for (size_t i = 0; i < given_shape.size(); ++i)  // each size checked first: "abc" is refused as such
    parse_size("--shape", i < examples.size() ? examples[i].substr(0, examples[i].find('=')) : "a size", given_shape[i]);
  if (a.has("--shape") && (given_shape.size() < required || given_shape.size() > examples.size()))
    throw Error("--shape takes " +
                (required == examples.size() ? std::to_string(required)
                                             : std::to_string(required) + " to " + std::to_string(examples.size())) +
                " sizes (" + names + ") but has " + std::to_string(given_shape.size()) +
                "; to set some dims only, use --dims NAME=N,... (the others keep their example sizes: " + d.dims + ")");
  std::vector<std::pair<std::string, std::string>> overrides;
  for (const auto& item : split(a.get("--dims", ""), ',')) {
    const size_t eq = item.find('=');
    if (eq == std::string::npos) throw Error("--dims takes NAME=N items but has '" + item + "'");
    for (const auto& [n, v] : overrides)
      if (n == item.substr(0, eq))
        throw Error("--dims names " + n + " twice (" + n + "=" + v + " and " + item + ")");
    overrides.emplace_back(item.substr(0, eq), item.substr(eq + 1));
  }
  for (size_t i = 0; i < examples.size(); ++i) {
    const size_t eq = examples[i].find('=');
    const std::string name = examples[i].substr(0, eq);
    int64_t value = i < given_shape.size() ? parse_size("--shape", name, given_shape[i])
                                           : symbolic_shape(examples[i].substr(eq + 1), dims).at(0);
    for (const auto& [n, v] : overrides)
      if (n == name) value = parse_size("--dims", name, v);
    dims.emplace_back(name, value);
  }
  for (const auto& [n, v] : overrides) {
    bool found = false;
    for (const auto& [name, value] : dims) found = found || name == n;
    if (!found) throw Error("--dims: " + d.name + " has no dim '" + n + "' (dims: " + d.dims + ")");
  }

  GenericCall& c = out.call;
  c = generic_call(d);
  for (size_t k = 0; k < d.options.size(); ++k)
    if (a.has(option_flag(d.options[k]))) c.options[k] = parse_option(d, d.options[k], a.get(option_flag(d.options[k]), ""));
  if (a.has("--backend")) {
    Provenance p;
    if (!parse_provenance(a.get("--backend", ""), &p))
      throw Error("--backend must be kda, aot, jit, vendor or reference but is '" + a.get("--backend", "") + "'");
    c.dispatch.backend = p;
  }
  if (a.has("--quality")) {
    Quality q;
    if (!parse_quality(a.get("--quality", ""), &q))
      throw Error("--quality must be exact, lossless or high but is '" + a.get("--quality", "") + "'");
    c.dispatch.quality = q;
  }
  std::vector<std::pair<std::string, std::string>> dtypes;
  for (const auto& item : split(a.get("--dtype", ""), ',')) {
    const size_t eq = item.find('=');
    if (eq == std::string::npos || d.tensor_index(item.substr(0, eq)) < 0)
      throw Error("--dtype takes TENSOR=DTYPE items naming tensors of " + d.name + " but has '" + item + "'");
    dtypes.emplace_back(item.substr(0, eq), item.substr(eq + 1));
  }
  auto listed = [&](const char* flag, const std::string& name) {
    for (const auto& item : split(a.get(flag, ""), ','))
      if (item == name) return true;
    return false;
  };
  for (const char* flag : {"--with", "--without"})
    for (const auto& item : split(a.get(flag, ""), ','))
      if (d.tensor_index(item) < 0 || !d.tensors[d.tensor_index(item)].optional)
        throw Error(std::string(flag) + " takes optional tensors of " + d.name + " but has '" + item + "'");

  // Inputs first (outputs' presence and extents read them).
  out.bytes.assign(d.tensors.size(), 0);
  for (int pass = 0; pass < 2; ++pass) {
    for (size_t i = 0; i < d.tensors.size(); ++i) {
      const TensorSlot& t = d.tensors[i];
      if ((t.role == TensorRole::out) != (pass == 1)) continue;
      bool present = pass == 0 ? !t.optional || !t.keyword : output_present(d, t, c);
      if (listed("--with", t.name)) present = true;
      if (listed("--without", t.name)) present = false;
      if (!present) continue;
      std::string dt_name = split(t.dtypes, '|').at(0);
      if (pass == 1 && !t.alloc_dtype.empty()) dt_name = t.alloc_dtype;
      for (const auto& [n, v] : dtypes)
        if (n == t.name) dt_name = v;
      if (dt_name.rfind('=', 0) == 0) {
        const int other = d.tensor_index(dt_name.substr(1));
        if (other < 0 || !c.given[other]) throw Error(d.name + ": " + t.name + "'s dtype follows an absent tensor");
        dt_name = dtype_name(c.tensors[other].dtype);
      }
      DType dt;
      if (!parse_dtype(dt_name, &dt)) throw Error("--dtype: '" + dt_name + "' is not a dtype (bf16, f16, f32, ...)");
      const bool by_rule = pass == 1 && !t.alloc.empty() && t.alloc.rfind("like:", 0) != 0 &&
                           t.alloc.rfind("strided:", 0) != 0;
      const std::vector<int64_t> shape = by_rule ? alloc_shape(d, t, c) : symbolic_shape(t.shape, dims);
      __int128 bytes = static_cast<__int128>(dtype_size(dt));
      for (int64_t e : shape) bytes *= e > 0 ? e : 0;
      if (bytes > (__int128{1} << 56))
        throw Error(d.name + ": the tensors of this call would take more than 2^56 bytes (" + t.name + " has " +
                    std::to_string(shape.size()) + " dims of sizes " + sizes(shape) + ")");
      out.bytes[i] = static_cast<int64_t>(bytes);
      c.tensors[i] = TensorView::contiguous(place(i, out.bytes[i]), dt, dev, shape);
      c.given[i] = true;
    }
  }
  return out;
}

}  // namespace ditops::cli

// Table rows to cases (case_table.h): each tensor from its slot in the op's description.
#include "case_table.h"

#include <algorithm>
#include <set>
#include <sstream>

namespace ditops::optest {

namespace {

std::vector<std::string> split(const std::string& text, char separator) {
  std::vector<std::string> out;
  std::stringstream items(text);
  for (std::string item; std::getline(items, item, separator);) out.push_back(item);
  return out;
}

template <typename T>
void merge_by_name(std::vector<std::pair<std::string, T>>& into, const std::vector<std::pair<std::string, T>>& from) {
  for (const auto& item : from) {
    auto it = std::find_if(into.begin(), into.end(), [&](const auto& e) { return e.first == item.first; });
    if (it == into.end()) into.push_back(item);
    else it->second = item.second;
  }
}

void merge_tensor(RowTensor& into, const RowTensor& from) {
  if (from.dtype) into.dtype = from.dtype;
  if (from.shape) into.shape = from.shape;
  if (!from.strides.empty()) into.strides = from.strides;
  if (!from.storage.empty()) into.storage = from.storage;
  if (from.offset) into.offset = from.offset;
  if (from.fill) into.fill = from.fill;
}

// The slot's dtype: the first alternative of its rule, "=t" t's, a listed dtype the row's if listed.
DType slot_dtype(const OpDescription& d, const TensorSlot& slot, const std::vector<TensorCase>& earlier,
                 std::optional<DType> row) {
  const std::vector<std::string> rule = split(slot.dtypes, '|');
  if (!rule.empty() && rule[0].rfind('=', 0) == 0) {
    for (const TensorCase& t : earlier)
      if (t.name == rule[0].substr(1)) return t.dtype;
    throw Error(d.name + ": table row: " + slot.name + "'s dtype follows " + rule[0].substr(1) + ", which it lacks");
  }
  std::vector<DType> listed;
  for (const std::string& name : rule) {
    DType dt;
    if (parse_dtype(name, &dt)) listed.push_back(dt);
  }
  if (listed.empty()) throw Error(d.name + ": table row: " + slot.name + " has no dtype to derive");
  if (row && std::find(listed.begin(), listed.end(), *row) != listed.end()) return *row;
  return listed[0];
}

std::string number(double v) {
  std::ostringstream s;
  s << v;
  return s.str();
}

const char* fill_name(Fill::Kind kind) {
  switch (kind) {
    case Fill::Kind::normal: return "normal";
    case Fill::Kind::positive: return "positive";
    case Fill::Kind::index: return "index";
    case Fill::Kind::wave: return "wave";
    case Fill::Kind::constant: return "constant";
    case Fill::Kind::sentinel: return "sentinel";
    case Fill::Kind::special: return "special";
    case Fill::Kind::bits: return "bits";
  }
  return "?";
}

// "<dtype>_<dims>_<options>" and what the row itself says of its tensors.
std::string derived_name(const OpCase& c, const std::vector<std::pair<std::string, int64_t>>& dims,
                         const Row& row) {
  std::string name = c.tensors.empty() ? std::string("case") : dtype_name(c.tensors[0].dtype);
  for (const auto& [symbol, value] : dims) name += "_" + symbol + std::to_string(value);
  for (const auto& [option, text] : c.options) name += "_" + text;
  for (const RowTensor& t : row.tensors) {
    name += "_" + t.name;
    if (t.dtype) name += "-" + std::string(dtype_name(*t.dtype));
    if (t.shape) {
      name += "-shape";
      for (int64_t e : *t.shape) name += "x" + std::to_string(e);
    }
    if (!t.strides.empty()) name += "-strided";
    if (!t.storage.empty()) name += "-in-" + t.storage;
    if (t.offset) name += "-off" + std::to_string(t.offset);
    if (t.fill) {
      name += std::string("-") + fill_name(t.fill->kind);
      if (t.fill->kind == Fill::Kind::constant) name += number(t.fill->scale);
    }
  }
  return name;
}

}  // namespace

std::vector<OpCase> table_cases(const std::string& op_name, const Row& table, const std::vector<Row>& rows,
                                uint32_t& seed) {
  const OpDescription& d = op(op_name);
  std::vector<OpCase> out;
  std::set<std::string> names;
  for (const Row& row : rows) {
    std::vector<std::pair<std::string, int64_t>> dims = table.dims;
    merge_by_name(dims, row.dims);
    std::vector<RowTensor> edits = table.tensors;
    for (const RowTensor& t : row.tensors) {
      auto it = std::find_if(edits.begin(), edits.end(), [&](const RowTensor& e) { return e.name == t.name; });
      if (it == edits.end()) edits.push_back(t);
      else merge_tensor(*it, t);
    }
    OpCase c;
    c.op = op_name;
    c.kind = row.kind.value_or(table.kind.value_or(CaseKind::model));
    c.seed = row.seed ? *row.seed : seed++;
    c.options = table.options;
    merge_by_name(c.options, row.options);
    const std::optional<DType> dtype = row.dtype ? row.dtype : table.dtype;
    for (const TensorSlot& slot : d.tensors) {
      auto edit = std::find_if(edits.begin(), edits.end(), [&](const RowTensor& e) { return e.name == slot.name; });
      const bool named = edit != edits.end();
      if (slot.optional && !named) continue;
      TensorCase t;
      t.name = slot.name;
      t.dtype = named && edit->dtype ? *edit->dtype : slot_dtype(d, slot, c.tensors, dtype);
      if (named && edit->shape) {
        t.shape = *edit->shape;
      } else if (slot.shape == "1") {
        t.shape = {1};
      } else if (!slot.shape.empty()) {
        try {
          t.shape = symbolic_shape(slot.shape, dims);
        } catch (const std::exception& e) {
          throw Error(op_name + ": table row " + std::to_string(out.size()) + ": " + slot.name + "'s shape '" +
                      slot.shape + "': " + e.what());
        }
      } else {
        throw Error(op_name + ": table row " + std::to_string(out.size()) + ": " + slot.name +
                    " states no shape: the row gives it");
      }
      if (named) {
        t.strides = edit->strides;
        t.storage = edit->storage;
        t.offset = edit->offset;
        t.fill = edit->fill;
      }
      c.tensors.push_back(std::move(t));
    }
    for (const RowTensor& e : edits)
      if (d.tensor_index(e.name) < 0) throw Error(op_name + ": table row names '" + e.name + "', no tensor of the op");
    c.invalid = row.invalid.empty() ? table.invalid : row.invalid;
    c.unsupported = row.unsupported.empty() ? table.unsupported : row.unsupported;
    c.tolerance = row.tolerance ? *row.tolerance : table.tolerance.value_or(Tolerance{});
    c.large = row.large.value_or(table.large.value_or(false));
    c.name = !row.name.empty() ? row.name : derived_name(c, dims, row);
    if (!names.insert(c.name).second) throw Error(op_name + ": two table rows are named " + c.name);
    out.push_back(std::move(c));
  }
  return out;
}

}  // namespace ditops::optest

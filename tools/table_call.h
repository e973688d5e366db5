// A call of any op built from the op table and the CLI's flags (explain and the generic bench):
// sizes from the op's example dims, --shape and --dims; dtypes, optional tensors and options from
// flags; each present tensor placed where `place` says.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "ditops/op.h"
#include "tools/cli_common.h"

namespace ditops::cli {

// The flags table_call reads, the op's options among them (--rope-dim for rope_dim).
std::vector<std::string> table_call_flags(const OpDescription& op);
// An option's flag: its name with hyphens (the CLI reads --rope_dim as --rope-dim too).
std::string option_flag(const OptionSlot& option);

struct TableCall {
  GenericCall call;
  std::vector<std::pair<std::string, int64_t>> dims;  // the sizes used, in the order of op.dims
  std::vector<int64_t> bytes;                         // per tensor slot (0 when absent)
};

// place(slot, bytes) returns the address of a tensor of `bytes`. Outputs with an alloc rule take
// its extents (they may read options), the others their symbolic shape.
TableCall table_call(const OpDescription& op, const Args& args, Device device,
                     const std::function<void*(size_t slot, int64_t bytes)>& place);

std::vector<std::string> split(const std::string& s, char sep);

}  // namespace ditops::cli

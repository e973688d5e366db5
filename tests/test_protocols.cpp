// can_use and try_call (include/ditops/op.h): answers without running, an empty result instead of
// an exception when nothing is eligible, bad input still an error, an explicit backend strict.
#include <gtest/gtest.h>

#include <cstdlib>
#include <vector>

#include "ditops/op.h"
#include "ditops/registry.h"

namespace ditops {
namespace {

// residual_gate_add on small f32 host buffers through the generic call.
struct RgaCall {
  std::vector<float> residual = std::vector<float>(2 * 3 * 8, 1.0f), update = std::vector<float>(2 * 3 * 8, 2.0f),
                     gate = std::vector<float>(8, 0.5f), out = std::vector<float>(2 * 3 * 8, -7.0f);
  GenericCall call;
  RgaCall() {
    const OpDescription& d = op("residual_gate_add");
    call = generic_call(d);
    const Device cpu{DeviceKind::cpu, 0};
    auto set = [&](const char* name, std::vector<float>& v, std::vector<int64_t> shape) {
      const int i = d.tensor_index(name);
      call.tensors[i] = TensorView::contiguous(v.data(), DType::f32, cpu, shape);
      call.given[i] = true;
    };
    set("residual", residual, {2, 3, 8});
    set("update", update, {2, 3, 8});
    set("gate", gate, {1, 1, 8});
    set("out", out, {2, 3, 8});
  }
};

class Protocols : public ::testing::Test {
 protected:
  void TearDown() override {
    unsetenv("DITOPS_DISABLE");
    reload_config();
  }
};

TEST_F(Protocols, AValidCallIsUsableAndTryRunsIt) {
  RgaCall c;
  EXPECT_EQ(can_use("residual_gate_add", c.call), "");
  EXPECT_EQ(try_call("residual_gate_add", c.call), "residual_gate_add.reference");
  EXPECT_EQ(c.out[0], 2.0f);  // 1 + 2 * 0.5
}

TEST_F(Protocols, NothingEligibleIsAnAnswerNotAnError) {
  setenv("DITOPS_DISABLE", "residual_gate_add", 1);
  reload_config();
  RgaCall c;
  const std::string why = can_use("residual_gate_add", c.call);
  EXPECT_NE(why.find("no eligible implementation"), std::string::npos) << why;
  EXPECT_NE(why.find("residual_gate_add.reference: disabled by DITOPS_DISABLE"), std::string::npos) << why;
  EXPECT_EQ(try_call("residual_gate_add", c.call), "");
  for (float v : c.out) EXPECT_EQ(v, -7.0f);  // nothing written
  EXPECT_THROW(call("residual_gate_add", c.call), NoImplementation);
}

TEST_F(Protocols, AnExplicitBackendStaysStrict) {
  RgaCall c;
  c.call.dispatch.backend = Provenance::jit;  // CPU tensors: the jit cannot take them
  EXPECT_THROW(try_call("residual_gate_add", c.call), NoImplementation);
  for (float v : c.out) EXPECT_EQ(v, -7.0f);
}

// Every op: a call missing its tensors is a user error, through both protocols.
TEST_F(Protocols, BadInputRaisesThroughBothForEveryOp) {
  for (const OpDescription* d : op_descriptions()) {
    const GenericCall empty = generic_call(*d);
    EXPECT_THROW(can_use(d->name, empty), InvalidArgument) << d->name;
    EXPECT_THROW(try_call(d->name, empty), InvalidArgument) << d->name;
  }
  RgaCall c;
  c.gate.resize(4);
  c.call.tensors[op("residual_gate_add").tensor_index("gate")].shape[2] = 4;
  try {
    can_use("residual_gate_add", c.call);
    ADD_FAILURE() << "a gate of width 4 for width 8 was taken";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("gate.shape[2] must be 8"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace ditops

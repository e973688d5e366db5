# `pip install .` into a scratch folder, then import the installed package from outside the
# source tree and run one op on numpy arrays (the reference backend):
#   cmake -DPYTHON=... -DSOURCE_DIR=... -DWORK_DIR=... -P pip_install.cmake
file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR})
execute_process(
  COMMAND ${PYTHON} -m pip install -q --disable-pip-version-check --no-build-isolation --no-deps
          --target ${WORK_DIR}/site ${SOURCE_DIR}
  RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "pip install . failed (${rc})")
endif()
file(WRITE ${WORK_DIR}/smoke.py [=[
import numpy as np
import ditops
ops = {k["op"] for k in ditops.list_kernels()}
assert {"qknorm_rope", "residual_gate_add", "layernorm_modulate", "norm_scale_shift"} <= ops, ops
rng = np.random.default_rng(0)
r, u = (rng.standard_normal((2, 7, 64)).astype(np.float32) for _ in range(2))
g = rng.standard_normal((1, 1, 64)).astype(np.float32)
out = ditops.residual_gate_add(r, u, g)
assert np.array_equal(out, r + u * g), "residual_gate_add differs from numpy's fp32 rounding"
import importlib.util
assert importlib.util.find_spec("ditops.diffusers") is not None, "the ditops.diffusers subpackage is missing"
print("installed at", ditops.__file__, "ran", sorted(ops))
]=])
# The scratch site first; an existing PYTHONPATH stays behind it (where the environment provides
# dependencies such as tvm_ffi that way, as the GPU machine does).
set(site_path ${WORK_DIR}/site)
if(DEFINED ENV{PYTHONPATH} AND NOT "$ENV{PYTHONPATH}" STREQUAL "")
  set(site_path "${site_path}:$ENV{PYTHONPATH}")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} -E env PYTHONPATH=${site_path} ${PYTHON} ${WORK_DIR}/smoke.py
                WORKING_DIRECTORY ${WORK_DIR} RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "the installed package failed its smoke test (${rc})")
endif()

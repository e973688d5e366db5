#!/usr/bin/env bash
# The wheels a GPU machine lacks (it has PyTorch, Triton, pytest, huggingface-hub, safetensors, ...; no
# network there), fetched here into the git-ignored folders a device call carries:
#   .whl/        apache-tvm-ffi (the Python module), diffusers 0.42.1 (ditops.diffusers), importlib_metadata
#   .whl-extra/  torchao 0.18.0 (the model benches' torchao rowwise + compile variant)
# Then: run(..., carry=[".whl", ".whl-extra", ".commit", ...]) and, there, models_run.sh / device_run.sh
# install them with pip --no-index --target. Python 3.12 x86-64 wheels (the GPU image's python3).
set -euo pipefail
cd "$(dirname "$0")/../.."
grep -qx '/.whl-extra/' .git/info/exclude 2>/dev/null || echo '/.whl-extra/' >> .git/info/exclude
get() {
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform any -d "$1" "$2"
}
mkdir -p .whl .whl-extra
get .whl "apache-tvm-ffi>=0.1.15,<0.2"
get .whl "diffusers==0.42.1"
get .whl importlib_metadata
get .whl-extra "torchao==0.18.0"
git rev-parse --short HEAD > .commit
ls .whl .whl-extra

#!/usr/bin/env bash
# Fetches, on a machine with the package index, the wheels that benchmarks/gpu_check.sh needs
# on a GPU machine without one (a GPU image with JAX, flax, optax, orbax, pandas and scipy, as
# NVIDIA's and cloud images have, but not these):
#
#     benchmarks/gpu_wheels.sh [PYTHON_VERSION]     # default 3.12; into .whl/ (git-ignored)
#
# Pinned to the versions the test suite runs with; --no-deps: each one's own needs that such
# an image lacks are listed too. About 5 MB.
set -euo pipefail
cd "$(dirname "$0")/.."
version=${1:-3.12}
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$version" \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
    grain==0.2.18 array_record==0.8.6 ml-collections==1.1.0 portpicker==1.6.0 \
    tensorboardX==2.6.5
ls -l .whl

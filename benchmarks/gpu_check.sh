#!/usr/bin/env bash
# The GPU check, on one NVIDIA GPU, in under 8 minutes; no network needed:
#
#     benchmarks/gpu_check.sh [OUT_DIR]        # default runs/gpu_check
#
# writes OUT_DIR/gpu_check.json: the outcome of the test suite's gpu-marked tests (cuDNN
# attention equal to the einsums; a train step's loss equal to the CPU's in bfloat16), then
# Base and Looped :paper timed with cuDNN attention against the einsums, MoE :paper with
# dropless against capacity dispatch, each with its MaxText-convention MFU, memory, and XLA's
# estimated step time beside the measured one (loopscale/bench/gpu.py says how).
#
# Python: $PY, else .venv/bin/python, else python3; packages it lacks travel as wheels in .whl/
# (benchmarks/gpu_python.sh says how).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-runs/gpu_check}
mkdir -p "$out"
source benchmarks/gpu_python.sh  # $py, PYTHONPATH, carried wheels
"$py" -c "import jax; print('gpu_check:', jax.__version__, jax.devices())" || exit 2
# The tests' verdict goes into the JSON; the timings run whatever it is.
LOOPSCALE_TEST_GPU=1 "$py" -m pytest -q -p no:cacheprovider --junitxml="$out/gpu_tests.xml" \
    tests/test_attention_core.py tests/test_gpu.py
"$py" -m loopscale.bench.gpu --out="$out/gpu_check.json" --tests="$out/gpu_tests.xml" \
    "${@:2}"

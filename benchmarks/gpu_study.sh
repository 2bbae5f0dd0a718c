#!/usr/bin/env bash
# The permutation study's headline pair (PAPERS.md section 3) on one NVIDIA GPU, in at most
# about 6 minutes; no network needed. Run benchmarks/gpu_check.sh first, this one if GPU time
# remains:
#
#     benchmarks/gpu_study.sh [OUT_DIR]        # default runs/gpu_study
#
# Looped 4x8 against unshared 32 layers at the paper sweep's settings (sweeps/permutation.py
# :paper: 16 nodes, 8 hops, width 256, batch 64, learning rate 1e-3, no intermediate
# supervision), three seeds each: six runs side by side on the one GPU (each process holds
# a slice of its memory), each measured as it completes with `accuracy,lens`. Then
# analysis/permutation.py writes the success table and the lens ladders to RESULTS (default
# analysis/results/permutation_gpu/). What it should show, if the study holds: looped 4x8
# solves the task with every seed, unshared 32 does not at this learning rate.
#
# Fewer steps than the paper's 20,000, so that six runs fit the time: STEPS (default 3000,
# chosen before any run from an assumed ~10 ms a step, not a measured one: no GPU has run it;
# study.json, beside the report and in OUT_DIR, says how many). The sweep stops
# after BUDGET_S seconds (default 330) whatever is done; running the script again resumes it,
# and the analysis names the runs that have no measurement yet.
#
# ARG=tiny SEEDS='(0,)' STEPS=20 CONCURRENCY=1 run the same commands at the CPU smoke-test
# size (tests/test_gpu.py does). Python and wheels: benchmarks/gpu_python.sh.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-runs/gpu_study}
results=${RESULTS:-analysis/results/permutation_gpu}
arg=${ARG:-paper}
steps=${STEPS:-3000}
seeds=${SEEDS:-(0, 1, 2)}
concurrency=${CONCURRENCY:-6}
budget=${BUDGET_S:-330}
mkdir -p "$out" "$results"
source benchmarks/gpu_python.sh  # $py, PYTHONPATH, carried wheels
backend=$("$py" -c "import jax; print(jax.default_backend())") || exit 2
echo "gpu_study: $arg, $steps steps, seeds $seeds, on $backend"
start=$(date +%s)
# Six small runs share one GPU: each process takes a slice of its memory rather than the 75%
# JAX preallocates by default (which would leave the second process none).
timeout "$budget" "$py" -m loopscale.cli sweep --sweep="sweeps/permutation.py:$arg" \
    "--sweep.lrs=(0.001,)" "--sweep.grid.train.intermediate_supervision=(False,)" \
    "--sweep.seeds=$seeds" "--sweep.steps=$steps" --sweep.measure=accuracy,lens \
    --workdir="$out/sweep" --concurrency="$concurrency" \
    --env=XLA_PYTHON_CLIENT_MEM_FRACTION=0.14
sweep_status=$?
elapsed=$(( $(date +%s) - start ))
"$py" analysis/permutation.py --workdir="$out/sweep" --out="$results" || exit 2
printf '{"arg": "%s", "steps": %d, "seeds": "%s", "backend": "%s", "sweep_exit": %d, "sweep_s": %d}\n' \
    "$arg" "$steps" "$seeds" "$backend" "$sweep_status" "$elapsed" > "$out/study.json"
cp "$out/study.json" "$results/study.json"
echo "gpu_study: sweep exit $sweep_status after $elapsed s; report in $results/report.md"

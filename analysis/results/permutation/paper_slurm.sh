#!/usr/bin/env bash
#SBATCH --job-name=loopscale-permutation
#SBATCH --array=0-35
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --time=24:00:00
#SBATCH --output=slurm-%x-%A_%a.out
# loopscale sweep permutation: 36 runs into gs://BUCKET/perm
# One array task per run, one `loopscale train` per node:
#   sbatch slurm.sh
# Written by `loopscale sweep --launcher`. Running it again resumes: `loopscale train` skips
# completed and diverged runs and resumes interrupted ones from their checkpoints.

set -euo pipefail
REPO="${REPO:-~/loopscale}"
LOOPSCALE="${LOOPSCALE:-loopscale}"
export JAX_COMPILATION_CACHE_DIR=gs://BUCKET/perm/jax_cache

case "${SLURM_ARRAY_TASK_ID:?submit this script with sbatch}" in
  0) RUN_ID=2d1bc821c348  # looped budget=- d_model=256
     ARGS=(--config=experiments/permutation.py:paper --config.name=looped --config.train.intermediate_supervision=False --config.train.lr=0.001 --config.seed=0 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/2d1bc821c348 --eval=accuracy,lens,probes,patching) ;;
  1) RUN_ID=779da847c5c9  # looped budget=- d_model=256
     ARGS=(--config=experiments/permutation.py:paper --config.name=looped --config.train.intermediate_supervision=False --config.train.lr=0.001 --config.seed=1 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/779da847c5c9 --eval=accuracy,lens,probes,patching) ;;
  2) RUN_ID=2fbe1a1c1025  # looped budget=- d_model=256
     ARGS=(--config=experiments/permutation.py:paper --config.name=looped --config.train.intermediate_supervision=False --config.train.lr=0.001 --config.seed=2 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/2fbe1a1c1025 --eval=accuracy,lens,probes,patching) ;;
  3) RUN_ID=9fafc972dde6  # looped budget=- d_model=256
     ARGS=(--config=experiments/permutation.py:paper --config.name=looped --config.train.intermediate_supervision=False --config.train.lr=0.0003 --config.seed=0 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/9fafc972dde6 --eval=accuracy,lens,probes,patching) ;;
  4) RUN_ID=ab6d85950177  # looped budget=- d_model=256
     ARGS=(--config=experiments/permutation.py:paper --config.name=looped --config.train.intermediate_supervision=False --config.train.lr=0.0003 --config.seed=1 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/ab6d85950177 --eval=accuracy,lens,probes,patching) ;;
  5) RUN_ID=d91f24ba1357  # looped budget=- d_model=256
     ARGS=(--config=experiments/permutation.py:paper --config.name=looped --config.train.intermediate_supervision=False --config.train.lr=0.0003 --config.seed=2 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/d91f24ba1357 --eval=accuracy,lens,probes,patching) ;;
  6) RUN_ID=59f379ef401b  # looped budget=- d_model=256
     ARGS=(--config=experiments/permutation.py:paper --config.name=looped --config.train.intermediate_supervision=False --config.train.lr=0.0001 --config.seed=0 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/59f379ef401b --eval=accuracy,lens,probes,patching) ;;
  7) RUN_ID=80d25886dbf2  # looped budget=- d_model=256
     ARGS=(--config=experiments/permutation.py:paper --config.name=looped --config.train.intermediate_supervision=False --config.train.lr=0.0001 --config.seed=1 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/80d25886dbf2 --eval=accuracy,lens,probes,patching) ;;
  8) RUN_ID=277b3da8adc6  # looped budget=- d_model=256
     ARGS=(--config=experiments/permutation.py:paper --config.name=looped --config.train.intermediate_supervision=False --config.train.lr=0.0001 --config.seed=2 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/277b3da8adc6 --eval=accuracy,lens,probes,patching) ;;
  9) RUN_ID=f0f1d019e122  # looped budget=- d_model=256
     ARGS=(--config=experiments/permutation.py:paper --config.name=looped --config.train.intermediate_supervision=True --config.train.lr=0.001 --config.seed=0 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/f0f1d019e122 --eval=accuracy,lens,probes,patching) ;;
  10) RUN_ID=59a2b565eca8  # looped budget=- d_model=256
     ARGS=(--config=experiments/permutation.py:paper --config.name=looped --config.train.intermediate_supervision=True --config.train.lr=0.001 --config.seed=1 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/59a2b565eca8 --eval=accuracy,lens,probes,patching) ;;
  11) RUN_ID=018b64e8c3d1  # looped budget=- d_model=256
     ARGS=(--config=experiments/permutation.py:paper --config.name=looped --config.train.intermediate_supervision=True --config.train.lr=0.001 --config.seed=2 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/018b64e8c3d1 --eval=accuracy,lens,probes,patching) ;;
  12) RUN_ID=4217970ea2be  # looped budget=- d_model=256
     ARGS=(--config=experiments/permutation.py:paper --config.name=looped --config.train.intermediate_supervision=True --config.train.lr=0.0003 --config.seed=0 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/4217970ea2be --eval=accuracy,lens,probes,patching) ;;
  13) RUN_ID=03a5b722707d  # looped budget=- d_model=256
     ARGS=(--config=experiments/permutation.py:paper --config.name=looped --config.train.intermediate_supervision=True --config.train.lr=0.0003 --config.seed=1 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/03a5b722707d --eval=accuracy,lens,probes,patching) ;;
  14) RUN_ID=849c0f34eb7c  # looped budget=- d_model=256
     ARGS=(--config=experiments/permutation.py:paper --config.name=looped --config.train.intermediate_supervision=True --config.train.lr=0.0003 --config.seed=2 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/849c0f34eb7c --eval=accuracy,lens,probes,patching) ;;
  15) RUN_ID=509b8d49869c  # looped budget=- d_model=256
     ARGS=(--config=experiments/permutation.py:paper --config.name=looped --config.train.intermediate_supervision=True --config.train.lr=0.0001 --config.seed=0 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/509b8d49869c --eval=accuracy,lens,probes,patching) ;;
  16) RUN_ID=ce168ff7f81c  # looped budget=- d_model=256
     ARGS=(--config=experiments/permutation.py:paper --config.name=looped --config.train.intermediate_supervision=True --config.train.lr=0.0001 --config.seed=1 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/ce168ff7f81c --eval=accuracy,lens,probes,patching) ;;
  17) RUN_ID=4e0769f1b467  # looped budget=- d_model=256
     ARGS=(--config=experiments/permutation.py:paper --config.name=looped --config.train.intermediate_supervision=True --config.train.lr=0.0001 --config.seed=2 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/4e0769f1b467 --eval=accuracy,lens,probes,patching) ;;
  18) RUN_ID=9d40b6533294  # unshared budget=- d_model=256
     ARGS=(--config=experiments/permutation.py:paper --config.model.n_loops=1 --config.model.n_unique=32 --config.name=unshared --config.train.intermediate_supervision=False --config.train.lr=0.001 --config.seed=0 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/9d40b6533294 --eval=accuracy,lens,probes,patching) ;;
  19) RUN_ID=9f9d74abcf41  # unshared budget=- d_model=256
     ARGS=(--config=experiments/permutation.py:paper --config.model.n_loops=1 --config.model.n_unique=32 --config.name=unshared --config.train.intermediate_supervision=False --config.train.lr=0.001 --config.seed=1 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/9f9d74abcf41 --eval=accuracy,lens,probes,patching) ;;
  20) RUN_ID=511365126477  # unshared budget=- d_model=256
     ARGS=(--config=experiments/permutation.py:paper --config.model.n_loops=1 --config.model.n_unique=32 --config.name=unshared --config.train.intermediate_supervision=False --config.train.lr=0.001 --config.seed=2 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/511365126477 --eval=accuracy,lens,probes,patching) ;;
  21) RUN_ID=5b8585d52674  # unshared budget=- d_model=256
     ARGS=(--config=experiments/permutation.py:paper --config.model.n_loops=1 --config.model.n_unique=32 --config.name=unshared --config.train.intermediate_supervision=False --config.train.lr=0.0003 --config.seed=0 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/5b8585d52674 --eval=accuracy,lens,probes,patching) ;;
  22) RUN_ID=237a605adb9f  # unshared budget=- d_model=256
     ARGS=(--config=experiments/permutation.py:paper --config.model.n_loops=1 --config.model.n_unique=32 --config.name=unshared --config.train.intermediate_supervision=False --config.train.lr=0.0003 --config.seed=1 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/237a605adb9f --eval=accuracy,lens,probes,patching) ;;
  23) RUN_ID=ba2d2ac29541  # unshared budget=- d_model=256
     ARGS=(--config=experiments/permutation.py:paper --config.model.n_loops=1 --config.model.n_unique=32 --config.name=unshared --config.train.intermediate_supervision=False --config.train.lr=0.0003 --config.seed=2 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/ba2d2ac29541 --eval=accuracy,lens,probes,patching) ;;
  24) RUN_ID=b69bb6d9630e  # unshared budget=- d_model=256
     ARGS=(--config=experiments/permutation.py:paper --config.model.n_loops=1 --config.model.n_unique=32 --config.name=unshared --config.train.intermediate_supervision=False --config.train.lr=0.0001 --config.seed=0 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/b69bb6d9630e --eval=accuracy,lens,probes,patching) ;;
  25) RUN_ID=50dffbf863bf  # unshared budget=- d_model=256
     ARGS=(--config=experiments/permutation.py:paper --config.model.n_loops=1 --config.model.n_unique=32 --config.name=unshared --config.train.intermediate_supervision=False --config.train.lr=0.0001 --config.seed=1 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/50dffbf863bf --eval=accuracy,lens,probes,patching) ;;
  26) RUN_ID=b66001a8c551  # unshared budget=- d_model=256
     ARGS=(--config=experiments/permutation.py:paper --config.model.n_loops=1 --config.model.n_unique=32 --config.name=unshared --config.train.intermediate_supervision=False --config.train.lr=0.0001 --config.seed=2 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/b66001a8c551 --eval=accuracy,lens,probes,patching) ;;
  27) RUN_ID=fd9305853683  # unshared budget=- d_model=256
     ARGS=(--config=experiments/permutation.py:paper --config.model.n_loops=1 --config.model.n_unique=32 --config.name=unshared --config.train.intermediate_supervision=True --config.train.lr=0.001 --config.seed=0 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/fd9305853683 --eval=accuracy,lens,probes,patching) ;;
  28) RUN_ID=9dcac8555d51  # unshared budget=- d_model=256
     ARGS=(--config=experiments/permutation.py:paper --config.model.n_loops=1 --config.model.n_unique=32 --config.name=unshared --config.train.intermediate_supervision=True --config.train.lr=0.001 --config.seed=1 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/9dcac8555d51 --eval=accuracy,lens,probes,patching) ;;
  29) RUN_ID=67849548fcc0  # unshared budget=- d_model=256
     ARGS=(--config=experiments/permutation.py:paper --config.model.n_loops=1 --config.model.n_unique=32 --config.name=unshared --config.train.intermediate_supervision=True --config.train.lr=0.001 --config.seed=2 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/67849548fcc0 --eval=accuracy,lens,probes,patching) ;;
  30) RUN_ID=37c262e1c345  # unshared budget=- d_model=256
     ARGS=(--config=experiments/permutation.py:paper --config.model.n_loops=1 --config.model.n_unique=32 --config.name=unshared --config.train.intermediate_supervision=True --config.train.lr=0.0003 --config.seed=0 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/37c262e1c345 --eval=accuracy,lens,probes,patching) ;;
  31) RUN_ID=8fc807ebf1b8  # unshared budget=- d_model=256
     ARGS=(--config=experiments/permutation.py:paper --config.model.n_loops=1 --config.model.n_unique=32 --config.name=unshared --config.train.intermediate_supervision=True --config.train.lr=0.0003 --config.seed=1 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/8fc807ebf1b8 --eval=accuracy,lens,probes,patching) ;;
  32) RUN_ID=d842850efdc4  # unshared budget=- d_model=256
     ARGS=(--config=experiments/permutation.py:paper --config.model.n_loops=1 --config.model.n_unique=32 --config.name=unshared --config.train.intermediate_supervision=True --config.train.lr=0.0003 --config.seed=2 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/d842850efdc4 --eval=accuracy,lens,probes,patching) ;;
  33) RUN_ID=284a926e18fc  # unshared budget=- d_model=256
     ARGS=(--config=experiments/permutation.py:paper --config.model.n_loops=1 --config.model.n_unique=32 --config.name=unshared --config.train.intermediate_supervision=True --config.train.lr=0.0001 --config.seed=0 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/284a926e18fc --eval=accuracy,lens,probes,patching) ;;
  34) RUN_ID=bb6a465247f6  # unshared budget=- d_model=256
     ARGS=(--config=experiments/permutation.py:paper --config.model.n_loops=1 --config.model.n_unique=32 --config.name=unshared --config.train.intermediate_supervision=True --config.train.lr=0.0001 --config.seed=1 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/bb6a465247f6 --eval=accuracy,lens,probes,patching) ;;
  35) RUN_ID=14ad0ed16604  # unshared budget=- d_model=256
     ARGS=(--config=experiments/permutation.py:paper --config.model.n_loops=1 --config.model.n_unique=32 --config.name=unshared --config.train.intermediate_supervision=True --config.train.lr=0.0001 --config.seed=2 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/14ad0ed16604 --eval=accuracy,lens,probes,patching) ;;
  *) echo "no run for array task $SLURM_ARRAY_TASK_ID" >&2; exit 2 ;;
esac

# jax.distributed: process 0 on the allocation's first node; one process per node.
# awk reads the whole list: `head -n 1` would close the pipe early, and under
# pipefail scontrol's SIGPIPE (status 141) would fail the task.
head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | awk 'NR == 1')
export JAX_COORDINATOR_ADDRESS="$head_node:$((12000 + SLURM_JOB_ID % 20000))"
export JAX_NUM_PROCESSES="$SLURM_NNODES"
cd "${REPO/#\~/$HOME}"  # a leading ~ is not expanded inside quotes
echo "==> $RUN_ID on $SLURM_NNODES node(s)"
rc=0
srun --ntasks="$SLURM_NNODES" --ntasks-per-node=1 bash -c 'JAX_PROCESS_ID=$SLURM_PROCID exec "$@"' _ $LOOPSCALE train "${ARGS[@]}" || rc=$?
# 3: diverged, a result like any other.
if [ "$rc" -eq 3 ]; then exit 0; fi
exit "$rc"

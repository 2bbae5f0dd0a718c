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

case "${SLURM_ARRAY_TASK_ID:?submit this script with sbatch}" in
  0) RUN_ID=36603e93f65e  # looped budget=- d_model=256
     ARGS=(--config=experiments/permutation.py:paper --config.name=looped --config.train.intermediate_supervision=False --config.train.lr=0.001 --config.seed=0 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/36603e93f65e --eval=accuracy,lens,probes,patching) ;;
  1) RUN_ID=4d9eac1aaf44  # looped budget=- d_model=256
     ARGS=(--config=experiments/permutation.py:paper --config.name=looped --config.train.intermediate_supervision=False --config.train.lr=0.001 --config.seed=1 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/4d9eac1aaf44 --eval=accuracy,lens,probes,patching) ;;
  2) RUN_ID=3c908861e8a5  # looped budget=- d_model=256
     ARGS=(--config=experiments/permutation.py:paper --config.name=looped --config.train.intermediate_supervision=False --config.train.lr=0.001 --config.seed=2 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/3c908861e8a5 --eval=accuracy,lens,probes,patching) ;;
  3) RUN_ID=722ff8618ea5  # looped budget=- d_model=256
     ARGS=(--config=experiments/permutation.py:paper --config.name=looped --config.train.intermediate_supervision=False --config.train.lr=0.0003 --config.seed=0 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/722ff8618ea5 --eval=accuracy,lens,probes,patching) ;;
  4) RUN_ID=95d55e8ae533  # looped budget=- d_model=256
     ARGS=(--config=experiments/permutation.py:paper --config.name=looped --config.train.intermediate_supervision=False --config.train.lr=0.0003 --config.seed=1 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/95d55e8ae533 --eval=accuracy,lens,probes,patching) ;;
  5) RUN_ID=7ee85cd961af  # looped budget=- d_model=256
     ARGS=(--config=experiments/permutation.py:paper --config.name=looped --config.train.intermediate_supervision=False --config.train.lr=0.0003 --config.seed=2 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/7ee85cd961af --eval=accuracy,lens,probes,patching) ;;
  6) RUN_ID=880298fb0210  # looped budget=- d_model=256
     ARGS=(--config=experiments/permutation.py:paper --config.name=looped --config.train.intermediate_supervision=False --config.train.lr=0.0001 --config.seed=0 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/880298fb0210 --eval=accuracy,lens,probes,patching) ;;
  7) RUN_ID=e53a3cb3b533  # looped budget=- d_model=256
     ARGS=(--config=experiments/permutation.py:paper --config.name=looped --config.train.intermediate_supervision=False --config.train.lr=0.0001 --config.seed=1 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/e53a3cb3b533 --eval=accuracy,lens,probes,patching) ;;
  8) RUN_ID=f68a2417bbd9  # looped budget=- d_model=256
     ARGS=(--config=experiments/permutation.py:paper --config.name=looped --config.train.intermediate_supervision=False --config.train.lr=0.0001 --config.seed=2 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/f68a2417bbd9 --eval=accuracy,lens,probes,patching) ;;
  9) RUN_ID=0f99a3dc6d20  # looped budget=- d_model=256
     ARGS=(--config=experiments/permutation.py:paper --config.name=looped --config.train.intermediate_supervision=True --config.train.lr=0.001 --config.seed=0 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/0f99a3dc6d20 --eval=accuracy,lens,probes,patching) ;;
  10) RUN_ID=134305bd5c27  # looped budget=- d_model=256
     ARGS=(--config=experiments/permutation.py:paper --config.name=looped --config.train.intermediate_supervision=True --config.train.lr=0.001 --config.seed=1 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/134305bd5c27 --eval=accuracy,lens,probes,patching) ;;
  11) RUN_ID=568b768d4964  # looped budget=- d_model=256
     ARGS=(--config=experiments/permutation.py:paper --config.name=looped --config.train.intermediate_supervision=True --config.train.lr=0.001 --config.seed=2 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/568b768d4964 --eval=accuracy,lens,probes,patching) ;;
  12) RUN_ID=2bb04b64b276  # looped budget=- d_model=256
     ARGS=(--config=experiments/permutation.py:paper --config.name=looped --config.train.intermediate_supervision=True --config.train.lr=0.0003 --config.seed=0 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/2bb04b64b276 --eval=accuracy,lens,probes,patching) ;;
  13) RUN_ID=dab1eaa5317b  # looped budget=- d_model=256
     ARGS=(--config=experiments/permutation.py:paper --config.name=looped --config.train.intermediate_supervision=True --config.train.lr=0.0003 --config.seed=1 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/dab1eaa5317b --eval=accuracy,lens,probes,patching) ;;
  14) RUN_ID=748784e44787  # looped budget=- d_model=256
     ARGS=(--config=experiments/permutation.py:paper --config.name=looped --config.train.intermediate_supervision=True --config.train.lr=0.0003 --config.seed=2 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/748784e44787 --eval=accuracy,lens,probes,patching) ;;
  15) RUN_ID=7c324372c49e  # looped budget=- d_model=256
     ARGS=(--config=experiments/permutation.py:paper --config.name=looped --config.train.intermediate_supervision=True --config.train.lr=0.0001 --config.seed=0 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/7c324372c49e --eval=accuracy,lens,probes,patching) ;;
  16) RUN_ID=67bce62e5199  # looped budget=- d_model=256
     ARGS=(--config=experiments/permutation.py:paper --config.name=looped --config.train.intermediate_supervision=True --config.train.lr=0.0001 --config.seed=1 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/67bce62e5199 --eval=accuracy,lens,probes,patching) ;;
  17) RUN_ID=c831b98a2513  # looped budget=- d_model=256
     ARGS=(--config=experiments/permutation.py:paper --config.name=looped --config.train.intermediate_supervision=True --config.train.lr=0.0001 --config.seed=2 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/c831b98a2513 --eval=accuracy,lens,probes,patching) ;;
  18) RUN_ID=2f27499d1f53  # unshared budget=- d_model=256
     ARGS=(--config=experiments/permutation.py:paper --config.model.n_loops=1 --config.model.n_unique=32 --config.name=unshared --config.train.intermediate_supervision=False --config.train.lr=0.001 --config.seed=0 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/2f27499d1f53 --eval=accuracy,lens,probes,patching) ;;
  19) RUN_ID=8c37324e1ee6  # unshared budget=- d_model=256
     ARGS=(--config=experiments/permutation.py:paper --config.model.n_loops=1 --config.model.n_unique=32 --config.name=unshared --config.train.intermediate_supervision=False --config.train.lr=0.001 --config.seed=1 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/8c37324e1ee6 --eval=accuracy,lens,probes,patching) ;;
  20) RUN_ID=aebb44cfbf1f  # unshared budget=- d_model=256
     ARGS=(--config=experiments/permutation.py:paper --config.model.n_loops=1 --config.model.n_unique=32 --config.name=unshared --config.train.intermediate_supervision=False --config.train.lr=0.001 --config.seed=2 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/aebb44cfbf1f --eval=accuracy,lens,probes,patching) ;;
  21) RUN_ID=49a8d5bc5a51  # unshared budget=- d_model=256
     ARGS=(--config=experiments/permutation.py:paper --config.model.n_loops=1 --config.model.n_unique=32 --config.name=unshared --config.train.intermediate_supervision=False --config.train.lr=0.0003 --config.seed=0 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/49a8d5bc5a51 --eval=accuracy,lens,probes,patching) ;;
  22) RUN_ID=d2b28dcdde53  # unshared budget=- d_model=256
     ARGS=(--config=experiments/permutation.py:paper --config.model.n_loops=1 --config.model.n_unique=32 --config.name=unshared --config.train.intermediate_supervision=False --config.train.lr=0.0003 --config.seed=1 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/d2b28dcdde53 --eval=accuracy,lens,probes,patching) ;;
  23) RUN_ID=549eab5dfbdf  # unshared budget=- d_model=256
     ARGS=(--config=experiments/permutation.py:paper --config.model.n_loops=1 --config.model.n_unique=32 --config.name=unshared --config.train.intermediate_supervision=False --config.train.lr=0.0003 --config.seed=2 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/549eab5dfbdf --eval=accuracy,lens,probes,patching) ;;
  24) RUN_ID=67814e179e9e  # unshared budget=- d_model=256
     ARGS=(--config=experiments/permutation.py:paper --config.model.n_loops=1 --config.model.n_unique=32 --config.name=unshared --config.train.intermediate_supervision=False --config.train.lr=0.0001 --config.seed=0 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/67814e179e9e --eval=accuracy,lens,probes,patching) ;;
  25) RUN_ID=97ef2744a302  # unshared budget=- d_model=256
     ARGS=(--config=experiments/permutation.py:paper --config.model.n_loops=1 --config.model.n_unique=32 --config.name=unshared --config.train.intermediate_supervision=False --config.train.lr=0.0001 --config.seed=1 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/97ef2744a302 --eval=accuracy,lens,probes,patching) ;;
  26) RUN_ID=a17973ac23bd  # unshared budget=- d_model=256
     ARGS=(--config=experiments/permutation.py:paper --config.model.n_loops=1 --config.model.n_unique=32 --config.name=unshared --config.train.intermediate_supervision=False --config.train.lr=0.0001 --config.seed=2 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/a17973ac23bd --eval=accuracy,lens,probes,patching) ;;
  27) RUN_ID=881e7ca4ea20  # unshared budget=- d_model=256
     ARGS=(--config=experiments/permutation.py:paper --config.model.n_loops=1 --config.model.n_unique=32 --config.name=unshared --config.train.intermediate_supervision=True --config.train.lr=0.001 --config.seed=0 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/881e7ca4ea20 --eval=accuracy,lens,probes,patching) ;;
  28) RUN_ID=30ac74d908ba  # unshared budget=- d_model=256
     ARGS=(--config=experiments/permutation.py:paper --config.model.n_loops=1 --config.model.n_unique=32 --config.name=unshared --config.train.intermediate_supervision=True --config.train.lr=0.001 --config.seed=1 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/30ac74d908ba --eval=accuracy,lens,probes,patching) ;;
  29) RUN_ID=7447a512a3fe  # unshared budget=- d_model=256
     ARGS=(--config=experiments/permutation.py:paper --config.model.n_loops=1 --config.model.n_unique=32 --config.name=unshared --config.train.intermediate_supervision=True --config.train.lr=0.001 --config.seed=2 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/7447a512a3fe --eval=accuracy,lens,probes,patching) ;;
  30) RUN_ID=1933478f6eec  # unshared budget=- d_model=256
     ARGS=(--config=experiments/permutation.py:paper --config.model.n_loops=1 --config.model.n_unique=32 --config.name=unshared --config.train.intermediate_supervision=True --config.train.lr=0.0003 --config.seed=0 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/1933478f6eec --eval=accuracy,lens,probes,patching) ;;
  31) RUN_ID=0f20f1d5f1b0  # unshared budget=- d_model=256
     ARGS=(--config=experiments/permutation.py:paper --config.model.n_loops=1 --config.model.n_unique=32 --config.name=unshared --config.train.intermediate_supervision=True --config.train.lr=0.0003 --config.seed=1 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/0f20f1d5f1b0 --eval=accuracy,lens,probes,patching) ;;
  32) RUN_ID=2fe4c1995389  # unshared budget=- d_model=256
     ARGS=(--config=experiments/permutation.py:paper --config.model.n_loops=1 --config.model.n_unique=32 --config.name=unshared --config.train.intermediate_supervision=True --config.train.lr=0.0003 --config.seed=2 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/2fe4c1995389 --eval=accuracy,lens,probes,patching) ;;
  33) RUN_ID=bca71aa28a6e  # unshared budget=- d_model=256
     ARGS=(--config=experiments/permutation.py:paper --config.model.n_loops=1 --config.model.n_unique=32 --config.name=unshared --config.train.intermediate_supervision=True --config.train.lr=0.0001 --config.seed=0 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/bca71aa28a6e --eval=accuracy,lens,probes,patching) ;;
  34) RUN_ID=0aac9db0a123  # unshared budget=- d_model=256
     ARGS=(--config=experiments/permutation.py:paper --config.model.n_loops=1 --config.model.n_unique=32 --config.name=unshared --config.train.intermediate_supervision=True --config.train.lr=0.0001 --config.seed=1 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/0aac9db0a123 --eval=accuracy,lens,probes,patching) ;;
  35) RUN_ID=6118f0296667  # unshared budget=- d_model=256
     ARGS=(--config=experiments/permutation.py:paper --config.model.n_loops=1 --config.model.n_unique=32 --config.name=unshared --config.train.intermediate_supervision=True --config.train.lr=0.0001 --config.seed=2 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/6118f0296667 --eval=accuracy,lens,probes,patching) ;;
  *) echo "no run for array task $SLURM_ARRAY_TASK_ID" >&2; exit 2 ;;
esac

# jax.distributed: process 0 on the allocation's first node; one process per node.
# awk reads the whole list: `head -n 1` would close the pipe early, and under
# pipefail scontrol's SIGPIPE (status 141) would fail the task.
head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | awk 'NR == 1')
export JAX_COORDINATOR_ADDRESS="$head_node:$((12000 + SLURM_JOB_ID % 20000))"
export JAX_NUM_PROCESSES="$SLURM_NNODES"
export JAX_COMPILATION_CACHE_DIR=gs://BUCKET/perm/jax_cache
cd "${REPO/#\~/$HOME}"  # a leading ~ is not expanded inside quotes
echo "==> $RUN_ID on $SLURM_NNODES node(s)"
rc=0
srun --ntasks="$SLURM_NNODES" --ntasks-per-node=1 bash -c 'JAX_PROCESS_ID=$SLURM_PROCID exec "$@"' _ $LOOPSCALE train "${ARGS[@]}" || rc=$?
# 3: diverged, a result like any other.
if [ "$rc" -eq 3 ]; then exit 0; fi
exit "$rc"

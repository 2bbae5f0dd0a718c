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
  0) RUN_ID=c982c1f1f564  # looped budget=- d_model=256
     ARGS=(--config=experiments/permutation.py:paper --config.name=looped --config.train.intermediate_supervision=False --config.train.lr=0.001 --config.seed=0 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/c982c1f1f564 --eval=accuracy,lens,probes,patching) ;;
  1) RUN_ID=72ccc81158fe  # looped budget=- d_model=256
     ARGS=(--config=experiments/permutation.py:paper --config.name=looped --config.train.intermediate_supervision=False --config.train.lr=0.001 --config.seed=1 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/72ccc81158fe --eval=accuracy,lens,probes,patching) ;;
  2) RUN_ID=69adc80f0d28  # looped budget=- d_model=256
     ARGS=(--config=experiments/permutation.py:paper --config.name=looped --config.train.intermediate_supervision=False --config.train.lr=0.001 --config.seed=2 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/69adc80f0d28 --eval=accuracy,lens,probes,patching) ;;
  3) RUN_ID=23aae461b6c5  # looped budget=- d_model=256
     ARGS=(--config=experiments/permutation.py:paper --config.name=looped --config.train.intermediate_supervision=False --config.train.lr=0.0003 --config.seed=0 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/23aae461b6c5 --eval=accuracy,lens,probes,patching) ;;
  4) RUN_ID=f8e9e6ee0247  # looped budget=- d_model=256
     ARGS=(--config=experiments/permutation.py:paper --config.name=looped --config.train.intermediate_supervision=False --config.train.lr=0.0003 --config.seed=1 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/f8e9e6ee0247 --eval=accuracy,lens,probes,patching) ;;
  5) RUN_ID=a6bbb95f9634  # looped budget=- d_model=256
     ARGS=(--config=experiments/permutation.py:paper --config.name=looped --config.train.intermediate_supervision=False --config.train.lr=0.0003 --config.seed=2 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/a6bbb95f9634 --eval=accuracy,lens,probes,patching) ;;
  6) RUN_ID=ded9b69471b6  # looped budget=- d_model=256
     ARGS=(--config=experiments/permutation.py:paper --config.name=looped --config.train.intermediate_supervision=False --config.train.lr=0.0001 --config.seed=0 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/ded9b69471b6 --eval=accuracy,lens,probes,patching) ;;
  7) RUN_ID=524a5b835dd2  # looped budget=- d_model=256
     ARGS=(--config=experiments/permutation.py:paper --config.name=looped --config.train.intermediate_supervision=False --config.train.lr=0.0001 --config.seed=1 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/524a5b835dd2 --eval=accuracy,lens,probes,patching) ;;
  8) RUN_ID=0569a1cd5de4  # looped budget=- d_model=256
     ARGS=(--config=experiments/permutation.py:paper --config.name=looped --config.train.intermediate_supervision=False --config.train.lr=0.0001 --config.seed=2 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/0569a1cd5de4 --eval=accuracy,lens,probes,patching) ;;
  9) RUN_ID=edb9432ed5fc  # looped budget=- d_model=256
     ARGS=(--config=experiments/permutation.py:paper --config.name=looped --config.train.intermediate_supervision=True --config.train.lr=0.001 --config.seed=0 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/edb9432ed5fc --eval=accuracy,lens,probes,patching) ;;
  10) RUN_ID=f949f310d708  # looped budget=- d_model=256
     ARGS=(--config=experiments/permutation.py:paper --config.name=looped --config.train.intermediate_supervision=True --config.train.lr=0.001 --config.seed=1 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/f949f310d708 --eval=accuracy,lens,probes,patching) ;;
  11) RUN_ID=d809c222b0c8  # looped budget=- d_model=256
     ARGS=(--config=experiments/permutation.py:paper --config.name=looped --config.train.intermediate_supervision=True --config.train.lr=0.001 --config.seed=2 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/d809c222b0c8 --eval=accuracy,lens,probes,patching) ;;
  12) RUN_ID=d4cb326371a0  # looped budget=- d_model=256
     ARGS=(--config=experiments/permutation.py:paper --config.name=looped --config.train.intermediate_supervision=True --config.train.lr=0.0003 --config.seed=0 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/d4cb326371a0 --eval=accuracy,lens,probes,patching) ;;
  13) RUN_ID=09988cb8d540  # looped budget=- d_model=256
     ARGS=(--config=experiments/permutation.py:paper --config.name=looped --config.train.intermediate_supervision=True --config.train.lr=0.0003 --config.seed=1 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/09988cb8d540 --eval=accuracy,lens,probes,patching) ;;
  14) RUN_ID=e43dc4603cea  # looped budget=- d_model=256
     ARGS=(--config=experiments/permutation.py:paper --config.name=looped --config.train.intermediate_supervision=True --config.train.lr=0.0003 --config.seed=2 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/e43dc4603cea --eval=accuracy,lens,probes,patching) ;;
  15) RUN_ID=35fff66f79b2  # looped budget=- d_model=256
     ARGS=(--config=experiments/permutation.py:paper --config.name=looped --config.train.intermediate_supervision=True --config.train.lr=0.0001 --config.seed=0 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/35fff66f79b2 --eval=accuracy,lens,probes,patching) ;;
  16) RUN_ID=f5557a535eaa  # looped budget=- d_model=256
     ARGS=(--config=experiments/permutation.py:paper --config.name=looped --config.train.intermediate_supervision=True --config.train.lr=0.0001 --config.seed=1 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/f5557a535eaa --eval=accuracy,lens,probes,patching) ;;
  17) RUN_ID=0408ce990453  # looped budget=- d_model=256
     ARGS=(--config=experiments/permutation.py:paper --config.name=looped --config.train.intermediate_supervision=True --config.train.lr=0.0001 --config.seed=2 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/0408ce990453 --eval=accuracy,lens,probes,patching) ;;
  18) RUN_ID=4b35130ec8e1  # unshared budget=- d_model=256
     ARGS=(--config=experiments/permutation.py:paper --config.model.n_loops=1 --config.model.n_unique=32 --config.name=unshared --config.train.intermediate_supervision=False --config.train.lr=0.001 --config.seed=0 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/4b35130ec8e1 --eval=accuracy,lens,probes,patching) ;;
  19) RUN_ID=973c14ff93a3  # unshared budget=- d_model=256
     ARGS=(--config=experiments/permutation.py:paper --config.model.n_loops=1 --config.model.n_unique=32 --config.name=unshared --config.train.intermediate_supervision=False --config.train.lr=0.001 --config.seed=1 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/973c14ff93a3 --eval=accuracy,lens,probes,patching) ;;
  20) RUN_ID=f69d377424e9  # unshared budget=- d_model=256
     ARGS=(--config=experiments/permutation.py:paper --config.model.n_loops=1 --config.model.n_unique=32 --config.name=unshared --config.train.intermediate_supervision=False --config.train.lr=0.001 --config.seed=2 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/f69d377424e9 --eval=accuracy,lens,probes,patching) ;;
  21) RUN_ID=777ec93dc895  # unshared budget=- d_model=256
     ARGS=(--config=experiments/permutation.py:paper --config.model.n_loops=1 --config.model.n_unique=32 --config.name=unshared --config.train.intermediate_supervision=False --config.train.lr=0.0003 --config.seed=0 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/777ec93dc895 --eval=accuracy,lens,probes,patching) ;;
  22) RUN_ID=389f943cdc5b  # unshared budget=- d_model=256
     ARGS=(--config=experiments/permutation.py:paper --config.model.n_loops=1 --config.model.n_unique=32 --config.name=unshared --config.train.intermediate_supervision=False --config.train.lr=0.0003 --config.seed=1 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/389f943cdc5b --eval=accuracy,lens,probes,patching) ;;
  23) RUN_ID=75528098100d  # unshared budget=- d_model=256
     ARGS=(--config=experiments/permutation.py:paper --config.model.n_loops=1 --config.model.n_unique=32 --config.name=unshared --config.train.intermediate_supervision=False --config.train.lr=0.0003 --config.seed=2 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/75528098100d --eval=accuracy,lens,probes,patching) ;;
  24) RUN_ID=28ffb3f9c3f5  # unshared budget=- d_model=256
     ARGS=(--config=experiments/permutation.py:paper --config.model.n_loops=1 --config.model.n_unique=32 --config.name=unshared --config.train.intermediate_supervision=False --config.train.lr=0.0001 --config.seed=0 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/28ffb3f9c3f5 --eval=accuracy,lens,probes,patching) ;;
  25) RUN_ID=952e00f16242  # unshared budget=- d_model=256
     ARGS=(--config=experiments/permutation.py:paper --config.model.n_loops=1 --config.model.n_unique=32 --config.name=unshared --config.train.intermediate_supervision=False --config.train.lr=0.0001 --config.seed=1 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/952e00f16242 --eval=accuracy,lens,probes,patching) ;;
  26) RUN_ID=9db739899b0d  # unshared budget=- d_model=256
     ARGS=(--config=experiments/permutation.py:paper --config.model.n_loops=1 --config.model.n_unique=32 --config.name=unshared --config.train.intermediate_supervision=False --config.train.lr=0.0001 --config.seed=2 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/9db739899b0d --eval=accuracy,lens,probes,patching) ;;
  27) RUN_ID=70b80486ccc5  # unshared budget=- d_model=256
     ARGS=(--config=experiments/permutation.py:paper --config.model.n_loops=1 --config.model.n_unique=32 --config.name=unshared --config.train.intermediate_supervision=True --config.train.lr=0.001 --config.seed=0 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/70b80486ccc5 --eval=accuracy,lens,probes,patching) ;;
  28) RUN_ID=cc66a48455a8  # unshared budget=- d_model=256
     ARGS=(--config=experiments/permutation.py:paper --config.model.n_loops=1 --config.model.n_unique=32 --config.name=unshared --config.train.intermediate_supervision=True --config.train.lr=0.001 --config.seed=1 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/cc66a48455a8 --eval=accuracy,lens,probes,patching) ;;
  29) RUN_ID=9c454e93e9bc  # unshared budget=- d_model=256
     ARGS=(--config=experiments/permutation.py:paper --config.model.n_loops=1 --config.model.n_unique=32 --config.name=unshared --config.train.intermediate_supervision=True --config.train.lr=0.001 --config.seed=2 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/9c454e93e9bc --eval=accuracy,lens,probes,patching) ;;
  30) RUN_ID=04fb9cf9bd34  # unshared budget=- d_model=256
     ARGS=(--config=experiments/permutation.py:paper --config.model.n_loops=1 --config.model.n_unique=32 --config.name=unshared --config.train.intermediate_supervision=True --config.train.lr=0.0003 --config.seed=0 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/04fb9cf9bd34 --eval=accuracy,lens,probes,patching) ;;
  31) RUN_ID=08e4ea8cb64c  # unshared budget=- d_model=256
     ARGS=(--config=experiments/permutation.py:paper --config.model.n_loops=1 --config.model.n_unique=32 --config.name=unshared --config.train.intermediate_supervision=True --config.train.lr=0.0003 --config.seed=1 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/08e4ea8cb64c --eval=accuracy,lens,probes,patching) ;;
  32) RUN_ID=7b765f347a23  # unshared budget=- d_model=256
     ARGS=(--config=experiments/permutation.py:paper --config.model.n_loops=1 --config.model.n_unique=32 --config.name=unshared --config.train.intermediate_supervision=True --config.train.lr=0.0003 --config.seed=2 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/7b765f347a23 --eval=accuracy,lens,probes,patching) ;;
  33) RUN_ID=014a4e5c3f60  # unshared budget=- d_model=256
     ARGS=(--config=experiments/permutation.py:paper --config.model.n_loops=1 --config.model.n_unique=32 --config.name=unshared --config.train.intermediate_supervision=True --config.train.lr=0.0001 --config.seed=0 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/014a4e5c3f60 --eval=accuracy,lens,probes,patching) ;;
  34) RUN_ID=700720466c0c  # unshared budget=- d_model=256
     ARGS=(--config=experiments/permutation.py:paper --config.model.n_loops=1 --config.model.n_unique=32 --config.name=unshared --config.train.intermediate_supervision=True --config.train.lr=0.0001 --config.seed=1 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/700720466c0c --eval=accuracy,lens,probes,patching) ;;
  35) RUN_ID=8313cb12f8cd  # unshared budget=- d_model=256
     ARGS=(--config=experiments/permutation.py:paper --config.model.n_loops=1 --config.model.n_unique=32 --config.name=unshared --config.train.intermediate_supervision=True --config.train.lr=0.0001 --config.seed=2 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/8313cb12f8cd --eval=accuracy,lens,probes,patching) ;;
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

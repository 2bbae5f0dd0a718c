#!/usr/bin/env bash
# loopscale sweep permutation: 36 runs into gs://BUCKET/perm
# Runs every run in turn on all hosts of one TPU slice:
#   TPU_NAME=my-slice ZONE=us-central2-b bash tpu-pod.sh
# Each run's output goes to $LOGS/RUN_ID.log here.
# Written by `loopscale sweep --launcher`. Running it again resumes: `loopscale train` skips
# completed and diverged runs and resumes interrupted ones from their checkpoints.

set -uo pipefail
TPU_NAME="${TPU_NAME:-perm-v5p-8}"
ZONE="${ZONE:-us-east5-a}"
PROJECT="${PROJECT:-}"
REPO="${REPO:-~/loopscale}"
LOOPSCALE="${LOOPSCALE:-loopscale}"
LOGS="${LOGS:-tpu-pod-logs/permutation}"
WORKDIR=gs://BUCKET/perm
CACHE=gs://BUCKET/perm/jax_cache
# libtpu's flags for every run (loopscale/parallel/xla_flags.py: collectives overlapped
# with compute), after any of your own in LIBTPU_INIT_ARGS.
LIBTPU_ARGS="${LIBTPU_INIT_ARGS:+$LIBTPU_INIT_ARGS }--xla_tpu_enable_async_collective_fusion=true --xla_tpu_enable_async_collective_fusion_fuse_all_gather=true --xla_tpu_enable_async_collective_fusion_multiple_steps=true --xla_tpu_overlap_compute_collective_tc=true --xla_enable_async_all_gather=true --xla_enable_async_all_reduce=true --xla_tpu_enable_data_parallel_all_reduce_opt=true --xla_tpu_data_parallel_opt_different_sized_ops=true --xla_tpu_enable_latency_hiding_scheduler=true"
mkdir -p "$LOGS"
# This invocation's bookkeeping: a run is started by the slot that first creates
# $CLAIMS/RUN_ID (mkdir is atomic), and failures are listed in $CLAIMS/failed.
CLAIMS=$(mktemp -d "${TMPDIR:-/tmp}/loopscale-claims.XXXXXX")
trap 'rm -rf "$CLAIMS"' EXIT
# Interrupted: stop every slot and its ssh sessions (the whole process group).
trap 'trap - INT TERM; kill 0' INT TERM

# run_args RUN_ID: ARGS=(the run's `loopscale train` arguments).
run_args() {
  case "$1" in
    # looped budget=- d_model=256 steps=20000
    36603e93f65e) ARGS=(--config=experiments/permutation.py:paper --config.name=looped --config.train.intermediate_supervision=False --config.train.lr=0.001 --config.seed=0 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/36603e93f65e --eval=accuracy,lens,probes,patching) ;;
    # looped budget=- d_model=256 steps=20000
    4d9eac1aaf44) ARGS=(--config=experiments/permutation.py:paper --config.name=looped --config.train.intermediate_supervision=False --config.train.lr=0.001 --config.seed=1 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/4d9eac1aaf44 --eval=accuracy,lens,probes,patching) ;;
    # looped budget=- d_model=256 steps=20000
    3c908861e8a5) ARGS=(--config=experiments/permutation.py:paper --config.name=looped --config.train.intermediate_supervision=False --config.train.lr=0.001 --config.seed=2 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/3c908861e8a5 --eval=accuracy,lens,probes,patching) ;;
    # looped budget=- d_model=256 steps=20000
    722ff8618ea5) ARGS=(--config=experiments/permutation.py:paper --config.name=looped --config.train.intermediate_supervision=False --config.train.lr=0.0003 --config.seed=0 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/722ff8618ea5 --eval=accuracy,lens,probes,patching) ;;
    # looped budget=- d_model=256 steps=20000
    95d55e8ae533) ARGS=(--config=experiments/permutation.py:paper --config.name=looped --config.train.intermediate_supervision=False --config.train.lr=0.0003 --config.seed=1 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/95d55e8ae533 --eval=accuracy,lens,probes,patching) ;;
    # looped budget=- d_model=256 steps=20000
    7ee85cd961af) ARGS=(--config=experiments/permutation.py:paper --config.name=looped --config.train.intermediate_supervision=False --config.train.lr=0.0003 --config.seed=2 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/7ee85cd961af --eval=accuracy,lens,probes,patching) ;;
    # looped budget=- d_model=256 steps=20000
    880298fb0210) ARGS=(--config=experiments/permutation.py:paper --config.name=looped --config.train.intermediate_supervision=False --config.train.lr=0.0001 --config.seed=0 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/880298fb0210 --eval=accuracy,lens,probes,patching) ;;
    # looped budget=- d_model=256 steps=20000
    e53a3cb3b533) ARGS=(--config=experiments/permutation.py:paper --config.name=looped --config.train.intermediate_supervision=False --config.train.lr=0.0001 --config.seed=1 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/e53a3cb3b533 --eval=accuracy,lens,probes,patching) ;;
    # looped budget=- d_model=256 steps=20000
    f68a2417bbd9) ARGS=(--config=experiments/permutation.py:paper --config.name=looped --config.train.intermediate_supervision=False --config.train.lr=0.0001 --config.seed=2 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/f68a2417bbd9 --eval=accuracy,lens,probes,patching) ;;
    # looped budget=- d_model=256 steps=20000
    0f99a3dc6d20) ARGS=(--config=experiments/permutation.py:paper --config.name=looped --config.train.intermediate_supervision=True --config.train.lr=0.001 --config.seed=0 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/0f99a3dc6d20 --eval=accuracy,lens,probes,patching) ;;
    # looped budget=- d_model=256 steps=20000
    134305bd5c27) ARGS=(--config=experiments/permutation.py:paper --config.name=looped --config.train.intermediate_supervision=True --config.train.lr=0.001 --config.seed=1 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/134305bd5c27 --eval=accuracy,lens,probes,patching) ;;
    # looped budget=- d_model=256 steps=20000
    568b768d4964) ARGS=(--config=experiments/permutation.py:paper --config.name=looped --config.train.intermediate_supervision=True --config.train.lr=0.001 --config.seed=2 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/568b768d4964 --eval=accuracy,lens,probes,patching) ;;
    # looped budget=- d_model=256 steps=20000
    2bb04b64b276) ARGS=(--config=experiments/permutation.py:paper --config.name=looped --config.train.intermediate_supervision=True --config.train.lr=0.0003 --config.seed=0 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/2bb04b64b276 --eval=accuracy,lens,probes,patching) ;;
    # looped budget=- d_model=256 steps=20000
    dab1eaa5317b) ARGS=(--config=experiments/permutation.py:paper --config.name=looped --config.train.intermediate_supervision=True --config.train.lr=0.0003 --config.seed=1 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/dab1eaa5317b --eval=accuracy,lens,probes,patching) ;;
    # looped budget=- d_model=256 steps=20000
    748784e44787) ARGS=(--config=experiments/permutation.py:paper --config.name=looped --config.train.intermediate_supervision=True --config.train.lr=0.0003 --config.seed=2 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/748784e44787 --eval=accuracy,lens,probes,patching) ;;
    # looped budget=- d_model=256 steps=20000
    7c324372c49e) ARGS=(--config=experiments/permutation.py:paper --config.name=looped --config.train.intermediate_supervision=True --config.train.lr=0.0001 --config.seed=0 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/7c324372c49e --eval=accuracy,lens,probes,patching) ;;
    # looped budget=- d_model=256 steps=20000
    67bce62e5199) ARGS=(--config=experiments/permutation.py:paper --config.name=looped --config.train.intermediate_supervision=True --config.train.lr=0.0001 --config.seed=1 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/67bce62e5199 --eval=accuracy,lens,probes,patching) ;;
    # looped budget=- d_model=256 steps=20000
    c831b98a2513) ARGS=(--config=experiments/permutation.py:paper --config.name=looped --config.train.intermediate_supervision=True --config.train.lr=0.0001 --config.seed=2 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/c831b98a2513 --eval=accuracy,lens,probes,patching) ;;
    # unshared budget=- d_model=256 steps=20000
    2f27499d1f53) ARGS=(--config=experiments/permutation.py:paper --config.model.n_loops=1 --config.model.n_unique=32 --config.name=unshared --config.train.intermediate_supervision=False --config.train.lr=0.001 --config.seed=0 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/2f27499d1f53 --eval=accuracy,lens,probes,patching) ;;
    # unshared budget=- d_model=256 steps=20000
    8c37324e1ee6) ARGS=(--config=experiments/permutation.py:paper --config.model.n_loops=1 --config.model.n_unique=32 --config.name=unshared --config.train.intermediate_supervision=False --config.train.lr=0.001 --config.seed=1 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/8c37324e1ee6 --eval=accuracy,lens,probes,patching) ;;
    # unshared budget=- d_model=256 steps=20000
    aebb44cfbf1f) ARGS=(--config=experiments/permutation.py:paper --config.model.n_loops=1 --config.model.n_unique=32 --config.name=unshared --config.train.intermediate_supervision=False --config.train.lr=0.001 --config.seed=2 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/aebb44cfbf1f --eval=accuracy,lens,probes,patching) ;;
    # unshared budget=- d_model=256 steps=20000
    49a8d5bc5a51) ARGS=(--config=experiments/permutation.py:paper --config.model.n_loops=1 --config.model.n_unique=32 --config.name=unshared --config.train.intermediate_supervision=False --config.train.lr=0.0003 --config.seed=0 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/49a8d5bc5a51 --eval=accuracy,lens,probes,patching) ;;
    # unshared budget=- d_model=256 steps=20000
    d2b28dcdde53) ARGS=(--config=experiments/permutation.py:paper --config.model.n_loops=1 --config.model.n_unique=32 --config.name=unshared --config.train.intermediate_supervision=False --config.train.lr=0.0003 --config.seed=1 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/d2b28dcdde53 --eval=accuracy,lens,probes,patching) ;;
    # unshared budget=- d_model=256 steps=20000
    549eab5dfbdf) ARGS=(--config=experiments/permutation.py:paper --config.model.n_loops=1 --config.model.n_unique=32 --config.name=unshared --config.train.intermediate_supervision=False --config.train.lr=0.0003 --config.seed=2 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/549eab5dfbdf --eval=accuracy,lens,probes,patching) ;;
    # unshared budget=- d_model=256 steps=20000
    67814e179e9e) ARGS=(--config=experiments/permutation.py:paper --config.model.n_loops=1 --config.model.n_unique=32 --config.name=unshared --config.train.intermediate_supervision=False --config.train.lr=0.0001 --config.seed=0 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/67814e179e9e --eval=accuracy,lens,probes,patching) ;;
    # unshared budget=- d_model=256 steps=20000
    97ef2744a302) ARGS=(--config=experiments/permutation.py:paper --config.model.n_loops=1 --config.model.n_unique=32 --config.name=unshared --config.train.intermediate_supervision=False --config.train.lr=0.0001 --config.seed=1 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/97ef2744a302 --eval=accuracy,lens,probes,patching) ;;
    # unshared budget=- d_model=256 steps=20000
    a17973ac23bd) ARGS=(--config=experiments/permutation.py:paper --config.model.n_loops=1 --config.model.n_unique=32 --config.name=unshared --config.train.intermediate_supervision=False --config.train.lr=0.0001 --config.seed=2 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/a17973ac23bd --eval=accuracy,lens,probes,patching) ;;
    # unshared budget=- d_model=256 steps=20000
    881e7ca4ea20) ARGS=(--config=experiments/permutation.py:paper --config.model.n_loops=1 --config.model.n_unique=32 --config.name=unshared --config.train.intermediate_supervision=True --config.train.lr=0.001 --config.seed=0 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/881e7ca4ea20 --eval=accuracy,lens,probes,patching) ;;
    # unshared budget=- d_model=256 steps=20000
    30ac74d908ba) ARGS=(--config=experiments/permutation.py:paper --config.model.n_loops=1 --config.model.n_unique=32 --config.name=unshared --config.train.intermediate_supervision=True --config.train.lr=0.001 --config.seed=1 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/30ac74d908ba --eval=accuracy,lens,probes,patching) ;;
    # unshared budget=- d_model=256 steps=20000
    7447a512a3fe) ARGS=(--config=experiments/permutation.py:paper --config.model.n_loops=1 --config.model.n_unique=32 --config.name=unshared --config.train.intermediate_supervision=True --config.train.lr=0.001 --config.seed=2 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/7447a512a3fe --eval=accuracy,lens,probes,patching) ;;
    # unshared budget=- d_model=256 steps=20000
    1933478f6eec) ARGS=(--config=experiments/permutation.py:paper --config.model.n_loops=1 --config.model.n_unique=32 --config.name=unshared --config.train.intermediate_supervision=True --config.train.lr=0.0003 --config.seed=0 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/1933478f6eec --eval=accuracy,lens,probes,patching) ;;
    # unshared budget=- d_model=256 steps=20000
    0f20f1d5f1b0) ARGS=(--config=experiments/permutation.py:paper --config.model.n_loops=1 --config.model.n_unique=32 --config.name=unshared --config.train.intermediate_supervision=True --config.train.lr=0.0003 --config.seed=1 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/0f20f1d5f1b0 --eval=accuracy,lens,probes,patching) ;;
    # unshared budget=- d_model=256 steps=20000
    2fe4c1995389) ARGS=(--config=experiments/permutation.py:paper --config.model.n_loops=1 --config.model.n_unique=32 --config.name=unshared --config.train.intermediate_supervision=True --config.train.lr=0.0003 --config.seed=2 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/2fe4c1995389 --eval=accuracy,lens,probes,patching) ;;
    # unshared budget=- d_model=256 steps=20000
    bca71aa28a6e) ARGS=(--config=experiments/permutation.py:paper --config.model.n_loops=1 --config.model.n_unique=32 --config.name=unshared --config.train.intermediate_supervision=True --config.train.lr=0.0001 --config.seed=0 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/bca71aa28a6e --eval=accuracy,lens,probes,patching) ;;
    # unshared budget=- d_model=256 steps=20000
    0aac9db0a123) ARGS=(--config=experiments/permutation.py:paper --config.model.n_loops=1 --config.model.n_unique=32 --config.name=unshared --config.train.intermediate_supervision=True --config.train.lr=0.0001 --config.seed=1 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/0aac9db0a123 --eval=accuracy,lens,probes,patching) ;;
    # unshared budget=- d_model=256 steps=20000
    6118f0296667) ARGS=(--config=experiments/permutation.py:paper --config.model.n_loops=1 --config.model.n_unique=32 --config.name=unshared --config.train.intermediate_supervision=True --config.train.lr=0.0001 --config.seed=2 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/6118f0296667 --eval=accuracy,lens,probes,patching) ;;
  esac
}

# finished RUN_ID: its summary says completed or diverged (then nothing is launched).
finished() {
  local summary="$WORKDIR/runs/$1/summary.json"
  case "$summary" in
    gs://*) gcloud storage cat "$summary" 2>/dev/null ;;
    *) cat "$summary" 2>/dev/null ;;
  esac | grep -Eq '"status": *"(completed|diverged)"'
}

# ssh_run RUN_ID WORKER ENV [FLAG]: `loopscale train [FLAG]` of the run on host WORKER
# (`all`: on every host) with the variables ENV; a failure is recorded.
ssh_run() {
  local id="$1" worker="$2" env="$3" flag="${4:-}" remote rc
  run_args "$id"
  remote="cd $REPO && $env LIBTPU_INIT_ARGS=$(printf %q "$LIBTPU_ARGS") JAX_COMPILATION_CACHE_DIR=$(printf %q "$CACHE") $LOOPSCALE train $flag $(printf '%q ' "${ARGS[@]}")"
  gcloud compute tpus tpu-vm ssh "$TPU_NAME" --zone="$ZONE" ${PROJECT:+--project="$PROJECT"} --worker="$worker" --command="$remote" </dev/null >>"$LOGS/$id.log" 2>&1
  rc=$?
  # 0: completed, 3: diverged (a result, not a failure); anything else is retried by
  # running this script again (`loopscale train` resumes from the checkpoint).
  if [ "$rc" -ne 0 ] && [ "$rc" -ne 3 ]; then
    echo "run $id failed (exit $rc; log: $LOGS/$id.log)" >&2
    echo "$id" >>"$CLAIMS/failed"
  fi
}

# slot WORKER CHIPS BOUNDS PORT RUN_ID...: one process at a time on chips CHIPS of host
# WORKER, taking the queue's runs that no other slot has claimed. libtpu's variables
# make the process a one-process slice of its own on just those chips:
#   TPU_VISIBLE_CHIPS             the host's chips this process opens (the others are
#                                 another slot's);
#   TPU_CHIPS_PER_PROCESS_BOUNDS  their extent along the chip axes (2 chips: 1,2,1);
#   TPU_PROCESS_BOUNDS=1,1,1      one process in this slice (instead of the pod's
#                                 hosts from the TPU metadata);
#   TPU_PROCESS_PORT              the port libtpu listens on for its slice's processes,
#                                 one per slot so that they do not collide;
#   TPU_PROCESS_ADDRESSES         the addresses of the slice's processes: only itself,
#                                 so it neither waits for nor contacts other hosts;
#   CLOUD_TPU_TASK_ID=0           its index among them (else the host's worker id);
#   ALLOW_MULTIPLE_LIBTPU_LOAD=1  lets several processes of one host load libtpu,
#                                 which its lock file would refuse.
# No jax.distributed: each run is a single process.
slot() {
  local worker="$1" chips="$2" bounds="$3" port="$4" id; shift 4
  for id in "$@"; do
    mkdir "$CLAIMS/$id" 2>/dev/null || continue
    finished "$id" && continue
    echo "==> $id on host $worker, chips $chips"
    ssh_run "$id" "$worker" "ALLOW_MULTIPLE_LIBTPU_LOAD=1 TPU_VISIBLE_CHIPS=$chips TPU_CHIPS_PER_PROCESS_BOUNDS=$bounds TPU_PROCESS_BOUNDS=1,1,1 TPU_PROCESS_PORT=$port TPU_PROCESS_ADDRESSES=localhost:$port CLOUD_TPU_TASK_ID=0"
  done
}

# whole_slice RUN_ID...: each run in turn on every chip of the slice, `loopscale train
# --distributed` on all hosts (jax.distributed finds them from the TPU metadata).
whole_slice() {
  local id
  for id in "$@"; do
    mkdir "$CLAIMS/$id" 2>/dev/null || continue
    finished "$id" && continue
    echo "==> $id on all hosts"
    ssh_run "$id" all "" --distributed
  done
}

# One session with every host first, in the foreground: gcloud creates and copies its
# ssh key here (and may ask), not in dozens of sessions at once, and a wrong TPU_NAME
# or ZONE stops the script before any run is claimed.
gcloud compute tpus tpu-vm ssh "$TPU_NAME" --zone="$ZONE" ${PROJECT:+--project="$PROJECT"} --worker=all --command=true </dev/null || exit 1

# Phase 1/1: 36 run(s) one after another, each on the whole slice.
whole_slice 36603e93f65e 4d9eac1aaf44 3c908861e8a5 722ff8618ea5 95d55e8ae533 7ee85cd961af 880298fb0210 e53a3cb3b533 f68a2417bbd9 0f99a3dc6d20 134305bd5c27 568b768d4964 2bb04b64b276 dab1eaa5317b 748784e44787 7c324372c49e 67bce62e5199 c831b98a2513 2f27499d1f53 8c37324e1ee6 aebb44cfbf1f 49a8d5bc5a51 d2b28dcdde53 549eab5dfbdf 67814e179e9e 97ef2744a302 a17973ac23bd 881e7ca4ea20 30ac74d908ba 7447a512a3fe 1933478f6eec 0f20f1d5f1b0 2fe4c1995389 bca71aa28a6e 0aac9db0a123 6118f0296667

failed=$(cat "$CLAIMS/failed" 2>/dev/null | wc -l | tr -d ' ')
echo "$failed run(s) failed" >&2
[ "$failed" -eq 0 ]

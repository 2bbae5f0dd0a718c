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
    2d1bc821c348) ARGS=(--config=experiments/permutation.py:paper --config.name=looped --config.train.intermediate_supervision=False --config.train.lr=0.001 --config.seed=0 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/2d1bc821c348 --eval=accuracy,lens,probes,patching) ;;
    # looped budget=- d_model=256 steps=20000
    779da847c5c9) ARGS=(--config=experiments/permutation.py:paper --config.name=looped --config.train.intermediate_supervision=False --config.train.lr=0.001 --config.seed=1 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/779da847c5c9 --eval=accuracy,lens,probes,patching) ;;
    # looped budget=- d_model=256 steps=20000
    2fbe1a1c1025) ARGS=(--config=experiments/permutation.py:paper --config.name=looped --config.train.intermediate_supervision=False --config.train.lr=0.001 --config.seed=2 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/2fbe1a1c1025 --eval=accuracy,lens,probes,patching) ;;
    # looped budget=- d_model=256 steps=20000
    9fafc972dde6) ARGS=(--config=experiments/permutation.py:paper --config.name=looped --config.train.intermediate_supervision=False --config.train.lr=0.0003 --config.seed=0 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/9fafc972dde6 --eval=accuracy,lens,probes,patching) ;;
    # looped budget=- d_model=256 steps=20000
    ab6d85950177) ARGS=(--config=experiments/permutation.py:paper --config.name=looped --config.train.intermediate_supervision=False --config.train.lr=0.0003 --config.seed=1 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/ab6d85950177 --eval=accuracy,lens,probes,patching) ;;
    # looped budget=- d_model=256 steps=20000
    d91f24ba1357) ARGS=(--config=experiments/permutation.py:paper --config.name=looped --config.train.intermediate_supervision=False --config.train.lr=0.0003 --config.seed=2 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/d91f24ba1357 --eval=accuracy,lens,probes,patching) ;;
    # looped budget=- d_model=256 steps=20000
    59f379ef401b) ARGS=(--config=experiments/permutation.py:paper --config.name=looped --config.train.intermediate_supervision=False --config.train.lr=0.0001 --config.seed=0 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/59f379ef401b --eval=accuracy,lens,probes,patching) ;;
    # looped budget=- d_model=256 steps=20000
    80d25886dbf2) ARGS=(--config=experiments/permutation.py:paper --config.name=looped --config.train.intermediate_supervision=False --config.train.lr=0.0001 --config.seed=1 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/80d25886dbf2 --eval=accuracy,lens,probes,patching) ;;
    # looped budget=- d_model=256 steps=20000
    277b3da8adc6) ARGS=(--config=experiments/permutation.py:paper --config.name=looped --config.train.intermediate_supervision=False --config.train.lr=0.0001 --config.seed=2 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/277b3da8adc6 --eval=accuracy,lens,probes,patching) ;;
    # looped budget=- d_model=256 steps=20000
    f0f1d019e122) ARGS=(--config=experiments/permutation.py:paper --config.name=looped --config.train.intermediate_supervision=True --config.train.lr=0.001 --config.seed=0 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/f0f1d019e122 --eval=accuracy,lens,probes,patching) ;;
    # looped budget=- d_model=256 steps=20000
    59a2b565eca8) ARGS=(--config=experiments/permutation.py:paper --config.name=looped --config.train.intermediate_supervision=True --config.train.lr=0.001 --config.seed=1 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/59a2b565eca8 --eval=accuracy,lens,probes,patching) ;;
    # looped budget=- d_model=256 steps=20000
    018b64e8c3d1) ARGS=(--config=experiments/permutation.py:paper --config.name=looped --config.train.intermediate_supervision=True --config.train.lr=0.001 --config.seed=2 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/018b64e8c3d1 --eval=accuracy,lens,probes,patching) ;;
    # looped budget=- d_model=256 steps=20000
    4217970ea2be) ARGS=(--config=experiments/permutation.py:paper --config.name=looped --config.train.intermediate_supervision=True --config.train.lr=0.0003 --config.seed=0 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/4217970ea2be --eval=accuracy,lens,probes,patching) ;;
    # looped budget=- d_model=256 steps=20000
    03a5b722707d) ARGS=(--config=experiments/permutation.py:paper --config.name=looped --config.train.intermediate_supervision=True --config.train.lr=0.0003 --config.seed=1 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/03a5b722707d --eval=accuracy,lens,probes,patching) ;;
    # looped budget=- d_model=256 steps=20000
    849c0f34eb7c) ARGS=(--config=experiments/permutation.py:paper --config.name=looped --config.train.intermediate_supervision=True --config.train.lr=0.0003 --config.seed=2 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/849c0f34eb7c --eval=accuracy,lens,probes,patching) ;;
    # looped budget=- d_model=256 steps=20000
    509b8d49869c) ARGS=(--config=experiments/permutation.py:paper --config.name=looped --config.train.intermediate_supervision=True --config.train.lr=0.0001 --config.seed=0 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/509b8d49869c --eval=accuracy,lens,probes,patching) ;;
    # looped budget=- d_model=256 steps=20000
    ce168ff7f81c) ARGS=(--config=experiments/permutation.py:paper --config.name=looped --config.train.intermediate_supervision=True --config.train.lr=0.0001 --config.seed=1 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/ce168ff7f81c --eval=accuracy,lens,probes,patching) ;;
    # looped budget=- d_model=256 steps=20000
    4e0769f1b467) ARGS=(--config=experiments/permutation.py:paper --config.name=looped --config.train.intermediate_supervision=True --config.train.lr=0.0001 --config.seed=2 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/4e0769f1b467 --eval=accuracy,lens,probes,patching) ;;
    # unshared budget=- d_model=256 steps=20000
    9d40b6533294) ARGS=(--config=experiments/permutation.py:paper --config.model.n_loops=1 --config.model.n_unique=32 --config.name=unshared --config.train.intermediate_supervision=False --config.train.lr=0.001 --config.seed=0 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/9d40b6533294 --eval=accuracy,lens,probes,patching) ;;
    # unshared budget=- d_model=256 steps=20000
    9f9d74abcf41) ARGS=(--config=experiments/permutation.py:paper --config.model.n_loops=1 --config.model.n_unique=32 --config.name=unshared --config.train.intermediate_supervision=False --config.train.lr=0.001 --config.seed=1 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/9f9d74abcf41 --eval=accuracy,lens,probes,patching) ;;
    # unshared budget=- d_model=256 steps=20000
    511365126477) ARGS=(--config=experiments/permutation.py:paper --config.model.n_loops=1 --config.model.n_unique=32 --config.name=unshared --config.train.intermediate_supervision=False --config.train.lr=0.001 --config.seed=2 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/511365126477 --eval=accuracy,lens,probes,patching) ;;
    # unshared budget=- d_model=256 steps=20000
    5b8585d52674) ARGS=(--config=experiments/permutation.py:paper --config.model.n_loops=1 --config.model.n_unique=32 --config.name=unshared --config.train.intermediate_supervision=False --config.train.lr=0.0003 --config.seed=0 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/5b8585d52674 --eval=accuracy,lens,probes,patching) ;;
    # unshared budget=- d_model=256 steps=20000
    237a605adb9f) ARGS=(--config=experiments/permutation.py:paper --config.model.n_loops=1 --config.model.n_unique=32 --config.name=unshared --config.train.intermediate_supervision=False --config.train.lr=0.0003 --config.seed=1 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/237a605adb9f --eval=accuracy,lens,probes,patching) ;;
    # unshared budget=- d_model=256 steps=20000
    ba2d2ac29541) ARGS=(--config=experiments/permutation.py:paper --config.model.n_loops=1 --config.model.n_unique=32 --config.name=unshared --config.train.intermediate_supervision=False --config.train.lr=0.0003 --config.seed=2 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/ba2d2ac29541 --eval=accuracy,lens,probes,patching) ;;
    # unshared budget=- d_model=256 steps=20000
    b69bb6d9630e) ARGS=(--config=experiments/permutation.py:paper --config.model.n_loops=1 --config.model.n_unique=32 --config.name=unshared --config.train.intermediate_supervision=False --config.train.lr=0.0001 --config.seed=0 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/b69bb6d9630e --eval=accuracy,lens,probes,patching) ;;
    # unshared budget=- d_model=256 steps=20000
    50dffbf863bf) ARGS=(--config=experiments/permutation.py:paper --config.model.n_loops=1 --config.model.n_unique=32 --config.name=unshared --config.train.intermediate_supervision=False --config.train.lr=0.0001 --config.seed=1 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/50dffbf863bf --eval=accuracy,lens,probes,patching) ;;
    # unshared budget=- d_model=256 steps=20000
    b66001a8c551) ARGS=(--config=experiments/permutation.py:paper --config.model.n_loops=1 --config.model.n_unique=32 --config.name=unshared --config.train.intermediate_supervision=False --config.train.lr=0.0001 --config.seed=2 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/b66001a8c551 --eval=accuracy,lens,probes,patching) ;;
    # unshared budget=- d_model=256 steps=20000
    fd9305853683) ARGS=(--config=experiments/permutation.py:paper --config.model.n_loops=1 --config.model.n_unique=32 --config.name=unshared --config.train.intermediate_supervision=True --config.train.lr=0.001 --config.seed=0 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/fd9305853683 --eval=accuracy,lens,probes,patching) ;;
    # unshared budget=- d_model=256 steps=20000
    9dcac8555d51) ARGS=(--config=experiments/permutation.py:paper --config.model.n_loops=1 --config.model.n_unique=32 --config.name=unshared --config.train.intermediate_supervision=True --config.train.lr=0.001 --config.seed=1 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/9dcac8555d51 --eval=accuracy,lens,probes,patching) ;;
    # unshared budget=- d_model=256 steps=20000
    67849548fcc0) ARGS=(--config=experiments/permutation.py:paper --config.model.n_loops=1 --config.model.n_unique=32 --config.name=unshared --config.train.intermediate_supervision=True --config.train.lr=0.001 --config.seed=2 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/67849548fcc0 --eval=accuracy,lens,probes,patching) ;;
    # unshared budget=- d_model=256 steps=20000
    37c262e1c345) ARGS=(--config=experiments/permutation.py:paper --config.model.n_loops=1 --config.model.n_unique=32 --config.name=unshared --config.train.intermediate_supervision=True --config.train.lr=0.0003 --config.seed=0 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/37c262e1c345 --eval=accuracy,lens,probes,patching) ;;
    # unshared budget=- d_model=256 steps=20000
    8fc807ebf1b8) ARGS=(--config=experiments/permutation.py:paper --config.model.n_loops=1 --config.model.n_unique=32 --config.name=unshared --config.train.intermediate_supervision=True --config.train.lr=0.0003 --config.seed=1 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/8fc807ebf1b8 --eval=accuracy,lens,probes,patching) ;;
    # unshared budget=- d_model=256 steps=20000
    d842850efdc4) ARGS=(--config=experiments/permutation.py:paper --config.model.n_loops=1 --config.model.n_unique=32 --config.name=unshared --config.train.intermediate_supervision=True --config.train.lr=0.0003 --config.seed=2 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/d842850efdc4 --eval=accuracy,lens,probes,patching) ;;
    # unshared budget=- d_model=256 steps=20000
    284a926e18fc) ARGS=(--config=experiments/permutation.py:paper --config.model.n_loops=1 --config.model.n_unique=32 --config.name=unshared --config.train.intermediate_supervision=True --config.train.lr=0.0001 --config.seed=0 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/284a926e18fc --eval=accuracy,lens,probes,patching) ;;
    # unshared budget=- d_model=256 steps=20000
    bb6a465247f6) ARGS=(--config=experiments/permutation.py:paper --config.model.n_loops=1 --config.model.n_unique=32 --config.name=unshared --config.train.intermediate_supervision=True --config.train.lr=0.0001 --config.seed=1 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/bb6a465247f6 --eval=accuracy,lens,probes,patching) ;;
    # unshared budget=- d_model=256 steps=20000
    14ad0ed16604) ARGS=(--config=experiments/permutation.py:paper --config.model.n_loops=1 --config.model.n_unique=32 --config.name=unshared --config.train.intermediate_supervision=True --config.train.lr=0.0001 --config.seed=2 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/14ad0ed16604 --eval=accuracy,lens,probes,patching) ;;
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
whole_slice 2d1bc821c348 779da847c5c9 2fbe1a1c1025 9fafc972dde6 ab6d85950177 d91f24ba1357 59f379ef401b 80d25886dbf2 277b3da8adc6 f0f1d019e122 59a2b565eca8 018b64e8c3d1 4217970ea2be 03a5b722707d 849c0f34eb7c 509b8d49869c ce168ff7f81c 4e0769f1b467 9d40b6533294 9f9d74abcf41 511365126477 5b8585d52674 237a605adb9f ba2d2ac29541 b69bb6d9630e 50dffbf863bf b66001a8c551 fd9305853683 9dcac8555d51 67849548fcc0 37c262e1c345 8fc807ebf1b8 d842850efdc4 284a926e18fc bb6a465247f6 14ad0ed16604

failed=$(cat "$CLAIMS/failed" 2>/dev/null | wc -l | tr -d ' ')
echo "$failed run(s) failed" >&2
[ "$failed" -eq 0 ]

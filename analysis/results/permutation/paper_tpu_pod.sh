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
    c982c1f1f564) ARGS=(--config=experiments/permutation.py:paper --config.name=looped --config.train.intermediate_supervision=False --config.train.lr=0.001 --config.seed=0 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/c982c1f1f564 --eval=accuracy,lens,probes,patching) ;;
    # looped budget=- d_model=256 steps=20000
    72ccc81158fe) ARGS=(--config=experiments/permutation.py:paper --config.name=looped --config.train.intermediate_supervision=False --config.train.lr=0.001 --config.seed=1 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/72ccc81158fe --eval=accuracy,lens,probes,patching) ;;
    # looped budget=- d_model=256 steps=20000
    69adc80f0d28) ARGS=(--config=experiments/permutation.py:paper --config.name=looped --config.train.intermediate_supervision=False --config.train.lr=0.001 --config.seed=2 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/69adc80f0d28 --eval=accuracy,lens,probes,patching) ;;
    # looped budget=- d_model=256 steps=20000
    23aae461b6c5) ARGS=(--config=experiments/permutation.py:paper --config.name=looped --config.train.intermediate_supervision=False --config.train.lr=0.0003 --config.seed=0 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/23aae461b6c5 --eval=accuracy,lens,probes,patching) ;;
    # looped budget=- d_model=256 steps=20000
    f8e9e6ee0247) ARGS=(--config=experiments/permutation.py:paper --config.name=looped --config.train.intermediate_supervision=False --config.train.lr=0.0003 --config.seed=1 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/f8e9e6ee0247 --eval=accuracy,lens,probes,patching) ;;
    # looped budget=- d_model=256 steps=20000
    a6bbb95f9634) ARGS=(--config=experiments/permutation.py:paper --config.name=looped --config.train.intermediate_supervision=False --config.train.lr=0.0003 --config.seed=2 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/a6bbb95f9634 --eval=accuracy,lens,probes,patching) ;;
    # looped budget=- d_model=256 steps=20000
    ded9b69471b6) ARGS=(--config=experiments/permutation.py:paper --config.name=looped --config.train.intermediate_supervision=False --config.train.lr=0.0001 --config.seed=0 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/ded9b69471b6 --eval=accuracy,lens,probes,patching) ;;
    # looped budget=- d_model=256 steps=20000
    524a5b835dd2) ARGS=(--config=experiments/permutation.py:paper --config.name=looped --config.train.intermediate_supervision=False --config.train.lr=0.0001 --config.seed=1 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/524a5b835dd2 --eval=accuracy,lens,probes,patching) ;;
    # looped budget=- d_model=256 steps=20000
    0569a1cd5de4) ARGS=(--config=experiments/permutation.py:paper --config.name=looped --config.train.intermediate_supervision=False --config.train.lr=0.0001 --config.seed=2 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/0569a1cd5de4 --eval=accuracy,lens,probes,patching) ;;
    # looped budget=- d_model=256 steps=20000
    edb9432ed5fc) ARGS=(--config=experiments/permutation.py:paper --config.name=looped --config.train.intermediate_supervision=True --config.train.lr=0.001 --config.seed=0 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/edb9432ed5fc --eval=accuracy,lens,probes,patching) ;;
    # looped budget=- d_model=256 steps=20000
    f949f310d708) ARGS=(--config=experiments/permutation.py:paper --config.name=looped --config.train.intermediate_supervision=True --config.train.lr=0.001 --config.seed=1 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/f949f310d708 --eval=accuracy,lens,probes,patching) ;;
    # looped budget=- d_model=256 steps=20000
    d809c222b0c8) ARGS=(--config=experiments/permutation.py:paper --config.name=looped --config.train.intermediate_supervision=True --config.train.lr=0.001 --config.seed=2 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/d809c222b0c8 --eval=accuracy,lens,probes,patching) ;;
    # looped budget=- d_model=256 steps=20000
    d4cb326371a0) ARGS=(--config=experiments/permutation.py:paper --config.name=looped --config.train.intermediate_supervision=True --config.train.lr=0.0003 --config.seed=0 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/d4cb326371a0 --eval=accuracy,lens,probes,patching) ;;
    # looped budget=- d_model=256 steps=20000
    09988cb8d540) ARGS=(--config=experiments/permutation.py:paper --config.name=looped --config.train.intermediate_supervision=True --config.train.lr=0.0003 --config.seed=1 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/09988cb8d540 --eval=accuracy,lens,probes,patching) ;;
    # looped budget=- d_model=256 steps=20000
    e43dc4603cea) ARGS=(--config=experiments/permutation.py:paper --config.name=looped --config.train.intermediate_supervision=True --config.train.lr=0.0003 --config.seed=2 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/e43dc4603cea --eval=accuracy,lens,probes,patching) ;;
    # looped budget=- d_model=256 steps=20000
    35fff66f79b2) ARGS=(--config=experiments/permutation.py:paper --config.name=looped --config.train.intermediate_supervision=True --config.train.lr=0.0001 --config.seed=0 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/35fff66f79b2 --eval=accuracy,lens,probes,patching) ;;
    # looped budget=- d_model=256 steps=20000
    f5557a535eaa) ARGS=(--config=experiments/permutation.py:paper --config.name=looped --config.train.intermediate_supervision=True --config.train.lr=0.0001 --config.seed=1 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/f5557a535eaa --eval=accuracy,lens,probes,patching) ;;
    # looped budget=- d_model=256 steps=20000
    0408ce990453) ARGS=(--config=experiments/permutation.py:paper --config.name=looped --config.train.intermediate_supervision=True --config.train.lr=0.0001 --config.seed=2 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/0408ce990453 --eval=accuracy,lens,probes,patching) ;;
    # unshared budget=- d_model=256 steps=20000
    4b35130ec8e1) ARGS=(--config=experiments/permutation.py:paper --config.model.n_loops=1 --config.model.n_unique=32 --config.name=unshared --config.train.intermediate_supervision=False --config.train.lr=0.001 --config.seed=0 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/4b35130ec8e1 --eval=accuracy,lens,probes,patching) ;;
    # unshared budget=- d_model=256 steps=20000
    973c14ff93a3) ARGS=(--config=experiments/permutation.py:paper --config.model.n_loops=1 --config.model.n_unique=32 --config.name=unshared --config.train.intermediate_supervision=False --config.train.lr=0.001 --config.seed=1 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/973c14ff93a3 --eval=accuracy,lens,probes,patching) ;;
    # unshared budget=- d_model=256 steps=20000
    f69d377424e9) ARGS=(--config=experiments/permutation.py:paper --config.model.n_loops=1 --config.model.n_unique=32 --config.name=unshared --config.train.intermediate_supervision=False --config.train.lr=0.001 --config.seed=2 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/f69d377424e9 --eval=accuracy,lens,probes,patching) ;;
    # unshared budget=- d_model=256 steps=20000
    777ec93dc895) ARGS=(--config=experiments/permutation.py:paper --config.model.n_loops=1 --config.model.n_unique=32 --config.name=unshared --config.train.intermediate_supervision=False --config.train.lr=0.0003 --config.seed=0 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/777ec93dc895 --eval=accuracy,lens,probes,patching) ;;
    # unshared budget=- d_model=256 steps=20000
    389f943cdc5b) ARGS=(--config=experiments/permutation.py:paper --config.model.n_loops=1 --config.model.n_unique=32 --config.name=unshared --config.train.intermediate_supervision=False --config.train.lr=0.0003 --config.seed=1 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/389f943cdc5b --eval=accuracy,lens,probes,patching) ;;
    # unshared budget=- d_model=256 steps=20000
    75528098100d) ARGS=(--config=experiments/permutation.py:paper --config.model.n_loops=1 --config.model.n_unique=32 --config.name=unshared --config.train.intermediate_supervision=False --config.train.lr=0.0003 --config.seed=2 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/75528098100d --eval=accuracy,lens,probes,patching) ;;
    # unshared budget=- d_model=256 steps=20000
    28ffb3f9c3f5) ARGS=(--config=experiments/permutation.py:paper --config.model.n_loops=1 --config.model.n_unique=32 --config.name=unshared --config.train.intermediate_supervision=False --config.train.lr=0.0001 --config.seed=0 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/28ffb3f9c3f5 --eval=accuracy,lens,probes,patching) ;;
    # unshared budget=- d_model=256 steps=20000
    952e00f16242) ARGS=(--config=experiments/permutation.py:paper --config.model.n_loops=1 --config.model.n_unique=32 --config.name=unshared --config.train.intermediate_supervision=False --config.train.lr=0.0001 --config.seed=1 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/952e00f16242 --eval=accuracy,lens,probes,patching) ;;
    # unshared budget=- d_model=256 steps=20000
    9db739899b0d) ARGS=(--config=experiments/permutation.py:paper --config.model.n_loops=1 --config.model.n_unique=32 --config.name=unshared --config.train.intermediate_supervision=False --config.train.lr=0.0001 --config.seed=2 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/9db739899b0d --eval=accuracy,lens,probes,patching) ;;
    # unshared budget=- d_model=256 steps=20000
    70b80486ccc5) ARGS=(--config=experiments/permutation.py:paper --config.model.n_loops=1 --config.model.n_unique=32 --config.name=unshared --config.train.intermediate_supervision=True --config.train.lr=0.001 --config.seed=0 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/70b80486ccc5 --eval=accuracy,lens,probes,patching) ;;
    # unshared budget=- d_model=256 steps=20000
    cc66a48455a8) ARGS=(--config=experiments/permutation.py:paper --config.model.n_loops=1 --config.model.n_unique=32 --config.name=unshared --config.train.intermediate_supervision=True --config.train.lr=0.001 --config.seed=1 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/cc66a48455a8 --eval=accuracy,lens,probes,patching) ;;
    # unshared budget=- d_model=256 steps=20000
    9c454e93e9bc) ARGS=(--config=experiments/permutation.py:paper --config.model.n_loops=1 --config.model.n_unique=32 --config.name=unshared --config.train.intermediate_supervision=True --config.train.lr=0.001 --config.seed=2 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/9c454e93e9bc --eval=accuracy,lens,probes,patching) ;;
    # unshared budget=- d_model=256 steps=20000
    04fb9cf9bd34) ARGS=(--config=experiments/permutation.py:paper --config.model.n_loops=1 --config.model.n_unique=32 --config.name=unshared --config.train.intermediate_supervision=True --config.train.lr=0.0003 --config.seed=0 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/04fb9cf9bd34 --eval=accuracy,lens,probes,patching) ;;
    # unshared budget=- d_model=256 steps=20000
    08e4ea8cb64c) ARGS=(--config=experiments/permutation.py:paper --config.model.n_loops=1 --config.model.n_unique=32 --config.name=unshared --config.train.intermediate_supervision=True --config.train.lr=0.0003 --config.seed=1 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/08e4ea8cb64c --eval=accuracy,lens,probes,patching) ;;
    # unshared budget=- d_model=256 steps=20000
    7b765f347a23) ARGS=(--config=experiments/permutation.py:paper --config.model.n_loops=1 --config.model.n_unique=32 --config.name=unshared --config.train.intermediate_supervision=True --config.train.lr=0.0003 --config.seed=2 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/7b765f347a23 --eval=accuracy,lens,probes,patching) ;;
    # unshared budget=- d_model=256 steps=20000
    014a4e5c3f60) ARGS=(--config=experiments/permutation.py:paper --config.model.n_loops=1 --config.model.n_unique=32 --config.name=unshared --config.train.intermediate_supervision=True --config.train.lr=0.0001 --config.seed=0 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/014a4e5c3f60 --eval=accuracy,lens,probes,patching) ;;
    # unshared budget=- d_model=256 steps=20000
    700720466c0c) ARGS=(--config=experiments/permutation.py:paper --config.model.n_loops=1 --config.model.n_unique=32 --config.name=unshared --config.train.intermediate_supervision=True --config.train.lr=0.0001 --config.seed=1 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/700720466c0c --eval=accuracy,lens,probes,patching) ;;
    # unshared budget=- d_model=256 steps=20000
    8313cb12f8cd) ARGS=(--config=experiments/permutation.py:paper --config.model.n_loops=1 --config.model.n_unique=32 --config.name=unshared --config.train.intermediate_supervision=True --config.train.lr=0.0001 --config.seed=2 --config.train.steps=20000 --config.train.warmup_steps=200 --config.train.eval_every=1000 --config.train.checkpoint_every=1000 --workdir=gs://BUCKET/perm/runs/8313cb12f8cd --eval=accuracy,lens,probes,patching) ;;
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
  remote="cd $REPO && $env JAX_COMPILATION_CACHE_DIR=$(printf %q "$CACHE") $LOOPSCALE train $flag $(printf '%q ' "${ARGS[@]}")"
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
whole_slice c982c1f1f564 72ccc81158fe 69adc80f0d28 23aae461b6c5 f8e9e6ee0247 a6bbb95f9634 ded9b69471b6 524a5b835dd2 0569a1cd5de4 edb9432ed5fc f949f310d708 d809c222b0c8 d4cb326371a0 09988cb8d540 e43dc4603cea 35fff66f79b2 f5557a535eaa 0408ce990453 4b35130ec8e1 973c14ff93a3 f69d377424e9 777ec93dc895 389f943cdc5b 75528098100d 28ffb3f9c3f5 952e00f16242 9db739899b0d 70b80486ccc5 cc66a48455a8 9c454e93e9bc 04fb9cf9bd34 08e4ea8cb64c 7b765f347a23 014a4e5c3f60 700720466c0c 8313cb12f8cd

failed=$(cat "$CLAIMS/failed" 2>/dev/null | wc -l | tr -d ' ')
echo "$failed run(s) failed" >&2
[ "$failed" -eq 0 ]

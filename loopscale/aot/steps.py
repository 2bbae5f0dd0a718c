"""The steps `loopscale compile --step=` can compile (names only: the CLI reads them without
importing JAX). `eval:NAME` is a `loopscale eval` measurement's device step over LM batches,
whose per-chip memory is what a paper-scale evaluation of it holds."""

MEASURE_STEPS = ("eval:jsd", "eval:early_exit", "eval:routing")
STEPS = ("train", "eval", *MEASURE_STEPS)

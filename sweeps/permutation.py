"""Permutation traversal (PAPERS.md section 3): looped 4x8 against unshared 32 layers.

    loopscale plan --sweep=sweeps/permutation.py:paper --out=plan.csv
    loopscale sweep --sweep=sweeps/permutation.py:paper --workdir=gs://BUCKET/perm --launcher=slurm
    loopscale collect gs://BUCKET/perm --out=results.csv

Two families trained identically (16 nodes, 8 hops, width 256, 20,000 steps): `looped_4x8`
(a 4-layer block iterated 8 times) and `unshared_32` (32 distinct layers), over 3 seeds, 3
learning rates (1e-3, 3e-4, 1e-4) and with or without intermediate supervision: 36 runs. What
it should show: looped 4x8 solving the task with every seed at every learning rate; unshared
32 failing at 1e-3 and succeeding only at a lower learning rate or with intermediate
supervision. Each run logs its held-out answer accuracy beside the shortcut accuracy
(answering the start node) at every evaluation (`eval_accuracy`, `eval_shortcut`; collect's
`final_eval_accuracy`); each completed run is then measured (`loopscale eval
--what=accuracy,lens,probes,patching`: accuracy per hop and loop exit, the logit-lens and probe
ladder, the patching maps).

Intermediate supervision reads out at the looped model's loop boundaries, and at every 4th
layer boundary of `unshared_32` (the same depths; data/permutation.py `layer_labels`).

ARG `tiny` (default): a CPU smoke test, 2x2 looped against 4 unshared layers at width 64,
200 steps, 2 seeds and 2 learning rates (16 runs of seconds each); the study's effect needs
thousands of steps (PAPERS.md), so expect chance-level answers there.
"""

from ml_collections import ConfigDict

from loopscale.sweep import base_sweep


def get_config(arg: str | None = "tiny") -> ConfigDict:
    paper = arg == "paper"
    exp = f"experiments/permutation.py:{'paper' if paper else 'tiny'}"
    deep = 32 if paper else 4
    s = base_sweep()
    s.name = "permutation"
    s.families = {
        "looped": {"experiment": exp, "overrides": {}},  # paper: 4 x 8; tiny: 2 x 2
        "unshared": {"experiment": exp, "overrides": {"model": {"n_unique": deep, "n_loops": 1}}},
    }
    s.shape.params = "params_unique"
    s.grid = {"train": {"intermediate_supervision": (False, True)}}
    s.warmup_frac = 0.01
    # Every run is measured as it completes: per-hop accuracy, the lens/probe ladder and the
    # patching maps (the inputs of analysis/permutation.py).
    s.measure = "accuracy,lens,probes,patching"
    if paper:
        s.seeds, s.lrs = (0, 1, 2), (1e-3, 3e-4, 1e-4)
        s.steps, s.evals, s.checkpoints = 20000, 20, 20
    else:
        s.seeds, s.lrs = (0, 1), (1e-3, 3e-4)
        s.steps, s.evals, s.checkpoints = 200, 4, 2
        s.peak_flops, s.mfu = 1.9e11, 0.25
    return s

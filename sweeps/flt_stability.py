"""FLT stability study (PAPERS.md section 1): the five injection modes at 6, 9 and 12 loops.

    loopscale plan --sweep=sweeps/flt_stability.py --out=plan.csv
    loopscale sweep --sweep=sweeps/flt_stability.py --workdir=runs/flt_stability --concurrency=2
    loopscale collect runs/flt_stability --out=results.csv

15 runs: injection none (the original LT), input, attn_first, fla and flt, each at 6, 9 and 12
loops, one seed, same data order. Every run logs the study's diagnostics (gradient norm, the
cosine between consecutive gradients, per-loop residual norms, per-loop gradient norms every 25
steps), records `collapsed` in summary.json, and is measured as it completes (`loopscale eval
--what=loops,act_grads`: perplexity at every inference loop count, activation-gradient norms
per loop), the inputs of analysis/flt_stability.py. What it should show: the original LT stalling at the byte-unigram loss with a
growing last-loop residual norm at 9 and 12 loops (collapsed: true), `input` and `attn_first`
failing at high loop counts, `fla` damping the residual growth without always avoiding
collapse, and `flt` training at every loop count.

ARG `tiny` (default): the CPU setting of PAPERS.md's practical notes (d 128, 2 layers per loop,
byte-level KJV, sequence 128, batch 16, AdamW 3e-3), 300 steps: about 7 minutes per 12-loop
run on a 2-core CPU, ~1.5 hours for the sweep at concurrency 2. ARG `small`: the study's
stability runs, the Small model (6 layers, d 384) for 2,000 steps, Muon recipe, on an
accelerator (`--launcher=tpu-pod|slurm`).
"""

from ml_collections import ConfigDict

from loopscale.sweep import base_sweep

INJECTIONS = ("none", "input", "attn_first", "fla", "flt")


def get_config(arg: str | None = "tiny") -> ConfigDict:
    size = arg or "tiny"
    s = base_sweep()
    s.name = "flt_stability"
    s.families = {inj: {"experiment": f"experiments/flt.py:{size}",
                        "overrides": {"model": {"injection": inj}}} for inj in INJECTIONS}
    s.select = ",".join(INJECTIONS)
    s.overrides = {"train": {"loop_grad_every": 25, "log_grad_cosine": True}}
    s.grid = {"model": {"n_loops": (6, 9, 12)}}
    s.steps = 300 if size == "tiny" else 2000
    # The study's recipe has no warmup: the preset's 0 is kept (base_sweep's warmup_frac).
    s.evals, s.checkpoints = 6, 6
    s.measure = "loops,act_grads"
    if size == "tiny":
        s.peak_flops, s.mfu = 1.9e11, 0.25
    return s

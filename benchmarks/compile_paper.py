"""Compile every paper-scale experiment for a TPU topology and tabulate what each needs per chip.

    .venv/bin/python benchmarks/compile_paper.py --topology=v5p-128 --out=runs/compile

For each `:paper` experiment (and the largest run of sweeps/isoflop_paper.py), the train step
and the eval step are compiled ahead of time for the topology, at the experiment's own batch
and mesh (libtpu's compiler on this CPU; no TPU needed), as `loopscale compile` does. One JSON
report per (experiment, step) is kept in --out, so an interrupted run resumes; the Markdown
table (memory per chip, HBM share, estimated step time and MFU, collectives per step) is
printed and written to --out/table.md. It should show every row fitting in at most 90% of HBM.
Paper-size compiles take from seconds to a few minutes each here.

With --chips, each train step is also sized as `loopscale plan --topology` sizes a sweep's
runs (loopscale/sweep/sizing.py): the fewest chips of the topology it fits on at its own batch,
on one host in micro-batches before it takes more hosts (column "chips a run"; "-" where not
sized). Those compiles are of the real scanned step, minutes each at paper size; with
--compile-cache (default: the folder of kept v5p-128 figures) a program compiled before is read
back instead. The paper sweep's own figures there do not serve these presets: their learning
rates, a constant in the program, differ from the sweep's (measured 2026-12-08).

    .venv/bin/python benchmarks/compile_paper.py --topology=v5p-128 --out=runs/compile \
        --steps=train --chips --only=base,looped,moe,looped_moe,isoflop_largest,permutation
"""

from __future__ import annotations

import argparse
import json
import os
import time

from loopscale.aot import topology

EXPERIMENTS = {
    "base": ("experiments/base.py:paper", []),
    "looped": ("experiments/looped.py:paper", []),
    "moe": ("experiments/moe.py:paper", []),
    "looped_moe": ("experiments/looped_moe.py:paper", []),
    "flt_6": ("experiments/flt.py:paper,6", []),
    "flt_12": ("experiments/flt.py:paper,12", []),
    "permutation": ("experiments/permutation.py:paper", []),
    # The MoE families with capacity dispatch (factor 1.25) instead of dropless.
    "moe_capacity": ("experiments/moe.py:paper", ["--config.model.moe_dispatch=capacity"]),
    "looped_moe_capacity": ("experiments/looped_moe.py:paper",
                            ["--config.model.moe_dispatch=capacity"]),
    # The largest run of sweeps/isoflop_paper.py: MoE at the top of its width ladder.
    "isoflop_largest": ("experiments/moe.py:paper",
                        ["--config.model.d_model=1024", "--config.model.n_heads=16"]),
}


def chips_cell(fit: dict | None) -> str:
    """The fewest chips a run fits on, as sized: "4", or "4 (2 micro-batches; whole 8)" for
    one host in micro-batches where the batch whole needs 8."""
    if fit is None:
        return "-"
    if fit["chips"] is None:
        return "none"
    if fit["grad_accum"] is None:
        return str(fit["chips"])
    own = "" if fit["unpacked_chips"] is None else f"; whole {fit['unpacked_chips']}"
    return f"{fit['chips']} ({fit['grad_accum']} micro-batches{own})"


def sized(name: str, config, slc, out: str) -> dict:
    """`config`'s train step sized for `slc` (sizing.fit_shape), kept in out/NAME.chips.json."""
    from loopscale.sweep import sizing

    path = os.path.join(out, f"{name}.chips.json")
    if os.path.exists(path):
        with open(path) as f:
            return json.load(f)
    t0 = time.time()
    fit = sizing.fit_shape(config, slc)
    result = {"chips": fit.chips, "grad_accum": fit.grad_accum,
              "unpacked_chips": fit.unpacked.chips if fit.unpacked else None,
              "step_time_s": fit.step_time_s, "why": fit.why}
    with open(path + ".tmp", "w") as f:
        json.dump(result, f, indent=2)
    os.replace(path + ".tmp", path)
    print(f"{name} chips: {chips_cell(result)} ({time.time() - t0:.0f} s)", flush=True)
    return result


def row(name: str, r: dict, fit: dict | None = None) -> str:
    mem = r["memory_per_chip"]
    coll = r["collectives"] or {}
    moved = sum(c["bytes"] for c in coll.values()) / 1e9
    kinds = ", ".join(f"{k} {c['count']}" for k, c in coll.items() if c["count"])
    time_s = f"{r['est_step_time_s']:.3f}" if r.get("est_step_time_s") else "-"
    mfu = f"{r['est_mfu']:.0%}" if r.get("est_mfu") else "-"
    maxtext = f"{r['est_mfu_maxtext']:.0%}" if r.get("est_mfu_maxtext") else "-"
    # The splash kernel is not priced by XLA's cost model: its time is left out (marked *).
    if r.get("cost_warning") and "does not price" in r["cost_warning"]:
        time_s, mfu, maxtext = time_s + "*", mfu + "*", maxtext + "*"
    mesh = " ".join(f"{k}={v}" for k, v in r["mesh"].items() if v > 1)
    return (f"| {name} | {r['step']} | {r['global_batch']} | {mesh} | "
            f"{mem['arguments'] / 1e9:.1f} | {mem['temporaries'] / 1e9:.1f} | "
            f"{mem['total'] / 1e9:.1f} | {r['hbm_fraction']:.0%} | {time_s} | {mfu} | {maxtext} | "
            f"{moved:.2f} GB ({kinds}) | {r['compile_time_s']:.0f} | {chips_cell(fit)} |")


def main() -> None:
    topology.quiet_libtpu()
    from loopscale.aot import compile as aot
    from loopscale.aot import kept
    from loopscale.config import load_config, parse
    from loopscale.sweep import packing

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--topology", default="v5p-128")
    p.add_argument("--out", default="runs/compile")
    p.add_argument("--only", default="", help="comma-separated experiment names (default: all)")
    p.add_argument("--steps", default="train,eval")
    p.add_argument("--chips", action="store_true",
                   help="also size each train step: the fewest chips it fits on (slow)")
    p.add_argument("--compile-cache", default="benchmarks/results/compile_cache/v5p-128",
                   help="kept compiled figures for --chips (loopscale/aot/kept.py); '' for none")
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    target = aot.tpu_target(args.topology)
    names = args.only.split(",") if args.only else list(EXPERIMENTS)
    lines = [f"Compiled for {target.name} ({len(target.devices)} chips, "
             f"{target.hbm_bytes / 1e9:.1f} GB = {target.hbm_bytes / 2**30:.2f} GiB of HBM each; "
             "GB below are 1e9 bytes):", "",
             "| run | step | batch | mesh | params+opt GB | temporaries GB | total GB | HBM "
             "| est. step s | est. MFU | est. MFU (MaxText) | collectives per step | compile s "
             "| chips a run |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name in names:
        experiment, overrides = EXPERIMENTS[name]
        for step in args.steps.split(","):
            path = os.path.join(args.out, f"{name}.{step}.json")
            if not os.path.exists(path):
                t0 = time.time()
                config = parse(load_config(experiment, overrides))
                report = aot.report(config, target, step)
                with open(path + ".tmp", "w") as f:
                    json.dump(report, f, indent=2)
                os.replace(path + ".tmp", path)
                print(f"{name} {step}: {time.time() - t0:.0f} s", flush=True)
            fit = None
            if args.chips and step == "train":
                with kept.kept_in(args.compile_cache or None):
                    fit = sized(name, parse(load_config(experiment, overrides)),
                                packing.parse_slice(args.topology), args.out)
            with open(path) as f:
                lines.append(row(name, json.load(f), fit))
    table = "\n".join(lines) + "\n"
    with open(os.path.join(args.out, "table.md"), "w") as f:
        f.write(table)
    print(table)


if __name__ == "__main__":
    main()

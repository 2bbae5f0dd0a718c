"""How big the benchmark's models are and how many repetitions each figure gets.

`FULL` is what `loopscale bench` runs (under 10 minutes on a 2-core CPU): d_model 128, two
heads of 64, sequence 128, batch 8, float32, one device; a step is then 0.1-1 s, so the few
milliseconds a step costs to dispatch are under a few per cent. `TINY` runs every figure's
machinery in seconds (tests/test_bench.py); its ratios mean nothing.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Scale:
    name: str
    d_model: int
    n_heads: int
    seq_len: int
    batch_size: int
    reps: int  # interleaved timed rounds per figure, after `warmup`
    warmup: int
    compile_reps: int  # compiles per loop count in the compile-time figure
    base_layers: int  # Base depth of "Looped (base_layers/2 x 2) / Base" (the study: 16)
    layers: int  # depth of Base in the lean and MoE figures (base.py:tiny has 4)
    flt_loops: int  # loops of the FLT / LT and PyTorch figures (flt.py's tiny default: 4)
    memory_loops: int  # loops of the remat memory figure
    compile_loops: tuple[int, int]  # (few, many) loops of the compile-time figure
    data_batches: int  # batches drawn per timed round of the data pipeline
    # `loopscale sweep` overrides of the demo sweep slice the sweep rows read (FULL: Base at
    # the demo's lowest budget, 5 widths, d 8..24, a real piece of the demo); None: those
    # rows are not run
    sweep: tuple[str, ...] | None
    sweep_concurrency: int
    fit_grid: str  # starts of the approach-3 fit (parametric.grid_starts)
    fit_bootstrap: int  # bootstrap refits after it
    mfu_preset: str  # the experiment files' ARG of the MFU figures (paper: the studies' runs)
    mfu_topology: str  # the TPU slice they are compiled for
    host_steps: int  # the host-overhead figure's short run (its long run: 3x as many steps)

    def shape_overrides(self) -> list[str]:
        return [f"--config.model.d_model={self.d_model}",
                f"--config.model.n_heads={self.n_heads}",
                f"--config.model.head_dim={self.d_model // self.n_heads}",
                f"--config.train.seq_len={self.seq_len}",
                f"--config.train.batch_size={self.batch_size}",
                "--config.model.dtype=float32"]

    def describe(self) -> str:
        return (f"d_model {self.d_model}, {self.n_heads} heads of {self.d_model // self.n_heads}, "
                f"batch {self.batch_size} x {self.seq_len} tokens, float32, one CPU device")


FULL = Scale(name="full", d_model=128, n_heads=2, seq_len=128, batch_size=8, reps=11, warmup=1,
             compile_reps=5, base_layers=16, layers=4, flt_loops=4, memory_loops=12,
             compile_loops=(2, 12), data_batches=20,
             sweep=("--sweep.select=base", "--sweep.budgets=(5e10,)"), sweep_concurrency=2,
             fit_grid="hoffmann", fit_bootstrap=1000, mfu_preset="paper", mfu_topology="v5p-128",
             host_steps=200)

TINY = Scale(name="tiny", d_model=32, n_heads=1, seq_len=16, batch_size=2, reps=1, warmup=0,
             compile_reps=1, base_layers=2, layers=2, flt_loops=2, memory_loops=3,
             compile_loops=(1, 2), data_batches=2, sweep=None, sweep_concurrency=1,
             fit_grid="small", fit_bootstrap=4, mfu_preset="tiny", mfu_topology="v5p-8",
             host_steps=100)

SCALES = {s.name: s for s in (FULL, TINY)}

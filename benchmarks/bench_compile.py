"""Compile time of one training step, jit(value_and_grad(loss)) lower + compile, at 2 and 12
loops, with the nested scans (`scan=True`) against the unrolled Python loops (`scan=False`).

    .venv/bin/python benchmarks/bench_compile.py [--config=experiments/flt.py:tiny] [--loops=2,12]

The scanned step compiles one loop body whatever the loop count, so its compile time should stay
flat as loops grow, while the unrolled one grows with loops x layers. Each cell is a fresh
`jax.jit` (no compilation cache), parameters abstract, so nothing is allocated or run; the
fastest of --repeat compiles counts, after one warm-up compile.
"""

import argparse
import dataclasses
import time

import jax

from loopscale.config import load_config, parse
from loopscale.evaluate.xla_cost import lower_train_step


def compile_seconds(model_cfg, train) -> tuple[float, float, float]:
    """(lower, compile, compile CPU) seconds of the training step of `model_cfg`; CPU time is
    the steadier figure on a shared machine."""
    start = time.perf_counter()
    lowered = lower_train_step(model_cfg, train)
    lowered_at, cpu = time.perf_counter(), time.process_time()
    lowered.compile()
    return lowered_at - start, time.perf_counter() - lowered_at, time.process_time() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="experiments/flt.py:tiny")
    parser.add_argument("--loops", default="2,12", help="comma-separated loop counts")
    parser.add_argument("--repeat", type=int, default=2,
                        help="compiles per cell; the fastest counts")
    args = parser.parse_args()

    config = parse(load_config(args.config))
    loops = [int(k) for k in args.loops.split(",")]
    print(f"{args.config}: d {config.model.d_model}, {config.model.n_unique} layers per loop, "
          f"injection {config.model.injection.value}, batch {config.train.batch_size} x "
          f"{config.train.seq_len}, backend {jax.default_backend()}")
    compile_seconds(dataclasses.replace(config.model, n_loops=1), config.train)  # warm-up
    print(f"{'loops':>5} {'path':>8} {'lower s':>8} {'compile s':>10} {'total s':>8} "
          f"{'compile cpu s':>14}")
    for k in loops:
        for scan in (True, False):
            cfg = dataclasses.replace(config.model, n_loops=k, scan=scan)
            lower, comp, cpu = min(
                (compile_seconds(cfg, config.train) for _ in range(args.repeat)),
                key=lambda r: r[0] + r[1])
            path = "scan" if scan else "unrolled"
            print(f"{k:>5} {path:>8} {lower:>8.2f} {comp:>10.2f} {lower + comp:>8.2f} {cpu:>14.2f}",
                  flush=True)


if __name__ == "__main__":
    main()

"""Times Chinchilla approach 3 on the published Chinchilla runs: the 4,500-start Hoffmann grid
plus 1,000 bootstrap refits (warm-started, see loopscale/scaling/parametric.py), and prints the
fit, the 95% intervals and the wall/CPU time of each stage.

    .venv/bin/python benchmarks/bench_fit.py [--bootstrap=1000] [--grid=hoffmann] [--seed=0]

Target: about a minute on a 2-core machine. Reference (Besiroglu et al. 2024): protocol fit
E 1.8172, A 477.8, B 2143.9, alpha 0.3473, beta 0.3672; 95% intervals alpha 0.317-0.373,
beta 0.331-0.415, E 1.769-1.871.
"""

import argparse
import os
import time

import numpy as np
import pandas as pd

from loopscale.scaling.parametric import bootstrap_parametric, fit_parametric, grid_starts

DATA = os.environ.get("CHINCHILLA_CSV", "/work/shared/data/chinchilla_svg_extracted_data.csv")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", type=int, default=1000)
    parser.add_argument("--grid", default="hoffmann", choices=("hoffmann", "small"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data", default=DATA)
    args = parser.parse_args()

    df = pd.read_csv(args.data)
    n, c, loss = (df[k].to_numpy() for k in ("Model Size", "Training FLOP", "loss"))
    keep = loss < np.sort(loss)[-5]  # Besiroglu et al.: drop the five highest losses
    n, d, loss = n[keep], (c / (6 * n))[keep], loss[keep]

    wall, cpu = time.perf_counter(), time.process_time()
    fit = fit_parametric(n, d, loss, grid_starts(args.grid))
    grid_wall, grid_cpu = time.perf_counter() - wall, time.process_time() - cpu
    wall, cpu = time.perf_counter(), time.process_time()
    boot = bootstrap_parametric(fit, n, d, loss, args.bootstrap, np.random.default_rng(args.seed))
    boot_wall, boot_cpu = time.perf_counter() - wall, time.process_time() - cpu

    print(f"{n.size} runs, {fit.n_starts} starts ({fit.n_converged} converged), "
          f"{args.bootstrap} bootstrap resamples ({boot.n_failed} failed)")
    for name, value in fit.figures().items():
        low, high = boot.interval(name) or (float("nan"), float("nan"))
        print(f"  {name:<6}{value:>12.5g}   95% CI [{low:.5g}, {high:.5g}]")
    print(f"grid:      {grid_wall:6.1f} s wall, {grid_cpu:6.1f} s CPU")
    print(f"bootstrap: {boot_wall:6.1f} s wall, {boot_cpu:6.1f} s CPU")
    print(f"total:     {grid_wall + boot_wall:6.1f} s wall, {grid_cpu + boot_cpu:6.1f} s CPU "
          f"(load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)")


if __name__ == "__main__":
    main()

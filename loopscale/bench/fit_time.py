"""How long Chinchilla approach 3 takes on the published Chinchilla runs: the Hoffmann grid of
starts (4,500 at the full scale) and the bootstrap refits (1,000), timed apart, with the fit
and its 95% intervals beside the times so a slow fit can be told from a wrong one.

The table is the checkout's reference data (`data/reference/chinchilla_svg_extracted_data.csv`,
or `$CHINCHILLA_CSV`); the five highest losses are dropped as Besiroglu
et al. 2024 do. Their fit, for comparison: E 1.8172, A 477.8, B 2143.9, alpha 0.3473,
beta 0.3672; 95% intervals alpha 0.317-0.373, beta 0.331-0.415, E 1.769-1.871.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np

from loopscale import checkout


def chinchilla_csv() -> Path | None:
    """The Chinchilla table if this checkout can see it, else None."""
    env = os.environ.get("CHINCHILLA_CSV")
    path = Path(env) if env else checkout.reference_table(checkout.CHINCHILLA)
    return path if path.is_file() else None


def chinchilla_points(path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(parameters, tokens, loss) of the published runs less the five highest losses."""
    import pandas as pd

    df = pd.read_csv(path)
    n, c, loss = (df[k].to_numpy() for k in ("Model Size", "Training FLOP", "loss"))
    keep = loss < np.sort(loss)[-5]
    return n[keep], (c / (6 * n))[keep], loss[keep]


def time_fit(path: Path, grid: str, bootstrap: int, seed: int = 0) -> dict:
    """Wall and CPU seconds of the grid fit and of the bootstrap, the fit, its intervals."""
    from loopscale.scaling.parametric import bootstrap_parametric, fit_parametric, grid_starts

    n, d, loss = chinchilla_points(path)
    starts = grid_starts(grid)
    wall, cpu = time.perf_counter(), time.process_time()
    fit = fit_parametric(n, d, loss, starts)
    grid_wall, grid_cpu = time.perf_counter() - wall, time.process_time() - cpu
    wall, cpu = time.perf_counter(), time.process_time()
    boot = bootstrap_parametric(fit, n, d, loss, bootstrap, np.random.default_rng(seed))
    boot_wall, boot_cpu = time.perf_counter() - wall, time.process_time() - cpu
    figures = fit.figures()
    return {
        "runs": int(n.size), "starts": int(fit.n_starts), "converged": int(fit.n_converged),
        "bootstrap": bootstrap, "bootstrap_failed": int(boot.n_failed),
        "grid_wall_s": grid_wall, "grid_cpu_s": grid_cpu,
        "bootstrap_wall_s": boot_wall, "bootstrap_cpu_s": boot_cpu,
        "total_wall_s": grid_wall + boot_wall,
        "fit": {k: float(v) for k, v in figures.items()},
        "interval_95": {k: [float(x) for x in boot.interval(k)] if boot.interval(k) else None
                        for k in figures},
    }

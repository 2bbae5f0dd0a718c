"""`loopscale eval`: measurements of a run's checkpoint, written into the run directory.

    RUN/eval/NAME.json   {"checkpoint_step", "batches", ...the measurement's figures}
    RUN/eval/NAME.png    its figure

Resumable per measurement: a NAME.json of the same checkpoint step and held-out batches is
kept and not measured again, so a sweep can evaluate each run as it completes and an
interrupted evaluation picks up where it stopped. The run may be finished or still training
(the newest checkpoint, or `step=`). `collect` turns the JSON files' top-level numbers into
columns `NAME_KEY` (rundir.run.read_evals).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import jax

from loopscale.errors import UsageError
from loopscale.evaluate import held_out
from loopscale.evaluate.loaded import Loaded
from loopscale.evaluate.measures import INPUTS, MEASURES, READS_HELD_OUT, Measure
from loopscale.files import read_json, write_atomic, write_json
from loopscale.rundir.load import load_run
from loopscale.rundir.run import CHECKPOINTS, EVAL, checkpoint_steps, read_config
from loopscale.parallel.mesh import make_mesh


def parse_what(spec: str, where: str = "--what") -> tuple[Measure, ...]:
    """Measurement names (comma-separated) -> Measures; UsageError naming `where` if bad."""
    names = [n.strip() for n in spec.split(",") if n.strip()]
    if not names:
        raise UsageError(f"{where} names no measurement")
    built = ", ".join(m.value for m in MEASURES)
    out = []
    for name in names:
        try:
            measure = Measure(name)
        except ValueError:
            raise UsageError(f"{where}={name} is not a measurement (built: {built})") from None
        if measure not in MEASURES:
            raise UsageError(f"{where}={name} is not built yet (built: {built})")
        out.append(measure)
    return tuple(dict.fromkeys(out))


def evaluate_run(rundir: str, what: Sequence[Measure], step: int | None = None,
                 batches: int | None = None, tasks: Sequence[str] = (), data: str = "",
                 loop_counts: Sequence[int] = ()) -> dict[Measure, str]:
    """Takes the measurements `what` of the run in `rundir` (UsageError if it cannot); returns
    the JSON path of each, measured now or kept from before. `tasks`: mc's task files;
    `data`: held-out text files read instead of the run's held-out split (held_out.py);
    `loop_counts`: the loops measure's counts (default 1 .. 2K)."""
    available = checkpoint_steps(os.path.join(rundir, CHECKPOINTS))
    if step is None and available:
        step = available[-1]
    out_dir = os.path.join(rundir, EVAL)
    paths = {m: os.path.join(out_dir, f"{m.value}.json") for m in what}
    # What each measurement reads besides the checkpoint, as an identity kept in its JSON;
    # computed first, so bad task or data files are refused before anything is loaded.
    data_id = held_out.fingerprint(data) if data else {}
    inputs = {}
    for m in what:
        identity = {**(INPUTS[m](tuple(tasks)) if m in INPUTS else {}),
                    **(data_id if m in READS_HELD_OUT else {})}
        if m is Measure.LOOPS and loop_counts:
            identity["loop_counts"] = list(loop_counts)
        if identity:
            inputs[m] = identity
    loaded = None
    for measure in what:
        previous = read_json(paths[measure]) or {}
        if step is not None and previous.get("checkpoint_step") == step and \
                (batches is None or previous.get("batches") == batches) and \
                previous.get("inputs") == inputs.get(measure):
            continue  # up to date
        if loaded is None:
            mesh = make_mesh(read_config(rundir).mesh)  # the run's own mesh, on these devices
            config, params = load_run(rundir, step=step, mesh=mesh)
            n = batches or config.train.eval_batches
            if n < 1:
                raise UsageError(f"--batches must be at least 1, got {n}")
            loaded = Loaded(config, step, params, mesh, n, tuple(tasks), data, tuple(loop_counts))
        measure_fn, plot = MEASURES[measure]
        result = {"checkpoint_step": step, "batches": loaded.batches,
                  **({"inputs": inputs[measure]} if measure in inputs else {}),
                  **measure_fn(loaded)}
        if jax.process_index() == 0:  # every process measures (sharded); one writes
            fig = plot(result, f"{loaded.config.name} at step {step}: {measure.value}")
            write_atomic(paths[measure].removesuffix(".json") + ".png", _png(fig))
            write_json(paths[measure], result)
    return paths


def _png(fig) -> bytes:
    import io

    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120)
    plt.close(fig)
    return buf.getvalue()

"""The measurements `loopscale eval` takes of a trained run, one function each.

Each gets the run loaded once (`Loaded`: config, parameters-only restore on the run's mesh,
the held-out batches) and returns a JSON-able dict of its figures; `plot_*` draws its figure.
Held-out data is the run's own eval split (data/: a fixed split of the run's source that
training never reads, `--batches` batches of it), evaluated in the train step's micro-batches
on the run's mesh, so a paper-scale run evaluates where it trained.

    ppl     held-out loss and perplexity at every loop exit (the last is the model's)
    loops   loss and perplexity at inference loop counts 1 .. 2K (K the trained count)
"""

from __future__ import annotations

import dataclasses
import enum
import math

import jax

from loopscale import data as data_lib
from loopscale.config import Config
from loopscale.evaluate.lm import evaluate, jit_eval_step
from loopscale.model import LoopedLM
from loopscale.train import mesh as mesh_lib


class Measure(str, enum.Enum):
    PPL = "ppl"
    LOOPS = "loops"


@dataclasses.dataclass(frozen=True)
class Loaded:
    """A run's checkpoint, ready to evaluate."""

    config: Config
    step: int  # the checkpoint's
    params: object
    mesh: jax.sharding.Mesh
    batches: int  # held-out batches of config.train.batch_size sequences

    @property
    def model(self) -> LoopedLM:
        return LoopedLM(self.config.model)

    def loss_per_exit(self, n_loops: int) -> tuple[list[float], float]:
        """(mean held-out loss at each loop exit, tokens scored) at `n_loops` loops."""
        c = self.config
        train = dataclasses.replace(c.train, eval_batches=self.batches)
        eval_ds = data_lib.make_dataset(c.data, train, c.seed, "eval", jax.process_index(),
                                        jax.process_count())
        batch_sharding = mesh_lib.batch_sharding(self.mesh)
        with mesh_lib.activate(self.mesh):
            step = jit_eval_step(self.model, train, n_loops,
                                 param_shardings=jax.tree.map(lambda x: x.sharding, self.params),
                                 batch_sharding=batch_sharding)
            out = evaluate(step, self.params, eval_ds, batch_sharding)
        return out["eval_loss_per_loop"], out["eval_tokens"]


def _ppl(loss: float) -> float:
    return math.exp(loss) if loss < 700 else math.inf


def ppl(run: Loaded) -> dict:
    per_exit, tokens = run.loss_per_exit(run.config.model.n_loops)
    return {"loss": per_exit[-1], "ppl": _ppl(per_exit[-1]), "n_loops": run.config.model.n_loops,
            "loss_per_exit": per_exit, "ppl_per_exit": [_ppl(x) for x in per_exit],
            "tokens": tokens}


def loops(run: Loaded) -> dict:
    """Loop counts 1 .. 2K: the looped block run fewer or more times than it was trained for
    (a model without loops, K = 1, runs its whole stack once or twice)."""
    trained = run.config.model.n_loops
    counts = list(range(1, 2 * trained + 1))
    losses = [run.loss_per_exit(k)[0][-1] for k in counts]
    return {"trained_loops": trained, "loop_counts": counts, "loss": losses,
            "ppl": [_ppl(x) for x in losses],
            "loss_at_trained": losses[trained - 1]}


def plot_ppl(result: dict, title: str):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.5))
    exits = range(1, len(result["ppl_per_exit"]) + 1)
    ax.plot(list(exits), result["ppl_per_exit"], marker="o")
    ax.set(xlabel="loop exit", ylabel="held-out perplexity", yscale="log", title=title)
    fig.tight_layout()
    return fig


def plot_loops(result: dict, title: str):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.plot(result["loop_counts"], result["ppl"], marker="o")
    ax.axvline(result["trained_loops"], color="grey", linestyle=":", label="trained")
    ax.set(xlabel="inference loop count", ylabel="held-out perplexity", yscale="log",
           title=title)
    ax.legend()
    fig.tight_layout()
    return fig


MEASURES = {Measure.PPL: (ppl, plot_ppl), Measure.LOOPS: (loops, plot_loops)}

"""The measurements `loopscale eval` takes of a trained run, one function each.

Each gets the run loaded once (`Loaded`: config, parameters-only restore on the run's mesh,
the held-out batches) and returns a JSON-able dict of its figures; `plot_*` draws its figure.
Held-out data is the run's own eval split (data/: a fixed split of the run's source that
training never reads, `--batches` batches of it), evaluated in the train step's micro-batches
on the run's mesh, so a paper-scale run evaluates where it trained.

    ppl     held-out loss and perplexity at every loop exit (the last is the model's)
    loops   loss and perplexity at inference loop counts 1 .. 2K (K the trained count)
    early_exit  per token, exit at the first loop boundary (layer, without loops) whose
            logit-lens entropy is below tau; tau swept: perplexity against forward FLOPs
            saved, and at 5/10/20/30% saved (the sparse-layers study's Table 7;
            early_exit.py says how exits are simulated)
    jsd     Jensen-Shannon divergence (bits) of each exit's distribution from the final one:
            mean and spread over tokens, share of tokens below 0.5 (divergence.py)
    routing MoE top-k sets across loop passes per physical layer: identical / overlapping /
            disjoint shares, distinct experts per token, load per (pass, layer, expert)
            (routing.py)
    accuracy  permutation traversal: final-answer accuracy overall, per hop count and per loop
            exit, beside the shortcut accuracy (answers.py)
    lens    permutation traversal: the logit lens at every layer and loop boundary, at the
            answer position: share naming the node after hop j, per iteration and depth (the
            ladder), each iteration's best hop (lens.py, ladder.py)
    probes  permutation traversal: linear probes for the node after hop j at every layer and
            loop boundary, fitted on half the held-out examples and scored on the other half,
            beside the lens on the same examples (probes.py, probe_fit.py); one process tested
    patching  permutation traversal: the clean run's stream at each (loop, layer, position)
            replaced by a corrupted twin's (another start node): share of answers flipped to
            the corrupted run's and normalised logit difference, iteration (or layer) x
            position (patching.py)
    act_grads  the FLT study's ||dL/dx|| at the end of every layer of every loop, per loop
            boundary and per layer, on held-out micro-batches (act_grads.py)
    mc      downstream multiple choice, OLMES-style: local JSONL tasks (--tasks; default the
            shipped KJV verse task) as cloze and lettered choices, log-likelihood scored with
            none / per-token / per-char / PMI normalisation, accuracy with bootstrap intervals
            (mc.py, mc_score.py, mc_tasks.py; the format: docs/mc_tasks.md)
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from loopscale import data as data_lib
from loopscale.config import Config
from loopscale.data import permutation
from loopscale.errors import UsageError
from loopscale.evaluate import act_grads, held_out, ladder, lens, patching, probes
from loopscale.evaluate import early_exit as exits
from loopscale.evaluate.answers import accuracy_sums, accuracy_table
from loopscale.evaluate.divergence import BELOW, jsd_step
from loopscale.evaluate.lm import evaluate, jit_eval_step
from loopscale.evaluate.mc import mc, plot_mc
from loopscale.evaluate.mc_tasks import fingerprint
from loopscale.evaluate.routing import routing_step
from loopscale.model import LoopedLM
from loopscale.train import mesh as mesh_lib


class Measure(str, enum.Enum):
    PPL = "ppl"
    LOOPS = "loops"
    JSD = "jsd"
    ROUTING = "routing"
    ACCURACY = "accuracy"
    # Issue 11's other measurements; a name without an entry in MEASURES is refused as not
    # built yet (suite.parse_what).
    EARLY_EXIT = "early_exit"
    LENS = "lens"
    PROBES = "probes"
    PATCHING = "patching"
    ACT_GRADS = "act_grads"
    MC = "mc"


@dataclasses.dataclass(frozen=True)
class Loaded:
    """A run's checkpoint, ready to evaluate."""

    config: Config
    step: int  # the checkpoint's
    params: object
    mesh: jax.sharding.Mesh
    batches: int  # held-out batches of config.train.batch_size sequences
    tasks: tuple[str, ...] = ()  # --tasks: mc's task files (none: the shipped one)
    data: str = ""  # --data: held-out text files instead of the run's held-out split

    @property
    def model(self) -> LoopedLM:
        return LoopedLM(self.config.model)

    @property
    def train(self):
        return dataclasses.replace(self.config.train, eval_batches=self.batches)

    def _held_out(self):
        c = self.config
        if self.data:
            return held_out.dataset(c, self.train, self.data, jax.process_index(),
                                    jax.process_count())
        return data_lib.make_dataset(c.data, self.train, c.seed, "eval", jax.process_index(),
                                     jax.process_count())

    def _shardings(self):
        return (jax.tree.map(lambda x: x.sharding, self.params),
                mesh_lib.batch_sharding(self.mesh))

    def loss_per_exit(self, n_loops: int) -> tuple[list[float], float]:
        """(mean held-out loss at each loop exit, tokens scored) at `n_loops` loops."""
        params_sharding, batch_sharding = self._shardings()
        with mesh_lib.activate(self.mesh):
            step = jit_eval_step(self.model, self.train, n_loops, param_shardings=params_sharding,
                                 batch_sharding=batch_sharding)
            out = evaluate(step, self.params, self._held_out(), batch_sharding)
        return out["eval_loss_per_loop"], out["eval_tokens"]

    def sums(self, step_fn, max_batches: int | None = None, prepare=None) -> dict:
        """`step_fn(params, batch, model=, train=, n_loops=)`'s sums over the held-out batches
        (the first `max_batches` of them), at the trained loop count. `prepare(i, local)`, if
        given, returns held-out batch i's rows in this process as the step reads them (fields
        made on the host: patching's corrupted inputs, supervision labels)."""
        params_sharding, batch_sharding = self._shardings()
        step = jax.jit(functools.partial(step_fn, model=self.model, train=self.train,
                                         n_loops=self.config.model.n_loops),
                       in_shardings=(params_sharding, batch_sharding))
        total = None
        with mesh_lib.activate(self.mesh):
            for i, local in enumerate(self._held_out().iterator()):
                if i == max_batches:
                    break
                if prepare is not None:
                    local = prepare(i, local)
                out = jax.device_get(step(self.params, mesh_lib.global_batch(local, batch_sharding)))
                total = out if total is None else jax.tree.map(np.add, total, out)
        return total


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


def jsd(run: Loaded) -> dict:
    """Per exit 1 .. K-1 (the last exit is the final distribution itself)."""
    k = run.config.model.n_loops
    if k < 2:
        return {"n_loops": k, "exits": [], "mean": [], "std": [], "share_below": [],
                "below": BELOW, "note": "one loop: no earlier exit to compare"}
    s = run.sums(jsd_step)
    n = max(float(s["weight"]), 1.0)
    mean = np.asarray(s["js_sum"]) / n
    std = np.sqrt(np.maximum(np.asarray(s["js_sq_sum"]) / n - mean ** 2, 0.0))
    return {"n_loops": k, "exits": list(range(1, k)), "mean": mean.tolist(), "std": std.tolist(),
            "share_below": (np.asarray(s["below"]) / n).tolist(), "below": BELOW,
            "tokens": float(s["weight"]), "mean_first_exit": float(mean[0])}


def early_exit(run: Loaded) -> dict:
    """Entropy-threshold early exit at the trained loop count (early_exit.py)."""
    c = run.config
    cands = exits.Candidates.of(c.model, c.model.n_loops)
    if len(cands.uses) < 2:
        raise UsageError(f"--what=early_exit needs a looped model or more than one layer; "
                         f"{c.name} has one layer and one loop")
    sample = run.sums(exits.entropy_step, max_batches=1)
    taus = exits.tau_grid(c.model.vocab_size, np.asarray(sample["entropy"])[
        :, np.asarray(sample["mask"], bool)])
    sums = run.sums(functools.partial(exits.exit_step, taus=jnp.asarray(taus, jnp.float32)))
    layer_use, forward = exits.layer_use_flops(c.model, c.train.seq_len, c.flop_convention)
    check = 2.0 * c.model.d_model * c.model.vocab_size
    return exits.summarise(sums, taus, cands, layer_use, forward, check)


def routing(run: Loaded) -> dict:
    """Per physical layer, consecutive loop passes compared (a model without loops has no pair
    to compare: refused, rather than reporting shares of zero pairs)."""
    m = run.config.model
    if m.ffn.value != "moe":
        raise UsageError(f"--what=routing needs an MoE model; {run.config.name} has "
                         f"model.ffn={m.ffn.value}")
    if m.n_loops < 2:
        raise UsageError(f"--what=routing compares a token's experts across loop passes; "
                         f"{run.config.name} has model.n_loops={m.n_loops}")
    s = run.sums(routing_step)
    pairs = np.maximum(np.asarray(s["pairs"]), 1.0)
    identical, disjoint = np.asarray(s["identical"]) / pairs, np.asarray(s["disjoint"]) / pairs
    load = np.asarray(s["load"])  # (K, L, E)
    share = load / np.maximum(load.sum(-1, keepdims=True), 1.0)
    unique = np.asarray(s["unique_sum"]) / max(float(s["weight"]), 1.0)
    return {"n_loops": m.n_loops, "layers": list(range(1, m.n_unique + 1)), "top_k": m.top_k,
            "identical": identical.tolist(), "partial": (1 - identical - disjoint).tolist(),
            "disjoint": disjoint.tolist(), "unique_experts": unique.tolist(),
            "load_per_pass": share.tolist(), "tokens": float(s["weight"]),
            "identical_mean": float(identical.mean()), "disjoint_mean": float(disjoint.mean()),
            "unique_experts_mean": float(unique.mean())}


def plot_routing(result: dict, title: str):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.5))
    layers = np.asarray(result["layers"])
    bottom = np.zeros(len(layers))
    for key in ("identical", "partial", "disjoint"):
        ax.bar(layers, result[key], bottom=bottom, label=key)
        bottom += np.asarray(result[key])
    ax.set(xlabel="physical layer", ylabel="share of tokens, consecutive passes", ylim=(0, 1),
           title=title)
    ax.legend(fontsize="small")
    fig.tight_layout()
    return fig


def accuracy(run: Loaded) -> dict:
    c = run.config
    ladder.require_permutation(c, "accuracy")
    sums = run.sums(functools.partial(accuracy_sums, hops_max=c.data.hops_max))
    return {"n_loops": c.model.n_loops, "shortcut_expected": permutation.shortcut_probability(
        c.data.n_nodes, c.data.hops_min, c.data.hops_max), **accuracy_table(sums)}


def plot_accuracy(result: dict, title: str):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.5))
    hops = sorted(result["per_hop"], key=int)
    x = np.arange(len(hops))
    ax.bar(x - 0.2, [result["per_hop"][h]["accuracy"] for h in hops], 0.4, label="model")
    ax.bar(x + 0.2, [result["per_hop"][h]["shortcut"] for h in hops], 0.4, label="shortcut")
    ax.set(xticks=x, xticklabels=hops, xlabel="hops", ylabel="answer accuracy", ylim=(0, 1),
           title=title)
    ax.legend(fontsize="small")
    fig.tight_layout()
    return fig


def plot_jsd(result: dict, title: str):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.5))
    if result["exits"]:
        ax.errorbar(result["exits"], result["mean"], yerr=result["std"], marker="o", capsize=3)
    ax.set(xlabel="loop exit", ylabel="JSD to the final exit (bits)", ylim=(0, 1), title=title)
    fig.tight_layout()
    return fig


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


MEASURES = {
    Measure.PPL: (ppl, plot_ppl),
    Measure.LOOPS: (loops, plot_loops),
    Measure.JSD: (jsd, plot_jsd),
    Measure.EARLY_EXIT: (early_exit, exits.plot),
    Measure.ROUTING: (routing, plot_routing),
    Measure.ACCURACY: (accuracy, plot_accuracy),
    Measure.LENS: (lens.lens, lens.plot_lens),
    Measure.PROBES: (probes.probes, probes.plot_probes),
    Measure.PATCHING: (patching.patching, patching.plot_patching),
    Measure.ACT_GRADS: (act_grads.act_grads, act_grads.plot_act_grads),
    Measure.MC: (mc, plot_mc),
}

# What a measurement reads besides the checkpoint and the held-out batches (from --tasks), as
# a JSON-able identity: suite.py records it and keeps a result only while it is unchanged. It
# is computed before the checkpoint is loaded, so a bad task file is refused first.
INPUTS = {Measure.MC: fingerprint}
# The measurements that read held-out batches (`Loaded._held_out`): `--data` replaces them.
READS_HELD_OUT = frozenset(Measure) - {Measure.MC}

"""The measurements `loopscale eval` takes of a trained run, one function each.

Each gets the run loaded once (`Loaded`, loaded.py: config, parameters-only restore on the
run's mesh, the held-out batches) and returns a JSON-able dict of its figures; its `plot_*`
draws its figure. This module is only the table: the measurements live in their own modules,
which import `Loaded` from below and never this table.

    ppl     held-out held-out loss and perplexity at every loop exit (the last is the model's)
    loops   loss and perplexity at inference loop counts 1 .. 2K (K the trained count) or
            those of --loops, the saturating fit L(r) = L_inf + (L_1 - L_inf) exp(-k (r - 1))
            with intervals, and the stream's norm and step per loop (loop_losses.py)
    early_exit  per token, exit at the first loop boundary (layer, without loops) whose
            logit-lens entropy is below tau; tau swept: perplexity against forward FLOPs
            saved, and at 5/10/20/30% saved (the sparse-layers study's Table 7), each with a
            95% bootstrap interval over held-out sequences; a note says what the run's
            flop_convention counts (early_exit.py says how exits are simulated)
    jsd     Jensen-Shannon divergence (bits) of the logit-lens distribution at every depth
            (after each layer of each loop, looped or not) from the final one: mean and spread
            over tokens, share of tokens below 0.5, also per loop exit; the depth where half
            the tokens are below, as a fraction of the depth (divergence.py)
    routing MoE top-k sets across loop passes per physical layer: identical / overlapping /
            disjoint shares beside random routing's (hypergeometric), distinct experts per
            token, load per (pass, layer, expert) (routing.py)
    accuracy  permutation traversal: final-answer accuracy overall, per hop count and per loop
            exit, beside the shortcut accuracy (accuracy.py)
    lens    permutation traversal: the logit lens at every layer and loop boundary, at the
            answer position: share naming the node after hop j, per iteration, depth and
            matched point (the ladder), each one's best hop and the ladder's scores (rank
            correlation, distance from k H / K); none of it scored for a run at chance
            (lens.py, ladder.py)
    probes  permutation traversal: linear probes for the node after hop j at every layer and
            loop boundary, fitted on 64 generated batches (L2 by cross-validation) and scored
            on the held-out examples, beside the lens on them (probes.py, probe_fit.py); one
            process tested
    patching  permutation traversal: the clean run's stream at each (loop, layer, position)
            replaced by a corrupted twin's (another start node): share of answers flipped to
            the corrupted run's and normalised logit difference, iteration (or layer) x
            position (patching.py)
    act_grads  the FLT study's ||dL/dx|| at the end of every layer of every loop, per loop
            boundary and per layer, on held-out micro-batches (act_grads.py)
    mc      downstream multiple choice, OLMES-style: local JSONL tasks (--tasks; default the
            shipped KJV verse task) as cloze and lettered choices, log-likelihood scored with
            none / per-token / per-char / PMI normalisation, accuracy with bootstrap intervals
            (mc.py, mc_score.py, mc_tasks.py; the format: docs/mc_tasks.md); --tasks=olmes: the
            OLMES core nine from OLMES's own request files, each task's score the better of CF
            and MCF under its primary normalisation, and their average (olmes.py)
"""

from __future__ import annotations

import enum

from loopscale.evaluate import (
    accuracy, act_grads, divergence, early_exit, lens, loop_losses, patching, probes, routing,
)
from loopscale.evaluate.mc import fingerprint, mc, plot_mc


class Measure(str, enum.Enum):
    PPL = "ppl"
    LOOPS = "loops"
    JSD = "jsd"
    ROUTING = "routing"
    ACCURACY = "accuracy"
    EARLY_EXIT = "early_exit"
    LENS = "lens"
    PROBES = "probes"
    PATCHING = "patching"
    ACT_GRADS = "act_grads"
    MC = "mc"


MEASURES = {
    Measure.PPL: (loop_losses.ppl, loop_losses.plot_ppl),
    Measure.LOOPS: (loop_losses.loops, loop_losses.plot_loops),
    Measure.JSD: (divergence.jsd, divergence.plot_jsd),
    Measure.EARLY_EXIT: (early_exit.early_exit, early_exit.plot),
    Measure.ROUTING: (routing.routing, routing.plot_routing),
    Measure.ACCURACY: (accuracy.accuracy, accuracy.plot_accuracy),
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

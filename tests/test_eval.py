"""`loopscale eval`: measurements of a run's checkpoint on its held-out split, written into
the run directory, resumable, and collected as columns."""

import dataclasses
import json
import shutil
from pathlib import Path

import evalkit
import numpy as np
import pytest
import trainkit

from loopscale.cli import main
from loopscale.sweep.collect import collect_dir
from loopscale.train.trainer import train

FIXTURE = Path(__file__).parent / "fixtures" / "rundirs_fb4f2b5" / "killed"


def test_ppl_and_loops_of_a_checkpoint(tmp_path, capsys):
    """The run of the old-format fixture, killed at step 4 (its step-4 evaluation is in its
    metrics): eval of that checkpoint on the same held-out batches gives the same loss."""
    run = tmp_path / "run"
    shutil.copytree(FIXTURE, run)
    logged = [r for r in trainkit.metric_rows(run) if "eval_loss" in r][-1]
    assert main(["eval", f"--workdir={run}", "--what=ppl,loops"]) == 0
    ppl = json.loads((run / "eval" / "ppl.json").read_text())
    assert ppl["checkpoint_step"] == 4 and ppl["batches"] == 2
    assert ppl["loss"] == pytest.approx(logged["eval_loss"], rel=1e-5)
    assert ppl["ppl"] == pytest.approx(2.718281828 ** ppl["loss"], rel=1e-6)
    loops = json.loads((run / "eval" / "loops.json").read_text())
    assert loops["loop_counts"] == [1, 2] and loops["trained_loops"] == 1
    assert loops["loss_at_trained"] == pytest.approx(ppl["loss"], rel=1e-6)
    assert loops["loss"][1] != loops["loss"][0]  # the stack run twice is another model
    for name in ("ppl", "loops"):
        assert (run / "eval" / f"{name}.png").read_bytes()[:4] == b"\x89PNG"
    # Up to date: a second call measures nothing (the files are not rewritten).
    before = (run / "eval" / "ppl.json").stat().st_mtime_ns
    assert main(["eval", f"--workdir={run}", "--what=ppl"]) == 0
    assert (run / "eval" / "ppl.json").stat().st_mtime_ns == before
    # collect carries the figures as columns.
    row = collect_dir(str(run))[0]
    assert row["ppl_loss"] == ppl["loss"] and row["loops_loss_at_trained"] == ppl["loss"]


@pytest.fixture(scope="module")
def looped_run(tmp_path_factory):
    """A tiny looped run trained once for this file's measurements: (config, run directory)."""
    tmp = tmp_path_factory.mktemp("looped")
    corpus = trainkit.write_corpus(str(tmp / "text"))
    cfg = trainkit.config("looped", corpus, str(tmp / "cache"),
                          **{"train.steps": 4, "train.checkpoint_every": 0})
    assert train(cfg, str(tmp / "run")) == 0
    return cfg, tmp / "run"


@pytest.mark.slow
def test_loops_of_a_looped_run_at_every_count(looped_run):
    cfg, run = looped_run
    tmp_path = run.parent
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert main(["eval", f"--workdir={tmp_path / 'run'}", "--what=loops,ppl"]) == 0
    loops = json.loads((tmp_path / "run" / "eval" / "loops.json").read_text())
    k = cfg.model.n_loops
    assert loops["loop_counts"] == list(range(1, 2 * k + 1))
    # At the trained count: the trainer's own final evaluation, per exit too.
    assert loops["loss_at_trained"] == pytest.approx(summary["final_eval_loss"], rel=1e-5)
    ppl = json.loads((tmp_path / "run" / "eval" / "ppl.json").read_text())
    assert ppl["loss_per_exit"] == pytest.approx(summary["eval_loss_per_loop"], rel=1e-5)
    # The stream per loop at the largest count: norms, and steps between consecutive loops.
    assert loops["state_loops"] == list(range(1, 2 * k + 1))
    assert len(loops["residual_norm"]) == 2 * k and len(loops["relative_step"]) == 2 * k - 1
    assert all(0 < s < 10 for s in loops["relative_step"])
    assert loops["saturating_fit"]["fitted"] and loops["saturating_fit"]["dof"] == 2 * k - 3

    # Any counts, beyond training: the trained count is added, and the same counts measure
    # the same losses as the default's.
    assert main(["eval", f"--workdir={run}", "--what=loops", "--loops=1,3,8"]) == 0
    chosen = json.loads((run / "eval" / "loops.json").read_text())
    assert chosen["loop_counts"] == [1, 2, 3, 8] and chosen["state_loops"][-1] == 8
    assert chosen["loss"][:3] == pytest.approx(loops["loss"][:3], rel=1e-6)
    assert chosen["inputs"] == {"loop_counts": [1, 3, 8]}

    # jsd: against the plain computation from the whole (K, B, T, V) exit logits.
    import jax
    import numpy as np

    from loopscale import data as data_lib
    from loopscale.model import LoopedLM
    from loopscale.rundir.load import load_run

    assert main(["eval", f"--workdir={tmp_path / 'run'}", "--what=jsd", "--batches=2"]) == 0
    got = json.loads((tmp_path / "run" / "eval" / "jsd.json").read_text())
    config, params = load_run(tmp_path / "run")
    params = jax.device_get(params)
    train_cfg = dataclasses.replace(config.train, eval_batches=2)
    # The model's forward pass, compiled once for both batches (rather than run op by op).
    exit_logits = jax.jit(lambda p, x: LoopedLM(config.model).apply(
        {"params": p}, x, exit_logits=True).exit_logits)
    js, mask = [], []
    for batch in data_lib.make_dataset(config.data, train_cfg, config.seed, "eval").iterator():
        logits = exit_logits(params, batch["inputs"])
        logp = np.asarray(jax.nn.log_softmax(logits, -1), np.float64)
        js.append(_js_bits_reference(logp[:-1], logp[-1:]))
        mask.append(np.asarray(batch["mask"], np.float64))
    js, mask = np.concatenate(js, 1), np.concatenate(mask, 0)  # (K-1, N, T), (N, T)
    mean = (js * mask).sum((1, 2)) / mask.sum()
    assert got["exits"] == list(range(1, k)) and got["tokens"] == mask.sum()
    np.testing.assert_allclose(got["mean"], mean, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(got["share_below"], ((js < 0.5) * mask).sum((1, 2)) / mask.sum(),
                               atol=1e-6)
    # Measured at every depth now: the loop exits are its loop-boundary depths.
    L = config.model.n_unique
    assert got["depths"] == list(range(1, k * L + 1))
    assert got["mean"] == [got["depth_mean"][j * L - 1] for j in range(1, k)]
    assert got["mean_first_exit"] == got["depth_mean"][L - 1]


def test_held_out_text_files_replace_the_runs_split(tmp_path, capsys):
    """--data: the run's own held-out documents given as files measure exactly what its
    held-out split does; other text measures something else and is kept apart."""
    from loopscale.data.text import kjv_documents, split_tail

    run = tmp_path / "run"
    shutil.copytree(FIXTURE, run)
    assert main(["eval", f"--workdir={run}", "--what=ppl"]) == 0
    own = json.loads((run / "eval" / "ppl.json").read_text())
    _, val_docs = split_tail(kjv_documents(), 0.01)  # the fixture's corpus and val_fraction
    for i, doc in enumerate(val_docs):
        (tmp_path / f"val{i:03d}.txt").write_text(doc)
    data = f"--data={tmp_path}/val*.txt"
    assert main(["eval", f"--workdir={run}", "--what=ppl", data]) == 0
    same = json.loads((run / "eval" / "ppl.json").read_text())
    assert same["loss"] == own["loss"] and same["tokens"] == own["tokens"]
    assert set(same["inputs"]) == {"data"} and "inputs" not in own
    before = (run / "eval" / "ppl.json").stat().st_mtime_ns
    assert main(["eval", f"--workdir={run}", "--what=ppl", data]) == 0  # kept: same files
    assert (run / "eval" / "ppl.json").stat().st_mtime_ns == before
    (tmp_path / "other.txt").write_text(kjv_documents()[0])  # Genesis 1: trained on
    assert main(["eval", f"--workdir={run}", "--what=ppl", f"--data={tmp_path}/other.txt",
                 "--batches=1"]) == 0
    other = json.loads((run / "eval" / "ppl.json").read_text())
    assert other["loss"] != own["loss"] and other["inputs"] != same["inputs"]
    capsys.readouterr()
    # Bad files: one line, exit 2, the measurement on disk untouched.
    for args, phrase in [([f"--data={tmp_path}/none*.txt"], "--data: "),
                         ([f"--data={tmp_path}/other.txt", "--batches=50"], "fewer than the 50")]:
        before = (run / "eval" / "ppl.json").read_bytes()
        assert main(["eval", f"--workdir={run}", "--what=ppl", *args]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and phrase in err[0], err
        assert (run / "eval" / "ppl.json").read_bytes() == before


@pytest.mark.parametrize("args,phrase", [
    (["--what=ppl,nope"], "--what=nope is not a measurement"),
    (["--what=nope"], "--what=nope is not a measurement"),
    (["--what=ppl", "--step=3"], "no checkpoint at step 3 (there are: 4)"),
])
def test_bad_eval_requests_exit_2_in_one_line(tmp_path, capsys, args, phrase):
    run = tmp_path / "run"
    shutil.copytree(FIXTURE, run)
    assert main(["eval", f"--workdir={run}", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and phrase in err[0], err
    assert not (run / "eval").exists()


def _js_bits_reference(logp, logq):
    """JSD(p, q) in bits over the last axis, as the textbook writes it: with m = (p + q) / 2,
    (KL(p || m) + KL(q || m)) / 2 / ln 2 (float64, no logaddexp: the plain formula)."""
    import numpy as np

    p, q = np.exp(logp), np.exp(logq)
    log_m = np.log(0.5 * (p + q))
    return (0.5 * (p * (logp - log_m)).sum(-1) + 0.5 * (q * (logq - log_m)).sum(-1)) / np.log(2)


def _depth_reference(run, batches: int):
    """Per depth (after every layer of every loop, depth-major), each token's logit-lens
    entropy (nats), loss and JSD (bits) to the last depth, from the whole (K*L, N, T, V)
    logits in float64; with the mask and the inputs (N, T)."""
    import jax
    import numpy as np

    from loopscale import data as data_lib
    from loopscale.model import LoopedLM
    from loopscale.rundir.load import load_run

    config, params = load_run(run)
    params = jax.device_get(params)
    model = LoopedLM(config.model, collect_layers=True)
    train_cfg = dataclasses.replace(config.train, eval_batches=batches)

    @jax.jit  # the model's forward pass, compiled once for every batch (not run op by op)
    def depth_logits(params, inputs):
        hidden = model.apply({"params": params}, inputs, readout=False).layer_hidden
        hidden = hidden.reshape(-1, *hidden.shape[2:])  # (K*L, B, T, D)
        return model.apply({"params": params}, hidden, method=LoopedLM.readout)

    out = {"entropy": [], "loss": [], "js": [], "mask": [], "inputs": []}
    for b in data_lib.make_dataset(config.data, train_cfg, config.seed, "eval").iterator():
        logp = np.asarray(jax.nn.log_softmax(np.asarray(depth_logits(params, b["inputs"]),
                                                        np.float64), -1))
        out["js"].append(_js_bits_reference(logp, logp[-1:]))
        out["entropy"].append(-(np.exp(logp) * logp).sum(-1))
        out["loss"].append(-np.take_along_axis(logp, b["targets"][None, ..., None], -1)[..., 0])
        out["mask"].append(np.asarray(b["mask"], np.float64))
        out["inputs"].append(np.asarray(b["inputs"]))
    return {k: np.concatenate(v, 0 if k in ("mask", "inputs") else 1) for k, v in out.items()}


def _bootstrap_reference(sums_per_sequence: dict, inputs):
    """`exit_step`'s bootstrap sums (`boot_*`) from per-sequence sums (N_tau, S) and (S,), with
    the module's own replicate weights of the sequences' tokens: what the device computes."""
    import jax
    import numpy as np

    from loopscale.evaluate import early_exit as exits

    counts = np.asarray(jax.jit(exits.replicate_weights)(inputs), np.float64)  # (R, S)
    return {"boot_loss": counts @ sums_per_sequence["loss"].T,
            "boot_uses": counts @ sums_per_sequence["uses"].T,
            "boot_weight": counts @ sums_per_sequence["weight"]}


@pytest.mark.slow
@pytest.mark.parametrize("which", ["looped", "layers"])
def test_early_exit_against_the_whole_logits(which, looped_run, tmp_path, capsys):
    """A looped run exits at loop boundaries, a run without loops (the fixture's, 4 layers)
    at its layers; every point of the tau sweep equals the exit rule applied by hand, and the
    intervals the bootstrap of the same per-sequence sums. The same reference gives the JSD
    at every depth (jsd), for the looped run and the one without loops alike."""
    import numpy as np

    from loopscale.config.schema import FlopConvention
    from loopscale.evaluate import early_exit as exits
    from loopscale.flops import param_counts
    from loopscale.rundir.run import read_config

    if which == "looped":
        run = looped_run[1]
    else:
        run = tmp_path / "run"
        shutil.copytree(FIXTURE, run)
    cfg = read_config(run)
    K, L = cfg.model.n_loops, cfg.model.n_unique
    assert main(["eval", f"--workdir={run}", "--what=early_exit,ppl,jsd", "--batches=2"]) == 0
    printed = capsys.readouterr().out
    got = json.loads((run / "eval" / "early_exit.json").read_text())
    ref = _depth_reference(run, 2)
    at = np.asarray([L * (k + 1) - 1 for k in range(K)] if K > 1 else range(L))  # candidates
    entropy, loss, mask = ref["entropy"][at], ref["loss"][at], ref["mask"]
    C = entropy.shape[0]
    assert got["candidates"] == ("loop boundaries" if which == "looped" else "layers")
    assert got["candidate_uses"] == (at + 1).tolist()
    assert len(got["candidate_uses"]) == C and got["tokens"] == mask.sum()
    want, per_sequence = [], {"loss": [], "uses": [], "weight": mask.sum(1)}
    uses = np.asarray(got["candidate_uses"], np.float64)
    for tau in got["tau"]:
        below = np.concatenate([entropy[:-1] < tau, np.ones_like(entropy[:1], bool)])
        first = np.argmax(below, axis=0)
        exit_loss = np.take_along_axis(loss, first[None], 0)[0] * mask
        want.append(exit_loss.sum() / mask.sum())
        per_sequence["loss"].append(exit_loss.sum(1))
        per_sequence["uses"].append((uses[first] * mask).sum(1))
    # The tiny looped model's entropies crowd just under ln V, 1e-5 apart, so a few tokens'
    # exits at a threshold hang on float32 rounding (up to 7e-5 of the mean loss seen); the
    # next candidate's loss differs by far more than 1e-4 (checked below), so a wrong rule fails.
    np.testing.assert_allclose(got["loss"], want, rtol=1e-4)
    first_loss, full_loss = ((loss[[0, -1]] * mask).sum((1, 2)) / mask.sum()).tolist()
    assert abs(first_loss - full_loss) > 1e-3 * full_loss
    # tau = 0: nobody leaves early (the model's own loss); past ln V everybody leaves at the
    # first candidate, saving all the depth after it.
    ppl = json.loads((run / "eval" / "ppl.json").read_text())
    assert got["loss"][0] == pytest.approx(ppl["loss"], rel=1e-5)
    assert got["exit_share"][-1][0] == 1.0 and got["flops_saved"][0] == 0.0
    layer_use, forward = exits.layer_use_flops(cfg.model, cfg.train.seq_len,
                                               FlopConvention.SPARSE_STUDY)
    p = param_counts(cfg.model)
    final_norm = cfg.model.d_model if cfg.model.norm_gain else 0
    assert forward == 2 * p["params_active"]
    assert forward - K * L * layer_use == pytest.approx(
        2 * (p["params_active"] - p["params_active_nonembedding"] + final_norm))
    assert cfg.flop_convention is FlopConvention.SPARSE_STUDY
    first_uses = got["candidate_uses"][0]
    assert got["flops_saved"][-1] == pytest.approx((K * L - first_uses) * layer_use / forward)
    assert np.all(np.diff(got["flops_saved"]) >= -1e-12)  # more tau, never less saved
    saved = np.asarray(got["flops_saved"])
    for pct in exits.SAVED_TARGETS:
        value, bracket = got[f"ppl_at_{pct}"], got["brackets"][f"bracket_{pct}"]
        assert (value is None) == (pct / 100 > got["max_saved"]) == (bracket is None)
        if value is None:
            continue
        # Between the grid points either side (the first tau reaching each saving), with
        # log-perplexity linear in the saving, worked out here from the sweep itself.
        lo, hi = bracket
        assert lo <= pct / 100 <= hi and lo in saved and hi in saved
        i, j = int(np.argmax(saved == lo)), int(np.argmax(saved == hi))
        t = 0.0 if hi == lo else (pct / 100 - lo) / (hi - lo)
        assert value == pytest.approx(np.exp((1 - t) * got["loss"][i] + t * got["loss"][j]),
                                      rel=1e-9)
    # The note says what the saved shares are shares of: the study's convention counts the
    # input embedding as a V x D matmul.
    V, D = cfg.model.vocab_size, cfg.model.d_model
    assert got["embedding_in_share"] == pytest.approx(2 * V * D / forward)
    assert "flop_convention=6n_emb" in got["note"] and "input embedding" in got["note"]
    assert f"{got['embedding_in_share']:.1%}" in got["note"] and got["note"] in printed

    # Intervals: the bootstrap of the reference's per-sequence sums with the same replicate
    # weights (the sequences' tokens seed them) gives the same bounds; they bracket the point.
    per_sequence = {k: np.asarray(v, np.float64) for k, v in per_sequence.items()}
    boot = _bootstrap_reference(per_sequence, ref["inputs"])
    assert got["ci_level"] == 0.95 and got["ci_resamples"] == boot["boot_loss"].shape[0]
    full_R = np.exp(boot["boot_loss"][:, 0] / boot["boot_weight"])
    np.testing.assert_allclose([got["ppl_full_low"], got["ppl_full_high"]],
                               np.percentile(full_R, [2.5, 97.5]), rtol=1e-5)
    want_ci = exits.intervals(boot, K * L, layer_use, forward,
                              {k: got[k] for k in ("ppl_full", *(f"ppl_at_{p}" for p in
                                                                 exits.SAVED_TARGETS))})
    for name in ("ppl_full", *(f"ppl_at_{p}" for p in exits.SAVED_TARGETS)):
        low, high = got[f"{name}_low"], got[f"{name}_high"]
        if got[name] is None:
            assert low is None and high is None
            continue
        assert low < got[name] < high, name
        np.testing.assert_allclose([low, high], [want_ci[f"{name}_low"], want_ci[f"{name}_high"]],
                                   rtol=1e-3, err_msg=name)
    assert (run / "eval" / "early_exit.png").read_bytes()[:4] == b"\x89PNG"
    row = collect_dir(str(run))[0]
    assert row["early_exit_ppl_full"] == got["ppl_full"]
    assert row["early_exit_ppl_full_high"] == got["ppl_full_high"]

    # jsd at every depth, looped or not, against the same reference.
    js = json.loads((run / "eval" / "jsd.json").read_text())
    N = K * L
    js_ref = ref["js"]
    assert js["depths"] == list(range(1, N + 1)) and js["loop_boundaries"] == [
        k * L for k in range(1, K + 1)]
    np.testing.assert_allclose(js["depth_mean"], (js_ref * mask).sum((1, 2)) / mask.sum(),
                               rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(js["depth_share_below"],
                               ((js_ref < 0.5) * mask).sum((1, 2)) / mask.sum(), atol=1e-6)
    assert js["depth_mean"][-1] == 0.0 and js["depth_share_below"][-1] == 1.0
    assert all(v > 0 for v in js["depth_mean"][:-1])  # L-1 depths before the last without loops
    # The loop exits are the loop-boundary depths.
    assert js["exits"] == list(range(1, K))
    assert js["mean"] == [js["depth_mean"][k * L - 1] for k in range(1, K)]
    assert js["share_below"] == [js["depth_share_below"][k * L - 1] for k in range(1, K)]
    assert ("mean_first_exit" in js) == (K > 1)
    # Convergence scalars: the first depth where half the tokens are below 0.5 bits, and each
    # token's first such depth, as fractions of the depth.
    share = np.asarray(js["depth_share_below"])
    half = int(np.argmax(share >= 0.5)) + 1
    assert js["converged_half_depth"] == half and js["converged_half_fraction"] == half / N
    first = np.argmax(np.concatenate([js_ref[:-1] < 0.5, np.ones_like(js_ref[:1], bool)]), 0)
    np.testing.assert_allclose(js["first_converged_share"], [(
        (first == d) * mask).sum() / mask.sum() for d in range(N)], atol=1e-6)
    assert js["first_converged_fraction_mean"] == pytest.approx(
        ((first + 1) * mask).sum() / mask.sum() / N, abs=1e-6)
    assert js["note"] in printed and f"from depth {half} of {N}" in js["note"]
    assert (run / "eval" / "jsd.png").read_bytes()[:4] == b"\x89PNG"
    assert collect_dir(str(run))[0]["jsd_converged_half_fraction"] == half / N


def test_bootstrap_interval_shrinks_with_more_sequences():
    """The early-exit interval from the bootstrap sums of synthetic sequences: it brackets the
    point and narrows about as 1/sqrt(sequences) (16 times the sequences: a quarter as wide)."""
    import jax
    import numpy as np

    from loopscale.evaluate import early_exit as exits

    rng = np.random.default_rng(0)
    weights = jax.jit(exits.replicate_weights)
    widths = []
    for n in (64, 1024):
        tokens = np.full(n, 32.0)
        loss = rng.gamma(4.0, 0.75, n) * tokens  # per-sequence summed loss, mean 3 nats
        sums = {"loss": loss[None], "uses": np.full((1, n), 4.0) * tokens, "weight": tokens}
        inputs = rng.integers(0, 256, (n, 32))
        boot = _bootstrap_reference(sums, inputs)
        point = {"ppl_full": float(np.exp(loss.sum() / tokens.sum())),
                 **{f"ppl_at_{p}": None for p in exits.SAVED_TARGETS}}
        ci = exits.intervals(boot, 4, 1.0, 4.0, point)
        assert ci["ppl_full_low"] < point["ppl_full"] < ci["ppl_full_high"]
        assert ci["ppl_at_5_low"] is None and ci["ppl_at_5_high"] is None
        widths.append(ci["ppl_full_high"] - ci["ppl_full_low"])
        # The weights are the sequences' own: the same rows in another order, the same columns.
        order = rng.permutation(n)[:8]
        np.testing.assert_array_equal(np.asarray(weights(inputs[order])),
                                      np.asarray(weights(inputs))[:, order])
    assert 0.15 < widths[1] / widths[0] < 0.35


def test_early_exit_rows_come_back_in_batch_order():
    """The bootstrap weights are drawn for the batch's rows in order, so the per-sequence sums
    taken micro-batch by micro-batch must come back in that order (and the sums add up)."""
    import jax.numpy as jnp
    import numpy as np

    from loopscale.evaluate.early_exit import _rows_over_micro_batches

    batch = {"inputs": jnp.arange(12 * 3).reshape(12, 3)}
    fn = lambda micro: ({"first": micro["inputs"][:, 0] * jnp.ones((2, 1), jnp.int32)},
                        {"total": jnp.sum(micro["inputs"])})
    for accum in (1, 3, 4):
        rows, sums = _rows_over_micro_batches(fn, batch, accum)
        np.testing.assert_array_equal(rows["first"], np.tile(np.arange(12) * 3, (2, 1)))
        assert int(sums["total"]) == int(jnp.sum(batch["inputs"]))


@pytest.mark.parametrize("top_k,n_experts", [(2, 8), (1, 4), (3, 7), (2, 6), (4, 8)])
def test_random_routing_baseline(top_k, n_experts):
    """Two uniform top-k sets of E experts, exactly: top-2 of 8 is the study's 1/28, 12/28,
    15/28; every case against brute-force enumeration of all pairs of sets."""
    import itertools
    import math

    from loopscale.evaluate.routing import random_overlap, random_unique_experts

    got = random_overlap(top_k, n_experts)
    if (top_k, n_experts) == (2, 8):
        assert got == pytest.approx({"identical": 1 / 28, "partial": 12 / 28,
                                     "disjoint": 15 / 28}, abs=1e-12)
        assert [round(100 * got[k], 1) for k in ("identical", "partial", "disjoint")] == [
            3.6, 42.9, 53.6]
    sets = [set(c) for c in itertools.combinations(range(n_experts), top_k)]
    shared = [len(a & b) for a in sets for b in sets]
    count = {"identical": shared.count(top_k), "disjoint": shared.count(0)}
    count["partial"] = len(shared) - count["identical"] - count["disjoint"]
    assert got == pytest.approx({k: v / len(shared) for k, v in count.items()}, abs=1e-12)
    # Distinct experts over two passes: the mean of |a | b| over the same pairs.
    assert random_unique_experts(top_k, n_experts, 2) == pytest.approx(
        sum(len(a | b) for a in sets for b in sets) / len(sets) ** 2)
    assert random_unique_experts(top_k, n_experts, 1) == pytest.approx(top_k)
    assert math.isclose(sum(got.values()), 1.0)


@pytest.mark.slow
def test_routing_across_loop_passes(tmp_path, capsys):
    import jax
    import numpy as np

    from loopscale import data as data_lib
    from loopscale.model import LoopedLM
    from loopscale.rundir.load import load_run
    from loopscale.train.diagnostics import routing_overlap

    corpus = trainkit.write_corpus(str(tmp_path / "text"))
    cfg = trainkit.config("looped_moe", corpus, str(tmp_path / "cache"),
                          **{"train.steps": 3, "train.checkpoint_every": 0})
    run = tmp_path / "run"
    assert train(cfg, str(run)) == 0
    assert main(["eval", f"--workdir={run}", "--what=routing", "--batches=2"]) == 0
    got = json.loads((run / "eval" / "routing.json").read_text())
    m = cfg.model
    assert got["layers"] == list(range(1, m.n_unique + 1))
    shares = np.asarray([got["identical"], got["partial"], got["disjoint"]])
    np.testing.assert_allclose(shares.sum(0), 1.0, atol=1e-6)
    assert all(m.top_k <= u <= min(m.n_loops * m.top_k, m.n_experts) for u in got["unique_experts"])
    np.testing.assert_allclose(np.asarray(got["load_per_pass"]).sum(-1), 1.0, atol=1e-6)
    # The same comparison as the training metric, on the same held-out batches.
    config, params = load_run(run)
    train_cfg = dataclasses.replace(config.train, eval_batches=2)
    # The model's forward pass, compiled once for both batches (not run op by op).
    experts = jax.jit(lambda p, x: LoopedLM(config.model).apply(
        {"params": p}, x, readout=False).moe["experts"])
    chosen = [np.asarray(experts(jax.device_get(params), b["inputs"])) for b in
              data_lib.make_dataset(config.data, train_cfg, config.seed, "eval").iterator()]
    ref = [routing_overlap(e) for e in chosen]
    for key in ("identical", "disjoint"):
        assert got[f"{key}_mean"] == pytest.approx(
            float(np.mean([r[f"route_{key}"] for r in ref])), abs=1e-6)
    # Partial, counted directly (neither side derives it as 1 - identical - disjoint here):
    # consecutive passes' sets as Python sets, sharing some but not all experts.
    partial = [np.mean([0 < len(set(e[t, l, b, s]) & set(e[t + 1, l, b, s])) < m.top_k
                        for t, l, b, s in np.ndindex(e.shape[0] - 1, *e.shape[1:4])])
               for e in chosen]
    assert got["partial_mean"] == pytest.approx(float(np.mean(partial)), abs=1e-6)
    # The random-routing baseline beside them, printed with the measured shares and drawn.
    from loopscale.evaluate.routing import random_overlap

    chance = random_overlap(m.top_k, m.n_experts)
    assert {k: got[f"random_{k}"] for k in chance} == chance
    printed = capsys.readouterr().out
    assert got["note"] in printed and f"disjoint {got['disjoint_mean']:.1%} (random " \
        f"{chance['disjoint']:.1%})" in printed
    assert (run / "eval" / "routing.png").read_bytes()[:4] == b"\x89PNG"
    # A model without loops has no pair of passes to compare: refused (the same weights, read
    # as a one-loop model), not reported as shares of zero pairs.
    one_loop = tmp_path / "one_loop"
    shutil.copytree(run, one_loop, ignore=shutil.ignore_patterns("eval"))
    written = json.loads((one_loop / "config.json").read_text())
    written["model"]["n_loops"] = 1
    (one_loop / "config.json").write_text(json.dumps(written))
    assert main(["eval", f"--workdir={one_loop}", "--what=routing"]) == 2
    assert "model.n_loops=1" in capsys.readouterr().err and not (one_loop / "eval").exists()
    # A dense model has no routing to measure: one line, exit 2, nothing written.
    dense = tmp_path / "dense"
    shutil.copytree(FIXTURE, dense)
    assert main(["eval", f"--workdir={dense}", "--what=routing"]) == 2
    assert "needs an MoE model" in capsys.readouterr().err and not (dense / "eval").exists()


@pytest.mark.slow
def test_permutation_accuracy_per_hop_beside_the_shortcut(tmp_path, tmp_path_factory):
    import jax
    import numpy as np

    from loopscale import data as data_lib
    from loopscale.model import LoopedLM
    from loopscale.rundir.load import load_run

    # The tiny looped permutation preset, 3 steps, hops 2..4, trained for this test (or, in
    # the same process, once for tests/test_eval_lens.py too: each gets its own copy).
    _, run = evalkit.copy_of(evalkit.PERMUTATION_HOPS_2_4, tmp_path_factory, tmp_path / "run")
    assert main(["eval", f"--workdir={run}", "--what=accuracy", "--batches=3"]) == 0
    got = json.loads((run / "eval" / "accuracy.json").read_text())
    config, params = load_run(run)
    train_cfg = dataclasses.replace(config.train, eval_batches=3)
    # The model's forward pass, compiled once for the three batches (not run op by op).
    forward = jax.jit(lambda p, x: LoopedLM(config.model).apply({"params": p}, x).logits)
    right, short, hops = [], [], []
    for b in data_lib.make_dataset(config.data, train_cfg, config.seed, "eval").iterator():
        logits = forward(jax.device_get(params), b["inputs"])
        pred = np.argmax(np.asarray(logits)[np.arange(len(b["answer"])), b["answer_pos"]], -1)
        right.append(pred == b["answer"])
        short.append(b["start"] == b["answer"])
        hops.append(b["hops"])
    right, short, hops = map(np.concatenate, (right, short, hops))
    assert got["examples"] == right.size == 3 * config.train.batch_size
    assert got["accuracy"] == pytest.approx(right.mean()) and got["shortcut"] == short.mean()
    assert got["accuracy_per_exit"][-1] == pytest.approx(right.mean())
    assert sorted(got["per_hop"], key=int) == [str(h) for h in np.unique(hops)]
    for h, row in got["per_hop"].items():
        sel = hops == int(h)
        assert row["examples"] == sel.sum() and row["accuracy"] == pytest.approx(right[sel].mean())
        assert row["shortcut"] == pytest.approx(short[sel].mean())
    # The trainer's own held-out accuracy (summary.json, metrics.jsonl, collect) is the same
    # measurement over its eval batches.
    summary = json.loads((run / "summary.json").read_text())
    final_row = [r for r in trainkit.metric_rows(run) if "eval_loss" in r][-1]
    assert final_row["eval_accuracy"] == summary["final_eval_accuracy"]
    assert 0.0 <= final_row["eval_shortcut"] <= 1.0
    assert main(["eval", f"--workdir={run}", "--what=accuracy",
                 f"--batches={config.train.eval_batches}"]) == 0
    again = json.loads((run / "eval" / "accuracy.json").read_text())
    assert again["accuracy"] == pytest.approx(summary["final_eval_accuracy"])
    assert again["shortcut"] == pytest.approx(final_row["eval_shortcut"])
    assert collect_dir(str(run))[0]["final_eval_accuracy"] == summary["final_eval_accuracy"]


def test_saturating_fit_recovers_a_known_curve():
    """L(r) = L_inf + (L_1 - L_inf) exp(-k (r - 1)): exact on the curve itself; with noise of
    0.01 nats the 95% intervals hold the truth; three counts leave no interval, two no fit."""
    from loopscale.evaluate.loop_losses import saturating, saturating_fit

    counts = [1, 2, 4, 8, 16, 32]
    truth = {"L_inf": 3.1, "L_1": 4.0, "k": 0.45}
    exact = saturating_fit(counts, saturating(counts, *truth.values()).tolist())
    for name, value in truth.items():
        assert exact[name] == pytest.approx(value, rel=1e-6)
    noise = np.random.default_rng(0).normal(0.0, 0.01, len(counts))
    noisy = saturating_fit(counts, (saturating(counts, *truth.values()) + noise).tolist())
    for name, value in truth.items():
        lo, hi = noisy[f"{name}_interval"]
        assert lo < value < hi, (name, noisy)
    three = saturating_fit([1, 2, 4], [4.0, 3.5, 3.3])
    assert three["fitted"] and three["k_interval"] is None
    assert not saturating_fit([1, 2], [4.0, 3.5])["fitted"]

"""`loopscale eval --what=lens,probes`: the logit lens and linear probes of the permutation walk
at every layer and loop boundary (evaluate/lens.py, probes.py, probe_fit.py, ladder.py)."""

import dataclasses
import functools
import json
import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import evalkit
import numpy as np
import pytest

from loopscale import data as data_lib
from loopscale.cli import main
from loopscale.config import load_config, parse
from loopscale.evaluate import ladder, lens, probe_fit, probes as probes_lib
from loopscale.model import LoopedLM
from loopscale.rundir.load import load_run
from loopscale.sweep.collect import collect_dir

TEXT_RUN = Path(__file__).parent / "fixtures" / "rundirs_fb4f2b5" / "killed"
BATCHES = 4
# The fixture's probes: the real 64 generated batches, a cheaper cross-validation (5 fits of 30
# steps instead of 25 of 100: minutes on two cores); the default grid is tested on synthetic
# features below.
CHEAP_CV = probe_fit.ProbeSettings(steps=30, l2_grid=(1e-2, 1.0), folds=2)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A tiny looped (2 x 2) permutation run, a few steps, hops 2..4 (so some hops are masked),
    measured once with both evaluations. (The run of tests/test_eval.py's per-hop accuracy
    test: trained once in a process that runs both, each file measuring its own copy.)"""
    _, rundir = evalkit.copy_of(evalkit.PERMUTATION_HOPS_2_4, tmp_path_factory,
                                tmp_path_factory.mktemp("lens") / "run")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(probes_lib, "SETTINGS", CHEAP_CV)
        assert main(["eval", f"--workdir={rundir}", "--what=lens,probes",
                     f"--batches={BATCHES}"]) == 0
    return rundir


@pytest.fixture(scope="module")
def held_out(run):
    """(config, parameters on the host, the held-out batches the evaluations read, whole)."""
    config, params = load_run(run)
    train_cfg = dataclasses.replace(config.train, eval_batches=BATCHES)
    batches = list(data_lib.make_dataset(config.data, train_cfg, config.seed, "eval").iterator())
    return config, jax.device_get(params), {k: np.concatenate([b[k] for b in batches])
                                            for k in batches[0]}


def plain_lens_predictions(config, params, data) -> np.ndarray:
    """(K, L, N) argmax of the readout of every layer's stream at the answer position, from
    the whole (K, L, B, T, D) hidden states."""
    model = LoopedLM(config.model)
    out = LoopedLM(config.model, collect_layers=True).apply(
        {"params": params}, data["inputs"], readout=False)
    rows = np.arange(len(data["answer_pos"]))
    hidden = np.asarray(out.layer_hidden)[:, :, rows, data["answer_pos"]]  # (K, L, N, D)
    logits = model.apply({"params": params}, jnp.asarray(hidden), method=LoopedLM.readout)
    return np.argmax(np.asarray(logits), -1)


def plain_shares(pred_KxLxN, data) -> np.ndarray:
    """(K, L, H): share of the examples with a hop j whose prediction is the node after it."""
    hit = (pred_KxLxN[..., None] == data["hop_labels"]) & data["hop_mask"]
    return hit.sum(2) / np.maximum(data["hop_mask"].sum(0), 1)  # no examples: 0, as reported


def test_lens_equals_the_readout_of_every_layer(run, held_out):
    config, params, data = held_out
    got = json.loads((run / "eval" / "lens.json").read_text())
    K, L = config.model.n_loops, config.model.n_unique
    pred = plain_lens_predictions(config, params, data)
    share = plain_shares(pred, data)
    assert got["examples"] == len(data["answer"]) == BATCHES * config.train.batch_size
    assert got["hops"] == [1, 2, 3, 4] and got["iterations"] == list(range(1, K + 1))
    assert got["hop_examples"] == data["hop_mask"].sum(0).tolist()
    assert got["hop_examples"][:2] == [got["examples"]] * 2  # hops 1, 2 always exist
    np.testing.assert_allclose(got["layer"], share.reshape(K * L, -1), atol=1e-12)
    np.testing.assert_allclose(got["iteration"], share[:, -1], atol=1e-12)
    # Per walk length: the same shares over the examples whose walk has exactly H hops.
    assert got["walk_examples"] == [int(np.sum(data["hops"] == h)) for h in range(1, 5)]
    for h in (2, 3, 4):
        walk = {k: v[data["hops"] == h] for k, v in data.items()}
        np.testing.assert_allclose(np.asarray(got["walk_layer"])[:, h - 1, :h],
                                   plain_shares(pred[:, :, data["hops"] == h], walk)
                                   .reshape(K * L, -1)[:, :h], atol=1e-12)
    # Looped 2 x 2: matched at its loop boundaries.
    assert got["matched"]["every"] == L
    assert got["matched"]["depths"] == [L * k for k in range(1, K + 1)]
    np.testing.assert_allclose(got["matched"]["rate"], share[:, -1], atol=1e-12)
    right = int(np.sum(pred[-1, -1] == data["answer"]))
    assert got["final_answer"] == pytest.approx(right / len(data["answer"]))
    assert got["shortcut"] == pytest.approx(np.mean(data["start"] == data["answer"]))
    assert got["intermediate_supervision"] is False and got["n_unique"] == L
    # Three steps of training: at chance, so nothing of the ladder is scored.
    assert got["at_chance"] is True
    assert got["at_chance_reason"] == ladder.at_chance_reason(
        right, len(data["answer"]), 1 / config.data.n_nodes, got["shortcut"])
    for key in ("best_hop", "ladder_match", "diagonal", "rank_correlation", "uniform_deviation"):
        assert got[key] is None and got["matched"].get(key) is None, key
    assert (run / "eval" / "lens.png").read_bytes()[:4] == b"\x89PNG"
    # The probes' lens is the same readout on the same (scoring) examples: the held-out ones.
    probes = json.loads((run / "eval" / "probes.json").read_text())
    for key in ("layer", "walk_layer", "final_answer", "at_chance_reason"):
        assert probes["lens"][key] == got[key], key
    assert probes["examples"] == got["examples"] and probes["at_chance"] is True


def test_probes_are_fitted_on_generated_examples_and_scored_on_held_out_ones(run, held_out):
    config, _, data = held_out
    got = json.loads((run / "eval" / "probes.json").read_text())
    assert got["fit_examples"] == probes_lib.FIT_BATCHES * config.train.batch_size
    assert got["fit_data"] == {"split": "eval", "seed": probes_lib.FIT_SEED,
                               "batches": probes_lib.FIT_BATCHES}
    assert got["examples"] == len(data["answer"])
    assert got["shared_permutations"] == 0.0  # 16 nodes: a shared permutation is a ~1e-9 event
    P, H = config.model.n_loops * config.model.n_unique, config.data.hops_max
    assert got["l2_grid"] == sorted(CHEAP_CV.l2_grid) and got["folds"] == CHEAP_CV.folds
    assert np.shape(got["l2_layer"]) == (P, H) and np.shape(got["cv_loss_layer"]) == (P, H, 2)
    assert set(np.ravel(got["l2_layer"])) <= set(got["l2_grid"])
    # each probe's strength is its least cross-validated loss (the stronger one on a tie)
    loss = np.asarray(got["cv_loss_layer"])
    grid = np.asarray(got["l2_grid"])
    pick = grid[len(grid) - 1 - np.argmin(loss[..., ::-1], axis=-1)]
    np.testing.assert_array_equal(got["l2_layer"], pick)
    assert got["intermediate_supervision"] is False and got["best_hop"] is None


def test_lens_of_a_stream_that_names_a_chosen_node(held_out):
    """Hand-built: blocks that add nothing (zero output projections), one-hot embeddings and
    the unembedding their transpose, so every layer's readout at the answer position names the
    token there; the token placed there is example b's node after hop 1 + b % 3, or its start.
    The lens must report exactly those shares."""
    config, _, data = held_out
    cfg = dataclasses.replace(config.model, zero_init_out=True)
    V, D = cfg.vocab_size, cfg.d_model
    model = LoopedLM(cfg)
    # Initialised compiled (not op by op); the random values do not enter the result: zero
    # output projections make every block add nothing, and the embeddings are replaced below.
    params = jax.jit(model.init)(jax.random.key(0), data["inputs"][:1])["params"]
    params = {**params, "embedding": jnp.eye(V, D), "unembed": jnp.eye(V, D).T}
    n = len(data["answer"])
    chosen_hop = np.arange(n) % 4  # 0: the start node; j = 1..3: the node after hop j
    walk = np.concatenate([data["start"][:, None], data["hop_labels"]], 1)
    chosen = walk[np.arange(n), chosen_hop]
    inputs = data["inputs"].copy()
    inputs[np.arange(n), data["answer_pos"]] = chosen
    batch = {**{k: jnp.asarray(v) for k, v in data.items()}, "inputs": jnp.asarray(inputs)}
    step = jax.jit(functools.partial(lens.lens_step, model=model, train=None, n_loops=cfg.n_loops))
    sums = jax.device_get(step(params, batch))
    got = lens.table(sums, config.data.n_nodes, every=cfg.n_unique)
    # By construction: a hop's share counts the examples given that hop's node, plus those
    # whose chosen node happens to equal it (a cycle of the permutation), over its examples.
    expect_H = [np.mean(chosen[data["hop_mask"][:, j]] == data["hop_labels"][data["hop_mask"][:, j], j])
                for j in range(4)]
    assert expect_H[0] >= np.mean(chosen_hop == 1)  # the construction is what it says
    assert expect_H[3] < 0.5  # hop 4 is never chosen: only coincidences name it
    for row in got["layer"] + got["iteration"]:
        np.testing.assert_allclose(row, expect_H, atol=1e-12)
    assert got["start_iteration"] == [pytest.approx(np.mean(chosen == data["start"]))] * cfg.n_loops
    assert got["final_answer"] == pytest.approx(np.mean(chosen == data["answer"]))
    scored = ladder.summary(ladder.Rates.from_counts(sums), cfg.n_unique, at_chance=None)
    assert scored["best_hop"] == [int(np.argmax(expect_H)) + 1] * cfg.n_loops
    assert scored["rank_correlation"] is None  # one best hop throughout: rho is undefined


def test_probe_fitter_finds_a_linear_code_and_not_noise():
    """Synthetic streams: at point 0 a one-hot-like code of hop 1's node plus noise; at point 1
    hop 2's node is coded, scaled 50x with an offset (standardisation must undo it); point 2
    is pure noise. Fitted on 256 examples, scored on 256 others."""
    rng = np.random.default_rng(0)
    N, D, C = 512, 32, 8
    y = rng.integers(C, size=(N, 2)).astype(np.int32)
    mask = np.ones((N, 2), bool)
    mask[::3, 1] = False  # hop 2 missing in a third of the examples
    code = rng.normal(size=(C, D))
    x = np.stack([code[y[:, 0]] + 0.7 * rng.normal(size=(N, D)),
                  50 * (code[y[:, 1]] + 0.7 * rng.normal(size=(N, D))) + 3.0,
                  rng.normal(size=(N, D))]).astype(np.float32)
    probes = probe_fit.fit(x[:, :256], y[:256], mask[:256], n_classes=C)
    acc, count = map(np.asarray, probe_fit.accuracy(probes, x[:, 256:], y[256:], mask[256:]))
    assert count.tolist() == [256, int(mask[256:, 1].sum())]
    assert acc[0, 0] > 0.97 and acc[1, 1] > 0.97  # the coded hop, on unseen examples
    assert acc[0, 1] < 0.25 and acc[1, 0] < 0.25  # the other hop is independent: chance
    assert np.all(acc[2] < 0.25)  # noise: chance (1/8), for all its fit on the fitting half
    fit_acc, _ = probe_fit.accuracy(probes, x[:, :256], y[:256], mask[:256])
    assert np.asarray(fit_acc)[2].min() > 0.3  # it did fit the noise: held-out scoring matters


def test_cross_validation_picks_a_weak_penalty_for_a_code_and_a_strong_one_for_noise():
    """Point 0 codes hop 1's node separably (a scaled one-hot plus a little noise), point 1
    codes hop 2's, point 2 is noise (the shapes of the test above: one compiled fit). Held-out
    cross-entropy falls with the penalty where a probe has nothing to find (its fit shrinks to
    the class frequencies) and rises with it on a code (confident right answers are shrunk)."""
    rng = np.random.default_rng(1)
    N, D, C = 256, 32, 8
    y = rng.integers(C, size=(N, 2)).astype(np.int32)
    mask = np.ones((N, 2), bool)
    x = np.stack([3 * np.eye(C, D)[y[:, 0]] + 0.3 * rng.normal(size=(N, D)),
                  3 * np.eye(C, D)[y[:, 1]] + 0.3 * rng.normal(size=(N, D)),
                  rng.normal(size=(N, D))]).astype(np.float32)
    probes, cv = probe_fit.fit_cv(x, y, mask, n_classes=C)
    grid = sorted(probe_fit.ProbeSettings().l2_grid)
    l2 = np.asarray(cv.l2_PxH)
    assert l2[0, 0] <= 1e-2 and l2[1, 1] <= 1e-2, l2  # the codes
    assert np.all(l2[[0, 1, 2, 2], [1, 0, 0, 1]] >= 1.0), l2  # nothing to find: the top of the grid
    assert grid[-2:] == [1.0, 10.0] and grid[0] == 1e-4
    loss = np.asarray(cv.loss_GxPxH)  # strengths largest first
    assert loss[0, 2, 0] < loss[-1, 2, 0] and loss[0, 0, 0] > loss[-1, 0, 0]
    acc, _ = probe_fit.accuracy(probes, x, y, mask)
    assert np.asarray(acc)[0, 0] == 1.0 == np.asarray(acc)[1, 1]  # refitted on all examples


def rates(K, L, walks: dict[int, int], best) -> ladder.Rates:
    """Synthetic rates: at depth d (1-based) of a K x L network, examples with an H-hop walk
    name hop best(d, H) with rate 0.9 and every other of their hops with rate 0.05; `walks`
    maps H to how many examples have it (hops_max 4)."""
    G = 4
    walk = np.zeros((K, L, G, G))
    for d in range(K * L):
        for h in walks:
            walk[d // L, d % L, h - 1, :h] = 0.05
            walk[d // L, d % L, h - 1, best(d + 1, h) - 1] = 0.9
    walk_G = np.array([walks.get(h, 0) for h in range(1, G + 1)])
    hop_H = np.array([sum(n for h, n in walks.items() if h >= j) for j in range(1, G + 1)])
    hop = np.einsum("klgh,g->klh", walk, walk_G) / np.maximum(hop_H, 1)
    return ladder.Rates(hop, hop_H, walk, walk_G)


def uniform(d: int, h: int, depth: int = 8) -> int:
    """The hop nearest d * h / depth (at least 1): a ladder spread evenly over the depth."""
    return max(1, round(d * h / depth))


def test_a_perfect_ladder_scores_one_and_sits_on_k_h_over_k():
    got = ladder.summary(rates(4, 2, {4: 100}, uniform), every=2, at_chance=None)
    assert got["best_hop"] == [1, 2, 3, 4] == got["matched"]["best_hop"]
    assert got["ladder_match"] == 1.0 and got["diagonal"] == pytest.approx(0.9)
    assert got["rank_correlation"] == pytest.approx(1) and got["uniform_deviation"] == 0.0
    assert got["matched"]["walks"]["4"]["deviation"] == 0.0 and got["at_chance"] is False
    # Walks of 2 and 4 hops, each spread evenly over the 4 iterations: the 4-hop walks sit on
    # k * 4 / 4; the 2-hop ones can only round k * 2 / 4 = 0.5, 1, 1.5, 2 to 1, 1, 2, 2.
    mixed = ladder.summary(rates(4, 2, {2: 50, 4: 50}, uniform), every=2, at_chance=None)
    walks = mixed["matched"]["walks"]
    assert walks["2"]["best_hop"] == [1, 1, 2, 2] and walks["4"]["best_hop"] == [1, 2, 3, 4]
    assert walks["2"]["deviation"] == pytest.approx(0.25) and walks["4"]["deviation"] == 0.0
    assert mixed["uniform_deviation"] == pytest.approx(0.125)
    assert walks["2"]["examples"] == 50 and mixed["walk_examples"] == [0, 50, 0, 50]
    # A one-hop-per-iteration ladder that ignores H: 2-hop walks run past their end (held at
    # hop 2), far from k * 2 / 4.
    rigid = ladder.summary(rates(4, 2, {2: 50, 4: 50}, lambda d, h: min(h, -(-d // 2))),
                           every=2, at_chance=None)
    assert rigid["matched"]["walks"]["2"]["deviation"] == pytest.approx(0.5)


def test_a_reversed_ladder_scores_minus_one_and_a_flat_one_none():
    reverse = ladder.summary(rates(4, 2, {4: 100}, lambda d, h: h + 1 - uniform(d, h)), 2, None)
    assert reverse["best_hop"] == [4, 3, 2, 1] and reverse["rank_correlation"] == pytest.approx(-1)
    assert reverse["ladder_match"] == 0.0 and reverse["uniform_deviation"] == 2.0
    flat = ladder.summary(rates(4, 2, {4: 100}, lambda d, h: 2), 2, None)
    assert flat["best_hop"] == [2, 2, 2, 2] and flat["rank_correlation"] is None
    assert flat["matched"]["walks"]["4"]["rank_correlation"] is None
    assert ladder.rank_correlation([3]) is None  # one point: no rank correlation either


def test_matched_points_put_a_looped_and_an_unshared_ladder_on_one_axis():
    """An unshared 8-layer stack and a looped 2 x 4 model with the same rates at every depth:
    the stack's layers 2, 4, 6, 8 are the looped model's loop boundaries 1..4."""
    looped = ladder.summary(rates(4, 2, {4: 100}, uniform), every=2, at_chance=None)
    unshared = ladder.summary(rates(1, 8, {4: 100}, uniform), every=2, at_chance=None)
    assert unshared["iterations"] == [1] and unshared["matched"]["depths"] == [2, 4, 6, 8]
    assert unshared["matched"] == looped["matched"]
    np.testing.assert_allclose(looped["matched"]["rate"], looped["iteration"])
    # Re-read at a looped partner of 4 layers x 2 loops: layers 4 and 8.
    half = ladder.rematched(json.loads(json.dumps(unshared)), every=4)
    assert half["depths"] == [4, 8] and half["best_hop"] == [2, 4]
    assert half["walks"]["4"]["deviation"] == 0.0 and half["rank_correlation"] == pytest.approx(1)
    with pytest.raises(ValueError, match="do not divide"):
        ladder.rematched(unshared, every=3)
    # The default: a looped model's loop; an unshared stack's depth / hops_max where whole.
    def every(*overrides):
        c = parse(load_config("experiments/permutation.py:paper", list(overrides)))
        return ladder.matched_every(c.model, c.data)
    assert every() == 4  # looped 4 x 8
    assert every("--config.model.n_unique=32", "--config.model.n_loops=1") == 4
    assert every("--config.model.n_unique=4", "--config.model.n_loops=1") == 1


def test_at_chance_results_have_no_ladder_figures():
    # 30 of 100 right: above chance (1/16) but not clearly above a shortcut of 0.25
    reason = ladder.at_chance_reason(30, 100, 1 / 16, 0.25)
    assert reason is not None and "shortcut 0.25" in reason and "100 examples" in reason
    assert ladder.answer_low(30, 100) < 0.25 < 0.3
    assert ladder.at_chance_reason(45, 100, 1 / 16, 0.25) is None  # interval from 0.35
    assert ladder.at_chance_reason(7, 64, 1 / 16, 0.0) is not None  # 0.11, from 0.045: no
    assert ladder.at_chance_reason(0, 0, 1 / 16, 0.0) is not None
    perfect = rates(4, 2, {4: 100}, uniform)
    got = ladder.summary(perfect, every=2, at_chance=reason)
    assert got["at_chance"] is True and got["at_chance_reason"] == reason
    for key in ("best_hop", "ladder_match", "diagonal", "rank_correlation", "uniform_deviation"):
        assert got[key] is None and got["matched"].get(key) is None
    assert got["matched"]["walks"] is None
    np.testing.assert_allclose(got["layer"], perfect.hop_KxLxH.reshape(8, 4))  # rates kept
    fig = ladder.plot([("lens", got)], "at chance")
    assert not any(ax.images for ax in fig.axes)
    assert reason in " ".join(t.get_text() for ax in fig.axes for t in ax.texts)
    scored = ladder.plot([("lens", ladder.summary(perfect, 2, None))], "scored")
    assert sum(len(ax.images) for ax in scored.axes) == 2
    import matplotlib.pyplot as plt
    plt.close("all")


@pytest.mark.parametrize("what", ["lens", "probes"])
def test_a_text_run_is_refused_in_one_line(tmp_path, capsys, what):
    rundir = tmp_path / "run"
    shutil.copytree(TEXT_RUN, rundir)
    assert main(["eval", f"--workdir={rundir}", f"--what={what}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"--what={what} needs the permutation task" in err[0], err
    assert not (rundir / "eval").exists()


def test_collect_carries_the_ladder_scalars(run):
    row = collect_dir(str(run))[0]
    for name in ("lens", "probes"):
        got = json.loads((run / "eval" / f"{name}.json").read_text())
        for key in ("examples", "chance", "final_answer", "final_answer_low"):
            assert row[f"{name}_{key}"] == got[key]
        # at chance: no ladder scalar to carry
        for key in ("ladder_match", "diagonal", "rank_correlation", "uniform_deviation"):
            assert got[key] is None and f"{name}_{key}" not in row
        assert (run / "eval" / f"{name}.png").read_bytes()[:4] == b"\x89PNG"
    assert row["lens_final_answer"] == json.loads((run / "eval" / "lens.json").read_text())["final_answer"]


def test_the_study_reads_its_ladder_from_unsupervised_runs_at_matched_points(run, tmp_path):
    """analysis/permutation.py on a sweep of the fixture's run (looped 2 x 2, at chance) and two
    hand-made ones: a more accurate copy trained with intermediate supervision, and an unshared
    4-layer stack, supervised too, with a clean synthetic ladder (one walk of 4 hops, hop
    d * 4 / 4 at layer d). The looped ladder comes from the unsupervised run (at chance: not
    drawn), the unshared one is noted as taught and read at the looped model's matched points."""
    import sys
    sys.path.insert(0, str(Path(__file__).parent.parent / "analysis"))
    import permutation as study

    from loopscale.files import write_json

    sweep = tmp_path / "sweep"
    real = sweep / "runs" / "real"
    shutil.copytree(run, real)
    config = json.loads((real / "config.json").read_text())
    scored = ladder.summary(rates(1, 4, {4: 100}, lambda d, h: d), every=1, at_chance=None)
    for name, overrides, acc in (
            ("sup", {"train": {**config["train"], "intermediate_supervision": True}}, 0.99),
            ("flat", {"name": "unshared", "model": {**config["model"], "n_unique": 4, "n_loops": 1},
                      "train": {**config["train"], "intermediate_supervision": True}}, 0.95)):
        (sweep / "runs" / name / "eval").mkdir(parents=True)
        (sweep / "runs" / name / "config.json").write_text(json.dumps({**config, **overrides}))
        write_json(sweep / "runs" / name / "summary.json",
                   {"status": "completed", "final_eval_accuracy": acc})
        write_json(sweep / "runs" / name / "eval" / "lens.json",
                   {**scored, "final_answer": acc, "chance": 1 / 16, "examples": 100})
    assert study.main([f"--workdir={sweep}"]) == 0
    report = (sweep / "analysis" / "report.md").read_text()
    ladder_rows = [r for r in report.splitlines() if r.startswith("| permutation | ")]
    assert any("| real | lens |" in r for r in ladder_rows)
    assert not any("| sup |" in r for r in ladder_rows)  # more accurate, but supervised
    assert "Family unshared: only runs trained with intermediate supervision" in report
    lens_json = json.loads((real / "eval" / "lens.json").read_text())
    assert f"permutation/real lens: {lens_json['at_chance_reason']}" in report
    assert not (sweep / "analysis" / "ladder_real.png").exists()  # at chance: not drawn
    assert (sweep / "analysis" / "ladder_flat.png").exists()
    # The unshared stack at its looped partner's matched points: layers 2 and 4 (n_unique 2).
    matched = [r for r in report.splitlines() if r.startswith("| unshared | flat | lens | 2 |")]
    assert matched and "| 2 4 | 1 | H=4: 0 |" in matched[0], matched
    assert (sweep / "analysis" / "ladder_matched.png").exists()

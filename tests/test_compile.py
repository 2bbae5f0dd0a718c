"""Ahead-of-time compilation for TPU topologies (libtpu's compiler on this CPU): topology
names, reading the compiled program, activation constraints in effect, `loopscale compile`.
Weak scaling per family is in test_weak_scaling.py (a file of its own: it is the slowest)."""

import base64
import dataclasses
import json

import jax
import numpy as np
import pytest

from loopscale import cli
from loopscale.aot import compile as aot
from loopscale.aot import hlo as hlo_lib
from loopscale.aot import kept
from loopscale.aot import topology
from loopscale.config import load_config, parse
from loopscale.config.schema import MeshConfig
from loopscale.errors import UsageError

topology.quiet_libtpu()



# --- Topology names. ---

@pytest.mark.parametrize("name, layout, chips", [
    ("v5p-128", "v5p:4x4x4", 64),
    ("v5p-8", "v5p:2x2x1", 4),
    ("v5p:2x2x2", "v5p:2x2x2", 8),
    ("v5litepod-256", "v5e:16x16", 256),
    ("v5e-8", "v5e:2x4", 8),
    ("v6e-256", "v6e:16x16", 256),
    ("v6e-128", "v6e:8x16", 128),
    ("v5p-2", "v5p:1x1x1", 1),
])
def test_topology_names(name, layout, chips):
    topo = topology.parse(name)
    assert (topo.name, topo.chips) == (layout, chips)
    assert topology.parse(name, slices=2).chips == 2 * chips


@pytest.mark.parametrize("name", ["v9-8", "v5p-12", "v5p:4x4", "v5e:2x2x2", "v5p-3", "tpu"])
def test_bad_topology_names_say_why(name):
    with pytest.raises(UsageError, match="topology"):
        topology.parse(name)


def test_two_slices_put_the_data_axis_across_them():
    from loopscale.parallel import mesh as mesh_lib

    devices = topology.devices(topology.parse("v5p:2x2x1", slices=2))
    mesh = mesh_lib.make_mesh(MeshConfig(data=2, fsdp=4, tensor=1, expert=1), devices)
    slice_of = np.vectorize(lambda d: d.slice_index)(mesh.devices)
    # Along `data` the slice changes; along every other axis it does not.
    assert (slice_of[0] == 0).all() and (slice_of[1] == 1).all()
    with pytest.raises(UsageError, match="multiple of the 2 slices"):
        mesh_lib.make_mesh(MeshConfig(data=1, fsdp=8, tensor=1, expert=1), devices)


# --- Reading the compiled program. ---

HLO = """
  %all-reduce.3 = (f32[4,8]{1,0}, /*index=1*/bf16[16]{0}) all-reduce(%a, %b), channel_id=1
  %all-gather-start.1 = (f32[2,8]{1,0}, f32[16,8]{1,0}) all-gather-start(%p), dimensions={0}
  %all-gather-done.1 = f32[16,8]{1,0} all-gather-done(%all-gather-start.1)
  ROOT %reduce-scatter.2 = f32[2]{0} reduce-scatter(%all-reduce.3), dimensions={0}
  %fusion.1 = f32[4]{0} fusion(%all-reduce.3), kind=kLoop
"""


def test_collectives_are_read_from_hlo():
    got = hlo_lib.collectives(HLO)
    assert got["all-reduce"] == {"count": 1, "bytes": 4 * 8 * 4 + 16 * 2}  # the whole tuple
    assert got["all-gather"] == {"count": 1, "bytes": 16 * 8 * 4}  # the result, once
    assert got["reduce-scatter"] == {"count": 1, "bytes": 8}
    assert got["all-to-all"] == got["collective-permute"] == {"count": 0, "bytes": 0}


def test_cost_extrapolation_is_exact_for_a_linear_cost():
    x, a0, a1, b1 = 100.0, 7.0, 9.0, 3.0

    def cost(k, l):
        return x + l * a0 + (k - 1) * (l * a1 + b1)

    points = {(k, l): cost(k, l) for k in (1, 2) for l in (1, 2)}
    assert aot._extrapolate(points, 6, 12) == pytest.approx(cost(6, 12))
    assert aot._extrapolate(points, 1, 16) == pytest.approx(cost(1, 16))


# --- The sharding, as compiled. ---

def _config(family, *overrides):
    return parse(load_config(f"experiments/{family}.py:tiny", list(overrides)))


@pytest.fixture(scope="module")
def v5p8():
    return topology.devices(topology.parse("v5p:2x2x2"))


def test_activation_constraints_split_the_batch_under_fsdp():
    """Under fsdp=4 the lowered step carries the model's constraints, and after partitioning
    each device's attention logits hold batch/4 rows (without the constraints XLA split the
    hidden dimension instead and every device held the whole batch)."""
    B, T, H = 8, 16, 2
    config = _config("base", "--config.mesh.data=1", "--config.mesh.fsdp=4",
                     f"--config.train.batch_size={B}", f"--config.train.seq_len={T}",
                     f"--config.model.n_heads={H}", "--config.model.head_dim=32")
    lowered, _ = aot.lower(config, jax.devices()[:4])
    assert lowered.as_text().count("sharding_constraint") >= 4
    hlo = lowered.compile().as_text()
    assert f"f32[{B // 4},{H},{T},{T}]" in hlo
    assert f"f32[{B},{H},{T},{T}]" not in hlo


# --- `loopscale compile`. ---

def test_compile_command_prints_the_report(capsys, tmp_path, monkeypatch):
    argv = ["compile", "--config=experiments/looped.py:tiny", "--topology=v5p:2x2x2",
            "--config.train.batch_size=16", "--config.mesh.fsdp=-1", "--config.mesh.data=1",
            f"--compile-cache={tmp_path}"]
    code = cli.main(argv)
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    assert (out["chips"], out["device_kind"], out["mesh"]["fsdp"]) == (8, "TPU v5", 8)
    assert out["fits"] is True and 0 < out["hbm_fraction"] < 0.01
    mem = out["memory_per_chip"]
    assert mem["total"] == (mem["arguments"] + mem["outputs"] - mem["aliased"]
                            + mem["temporaries"] + mem["code"])
    assert out["est_step_time_s"] > 0 and 0 < out["est_mfu"] < 1
    # MaxText's count (no embedding lookup, causal attention) over the same time and peak.
    assert 0 < out["model_flops_per_step_maxtext"] < out["model_flops_per_step"]
    assert out["est_mfu_maxtext"] == pytest.approx(
        out["est_mfu"] * out["model_flops_per_step_maxtext"] / out["model_flops_per_step"])
    # The analytic model FLOPs are at least what XLA executes per chip, times the chips,
    # less the optimiser and elementwise work the model count leaves out (within 2x).
    assert out["xla_flops_per_chip"] * 8 == pytest.approx(out["model_flops_per_step"], rel=1.0)
    assert out["collectives"]["all-gather"]["count"] > 0  # FSDP gathers its parameters

    # Again with the figures kept: the same report, and nothing compiled (the real step and
    # the cost's shallow points each read back from the folder).
    def no_compile(*_):
        raise AssertionError("compiled a program whose figures were kept")

    monkeypatch.setattr(aot, "compile_lowered", no_compile)
    assert cli.main(argv) == 0
    again = json.loads(capsys.readouterr().out)
    assert again.pop("compile_time_s") > 0
    assert again == {k: v for k, v in out.items() if k != "compile_time_s"}
    assert len(list(tmp_path.glob("*.json"))) == 5  # the scanned step + 4 shallow points


def test_kept_figures_are_named_by_program_devices_flags_and_reading(v5p8, tmp_path):
    text = aot.lower(_config("base"), v5p8)[0].as_text()
    other = aot.lower(_config("base", "--config.train.batch_size=16"), v5p8)[0].as_text()
    names = {kept.key("memory", text, v5p8, {}), kept.key("memory", other, v5p8, {}),
             kept.key("cost", text, v5p8, {}), kept.key("memory", text, v5p8[:4], {}),
             kept.key("memory", text, v5p8, {"xla_tpu_enable_async_all_gather": True})}
    jax.config.update("jax_exec_time_optimization_effort", -0.5)
    try:
        names.add(kept.key("memory", text, v5p8, {}))
    finally:
        jax.config.update("jax_exec_time_optimization_effort", 0.0)
    assert len(names) == 6
    assert kept.key("memory", text, v5p8, {}) == kept.key("memory", text, v5p8, {})

    # A Pallas kernel's body names its source files by absolute path: where the checkout is
    # does not change the name, what the kernel holds does.
    def kernel(path, op="tpu.matmul"):
        body = base64.b64encode(f"{op}\x00\x07{path}/loopscale/model/moe.py\x00".encode())
        return f'custom_call_config\\22: {{\\22body\\22: \\22{body.decode()}\\22}}'
    assert (kept.key("memory", kernel("/home/a/checkout"), v5p8, {})
            == kept.key("memory", kernel("/srv/b/elsewhere"), v5p8, {}))
    assert (kept.key("memory", kernel("/home/a/checkout"), v5p8, {})
            != kept.key("memory", kernel("/home/a/checkout", "tpu.matmul_other"), v5p8, {}))

    class Lowered:  # a stand-in: figures() reads only its text
        def as_text(self):
            return text

    def fails():
        raise RuntimeError("not a lack of memory")

    with kept.kept_in(tmp_path), pytest.raises(RuntimeError):
        kept.figures("memory", Lowered(), v5p8, {}, fails)
    assert not list(tmp_path.iterdir())  # a failed compile is not kept
    with kept.kept_in(tmp_path):
        assert kept.figures("memory", Lowered(), v5p8, {}, lambda: {"total": 7}) == {"total": 7}
        assert kept.figures("memory", Lowered(), v5p8, {}, fails) == {"total": 7}
    with pytest.raises(RuntimeError):  # no folder: nothing is read
        kept.figures("memory", Lowered(), v5p8, {}, fails)

    # A file named the old way (the raw text, kernel paths and all) is found and renamed.
    class WithKernel:
        def as_text(self):
            return kernel("/home/a/checkout")

    old = kept.key("memory", WithKernel().as_text(), v5p8, {}, raw=True)
    new = kept.key("memory", WithKernel().as_text(), v5p8, {})
    assert old != new
    (tmp_path / f"{old}.json").write_text(json.dumps({"figures": {"total": 9}}))
    with kept.kept_in(tmp_path):
        assert kept.figures("memory", WithKernel(), v5p8, {}, fails) == {"total": 9}
    assert not (tmp_path / f"{old}.json").exists()
    assert json.loads((tmp_path / f"{new}.json").read_text())["figures"] == {"total": 9}


def test_a_step_that_does_not_fit_exits_1_and_says_what_it_needs(capsys):
    code = cli.main(["compile", "--config=experiments/base.py:tiny", "--topology=v5e:1x1",
                     "--no-cost", "--config.model.vocab_size=1000000",
                     "--config.model.d_model=2048", "--config.model.n_heads=16"])
    captured = capsys.readouterr()
    assert code == 1
    assert json.loads(captured.out)["fits"] is False
    assert "does not fit v5e:1x1: needs" in captured.err and len(captured.err.splitlines()) == 1


def test_bad_topology_exits_2(capsys):
    assert cli.main(["compile", "--config=experiments/base.py:tiny", "--topology=v7x-8"]) == 2
    assert "topology" in capsys.readouterr().err


def test_eval_step_compiles_in_micro_batches(v5p8):
    config = _config("flt", "--config.train.batch_size=32", "--config.train.grad_accum=4",
                     "--config.train.ce_chunk=16", "--config.model.vocab_size=4096")
    whole = dataclasses.replace(config, train=dataclasses.replace(
        config.train, grad_accum=1, ce_chunk=0))
    chunked = aot.memory(aot.lower(config, v5p8, "eval")[0].compile())["temporaries"]
    at_once = aot.memory(aot.lower(whole, v5p8, "eval")[0].compile())["temporaries"]
    assert chunked < at_once / 2


@pytest.mark.parametrize("step", ["eval:jsd", "eval:early_exit"])
def test_eval_measurement_steps_compile_in_micro_batches(step, v5p8):
    """`loopscale eval`'s device steps hold what the eval step holds: a micro-batch's stream
    at every exit and a few positions' vocabulary at a time, never (K, B, T, V)."""
    config = _config("flt", "--config.train.batch_size=32", "--config.train.grad_accum=4",
                     "--config.train.ce_chunk=16", "--config.model.vocab_size=4096")
    whole = dataclasses.replace(config, train=dataclasses.replace(
        config.train, grad_accum=1, ce_chunk=0))
    chunked = aot.memory(aot.lower(config, v5p8, step)[0].compile())["temporaries"]
    at_once = aot.memory(aot.lower(whole, v5p8, step)[0].compile())["temporaries"]
    assert chunked < at_once / 2


@pytest.mark.parametrize("step", ["eval:jsd", "eval:early_exit"])
def test_eval_measurement_steps_lower_for_one_layer_run_once(step, v5p8):
    """The cost estimate lowers the step at one layer run once (aot.compile.step_cost): a
    measurement with no depth before the final one still has a program (it failed to trace)."""
    config = _config("flt", "--config.model.n_loops=1", "--config.model.n_unique=1")
    assert "stablehlo" in aot.lower(config, v5p8, step)[0].as_text()


def test_routing_step_of_a_dense_model_is_refused(capsys):
    assert cli.main(["compile", "--config=experiments/base.py:tiny", "--topology=v5p:2x2x2",
                     "--step=eval:routing", "--no-cost"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--step=eval:routing needs an MoE model" in err[0]


def test_libtpu_start_up_is_quiet_on_a_cpu_machine():
    """libtpu is installed; on a host without TPUs its start-up warnings must not reach users
    of any command (they come from C++ at backend start, before Python logging)."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith(("TPU_", "JAX_PLATFORMS",
                                                                     "ALLOW_MULTIPLE_LIBTPU"))}
    run = subprocess.run([sys.executable, "-m", "loopscale.cli", "compile",
                          "--config=experiments/base.py:tiny", "--topology=v5p:2x2x1",
                          "--no-cost"], capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["chips"] == 4
    assert run.stderr == ""


def test_moe_steps_get_a_step_time():
    """libtpu's cost model prices lax.top_k and sort at -1 s each, which made every MoE step's
    estimate negative; the router and the dropless order now use neither (with ragged_dot:
    megablox, dropless MoE's default on TPU, is priced negative, the test below)."""
    target = aot.tpu_target("v5p:2x2x1")
    for dispatch in ("dropless", "capacity"):
        out = aot.report(_config("moe", "--config.train.batch_size=8",
                                 f"--config.model.moe_dispatch={dispatch}",
                                 "--config.model.moe_matmul=ragged_dot"), target)
        assert out["est_step_time_s"] > 0 and out["cost_warning"] is None, dispatch
        assert 0 < out["est_mfu"] < 1


def test_dropless_moe_on_tpu_runs_megablox_and_says_what_xla_cannot_price():
    """model.moe_matmul=auto compiled for TPU: the experts run in megablox's Pallas kernel
    (tiny's sequence of 64 takes no splash attention), whose FLOPs and time XLA's cost model
    leaves out, and whose program it prices negative: the output says both."""
    config = _config("moe", "--config.train.batch_size=8")
    out = aot.report(config, aot.tpu_target("v5p:2x2x1"))
    assert out["fits"] and out["est_step_time_s"] is None
    assert "does not price Pallas TPU kernel" in out["cost_warning"]
    assert "negative step time" in out["cost_warning"]
    # The FLOPs megablox declares: 2 m k n for each of a layer's three matmuls forward, and
    # backward each one's input gradient (gmm) and weight gradient (tgmm), on every chip's
    # rows (its batch's tokens times top_k).
    m = config.model
    rows = config.train.batch_size * config.train.seq_len // out["chips"] * m.top_k
    per_layer = 9 * 2 * rows * m.d_model * m.expert_width
    assert out["kernel_flops_per_chip"] == pytest.approx(per_layer * m.n_unique * m.n_loops)

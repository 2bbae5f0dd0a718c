"""XLA's flags per platform (parallel/xla_flags.py): on a small TPU compile (libtpu on this CPU)
they turn the step's collectives into start/done pairs with compute scheduled between, which
the compile without them has none of; `loopscale compile` compiles with them and reports the
pairs; the launch scripts and the local runner's command.sh carry them to every run, after
the user's own."""

import pytest

from loopscale.aot import compile as aot
from loopscale.aot import hlo as hlo_lib
from loopscale.aot import topology
from loopscale.config import load_config, parse
from loopscale.parallel import xla_flags
from loopscale.sweep import launchers, processes
from loopscale.sweep import plan as plan_lib

topology.quiet_libtpu()


@pytest.fixture(scope="module")
def fsdp_step():
    """Base at d 512 under fsdp=4 on a v5p host: all-gathers of the parameters, reduce-scatters
    of their gradients, in the layer scan."""
    devices = topology.devices(topology.parse("v5p:2x2x1"))
    config = parse(load_config("experiments/base.py:tiny", [
        "--config.model.d_model=512", "--config.model.n_heads=4", "--config.model.head_dim=128",
        "--config.train.seq_len=512", "--config.train.batch_size=16", "--config.mesh.data=1",
        "--config.mesh.fsdp=4",
        # XLA's own gathers and scatters, layer by layer: under `once` they run before the
        # first layer and after the last, with no compute to overlap (docs/compile.md)
        "--config.train.grad_reduction=per_use"]))
    lowered, _ = aot.lower(config, devices)
    return config, devices, lowered


def test_the_tpu_flags_overlap_collectives_with_compute(fsdp_step):
    """`loopscale compile`'s step (compile_step, with the flags) against the same lowered step
    compiled without them."""
    config, devices, lowered = fsdp_step
    plain = hlo_lib.async_collectives(lowered.compile().as_text())
    flagged = aot.compile_step(config, devices)["async_collectives"]
    assert plain == {"pairs": 0, "with_compute_between": 0}
    assert flagged["pairs"] >= 4  # the four layers' gathers and scatters, at least
    assert flagged["with_compute_between"] == flagged["pairs"]


def test_cpus_get_no_flags_and_a_users_own_come_first(monkeypatch):
    assert xla_flags.compiler_options("cpu") == {} and xla_flags.env("cpu") == {}
    monkeypatch.setenv("XLA_FLAGS", "--xla_dump_to=/tmp/x")
    value = xla_flags.env("gpu")["XLA_FLAGS"]
    assert value.startswith("--xla_dump_to=/tmp/x --xla_gpu_enable_latency_hiding_scheduler=true")
    monkeypatch.delenv("LIBTPU_INIT_ARGS", raising=False)
    assert xla_flags.env("tpu") == {"LIBTPU_INIT_ARGS": xla_flags.as_args(xla_flags.TPU)}


def _plan():
    return plan_lib.plan_file("sweeps/isoflop_cpu.py").runs[:2]


def test_the_launch_scripts_set_each_platforms_flags():
    runs = _plan()
    options = launchers.ClusterOptions()
    tpu = launchers.tpu_pod_script("s", runs, "gs://b/s", options)
    assert f'LIBTPU_ARGS="${{LIBTPU_INIT_ARGS:+$LIBTPU_INIT_ARGS }}' \
           f'{xla_flags.as_args(xla_flags.TPU)}"' in tpu
    assert 'LIBTPU_INIT_ARGS=$(printf %q "$LIBTPU_ARGS")' in tpu  # in every run's command
    gpu = launchers.slurm_script("s", runs, "/w", launchers.ClusterOptions(gpus_per_node=8))
    assert f'export XLA_FLAGS="${{XLA_FLAGS:+$XLA_FLAGS }}{xla_flags.as_args(xla_flags.GPU)}"' \
        in gpu
    cpu = launchers.slurm_script("s", runs, "/w", launchers.ClusterOptions())
    assert "XLA_FLAGS" not in cpu


def test_a_runs_command_sh_records_the_hosts_flags(tmp_path, monkeypatch):
    monkeypatch.setattr(xla_flags, "local_platform", lambda: "tpu")
    monkeypatch.delenv("LIBTPU_INIT_ARGS", raising=False)
    run = _plan()[0]
    processes.prepare(run, str(tmp_path), ["loopscale", "train"], [])
    script = (tmp_path / "runs" / run.run_id / "command.sh").read_text()
    assert f"export LIBTPU_INIT_ARGS='{xla_flags.as_args(xla_flags.TPU)}'" in script
    monkeypatch.setattr(xla_flags, "local_platform", lambda: "cpu")
    processes.prepare(run, str(tmp_path), ["loopscale", "train"], [])
    assert "LIBTPU_INIT_ARGS" not in (tmp_path / "runs" / run.run_id / "command.sh").read_text()

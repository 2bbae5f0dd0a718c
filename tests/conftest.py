"""Every test sees 8 virtual CPU devices (set before JAX initialises its backend)."""

import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

from loopscale.aot.topology import quiet_libtpu  # noqa: E402

quiet_libtpu()  # libtpu is installed for the TPU compile tests; keep its start-up quiet

import jax  # noqa: E402

jax.config.update("jax_platforms", "cpu")

"""The persistent compilation cache is turned off for a mesh of several CPU devices, where
XLA:CPU executables read back from it deadlock in their collectives (parallel/xla_cache.py; the
abort itself was reproduced by hand: a dropless Looped-MoE run on 8 CPU devices, twice, the
second from the cache)."""

import jax
import numpy as np
from jax.experimental.compilation_cache import compilation_cache
from jax.sharding import Mesh

from loopscale.parallel import xla_cache


def test_cache_goes_off_for_several_cpu_devices_only(tmp_path, capsys):
    saved = (jax.config.jax_enable_compilation_cache, jax.config.jax_compilation_cache_dir)
    try:
        jax.config.update("jax_compilation_cache_dir", str(tmp_path))
        jax.config.update("jax_enable_compilation_cache", True)
        one = Mesh(np.array(jax.devices()[:1]), ("data",))
        assert not xla_cache.off_for_cpu_collectives(one)
        assert jax.config.jax_enable_compilation_cache  # one device keeps it
        several = Mesh(np.array(jax.devices()[:2]), ("data",))
        assert xla_cache.off_for_cpu_collectives(several)
        assert not jax.config.jax_enable_compilation_cache
        assert "2 CPU devices" in capsys.readouterr().err
        assert not xla_cache.off_for_cpu_collectives(several)  # already off: said once
        assert capsys.readouterr().err == ""
    finally:
        jax.config.update("jax_enable_compilation_cache", saved[0])
        jax.config.update("jax_compilation_cache_dir", saved[1])
        compilation_cache.reset_cache()

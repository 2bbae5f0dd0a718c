"""Conversions between the scanned parameter layout and the unrolled (Python-loop) one.

Scanned: loop/stack/layers/<leaf> with a leading axis of size n_unique.
Unrolled: loop/stack/layer_<l>/<leaf>. Same numbers, so the two paths can be compared exactly.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def unstack_layers(params: dict, n_unique: int) -> dict:
    params = dict(params)
    loop = dict(params["loop"])
    stack = dict(loop["stack"])
    layers = stack.pop("layers")
    for layer in range(n_unique):
        stack[f"layer_{layer}"] = jax.tree.map(lambda p, i=layer: p[i], layers)
    loop["stack"] = stack
    params["loop"] = loop
    return params


def stack_layers(params: dict, n_unique: int) -> dict:
    params = dict(params)
    loop = dict(params["loop"])
    stack = dict(loop["stack"])
    per_layer = [stack.pop(f"layer_{layer}") for layer in range(n_unique)]
    stack["layers"] = jax.tree.map(lambda *p: jnp.stack(p), *per_layer)
    loop["stack"] = stack
    params["loop"] = loop
    return params

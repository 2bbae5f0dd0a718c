"""Conversions between the scanned parameter layout and the unrolled (Python-loop) one.

Scanned: loop/stack/layers/<leaf> with a leading axis of size n_unique, and likewise
prelude/layers and coda/layers (model.n_prelude, model.n_coda) when the model has them.
Unrolled: loop/stack/layer_<l>/<leaf> (prelude/layer_<l>, coda/layer_<l>). Same numbers, so the
two paths can be compared exactly.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

PARTS = ("prelude", "coda")  # unlooped layer stacks beside the core's loop/stack


def _unstacked(stack: dict, n: int) -> dict:
    stack = dict(stack)
    layers = stack.pop("layers")
    for layer in range(n):
        stack[f"layer_{layer}"] = jax.tree.map(lambda p, i=layer: p[i], layers)
    return stack


def _stacked(stack: dict, n: int) -> dict:
    stack = dict(stack)
    per_layer = [stack.pop(f"layer_{layer}") for layer in range(n)]
    stack["layers"] = jax.tree.map(lambda *p: jnp.stack(p), *per_layer)
    return stack


def _each_stack(params: dict, core, part) -> dict:
    """`core` applied to the loop's layer stack, `part` to the prelude's and the coda's."""
    params = dict(params)
    params["loop"] = {**params["loop"], "stack": core(params["loop"]["stack"])}
    for name in PARTS:
        if name in params:
            params[name] = part(params[name])
    return params


def unstack_layers(params: dict, n_unique: int) -> dict:
    return _each_stack(params, lambda stack: _unstacked(stack, n_unique),
                       lambda stack: _unstacked(stack, len(jax.tree.leaves(stack)[0])))


def stack_layers(params: dict, n_unique: int) -> dict:
    return _each_stack(params, lambda stack: _stacked(stack, n_unique),
                       lambda stack: _stacked(stack, len(stack)))

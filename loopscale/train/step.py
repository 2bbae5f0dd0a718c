"""The training objective and the pure, module-level train step.

`train_step` is jitted once per loop count (trainer.py) with explicit shardings and the state
donated. Everything static (model, optimiser, config) is bound with functools.partial. The
held-out evaluation step that the trainer runs is train/eval_loss.py.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
from typing import Any

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import optax

from loopscale.config.enums import FFNKind, GradReduction
from loopscale.config.schema import TrainConfig
from loopscale.model import LoopedLM, ModelOutputs, StreamEdit
from loopscale.model.loss import cross_entropy, lm_loss, z_loss
from loopscale.model.sharding import (BATCH_AXES, current_platform, gather, manual_part,
                                      reduce_to)
from loopscale.train.diagnostics import routing_overlap
from loopscale.train.optimizer import scheduled_update


@flax.struct.dataclass
class TrainState:
    step: jax.Array
    params: Any
    opt_state: Any


def _sq_norm(tree) -> jax.Array:
    return sum(jnp.sum(jnp.square(x.astype(jnp.float32))) for x in jax.tree.leaves(tree))


def readout_fn(model: LoopedLM, params, lead=("act_batch", "act_length")):
    """hidden (..., D) -> logits (..., V) through the shared final norm and unembedding."""
    return lambda h: model.apply({"params": params}, h, lead=lead, method=LoopedLM.readout)


def _at_answer(hidden_NxBxTxD, pos_B) -> jax.Array:
    """The stream at each row's answer position: (N, B, T, D) -> (N, B, D)."""
    return hidden_NxBxTxD[:, jnp.arange(pos_B.shape[0]), pos_B]


def loop_supervision_loss(readout, loop_hidden_KxBxTxD, batch) -> jax.Array:
    """Intermediate supervision: the exit at loop boundary j, read at the answer position, is
    trained on `loop_labels[:, j]` (data/permutation.py: the node after j+1 hops, holding the
    answer once all hops are done). The last boundary is the main loss's already."""
    labels_BxK = batch["loop_labels"]
    n = labels_BxK.shape[1] - 1
    if n <= 0:
        return jnp.zeros((), jnp.float32)
    logits_nxBxV = readout(_at_answer(loop_hidden_KxBxTxD[:n], batch["answer_pos"]))
    return cross_entropy(logits_nxBxV, labels_BxK[:, :n].T, jnp.ones_like(labels_BxK[:, :n].T))


def layer_supervision_loss(readout, layer_hidden_LxBxTxD, batch) -> jax.Array:
    """Intermediate supervision of an unshared model: the boundary after layer l, read out with
    the shared final norm and unembedding at the answer position, is trained on
    `layer_labels[:, l]` where `layer_label_mask` says so (data/permutation.py)."""
    labels_BxL, mask_BxL = batch["layer_labels"], batch["layer_label_mask"]
    n = labels_BxL.shape[1]
    logits_nxBxV = readout(_at_answer(layer_hidden_LxBxTxD[:n], batch["answer_pos"]))
    return cross_entropy(logits_nxBxV, labels_BxL.T, mask_BxL.T)


def _supervises_loops(batch, train: TrainConfig) -> bool:
    return train.intermediate_supervision and "loop_labels" in batch


def _supervises_layers(batch, train: TrainConfig) -> bool:
    return train.intermediate_supervision and "layer_labels" in batch


def loss_fn(params, batch, model: LoopedLM, train: TrainConfig, n_loops: int,
            edit: StreamEdit | None = None, frozen_loops: jax.Array | None = None,
            max_frozen: int = 0):
    """The training loss: `objective` of the model's forward pass at `n_loops` loops. Every
    train step and XLA's FLOP count (evaluate/xla_cost.py) differentiate this function; the
    activation gradients (act_grad_norms) differentiate it with respect to a zero `edit.add`.
    `frozen_loops` (traced, at most `max_frozen`): the step shared by every loop count of a
    truncated schedule (loop_schedule.shared_frozen_slots): that many loops without a gradient,
    then `n_loops` = train.bptt_loops with one."""
    if _supervises_layers(batch, train):
        model = model.clone(collect_layers=True)
    out = model.apply({"params": params}, batch["inputs"], n_loops=n_loops, readout=False,
                      edit=edit, all_exits=_supervises_loops(batch, train),
                      bptt_loops=0 if frozen_loops is not None else train.bptt_loops,
                      frozen_loops=frozen_loops, max_frozen=max_frozen)
    return objective(params, out, batch, model, train)


def objective(params, out: ModelOutputs, batch, model: LoopedLM, train: TrainConfig):
    """(loss, aux) of a forward pass `out` of `model` on `batch`: the LM
    cross-entropy at the configured loops, the logit z-loss, intermediate supervision and the
    MoE auxiliary losses at their train-config weights. Apart from `loss_fn` so that a caller
    that runs the model itself (the coordinate check, evaluate/coordcheck.py, captures
    intermediates) differentiates the same objective."""
    n_loops = out.loop_hidden.shape[0]
    supervise = _supervises_loops(batch, train)
    mask = batch["mask"]
    ce, lse_BxT = lm_loss(readout_fn(model, params), out.exit_hidden, batch["targets"], mask,
                          model.cfg.loss_loops, train.ce_chunk)
    total = ce
    if train.z_loss_weight:
        total = total + train.z_loss_weight * z_loss(lse_BxT, mask)
    aux = {"ce": ce, "residual_norm": out.residual_norm}
    points = readout_fn(model, params, lead=(None, "act_batch"))
    if supervise:
        hop = loop_supervision_loss(points, out.exit_hidden, batch)
        total, aux["loop_supervision_loss"] = total + hop, hop
    if _supervises_layers(batch, train):
        hop = layer_supervision_loss(points, out.layer_hidden[-1], batch)
        total, aux["layer_supervision_loss"] = total + hop, hop
    if out.moe is not None:
        total = total + train.lb_loss_weight * out.lb_loss + train.router_z_weight * out.router_z
        aux.update(lb_loss=out.lb_loss, router_z=out.router_z,
                   expert_load=jnp.mean(out.moe["expert_load"], axis=1),  # (K, E) over layers
                   dropped_frac=jnp.mean(out.moe["dropped_frac"]))
        if n_loops > 1:
            aux.update(routing_overlap(out.moe["experts"]))
    return total, aux


# Whether `gradients` unrolls its loop over micro-batches: read when the step is traced, set
# only by `unrolled_micro_batches` (aot.compile.step_cost, whose XLA cost analysis counts a
# while loop's body once). The step computes the same either way; a trained step keeps the
# loop, so that one micro-batch's activations are live at a time.
_UNROLL_MICRO_BATCHES = contextvars.ContextVar("unroll_micro_batches", default=False)


@contextlib.contextmanager
def unrolled_micro_batches():
    """Steps traced inside run their micro-batches unrolled (for cost analysis only)."""
    token = _UNROLL_MICRO_BATCHES.set(True)
    try:
        yield
    finally:
        _UNROLL_MICRO_BATCHES.reset(token)


def micro_batches(batch, accum: int):
    """(B, ...) -> (accum, B/accum, ...) with micro-batch i = rows i, i+accum, ..., so each
    micro-batch keeps rows from every data-parallel shard."""
    def split(x):
        x = x.reshape(x.shape[0] // accum, accum, *x.shape[1:])
        return jnp.swapaxes(x, 0, 1)
    return jax.tree.map(split, batch)


def _tokens(batch) -> jax.Array:
    return jnp.sum(batch["mask"].astype(jnp.float32))


def gradients(params, batch, model: LoopedLM, train: TrainConfig, n_loops: int,
              frozen_loops: jax.Array | None = None, max_frozen: int = 0,
              total: jax.Array | None = None):
    """(loss, aux, grads) of the batch, its micro-batches summed. Each micro-batch's loss is a
    mean over its own masked tokens; weighted by its share of the batch's `total` masked
    tokens, the summed loss and gradient are those of the whole batch at once. `total`: the
    masked tokens of the whole batch where this program holds only its own rows of it
    (`local_gradients`, which sums the results over the devices); None: these."""
    whole = total is None and train.grad_accum == 1
    if total is None:
        total = jnp.maximum(_tokens(batch), 1.0)

    def objective(p, micro):
        loss, aux = loss_fn(p, micro, model, train, n_loops, frozen_loops=frozen_loops,
                            max_frozen=max_frozen)
        if whole:  # the batch all at once in one program: its own mean is the loss
            return loss, aux
        return loss * (_tokens(micro) / total), aux

    grad_fn = jax.value_and_grad(objective, has_aux=True)
    if train.grad_accum == 1:
        (loss, aux), grads = grad_fn(params, batch)
        return loss, aux, grads

    def body(carry, micro):
        (loss, aux), grads = grad_fn(params, micro)
        acc_loss, acc_grads = carry
        return (acc_loss + loss, jax.tree.map(jnp.add, acc_grads, grads)), aux

    init = (jnp.zeros((), jnp.float32), jax.tree.map(jnp.zeros_like, params))
    (loss, grads), aux = jax.lax.scan(body, init, micro_batches(batch, train.grad_accum),
                                      unroll=_UNROLL_MICRO_BATCHES.get())
    return loss, jax.tree.map(lambda a: jnp.mean(a, axis=0), aux), grads


@dataclasses.dataclass(frozen=True)
class GradLayout:
    """Where the parameters are stored and where their gradient is wanted, as trees of
    PartitionSpecs shaped like the parameters (sharded_state.py): `grads` is `params` with
    `data` added under ZeRO-1 (the optimiser state's split, parallel/mesh.zero1_shardings).
    `local_gradients` gathers the parameters from the one and reduces the gradient to the
    other; without a layout both are whole."""

    params: Any
    grads: Any


def once_axes(model: LoopedLM, train: TrainConfig, layout: GradLayout | None = None
              ) -> tuple[str, ...]:
    """The mesh axes over which `local_gradients` reduces the gradient once a step: those of
    `data` and `fsdp` that split the batch, where the config asks for it and at most one other
    axis splits the step (none for an MoE); () otherwise.
    `fsdp` also splits the parameters, so it needs their `layout`: they are gathered once at
    the start of the step and the gradient reduce-scattered once at its end (left to XLA,
    both happen at every use of the shared block). `expert` and `tensor` stay XLA's. An MoE's
    load-balancing loss is a statistic of the whole batch: its expert load is averaged over
    the devices inside (model/moe.py); with `expert` or `tensor` splitting its experts as
    well it keeps XLA's per-use reduction."""
    mesh = jax.sharding.get_abstract_mesh()
    if train.grad_reduction is not GradReduction.ONCE or mesh.manual_axes:
        return ()
    candidates = ("data", "fsdp") if layout is not None else ("data",)
    axes = tuple(a for a in candidates if a in mesh.axis_names and mesh.shape[a] > 1)
    others = sum(mesh.shape[a] > 1 for a in mesh.axis_names if a not in axes)
    # XLA's partitioner (jaxlib 0.10.2) aborts on a step manual over `data` that two other
    # axes split (data x fsdp x tensor with only `data` manual: a failed check in
    # spmd_partitioner_util.cc, measured); one other axis is fine.
    if others > (0 if model.cfg.ffn is FFNKind.MOE else 1):
        return ()
    return axes


def _without(rules, manual: tuple[str, ...]):
    """The logical axis rules with the shard_map's manual axes taken out: inside it, the
    activations' constraints may name only the axes the compiler still partitions."""
    def kept(axes):
        axes = (axes,) if isinstance(axes, str) else axes or ()
        left = tuple(a for a in axes if a not in manual)
        return left[0] if len(left) == 1 else left or None
    return tuple((name, kept(axes)) for name, axes in rules)


def local_gradients(axes: tuple[str, ...], layout: GradLayout | None, params, batch,
                    model: LoopedLM, train: TrainConfig, n_loops: int,
                    frozen_loops: jax.Array | None = None, max_frozen: int = 0):
    """`gradients` with one reduction a step: a shard_map manual over `axes` (the rest left to
    the compiler) in which each device differentiates its own rows with respect to its own
    whole copy of the parameters, summing the gradient over every loop's use of the shared
    block and every micro-batch; then one reduction to where `layout` wants the gradient (an
    all-reduce; a reduce-scatter over the axes that split it: fsdp, ZeRO-1's data). Parameters
    split over fsdp are gathered once, before the loops. Left to XLA, the step reduces each
    use's gradient as it is made and gathers the block again for each use (measured: bytes
    growing with the loop count, tests/test_grad_reduction.py). Under fsdp this holds the
    whole parameters and their float32 gradient on every chip through the step, as data
    parallelism does; `per_use` keeps FSDP's memory.
    The loss is exact (each device's mean weighted by its share of the masked tokens) where an
    MoE's auxiliary losses are not in it; theirs, means over every token, and the other
    metrics (the devices' mean) are exact where every device holds as many masked tokens
    (packed text, the algorithmic tasks). Each device's gradient is summed in float32 and then
    reduced in the model's compute dtype (off CPUs)."""
    mesh = jax.sharding.get_abstract_mesh()
    rules = _without(nn.get_logical_axis_rules(), axes)
    # The sum travels in the compute dtype, as the partial sums of each use did under XLA's
    # own partitioning (bfloat16 at paper scale: half the bytes of the float32 gradient). Not
    # on CPUs: XLA:CPU widens a bfloat16 all-reduce to float32 anyway, and jaxlib 0.10.2
    # aborts doing so on this one (AllReducePromotion: "Invalid binary instruction opcode").
    wire = jnp.float32 if current_platform() == "cpu" else jnp.dtype(model.cfg.dtype.value)
    whole = jax.sharding.PartitionSpec()
    if layout is None:
        param_specs = grad_specs = jax.tree.map(lambda _: whole, params)
    else:
        param_specs, grad_specs = (jax.tree.map(lambda s: manual_part(s, axes), tree)
                                   for tree in (layout.params, layout.grads))

    def fetch(path, w, spec):
        # The shared layers' weights travel in the compute dtype: every one is cast to it
        # where it is used (attention.py, ffn.py, layers.RMSNorm), so rounding it first
        # changes nothing computed. The rest travel as stored: the embedding table is scaled
        # before its cast, the loop's own injection and modulation weights are combined in
        # float32. Differentiated at float32, every use's gradient is still summed in float32.
        if not any(spec):  # whole already (not split over a manual axis)
            return w
        shared_layers = [getattr(k, "key", None) for k in path[:2]] == ["loop", "stack"]
        return gather(w.astype(wire if shared_layers else w.dtype), spec).astype(w.dtype)

    def local(params, batch, frozen):
        params = jax.tree_util.tree_map_with_path(fetch, params, param_specs)
        if "fsdp" in axes:
            # The barrier keeps the gathers where they are: without it libtpu sinks a copy of
            # each into every matmul that uses the weight, forward and backward, on every
            # loop (measured on v5p: the MLP weights gathered 3 times a layer, the
            # unembedding 5).
            params = jax.lax.optimization_barrier(params)
        total = jnp.maximum(jax.lax.psum(_tokens(batch), axes), 1.0)
        with nn.logical_axis_rules(rules):
            loss, aux, grads = gradients(params, batch, model, train, n_loops, frozen,
                                         max_frozen, total)
        grads = jax.tree.map(lambda g, spec: reduce_to(g.astype(wire), spec, axes).astype(
            g.dtype), grads, grad_specs)
        return (jax.lax.psum(loss, axes), jax.tree.map(lambda x: jax.lax.pmean(x, axes), aux),
                grads)

    # The rows split over the manual axes in the order the batch is stored, so that entering
    # the shard_map moves nothing.
    rows = jax.sharding.PartitionSpec(tuple(a for a in BATCH_AXES if a in axes))
    # check_vma off: the splash kernel's own shard_map inside (model/attention_core.py) does
    # not say how its outputs vary, which the checked autodiff needs. Nothing is reduced
    # inside the differentiated function, so its gradient is each device's own.
    return jax.shard_map(local, mesh=mesh, in_specs=(param_specs, rows, whole),
                         out_specs=(whole, whole, grad_specs), axis_names=frozenset(axes),
                         check_vma=False)(params, batch, frozen_loops)


def train_step(state: TrainState, batch, lr_factor: jax.Array, frozen_loops=None, *,
               model: LoopedLM, tx: optax.GradientTransformation, train: TrainConfig,
               n_loops: int, max_frozen: int = 0, layout: GradLayout | None = None):
    """One optimiser step; `lr_factor` is the schedule's multiplier lr_t / peak for this step
    (an argument, so the compiled step does not depend on the schedule: optimizer.py);
    `frozen_loops` with `max_frozen`: the step shared across loop counts (`loss_fn`);
    `layout`: the parameters' and gradient's partitioning (`GradLayout`), for
    `local_gradients`."""
    axes = once_axes(model, train, layout)
    reduced = functools.partial(local_gradients, axes, layout) if axes else gradients
    loss, aux, grads = reduced(state.params, batch, model, train, n_loops, frozen_loops,
                               max_frozen)
    updates, opt_state = scheduled_update(tx, grads, state.opt_state, state.params, lr_factor)
    params = optax.apply_updates(state.params, updates)
    layer_grads = grads["loop"]["stack"]
    metrics = {
        "loss": loss,
        "grad_norm": optax.tree.norm(grads),  # before clipping (clipping lives in tx)
        "update_norm": optax.tree.norm(updates),
        "grad_norm_embedding": jnp.sqrt(_sq_norm(grads["embedding"])),
        "grad_norm_head": jnp.sqrt(_sq_norm(grads["unembed"])),
        **aux,
    }
    if train.log_grad_cosine:  # recorded by optimizer.track_grad_cosine on the raw gradient
        metrics["grad_cosine"] = optax.tree.get(opt_state, "grad_cosine")
    if "layers" in layer_grads:  # scanned: one norm per unique layer (the FLT "per block")
        metrics["grad_norm_block"] = jnp.sqrt(sum(
            jnp.sum(jnp.square(g), axis=tuple(range(1, g.ndim))) for g in jax.tree.leaves(layer_grads)))
    return TrainState(step=state.step + 1, params=params, opt_state=opt_state), metrics


def loop_grad_norms(params, batch, *, model: LoopedLM, train: TrainConfig, n_loops: int) -> jax.Array:
    """Norm of each loop's contribution to the shared block's gradient, shape (n_loops,).

    The block's params are tiled once per loop and fed to the per-loop-params model, which then
    computes exactly the shared model; the gradient with respect to copy t is loop t's share."""
    per_loop = model.clone(per_loop_params=True)
    tiled = {**params, "loop": jax.tree.map(
        lambda p: jnp.broadcast_to(p, (n_loops, *p.shape)), params["loop"])}
    grads = jax.grad(lambda p: loss_fn(p, batch, per_loop, train, n_loops)[0])(tiled)["loop"]
    return jnp.sqrt(sum(jnp.sum(jnp.square(g), axis=tuple(range(1, g.ndim)))
                        for g in jax.tree.leaves(grads)))


def act_grad_norms(params, batch, *, model: LoopedLM, train: TrainConfig, n_loops: int
                   ) -> jax.Array:
    """||dL/dx_l^(t)||, shape (n_loops, n_unique): the gradient of the training objective
    (`loss_fn`, this batch's own mean) with respect to the stream at the end of layer l of loop
    t, as the FLT authors log it (scripts/base_check.py: the L2 norm of a block's output
    gradient over the whole (B, T, D) tensor of one micro-batch, per loop and block; their loss
    is also divided by the number of micro-batches, not done here). Taken as the gradient with
    respect to a zero `add` of the stream hook, which is the stream's total gradient: through
    the following layers, the next loops and every readout of it. Column -1 is the loop
    boundary."""
    K, L, D = n_loops, model.cfg.n_unique, model.cfg.d_model
    B, T = batch["inputs"].shape
    keep = jnp.ones((K, L, B, T), jnp.float32)

    def loss(add):
        return loss_fn(params, batch, model, train, n_loops, StreamEdit(keep, add))[0]

    g = jax.grad(loss)(jnp.zeros((K, L, B, T, D), jnp.float32))
    return jnp.sqrt(jnp.sum(jnp.square(g), axis=(2, 3, 4)))

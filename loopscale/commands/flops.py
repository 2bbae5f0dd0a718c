"""`loopscale flops --config=...`: parameters and training FLOPs per token, analytic and as XLA
counts them, as JSON on stdout (loopscale/flops.py documents every field and convention).

Keys: params_embedding (input embedding + unembedding), params_unique (other stored params),
params_effective (those per use, K x the layers), params_active (per use, MoE router + top_k
experts, with the vocabulary matrices: the sparse-layers study's N_active; the variants
params_active_nonembedding and params_active_stored give the other readings), params_total;
flop_convention and count_router (whether the active counts and the 6N FLOPs include the MoE
routers' weights: model.count_router, false in the sparse-layers study's presets);
flops_per_token_train (the config's flop_convention), flops_per_token_6n (6 x non-embedding
active params per use), flops_per_token_by_convention, flops_per_token_computed (what the
compiled step executes), xla_flops_per_token_train (XLA's cost analysis of the unrolled step
jit(value_and_grad(loss)) on a train.batch_size x train.seq_len batch) and their ratio."""

from __future__ import annotations

import argparse
import json

from loopscale.commands.common import add_config_arg, load_experiment


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "flops", help="parameters and FLOPs per token, analytic and as XLA counts them",
        description=__doc__.split("\n\n")[0].replace("\n", " "))
    add_config_arg(p)
    p.add_argument("--no-xla", dest="xla", action="store_false",
                   help="skip compiling the step for XLA's count (its fields are null)")
    p.set_defaults(run=run)


def flops_report(config, xla: bool = True) -> dict:
    """Everything `loopscale flops` prints, for a validated Config."""
    import jax

    from loopscale import flops

    # The CPU lowering of jax.lax.ragged_dot is dense over all experts; GPU/TPU are grouped.
    dense = jax.default_backend() == "cpu"
    out = flops.report(config.model, config.train.seq_len, config.flop_convention, dense)
    out["batch_size"] = config.train.batch_size
    out["tokens_per_step"] = config.train.batch_size * config.train.seq_len
    out["backend"] = jax.default_backend()
    out["xla_flops_per_token_train"] = None
    out["xla_transcendentals_per_token_train"] = None
    out["computed_over_xla"] = None
    if xla:
        from loopscale.evaluate.xla_cost import xla_flops_per_token_train

        out.update(xla_flops_per_token_train(config.model, config.train))
        if out["xla_flops_per_token_train"]:
            ratio = out["flops_per_token_computed"] / out["xla_flops_per_token_train"]
            out["computed_over_xla"] = ratio
    return out


def run(args: argparse.Namespace) -> int:
    config = load_experiment(args)
    print(json.dumps(flops_report(config, xla=args.xla), indent=2))
    return 0

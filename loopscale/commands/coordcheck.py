"""`loopscale coordcheck --config=... --out=DIR`: the muP coordinate check
(loopscale/evaluate/coordcheck.py).

Writes DIR/coordcheck.json and DIR/coordcheck.png, prints one summary line, and exits 0 whether
or not the check passes (it is a measurement; `passed` and `violations` in the JSON say).
"""

from __future__ import annotations

import argparse
import dataclasses

from loopscale.commands.common import add_config_arg, load_experiment
from loopscale.errors import UsageError
from loopscale.evaluate import coordcheck

_DEFAULTS = coordcheck.Settings()


def _widths(text: str) -> tuple[int, ...]:
    try:
        widths = tuple(int(w) for w in text.split(",") if w.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"--widths={text!r} must be comma-separated integers") from None
    if len(widths) < 2 or min(widths) < 1:
        raise argparse.ArgumentTypeError(f"--widths={text!r} needs at least two positive widths")
    return widths


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "coordcheck", help="muP coordinate check across widths, per layer and per loop iteration",
        description=__doc__.splitlines()[0],
    )
    add_config_arg(parser)
    parser.add_argument("--out", required=True, help="directory for coordcheck.json and .png")
    parser.add_argument("--widths", type=_widths, default=(64, 128, 256, 512, 1024),
                        help="comma-separated d_model values (head size fixed)")
    parser.add_argument("--steps", type=int, default=_DEFAULTS.steps, help="Adam steps")
    parser.add_argument("--lr", type=float, default=_DEFAULTS.lr,
                        help="constant Adam learning rate at the base width (no warmup)")
    parser.add_argument("--seeds", type=int, default=_DEFAULTS.seeds, help="seeds averaged")
    parser.add_argument("--batch-size", type=int, default=_DEFAULTS.batch_size)
    parser.add_argument("--seq-len", type=int, default=_DEFAULTS.seq_len)
    parser.add_argument("--tol", type=float, default=1.2,
                        help="allowed ratio between the widest and narrowest width")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    cfg = load_experiment(args)
    for name in ("steps", "seeds", "batch_size", "seq_len"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')}={getattr(args, name)} must be at least 1")
    if args.lr <= 0:
        raise UsageError(f"--lr={args.lr} must be positive")
    if args.tol <= 1.0:
        raise UsageError(f"--tol={args.tol} must be above 1")
    t = cfg.train
    settings = dataclasses.replace(
        _DEFAULTS, steps=args.steps, lr=args.lr, seeds=args.seeds, batch_size=args.batch_size,
        seq_len=args.seq_len, b1=t.b1, b2=t.b2, eps=t.eps, z_loss_weight=t.z_loss_weight,
        lb_loss_weight=t.lb_loss_weight, router_z_weight=t.router_z_weight,
    )
    result = coordcheck.run(cfg.model, args.widths, settings, tol=args.tol)
    json_path, png_path = coordcheck.write(result, args.out)
    worst = max(result["max_ratio"], key=result["max_ratio"].get)
    print(f"coordcheck {cfg.model.param.value} widths {min(args.widths)}..{max(args.widths)}: "
          f"{'passed' if result['passed'] else 'FAILED'}, worst {worst} "
          f"x{result['max_ratio'][worst]:.3f} (tol {args.tol}); wrote {json_path}, {png_path}")
    for note in result["notes"]:
        print(f"note: {note}")
    return 0

"""Reads `--config=experiments/NAME.py[:ARG]` plus `--config.a.b=v` overrides.

This module runs the config file itself (so that each way a file can be wrong is one line
naming the file: a syntax error and its line, an import that fails, no `get_config`, a
`get_config` that raises) and hands the ConfigDict to ml_collections' config-dict flag, which
applies the typed overrides on a private FlagValues, so that the library never touches absl's
global flags. Every failure is a one-line UsageError.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Sequence
from types import ModuleType

import ml_collections
from absl import flags
from ml_collections import config_flags

from loopscale.errors import UsageError


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0]}" if text else type(e).__name__


def _run_file(path: str, module_name: str) -> ModuleType:
    """Executes the config file as a module; any failure is a UsageError naming the file."""
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except SyntaxError as e:  # also IndentationError
        raise UsageError(f"{path}: line {e.lineno}: {e.msg}") from e
    except Exception as e:  # an import or a statement at the top of the file failed
        raise UsageError(f"{path}: loading it raised {_first_line(e)}") from e
    return module


def _call_get_config(path: str, module: ModuleType, arg: str | None):
    get_config = getattr(module, "get_config", None)
    if not callable(get_config):
        raise UsageError(f"{path} has no get_config(arg)")
    try:
        return get_config() if arg is None else get_config(arg)
    except Exception as e:  # the file's own check (a bad ARG, say): its message is the point
        raise UsageError(f"{path}: get_config raised {_first_line(e)}") from e


def load_config(spec: str, overrides: Sequence[str] = (), flag: str = "config") -> ml_collections.ConfigDict:
    """Loads an ml_collections config file with overrides such as `--config.model.d_model=256`.

    `spec` is PATH or PATH:ARG (ARG goes to `get_config`); `flag` names the flag (`config` for
    experiments, `sweep` for sweep files)."""
    path, _, arg = spec.partition(":")
    if not os.path.isfile(path):
        raise UsageError(f"--{flag}: no such file {path}")
    cfg = _call_get_config(path, _run_file(path, f"{flag}_config"), arg if ":" in spec else None)
    if not isinstance(cfg, ml_collections.ConfigDict):
        raise UsageError(f"{path}: get_config() returned {type(cfg).__name__}, not a ConfigDict")
    argv = ["loopscale", *overrides]
    values = flags.FlagValues()
    # sys_argv: the flag defines one override flag per `--config.x` it sees there.
    try:
        config_flags.DEFINE_config_dict(flag, cfg, flag_values=values, lock_config=True,
                                        sys_argv=argv)
        values(argv)
        cfg = getattr(values, flag)
    except flags.Error as e:  # unparsable or ill-typed override, unknown flag
        raise UsageError(str(e).splitlines()[0]) from None
    except (AttributeError, KeyError) as e:  # an override naming a field that does not exist
        field = str(e).strip("'\"")
        bad = next((o for o in overrides if field in o), field)
        raise UsageError(f"unknown config field in {bad.split('=')[0].lstrip('-')}") from None
    except (TypeError, ValueError) as e:
        raise UsageError(f"bad override: {str(e).splitlines()[0]}") from None
    return cfg

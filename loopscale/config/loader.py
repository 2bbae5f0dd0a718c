"""Reads `--config=experiments/NAME.py[:ARG]` plus `--config.a.b=v` overrides.

The ml_collections config-file flag does the work (file loading, the `:ARG` suffix, typed
overrides); this module only gives it a private FlagValues, so that the library never touches
absl's global flags, and turns its exceptions into one-line UsageErrors.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import ml_collections
from absl import flags
from ml_collections import config_flags

from loopscale.errors import UsageError


def load_config(spec: str, overrides: Sequence[str] = (), flag: str = "config") -> ml_collections.ConfigDict:
    """Loads an ml_collections config file with overrides such as `--config.model.d_model=256`.

    `flag` names the flag (`config` for experiments, `sweep` for sweep files)."""
    path = spec.split(":", 1)[0]
    if not os.path.isfile(path):
        raise UsageError(f"--{flag}: no such file {path}")
    argv = ["loopscale", f"--{flag}={spec}", *overrides]
    values = flags.FlagValues()
    # sys_argv: the flag defines one override flag per `--config.x` it sees there.
    config_flags.DEFINE_config_file(flag, flag_values=values, lock_config=True, sys_argv=argv)
    try:
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
    if not isinstance(cfg, ml_collections.ConfigDict):
        raise UsageError(f"--{flag}={spec}: get_config() did not return a ConfigDict")
    return cfg

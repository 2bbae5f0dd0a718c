"""Files of the checkout beside the package: sweeps/ and data/reference/.

loopscale is installed editable from its checkout (`make install`: `pip install -e`), so the
checkout's folders sit one level above the package wherever the clone is. Commands that default
to one of them (the demo's sweep, the bench's reference table) find it here, never through the
current directory or a path of one machine. A non-editable install carries neither folder:
callers check that the file exists and say so in one line.
"""

from __future__ import annotations

from pathlib import Path

import loopscale
from loopscale.errors import UsageError

# The published tables the fitting code is tested against (data/reference/PROVENANCE.md).
CHINCHILLA = "chinchilla_svg_extracted_data.csv"
PORIAN_POINTS = "porian2024_isoflop_points.csv"
PORIAN_OPTIMA = "porian2024_isoflop_optima.csv"


def root() -> Path:
    """The checkout the package was installed from (read when asked, not at import)."""
    return Path(loopscale.__file__).resolve().parents[1]


def reference_table(name: str) -> Path:
    """data/reference/NAME of the checkout."""
    return root() / "data" / "reference" / name


def sweep_file(name: str) -> Path:
    """sweeps/NAME of the checkout."""
    return root() / "sweeps" / name


def demo_sweep() -> str:
    """sweeps/isoflop_cpu.py, the CPU demo's sweep (`loopscale demo`, the bench's sweep share);
    a UsageError where the package is not installed from a checkout."""
    path = sweep_file("isoflop_cpu.py")
    if not path.is_file():
        raise UsageError(f"no {path} beside the installed package (not an editable install of "
                         "the checkout); pass --sweep=PATH/sweeps/isoflop_cpu.py")
    return str(path)

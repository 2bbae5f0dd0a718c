"""fit.json's numbers as plain JSON: `clean` turns numpy scalars into Python ones, tuples
into lists and NaN or infinity into null (JSON has neither), recursively."""

from __future__ import annotations

import math
from typing import Any

import numpy as np


def clean(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean(v) for v in value]
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return float(value) if math.isfinite(value) else None
    return value

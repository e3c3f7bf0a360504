"""The wording of a value a key does not take, one for every check that names a key: the config's
(training/config.py) and a preprocessing record's (data/transforms.py)."""

from __future__ import annotations

import math
from collections.abc import Collection
from typing import Any


def not_one_of(key: str, value: Any, allowed: Collection) -> str | None:
    """`key: value is not one of ...` when `value` is not in `allowed`; None when it is."""
    if value in allowed:
        return None
    return f"{key}: {value!r} is not one of {', '.join(map(str, allowed))}"


def out_of_range(key: str, value: float, lowest: float, highest: float = math.inf) -> str | None:
    """`key=value: must be ...` when `value` lies outside lowest..highest or is not finite (NaN fails every
    comparison); None when it is within."""
    if lowest <= value <= highest and math.isfinite(value):
        return None
    bounds = f"at least {lowest:g}" if highest == math.inf else f"from {lowest:g} to {highest:g}"
    return f"{key}={value}: must be {'a finite number, ' if not math.isfinite(value) else ''}{bounds}"

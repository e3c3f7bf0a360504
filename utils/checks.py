"""The wording of a value a key does not take, one for every check that names a key: the config's
(training/config.py) and a preprocessing record's (data/transforms.py); and the setting a path that
does not exist was meant to be (`auot` for `auto`)."""

from __future__ import annotations

import difflib
import math
import os
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


def mistyped_word(value: str, words: Collection[str]) -> str | None:
    """The word of `words` that `value`, a key's path or setting, is a typo of (`auot`, `Off`): a value close
    to one and naming nothing on disk. None when `value` is a word, a path that exists, or like no word."""
    close = difflib.get_close_matches(value.lower(), [word for word in words if word], n=1)
    if value in words or not close or "/" in value or os.path.lexists(os.path.expanduser(value)):
        return None
    return close[0]

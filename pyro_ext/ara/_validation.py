"""Argument checks shared by the attacker models and the trainers."""

import math
import numbers


def check_count(value, name, low=0):
    """An integer ``>= low`` (booleans rejected)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    return value


def check_number(value, name, low, high=math.inf, open_low=False):
    """A finite real number in ``[low, high]``, or ``(low, high]`` with ``open_low``."""
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or not (low < value if open_low else low <= value) or value > high:
        bounds = f"{'(' if open_low else '['}{low}, {high}]"
        raise ValueError(f"{name} must be a finite number in {bounds}, got {value!r}")
    return float(value)

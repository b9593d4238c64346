"""Checks of option values that more than one family (and the command line) take: one copy each, so
the API and the CLI refuse the same values with the same words."""
from __future__ import annotations

from .errors import InvalidOptionError


def check_positive_int(name: str, value) -> int:
    """``value`` if it is an integer >= 1 (not a bool); InvalidOptionError naming ``name`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidOptionError(f"{name} must be a positive integer, got {value!r}")
    return value

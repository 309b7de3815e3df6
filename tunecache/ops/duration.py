"""Durations as operators type them ('90m', '30d'), in seconds: the unit is required."""

from __future__ import annotations

import re

from ..errors import ConfigError

__all__ = ["DURATION_HELP", "parse_duration"]

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$", re.IGNORECASE)
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
DURATION_HELP = "3600s, 90m, 12h, 30d or 2w"


def parse_duration(text: str, name: str = "--older-than") -> float:
    """'90s', '15m', '12h', '30d', '2w' -> seconds.

    The unit is required: a bare '30' meant 30 seconds, which an operator who meant 30
    days only finds out when every entry is gone.
    """
    match = _DURATION.match(text or "")
    if not match:
        raise ConfigError(name, text, f"a duration with a unit (s, m, h, d or w), such as "
                          f"{DURATION_HELP}")
    return float(match.group(1)) * _UNITS[match.group(2).lower()]

"""Sizes as operators type them ('2GB', '500MiB'), in bytes: the unit is required."""

from __future__ import annotations

import re

from ..errors import ConfigError

__all__ = ["SIZE_HELP", "parse_size"]

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]i?)?(b)\s*$", re.IGNORECASE)
_POWERS = {"": 0, "k": 1, "m": 2, "g": 3, "t": 4}
SIZE_HELP = "500MB, 2GB, 1.5GiB or 0B (KB, MB, GB, TB are powers of 1000; KiB, MiB, ... of 1024)"


def parse_size(text: str, name: str = "--max-graph-bytes") -> int:
    """'2GB' -> 2_000_000_000, '2GiB' -> 2 * 2**30, '0B' -> 0.

    The unit is required, as for durations: a bare '2' meant as gigabytes would be two
    bytes, and a prune to that budget deletes every compiled graph.
    """
    match = _SIZE.match(text or "")
    if not match:
        raise ConfigError(name, text, f"a size with a unit, such as {SIZE_HELP}")
    prefix = (match.group(2) or "").lower()
    base = 1024 if prefix.endswith("i") else 1000
    return int(float(match.group(1)) * base ** _POWERS[prefix.rstrip("i")])

"""The one reader of JSON that came from shared storage: a stored column, an export line.

Whoever can write the database can write any JSON text, and Python's ``json.loads`` takes
more than tunecache can use: integers of any length (a 310-digit one reads as an int that
``float()`` cannot convert, so one planted timing poisoned every later use of its row), the
non-standard tokens ``NaN`` and ``Infinity``, and nesting deep enough to exhaust the
parser's recursion. :func:`loads` refuses all of these with :class:`StoredJSONError` (a
``ValueError``), so a bad value costs only the row it is in. Writers go through
:func:`check` before storing, so tunecache never stores what it would refuse to read.
"""

from __future__ import annotations

import json
import math
from typing import Any

__all__ = ["StoredJSONError", "loads", "check", "number", "MAX_NUMBER", "MAX_DEPTH"]

# Numbers a tuning entry holds are milliseconds, sizes, counts and epoch seconds. 2**53 is
# the largest magnitude at which every integer is exactly a double (JSON's interoperable
# range, RFC 8259 section 6): past it a value is no measurement.
MAX_NUMBER = float(2**53)
# Digits of a number's text: 2**53 has 16, and a double's shortest repr is at most 24
# characters ("-2.2250738585072014e-308"); more is padding meant to cost the parser.
_MAX_INT_TEXT = 17
_MAX_FLOAT_TEXT = 32
# Real keys nest 3 levels (a key's env, a candidate list of shapes); meta 3.
MAX_DEPTH = 32


class StoredJSONError(ValueError):
    """A stored JSON text that tunecache will not use; the message says why, as a
    predicate ("nested too deeply"), so callers can write "timings are {error}"."""


def _shown(text: str) -> str:
    return text if len(text) <= 20 else text[:20] + "\u2026"


def _int(text: str) -> int:
    # json hands the digits over before converting them, so a long run is refused before
    # int() spends quadratic time on it (or raises its own digit-limit error).
    if len(text) > _MAX_INT_TEXT or abs(int(text)) > MAX_NUMBER:
        raise StoredJSONError(f"out of range (number {_shown(text)})")
    return int(text)


def _float(text: str) -> float:
    value = float(text) if len(text) <= _MAX_FLOAT_TEXT else math.inf
    if not math.isfinite(value) or abs(value) > MAX_NUMBER:
        raise StoredJSONError(f"out of range (number {_shown(text)})")
    return value


def _constant(name: str) -> Any:
    raise StoredJSONError(f"not JSON ({name})")


def _depth_exceeds(value: Any, limit: int) -> bool:
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            item = list(item.values())
        if isinstance(item, list):
            if depth > limit:
                return True
            stack.extend((child, depth + 1) for child in item
                         if isinstance(child, (dict, list)))
    return False


def loads(text: str | bytes, limit: int) -> Any:
    """The value of a stored JSON text of at most ``limit`` characters, or
    StoredJSONError: too long, not JSON, NaN or Infinity, a number past
    :data:`MAX_NUMBER` or with too many digits, or nested deeper than :data:`MAX_DEPTH`."""
    if not isinstance(text, (str, bytes)):
        raise StoredJSONError(f"not JSON text ({type(text).__name__})")
    if len(text) > limit:
        raise StoredJSONError(f"larger than {limit} bytes")
    try:
        value = json.loads(text, parse_int=_int, parse_float=_float, parse_constant=_constant)
    except StoredJSONError:
        raise
    except RecursionError:
        # json's C scanner recurses once per level: '[' * 100000 fits every size limit.
        raise StoredJSONError("nested too deeply") from None
    except ValueError as e:
        raise StoredJSONError(f"not valid JSON ({e})") from None
    if _depth_exceeds(value, MAX_DEPTH):
        raise StoredJSONError("nested too deeply")
    return value


def check(text: str, limit: int) -> str:
    """``text`` as it is, if :func:`loads` reads it back; else StoredJSONError. Writers
    call this so that nothing tunecache stores is refused when read."""
    loads(text, limit)
    return text


def number(value: Any) -> float | None:
    """A finite number within :data:`MAX_NUMBER` as a float (a bool is none), or None:
    for a number read from a typed column, or from a value :func:`loads` returned."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, int):
        return float(value) if abs(value) <= MAX_NUMBER else None
    return value if math.isfinite(value) and abs(value) <= MAX_NUMBER else None

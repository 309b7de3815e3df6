"""Human output of the CLI: durations, sizes, times, clipped text, tables, JSON, and
progress bars on stderr (stdout stays clean for --json and export)."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import math
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import click

__all__ = ["clip", "safe", "dur", "span", "plain", "ms", "times", "plural", "size", "when",
           "table", "dumps", "progress"]

# Characters a terminal acts on rather than shows: C0 controls (newline, ESC that starts a
# colour or cursor sequence), DEL, C1 controls (NEL, CSI), the Unicode line and paragraph
# separators, and the bidi controls that reorder what follows them. Text from the shared
# database is anyone's, so a stored name could otherwise forge a table row or hide one.
# Lone surrogates too: they cannot be written to a UTF-8 terminal at all.
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069"
                     "\ud800-\udfff]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def safe(value: Any) -> str:
    """``value`` as text for a terminal, its control characters written as escapes
    (``\\x1b``, ``\\u202e``). Every field of human output that comes from the database
    goes through this (table cells do by themselves); --json needs none (json.dumps
    escapes them)."""
    return _UNSAFE.sub(_escape, "" if value is None else str(value))


def clip(value: Any, width: int) -> str:
    """``value`` as safe text in at most ``width`` characters, an ellipsis marking a cut."""
    text = safe(value)
    return text if len(text) <= width else text[:width - 1] + "\u2026"


def _number(value: Any) -> float | None:
    """A column read from shared storage as a finite number, or None (store.columns.time;
    imported when first used: the store package loads SQLAlchemy, which ``tunecache
    --help`` must not)."""
    from ..store import columns

    return columns.time(value)


def dur(seconds: Any) -> str:
    """A duration in seconds, as '12.5s', '3m 07s', '2h 05m' or '4d 03h'."""
    if seconds is None:
        return "-"
    s = _number(seconds)
    if s is None:
        return "?"
    if s < 60:
        return f"{s:.1f}s"
    if s < 3600:
        return f"{int(s // 60)}m {int(s % 60):02d}s"
    if s < 86400:
        return f"{int(s // 3600)}h {int(s % 3600 // 60):02d}m"
    return f"{int(s // 86400)}d {int(s % 86400 // 3600):02d}h"


def span(seconds: float) -> str:
    """A window an operator typed ('7d', '12h'), as :func:`dur` writes it but without the
    zeros of a whole unit: '7d', not '7d 00h'."""
    text = dur(seconds)
    for zeros in (" 00h", " 00m", " 00s"):
        text = text.removesuffix(zeros)
    return text.replace(".0s", "s")


def plain(value: Any, digits: int = 3) -> str:
    """A number to about ``digits`` significant digits in plain decimals, never in
    e-notation ('0.0123', '1.85', '12,345'); '?' where it is no finite number."""
    number = _number(value) if not isinstance(value, float) or math.isfinite(value) else None
    if number is None:
        return "?"
    magnitude = abs(number)
    if magnitude == 0:
        return "0"
    if magnitude >= 10 ** digits:
        return f"{number:,.0f}"
    if magnitude < 1e-6:
        return "<0.000001" if number > 0 else "-<0.000001"
    decimals = min(6, max(0, digits - 1 - math.floor(math.log10(magnitude))))
    return f"{number:.{decimals}f}"


def ms(value: Any) -> str:
    """A time in milliseconds: '0.0123 ms', '850 ms', past a second as :func:`dur` writes
    it ('12.5s', '3m 07s'); '-' for None."""
    if value is None:
        return "-"
    number = _number(value)
    if number is None:
        return "?"
    if abs(number) >= 1000:
        return ("-" if number < 0 else "") + dur(abs(number) / 1000)
    return f"{plain(number)} ms"


def times(value: Any) -> str:
    """A ratio such as a speedup: '1.85x', '2,400x'; '-' for None."""
    return "-" if value is None else f"{plain(value)}x"


def plural(count: int, noun: str, plural_form: str | None = None) -> str:
    """'1 entry', '2 entries', '1 GEMM', '3 GEMMs': ``count`` and ``noun`` agreeing (the
    plural form given where adding s or ies is wrong)."""
    if count == 1:
        return f"{count} {noun}"
    if plural_form is None:
        if noun.endswith("y") and noun[-2:-1] not in "aeiou":
            plural_form = noun[:-1] + "ies"
        elif noun.endswith(("s", "sh", "ch", "x")):
            plural_form = noun + "es"
        else:
            plural_form = noun + "s"
    return f"{count} {plural_form}"


def size(n: int | None) -> str:
    """A size in bytes, in B, KiB, MiB or GiB."""
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


def when(ts: Any) -> str:
    """An epoch timestamp as UTC date and time ('?' if it is no valid time)."""
    if ts is None:
        return "-"
    seconds = _number(ts)
    if seconds is None:
        return "?"
    try:
        stamp = datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc)
    except (ValueError, OverflowError, OSError):  # out of the platform's range
        return "?"
    return stamp.strftime("%Y-%m-%d %H:%M:%S UTC")


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], indent: str = "  ") -> None:
    """Echo rows in left-aligned columns under ``headers``."""
    cells = [[str(h) for h in headers]] + [["-" if c is None else safe(c) for c in r]
                                           for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    for r in cells:
        click.echo((indent + "  ".join(c.ljust(w) for c, w in zip(r, widths))).rstrip())


def _standard(value: Any) -> Any:
    """``value`` with each float that is not finite as None, in lists and dicts too; a
    report (a dataclass) as its ``to_json()``, or its fields where it has none."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _standard(value.to_json() if hasattr(value, "to_json")
                         else dataclasses.asdict(value))
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _standard(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_standard(v) for v in value]
    return value


def dumps(data: Any) -> str:
    """The --json document of a command's result, standard JSON: a value that is not
    finite (a sum over a stored infinity) is null, never the token Infinity or NaN that
    strict parsers refuse."""
    return json.dumps(_standard(data), indent=2, sort_keys=True, default=str, allow_nan=False)


@contextlib.contextmanager
def progress(label: str, show: bool = True, *, percent: bool = False
             ) -> Iterator[tuple[Callable[[int], None], Callable[..., None]]]:
    """(on_total, advance) callbacks driving a click progress bar on stderr, created when
    the total is known; ``advance(n, note)`` may say what was done so far beside the bar.
    ``percent``: the total is a scale (prune walks the table per mille, not row by row),
    so the bar shows a percentage, never a count that reads as rows."""
    bar: list[Any] = []
    stack = contextlib.ExitStack()

    # Only on a terminal: in a nightly job's log a bar is noise (click would print its
    # label alone).
    show = show and sys.stderr.isatty()

    def on_total(total: int) -> None:
        if show and total and not bar:
            bar.append(stack.enter_context(
                click.progressbar(length=total, label=label, file=sys.stderr,
                                  show_pos=not percent, show_percent=percent,
                                  item_show_func=lambda note: note)))

    def advance(n: int, note: str | None = None) -> None:
        if bar:
            bar[0].update(n, note)

    with stack:
        yield on_total, advance

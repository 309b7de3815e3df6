"""Ctrl-C in a command that writes in batches (prune, import, merge): it stops after the
batch in hand, says what is committed, and exits 130 like a shell. In one that only reads
(export, a dry run) or at a second Ctrl-C: one line saying what that leaves, and 130."""

from __future__ import annotations

import contextlib
import functools
import signal
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar

import click

__all__ = ["ctrl_c_stops", "ctrl_c_says", "EXIT_INTERRUPTED"]

F = TypeVar("F", bound=Callable[..., Any])

EXIT_INTERRUPTED = 130  # 128 + SIGINT, what a shell reports for a command Ctrl-C ended


@contextlib.contextmanager
def ctrl_c_stops() -> Iterator[Callable[[], bool]]:
    """While a command writes, Ctrl-C (SIGINT) asks it to stop after the batch in hand
    instead of raising inside a transaction: the count it then prints is exactly what was
    committed. A second Ctrl-C interrupts at once, as usual."""
    asked = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield asked.is_set
        return
    previous = signal.getsignal(signal.SIGINT)

    def on_sigint(signum: int, frame: object) -> None:
        asked.set()
        signal.signal(signal.SIGINT, previous)

    signal.signal(signal.SIGINT, on_sigint)
    try:
        yield asked.is_set
    finally:
        signal.signal(signal.SIGINT, previous)


def ctrl_c_says(what: Callable[[Mapping[str, Any]], str]) -> Callable[[F], F]:
    """A command that Ctrl-C ends where it is: instead of click's "Aborted!" and exit 1,
    one line on stderr (stdout may be an export, or --json) saying ``what(options)``
    that leaves, and exit 130. ``options``: the command's keyword arguments."""

    def decorate(fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            try:
                return fn(*args, **kwargs)
            except KeyboardInterrupt:
                click.echo(f"interrupted by Ctrl-C: {what(kwargs)}", err=True)
                raise click.exceptions.Exit(EXIT_INTERRUPTED) from None

        return wrapper  # type: ignore[return-value]

    return decorate

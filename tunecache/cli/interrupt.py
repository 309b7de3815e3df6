"""Ctrl-C in a command that writes in batches (prune, import, merge): it stops after the
batch in hand, says what is committed, and exits 130 like a shell."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator

__all__ = ["ctrl_c_stops", "EXIT_INTERRUPTED"]

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

"""Shared by tests/test_trust_*.py: run a call that must not block on a FIFO."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest


def returns_within(fn: Callable[[], Any], fifo: Path, timeout: float = 60.0) -> Any:
    """``fn()``'s result (or the exception it raised, raised here), run in a thread that
    must end within ``timeout`` seconds. If it is still blocked on ``fifo``, a writer is
    opened so that the thread ends, and the test fails: the call hung."""
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the test
            outcome["error"] = e

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)  # a reader waits: this succeeds
        os.close(fd)
        thread.join(timeout)
        pytest.fail(f"blocked on the FIFO {fifo}")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]

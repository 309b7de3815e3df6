"""The guard around tunecache's own part of a Triton hook (reading or publishing the shared
cache, planning a kernel's tuning): an error there never fails the user's job. It is one
warning, and Inductor goes on as it would without tunecache."""

from __future__ import annotations

from collections.abc import Callable
from types import TracebackType

__all__ = ["Attempt"]


class Attempt:
    """A context manager around one part of a hook that is tunecache's, not Inductor's
    (:meth:`.remote.TritonCache.attempt`).

    An ``Exception`` raised in the block is reported to ``warn(what, error)`` (one warning
    per ``what``, then debug lines: :meth:`.remote.TritonCache.warn_once`) and does not
    propagate; the caller then goes on as Inductor alone would, and the comment at its
    ``with`` says how. :attr:`failure` records the error as text, for a claim the caller
    gives back. A ``BaseException`` (an interrupt, :class:`.signals.NoLongerWanted`) goes
    through, and so does what the caller runs outside the block (Inductor's own code,
    whose errors are the job's, as without tunecache).
    """

    def __init__(self, what: str, warn: Callable[[str, BaseException], None]) -> None:
        self.what = what
        self._warn = warn
        self.failure = ""  # "TypeError: ..." once the block raised

    @property
    def failed(self) -> bool:
        return bool(self.failure)

    def __enter__(self) -> Attempt:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> bool:
        if not isinstance(error, Exception):  # none, or a BaseException: it goes through
            return False
        self._warn(self.what, error)
        self.failure = f"{type(error).__name__}: {error}"
        return True

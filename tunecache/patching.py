"""The patch ledger: every attribute tunecache sets on Inductor or Triton, with what it
replaced.

Why one ledger
    tunecache changes Inductor by setting attributes: methods on its classes, instance
    methods on the selector singleton, class names in ``torch._inductor.remote_cache``,
    config flags. Each change is recorded here, before it is made, with the owner's own
    value (or the fact that it had none), so that undoing is one loop over one list in
    reverse order, whoever made the change: :func:`tunecache.inductor.disable` undoes
    everything, and a failure half-way through enabling undoes everything since the
    :meth:`Ledger.mark` it took first. Nothing else keeps undo records. What holds for
    one call or one kernel only uses a Ledger of its own
    (``tunecache/inductor/triton/coordesc.py``), and so do the changes on Triton's
    ``Autotuner`` (``tunecache/user_kernels/autotuner.py``).

It lives outside the Inductor package, and imports nothing of tunecache, so that Triton's
side can use it without loading the Inductor package at ``import triton``.

What "own value" means
    A class's or module's ``__dict__`` entry (a staticmethod object itself, not the
    function attribute access returns), so that undo puts back the very same object. An
    attribute the owner does not hold itself (a method it inherits, or an instance
    attribute over its class's) is recorded as :data:`ABSENT`, and undo deletes ours so
    that the inherited one shows through again. Inductor's config modules keep their
    settings outside ``__dict__`` (their own ``__setattr__``, and ``delattr`` hides a
    setting for good): those are read and written with getattr/setattr, and must exist.

Changed since
    Undo restores an attribute only if it still holds the value we set: one changed since
    (``config.patch``, a test's monkeypatch, another library) is left as it is now.
"""

from __future__ import annotations

import logging
import threading
import types
from typing import Any

__all__ = ["ABSENT", "Ledger"]

log = logging.getLogger("tunecache")


class _Absent:
    def __repr__(self) -> str:
        return "ABSENT"


ABSENT: Any = _Absent()  # the owner had no attribute of its own by that name


def _settings_object(owner: Any) -> bool:
    """Whether ``owner`` keeps its attributes outside ``__dict__`` behind its own
    ``__setattr__`` (torch's ConfigModule: ``torch._inductor.config`` and the like)."""
    return (isinstance(owner, types.ModuleType)
            and type(owner).__setattr__ is not types.ModuleType.__setattr__)


def own_value(owner: Any, name: str) -> Any:
    """``owner``'s own value of ``name`` (see the module docstring), or :data:`ABSENT`."""
    if _settings_object(owner):
        return getattr(owner, name)  # raises AttributeError for a setting that is not there
    own = getattr(owner, "__dict__", {})
    return own.get(name, ABSENT)


class Ledger:
    """Attributes set on other objects, each with the owner's own value before, undone in
    reverse order (all, or since a :meth:`mark`). Thread-safe: Triton's runtime hooks are
    installed by whichever thread loads the first kernel.

    Also usable on its own for a scoped change: ``with Ledger() as ledger:`` undoes on
    exit whatever was set through it.
    """

    def __init__(self) -> None:
        self._lock = threading.RLock()
        # (owner, name, own value before, the value we set)
        self._entries: list[tuple[Any, str, Any, Any]] = []

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def entries(self) -> list[tuple[Any, str]]:
        """(owner, name) of every recorded change, oldest first."""
        with self._lock:
            return [(owner, name) for owner, name, _, _ in self._entries]

    def mark(self) -> int:
        """A point to undo back to (:meth:`undo`)."""
        with self._lock:
            return len(self._entries)

    def patch(self, owner: Any, name: str, value: Any) -> Any:
        """Set ``owner.name = value``, recording the own value it replaces; returns that
        value (:data:`ABSENT` where there was none)."""
        with self._lock:
            before = own_value(owner, name)
            self._entries.append((owner, name, before, value))
            try:
                setattr(owner, name, value)
            except BaseException:
                self._entries.pop()
                raise
            return before

    def undo(self, mark: int = 0) -> None:
        """Undo every change since ``mark``, newest first. Each is undone even where an
        earlier one fails; the first failure is raised after all were tried."""
        error: BaseException | None = None
        while True:
            with self._lock:
                if len(self._entries) <= mark:
                    break
                owner, name, before, ours = self._entries.pop()
            try:
                self._undo_one(owner, name, before, ours)
            except Exception as e:  # noqa: BLE001 - undo the rest first
                error = error or e
        if error is not None:
            raise error

    @staticmethod
    def _undo_one(owner: Any, name: str, before: Any, ours: Any) -> None:
        if own_value(owner, name) is not ours:
            log.debug("tunecache: %r.%s was changed after tunecache set it; left as it is",
                      owner, name)
            return
        if before is ABSENT:
            delattr(owner, name)
        else:
            setattr(owner, name, before)

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.undo()

"""Which entries an operator command selects (:class:`EntryFilter`): conditions on the
label columns, shared by prune, ls, export, warm and (through ``GraphFilter.of_entries``)
the compiled graphs' commands."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from sqlalchemy import ColumnElement, and_, true

from .schema import entries

__all__ = ["EntryFilter"]


class EntryFilter:
    """Conditions on the label columns, built from operator options.

    ``keep``: match entries whose label is set and is none of these (prune --keep-torch:
    entries without that label, i.e. not written under the key convention, are left
    alone); ``only``: match entries whose label is one of these (prune --torch, ls --torch);
    ``ops``/``kinds``/``states``: match only these.
    """

    _COLUMNS: ClassVar[dict[str, Any]] = {
        "device": entries.c.device,
        "torch": entries.c.torch_version,
        "triton": entries.c.triton_version,
    }

    def __init__(
        self,
        *,
        keep: Mapping[str, Sequence[str]] | None = None,
        only: Mapping[str, Sequence[str]] | None = None,
        ops: Sequence[str] = (),
        kinds: Sequence[str] = (),
        states: Sequence[str] = (),
    ) -> None:
        self.keep = {k: list(v) for k, v in (keep or {}).items() if v}
        self.only = {k: list(v) for k, v in (only or {}).items() if v}
        self.ops = list(ops)
        self.kinds = list(kinds)
        self.states = list(states)

    def __bool__(self) -> bool:
        return bool(self.keep or self.only or self.ops or self.kinds or self.states)

    def condition(self) -> ColumnElement[bool]:
        parts: list[ColumnElement[bool]] = []
        for name, values in self.keep.items():
            col = self._COLUMNS[name]
            parts.append(and_(col.is_not(None), col.not_in(values)))
        for name, values in self.only.items():
            parts.append(self._COLUMNS[name].in_(values))
        if self.ops:
            parts.append(entries.c.op.in_(self.ops))
        if self.kinds:
            parts.append(entries.c.kind.in_(self.kinds))
        if self.states:
            parts.append(entries.c.state.in_(self.states))
        return and_(true(), *parts)

"""Options the commands share, each defined once: --db and --json (as one
:class:`Invocation`), the entry filters, durations, choices read from the library when
first needed, and the database a command works on.

Nothing here imports SQLAlchemy, Alembic or torch at import time: ``tunecache --help``
must start fast (tests/test_cli_start.py), so tunecache.ops (SQLAlchemy) and
tunecache.warm are imported when a command, or a choice, is first used.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

import click

from ..errors import ConfigError
from ..keys import KINDS as KNOWN_KINDS
from ..settings import Settings
from . import format as fmt

if TYPE_CHECKING:
    from ..ops import EntryFilter
    from ..store import Database

__all__ = ["KINDS", "Invocation", "common", "json_only", "Duration", "ByteSize", "LibraryChoice",
           "Selection", "entry_filters", "op_option", "kind_option", "opened"]

F = TypeVar("F", bound=Callable[..., Any])

# The kinds of entries tunecache writes, for --kind's help (ls and export accept any
# kind; prune refuses one that is neither listed nor stored: tunecache.keys.KINDS).
KINDS = ", ".join(KNOWN_KINDS)


@dataclasses.dataclass
class Invocation:
    """How the command was invoked, which every command gets: the database chosen
    (--db), the settings read from it and the environment, and the output format
    (--json)."""

    db: str | None
    as_json: bool

    @functools.cached_property
    def settings(self) -> Settings:
        try:
            return Settings.from_env(db=self.db)
        except ConfigError as e:
            if self.db is not None and e.name == "TUNECACHE_DB":
                raise ConfigError("--db", e.value, e.expected) from None
            raise

    def emit(self, data: Any, human: Callable[[], None]) -> None:
        if self.as_json:
            click.echo(fmt.dumps(data))
        else:
            human()


_json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")


def common(fn: F) -> F:
    """--db and --json, handed to the command as one :class:`Invocation`."""

    @click.option("--db", metavar="PATH|URL", default=None,
                  help="Database: a SQLite path or sqlite:/// / postgresql:// URL "
                       "(default: $TUNECACHE_DB, else ~/.cache/tunecache/tunecache.db).")
    @_json_option
    @functools.wraps(fn)
    def wrapper(*args: Any, db: str | None, as_json: bool, **kwargs: Any) -> Any:
        return fn(Invocation(db, as_json), *args, **kwargs)

    # The command's own signature less the Invocation, which click never sees.
    return wrapper  # type: ignore[return-value]


def json_only(fn: F) -> F:
    """--json alone, for a command that needs no database, handed over as an
    :class:`Invocation`."""

    @_json_option
    @functools.wraps(fn)
    def wrapper(*args: Any, as_json: bool, **kwargs: Any) -> Any:
        return fn(Invocation(None, as_json), *args, **kwargs)

    return wrapper  # type: ignore[return-value]  # as in common()


@contextlib.contextmanager
def opened(inv: Invocation, *, create: bool = False, writes: str | None = None,
           read_only: bool = False) -> Iterator[Database]:
    """The database ``inv`` names, at the head schema, disposed of when the block ends
    (see tunecache.ops.opening; ``read_only``: never created or migrated)."""
    from ..ops import opening  # SQLAlchemy: only once a command runs (module docstring)

    with opening.opened(inv.settings, create=create, writes=writes,
                        read_only=read_only) as db:
        yield db


class Duration(click.ParamType):
    """A duration with a unit ('30d'), as seconds; a bare number is refused."""

    name = "DURATION"

    def convert(self, value: Any, param: Any, ctx: Any) -> float:
        from ..ops.duration import DURATION_HELP, parse_duration

        if isinstance(value, (int, float)):
            return float(value)
        try:
            return parse_duration(value)
        except ConfigError:
            text = str(value).strip()
            if text.replace(".", "", 1).isdigit():
                self.fail(f"{value!r} has no unit: use s, m, h, d or w ({text}d is {text} "
                          f"days, {text}s {text} seconds)", param, ctx)
            self.fail(f"{value!r} is not a duration (use {DURATION_HELP})", param, ctx)


class ByteSize(click.ParamType):
    """A size with a unit ('2GB', '500MiB'), as bytes; a bare number is refused."""

    name = "SIZE"

    def convert(self, value: Any, param: Any, ctx: Any) -> int:
        from ..ops.size import SIZE_HELP, parse_size

        if isinstance(value, int):
            return value
        try:
            return parse_size(value)
        except ConfigError:
            self.fail(f"{value!r} is not a size with a unit (use {SIZE_HELP})", param, ctx)


class LibraryChoice(click.Choice):
    """A choice among the names the library defines (``module:attribute``), read when
    first used (parsing the option, or its command's help), not when the CLI loads: the
    module imports SQLAlchemy."""

    def __init__(self, where: str) -> None:
        self._where = where
        self._choices: tuple[str, ...] | None = None
        super().__init__((), case_sensitive=True)

    @property
    def choices(self) -> tuple[str, ...]:
        if self._choices is None:
            module, attribute = self._where.split(":")
            self._choices = tuple(getattr(importlib.import_module(module), attribute))
        return self._choices

    @choices.setter
    def choices(self, value: Any) -> None:
        pass  # click.Choice.__init__ sets them; they come from the library instead


def op_option(help: str) -> Callable[[F], F]:
    return click.option("--op", multiple=True, help=help)


def kind_option(help: str) -> Callable[[F], F]:
    return click.option("--kind", multiple=True, metavar="KIND", help=help)


@dataclasses.dataclass(frozen=True)
class Selection:
    """The entries ls and export work on (--op, --kind, --state, --device, --torch)."""

    ops: tuple[str, ...] = ()
    kinds: tuple[str, ...] = ()
    states: tuple[str, ...] = ()
    devices: tuple[str, ...] = ()
    torch: tuple[str, ...] = ()

    def entry_filter(self) -> EntryFilter:
        from ..ops import EntryFilter

        return EntryFilter(only={"device": list(self.devices), "torch": list(self.torch)},
                           ops=list(self.ops), kinds=list(self.kinds), states=list(self.states))


def entry_filters(*, states: bool = False) -> Callable[[F], F]:
    """--op, --kind, (with ``states``) --state, --device, --torch, handed to the command as
    one :class:`Selection` named ``selection``."""

    def decorate(fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args: Any, op: tuple[str, ...], kind: tuple[str, ...],
                    device: tuple[str, ...], torch_: tuple[str, ...],
                    state: tuple[str, ...] = (), **kwargs: Any) -> Any:
            return fn(*args, selection=Selection(op, kind, state, device, torch_), **kwargs)

        options = [
            op_option("Only these ops (repeatable)."),
            kind_option(f"Only these kinds: {KINDS} (repeatable)."),
        ]
        if states:
            options.append(click.option(
                "--state", multiple=True, type=click.Choice(["done", "claimed", "failed"]),
                help="Only these states (repeatable)."))
        options += [
            click.option("--device", multiple=True, help="Only these devices (repeatable)."),
            click.option("--torch", "torch_", multiple=True,
                         help="Only these torch versions (repeatable)."),
        ]
        for option in reversed(options):  # click lists the last one applied first
            wrapper = option(wrapper)
        return wrapper  # type: ignore[return-value]  # as in common()

    return decorate

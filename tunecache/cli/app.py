"""The ``tunecache`` command group, and the one place where library errors become
one-line ``Error: ...`` messages and exit codes.

Exit 2 for a bad argument or setting (like click's usage errors), 1 for everything else
(database unreachable, schema too new, bad import lines, failed doctor checks).
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import click

from .. import __version__
from ..errors import ConfigError, StoreUnavailableError, TuneCacheError

__all__ = ["BadArgument", "cli"]


class BadArgument(click.ClickException):
    """A bad option value or setting, shown in one line, exit 2 like click's usage errors."""

    exit_code = 2


def _message(error: TuneCacheError) -> str:
    text = str(error)
    if isinstance(error, StoreUnavailableError) and "doctor" not in text:
        text += " (`tunecache doctor` checks the setup)"
    return text


class _OneLineUsage(click.UsageError):
    """A usage error in one line, like every other error here: click's own prints the
    usage, a hint and a blank line before the message (4 lines for a mistyped option)."""

    def show(self, file: Any = None) -> None:
        # Named as installed, whatever argv[0] was (python -m, a test's runner).
        path = self.ctx.command_path.split(" ")[1:] if self.ctx is not None else []
        where = " ".join(["tunecache", *path])
        click.echo(f"Error: {self.message} (see '{where} --help')",
                   file=file or sys.stderr)


def _one_line(e: click.UsageError) -> _OneLineUsage:
    return _OneLineUsage(e.format_message().rstrip("."), e.ctx)  # exit 2, as a UsageError


class _Group(click.Group):
    def make_context(self, info_name: str | None, args: list[str],
                     parent: click.Context | None = None, **extra: Any) -> click.Context:
        # The group's own options and a mistyped command name fail here.
        try:
            return super().make_context(info_name, args, parent, **extra)
        except _OneLineUsage:
            raise
        except click.UsageError as e:
            raise _one_line(e) from e

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except _OneLineUsage:
            raise
        except click.UsageError as e:  # a command's options and arguments
            raise _one_line(e) from e
        except ConfigError as e:
            raise BadArgument(str(e)) from e
        except TuneCacheError as e:
            raise click.ClickException(_message(e)) from e


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="tunecache")
def cli() -> None:
    """Operate a shared tunecache: what is in it, what to drop, what to ship, is it healthy.

    Every command takes --db (else $TUNECACHE_DB) and most take --json.
    """
    # Library warnings (one line each) reach the operator; never configure the root logger.
    logger = logging.getLogger("tunecache")
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.WARNING)

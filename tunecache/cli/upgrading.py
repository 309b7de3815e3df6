"""`tunecache upgrade`: run the schema migrations now (a thin shell over
tunecache.ops.opening.upgrade, imported when the command runs)."""

from __future__ import annotations

import click

from .options import Invocation, common

__all__ = ["upgrade"]


@click.command()
@common
def upgrade(inv: Invocation) -> None:
    """Run the schema migrations now (creates the database if it does not exist)."""
    from .. import ops

    report = ops.upgrade(inv.settings)

    def human() -> None:
        if report.from_revision == report.to_revision:
            click.echo(f"{report.database}: schema already at revision {report.to_revision}")
        else:
            click.echo(f"{report.database}: schema upgraded from revision "
                       f"{report.from_revision or '(none)'} to {report.to_revision}")

    inv.emit(report, human)

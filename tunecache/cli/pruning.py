"""`tunecache prune`: delete entries in small batches, safely while jobs run (a thin shell
over tunecache.ops.pruning, imported when the command runs)."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

import click

from . import format as fmt
from .app import BadArgument
from .interrupt import EXIT_INTERRUPTED, ctrl_c_says, ctrl_c_stops
from .options import KINDS, ByteSize, Duration, Invocation, common, kind_option, op_option, opened

if TYPE_CHECKING:
    from ..ops import PruneReport

__all__ = ["prune"]


@click.command()
@click.option("--older-than", type=Duration(), default=None,
              help="Entries not used for this long (last use, else last update), with "
                   "a unit: 30d, 12h, 90m, 3600s, 2w.")
@click.option("--keep-torch", multiple=True, metavar="VERSION",
              help="Keep only entries of these torch versions (repeatable).")
@click.option("--keep-triton", multiple=True, metavar="VERSION",
              help="Keep only entries of these triton versions (repeatable).")
@click.option("--keep-device", multiple=True, metavar="NAME",
              help="Keep only entries of these devices (repeatable).")
@click.option("--torch", "torch_", multiple=True, metavar="VERSION",
              help="Drop entries of these torch versions (repeatable).")
@click.option("--triton", multiple=True, metavar="VERSION",
              help="Drop entries of these triton versions (repeatable).")
@click.option("--device", multiple=True, metavar="NAME",
              help="Drop entries of these devices (repeatable).")
@op_option("Only entries of these ops (with the filters above).")
@kind_option(f"Only entries of these kinds: {KINDS} (with the filters above).")
@click.option("--failed", is_flag=True, help="Drop keys marked failed (they are retried).")
@click.option("--expired-claims", is_flag=True,
              help="Drop claims whose lease has passed (their owner is gone).")
@click.option("--invalid", is_flag=True,
              help="Drop done entries whose key or timings fail validation.")
@click.option("--max-graph-bytes", type=ByteSize(), default=None, metavar="SIZE",
              help="Compiled graphs: keep at most this many payload bytes (2GB, 500MiB, "
                   "0B), deleting the least recently used first; rows whose digest or size "
                   "is invalid (a size below 0 or over the 512 MiB a graph may have) go "
                   "before any.")
@click.option("--dry-run", is_flag=True, help="Show what would go; delete nothing.")
# The default is tunecache.ops.pruning.DRY_RUN_LISTED (not imported: tunecache.ops loads
# SQLAlchemy, which `tunecache --help` starts without).
@click.option("--limit", type=click.IntRange(0, None), default=20, show_default=True,
              help="--dry-run: list at most this many entries (it counts them all).")
@click.option("--vacuum/--no-vacuum", default=None,
              help="SQLite: VACUUM after deleting (default: only when a quarter of the "
                   "file is free and it is at most 256 MiB, since VACUUM holds the write "
                   "lock while it copies). PostgreSQL: plain VACUUM of the table.")
@click.option("--batch-size", type=click.IntRange(1, 100_000), default=None,
              help="Rows per delete transaction (default: on SQLite, as many as hold "
                   "the write lock about a second, since jobs' claims wait that long; "
                   "2000 on PostgreSQL).")
@click.option("--no-pause", is_flag=True,
              help="SQLite: no 0.1 s pause between batches (for a maintenance window: "
                   "running jobs would wait for the whole prune).")
@common
@ctrl_c_says(lambda options: "a dry run; nothing was deleted" if options["dry_run"] else
             "stopped at once (a second Ctrl-C): the batches deleted so far are gone; run "
             "the same prune again to finish")
def prune(inv: Invocation, older_than: float | None, keep_torch: tuple[str, ...],
          keep_triton: tuple[str, ...], keep_device: tuple[str, ...], torch_: tuple[str, ...],
          triton: tuple[str, ...], device: tuple[str, ...], op: tuple[str, ...],
          kind: tuple[str, ...], failed: bool,
          expired_claims: bool, invalid: bool, max_graph_bytes: int | None, dry_run: bool,
          vacuum: bool | None, limit: int,
          batch_size: int | None, no_pause: bool) -> None:
    """Delete entries, in small batches, safely while jobs run.

    Selections are OR-ed: --failed, --expired-claims, --invalid, and the done or failed
    entries that match every filter given among --older-than, --keep-*, --torch,
    --triton, --device, --op and --kind. A claim whose lease runs is never deleted. A deleted done
    entry is tuned again by the next job that needs it.

    Compiled graphs, kernels and shape profiles (kinds fxgraph, autograd, kernel, pgo) are
    selected by the same filters where they apply (--older-than, --torch, --keep-torch,
    --kind; a filter on --op, --device or --triton selects none of them), and by
    --max-graph-bytes. On SQLite the blob files of deleted graphs go with them, and so do
    orphan blob files older than an hour. A deleted graph or kernel is compiled again by
    the next job that needs it; a deleted profile is learnt again.
    """
    from .. import ops

    spec = ops.PruneSpec(
        older_than=older_than,
        keep={"torch": list(keep_torch), "triton": list(keep_triton), "device": list(keep_device)},
        only={"torch": list(torch_), "triton": list(triton), "device": list(device)},
        ops=list(op), kinds=list(kind), failed=failed, expired_claims=expired_claims,
        invalid=invalid, max_graph_bytes=max_graph_bytes,
    )
    if spec.is_empty():
        raise BadArgument("nothing selected: give --older-than, --keep-torch/--keep-triton/"
                          "--keep-device, --torch/--triton/--device/--op/--kind, --failed, "
                          "--expired-claims, --invalid or --max-graph-bytes")
    with opened(inv, writes=None if dry_run else "prune", read_only=dry_run) as db, \
            fmt.progress("pruning" if not dry_run else "listing", not inv.as_json,
                         percent=not dry_run) as (total, step), \
            (ctrl_c_stops() if not dry_run else contextlib.nullcontext(None)) as stop:
        report = ops.prune(
            db, spec, dry_run=dry_run, batch=batch_size, pause=not no_pause,
            progress=step, on_total=total, stop=stop, listed=limit,
            on_deleted=lambda n: step(0, f"{n} deleted"),
            vacuum="auto" if vacuum is None else ("always" if vacuum else "never"))
    if report.interrupted:
        _interrupted(inv, report)

    for warning in report.warnings:  # on stderr, with --json too
        click.echo(f"Warning: {warning}", err=True)

    def human() -> None:
        g = report.graphs
        assert g is not None  # only a prune Ctrl-C stopped has none, reported above
        orphans = g.orphans
        # Said only when there is something to say: a cache without graphs reads as before.
        graph_line = bool(g.selected or g.over_budget or orphans["orphan_blobs"]
                          or g.max_graph_bytes is not None)
        if dry_run:
            would = report.would_delete or 0
            click.echo(f"would delete {fmt.plural(would, 'entry')} (dry run)")
            rows = report.entries or ()
            if rows:
                fmt.table(("key", "state", "op", "device", "torch", "triton", "last used", "why"),
                       [(r["key_hash"][:12], r["state"], r["op"], r["device"], r["torch"],
                         r["triton"], fmt.when(r["last_used_at"] or r["updated_at"]),
                         r["why"]) for r in rows[:limit]])
            if would > len(rows[:limit]):
                click.echo(f"  ... and {would - len(rows[:limit])} more (--limit lists more)")
            if graph_line:
                listed = g.graphs or ()
                click.echo(f"would delete {fmt.plural(g.would_delete or 0, 'compiled graph')} "
                           f"({fmt.size(g.bytes)}) and "
                           f"{fmt.plural(orphans['orphan_blobs'], 'orphan blob file')} "
                           f"({fmt.size(orphans['orphan_bytes'])})")
                fmt.table(("kind", "key", "size", "torch", "last used"),
                          [(x["kind"], fmt.clip(x["key"], 24), fmt.size(x["size"]),
                            x["torch_version"], fmt.when(x["last_used_at"] or x["created_at"]))
                           for x in listed[:20]])
                if len(listed) > 20:
                    click.echo(f"  ... and {len(listed) - 20} more (--json lists all)")
            return
        click.echo(f"deleted {fmt.plural(report.deleted or 0, 'entry')} in "
                   f"{fmt.plural(report.batches or 0, 'batch')} ({fmt.dur(report.seconds)})")
        v = report.vacuum
        assert v is not None and report.size_before is not None \
            and report.size_after is not None  # a prune that finished has them
        click.echo(f"vacuum: {'ran' if v.ran else 'skipped'} ({v.why})")
        click.echo(f"size: {fmt.size(report.size_before['bytes'])} -> "
                   f"{fmt.size(report.size_after['bytes'])}")
        if graph_line:
            kept = (f"; {g.kept_because_used} kept, used meanwhile"
                    if g.kept_because_used else "")
            click.echo(f"deleted {fmt.plural(g.deleted or 0, 'compiled graph')} "
                       f"({fmt.size(g.freed_bytes)}){kept}, "
                       f"{fmt.plural(orphans['orphan_blobs'], 'orphan blob file')} "
                       f"({fmt.size(orphans['orphan_bytes'])})")

    inv.emit(report, human)


def _interrupted(inv: Invocation, report: PruneReport) -> None:
    """Ctrl-C: say what was deleted (all of it committed), then exit 130 like a shell."""
    graphs = (report.graphs.deleted if report.graphs else 0) or 0

    def human() -> None:
        click.echo(f"interrupted: deleted {fmt.plural(report.deleted or 0, 'entry')} (of "
                   f"them {report.invalid_deleted} invalid) in "
                   f"{fmt.plural(report.batches or 0, 'batch')} and "
                   f"{fmt.plural(graphs, 'compiled graph')} before Ctrl-C; the rest is left "
                   "as it was (run the same prune again to finish)")

    inv.emit(report, human)
    click.get_current_context().exit(EXIT_INTERRUPTED)


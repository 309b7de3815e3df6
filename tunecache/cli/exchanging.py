"""Commands that move entries between caches: export, import, merge (thin shells over
tunecache.ops.exchange, imported when a command runs)."""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, TextIO, TypeVar

import click

from ..settings import Settings
from . import format as fmt
from .app import BadArgument
from .interrupt import EXIT_INTERRUPTED, ctrl_c_says, ctrl_c_stops
from .options import Invocation, LibraryChoice, Selection, common, entry_filters, opened

if TYPE_CHECKING:
    from ..ops import ImportReport

__all__ = ["export", "import_", "merge"]

F = TypeVar("F", bound=Callable[..., Any])


def _export_stopped(options: Mapping[str, Any]) -> str:
    output = options["output"]
    if output == "-":
        return "the export on stdout is incomplete; use none of it"
    if os.path.exists(output) and not os.path.isfile(output):
        return f"the export into {output} is incomplete; use none of it"
    return f"nothing exported; {output} is not written (an earlier file there is as it was)"


def _import_stopped(options: Mapping[str, Any]) -> str:
    # A real import or merge stops after the batch in hand (ctrl_c_stops) and says what it
    # committed; this is a dry run, or the second Ctrl-C that ends one at once.
    if options["dry_run"]:
        return "a dry run; nothing was written"
    return ("stopped at once (a second Ctrl-C): the batches committed so far stay; run the "
            "same command again to finish")


@click.command()
@click.option("-o", "--output", type=click.Path(dir_okay=False, allow_dash=True), default="-",
              help="Write to FILE (default: stdout).")
@click.option("--best-only", is_flag=True,
              help="Keep only the winner's timing (others written as null): a small cache "
                   "to ship with a model; consumers pick the same winner without tuning.")
@click.option("--graphs/--no-graphs", default=True, show_default=True,
              help="Also write the compiled graphs the filters select (--kind, --torch; "
                   "--op or --device select none), with their signatures.")
@entry_filters()
@common
@ctrl_c_says(_export_stopped)
def export(inv: Invocation, output: str, best_only: bool, graphs: bool,
           selection: Selection) -> None:
    """Write done entries as versioned JSON lines.

    Line 1: {"format": "tunecache-export", "version": 1, ...}; then one entry per line:
    key (the key object), key_hash, timings ({candidate: ms, null = failed/unmeasured}),
    best, tune_seconds, created_at, updated_at, last_used_at (kept by import). Then one
    compiled graph per line, {"graph": {kind, key, digest, signature, payload, torch,
    created_at}}, signature and payload in base64; a file with graphs says version 2
    (older tunecaches refuse it). The header's counts are of the lines written.
    The summary goes to stderr (stdout may be the export itself), or to stdout with --json
    when -o names a file.
    """
    from .. import ops

    with opened(inv, read_only=True) as db, contextlib.ExitStack() as stack:
        f: TextIO = sys.stdout if output == "-" else stack.enter_context(_output_file(output))
        with fmt.progress("exporting", output != "-" and not inv.as_json) as (total, step):
            report = ops.export(db, f, best_only=best_only, env=selection.entry_filter(),
                                graphs=graphs, progress=step, on_total=total)
    summary = (f"exported {fmt.plural(report.exported, 'entry')}"
               + (f", {fmt.plural(report.graphs, 'compiled graph')}" if report.graphs else "")
               + (f"; skipped {len(report.skipped_invalid)} invalid" if report.skipped_invalid
                  else "")
               + (f"; {report.provenance_dropped} {_DROPPED}" if report.provenance_dropped
                  else ""))
    if inv.as_json and output != "-":
        click.echo(fmt.dumps(report))
    else:
        click.echo(summary, err=True)
        for s in report.skipped_invalid:
            click.echo(f"  skipped {fmt.safe(s.key_hash[:16])}: {fmt.safe(s.reason)}", err=True)


@contextlib.contextmanager
def _output_file(path: str) -> Iterator[TextIO]:
    """The export's output file, written whole or not at all: into a temporary file beside
    it, renamed over ``path`` once the export has finished, so an export that fails or is
    interrupted leaves no partial file for an import to take (and an earlier file at
    ``path`` as it was). A path that is not a regular file (a pipe, /dev/stdout) is written
    directly. A path that cannot be written (a missing directory, no permission) is a
    one-line error (exit 1), not a traceback."""
    try:
        if os.path.exists(path) and not os.path.isfile(path):
            with open(path, "w", encoding="utf-8") as direct:
                yield direct
            return
        folder, name = os.path.split(os.path.abspath(path))
        fd, partial = tempfile.mkstemp(prefix=f".{name}.", suffix=".partial", dir=folder)
    except OSError as e:
        raise click.ClickException(f"{path}: cannot write the export there "
                                   f"({e.strerror or e})") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            yield f
        os.chmod(partial, 0o666 & ~_umask())
        os.replace(partial, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(partial)
        raise


# An entry whose family or meta is unreadable is still a good entry: exported and merged
# without them, and counted.
_DROPPED = "kept without their family or meta, which could not be read"


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_CONFLICT_HELP = (
    "For a key already in the target: keep (default) leaves a done entry as it is (done "
    "entries are immutable); replace overwrites it; faster overwrites it only when the "
    "incoming fastest timing is lower; neither overwrites measured timings with a "
    "--best-only file's unmeasured ones (the full entry is kept). Under every policy a live "
    "claim is left alone and a failed key or expired claim is replaced."
)


def _import_options(skip_invalid_help: str) -> Callable[[F], F]:
    """--on-conflict, --skip-invalid and --dry-run, shared by import and merge."""

    def decorate(fn: F) -> F:
        fn = click.option("--dry-run", is_flag=True, help="Validate and count; write nothing.")(fn)
        fn = click.option("--skip-invalid", is_flag=True, help=skip_invalid_help)(fn)
        # The policies are read from tunecache.ops.exchange when first used: the CLI
        # starts without it.
        return click.option("--on-conflict",
                            type=LibraryChoice("tunecache.ops.exchange:CONFLICT_POLICIES"),
                            default="keep", show_default=True, help=_CONFLICT_HELP)(fn)

    return decorate


def _import_report(ctx: click.Context, inv: Invocation, report: ImportReport,
                   skip_invalid: bool, what: str, verb: str = "import") -> None:
    """The report of an import or a merge (``verb``), and its exit code: 130 when Ctrl-C
    stopped it, 1 for invalid entries unless ``skip_invalid``, or for a file cut short."""
    full = (f" ({report.kept_full} of them with full timings, which the file's "
            "winner-only ones would have replaced)" if report.kept_full else "")
    counts = (f"{report.new} new, {report.replaced} replaced, {report.kept} kept{full}, "
              f"{report.busy} busy (being tuned), {report.invalid} invalid")
    done = "merged" if verb == "merge" else "imported"

    def human() -> None:
        if report.interrupted:
            through = report.done_through
            click.echo(f"interrupted by Ctrl-C: {done} {what} "
                       + (f"up to {fmt.safe(through)}, all committed ({counts})"
                          if through else "nothing yet")
                       + "; the rest is not; run the same command again to finish (what "
                       "is in already stays as it is)")
            return
        click.echo(f"{'would ' + verb if report.dry_run else done} into {report.database}: "
                   f"{counts} (on conflict: {report.on_conflict})")
        graphs = report.graphs
        if graphs.new or graphs.kept:
            click.echo(f"compiled graphs: {graphs.new} new, {graphs.kept} kept (already "
                       "there: first publish wins)")
        for bad in report.bad:
            click.echo(f"{what}: {fmt.safe(bad.where)}: {fmt.safe(bad.reason)}", err=True)
        if report.provenance_dropped:
            click.echo(f"{what}: {fmt.plural(report.provenance_dropped, 'entry')} {_DROPPED}",
                       err=True)

    inv.emit(report, human)
    if report.interrupted:
        ctx.exit(EXIT_INTERRUPTED)
    if report.cut_short and report.lines is not None:
        lines = report.lines
        # Honest counts: the line the cut went through is one of those read, and invalid.
        taken = lines.read - report.invalid
        were = "would be" if report.dry_run else "were"
        present = (f"the {lines.read} present {were} imported" if not report.invalid else
                   f"of the {lines.read} present, {taken} {were} imported and "
                   f"{report.invalid} {'was' if report.invalid == 1 else 'were'} invalid")
        click.echo(f"Error: {what}: the file ends after {lines.read} of the {lines.header} "
                   f"lines its header counts: it was cut short ({present}); import a "
                   "whole copy for the rest", err=True)
        ctx.exit(1)
    if report.invalid and not skip_invalid:
        if not inv.as_json:
            click.echo(f"Error: {fmt.plural(report.invalid, 'invalid entry', 'invalid entries')}"
                       " skipped; fix them or pass --skip-invalid to accept the rest silently",
                       err=True)
        ctx.exit(1)


@click.command("import")
@click.argument("file", type=click.File("r", encoding="utf-8", errors="replace"))
@_import_options("Exit 0 even if some lines were invalid (they are skipped either way).")
@common
@click.pass_context
@ctrl_c_says(_import_stopped)
def import_(ctx: click.Context, inv: Invocation, file: TextIO, on_conflict: str, skip_invalid: bool,
            dry_run: bool) -> None:
    """Import an export file (FILE, or - for stdin).

    Every entry is validated (key size and JSON, timings, tune_seconds); its key_hash is
    recomputed from the key, never trusted. A compiled graph is validated (kind, key,
    base64, sizes; its digest recomputed) and stored if its key is absent (first publish
    wins, whatever --on-conflict says); its signature is checked by the jobs that read it.
    Valid entries are imported even when others are not; each bad line is reported (line
    number and reason) and the exit code is 1 unless --skip-invalid.
    """
    from .. import ops

    # The header is read before the target is opened: a file that is not an export
    # creates no database.
    name = getattr(file, "name", "input")
    export_file = ops.parse_export(file, name)
    with opened(inv, create=True, writes=None if dry_run else "import",
                read_only=dry_run) as db, \
            fmt.progress("importing", not inv.as_json) as (total, step), \
            (ctrl_c_stops() if not dry_run else contextlib.nullcontext(None)) as stop:
        if export_file.expected is not None:
            total(export_file.expected)
        # on_conflict: a str from click.Choice(CONFLICT_POLICIES), which import_records
        # checks again.
        report = ops.import_file(db, export_file, on_conflict=on_conflict, dry_run=dry_run,
                                 progress=step, stop=stop)
    _import_report(ctx, inv, report, skip_invalid, name)


@click.command()
@click.argument("src_db")
@click.option("--into", metavar="PATH|URL", default=None,
              help="Target database (default: $TUNECACHE_DB); the same as --db, and "
                   "refused together with it.")
@_import_options("Exit 0 even if some source entries were invalid (skipped either way).")
@common
@click.pass_context
@ctrl_c_says(_import_stopped)
def merge(ctx: click.Context, inv: Invocation, src_db: str, into: str | None, on_conflict: str,
          skip_invalid: bool, dry_run: bool) -> None:
    """Merge the done entries of SRC_DB into the target, validated like an import.

    SRC_DB is only read (and must be at this tunecache's schema).
    """
    from .. import ops

    if into is not None:
        if inv.db is not None:
            raise BadArgument("--into and --db both name the target: give one of them")
        inv.db = into
    with ops.open_source(Settings.from_env(db=src_db)) as src, \
            opened(inv, create=True, writes=None if dry_run else "merge",
                   read_only=dry_run) as target, \
            fmt.progress("merging", not inv.as_json) as (total, step), \
            (ctrl_c_stops() if not dry_run else contextlib.nullcontext(None)) as stop:
        # on_conflict: as for import.
        report = ops.merge(src, target, on_conflict=on_conflict,  # type: ignore[arg-type]
                           dry_run=dry_run, progress=step, on_total=total, stop=stop)
    _import_report(ctx, inv, report, skip_invalid, src.display_url, "merge")


"""The ``tunecache`` command: a thin click shell over tunecache.maintenance, doctor and warm.

Conventions, shared by every command:

- ``--db PATH|URL`` overrides TUNECACHE_DB; ``--json`` prints one JSON document to stdout
  for scripts (human output otherwise). Both come from one decorator, :func:`_common`.
- Progress bars go to stderr, so stdout stays clean for ``--json`` and ``export``.
- Library errors become one-line ``Error: ...`` messages in one place (:class:`_Group`):
  exit 2 for a bad argument or setting, 1 for everything else (database unreachable,
  schema too new, bad import lines, failed doctor checks).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import functools
import json
import logging
import math
import os
import sys
from typing import Any, Callable, Iterator, Mapping, Sequence, TextIO, TypeVar

import click

from . import __version__
from .errors import ConfigError, StoreUnavailableError, TuneCacheError
from .settings import Settings

__all__ = ["main", "cli"]

F = TypeVar("F", bound=Callable[..., Any])

# Rows of `stats`' "by op" table in human output (--json has them all).
BY_OP_SHOWN = 20
# The kinds of entries tunecache writes, for --kind's help (any kind is accepted).
KINDS = "gemm, triton_config, fusion_benchmark"
# tunecache.maintenance.CONFLICT_POLICIES, spelled here because importing maintenance
# imports SQLAlchemy and Alembic (0.5 s), and every command, --help included, would pay
# for it at start-up (test_cli_start.py checks that the two agree).
CONFLICT_POLICIES = ("keep", "replace", "faster")


# -- errors, in one place ---------------------------------------------------------------


class _BadArgument(click.ClickException):
    """A bad option value or setting, shown in one line, exit 2 like click's usage errors."""

    exit_code = 2


def _message(error: TuneCacheError) -> str:
    text = str(error)
    if isinstance(error, StoreUnavailableError) and "doctor" not in text:
        text += " (`tunecache doctor` checks the setup)"
    return text


class _Group(click.Group):
    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except ConfigError as e:
            raise _BadArgument(str(e)) from e
        except TuneCacheError as e:
            raise click.ClickException(_message(e)) from e


# -- shared options --------------------------------------------------------------------


@dataclasses.dataclass
class Out:
    """What every command gets: the database choice and the output format."""

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
            click.echo(json.dumps(data, indent=2, sort_keys=True, default=_json_default))
        else:
            human()


def _json_default(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return str(value)


def _common(fn: F) -> F:
    """--db and --json, handed to the command as one :class:`Out`."""

    @click.option("--db", metavar="PATH|URL", default=None,
                  help="Database: a SQLite path or sqlite:/// / postgresql:// URL "
                       "(default: $TUNECACHE_DB, else ~/.cache/tunecache/tunecache.db).")
    @click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
    @functools.wraps(fn)
    def wrapper(*args: Any, db: str | None, as_json: bool, **kwargs: Any) -> Any:
        return fn(Out(db, as_json), *args, **kwargs)

    return wrapper  # type: ignore[return-value]


class _Duration(click.ParamType):
    name = "DURATION"

    def convert(self, value: Any, param: Any, ctx: Any) -> float:
        from .maintenance import DURATION_HELP, parse_duration

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


@contextlib.contextmanager
def _progress(label: str, show: bool = True) -> Iterator[tuple[Callable[[int], None],
                                                                Callable[[int], None]]]:
    """(on_total, advance) callbacks driving a click progress bar on stderr, created when
    the total is known."""
    bar: list[Any] = []
    stack = contextlib.ExitStack()

    # Only on a terminal: in a nightly job's log a bar is noise (click would print its
    # label alone).
    show = show and sys.stderr.isatty()

    def on_total(total: int) -> None:
        if show and total and not bar:
            bar.append(stack.enter_context(
                click.progressbar(length=total, label=label, file=sys.stderr,
                                  show_pos=True)))

    def advance(n: int) -> None:
        if bar:
            bar[0].update(n)

    with stack:
        yield on_total, advance


# -- formatting ------------------------------------------------------------------------


def _clip(value: Any, width: int) -> str:
    """``value`` as text in at most ``width`` characters, an ellipsis marking a cut."""
    text = "" if value is None else str(value)
    return text if len(text) <= width else text[:width - 1] + "\u2026"


def _number(value: Any) -> float | None:
    """A column read from shared storage as a finite number, or None: SQLite keeps
    whatever a writer put in a column, whatever its declared type."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _dur(seconds: Any) -> str:
    if seconds is None:
        return "-"
    s = _number(seconds)
    if s is None:
        return "?"
    if s < 60:
        return f"{s:.1f}s"
    if s < 3600:
        return f"{int(s // 60)}m {int(s % 60):02d}s"
    if s < 86400:
        return f"{int(s // 3600)}h {int(s % 3600 // 60):02d}m"
    return f"{int(s // 86400)}d {int(s % 86400 // 3600):02d}h"


def _bytes(n: int | None) -> str:
    if n is None:
        return "-"
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"


def _when(ts: Any) -> str:
    if ts is None:
        return "-"
    seconds = _number(ts)
    if seconds is None:
        return "?"
    try:
        stamp = datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc)
    except (ValueError, OverflowError, OSError):  # out of the platform's range
        return "?"
    return stamp.strftime("%Y-%m-%d %H:%M:%S UTC")


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]], indent: str = "  ") -> None:
    cells = [[str(h) for h in headers]] + [["-" if c is None else str(c) for c in r]
                                           for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    for r in cells:
        click.echo((indent + "  ".join(c.ljust(w) for c, w in zip(r, widths))).rstrip())


def _open(out: Out, *, create: bool = False, writes: str | None = None) -> Any:
    from .maintenance import open_database

    return open_database(out.settings, create=create, writes=writes)


# -- the group -------------------------------------------------------------------------


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


# -- stats -------------------------------------------------------------------------------


@cli.command()
@_common
def stats(out: Out) -> None:
    """Entries by state, environment and op; size; hits; time saved; claims; failures."""
    from . import maintenance

    db = _open(out)
    try:
        data = maintenance.stats(db)
    finally:
        db.dispose()

    def human() -> None:
        size = data["size"]
        free = f", {_bytes(size['free_bytes'])} free" if size["free_bytes"] else ""
        click.echo(f"database  {data['database']} ({data['backend']}, {_bytes(size['bytes'])}"
                   f"{free}, schema {data['schema']})")
        states = data["entries"]["by_state"]
        click.echo(f"entries   {data['entries']['total']} (done {states['done']}, "
                   f"claimed {states['claimed']}, failed {states['failed']})")
        # Two counts that differ on purpose: the entries' counters add up the results
        # each stored entry served (cache hits and waits for a peer's result), and go
        # when the entry is pruned; the processes' reports split hits from peers' results
        # and keep counting pruned entries.
        click.echo(f"hits      {data['hits']} results served by the stored entries (cache hits "
                   f"and peers' results); tuning stored {_dur(data['tune_seconds'])}, "
                   f"saved {_dur(data['seconds_saved'])}")
        u = data["usage"]
        click.echo(f"processes {u['reports']} reported: {u['hits']} cache hits, {u['peer']} "
                   f"peers' results, {u['tuned']} tuned, {u['local']} tuned without the "
                   f"database; saved {_dur(u['seconds_saved'])}, "
                   f"tuning {_dur(u['seconds_tuning'])}")
        claims = data["claims"]
        click.echo(f"claims    {claims['in_flight']} in flight, {claims['expired']} expired")
        click.echo(f"failed    {data['failed']['count']} keys")
        if data["by_kind"]:
            click.echo("by kind:")
            _table(("kind", "entries", "done", "hits", "tuning", "saved"),
                   [(r["kind"], r["entries"], r["done"], r["hits"], _dur(r["tune_seconds"]),
                     _dur(r["seconds_saved"])) for r in data["by_kind"]])
        if data["by_environment"]:
            click.echo("by environment:")
            _table(("device", "torch", "triton", "entries", "done", "hits", "saved"),
                   [(r["device"], r["torch"], r["triton"], r["entries"], r["done"], r["hits"],
                     _dur(r["seconds_saved"])) for r in data["by_environment"]])
        if data["by_op"]:
            # One op per Triton kernel name: a large cache has thousands.
            shown = data["by_op"][:BY_OP_SHOWN]
            click.echo("by op:")
            _table(("kind", "op", "entries", "done", "hits", "tuning", "saved"),
                   [(r["kind"], r["op"], r["entries"], r["done"], r["hits"],
                     _dur(r["tune_seconds"]), _dur(r["seconds_saved"])) for r in shown])
            if len(data["by_op"]) > len(shown):
                click.echo(f"  ... and {len(data['by_op']) - len(shown)} more ops "
                           "(--json lists all)")
        if claims["live"]:
            click.echo("claims in flight:")
            _table(("key", "op", "owner", "age", "lease left"),
                   [(c["key_hash"][:12], c["op"], c["owner"], _dur(c["age_seconds"]),
                     _dur(c["expires_in_seconds"])) for c in claims["live"]])
        if data["failed"]["keys"]:
            click.echo("failed keys:")
            _table(("key", "op", "attempts", "error"),
                   [(f["key_hash"][:12], f["op"], f["attempts"], (f["error"] or "")[:60])
                    for f in data["failed"]["keys"]])

    out.emit(data, human)


# -- prune -------------------------------------------------------------------------------


@cli.command()
@click.option("--older-than", type=_Duration(), default=None,
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
@click.option("--op", multiple=True, help="Only entries of these ops (with the filters above).")
@click.option("--kind", multiple=True, metavar="KIND",
              help=f"Only entries of these kinds: {KINDS} (with the filters above).")
@click.option("--failed", is_flag=True, help="Drop keys marked failed (they are retried).")
@click.option("--expired-claims", is_flag=True,
              help="Drop claims whose lease has passed (their owner is gone).")
@click.option("--invalid", is_flag=True,
              help="Drop done entries whose key or timings fail validation.")
@click.option("--dry-run", is_flag=True, help="Show what would go; delete nothing.")
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
@_common
def prune(out: Out, older_than: float | None, keep_torch: tuple[str, ...],
          keep_triton: tuple[str, ...], keep_device: tuple[str, ...], torch_: tuple[str, ...],
          triton: tuple[str, ...], device: tuple[str, ...], op: tuple[str, ...],
          kind: tuple[str, ...], failed: bool,
          expired_claims: bool, invalid: bool, dry_run: bool, vacuum: bool | None,
          batch_size: int | None, no_pause: bool) -> None:
    """Delete entries, in small batches, safely while jobs run.

    Selections are OR-ed: --failed, --expired-claims, --invalid, and the done or failed
    entries that match every filter given among --older-than, --keep-*, --torch,
    --triton, --device, --op and --kind. A claim whose lease runs is never deleted. A deleted done
    entry is tuned again by the next job that needs it.
    """
    from . import maintenance

    spec = maintenance.PruneSpec(
        older_than=older_than,
        keep={"torch": list(keep_torch), "triton": list(keep_triton), "device": list(keep_device)},
        only={"torch": list(torch_), "triton": list(triton), "device": list(device)},
        ops=list(op), kinds=list(kind), failed=failed, expired_claims=expired_claims,
        invalid=invalid,
    )
    if spec.is_empty():
        raise _BadArgument("nothing selected: give --older-than, --keep-torch/--keep-triton/"
                           "--keep-device, --torch/--triton/--device/--op/--kind, --failed, "
                           "--expired-claims or --invalid")
    db = _open(out, writes=None if dry_run else "prune")
    try:
        with _progress("pruning" if not dry_run else "listing", not out.as_json) as (total, step):
            report = maintenance.prune(
                db, spec, dry_run=dry_run, batch=batch_size, pause=not no_pause,
                progress=step, on_total=total,
                vacuum="auto" if vacuum is None else ("always" if vacuum else "never"))
    finally:
        db.dispose()

    def human() -> None:
        if dry_run:
            click.echo(f"would delete {report['would_delete']} entries (dry run)")
            rows = report["entries"]
            if rows:
                _table(("key", "state", "op", "device", "torch", "triton", "last used", "why"),
                       [(r["key_hash"][:12], r["state"], r["op"], r["device"], r["torch"],
                         r["triton"], _when(r["last_used_at"] or r["updated_at"]),
                         r.get("invalid", "")) for r in rows[:20]])
                if len(rows) > 20:
                    click.echo(f"  ... and {len(rows) - 20} more (--json lists all)")
            return
        click.echo(f"deleted {report['deleted']} entries in {report['batches']} batches "
                   f"({_dur(report['seconds'])})")
        v = report["vacuum"]
        click.echo(f"vacuum: {'ran' if v['ran'] else 'skipped'} ({v['why']})")
        click.echo(f"size: {_bytes(report['size_before']['bytes'])} -> "
                   f"{_bytes(report['size_after']['bytes'])}")

    out.emit(report, human)


# -- export / import / merge ------------------------------------------------------------------


def _env_filter(op: Sequence[str], device: Sequence[str], torch_: Sequence[str],
                state: Sequence[str] = (), kind: Sequence[str] = ()) -> Any:
    from .store.admin import EntryFilter

    return EntryFilter(only={"device": list(device), "torch": list(torch_)}, ops=list(op),
                       kinds=list(kind), states=list(state))


@cli.command()
@click.option("-o", "--output", type=click.Path(dir_okay=False, allow_dash=True), default="-",
              help="Write to FILE (default: stdout).")
@click.option("--best-only", is_flag=True,
              help="Keep only the winner's timing (others written as null): a small cache "
                   "to ship with a model; consumers pick the same winner without tuning.")
@click.option("--op", multiple=True, help="Only these ops (repeatable).")
@click.option("--kind", multiple=True, metavar="KIND", help=f"Only these kinds: {KINDS} (repeatable).")
@click.option("--device", multiple=True, help="Only these devices (repeatable).")
@click.option("--torch", "torch_", multiple=True, help="Only these torch versions (repeatable).")
@_common
def export(out: Out, output: str, best_only: bool, op: tuple[str, ...], kind: tuple[str, ...],
           device: tuple[str, ...], torch_: tuple[str, ...]) -> None:
    """Write done entries as versioned JSON lines.

    Line 1: {"format": "tunecache-export", "version": 1, ...}; then one entry per line:
    key (the key object), key_hash, timings ({candidate: ms, null = failed/unmeasured}),
    best, tune_seconds, created_at, updated_at. The summary goes to stderr (stdout may be
    the export itself), or to stdout with --json when -o names a file.
    """
    from . import maintenance

    db = _open(out)
    try:
        with contextlib.ExitStack() as stack:
            f: TextIO = (sys.stdout if output == "-" else
                         stack.enter_context(open(output, "w", encoding="utf-8")))
            with _progress("exporting", output != "-" and not out.as_json) as (total, step):
                report = maintenance.export(db, f, best_only=best_only,
                                            env=_env_filter(op, device, torch_, kind=kind),
                                            progress=step, on_total=total)
    finally:
        db.dispose()
    summary = (f"exported {report['exported']} entries"
               + (f"; skipped {len(report['skipped_invalid'])} invalid" if report["skipped_invalid"]
                  else ""))
    if out.as_json and output != "-":
        click.echo(json.dumps(report, indent=2, sort_keys=True))
    else:
        click.echo(summary, err=True)
        for s in report["skipped_invalid"]:
            click.echo(f"  skipped {s['key_hash'][:16]}: {s['reason']}", err=True)


_CONFLICT_HELP = (
    "For a key already in the target: keep (default) leaves a done entry as it is (done "
    "entries are immutable); replace overwrites it; faster overwrites it only when the "
    "incoming fastest timing is lower. Under every policy a live claim is left alone and a "
    "failed key or expired claim is replaced."
)


def _conflict_option(fn: F) -> F:
    return click.option("--on-conflict", type=click.Choice(CONFLICT_POLICIES), default="keep",
                        show_default=True, help=_CONFLICT_HELP)(fn)


def _import_report(ctx: click.Context, out: Out, report: Mapping[str, Any], skip_invalid: bool,
                   what: str) -> None:
    def human() -> None:
        verb = "would import" if report["dry_run"] else "imported"
        click.echo(f"{verb} into {report['database']}: {report['inserted']} new, "
                   f"{report['replaced']} replaced, {report['unchanged']} kept, "
                   f"{report['busy']} busy (being tuned), {report['invalid']} invalid "
                   f"(on conflict: {report['on_conflict']})")
        for bad in report["bad"]:
            click.echo(f"{what}: {bad['where']}: {bad['reason']}", err=True)

    out.emit(report, human)
    if report["invalid"] and not skip_invalid:
        if not out.as_json:
            click.echo(f"Error: {report['invalid']} invalid entries skipped; fix them or pass "
                       "--skip-invalid to accept the rest silently", err=True)
        ctx.exit(1)


@cli.command("import")
@click.argument("file", type=click.File("r", encoding="utf-8", errors="replace"))
@_conflict_option
@click.option("--skip-invalid", is_flag=True,
              help="Exit 0 even if some lines were invalid (they are skipped either way).")
@click.option("--dry-run", is_flag=True, help="Validate and count; write nothing.")
@_common
@click.pass_context
def import_(ctx: click.Context, out: Out, file: TextIO, on_conflict: str, skip_invalid: bool,
            dry_run: bool) -> None:
    """Import an export file (FILE, or - for stdin).

    Every entry is validated (key size and JSON, timings, tune_seconds); its key_hash is
    recomputed from the key, never trusted. Valid entries are imported even when others
    are not; each bad line is reported (line number and reason) and the exit code is 1
    unless --skip-invalid.
    """
    from . import maintenance

    db = _open(out, create=True, writes=None if dry_run else "import")
    try:
        with _progress("importing", not out.as_json) as (_total, step):
            report = maintenance.import_records(
                db, maintenance.parse_export(file, getattr(file, "name", "input")),
                on_conflict=on_conflict, dry_run=dry_run, progress=step)  # type: ignore[arg-type]
    finally:
        db.dispose()
    _import_report(ctx, out, report, skip_invalid, getattr(file, "name", "input"))


@cli.command()
@click.argument("src_db")
@click.option("--into", metavar="PATH|URL", default=None,
              help="Target database (default: --db, else $TUNECACHE_DB).")
@_conflict_option
@click.option("--skip-invalid", is_flag=True,
              help="Exit 0 even if some source entries were invalid (skipped either way).")
@click.option("--dry-run", is_flag=True, help="Validate and count; write nothing.")
@_common
@click.pass_context
def merge(ctx: click.Context, out: Out, src_db: str, into: str | None, on_conflict: str,
          skip_invalid: bool, dry_run: bool) -> None:
    """Merge the done entries of SRC_DB into the target, validated like an import.

    SRC_DB is only read (and must be at this tunecache's schema).
    """
    from . import maintenance
    from .store import Database, ensure_schema

    if into is not None:
        out.db = into
    src_settings = Settings.from_env(db=src_db)
    src = Database(src_settings.db_url, src_settings.lock_timeout, readonly=True)
    if src.sqlite_path and not os.path.exists(src.sqlite_path):
        raise _BadArgument(f"SRC_DB {src.display_url}: no such database file")
    try:
        ensure_schema(src, may_migrate=False)
        target = _open(out, create=True, writes=None if dry_run else "merge")
        try:
            with _progress("merging", not out.as_json) as (total, step):
                report = maintenance.merge(src, target, on_conflict=on_conflict,  # type: ignore[arg-type]
                                           dry_run=dry_run, progress=step, on_total=total)
        finally:
            target.dispose()
    finally:
        src.dispose()
    _import_report(ctx, out, report, skip_invalid, src.display_url)


# -- doctor ------------------------------------------------------------------------------


@cli.command()
@_common
@click.pass_context
def doctor(ctx: click.Context, out: Out) -> None:
    """Check that this host can share the cache safely; exit 1 if any check fails.

    Reachability, schema version, the filesystem under a SQLite path and whether POSIX
    locks work there, journal mode, group permissions, clock skew. Never writes to the
    database (on SQLite it creates and removes one scratch file beside it).
    """
    from . import doctor as doctor_mod

    checks = doctor_mod.run_checks(out.settings)
    failed = any(c.status == "fail" for c in checks)

    def human() -> None:
        for c in checks:
            click.echo(f"{c.status:<5} {c.name:<12} {c.message}")
            if c.fix and c.status != "ok":
                click.echo(f"{'':<5} {'':<12} fix: {c.fix}")

    out.emit({"ok": not failed, "checks": [c.as_dict() for c in checks]}, human)
    if failed:
        ctx.exit(1)


# -- ls / show -------------------------------------------------------------------------------


@cli.command("ls")
@click.option("--op", multiple=True, help="Only these ops (repeatable).")
@click.option("--kind", multiple=True, metavar="KIND", help=f"Only these kinds: {KINDS} (repeatable).")
@click.option("--state", multiple=True, type=click.Choice(["done", "claimed", "failed"]),
              help="Only these states (repeatable).")
@click.option("--device", multiple=True, help="Only these devices (repeatable).")
@click.option("--torch", "torch_", multiple=True, help="Only these torch versions (repeatable).")
@click.option("--limit", type=click.IntRange(1, None), default=50, show_default=True)
@_common
def ls_(out: Out, op: tuple[str, ...], kind: tuple[str, ...], state: tuple[str, ...],
        device: tuple[str, ...], torch_: tuple[str, ...], limit: int) -> None:
    """List entries, most recently updated first."""
    from . import maintenance

    db = _open(out)
    try:
        rows = maintenance.ls(db, _env_filter(op, device, torch_, state, kind), limit)
    finally:
        db.dispose()

    def human() -> None:
        _table(("key", "state", "op", "device", "torch", "best", "tune", "hits", "updated"),
               [(r["key_hash"][:12], r["state"], r["op"], r["device"], r["torch"],
                 _clip(r["best"], 40), _dur(r["tune_seconds"]), r["hits"],
                 _when(r["updated_at"])) for r in rows], indent="")

    out.emit(rows, human)


@cli.command()
@click.argument("key_hash_prefix")
@_common
def show(out: Out, key_hash_prefix: str) -> None:
    """Show one entry: key, timings (fastest first), winner, owner, token, times."""
    from . import maintenance

    db = _open(out)
    try:
        entry = maintenance.show(db, key_hash_prefix)
    finally:
        db.dispose()

    def human() -> None:
        click.echo(f"key_hash     {entry['key_hash']}")
        click.echo(f"state        {entry['state']}")
        click.echo(f"best         {entry['best'] or '-'}")
        click.echo(f"tune time    {_dur(entry['tune_seconds'])}")
        click.echo(f"owner        {entry['owner'] or '-'} (token {entry['token']}, "
                   f"attempts {entry['attempts']})")
        if entry["state"] == "claimed":
            left = (entry["lease_expires_at"] or entry["now"]) - entry["now"]
            click.echo(f"lease        {'expired' if left <= 0 else _dur(left) + ' left'}")
        if entry["error"]:
            click.echo(f"error        {entry['error']}")
        click.echo(f"hits         {entry['hits']}")
        click.echo(f"created      {_when(entry['created_at'])}")
        click.echo(f"updated      {_when(entry['updated_at'])}")
        click.echo(f"last used    {_when(entry['last_used_at'])}")
        if entry["key_error"]:
            click.echo(f"key: INVALID ({entry['key_error']})")
        else:
            click.echo("key:")
            click.echo(json.dumps(entry["key"], indent=2, sort_keys=True))
        if entry["timings_error"]:
            click.echo(f"timings: INVALID ({entry['timings_error']})")
        elif entry["timings"]:
            click.echo("timings (ms, fastest first):")
            for t in entry["timings"]:
                ms = "failed" if t["ms"] is None else f"{t['ms']:.6g}"
                click.echo(f"  {ms:>12}  {t['candidate']}")

    out.emit(entry, human)


# -- upgrade ---------------------------------------------------------------------------------


@cli.command()
@_common
def upgrade(out: Out) -> None:
    """Run the schema migrations now (creates the database if it does not exist)."""
    from . import maintenance

    report = maintenance.upgrade(out.settings)

    def human() -> None:
        if report["from"] == report["to"]:
            click.echo(f"{report['database']}: schema already at revision {report['to']}")
        else:
            click.echo(f"{report['database']}: schema upgraded from revision "
                       f"{report['from'] or '(none)'} to {report['to']}")

    out.emit(report, human)


# -- warm ----------------------------------------------------------------------------------


@cli.command()
@click.option("--op", multiple=True,
              # tunecache.warm.WARM_OPS (not imported here: the CLI starts without it)
              type=click.Choice(["mm", "addmm", "bmm", "baddbmm", "int_mm", "mm_plus_mm"]),
              help="Ops to warm (repeatable; default: every recorded GEMM key, and those "
                   "of ops warm cannot rebuild are listed as skipped, with the reason).")
@click.option("--from-torch", multiple=True, metavar="VERSION",
              help="Only keys recorded under these torch versions (repeatable).")
@click.option("--from-device", multiple=True, metavar="NAME",
              help="Only keys recorded on these devices (repeatable).")
@click.option("--limit", type=click.IntRange(1, None), default=None,
              help="At most this many distinct GEMMs.")
@click.option("--dry-run", is_flag=True, help="List what would be tuned; compile nothing.")
@_common
@click.pass_context
def warm(ctx: click.Context, out: Out, op: tuple[str, ...], from_torch: tuple[str, ...],
         from_device: tuple[str, ...], limit: int | None, dry_run: bool) -> None:
    """Re-tune, on this machine, the GEMM keys earlier jobs recorded, so the next job starts
    warm (after a torch/triton upgrade, or on a new GPU type).

    Each distinct (op, inputs, precision) is compiled with max-autotune and tunecache
    enabled. Under torchrun every rank runs it; claims split the work. Exit 1 if any
    compile failed.
    """
    from . import warm as warm_mod

    db = _open(out)
    try:
        tasks, skipped = warm_mod.select_tasks(db, op or None,
                                               from_torch=from_torch, from_device=from_device,
                                               limit=limit)
        if dry_run:
            data = {"database": db.display_url, "dry_run": True, "keys": len(tasks),
                    "tasks": [t.as_dict() for t in tasks], "skipped": skipped}

            def human_dry() -> None:
                click.echo(f"would warm {len(tasks)} GEMMs (dry run)")
                _table(("op", "precision", "inputs", "seen in"),
                       [(t.op, t.precision, t.inputs,
                         ", ".join(f"{s['device']}/torch {s['torch']}" for s in t.seen_in))
                        for t in tasks])
                for s in skipped:
                    click.echo(f"skipped {s['key_hash'][:16]}: {s['reason']}", err=True)

            out.emit(data, human_dry)
            return
        with _progress("warming", not out.as_json) as (total, step):
            total(len(tasks))
            report = warm_mod.warm(out.settings, db, tasks, progress=step)
        report["skipped"] = skipped
    finally:
        db.dispose()

    def human() -> None:
        click.echo(f"warmed {report['keys']} GEMMs in {_dur(report['seconds'])}: "
                   f"{report['tuned']} tuned here, {report['hit']} already cached, "
                   f"{report['peer']} tuned by peers, {report['local']} local only, "
                   f"{report['not_autotuned']} not autotuned, {report['error']} failed "
                   f"(rank {report['rank']} of {report['world_size']}); "
                   f"{len(skipped)} recorded keys skipped")
        for t in report["tasks"]:
            if t["outcome"] == "error":
                click.echo(f"failed: {t['op']} {t['inputs']}: {t['error']}", err=True)
            elif t.get("reason"):
                click.echo(f"{t['outcome']}: {t['op']} {t['inputs']}: {t['reason']}",
                           err=True)
        for s in skipped:
            click.echo(f"skipped {s['key_hash'][:16]}: {s['reason']}", err=True)

    out.emit(report, human)
    if report["error"]:
        ctx.exit(1)


def main() -> None:
    cli(prog_name="tunecache")


if __name__ == "__main__":
    main()

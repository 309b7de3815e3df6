"""Commands that look at a cache without changing it: stats, ls, show, doctor.

Each is a thin shell over tunecache.ops (imported when the command runs: it imports
SQLAlchemy, and ``tunecache --help`` starts without it).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import click

from . import format as fmt
from .app import BadArgument
from .options import Duration, Invocation, Selection, common, entry_filters, opened

# The per-day view's bound (tunecache.ops.statistics.DAYS_SHOWN; not imported from there:
# tunecache.ops loads SQLAlchemy, which `tunecache --help` starts without).
DAYS_SHOWN = 366

if TYPE_CHECKING:
    from ..ops.statistics import GainsReport, Headline, TransferredReport, UsageDay

__all__ = ["stats", "ls", "show", "doctor"]

# Rows of `stats`' "by op" table in human output (--json has them all).
BY_OP_SHOWN = 20
# Ops shown in stats' "what tuning bought" table, those that save the most first.
GAINS_OPS_SHOWN = 10


@click.command()
@click.option("--since", type=Duration(), default=None, metavar="DURATION",
              help="Count only what the jobs reported in this last while (7d, 12h); the "
                   "stored entries are counted whole.")
@click.option("--by-day", is_flag=True,
              help="Also list the jobs' reports per UTC day, newest first (the --since "
                   f"window's days, at most {DAYS_SHOWN}).")
@common
def stats(inv: Invocation, since: float | None, by_day: bool) -> None:
    """What the cache bought (three lines first), then entries by state, environment and
    op; size; hits; claims; failures; what tuning bought per kind and op; transferred
    entries and their regret."""
    from .. import ops

    with opened(inv, read_only=True) as db:
        data = ops.stats(db, since=since, by_day=by_day)

    def human() -> None:
        assert data.headline is not None
        _human_headline(data.headline, data.usage.invalid)
        size = data.size
        free = f", {fmt.size(size['free_bytes'])} free" if size["free_bytes"] else ""
        click.echo(f"database  {data.database} ({data.backend}, {fmt.size(size['bytes'])}"
                   f"{free}, schema {fmt.safe(data.schema)})")
        states = data.entries.by_state
        click.echo(f"entries   {data.entries.total} (done {states['done']}, "
                   f"claimed {states['claimed']}, failed {states['failed']})")
        # Two counts that differ on purpose: the entries' counters add up the results
        # each stored entry served (cache hits and waits for a peer's result), and go
        # when the entry is pruned; the processes' reports split hits from peers' results
        # and keep counting pruned entries.
        click.echo(f"hits      {data.hits} results served by the stored entries (cache hits "
                   f"and peers' results); tuning stored {fmt.dur(data.tune_seconds)}, "
                   f"compile time avoided {fmt.dur(data.seconds_saved)}")
        u = data.usage
        window = f" in the last {fmt.span(u.since_seconds)}" if u.since_seconds else ""
        click.echo(f"processes {fmt.plural(u.reports, 'report')}{window}: "
                   f"{fmt.plural(u.hits, 'cache hit')}, {u.peer} peers' results, {u.tuned} "
                   f"tuned, {u.local} tuned without the database; compile time avoided "
                   f"{fmt.dur(u.seconds_saved)}, tuning {fmt.dur(u.seconds_tuning)}"
                   + (f"; {fmt.plural(u.invalid, 'report')} with counts or times no job "
                      "records (not counted)" if u.invalid else ""))
        claims = data.claims
        click.echo(f"claims    {claims.in_flight} in flight, {claims.expired} expired")
        click.echo(f"failed    {fmt.plural(data.failed.count, 'key')}")
        graphs = data.graphs
        kinds = ", ".join(f"{fmt.safe(r['kind'])} {r['count']}" for r in graphs.by_kind)
        click.echo(f"graphs    {fmt.plural(graphs.count, 'compiled graph')}, "
                   f"{fmt.size(graphs.bytes)}" + (f" ({kinds})" if kinds else "")
                   + f", {fmt.plural(graphs.hits, 'load')}"
                   + (f"; {graphs.invalid} with an invalid size (not counted; prune "
                      "--max-graph-bytes removes them)" if graphs.invalid else ""))
        _human_gains(data.gains, data.transferred)
        if data.by_kind:
            click.echo("by kind:")
            fmt.table(("kind", "entries", "done", "hits", "tuning", "avoided"),
                   [(r["kind"], r["entries"], r["done"], r["hits"], fmt.dur(r["tune_seconds"]),
                     fmt.dur(r["seconds_saved"])) for r in data.by_kind])
        if data.by_environment:
            click.echo("by environment:")
            fmt.table(("device", "torch", "triton", "entries", "done", "hits", "avoided"),
                   [(r["device"], r["torch"], r["triton"], r["entries"], r["done"], r["hits"],
                     fmt.dur(r["seconds_saved"])) for r in data.by_environment])
        if data.by_op:
            # One op per Triton kernel name: a large cache has thousands.
            shown = data.by_op[:BY_OP_SHOWN]
            click.echo("by op:")
            fmt.table(("kind", "op", "entries", "done", "hits", "tuning", "avoided"),
                   [(r["kind"], r["op"], r["entries"], r["done"], r["hits"],
                     fmt.dur(r["tune_seconds"]), fmt.dur(r["seconds_saved"])) for r in shown])
            if len(data.by_op) > len(shown):
                click.echo(f"  ... and {len(data.by_op) - len(shown)} more ops "
                           "(--json lists all)")
        if graphs.groups:
            click.echo("compiled graphs by kind and torch:")
            # "ever loaded" against "entries": what publishing them was worth.
            fmt.table(("kind", "torch", "entries", "ever loaded", "size", "loads", "last used"),
                      [(g["kind"], g["torch"], g["count"], g["loaded"], fmt.size(g["bytes"]),
                        g["hits"], fmt.when(g["last_used_at"])) for g in graphs.groups])
        if claims.live:
            click.echo("claims in flight:")
            fmt.table(("key", "op", "owner", "age", "lease left"),
                   [(c["key_hash"][:12], c["op"], c["owner"], fmt.dur(c["age_seconds"]),
                     fmt.dur(c["expires_in_seconds"])) for c in claims.live])
        if data.failed.keys:
            click.echo("failed keys:")
            fmt.table(("key", "op", "attempts", "error"),
                   [(f["key_hash"][:12], f["op"], f["attempts"], (f["error"] or "")[:60])
                    for f in data.failed.keys])
        if data.by_day is not None:
            _human_days(data.by_day)

    inv.emit(data, human)


def _human_headline(h: Headline, invalid: int) -> None:
    """The three lines an operator reads first: compile time avoided, tuning spent, and
    what the tuned kernels gained against untuned."""
    window = f" in the last {fmt.span(h.since_seconds)}" if h.since_seconds else ""
    click.echo(f"avoided   {fmt.dur(h.compile_seconds_avoided)} of compile time{window}, by "
               f"{fmt.plural(h.results_served, 'result')} from the database (cache hits and "
               "peers' results)")
    click.echo(f"spent     {fmt.dur(h.tuning_seconds_spent)} tuning{window}, "
               f"{fmt.plural(h.keys_tuned, 'key')} tuned")
    if not h.entries_with_baseline:
        click.echo("gained    - (no stored entry records an untuned baseline)")
    else:
        click.echo(f"gained    tuned kernels {fmt.times(h.speedup)} as fast as untuned: one "
                   f"call of each of {fmt.plural(h.entries_with_baseline, 'stored entry')} "
                   f"{fmt.ms(h.tuned_ms_per_call)} against {fmt.ms(h.untuned_ms_per_call)}, "
                   f"{fmt.ms(h.ms_gained_per_call)} gained per call")


def _human_days(days: tuple[UsageDay, ...]) -> None:
    click.echo("by day (UTC, the jobs' reports):")
    if not days:
        click.echo("  no reports")
        return
    fmt.table(("day", "reports", "cache hits", "peers' results", "tuned", "avoided",
               "tuning"),
              [(d.day, d.reports, d.hits, d.peer, d.tuned + d.local, fmt.dur(d.seconds_saved),
                fmt.dur(d.seconds_tuning)) for d in days])


_ms = fmt.ms
_x = fmt.times


def _human_gains(gains: GainsReport, transferred: TransferredReport) -> None:
    """stats' "what tuning bought" and "transferred" lines (--json has every op)."""
    skipped = (f"; {fmt.plural(gains.skipped, 'entry')} skipped (their meta or timings "
               "do not read)" if gains.skipped else "")
    t = gains.total
    if not t["entries"]:
        click.echo(f"bought    no entry records an untuned baseline{skipped}")
    else:
        click.echo(f"bought    {fmt.plural(t['entries'], 'entry')} with a baseline: one call "
                   f"of each {_ms(t['baseline_ms'])} untuned, {_ms(t['best_ms'])} tuned "
                   f"({_x(t['speedup'])}, {_ms(t['ms_saved_per_call'])} gained), found in "
                   f"{fmt.dur(t['tune_seconds'])} of tuning{skipped}")
    moved = transferred.by_kind
    if moved:
        parts = []
        for r in moved:
            regret = (f"regret mean {fmt.plain(r['regret_mean'])}, max "
                      f"{fmt.plain(r['regret_max'])}"
                      if r["regret_measured"] else "no regret measured yet")
            parts.append(f"{fmt.safe(r['kind'])} {r['entries']} ({r['benchmarked']} of "
                         f"{r['generated']} candidates benchmarked; {r['regret_measured']} "
                         f"re-tuned in full, {regret})")
        click.echo("transfer  " + "; ".join(parts))
    if t["entries"]:
        rows = [("kind", r["kind"], "") for r in gains.by_kind] + \
            [("op", r["kind"], r["op"]) for r in gains.by_op[:GAINS_OPS_SHOWN]]
        click.echo("what tuning bought (per call, by kind, then by op):")
        table = gains.by_kind + gains.by_op[:GAINS_OPS_SHOWN]
        fmt.table(("by", "kind", "op", "entries", "untuned", "tuned", "speedup", "gained",
                   "tuning"),
                  [(*label, r["entries"], _ms(r["baseline_ms"]), _ms(r["best_ms"]),
                    _x(r["speedup"]), _ms(r["ms_saved_per_call"]), fmt.dur(r["tune_seconds"]))
                   for label, r in zip(rows, table)])
        if len(gains.by_op) > GAINS_OPS_SHOWN:
            click.echo(f"  ... and {len(gains.by_op) - GAINS_OPS_SHOWN} more ops "
                       "(--json lists all)")
        click.echo("top keys by time gained per call:")
        fmt.table(("key", "kind", "op", "untuned", "tuned", "speedup", "gained", "tuning",
                   "hits"),
                  [(k["key_hash"][:12], k["kind"], k["op"], _ms(k["baseline_ms"]),
                    _ms(k["best_ms"]), _x(k["speedup"]), _ms(k["ms_saved_per_call"]),
                    fmt.dur(k["tune_seconds"]), k["hits"]) for k in gains.top_keys])


@click.command("ls")
@entry_filters(states=True)
@click.option("--graphs", is_flag=True,
              help="List compiled graphs, kernels and shape profiles (Inductor's FX graph and "
                   "AOTAutograd entries, Triton's kernels, Dynamo's profiles), most recently "
                   "used first, instead of tuning entries; --kind fxgraph, autograd, kernel or "
                   "pgo implies it. Filters: --kind, --torch.")
@click.option("--limit", type=click.IntRange(1, None), default=50, show_default=True)
@common
def ls(inv: Invocation, selection: Selection, limit: int, graphs: bool) -> None:
    """List entries, most recently updated first (or, --graphs, compiled graphs)."""
    from .. import ops

    if selection.kinds and set(selection.kinds) <= set(ops.ARTIFACT_KINDS):
        graphs = True
    if graphs:
        if selection.ops or selection.states or selection.devices:
            raise BadArgument("compiled graphs have no op, state or device: with --graphs, "
                              "filter by --kind and --torch")
        _ls_graphs(inv, selection, limit)
        return
    with opened(inv, read_only=True) as db:
        rows = ops.ls(db, selection.entry_filter(), limit)

    def human() -> None:
        fmt.table(("key", "state", "op", "device", "torch", "best", "tune", "hits", "updated"),
               [(r["key_hash"][:12], r["state"], r["op"], r["device"], r["torch"],
                 fmt.clip(r["best"], 40), fmt.dur(r["tune_seconds"]), r["hits"],
                 fmt.when(r["updated_at"])) for r in rows], indent="")

    inv.emit(rows, human)


def _ls_graphs(inv: Invocation, selection: Selection, limit: int) -> None:
    from .. import ops

    with opened(inv, read_only=True) as db:
        rows = ops.ls_graphs(db, ops.GraphFilter.of_entries(selection.entry_filter()), limit)

    def human() -> None:
        fmt.table(("kind", "key", "size", "torch", "loads", "created", "last used"),
                  [(r["kind"], fmt.clip(r["key"], 24), fmt.size(r["size"]),
                    fmt.clip(r["torch_version"], 24), r["hits"], fmt.when(r["created_at"]),
                    fmt.when(r["last_used_at"])) for r in rows], indent="")

    inv.emit(rows, human)


@click.command()
@click.argument("key_hash_prefix")
@common
def show(inv: Invocation, key_hash_prefix: str) -> None:
    """Show one entry: key, timings (fastest first), winner, owner, token, times."""
    from .. import ops

    with opened(inv, read_only=True) as db:
        entry = ops.show(db, key_hash_prefix)

    def human() -> None:
        click.echo(f"key_hash     {fmt.safe(entry.key_hash)}")
        click.echo(f"state        {fmt.safe(entry.state)}")
        click.echo(f"best         {fmt.safe(entry.best or '-')}")
        click.echo(f"tune time    {fmt.dur(entry.tune_seconds)}")
        click.echo(f"owner        {fmt.safe(entry.owner or '-')} (token "
                   f"{fmt.safe(entry.token)}, attempts {fmt.safe(entry.attempts)})")
        if entry.state == "claimed":
            left = None if entry.lease_expired else entry.lease_expires_at - entry.now
            click.echo(f"lease        {'expired' if left is None else fmt.dur(left) + ' left'}")
        if entry.error:
            click.echo(f"error        {fmt.safe(entry.error)}")
        click.echo(f"hits         {fmt.safe(entry.hits)}")
        click.echo(f"created      {fmt.when(entry.created_at)}")
        click.echo(f"updated      {fmt.when(entry.updated_at)}")
        click.echo(f"last used    {fmt.when(entry.last_used_at)}")
        if entry.key_error:
            click.echo(f"key: INVALID ({fmt.safe(entry.key_error)})")
        else:
            click.echo("key:")
            click.echo(json.dumps(entry.key, indent=2, sort_keys=True))
        if entry.timings_error:
            click.echo(f"timings: INVALID ({fmt.safe(entry.timings_error)})")
        elif entry.timings:
            click.echo("timings (ms, fastest first):")
            for t in entry.timings:
                ms = "no timing" if t["ms"] is None else f"{t['ms']:.6g}"
                click.echo(f"  {ms:>12}  {fmt.safe(t['candidate'])}")
            if any(t["ms"] is None for t in entry.timings):
                # Both are stored as null: "failed" misnamed every candidate a --best-only
                # export left out.
                click.echo("  (no timing: the candidate failed to run, or was not measured: "
                           "a --best-only export keeps only the winner's)")

    inv.emit(entry, human)



@click.command()
@common
@click.pass_context
def doctor(ctx: click.Context, inv: Invocation) -> None:
    """Check that this host can share the cache safely; exit 1 if any check fails.

    Reachability, schema version, the filesystem under a SQLite path and whether POSIX
    locks work there, journal mode, group permissions, clock skew. Never writes to the
    database (on SQLite it creates and removes one scratch file beside it).
    """
    from .. import ops

    checks = ops.run_checks(inv.settings)
    failed = any(c.status == "fail" for c in checks)

    def human() -> None:
        for c in checks:
            click.echo(f"{c.status:<5} {c.name:<12} {c.message}")
            if c.fix and c.status != "ok":
                click.echo(f"{'':<5} {'':<12} fix: {c.fix}")

    inv.emit({"ok": not failed, "checks": [c.as_dict() for c in checks]}, human)
    if failed:
        ctx.exit(1)


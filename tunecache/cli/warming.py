"""`tunecache warm`: re-tune here the GEMM keys earlier jobs recorded (a thin shell over
tunecache.warm, imported when the command runs: it imports SQLAlchemy, and torch when it
compiles)."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import click

from . import format as fmt
from .app import BadArgument
from .options import Invocation, LibraryChoice, common, opened

if TYPE_CHECKING:
    from ..warm import ExhaustiveReport, ExhaustiveTask, WarmReport, WarmTask
    from ..warm.choose import SkippedKey
    from ..warm.user_kernel_run import UserKernelWarmReport

__all__ = ["warm"]


@click.command()
@click.option("--op", multiple=True,
              # read from tunecache.warm when first used: the CLI starts without it
              type=LibraryChoice("tunecache.warm:WARM_OPS"),
              help="Ops to warm (repeatable; default: every recorded GEMM key, and those "
                   "of ops warm cannot rebuild are listed as skipped, with the reason).")
@click.option("--from-torch", multiple=True, metavar="VERSION",
              help="Only keys recorded under these torch versions (repeatable).")
@click.option("--from-device", multiple=True, metavar="NAME",
              help="Only keys recorded on these devices (repeatable).")
@click.option("--limit", type=click.IntRange(1, None), default=None,
              help="At most this many distinct GEMMs.")
@click.option("--dry-run", is_flag=True, help="List what would be tuned; compile nothing.")
@click.option("--exhaustive", is_flag=True,
              help="Instead: re-tune in full the GEMM entries that were transferred (tuned "
                   "from neighbours' best candidates only) and record each one's regret "
                   "(its winner's time / the best of all candidates) in its meta.")
@click.option("--again", is_flag=True,
              help="With --exhaustive: also entries whose regret was measured before.")
@click.option("--user-kernels", "packages", multiple=True, metavar="PACKAGE",
              help="Instead: tune here the recorded keys of users' @triton.autotune "
                   "kernels of this installed package (repeatable; e.g. liger_kernel), by "
                   "calling each kernel as the job that tuned it did. Only kernels of the "
                   "packages named are imported.")
@common
@click.pass_context
def warm(ctx: click.Context, inv: Invocation, op: tuple[str, ...], from_torch: tuple[str, ...],
         from_device: tuple[str, ...], limit: int | None, dry_run: bool, exhaustive: bool,
         again: bool, packages: tuple[str, ...]) -> None:
    """Re-tune, on this machine, the GEMM keys earlier jobs recorded, so the next job starts
    warm (after a torch/triton upgrade, or on a new GPU type).

    Each distinct (op, inputs, precision) is compiled with max-autotune and tunecache
    enabled. Under torchrun every rank runs it; claims split the work. Exit 1 if any
    compile failed. With --user-kernels, the same for users' Triton kernels.
    """
    from .. import warm as warm_mod

    _warn_unmatched(inv, from_torch, from_device)
    if again and not exhaustive:
        raise BadArgument("--again only applies to --exhaustive")
    if packages:
        if op or exhaustive:
            raise BadArgument("--user-kernels warms users' kernels only: no --op, "
                              "--exhaustive")
        if any(not all(p.isidentifier() for p in name.split(".")) for name in packages):
            raise BadArgument("--user-kernels takes a package's import name (liger_kernel)")
        missing = [name for name in packages if not _installed(name)]
        if missing and not dry_run:  # a dry run lists recorded keys: no package needed
            # A nightly job with a typo would otherwise warm nothing, and say so quietly.
            raise BadArgument(f"--user-kernels: no installed package named "
                              f"{', '.join(missing)}")
        if not dry_run:
            _need("torch", "tunecache[torch]")
            _need("triton", "triton")
        _warm_user_kernels(ctx, inv, packages, from_torch, from_device, limit, dry_run)
        return
    if not dry_run:
        _need("torch", "tunecache[torch]")
    with opened(inv, read_only=dry_run) as db:
        tasks: Any  # WarmTask, or ExhaustiveTask with --exhaustive (each has its printer)
        if exhaustive:
            tasks, skipped = warm_mod.select_transferred(
                db, op or None, from_torch=from_torch, from_device=from_device, again=again,
                limit=limit)
        else:
            tasks, skipped = warm_mod.select_tasks(
                db, op or None, from_torch=from_torch, from_device=from_device, limit=limit)
        if dry_run:
            data = {"database": db.display_url, "dry_run": True, "keys": len(tasks),
                    "tasks": [t.as_dict() for t in tasks], "skipped": skipped,
                    **({"exhaustive": True} if exhaustive else {})}
            dry = _human_dry_exhaustive if exhaustive else _human_dry
            inv.emit(data, functools.partial(dry, tasks, skipped))
            return
        with fmt.progress("re-tuning in full" if exhaustive else "warming",
                          not inv.as_json) as (total, step):
            total(len(tasks))
            report: ExhaustiveReport | WarmReport
            if exhaustive:
                report = dataclasses.replace(
                    warm_mod.exhaustive(inv.settings, db, tasks, progress=step),
                    skipped=tuple(skipped))
                failed, human = report.error, functools.partial(_human_exhaustive, report)
            else:
                report = dataclasses.replace(
                    warm_mod.warm(inv.settings, db, tasks, progress=step),
                    skipped=tuple(skipped))
                failed, human = report.error, functools.partial(_human_warm, report)
    inv.emit(report, human)
    if failed:
        ctx.exit(1)


def _installed(package: str) -> bool:
    """Whether ``package`` (an import name) can be imported here."""
    import importlib.util

    try:
        return importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):  # a parent that is not a package, or is absent
        return False


def _need(module: str, install: str) -> None:
    """A warm that compiles needs ``module``: without it, one line on what to install."""
    try:
        __import__(module)
    except ImportError:
        raise click.ClickException(
            f"warm compiles with {module}, which is not installed here: pip install "
            f"'{install}' (or the build your jobs use); --dry-run lists the keys "
            "without it") from None


def _warm_user_kernels(ctx: click.Context, inv: Invocation, packages: tuple[str, ...],
                       from_torch: tuple[str, ...], from_device: tuple[str, ...],
                       limit: int | None, dry_run: bool) -> None:
    from ..user_kernels import warm as uk_warm

    with opened(inv, read_only=dry_run) as db:
        database = db.display_url
        tasks, skipped = uk_warm.select_user_kernels(
            db, packages, from_torch=from_torch, from_device=from_device, limit=limit)
    if dry_run:
        data = {"database": database, "dry_run": True, "user_kernels": len(tasks),
                "tasks": [t.as_dict() for t in tasks], "skipped": skipped}
        inv.emit(data, functools.partial(_human_dry_user_kernels, tasks, skipped))
        return
    from ..warm.user_kernel_run import warm_user_kernels

    with fmt.progress("warming user kernels", not inv.as_json) as (total, step):
        total(len(tasks))
        report = dataclasses.replace(
            warm_user_kernels(inv.settings, database, tasks, packages, progress=step),
            skipped=tuple(skipped))
    inv.emit(report, functools.partial(_human_user_kernels, report))
    if report.error:
        ctx.exit(1)


def _human_dry_user_kernels(tasks: Sequence[Any], skipped: Sequence[Mapping[str, Any]]) -> None:
    click.echo(f"would warm {len(tasks)} user-kernel keys (dry run)")
    fmt.table(("kernel", "tuning values", "seen in"),
              [(t.kernel, fmt.clip(str(t.tuning_key), 60),
                ", ".join(f"{s['device']}/triton {s['triton']}" for s in t.seen_in))
               for t in tasks])
    _echo_skipped(skipped)


def _human_user_kernels(report: UserKernelWarmReport) -> None:
    click.echo(f"warmed {report.user_kernels} user-kernel keys in "
               f"{fmt.dur(report.seconds)}: {report.tuned} tuned here, "
               f"{report.hit} already cached, {report.peer} tuned by peers, "
               f"{report.error} failed; {len(report.skipped)} recorded keys skipped")
    for t in report.tasks:
        if t["outcome"] == "error":
            click.echo(f"failed: {fmt.safe(t['kernel'])} {fmt.safe(str(t['tuning_key']))}: "
                       f"{fmt.safe(t['error'])}", err=True)
    _echo_skipped(report.skipped)


def _human_dry(tasks: Sequence[WarmTask], skipped: Sequence[SkippedKey]) -> None:
    click.echo(f"would warm {len(tasks)} GEMMs (dry run)")
    fmt.table(("op", "precision", "inputs", "seen in"),
              [(t.op, t.precision, t.inputs,
                ", ".join(f"{s['device']}/torch {s['torch']}" for s in t.seen_in))
               for t in tasks])
    _echo_skipped(skipped)


def _human_dry_exhaustive(tasks: Sequence[ExhaustiveTask],
                          skipped: Sequence[SkippedKey]) -> None:
    click.echo(f"would re-tune {len(tasks)} transferred GEMM entries in full (dry run)")
    fmt.table(("key", "op", "precision", "inputs", "benchmarked", "winner"),
              [(t.key_hash[:12], t.task.op, t.task.precision, fmt.clip(t.task.inputs, 60),
                f"{t.transfer.get('benchmarked', '?')} of "
                f"{t.transfer.get('generated', '?')}", _ms(t.winner_ms))
               for t in tasks])
    _echo_skipped(skipped)


def _human_warm(report: WarmReport) -> None:
    skipped = report.skipped
    click.echo(f"warmed {report.keys} GEMMs in {fmt.dur(report.seconds)}: "
               f"{report.tuned} tuned here, {report.hit} already cached, "
               f"{report.peer} tuned by peers, {report.local} local only, "
               f"{report.not_autotuned} not autotuned, {report.error} failed "
               f"(rank {report.rank} of {report.world_size}); "
               f"{len(skipped)} recorded keys skipped")
    for t in report.tasks:
        if t["outcome"] == "error":
            click.echo(f"failed: {fmt.safe(t['op'])} {fmt.safe(t['inputs'])}: "
                       f"{fmt.safe(t['error'])}", err=True)
        elif t.get("reason"):
            click.echo(f"{t['outcome']}: {fmt.safe(t['op'])} {fmt.safe(t['inputs'])}: "
                       f"{fmt.safe(t['reason'])}", err=True)
    _echo_skipped(skipped)


def _human_exhaustive(report: ExhaustiveReport) -> None:
    regrets = ("" if report.regret_mean is None or report.regret_max is None else
               f" (regret mean {report.regret_mean:.3g}, max {report.regret_max:.3g})")
    click.echo(f"re-tuned {report.keys} transferred GEMM entries in full in "
               f"{fmt.dur(report.seconds)}: {report.measured} regrets recorded"
               f"{regrets}, {report.other_environment} of another environment, "
               f"{report.not_autotuned} not autotuned, {report.error} failed "
               f"(rank {report.rank} of {report.world_size}); {len(report.skipped)} "
               "skipped")
    measured = [t for t in report.tasks if t["outcome"] == "measured"]
    if measured:
        fmt.table(("key", "op", "candidates", "transferred", "exhaustive", "regret"),
                  [(t["key_hash"][:12], t["op"], f"{t['candidates']} -> {t['candidates_after']}",
                    _ms(t["winner_ms"]), _ms(t["exhaustive_ms"]), f"{t['regret']:.3g}")
                   for t in measured])
    for t in report.tasks:
        if t["outcome"] == "error":
            click.echo(f"failed: {fmt.safe(t['key_hash'][:16])} {fmt.safe(t['op'])}: "
                       f"{fmt.safe(t['error'])}", err=True)
        elif t["outcome"] != "measured":
            click.echo(f"{t['outcome']}: {fmt.safe(t['key_hash'][:16])}: "
                       f"{fmt.safe(t.get('reason'))}", err=True)
    _echo_skipped(report.skipped)


def _warn_unmatched(inv: Invocation, from_torch: tuple[str, ...],
                    from_device: tuple[str, ...]) -> None:
    """A --from-torch or --from-device value no entry holds warms nothing: warned on
    stderr, as prune warns of a --torch that matches nothing."""
    from ..ops.pruning import unmatched_labels

    if not from_torch and not from_device:
        return
    with opened(inv, read_only=True) as db:
        warnings = (unmatched_labels(db, "--from-torch", "torch", list(from_torch))
                    + unmatched_labels(db, "--from-device", "device", list(from_device)))
    for warning in warnings:
        click.echo(f"Warning: {warning}", err=True)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g} ms"


def _echo_skipped(skipped: Sequence[Mapping[str, Any]]) -> None:
    """The recorded keys warm left out, each with its reason, to stderr (escaped: both
    come from the database)."""
    for s in skipped:
        what = s["key_hash"][:16]
        if "kernel" in s:
            what = f"{s['kernel']} {fmt.clip(str(s['tuning_key']), 60)}"
        click.echo(f"skipped {fmt.safe(what)}: {fmt.safe(s['reason'])}", err=True)

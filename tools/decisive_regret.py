"""What deciding by neighbours alone costs at a new size (the decisive levers).

    python tools/decisive_regret.py DB [--decisive DECISIVE_DB] [--json] [-o REPORT.json]

DB is the database of a job that compiled at a new size with transfer and
every decisive lever off (tools/bench_transfer.sh with DECISIVE=0: ``decisive-N.db``, a
copy of the recording the job started from plus what it measured). Transfer then times
the neighbours' choices at every new key, so DB
shows, for each entry the job measured, what its neighbours would have decided and what
that choice cost there:

- a GEMM key (transferred: a few candidates timed): whether its nearest recorded
  neighbours, all tuned in full, picked one choice, the smallest of their margins (the
  runner-up's time over the winner's, minus 1), and the regret of that choice here (its
  time over the fastest timed here);
- an epilogue-fusion site (measured here as Inductor measures it): whether the nearest
  recorded sites decided alike, their smallest margin, and the regret of their decision
  here;
- a Triton kernel (transferred: its neighbours' configs timed against the start
  config, meta ``transfer.timed``): whether its nearest neighbours, all full descents,
  found one config, and that config's time over the fastest timed here.

The neighbours are the entries of the same family (and, for a fusion site or a Triton
kernel, within the same size bounds) created before the entry, ranked by the library's own
rules (tunecache.inductor.transfer, .triton.decisions, .triton.kernel_keys). The margins are
gathered into a table: for each threshold, how many keys it decides and their worst
regret. That is the measurement behind DECISIVE_MARGIN and FUSION_DECISIVE_MARGIN.

With ``--decisive``, the database of a job run beside it with decisive parts on (the
defaults, or every decisive lever on; on its own copy of the same recording): every
entry that job decided without measuring (``meta.transfer.benchmarked == 0``) is looked up
in DB, and the regret of its decision is read from what DB's job measured at the same key.

A regret is None where the choice was not timed here (a GEMM template outside the
transfer plan, a fused candidate that was not benchmarked).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from tunecache.inductor.transfer import (
    AGREE,
    gemm_sizes,
    nearest_neighbours,
    neighbours_agreement,
    transfer_id,
)
from tunecache.inductor.triton.decisions import (
    DECISION_KIND,
    Decision,
    nearest_sites,
    sites_agreement,
)
from tunecache.inductor.triton.kernel_keys import (
    SIZES_FIELD,
    config_text,
    coordesc_result,
    nearest_results,
    results_agreement,
)
from tunecache.inductor.triton.remote import DECIDING_NEIGHBOURS

TRITON_KIND = "triton_config"
THRESHOLDS = (0.0, 0.05, 0.10, 0.25, 0.50, 1.0)
# A decision whose regret is above this is a miss: a decision by neighbours may cost 1%.
REGRET_LIMIT = 1.01


@dataclasses.dataclass(frozen=True)
class Entry:
    """One exported entry, as the library's neighbour rules read one."""

    key_hash: str
    key: Mapping[str, Any]
    family: str | None
    timings: dict[str, float]
    meta: Mapping[str, Any]
    created_at: float

    @property
    def kind(self) -> str:
        return str(self.key.get("kind"))

    @property
    def transfer(self) -> Mapping[str, Any] | None:
        value = self.meta.get("transfer")
        return value if isinstance(value, Mapping) else None


def exported(db: str) -> list[Entry]:
    """The done entries of ``db``, read with ``tunecache export``."""
    done = subprocess.run(
        [sys.executable, "-m", "tunecache.cli", "export", "--no-graphs", "--db", db],
        capture_output=True, text=True)
    if done.returncode != 0:
        why = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        raise SystemExit(f"decisive_regret: cannot export {db}: {why}")
    return entries_of(done.stdout.splitlines())


def entries_of(lines: Iterable[str]) -> list[Entry]:
    out = []
    for line in lines:
        record = json.loads(line)
        if "key_hash" not in record:
            continue  # the header
        timings = {c: math.inf if ms is None else float(ms)
                   for c, ms in record["timings"].items()}
        out.append(Entry(record["key_hash"], record["key"], record.get("family"), timings,
                         record.get("meta") or {}, float(record.get("created_at") or 0.0)))
    return out


def _earlier_of_family(entry: Entry, entries: Sequence[Entry]) -> list[Entry]:
    """The entries of ``entry``'s kind and family stored before it: its neighbours
    when it was tuned."""
    if entry.family is None:
        return []
    return [e for e in entries if e.family == entry.family and e.kind == entry.kind
            and e.key_hash != entry.key_hash and e.created_at < entry.created_at]


def _fastest(timings: Mapping[str, float]) -> float | None:
    finite = [ms for ms in timings.values() if math.isfinite(ms)]
    return min(finite) if finite else None


def _ratio(ms: float | None, best: float | None) -> float | None:
    if ms is None or best is None or not math.isfinite(ms) or best <= 0:
        return None
    return ms / best


# ------------------------------------------------------------------- regret of one choice

def gemm_choice_regret(choice: str, timings: Mapping[str, float]) -> float | None:
    """The time of ``choice`` (a candidate id at this size, or an identity across sizes:
    transfer_id or an ATen candidate id) over the fastest in ``timings``."""
    matching = [ms for c, ms in timings.items()
                if c == choice or transfer_id(c) == choice]
    return _ratio(min(matching), _fastest(timings)) if matching else None


def fusion_regret(rank: int | None, measured: Decision) -> float | None:
    """The cost of fusing as ``rank`` says (None: not fusing) at a site that measured
    ``measured``: 1.0 where they agree; where they do not, the chosen option's time over
    the measured winner's, where the chosen one was timed (fusing rank 0 is the only
    fused candidate Inductor times by default)."""
    if rank == measured.rank:
        return 1.0
    if rank is None:
        return _ratio(measured.unfused_ms, measured.fused_ms)
    if measured.rank is None and rank == 0 and measured.runner_up_ms is None:
        return _ratio(measured.fused_ms, measured.unfused_ms)
    return None


def triton_config_regret(config: Mapping[str, Any], measured: Entry) -> float | None:
    """The time of ``config`` (a best-config dict) at a kernel whose transfer timed it
    (meta ``transfer.timed``) over the fastest it timed; 1.0 where the kernel's own
    result is that config."""
    own = coordesc_result(measured.timings)
    if own is not None and config_text(own) == config_text(config):
        return 1.0
    timed = _timed_configs(measured)
    chosen = [ms for fields, ms in timed if all(config.get(k) == v for k, v in fields.items())]
    return _ratio(min(chosen), min(ms for _, ms in timed)) if chosen else None


def _timed_configs(entry: Entry) -> list[tuple[Mapping[str, Any], float]]:
    """(config fields, ms) of each config the kernel's transfer timed; a time that is no
    positive finite number is left out, so it cannot hide the others."""
    timed = (entry.transfer or {}).get("timed")
    out = []
    for t in timed if isinstance(timed, list) else []:
        fields = t.get("config") if isinstance(t, Mapping) else None
        ms = t.get("ms") if isinstance(t, Mapping) else None
        if isinstance(fields, Mapping) and isinstance(ms, (int, float)) \
                and math.isfinite(ms) and ms > 0:
            out.append((fields, float(ms)))
    return out


# ------------------------------------------------- what the neighbours would have decided

def _row(entry: Entry, nearest: int, verdict: str, margin: float | None = None,
         regret: float | None = None, **extra: Any) -> dict[str, Any]:
    # margin None: unknown, or infinite (only one option was timed)
    return {"kind": entry.kind, "key_hash": entry.key_hash, "op": entry.key.get("op"),
            "neighbours": nearest, "verdict": verdict,
            "margin": None if margin is None or math.isinf(margin) else round(margin, 4),
            "regret": None if regret is None else round(regret, 4), **extra}


def would_decide_gemm(entry: Entry, entries: Sequence[Entry]) -> dict[str, Any] | None:
    sizes = gemm_sizes(entry.key)
    nearest = [] if sizes is None else nearest_neighbours(
        sizes, _earlier_of_family(entry, entries))
    if not nearest:
        return None
    agreement = neighbours_agreement(nearest)
    if agreement.verdict != AGREE:
        return _row(entry, len(nearest), agreement.verdict, agreement.margin)
    return _row(entry, len(nearest), AGREE, agreement.margin,
                gemm_choice_regret(agreement.choice, entry.timings), choice=agreement.choice)


def would_decide_fusion(entry: Entry, entries: Sequence[Entry]) -> dict[str, Any] | None:
    measured = Decision.from_entry(entry.timings, entry.meta)
    sizes = entry.meta.get("sizes")
    if measured is None or not isinstance(sizes, list):
        return None
    found = []
    for e in _earlier_of_family(entry, entries):
        decision = Decision.from_entry(e.timings, e.meta)
        if decision is not None:
            found.append((e.key_hash, decision, e.meta))
    nearest = nearest_sites(sizes, found)
    if not nearest:
        return None
    agreement = sites_agreement(nearest)
    if agreement.verdict != AGREE:
        return _row(entry, len(nearest), agreement.verdict, agreement.margin)
    rank = agreement.choice.rank
    return _row(entry, len(nearest), AGREE, agreement.margin, fusion_regret(rank, measured),
                choice="not fused" if rank is None else f"fused, rank {rank}",
                measured="not fused" if measured.rank is None
                else f"fused, rank {measured.rank}")


def would_decide_triton(entry: Entry, entries: Sequence[Entry]) -> dict[str, Any] | None:
    sizes = entry.meta.get(SIZES_FIELD)
    if not isinstance(sizes, Mapping):
        return None
    nearest = nearest_results(sizes, _earlier_of_family(entry, entries))[:DECIDING_NEIGHBOURS]
    if not nearest:
        return None
    agreement = results_agreement(nearest)
    if agreement.verdict != AGREE:
        return _row(entry, len(nearest), agreement.verdict, agreement.margin)
    return _row(entry, len(nearest), AGREE, None, triton_config_regret(agreement.choice, entry))


def would_decide(entries: Sequence[Entry]) -> list[dict[str, Any]]:
    """A row for each entry measured at a new size that has recorded neighbours."""
    rows = []
    for entry in entries:
        transfer = entry.transfer
        row = None
        if entry.kind == "gemm" and transfer and transfer.get("benchmarked"):
            row = would_decide_gemm(entry, entries)
        elif entry.kind == DECISION_KIND and transfer is None:
            row = would_decide_fusion(entry, entries)
        elif entry.kind == TRITON_KIND and transfer and transfer.get("benchmarked"):
            row = would_decide_triton(entry, entries)
        if row is not None:
            rows.append(row)
    return rows


def thresholds(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """For each kind with margins and each threshold: the keys whose neighbours agree by
    at least that margin, and their regret here."""
    out = []
    for kind in ("gemm", DECISION_KIND):
        agreeing = [r for r in rows if r["kind"] == kind and r["verdict"] == AGREE]
        for threshold in THRESHOLDS:
            decided = [r for r in agreeing
                       if r["margin"] is None or r["margin"] >= threshold]
            known = [r["regret"] for r in decided if r["regret"] is not None]
            out.append({"kind": kind, "margin_at_least": threshold, "decided": len(decided),
                        "regret_known": len(known),
                        "worst_regret": max(known) if known else None,
                        "over_limit": sum(1 for g in known if g > REGRET_LIMIT)})
    return out


# ----------------------------------------------------- what a decisive job actually decided

def decided_regret(decisive: Sequence[Entry], measured: Sequence[Entry]
                   ) -> list[dict[str, Any]]:
    """A row for each entry the decisive job decided without measuring, with the regret
    of its decision where the other job measured the same key."""
    by_hash = {e.key_hash: e for e in measured}
    rows = []
    for entry in decisive:
        transfer = entry.transfer
        if transfer is None or transfer.get("benchmarked") != 0:
            continue
        other = by_hash.get(entry.key_hash)
        regret = None
        if other is not None and entry.kind == "gemm":
            finite = [c for c, ms in entry.timings.items() if math.isfinite(ms)]
            regret = gemm_choice_regret(finite[0], other.timings) if len(finite) == 1 else None
        elif other is not None and entry.kind == DECISION_KIND:
            ours = Decision.from_entry(entry.timings, entry.meta)
            theirs = Decision.from_entry(other.timings, other.meta)
            if ours is not None and theirs is not None:
                regret = fusion_regret(ours.rank, theirs)
        elif other is not None and entry.kind == TRITON_KIND:
            config = coordesc_result(entry.timings)
            regret = None if config is None else triton_config_regret(config, other)
        rows.append(_row(entry, len(transfer.get("from") or []),
                         "measured beside it" if other is not None else "not measured beside it",
                         None, regret))
    return rows


def summary(rows: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for kind in sorted({r["kind"] for r in rows}):
        mine = [r for r in rows if r["kind"] == kind]
        known = [r["regret"] for r in mine if r["regret"] is not None]
        out[kind] = {"rows": len(mine),
                     "agree": sum(1 for r in mine if r["verdict"] == AGREE),
                     "regret_known": len(known),
                     "worst_regret": max(known) if known else None,
                     "over_limit": sum(1 for g in known if g > REGRET_LIMIT)}
    return out


def report(db: str, decisive_db: str | None) -> dict[str, Any]:
    entries = exported(db)
    rows = would_decide(entries)
    out: dict[str, Any] = {"db": db, "would_decide": rows, "summary": summary(rows),
                           "thresholds": thresholds(rows)}
    if decisive_db is not None:
        decided = decided_regret(exported(decisive_db), entries)
        out.update(decisive_db=decisive_db, decided=decided, decided_summary=summary(decided))
    return out


def _print(out: Mapping[str, Any]) -> None:
    def fmt(v: Any) -> str:
        return "-" if v is None else f"{v:.3f}" if isinstance(v, float) else str(v)

    print(f"neighbours' verdicts at the new size ({out['db']}):")
    for r in out["would_decide"]:
        print(f"  {r['kind']:16} {r['key_hash'][:12]} {str(r['op'])[:24]:24} "
              f"n={r['neighbours']} {r['verdict']:40} margin={fmt(r['margin'])} "
              f"regret={fmt(r['regret'])}")
    for kind, s in out["summary"].items():
        print(f"  {kind}: {s}")
    print("by margin threshold:")
    for t in out["thresholds"]:
        print(f"  {t['kind']:16} margin >= {t['margin_at_least']:.2f}: decided "
              f"{t['decided']}, regret known {t['regret_known']}, worst "
              f"{fmt(t['worst_regret'])}, over {REGRET_LIMIT}: {t['over_limit']}")
    if "decided" in out:
        print(f"decided without measuring ({out['decisive_db']}):")
        for r in out["decided"]:
            print(f"  {r['kind']:16} {r['key_hash'][:12]} {str(r['op'])[:24]:24} "
                  f"{r['verdict']:24} regret={fmt(r['regret'])}")
        for kind, s in out["decided_summary"].items():
            print(f"  {kind}: {s}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("db", help="the database of a job with every decisive lever off "
                                   "(path or URL)")
    parser.add_argument("--decisive", default=None,
                        help="the database of a job with decisive parts on beside it")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("-o", "--output", default=None,
                        help="also write the report as JSON to this file")
    args = parser.parse_args(argv)
    out = report(args.db, args.decisive)
    if args.output:
        with open(args.output, "w") as f:
            json.dump(out, f, indent=1)
    if args.json:
        json.dump(out, sys.stdout, indent=1)
        print()
    else:
        _print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

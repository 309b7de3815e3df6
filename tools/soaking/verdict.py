"""What happened: the events, stored entries and plants read back, the figures and the
invariants that decide the verdict."""

from __future__ import annotations

import glob
import hashlib
import itertools
import json
import os
import sqlite3
from collections.abc import Iterator
from typing import Any

import tunecache

from .common import read_plants, workload_key
from .driver import Driver
from .postgres import libpq_url


def read_events(logdir: str) -> Iterator[dict[str, Any]]:
    for path in sorted(glob.glob(os.path.join(logdir, "events-*.jsonl"))):
        with open(path) as f:
            for line in f:
                try:
                    yield json.loads(line)
                except ValueError:
                    continue  # cannot happen with one write per line; never fatal


def _overlaps(windows: list[tuple[float, float]], start: float, end: float,
              at_least: float) -> bool:
    return any(a < end and b > start and b - a >= at_least for a, b in windows)


def analyse(driver: Driver, outages: list[tuple[float, float]]) -> dict[str, Any]:
    lease, chaos = driver.opts.lease, driver.chaos
    tunes: dict[tuple[int, int], list[dict[str, Any]]] = {}  # (pid, call) -> tune events
    calls: list[dict[str, Any]] = []
    others: list[dict[str, Any]] = []  # graph loads and publishes, key files
    jobs: dict[tuple[int, int], dict[str, Any]] = {}  # (pid, job) -> its end, if it ended
    plans: list[bool] = []  # per tune of a key of a family: whether transfer planned
    plants = read_plants(driver.logdir)
    # Keys the adversary wrote rows for are judged by the hostile cases, not by the
    # duplicate and divergence checks (their stored rows are the adversary's).
    hostile = {i for p in plants for i in p.get("keys", [])}
    for ev in read_events(driver.logdir):
        if ev["ev"] == "tune":
            if ev["i"] not in hostile:
                tunes.setdefault((ev["pid"], ev["call"]), []).append(ev)
        elif ev["ev"] == "call":
            calls.append(ev)
            jobs.setdefault((ev["pid"], ev["job"]), {})
        elif ev["ev"] == "job":
            jobs[(ev["pid"], ev["job"])] = ev
        elif ev["ev"] == "plan":
            plans.append(ev["planned"])
        else:
            others.append(ev)
    # A tune is local if the cache was already disabled when it started, or if it is the
    # last tune of a key in a call whose result for that key was local (a wait timeout).
    for call in calls:
        for i, (source, _) in call["results"].items():
            if source == "local":
                mine = [t for t in tunes.get((call["pid"], call["call"]), []) if t["i"] == int(i)]
                if mine:
                    mine[-1]["local"] = True
    claimed: dict[int, list[tuple[float, int, int]]] = {}
    local_tunes = 0
    for events in tunes.values():
        for t in events:
            if t["local"]:
                local_tunes += 1
            else:
                claimed.setdefault(t["i"], []).append((t["t"], t["pid"], t["call"]))

    freezes_by_pid: dict[int, list[tuple[float, float]]] = {}
    for pid, a, b in chaos.freezes:
        freezes_by_pid.setdefault(pid, []).append((a, b))
    down = outages + chaos.restarts

    def excused(pid: int, start: float, end: float) -> bool:
        return (chaos.died.get(pid, float("inf")) <= end
                or _overlaps(freezes_by_pid.get(pid, []), start, end, lease / 2)
                or _overlaps(down, start, end, lease / 2))

    # A tuner that raised gave its claim back (the call raised, counted as failed): the
    # next tune of its key is no duplicate.
    raised_calls = {(c["pid"], c["call"]) for c in calls if c["raised"]}
    duplicates = []
    for i, starts in claimed.items():
        starts.sort()
        for (t1, p1, c1), (t2, p2, _) in itertools.pairwise(starts):
            if (p1, c1) not in raised_calls and not excused(p1, t1, t2):
                duplicates.append(f"key {i}: pid {p1} at {t1 - driver.t0:.1f}s, "
                                  f"pid {p2} at {t2 - driver.t0:.1f}s")

    numbers = ({int(i) for c in calls for i in c["results"]} | set(claimed)) - hostile
    asked = {workload_key(driver.spec["run"], i).hash: i
             for i in {int(i) for c in calls for i in c["keys"]} | set(claimed)}
    stored, takeovers = read_stored(driver.url, driver.spec["run"], numbers)
    divergent: dict[int, str] = {}
    sources: dict[str, int] = {}
    longest = 0.0
    for call in calls:
        own_freeze = sum(min(b, call["end"]) - max(a, call["start"])
                         for a, b in freezes_by_pid.get(call["pid"], [])
                         if a < call["end"] and b > call["start"])
        longest = max(longest, call["end"] - call["start"] - own_freeze)
        for i, (source, timings) in call["results"].items():
            sources[source] = sources.get(source, 0) + 1
            if int(i) in hostile:
                continue
            if source in ("hit", "tuned", "peer") and timings != stored.get(int(i)):
                divergent.setdefault(int(i), f"key {i}: pid {call['pid']} got {source} "
                                     f"{timings}, stored {stored.get(int(i))}")
    raised = [f"pid {c['pid']}: {c['raised']}" for c in calls if c["raised"]]
    return {
        "keys": len(numbers),
        "calls": len(calls),
        "tunes_claimed": sum(map(len, claimed.values())),
        "tunes_local": local_tunes,
        "kills": chaos.kills,
        "storms": chaos.storms,
        "freezes": len(chaos.freezes),
        "long_freezes": chaos.long_freezes,
        "pg_restarts": len(chaos.restarts),
        "backends_terminated": chaos.terminated,
        "outages": len(outages),
        "takeovers": takeovers,
        "duplicates_by_live_owners": len(duplicates),
        "divergent": len(divergent),
        "raised": len(raised),
        "failed": sources.get("failed", 0),
        "local_results": sources.get("local", 0),
        "crashes": len(chaos.crashes),
        "hung": chaos.hung,
        "longest_wait_s": round(longest, 2),
        "sources": sources,
        "examples": (duplicates[:3] + list(divergent.values())[:3] + raised[:3]
                     + chaos.crashes[:3]),
        # Calls that raised are counted by hostile_report, by case.
        "jobs": len(jobs),
        "tunes_planned": f"{sum(plans)}/{len(plans)}",
        "peak_rss_mib": round(max((j.get("rss_kib", 0) for j in jobs.values()), default=0)
                              / 1024, 1),
        **hostile_report(driver, calls, others, plants, freezes_by_pid,
                         duplicates + list(divergent.values()) + chaos.crashes,
                         read_failed(driver.url), asked),
    }


def check_canaries(plants: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """(case, what happened) for every canary file outside the cache that is gone, no
    longer a plain file, or changed in content or mode, and every file that appeared in
    a canary folder: the files outside the cache that the soak touched."""
    touched: list[tuple[str, str]] = []
    for plant in plants:
        known = set()
        for c in plant.get("canary", []):
            known.add(c["path"])
            try:
                st = os.lstat(c["path"])
                if not os.path.isfile(c["path"]) or os.path.islink(c["path"]):
                    why = "is no longer a plain file"
                else:
                    with open(c["path"], "rb") as f:
                        same = hashlib.sha256(f.read()).hexdigest() == c["sha256"]
                    why = ("content changed" if not same
                           else f"mode {st.st_mode & 0o7777:o}, was {c['mode']:o}"
                           if st.st_mode & 0o7777 != c["mode"] else "")
            except FileNotFoundError:
                why = "deleted"
            if why:
                touched.append((plant["case"], f"{c['path']}: {why}"))
        for folder in plant.get("canary_dirs", []):
            try:
                names = os.listdir(folder)
            except OSError:
                touched.append((plant["case"], f"{folder}: folder gone"))
                continue
            for name in names:
                if os.path.join(folder, name) not in known:
                    touched.append((plant["case"], f"{folder}/{name}: created there"))
    return touched


def hostile_report(driver: Driver, calls: list[dict[str, Any]], others: list[dict[str, Any]],
                   plants: list[dict[str, Any]],
                   freezes_by_pid: dict[int, list[tuple[float, float]]],
                   normal_failures: list[str], failed_keys: list[tuple[str, str]],
                   numbers_by_hash: dict[str, int]) -> dict[str, Any]:
    """Per hostile case: plants, failures, hangs and keys marked failed, attributed by
    the keys and graphs the adversary aimed at; and the invariants. A call that asked
    for keys of several cases counts under each of them (the invariants count it
    once). ``failed_keys``: (hash, error) of every entry in state failed."""
    bound = driver.opts.hang_bound
    cases: dict[str, dict[str, Any]] = {}
    totals = {"failed": 0, "hung": 0, "cli": 0, "failed_key": 0}
    failed_jobs: set[tuple[int, int]] = set()

    def case(name: str) -> dict[str, Any]:
        return cases.setdefault(name, {"planted": 0, "skipped": 0, "failed": 0, "hung": 0,
                                       "keys_failed": 0, "examples": []})

    # The column of a case each total counts in.
    column = {"failed": "failed", "cli": "failed", "hung": "hung", "failed_key": "keys_failed"}

    def count(names: list[str] | str, what: str, example: str, ev: Any = None) -> None:
        """One ``what`` (a key of totals) of cases ``names``. Failures of a job's events
        count the job once (jobs failed); other failures (duplicates, divergent results,
        crashes) count each."""
        if what == "failed" and ev is not None and "job" in ev:
            job = (ev["pid"], ev["job"])
            totals[what] += job not in failed_jobs
            failed_jobs.add(job)
        else:
            totals[what] += 1
        names = [names] if isinstance(names, str) else names
        for name in names:
            c = case(name)
            c[column[what]] += 1
            if len(c["examples"]) < 3:
                also = f" [also counted under {', '.join(n for n in names if n != name)}]" \
                    if len(names) > 1 else ""
                c["examples"].append(example[:300] + also)

    key_case: dict[int, str] = {}
    graph_case: dict[int, str] = {}
    for p in plants:
        c = case(p["case"])
        c["skipped" if "skipped" in p else "planted"] += 1
        key_case.update({i: p["case"] for i in [*p.get("keys", []), *p.get("aimed", [])]})
        graph_case.update({i: p["case"] for i in p.get("graphs", [])})

    def attribute(keys: Any = (), graph: Any = None, role: Any = None) -> list[str]:
        names = list(dict.fromkeys(key_case[i] for i in keys or () if i in key_case))
        if graph in graph_case:
            names.append(graph_case[graph])
        if role == "hostile_key":
            names.append("verify_key_world_writable")
        return names or ["normal"]

    def frozen(pid: int, start: float, end: float) -> float:
        return sum(max(0.0, min(b, end) - max(a, start)) for a, b in freezes_by_pid.get(pid, []))

    for example in normal_failures:
        count("normal", "failed", example)
    for call in calls:
        names = attribute(call.get("keys"))
        if call["raised"]:
            count(names, "failed", f"pid {call['pid']} raised {call['raised']}", call)
        waited = call["end"] - call["start"] - call.get("tuning", 0.0) \
            - frozen(call["pid"], call["start"], call["end"])
        if waited > bound:
            count(names, "hung", f"pid {call['pid']} waited {waited:.1f}s on keys "
                  f"{call.get('keys')}")
    for ev in others:
        names = attribute(graph=ev.get("graph"), role=ev.get("role"))
        if ev.get("raised"):
            count(names, "failed", f"pid {ev['pid']} {ev['ev']} raised {ev['raised']}", ev)
        if ev.get("wrong"):
            count(names, "failed", f"pid {ev['pid']} loaded graph {ev['graph']} with other "
                  "bytes than were published", ev)
        if ev["ev"] == "keyfile" and ev["role"] == "hostile_key" and ev["accepted"]:
            count(names, "failed", f"pid {ev['pid']} loaded the world-writable verify key", ev)
        waited = ev["end"] - ev["start"] - frozen(ev["pid"], ev["start"], ev["end"])
        if waited > bound:
            count(names, "hung", f"pid {ev['pid']} {ev['ev']} took {waited:.1f}s")
    for h in driver.chaos.hangs:
        count(attribute(h.get("keys"), h.get("graph"), h.get("role")), "hung",
              f"pid {h['pid']} killed after waiting {h['waited']}s in {h['op']} "
              f"({', '.join(f'{k} {h[k]}' for k in ('keys', 'graph', 'role') if k in h)})")
    for _ in range(driver.chaos.hung):
        count("normal", "hung", "a worker still running past the final bound")
    for run in driver.operator.runs if driver.operator else []:
        c = case(run["case"])
        c["planted"] += 1
        if run["outcome"] == "error":  # allowed (exit 1 or 2, one line), but worth seeing
            c["errors"] = c.get("errors", 0) + 1
            if len(c["examples"]) < 3:
                c["examples"].append(f"(error) tunecache {' '.join(run['args'])}: {run['why']}")
        if run["outcome"] in ("failed", "hang"):
            count(run["case"], "cli" if run["outcome"] == "failed" else "hung",
                  f"tunecache {' '.join(run['args'])}: {run['why']}")
    # Keys marked failed: each must be one the adversary wrote a row for; any other was
    # charged for someone else's row (a neighbour), or failed on its own.
    tampered = {h for p in plants for h in p.get("rows", [])}
    untampered = []
    for row_hash, error in failed_keys:
        if row_hash in tampered:
            continue
        i = numbers_by_hash.get(row_hash)
        untampered.append(row_hash)
        count(attribute([i] if i is not None else ()), "failed_key",
              f"key {row_hash[:16]} (number {i}) marked failed: {error}")
    touched = check_canaries(plants)
    for planted_by, what in touched:
        c = case(planted_by)
        c["touched"] = c.get("touched", 0) + 1
        if len(c["examples"]) < 3:
            c["examples"].append(what)
    return {
        "cases": cases,
        "jobs_failed": totals["failed"],
        "keys_failed_untampered": totals["failed_key"],
        "keys_failed": len(failed_keys),
        "cli_failed": totals["cli"],
        "files_touched": len(touched),
        "hangs": totals["hung"],
        "hang_bound_s": bound,
    }


def read_stored(url: str, run: str, numbers: set[int]) -> tuple[dict[int, Any], int]:
    """Stored timings of done keys by number, and the takeovers (every claim after a
    key's first bumps its fencing token), read through tunecache's own store."""
    hashes = {workload_key(run, i).hash: i for i in numbers}
    cache = tunecache.open(url)
    try:
        rows = cache.store.read(list(hashes))
    finally:
        cache.close()
    stored = {hashes[h]: json.loads(row.timings_json)
              for h, row in rows.items() if row.state == "done" and row.timings_json}
    return stored, sum((row.token or 1) - 1 for row in rows.values())


def read_failed(url: str) -> list[tuple[str, str]]:
    """(key hash, error) of every entry marked failed, read with the driver's own SQL (a
    hostile row may be anything)."""
    sql = "SELECT key_hash, substr(error, 1, 200) FROM tunecache_entries WHERE state = 'failed'"
    if url.startswith("sqlite"):
        conn = sqlite3.connect(url.split("///", 1)[1], timeout=60)
        conn.text_factory = lambda b: b.decode(errors="replace")
        try:
            rows = conn.execute(sql).fetchall()
        finally:
            conn.close()
    else:
        import psycopg

        with psycopg.connect(libpq_url(url), connect_timeout=10) as pg:
            rows = pg.execute(sql).fetchall()
    return [(str(h), ascii(e)) for h, e in rows]


FIGURES = [
    ("keys", "keys"), ("calls", "calls"), ("tunes_claimed", "tunes under a claim"),
    ("tunes_local", "tunes local (fallback)"), ("kills", "kills"), ("storms", "kill storms"),
    ("freezes", "freezes"), ("long_freezes", "crowd freezes longer than the lease"),
    ("pg_restarts", "PostgreSQL restarts"), ("backends_terminated", "backends terminated"),
    ("outages", "database outages seen by the probe"), ("takeovers", "takeovers"),
    ("duplicates_by_live_owners", "duplicate tunes by live owners"),
    ("divergent", "divergent results"), ("raised", "callers that raised"),
    ("failed", "failed results"), ("local_results", "local results"),
    ("crashes", "worker crashes"), ("hung", "hung workers"),
    ("longest_wait_s", "longest wait (s)"), ("jobs", "jobs"),
    ("tunes_planned", "tunes of a family with a transfer plan"),
    ("peak_rss_mib", "peak worker RSS (MiB)"), ("keys_failed", "keys marked failed"),
]


def print_report(row: dict[str, Any]) -> None:
    print(f"soak {row['backend']}: {row['seconds']:g} s, {row['workers']} workers, "
          f"lease {row['lease_s']:g}s, hang bound {row['hang_bound_s']:g}s")
    for name, label in FIGURES:
        print(f"  {label:<38} {row[name]}")
    for example in row["examples"]:
        print(f"  ! {example}")
    print(f"  {'case':<28} {'planted':>7} {'skipped':>7} {'failed':>6} {'hung':>5} "
          f"{'touched':>7} {'keys failed':>11}")
    for name, c in sorted(row["cases"].items()):
        print(f"  {name:<28} {c['planted']:>7} {c['skipped']:>7} {c['failed']:>6} "
              f"{c['hung']:>5} {c.get('touched', 0):>7} {c['keys_failed']:>11}")
        for example in c["examples"]:
            print(f"    ! {example!a}"[:400])
    for name, label in INVARIANTS:
        verdict = "ok" if row[name] == 0 else "FAILED"
        print(f"  {label:<38} {row[name]}  {verdict}")


# The invariants of the hostile soak (all must be 0).
INVARIANTS = [("jobs_failed", "jobs failed"),
              ("keys_failed_untampered", "keys failed that no one tampered with"),
              ("cli_failed", "CLI commands failed (traceback, output)"),
              ("files_touched", "files outside the cache touched"),
              ("hangs", "hangs")]


def summary(row: dict[str, Any]) -> dict[str, Any]:
    """The JSON summary line: invariants and per-case counts, without examples."""
    return {"soak_summary": row["backend"], "seconds": row["seconds"], "seed": row["seed"],
            "ok": not failed(row), **{name: row[name] for name, _ in INVARIANTS},
            "cases": {name: {k: v for k, v in c.items() if k != "examples"}
                      for name, c in row["cases"].items()}}


def failed(row: dict[str, Any]) -> bool:
    return any(row[k] for k in ("duplicates_by_live_owners", "divergent", "raised",
                                "crashes", "hung", *(name for name, _ in INVARIANTS)))

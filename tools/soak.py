"""Soak test: workers claim and publish through the public API while a chaos driver SIGKILLs
them, SIGSTOPs crowds of them, restarts PostgreSQL and terminates its backends.

    python tools/soak.py --minutes 10 --backend both --workers 8

Each worker process runs "jobs" (``tunecache.open`` ... ``close``) of ``get_or_tune`` and
``get_or_tune_many`` calls on a moving window of keys that all workers share. Its tuner
sleeps (now and then longer than the lease, so only the heartbeat keeps the claim) and
returns timings drawn from a generator seeded by (pid, key): two processes that both tune
one key return different timings, so any divergence shows. Outside tunecache, each worker
appends to its own JSONL file every tune it starts and every call's results; the driver
records every kill, freeze, restart and termination, and a probe thread records every
window in which the database could not be written (a server restart, or on SQLite a
frozen process holding the write lock). At the end the driver reads the stored entries
and prints:

- keys: distinct keys asked for; calls; tunes under a claim, and local ones (fallbacks);
- kills (some in storms), freezes (shorter and longer than the lease), PostgreSQL
  restarts and backend terminations;
- takeovers: claims taken from an owner whose lease had passed (sum of token - 1);
- duplicate tunes by live owners: a key whose previous tuner was neither killed, nor
  frozen for lease/2 or more, nor cut off by a database outage of lease/2 or more,
  between its tune and the next one (an owner renews every lease/3, so nothing shorter
  can cost it its lease);
- divergent results: a hit, tuned or peer result whose timings differ from the stored
  entry's (so two callers disagree, or a caller disagrees with the store);
- callers that raised (a KeyFailedError is counted as failed instead), worker crashes,
  and workers still running well after the end (hung);
- the longest wait: the longest single call, less the time its own caller was frozen.

Exits 1 if duplicates by live owners, divergent results, raised callers, crashes or hung
workers are not all zero, or if an invariant of the hostile soak fails.

    python tools/soak.py --seconds 600 --backend both          # --no-hostile: chaos only

Hostile soak (on unless ``--no-hostile``). Beside the workers, an adversary process writes
the shared storage as anyone who can, without the private key, planting one case every
HOSTILE_EVERY (1) second by turns, aimed at the keys and graphs the workers will ask for
next; an operator thread runs the CLI; and jobs also share compiled graphs through
``tunecache.core.graphs`` (a key pair made with ``write_key_pair``; most jobs sign and
publish, some only verify, one in ten is handed the world-writable key file below). The
cases, by name (``*`` SQLite only: PostgreSQL keeps payloads in the row):

- ``lease_far_future``: claims whose lease ends in 1e300 s or at 9999-12-31;
- ``lease_nan``: a NaN lease (SQLite stores a NaN bound from Python as NULL);
- ``lease_negative``: leases of -1 and -1e300 (already expired: taken over);
- ``lease_wrong_type``: SQLite: text and bytes leases, a text token; PostgreSQL's float8
  column has no wrong type, so its nearest, +inf and -inf;
- ``garbled_timings``: done rows whose timings are broken JSON, JSON of the wrong shape,
  NaN, or start with an escape sequence;
- ``hostile_names``: a done entry and a graph row whose names (kind, op, device, torch and
  triton versions, key, winner) hold terminal escape sequences, CR, newlines, a
  right-to-left override and, where the database takes them (SQLite), NUL and a lone
  surrogate as invalid UTF-8; half of them dated 2001, for ``prune --older-than``;
- ``graph_size_2gib``, ``graph_size_negative``, ``graph_size_int64_max``: graph rows
  declaring payloads of 2 GiB, -10**18 and 2**63-1 bytes (with a 512-byte payload);
- ``blob_fifo``*: the blob of a graph jobs are loading replaced by a FIFO with no writer;
- ``blob_shard_symlink``* and ``keys_shard_symlink``*: a blob shard directory
  (``<db>.blobs/ab``) or a publishers' lock shard (``<db>.blobs/keys/ab``) of a graph
  about to be published replaced by a symlink to a canary folder outside the cache, with
  files dated 2001 named like orphan blobs, stale locks and leftovers of writers;
- ``lock_symlink``*: the blob lock and the publishers' lock of a graph about to be
  published replaced by symlinks to canary files (mode 640) outside the cache;
- ``verify_key_world_writable``: a copy of the verify key, mode 666, that some jobs are
  handed (as TUNECACHE_VERIFY_KEY): they must refuse it;
- ``huge_int_timings``: a done row whose timings hold a 310-digit integer, as a neighbour
  of the next key of a family and as the own row of another key jobs will ask for;
- ``huge_int_meta``: a neighbour whose meta holds 310-digit numbers (baseline.ms, best_ms);
- ``huge_transfer_benchmarked``: two neighbours whose meta's ``transfer.benchmarked`` has
  4300 digits (their sum is past Python's int-to-text limit);
- ``nan_meta``: neighbours whose meta holds the tokens NaN, Infinity and -Infinity;
- ``oversize_meta``, ``oversize_timings``: two neighbours each with 4 MiB of meta or
  timings (the limits are keys.MAX_META_BYTES, 64 KiB, and MAX_TIMINGS_BYTES, 1 MiB);
  planted on one turn of the cases in RARE_EVERY (3), to keep the database small;
- ``hits_crowding``: 70 neighbours (more than the 64 a key reads), 6 octaves from the key
  in size, with an enormous hits count (2**62; 2**31-1 in PostgreSQL's int4 column), so
  they are read before any genuine neighbour (slower tuning, never a wrong one);
- ``family_escape``: a done row whose family holds terminal escapes, CR and a newline.

The neighbour cases (``huge_*``, ``nan_meta``, ``oversize_*``, ``hits_crowding``) write
rows of the family of an even key jobs will ask for next: even keys are GEMM keys with a
family (a new family every FAMILY_SECONDS of keys), and their tuner does what transfer
does before tuning: ``TuneCache.neighbours``, then ``plan_transfer`` and ``baseline_meta``
of tunecache.inductor.transfer, stored as the entry's meta. The key such a row aims at is
not written by the adversary: if it fails, the row charged someone else's key.

The operator runs ``tunecache stats``, ``ls``, ``ls --graphs`` (also with ``--json``),
``prune --max-graph-bytes 256KiB --older-than 30d`` (and a ``--dry-run``), ``show`` of a
row the adversary planted (of each case by turns), ``export -o FILE`` (also
``--best-only``) and ``prune --invalid --dry-run``, one every OPERATOR_EVERY (4) seconds,
each a subprocess in its own session under CLI_TIMEOUT (120 s), with the operator's
environment (none of the workers' TUNECACHE_* settings); after the workers stop, a last
prune, ``ls --graphs``, ``stats``, ``stats --json``, ``show``, ``prune --invalid
--dry-run`` and both exports. A command passes if it exits 0 with output free of raw
control characters (``--json`` output and an export file: strict JSON, which has no NaN
or Infinity), or, while the chaos runs, exits 1 or 2 with a one-line error (counted as an
error, not a failure: the database may be down); a traceback, any other exit status, a
raw control character, or an error in the last round (a quiet database) is a failure,
and a timeout a hang.

A watchdog reads each worker's status record (one pwrite of what it is doing: a call and
its keys, a graph load or publish, a key file) twice a second; an operation that has
waited longer than HANG_LEASES (6) leases, its own tuning and the time it was frozen not
counted, is a hang, and the worker is killed with its process group (and replaced). The
same bound is applied to every operation that did return. So a hang in tunecache never
hangs the soak: every process it starts is in a session of its own under a bound, and
SIGINT/SIGTERM kill them all and remove the temp dir and the private PostgreSQL cluster.

The invariants, printed per backend with counts per case (planted, skipped, failed,
hung, touched, keys failed; the keys a plant aimed at attribute failures and hangs to it,
and the rest are ``normal``), then one JSON summary line (``{"soak_summary": backend,
...}``):

- **jobs failed**: jobs (one ``tunecache.open`` ... ``close`` of a worker) in which a call
  raised, a graph load or publish raised or returned other bytes than were published, or
  the world-writable verify key was accepted; and each duplicate by a live owner,
  divergent result and worker crash;
- **keys failed that no one tampered with**: entries in state ``failed`` at the end whose
  row the adversary never wrote (it logs the hash of every row it writes); each is named.
  Workers run with TUNECACHE_MAX_ATTEMPTS ``--max-attempts`` (10): chaos alone does not
  exhaust a key, a tuner that raises on every job does;
- **CLI commands failed**: operator commands that failed (a traceback, raw control
  characters, output or an export file that is not strict JSON, another exit status);
- **files outside the cache touched**: canary files deleted, no longer plain files, or
  changed in content or mode, and files created in a canary folder;
- **hangs**: operations past the hang bound, workers still running at the end, operator
  commands past CLI_TIMEOUT.

Keys the adversary wrote rows for are left out of the duplicate and divergence checks:
their stored rows are the adversary's.

PostgreSQL: by default a private throwaway cluster (initdb into a temp dir, as the
``postgres`` user when run as root, on a free port), restarted at will and removed at the
end; the shared server on 5432 is never touched. ``--pg-url`` uses an existing server
instead: backends are still terminated, but restarts need ``--pg-restart-cmd``.
"""

from __future__ import annotations

import sys
from pathlib import Path

# The repository, for tunecache (this directory, for the soak's parts, is on the path
# already: it is the script's).
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from soaking.main import main

if __name__ == "__main__":
    sys.exit(main(__doc__ or ""))

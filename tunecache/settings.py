"""Every TUNECACHE_* environment variable, read and validated in this one place.

A user sets about four: TUNECACHE_DB, TUNECACHE_MODE, a key (TUNECACHE_SIGNING_KEY or
TUNECACHE_VERIFY_KEY), and perhaps TUNECACHE_SHARE to narrow what is shared. The claim
protocol has four more (lease, wait, lock timeout, attempts); TUNECACHE_LEVERS is for
experiments. Variables of earlier versions (RENAMED) are still honoured, each with one
warning naming its replacement (docs/configuration.md).
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar, Literal

from .errors import ConfigError

__all__ = ["Settings", "Levers", "Mode", "GraphSharing", "resolve_db_url", "parse_list",
           "unknown_variables", "SHARE_ITEMS", "LEVER_ITEMS", "RENAMED",
           "default_db_path", "MAX_LEASE_SECONDS", "LEASE_CLOCK_SLACK_SECONDS",
           "IMPLAUSIBLE_LEASE_SECONDS"]

Mode = Literal["readwrite", "readonly", "off"]
MODES: tuple[str, ...] = ("readwrite", "readonly", "off")

# The drivers we test against. A bare "postgresql://" means psycopg 3: SQLAlchemy's own
# default for that scheme is psycopg2, which we neither depend on nor test.
_SCHEMES = {
    "sqlite": "sqlite",
    "sqlite+pysqlite": "sqlite",
    "postgresql": "postgresql+psycopg",
    "postgres": "postgresql+psycopg",
    "postgresql+psycopg": "postgresql+psycopg",
}


def default_db_path(environ: Mapping[str, str] | None = None) -> Path:
    """The embedded default database, under the user's cache directory (XDG)."""
    env = os.environ if environ is None else environ
    base = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "tunecache" / "tunecache.db"


# A scheme of a database URL, written without its two slashes ("postgresql:/host/db"):
# without this it read as a relative file path and quietly made a SQLite file there.
_SCHEME_WITHOUT_SLASHES = re.compile(r"^(sqlite|postgres(ql)?)(\+\w+)?:(?!//)", re.IGNORECASE)


def resolve_db_url(
    db: str | os.PathLike[str] | None, environ: Mapping[str, str] | None = None
) -> str:
    """Turn a TUNECACHE_DB value (a path or a URL; None for the default) into a URL."""
    if db is None:
        return f"sqlite:///{default_db_path(environ)}"
    text = os.fspath(db).strip()
    if not text:
        raise ConfigError("TUNECACHE_DB", db, "a file path or a sqlite:/// or postgresql:// URL")
    if _SCHEME_WITHOUT_SLASHES.match(text):
        raise ConfigError("TUNECACHE_DB", text, "a URL with two slashes after its scheme "
                          "(postgresql://host/db, sqlite:////abs/path.db) or a file path")
    if "://" not in text:
        return f"sqlite:///{Path(text).expanduser().absolute()}"
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        url = make_url(text)
    except (ArgumentError, ValueError):  # ValueError: a port that is not a number
        raise ConfigError(
            "TUNECACHE_DB", text, "a file path or a sqlite:/// or postgresql:// URL"
        ) from None
    scheme = _SCHEMES.get(url.drivername)
    if scheme is None:
        raise ConfigError(
            "TUNECACHE_DB", text, f"a sqlite:/// or postgresql:// URL, not {url.drivername}://"
        )
    if scheme == "sqlite" and not url.database:
        # An in-memory SQLite database cannot be shared by anyone: refuse it loudly.
        raise ConfigError("TUNECACHE_DB", text, "a SQLite URL naming a file (sqlite:////path)")
    if scheme == "sqlite" and url.database:
        url = url.set(database=str(Path(url.database).expanduser().absolute()))
    return url.set(drivername=scheme).render_as_string(hide_password=False)


def _positive_float(name: str, raw: str | float) -> float:
    try:
        value = float(raw)
    except (TypeError, ValueError):
        raise ConfigError(name, raw, "a positive number of seconds") from None
    if not math.isfinite(value) or value <= 0:
        raise ConfigError(name, raw, "a positive number of seconds")
    return value


def _whole_number(name: str, raw: str | int, least: int) -> int:
    """``raw`` as a whole number of at least ``least`` (0 or 1)."""
    wanted = "a positive whole number" if least > 0 else "0 or a positive whole number"
    try:
        value = int(raw)
    except (TypeError, ValueError):
        raise ConfigError(name, raw, wanted) from None
    if value < least:
        raise ConfigError(name, raw, wanted)
    return value


_DEFAULT_LOCK_TIMEOUT = 15.0

# The longest lease a claim may take (TUNECACHE_LEASE_SECONDS, TuneCache.claim's
# lease_seconds). A lease is only how long a dead owner's keys stay blocked (a live owner's
# heartbeat renews it), so an hour is far more than any job needs. It bounds what an
# honest row can hold: a claim whose lease ends more than IMPLAUSIBLE_LEASE_SECONDS ahead
# of the database's clock (this, plus slack for the clocks of hosts sharing a SQLite file,
# which stamp leases with their own) was written by no tunecache, no process will renew or
# finish it, and peers take it over as if it had passed instead of waiting for it.
MAX_LEASE_SECONDS = 3600.0
LEASE_CLOCK_SLACK_SECONDS = 600.0
IMPLAUSIBLE_LEASE_SECONDS = MAX_LEASE_SECONDS + LEASE_CLOCK_SLACK_SECONDS

# The parts of the Inductor integration and beyond that TUNECACHE_SHARE turns on, beside
# GEMM timings, which are always shared ("gemm" names them, so that TUNECACHE_SHARE=gemm
# reads as what it does): Triton kernel configs with fusion and split-size benchmarks,
# transfer from neighbouring sizes, compiled graphs, compiled kernels, Dynamo's shape
# profiles, users' own @triton.autotune kernels.
SHARE_ITEMS: tuple[str, ...] = ("triton", "transfer", "graphs", "kernels", "profiles",
                                "user_kernels")
# The research levers (TUNECACHE_LEVERS, Settings.levers): each a measured default.
LEVER_ITEMS: tuple[str, ...] = ("decisive_gemm", "decisive_fusion", "decisive_triton",
                                "compile_ahead", "user_kernel_transfer",
                                "user_kernel_regret")
# What a decisive lever turns on (Levers.decisive).
DECISIVE_PARTS = frozenset({"gemm", "triton", "fusion"})
# Spellings of a true flag (the renamed variables below).
TRUE_VALUES = ("1", "true", "yes", "on")
# Threads that compile a descent's next configs with compile_ahead on (at most one per
# core): 8 measured 2.22x on an H100 host's Triton (docs/benchmarks/).
COMPILE_AHEAD_THREADS = 8


def _flag(name: str, raw: str | bool) -> bool:
    if isinstance(raw, bool):
        return raw
    value = str(raw).strip().lower()
    if value in TRUE_VALUES:
        return True
    if value in ("", "0", "false", "no", "off"):
        return False
    raise ConfigError(name, raw, "1 or 0")


def parse_list(name: str, raw: Any, items: tuple[str, ...],
               default: frozenset[str], aliases: frozenset[str] = frozenset()
               ) -> frozenset[str]:
    """The one grammar of every list setting: names separated by commas are exactly what is
    on; names each prefixed with ``-`` (or ``+``) take them off (or put them on) the
    default; mixing both forms is an error. ``aliases`` are names accepted and ignored
    (``gemm``: always on). A collection from Python is the exact set."""
    if isinstance(raw, (frozenset, set, list, tuple)):
        words = [str(w) for w in raw]
        unknown = set(words) - set(items) - aliases
        if unknown:
            raise ConfigError(name, raw, f"names among {','.join(items)}")
        return frozenset(words) - aliases
    words = [w.strip().lower() for w in str(raw).split(",") if w.strip()]
    if not words:
        return default
    edits = [w[0] in "+-" for w in words]
    names = [w.lstrip("+-").strip() for w in words]
    wanted = f"a comma list of {','.join(items)}, or of them each prefixed with - or +"
    if any(edits) and not all(edits):
        raise ConfigError(name, raw, wanted + " (not both)")
    if any(n not in items and n not in aliases for n in names):
        raise ConfigError(name, raw, wanted)
    if not any(edits):
        return frozenset(names) - aliases
    on = set(default)
    for word, item in zip(words, names):
        if item in aliases:
            continue
        if word.startswith("-"):
            on.discard(item)
        else:
            on.add(item)
    return frozenset(on)


@dataclasses.dataclass(frozen=True)
class Levers:
    """The research levers, each with the default its benchmarks measured (docs/
    configuration.md, "Levers"). Settings of the library: ``Settings(levers=Levers(...))``,
    ``tunecache.enable(levers=...)``; TUNECACHE_LEVERS sets them for experiments.

    ``decisive``: with transfer, the parts where the nearest recorded sizes, all agreeing
    by a clear margin, decide a new size without measuring it (docs/transfer.md): gemm and
    fusion, whose decisions cost nothing on GPUs (regret 1.000), not triton (up to 1.78x).
    ``compile_ahead``: threads (at most one per core) compiling a Triton kernel's next
    configs while its descent benchmarks the previous ones (descents took 0.60-0.66x the
    time on an H100); 0 compiles each just before its benchmark, as Inductor does.
    ``user_kernel_transfer``: a user kernel's key value never tuned benchmarks only the
    winners of its nearest recorded values (off until measured on GPUs);
    ``user_kernel_regret``: a job reading such an entry measures its regret.
    """

    decisive: frozenset[str] = frozenset({"gemm", "fusion"})
    compile_ahead: int = COMPILE_AHEAD_THREADS
    user_kernel_transfer: bool = False
    user_kernel_regret: bool = False

    def __post_init__(self) -> None:
        decisive = frozenset(str(p) for p in self.decisive)
        if not decisive <= DECISIVE_PARTS:
            raise ConfigError("levers.decisive", sorted(decisive),
                              f"some of {','.join(sorted(DECISIVE_PARTS))}")
        object.__setattr__(self, "decisive", decisive)
        object.__setattr__(self, "compile_ahead",
                           _whole_number("levers.compile_ahead", self.compile_ahead, 0))
        for name in ("user_kernel_transfer", "user_kernel_regret"):
            object.__setattr__(self, name, _flag(f"levers.{name}", getattr(self, name)))

    @property
    def names(self) -> frozenset[str]:
        """The lever names that are on (TUNECACHE_LEVERS' names)."""
        on = {f"decisive_{p}" for p in self.decisive}
        on |= {n for n in ("user_kernel_transfer", "user_kernel_regret") if getattr(self, n)}
        return frozenset(on | ({"compile_ahead"} if self.compile_ahead else set()))

    @classmethod
    def parse(cls, name: str, raw: Any) -> Levers:
        """Levers from TUNECACHE_LEVERS' list grammar (:func:`parse_list`), a collection of
        lever names, or Levers itself."""
        if isinstance(raw, Levers):
            return raw
        on = parse_list(name, raw, LEVER_ITEMS, cls().names)
        return cls(decisive=frozenset(p for p in DECISIVE_PARTS if f"decisive_{p}" in on),
                   compile_ahead=COMPILE_AHEAD_THREADS if "compile_ahead" in on else 0,
                   user_kernel_transfer="user_kernel_transfer" in on,
                   user_kernel_regret="user_kernel_regret" in on)


# Variables of earlier versions, still honoured with one warning naming the replacement:
# name -> (the list it is now part of, the item it sets). TUNECACHE_DECISIVE and
# TUNECACHE_COMPILE_AHEAD carry values of their own (renamed_value below).
RENAMED: dict[str, tuple[str, str]] = {
    "TUNECACHE_TRITON_CONFIGS": ("TUNECACHE_SHARE", "triton"),
    "TUNECACHE_TRANSFER": ("TUNECACHE_SHARE", "transfer"),
    "TUNECACHE_GRAPHS": ("TUNECACHE_SHARE", "graphs"),
    "TUNECACHE_KERNELS": ("TUNECACHE_SHARE", "kernels"),
    "TUNECACHE_PGO": ("TUNECACHE_SHARE", "profiles"),
    "TUNECACHE_USER_KERNELS": ("TUNECACHE_SHARE", "user_kernels"),
    "TUNECACHE_DECISIVE": ("TUNECACHE_LEVERS", "decisive_gemm"),
    "TUNECACHE_COMPILE_AHEAD": ("TUNECACHE_LEVERS", "compile_ahead"),
    "TUNECACHE_USER_KERNEL_TRANSFER": ("TUNECACHE_LEVERS", "user_kernel_transfer"),
    "TUNECACHE_USER_KERNEL_REGRET": ("TUNECACHE_LEVERS", "user_kernel_regret"),
}


def unknown_variables(environ: Mapping[str, str]) -> list[tuple[str, str | None]]:
    """(name, nearest known name or None) of every TUNECACHE_* variable that no part of
    tunecache reads: a typo (TUNECACHE_DBB) would otherwise be silently ignored."""
    known = [*Settings.known_variables(), *RENAMED]
    # Compared without the common prefix, which would make every name look alike.
    tails = [k.removeprefix("TUNECACHE_") for k in known]

    def nearest(name: str) -> str | None:
        import difflib  # only once a name is unknown: not on every job's start

        close = difflib.get_close_matches(name.removeprefix("TUNECACHE_"), tails, n=1)
        return f"TUNECACHE_{close[0]}" if close else None

    return [(name, nearest(name)) for name in sorted(environ)
            if name.startswith("TUNECACHE_") and name not in known]


def _renamed(env: Mapping[str, str], values: dict[str, Any], notices: list[str]) -> None:
    """Apply the renamed variables set in ``env`` to ``values`` (share, levers) where the
    new variable is not set, one notice each naming the replacement."""
    share = set(SHARE_ITEMS)
    levers = Levers()
    lever_fields: dict[str, Any] = {}
    used = {"TUNECACHE_SHARE": False, "TUNECACHE_LEVERS": False}
    for var, (new, item) in RENAMED.items():
        if var not in env:
            continue
        raw = env[var]
        if new in env:
            notices.append(f"tunecache: {var} is replaced by {new}, which is set: {var} is "
                           "ignored")
            continue
        used[new] = True
        if var == "TUNECACHE_DECISIVE":
            decisive = _old_decisive(var, raw)
            lever_fields["decisive"] = decisive
            spelled = ",".join([f"+decisive_{p}" for p in sorted(decisive)]
                               + [f"-decisive_{p}" for p in sorted(DECISIVE_PARTS - decisive)])
        elif var == "TUNECACHE_COMPILE_AHEAD":
            threads = _whole_number(var, raw, 0)
            lever_fields["compile_ahead"] = threads
            spelled = "+compile_ahead" if threads else "-compile_ahead"
        else:
            on = _flag(var, raw)
            if new == "TUNECACHE_SHARE":
                (share.add if on else share.discard)(item)
            else:
                lever_fields[item] = on
            spelled = f"{'+' if on else '-'}{item}"
        notices.append(f"tunecache: {var} is renamed: set {new}={spelled} instead (honoured "
                       "this time)")
    if used["TUNECACHE_SHARE"]:
        values["share"] = frozenset(share)
    if used["TUNECACHE_LEVERS"]:
        values["levers"] = dataclasses.replace(levers, **lever_fields)


def _old_decisive(name: str, raw: str) -> frozenset[str]:
    """TUNECACHE_DECISIVE's own grammar: a flag (every part or none) or a list of parts."""
    try:
        return DECISIVE_PARTS if _flag(name, raw) else frozenset()
    except ConfigError:
        words = [w.strip().lower() for w in str(raw).split(",") if w.strip()]
    if not words or not set(words) <= DECISIVE_PARTS:
        raise ConfigError(name, raw, f"1, 0, or some of {','.join(sorted(DECISIVE_PARTS))}")
    return frozenset(words)


@dataclasses.dataclass(frozen=True)
class Settings:
    """How a process uses the cache: the claim protocol, what is shared, the keys, and the
    research levers. Read from the environment once (:meth:`from_env`), then passed down;
    every field but ``levers`` and ``share`` has a variable of its own."""

    db_url: str = dataclasses.field(default_factory=lambda: resolve_db_url(None))
    mode: Mode = "readwrite"
    # A claim's lease. The owner's heartbeat renews it every lease/3, so a live owner never
    # loses its claim; a killed or frozen one loses it within this many seconds.
    lease_seconds: float = 30.0
    # How long a process waits for keys its peers are tuning before it tunes them itself.
    wait_timeout: float = 900.0
    # How long one database operation may wait for a lock (SQLite busy timeout) or a
    # connection (PostgreSQL) before the store counts as unavailable. None: the default,
    # half the lease and at most _DEFAULT_LOCK_TIMEOUT (a float once constructed).
    lock_timeout: float | None = None
    # Claims of one key that may end without a result (tuner raised, process died) before
    # the key is marked failed and waiters get that answer.
    max_attempts: int = 3
    # What is shared beyond GEMM timings (SHARE_ITEMS; TUNECACHE_SHARE, parse_list's
    # grammar): everything by default. Graphs, kernels and profiles also need a key.
    share: frozenset[str] = frozenset(SHARE_ITEMS)
    # Compiled graphs, kernels and shape profiles are shared only signed: ``signing_key``,
    # the path of the private key (this job publishes what it compiles and verifies with
    # the public half); ``verify_key``, the path of the public key (a consumer that loads
    # verified entries and never publishes). A bad value turns those parts off
    # (graph_sharing() says why), never tuning sharing.
    signing_key: str | None = None
    verify_key: str | None = None
    levers: Levers = dataclasses.field(default_factory=Levers)
    # What from_env found worth a warning (unknown and renamed variables), for whoever
    # enables tunecache to say once (tunecache.process).
    notices: tuple[str, ...] = dataclasses.field(default=(), compare=False, repr=False)
    _graphs_problem: str | None = dataclasses.field(default=None, init=False, repr=False,
                                                    compare=False)

    _ENV: ClassVar[dict[str, str]] = {
        "db_url": "TUNECACHE_DB",
        "mode": "TUNECACHE_MODE",
        "lease_seconds": "TUNECACHE_LEASE_SECONDS",
        "wait_timeout": "TUNECACHE_WAIT_TIMEOUT",
        "lock_timeout": "TUNECACHE_LOCK_TIMEOUT",
        "max_attempts": "TUNECACHE_MAX_ATTEMPTS",
        "share": "TUNECACHE_SHARE",
        "signing_key": "TUNECACHE_SIGNING_KEY",
        "verify_key": "TUNECACHE_VERIFY_KEY",
        "levers": "TUNECACHE_LEVERS",
    }

    @classmethod
    def known_variables(cls) -> list[str]:
        """Every TUNECACHE_* name tunecache reads (the renamed ones are RENAMED's)."""
        return list(cls._ENV.values())

    @property
    def lock_seconds(self) -> float:
        """``lock_timeout`` as resolved: a float once constructed (None is the default)."""
        assert self.lock_timeout is not None  # __post_init__ resolved it
        return self.lock_timeout

    def shares(self, item: str) -> bool:
        """Whether ``item`` (one of SHARE_ITEMS) is shared."""
        return item in self.share

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ConfigError("TUNECACHE_MODE", self.mode, " or ".join(MODES))
        for name in ("lease_seconds", "wait_timeout"):
            object.__setattr__(self, name, _positive_float(self._ENV[name], getattr(self, name)))
        if self.lease_seconds > MAX_LEASE_SECONDS:
            raise ConfigError(self._ENV["lease_seconds"], self.lease_seconds,
                              f"at most {MAX_LEASE_SECONDS:g} seconds (a longer claim is "
                              "taken for abandoned by peers)")
        # A heartbeat renews every lease/3 and may wait up to lock_timeout for the lock (a
        # writer stalled inside a transaction, e.g. a frozen process, holds every other
        # writer back), so a live owner keeps its claim through every stall the lock
        # timeout tolerates only if lease/3 + lock_timeout < lease. Half the lease leaves
        # lease/6 for the renewal itself (docs/decisions.md, "Lock timeout").
        most = self.lease_seconds / 2
        if self.lock_timeout is None:
            object.__setattr__(self, "lock_timeout", min(_DEFAULT_LOCK_TIMEOUT, most))
        else:
            lock = _positive_float(self._ENV["lock_timeout"], self.lock_timeout)
            if lock > most:
                # Named after the variable the user set (the lock timeout: its default is
                # never above the bound), with the bound and both ways out.
                lease = self._ENV["lease_seconds"]
                raise ConfigError(
                    self._ENV["lock_timeout"], self.lock_timeout,
                    f"at most {most:g}, half of {lease}={self.lease_seconds:g} (a live "
                    "owner's claim must outlast a heartbeat's wait for a lock); lower "
                    f"{self._ENV['lock_timeout']}, or raise {lease} to at least {2 * lock:g}",
                )
            object.__setattr__(self, "lock_timeout", lock)
        object.__setattr__(
            self, "max_attempts", _whole_number(self._ENV["max_attempts"], self.max_attempts, 1)
        )
        object.__setattr__(self, "share", parse_list(
            self._ENV["share"], self.share, SHARE_ITEMS, frozenset(SHARE_ITEMS),
            aliases=frozenset({"gemm"})))
        object.__setattr__(self, "levers", Levers.parse(self._ENV["levers"], self.levers))
        self._key_settings()

    def _key_settings(self) -> None:
        problems = []
        for name in ("signing_key", "verify_key"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, (str, os.PathLike)):
                problems.append(str(ConfigError(self._ENV[name], value, "a file path")))
                value = None
            text = os.fspath(value).strip() if value is not None else ""
            # Unset and empty are the same: `TUNECACHE_SIGNING_KEY= job` turns it off.
            path = str(Path(text).expanduser().absolute()) if text else None
            object.__setattr__(self, name, path)
        object.__setattr__(self, "_graphs_problem", "; ".join(problems) or None)

    def graph_sharing(self) -> GraphSharing:
        """Whether and how this process shares compiled graphs (never raises)."""
        if self._graphs_problem is not None:
            return GraphSharing("invalid", problem=self._graphs_problem)
        if not self.shares("graphs"):
            return GraphSharing("off")
        return self._keyed()

    def _keyed(self) -> GraphSharing:
        """What the key settings and the mode allow a signed artifact."""
        if self.mode == "off":
            return GraphSharing("off")
        if self.signing_key is not None and self.mode == "readwrite":
            return GraphSharing("publish", self.signing_key, self.verify_key)
        if self.signing_key is not None or self.verify_key is not None:
            # A readonly process never writes, whatever key it holds.
            return GraphSharing("verify", self.signing_key, self.verify_key)
        return GraphSharing("unconfigured")

    def kernel_sharing(self) -> GraphSharing:
        """Whether and how this process shares compiled Triton kernels: as graphs are
        (the same keys), unless ``kernels`` is not shared."""
        plan = self.graph_sharing()
        return plan if self.shares("kernels") or plan.state == "invalid" \
            else GraphSharing("off")

    def pgo_sharing(self) -> GraphSharing:
        """Whether and how this process shares Dynamo's shape profiles: with ``profiles``
        shared, as graphs are (the same keys), whether graphs are shared or not: a profile
        is no compiled graph."""
        if self._graphs_problem is not None:  # a bad key setting
            return GraphSharing("invalid", problem=self._graphs_problem)
        if not self.shares("profiles"):
            return GraphSharing("off")
        return self._keyed()

    @classmethod
    def from_env(
        cls, environ: Mapping[str, str] | None = None, **overrides: Any
    ) -> Settings:
        """Settings from the environment; keyword arguments win over it. What deserves a
        warning (an unknown TUNECACHE_* name, a renamed one) is in ``notices``.

        ``db`` may be given as a path or URL (it is resolved like TUNECACHE_DB).
        """
        env = os.environ if environ is None else environ
        notices = [f"tunecache: {name} is not a tunecache setting and is ignored"
                   + (f" (did you mean {nearest}?)" if nearest else "")
                   for name, nearest in unknown_variables(env)]
        values: dict[str, Any] = {}
        _renamed(env, values, notices)
        for field, var in cls._ENV.items():
            if var in env:
                values[field] = env[var]
        if "mode" in values:
            values["mode"] = values["mode"].strip().lower()
        db = overrides.pop("db", None)
        if db is not None:
            values["db_url"] = db
        unknown = set(overrides) - set(cls._ENV)
        if unknown:
            raise TypeError(f"unknown tunecache setting(s): {', '.join(sorted(unknown))}")
        values.update(overrides)
        values["db_url"] = resolve_db_url(values.get("db_url"), env)
        return cls(**values, notices=tuple(notices))

    @property
    def owns_directory(self) -> bool:
        """The database is the embedded default, in tunecache's own directory under the
        user's cache directory, which may be created; no other directory is."""
        return self.db_url == resolve_db_url(None)

    @property
    def is_postgresql(self) -> bool:
        return self.db_url.startswith("postgresql")


@dataclasses.dataclass(frozen=True)
class GraphSharing:
    """:meth:`Settings.graph_sharing`: ``publish`` (sign and publish, verify with the
    private key's public half, or with ``verify_key`` where given: they must match),
    ``verify`` (load verified graphs, publish nothing: a verify key only, or a readonly
    process), ``unconfigured`` (no key: off, with one info line on how to turn it on),
    ``off`` (graphs not shared) or ``invalid`` (a bad setting: off, ``problem`` says
    which)."""

    state: Literal["publish", "verify", "unconfigured", "off", "invalid"]
    signing_key: str | None = None
    verify_key: str | None = None
    problem: str | None = None

"""Every TUNECACHE_* environment variable, read and validated in this one place."""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar, Literal

from .errors import ConfigError

__all__ = ["Settings", "Mode", "Activation", "GraphSharing", "activation", "resolve_db_url",
           "unknown_variables",
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

# What TUNECACHE_DECISIVE can turn on (Settings.decisive).
DECISIVE_PARTS = frozenset({"gemm", "triton", "fusion"})
# Spellings of a true TUNECACHE_* flag.
TRUE_VALUES = ("1", "true", "yes", "on")
# Not a setting of the cache: tools/bench_gpu.py's switch to count plain max-autotune runs.
COUNT_ONLY_VAR = "TUNECACHE_INDUCTOR_COUNT_ONLY"


def _flag(name: str, raw: str | bool) -> bool:
    if isinstance(raw, bool):
        return raw
    value = str(raw).strip().lower()
    if value in TRUE_VALUES:
        return True
    if value in ("", "0", "false", "no", "off"):
        return False
    raise ConfigError(name, raw, "1 or 0")


def _parts(name: str, raw: Any, parts: frozenset[str]) -> frozenset[str]:
    """A setting that turns on some of ``parts``: a flag (all or none), or their names
    separated by commas (a collection of them, given as a keyword)."""
    if isinstance(raw, (frozenset, set, list, tuple)):
        words = [str(w) for w in raw]
        valid = set(words) <= parts
    else:
        try:
            return parts if _flag(name, raw) else frozenset()
        except ConfigError:
            words = [w.strip().lower() for w in str(raw).split(",") if w.strip()]
        valid = bool(words) and set(words) <= parts
    if not valid:
        raise ConfigError(name, raw, f"1, 0, or some of {','.join(sorted(parts))}")
    return frozenset(words)


_log = logging.getLogger(__name__)
# Unknown TUNECACHE_* names already warned about by this process.
_warned_unknown: set[str] = set()


def unknown_variables(environ: Mapping[str, str]) -> list[tuple[str, str | None]]:
    """(name, nearest known name or None) of every TUNECACHE_* variable that no part of
    tunecache reads: a typo (TUNECACHE_DBB) would otherwise be silently ignored."""
    known = Settings.known_variables()
    # Compared without the common prefix, which would make every name look alike.
    tails = [k.removeprefix("TUNECACHE_") for k in known]

    def nearest(name: str) -> str | None:
        import difflib  # only once a name is unknown: not on every job's start

        close = difflib.get_close_matches(name.removeprefix("TUNECACHE_"), tails, n=1)
        return f"TUNECACHE_{close[0]}" if close else None

    return [(name, nearest(name)) for name in sorted(environ)
            if name.startswith("TUNECACHE_") and name not in known]


def _warn_unknown(environ: Mapping[str, str]) -> None:
    for name, nearest in unknown_variables(environ):
        if name in _warned_unknown:
            continue
        _warned_unknown.add(name)
        hint = f" (did you mean {nearest}?)" if nearest else ""
        _log.warning("tunecache: %s is not a tunecache setting and is ignored%s", name, hint)


@dataclasses.dataclass(frozen=True)
class Settings:
    """How a process uses the cache. Every field has an environment variable."""

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
    # Share Triton kernel configs (coordinate descent included) and fusion benchmark
    # timings too, not only GEMM timings (docs/triton-autotune.md). On by default since
    # the warm-start GPU runs of 2026-12-01 (docs/benchmarks.md); TUNECACHE_TRITON_CONFIGS=0
    # opts out.
    triton_configs: bool = True
    # A key never tuned starts from the recorded keys of its structure nearest in size:
    # only their best candidates are benchmarked (docs/transfer.md). TUNECACHE_TRANSFER=0
    # tunes every new key in full, as plain max-autotune does.
    transfer: bool = True
    # With transfer, the parts (DECISIVE_PARTS) where the nearest recorded sizes, all
    # agreeing by a clear margin, decide a new size without measuring it: a GEMM generates
    # only their choice, a Triton kernel loads their config, an epilogue fusion is
    # replayed (docs/transfer.md). TUNECACHE_DECISIVE: 1 (every part), 0, or a list such
    # as "fusion,triton". gemm and fusion are on by default: their decisions' regret was
    # 1.000 on GPUs (docs/benchmarks.md, 2026-12-05); a Triton kernel's neighbours' config
    # was up to 1.78x the best at the new size there, so triton is not.
    decisive: frozenset[str] = frozenset({"gemm", "fusion"})
    # Threads (at most one per core) that compile a Triton kernel's next candidate configs
    # while its coordinate descent (or transfer) benchmarks the previous ones
    # (inductor/triton/compile_ahead.py). On: descents of a cold job took 0.60-0.66x the
    # time on an H100 (docs/benchmarks.md, 2026-12-06). 0 compiles each candidate just
    # before its benchmark, as Inductor does.
    compile_ahead: int = 8
    # Compiled-graph sharing, on only with a key: ``signing_key``, the path of
    # the private key (this job publishes graphs it compiles and verifies with the public
    # half); ``verify_key``, the path of the public key (a consumer that loads verified
    # graphs and never publishes); ``graphs``: False turns it off even with keys. These
    # never stop tuning sharing: a bad value turns graph sharing off (graph_sharing()
    # says why, and the Inductor integration warns once).
    signing_key: str | None = None
    verify_key: str | None = None
    graphs: bool = True
    # Compiled Triton kernels shared across graphs and nodes (tunecache.triton_cache), with the
    # same keys and trust as graphs; TUNECACHE_KERNELS=0 keeps them in Triton's local cache.
    kernels: bool = True
    # Dynamo's profile-guided dynamic shapes served from the database (tunecache.inductor.
    # pgo), with the same keys and trust as graphs, for jobs that set a job id. On because
    # the GPU measurement put a dynamic graph's step within 1.02x of a static compile's
    # (docs/graphs.md); TUNECACHE_PGO=0 turns it off.
    pgo: bool = True
    # Users' own @triton.autotune kernels tuned once per cluster (tunecache.user_kernels);
    # TUNECACHE_USER_KERNELS=0 leaves Triton's autotuner alone.
    user_kernels: bool = True
    # A user kernel's key value never tuned benchmarks only the winners of the two nearest
    # recorded values of the same kernel (tunecache.user_kernels.sharing); off until its
    # step time is measured on GPUs. TUNECACHE_USER_KERNEL_REGRET=1: a job measures every
    # config of the transferred keys it reads and records the regret.
    user_kernel_transfer: bool = False
    user_kernel_regret: bool = False
    _graphs_problem: str | None = dataclasses.field(default=None, init=False, repr=False,
                                                    compare=False)
    _pgo_problem: str | None = dataclasses.field(default=None, init=False, repr=False,
                                                 compare=False)

    _ENV: ClassVar[dict[str, str]] = {
        "db_url": "TUNECACHE_DB",
        "mode": "TUNECACHE_MODE",
        "lease_seconds": "TUNECACHE_LEASE_SECONDS",
        "wait_timeout": "TUNECACHE_WAIT_TIMEOUT",
        "lock_timeout": "TUNECACHE_LOCK_TIMEOUT",
        "max_attempts": "TUNECACHE_MAX_ATTEMPTS",
        "triton_configs": "TUNECACHE_TRITON_CONFIGS",
        "transfer": "TUNECACHE_TRANSFER",
        "decisive": "TUNECACHE_DECISIVE",
        "compile_ahead": "TUNECACHE_COMPILE_AHEAD",
        "signing_key": "TUNECACHE_SIGNING_KEY",
        "verify_key": "TUNECACHE_VERIFY_KEY",
        "graphs": "TUNECACHE_GRAPHS",
        "kernels": "TUNECACHE_KERNELS",
        "pgo": "TUNECACHE_PGO",
        "user_kernels": "TUNECACHE_USER_KERNELS",
        "user_kernel_transfer": "TUNECACHE_USER_KERNEL_TRANSFER",
        "user_kernel_regret": "TUNECACHE_USER_KERNEL_REGRET",
    }

    @classmethod
    def known_variables(cls) -> list[str]:
        """Every TUNECACHE_* name tunecache reads: the settings, the benchmark counter,
        and the test suite's PostgreSQL server (tests/conftest.py)."""
        return [*cls._ENV.values(), COUNT_ONLY_VAR, "TUNECACHE_TEST_PG"]

    @property
    def lock_seconds(self) -> float:
        """``lock_timeout`` as resolved: a float once constructed (None is the default)."""
        assert self.lock_timeout is not None  # __post_init__ resolved it
        return self.lock_timeout

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
        object.__setattr__(
            self, "triton_configs", _flag(self._ENV["triton_configs"], self.triton_configs)
        )
        object.__setattr__(self, "transfer", _flag(self._ENV["transfer"], self.transfer))
        object.__setattr__(self, "decisive", _parts(self._ENV["decisive"], self.decisive,
                                                    DECISIVE_PARTS))
        object.__setattr__(self, "compile_ahead",
                           _whole_number(self._ENV["compile_ahead"], self.compile_ahead, 0))
        for name in ("user_kernels", "user_kernel_transfer", "user_kernel_regret"):
            object.__setattr__(self, name, _flag(self._ENV[name], getattr(self, name)))
        self._graph_settings()

    def _graph_settings(self) -> None:
        problems = []
        try:
            object.__setattr__(self, "graphs", _flag(self._ENV["graphs"], self.graphs))
        except ConfigError as e:
            object.__setattr__(self, "graphs", False)
            problems.append(str(e))
        try:
            object.__setattr__(self, "kernels", _flag(self._ENV["kernels"], self.kernels))
        except ConfigError as e:
            object.__setattr__(self, "kernels", False)
            problems.append(str(e))
        try:
            object.__setattr__(self, "pgo", _flag(self._ENV["pgo"], self.pgo))
        except ConfigError as e:  # turns profiles off, not graphs
            object.__setattr__(self, "pgo", False)
            object.__setattr__(self, "_pgo_problem", str(e))
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
        if not self.graphs:
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
        (the same keys), unless TUNECACHE_KERNELS=0."""
        plan = self.graph_sharing()
        return plan if self.kernels or plan.state == "invalid" else GraphSharing("off")

    def pgo_sharing(self) -> GraphSharing:
        """Whether and how this process shares Dynamo's shape profiles: off with
        TUNECACHE_PGO=0, else as graphs are (the same keys), whatever TUNECACHE_GRAPHS
        says: a profile is no compiled graph."""
        if self._pgo_problem is not None:
            return GraphSharing("invalid", problem=self._pgo_problem)
        if not self.pgo:
            return GraphSharing("off")
        if self._graphs_problem is not None:  # a bad key setting
            return GraphSharing("invalid", problem=self._graphs_problem)
        return self._keyed()

    @classmethod
    def from_env(
        cls, environ: Mapping[str, str] | None = None, **overrides: Any
    ) -> Settings:
        """Settings from the environment; keyword arguments win over it.

        ``db`` may be given as a path or URL (it is resolved like TUNECACHE_DB).
        """
        env = os.environ if environ is None else environ
        _warn_unknown(env)
        values: dict[str, Any] = {}
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
        return cls(**values)

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
    ``off`` (TUNECACHE_GRAPHS=0) or ``invalid`` (a bad setting: off, ``problem`` says
    which)."""

    state: Literal["publish", "verify", "unconfigured", "off", "invalid"]
    signing_key: str | None = None
    verify_key: str | None = None
    problem: str | None = None


@dataclasses.dataclass(frozen=True)
class Activation:
    """What the autoload hook (tunecache._autoload) does at ``import torch``.

    Read from the environment without building :class:`Settings`: it runs inside every
    ``import torch``, so it must cost next to nothing, import nothing and never raise. A
    bad value is reported later, when the cache is opened.
    """

    # Install the post-import hook at all: TUNECACHE_DB set and TUNECACHE_MODE not off,
    # or the benchmark counter asked for.
    hook: bool
    # TUNECACHE_INDUCTOR_COUNT_ONLY=1: install only the benchmark counter, no cache.
    count_only: bool
    # TUNECACHE_TRITON_CONFIGS on (the default; not count_only): plug in the Triton
    # autotune cache.
    triton: bool
    # A signing or verify key set, and neither TUNECACHE_GRAPHS nor TUNECACHE_KERNELS off
    # (not count_only): name tunecache Triton's cache manager now, before Inductor starts
    # its compile workers (when Dynamo looks up the inductor backend, before
    # select_algorithm is imported), which copy the environment once.
    kernels: bool = False
    # TUNECACHE_USER_KERNELS on (the default; not count_only): plug in front of Triton's
    # own autotuner once triton.runtime.autotuner is imported.
    user_kernels: bool = False


def activation(environ: Mapping[str, str] | None = None) -> Activation:
    """The autoload hook's :class:`Activation`, from the environment."""
    env = os.environ if environ is None else environ
    var = Settings._ENV
    count_only = env.get(COUNT_ONLY_VAR) == "1"
    if count_only:
        hook = True
    elif not env.get(var["db_url"], "").strip():
        hook = False
    else:
        hook = env.get(var["mode"], "").strip().lower() != "off"
    triton = env.get(var["triton_configs"], "1").strip().lower() in TRUE_VALUES
    keyed = any(env.get(var[k], "").strip() for k in ("signing_key", "verify_key"))
    kernels = keyed and all(env.get(var[k], "1").strip().lower() in TRUE_VALUES
                            for k in ("graphs", "kernels"))
    user_kernels = env.get(var["user_kernels"], "1").strip().lower() in TRUE_VALUES
    return Activation(hook, count_only, triton and hook and not count_only,
                      kernels and hook and not count_only,
                      user_kernels and hook and not count_only)

"""Tuning keys and their timings: a key's identity, timings validation, the winner.

A key is computed once into a :class:`Key`, which every layer passes on. Everything here is
pure and torch-free. Whatever reads an entry from shared storage goes
through :func:`validate_timings`, because a shared file can hold anything: a half-written
row from a crashed host, an entry from a buggy tunecache, or one written by hand.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from . import stored_json
from .errors import InvalidEntryError

__all__ = [
    "Key",
    "KeyLike",
    "canonical_json",
    "key_hash",
    "key_labels",
    "top_up_key",
    "top_up_base",
    "validate_timings",
    "octaves_apart",
    "to_ms",
    "timings_to_json",
    "best_candidate",
    "MAX_KEY_BYTES",
    "MAX_TIMINGS_BYTES",
    "MAX_CANDIDATES",
    "KINDS",
    "storable",
    "validate_meta",
    "meta_to_json",
    "MAX_META_BYTES",
]

# The kinds of entries tunecache itself writes (the key convention's "kind"); the last four
# are signed artifacts (Inductor's FX graph and AOTAutograd cache entries, Triton's
# compiled kernels, Dynamo's shape profiles). Callers of the API may write others.
KINDS = ("gemm", "triton_config", "fusion_benchmark", "fusion_decision", "user_kernel",
         "fxgraph", "autograd", "kernel", "pgo")

# Bounds on what one entry may hold. Real GEMM keys are under 2 KiB and real candidate
# lists under a few hundred names; anything far past that is garbage or hostile.
MAX_KEY_BYTES = 64 * 1024
MAX_TIMINGS_BYTES = 1024 * 1024
MAX_CANDIDATES = 10_000
MAX_CANDIDATE_NAME = 1024
MAX_LABEL = 256
# An entry's meta object (provenance, the untuned choice's time, regret) is small: a few
# hundred bytes. A family is a sha256 hex digest.
MAX_META_BYTES = 64 * 1024
MAX_FAMILY = 64


# Text neither database can store: PostgreSQL's text refuses NUL, and a lone surrogate
# (what JSON's "\ud800" escape reads as) has no UTF-8 encoding, so SQLite's driver cannot
# write it. Refused when a key or timings are validated, so that a bad import line or API
# call fails alone instead of aborting the transaction that writes its neighbours.
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
# A NUL inside canonical JSON: the escape \u0000 after an even number of backslashes (an
# odd number means the backslash itself was escaped, and the text is "\u0000", not NUL).
_JSON_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


def storable(text: str) -> bool:
    """Whether both databases can store ``text`` as it is (no NUL, no lone surrogate)."""
    return _UNSTORABLE.search(text) is None


def canonical_json(value: Any) -> str:
    """One text per value: sorted keys, no spaces, no NaN, so equal keys hash equally."""
    try:
        text = json.dumps(
            value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
        )
    except (TypeError, ValueError) as e:
        raise TypeError(f"a tunecache key must be JSON-able (no NaN/inf): {e}") from None
    except RecursionError:
        # json's C encoder recurses once per level, so a deep value fails at a depth that
        # depends on the caller's stack: bad input, reported as such, not a crash.
        raise ValueError("a tunecache key is nested too deeply to encode as JSON") from None
    return text


def key_hash(key: Mapping[str, Any]) -> tuple[str, str]:
    """(sha256 hex, canonical JSON) of a key mapping."""
    if not isinstance(key, Mapping):
        raise TypeError(f"a tunecache key must be a mapping, not {type(key).__name__}")
    text = canonical_json(dict(key))
    if _UNSTORABLE.search(text) or _JSON_NUL.search(text):
        raise ValueError("a tunecache key must not contain NUL characters or lone surrogates "
                         "(no database can store them)")
    if len(text.encode()) > MAX_KEY_BYTES:
        raise ValueError(f"a tunecache key must be under {MAX_KEY_BYTES} bytes as JSON")
    try:
        stored_json.check(text, MAX_KEY_BYTES)
    except stored_json.StoredJSONError as e:
        raise ValueError(f"a tunecache key would not be read back: it is {e}") from None
    return hashlib.sha256(text.encode()).hexdigest(), text


def _label(value: Any) -> str | None:
    return value[:MAX_LABEL] if isinstance(value, str) else None


def key_labels(key: Mapping[str, Any]) -> dict[str, str | None]:
    """The columns stats and prune group by, from the key convention
    ``{"kind": ..., "op": ..., "env": {"device": ..., "torch": ..., "triton": ...}}``."""
    env = key.get("env")
    env = env if isinstance(env, Mapping) else {}
    return {
        "kind": _label(key.get("kind")),
        "op": _label(key.get("op")),
        "device": _label(env.get("device")),
        "torch_version": _label(env.get("torch")),
        "triton_version": _label(env.get("triton")),
    }


@dataclasses.dataclass(frozen=True)
class Key(Mapping[str, Any]):
    """A tuning key, validated and hashed once: the mapping, its canonical JSON, its
    sha256 hash and the labels stats and prune group by. Equal keys have equal hashes.

    Build one with :meth:`of`; the mapping is the caller's, as is. A Key reads as that
    mapping (``key["op"]``, ``key.get``, ``dict(key)``), so a tuner, which gets the Key it
    was asked for, reads the fields it always read and the hash computed once.
    ``family``: the hash of the key's structure with its sizes left out, given by whoever
    built the key; stored beside it (not part of its hash) so that a new key can find
    recorded ones of the same structure (:meth:`tunecache.TuneCache.neighbours`).
    """

    hash: str
    json: str = dataclasses.field(repr=False)
    labels: Mapping[str, str | None] = dataclasses.field(compare=False, repr=False)
    mapping: Mapping[str, Any] = dataclasses.field(compare=False, repr=False)
    family: str | None = dataclasses.field(default=None, compare=False)

    def __getitem__(self, name: str) -> Any:
        return self.mapping[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.mapping)

    def __len__(self) -> int:
        return len(self.mapping)

    @classmethod
    def of(cls, key: KeyLike, family: str | None = None) -> Key:
        """The :class:`Key` of a key mapping (a :class:`Key` is returned as it is)."""
        if isinstance(key, Key):
            return key
        if family is not None and (not isinstance(family, str) or not family
                                   or len(family) > MAX_FAMILY or not storable(family)):
            raise ValueError(f"a key's family must be text of 1 to {MAX_FAMILY} characters")
        h, text = key_hash(key)
        return cls(h, text, key_labels(key), key, family)


# What the cache's methods accept: a key mapping (the public API) or a Key built before.
KeyLike = Key | Mapping[str, Any]

# The field that makes a key a top-up key (below).
_TOP_UP = "extra_candidates"


def top_up_key(key: Key, candidates: Iterable[str]) -> Key:
    """The key of the top-up entry of ``key``: the timings of ``candidates``, which its
    entry lacks (a later compile had them, and entries are immutable). A reader merges
    it with the entry; it is the key's mapping plus the sorted candidates."""
    return Key.of({**key.mapping, _TOP_UP: sorted(candidates)})


def top_up_base(key: Mapping[str, Any]) -> dict[str, Any] | None:
    """The key mapping a top-up key (:func:`top_up_key`) tops up, or None if ``key`` is
    none."""
    if _TOP_UP not in key:
        return None
    return {name: value for name, value in key.items() if name != _TOP_UP}


def validate_timings(raw: Any, key: str = "?") -> dict[str, float]:
    """Check a timings mapping {candidate: ms}; return it with ``None`` read as ``inf``.

    A candidate that failed to run is stored as JSON null (JSON has no infinity); every
    other value must be a finite, non-negative number. All of them may be null: "these
    candidates do not run here" is a result too (a compile that adds only a failing
    candidate to a key tunes just that one: a Triton config that needs more shared memory
    than the GPU has, for one).
    """
    if isinstance(raw, (str, bytes)):
        try:
            raw = stored_json.loads(raw, MAX_TIMINGS_BYTES)
        except stored_json.StoredJSONError as e:
            raise InvalidEntryError(key, f"timings are {e}") from None
    if not isinstance(raw, Mapping):
        raise InvalidEntryError(key, "timings are not a JSON object")
    if not raw:
        raise InvalidEntryError(key, "timings are empty")
    if len(raw) > MAX_CANDIDATES:
        raise InvalidEntryError(key, f"more than {MAX_CANDIDATES} candidates")
    out: dict[str, float] = {}
    for name, ms in raw.items():
        if not isinstance(name, str) or not name or len(name) > MAX_CANDIDATE_NAME \
                or not storable(name):
            raise InvalidEntryError(key, f"bad candidate name {str(name)[:40]!r}")
        if ms is None or ms == math.inf:
            out[name] = math.inf
            continue
        if isinstance(ms, bool) or not isinstance(ms, (int, float)):
            raise InvalidEntryError(key, f"timing of {name[:40]!r} is not a number")
        value = stored_json.number(ms)
        if value is None or value < 0:
            # No repr of an int out of range: one of 4300 digits raises in repr itself.
            shown = "out of range" if value is None and isinstance(ms, int) else repr(ms)
            raise InvalidEntryError(key, f"timing of {name[:40]!r} is {shown}")
        out[name] = value
    return out


def to_ms(value: Any) -> float:
    """A timing as a number of milliseconds >= 0, or ``inf`` for anything else (how a
    timing that failed reads everywhere: a GEMM's benchmark, a Triton config's
    ``time_taken_ms``, a coordinate descent's baseline and best)."""
    try:
        ms = float(value)
    except (TypeError, ValueError):
        return math.inf
    return ms if math.isfinite(ms) and ms >= 0 else math.inf


def validate_meta(raw: Any) -> dict[str, Any]:
    """An entry's meta object as read back: a JSON object under :data:`MAX_META_BYTES`,
    else empty. Meta only informs (stats, provenance, where transfer starts), so a garbled
    one costs only itself; whoever uses a field checks its type."""
    if not isinstance(raw, str):
        return {}
    try:
        value = stored_json.loads(raw, MAX_META_BYTES)
    except stored_json.StoredJSONError:
        return {}
    return value if isinstance(value, dict) else {}


def meta_to_json(meta: Mapping[str, Any] | None) -> str | None:
    """An entry's meta object as stored (None for none); refuses what it would not read
    back."""
    if not meta:
        return None
    text = canonical_json(dict(meta))
    if len(text) > MAX_META_BYTES or not storable(text) or _JSON_NUL.search(text):
        raise ValueError(f"an entry's meta must be a JSON object under {MAX_META_BYTES} bytes")
    try:
        return stored_json.check(text, MAX_META_BYTES)
    except stored_json.StoredJSONError as e:
        raise ValueError(
            f"an entry's meta would not be read back: it is {e}") from None


def timings_to_json(timings: Mapping[str, float]) -> str:
    """Store infinite (failed) timings as null; JSON has no infinity."""
    return canonical_json({k: (None if v == math.inf else v) for k, v in timings.items()})


def best_candidate(timings: Mapping[str, float]) -> str | None:
    """The fastest candidate; ties go to the smallest name, so every process agrees."""
    finite = [(ms, name) for name, ms in timings.items() if math.isfinite(ms)]
    return min(finite)[1] if finite else None


def octaves_apart(ours: Any, theirs: Any, *, most_each: float = math.inf,
                  most_total: float = math.inf) -> float | None:
    """How far apart two keys' sizes are, in octaves: ``|log2 a - log2 b|`` summed over
    the values that differ (4096 and 8192: 1.0). The one distance every transfer ranks
    neighbours by (GEMM, Triton kernels, fusion sites, users' kernels), each under its
    own bound: None where one value is more than ``most_each`` octaves away, the sum is
    more than ``most_total``, or the two are not comparable (another length, another
    non-number such as a dtype, a number that is not positive where they differ)."""
    if not isinstance(ours, (list, tuple)) or not isinstance(theirs, (list, tuple)) \
            or len(ours) != len(theirs):
        return None
    total = 0.0
    for a, b in zip(ours, theirs):
        if a == b and type(a) is type(b):
            continue
        numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (a, b))
        if not numbers or not a > 0 or not b > 0 or not math.isfinite(a) \
                or not math.isfinite(b):
            return None
        d = abs(math.log2(a) - math.log2(b))
        if d > most_each:
            return None
        total += d
    return total if total <= most_total else None

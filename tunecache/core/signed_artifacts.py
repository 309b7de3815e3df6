"""Compiled artifacts shared through the database, signed by the jobs that publish them.

:class:`SignedArtifactShare` serves opaque byte strings under (kind, key), one subclass
per kind of artifact, as Inductor's ``remote_cache.py`` names one backend per cache: the
subclass says what its entries are (for messages), which compiler makes one again when an
entry is refused, and the largest entry a reader decompresses. The subclasses are
:class:`tunecache.core.graphs.GraphShare` (compiled graphs: Inductor's FX graph and
AOTAutograd cache entries) and :class:`tunecache.core.kernels.KernelShare` (compiled
Triton kernels). Knowing nothing of either compiler, this module never unpickles
anything.

- ``publish``: compress (zlib), sign (kind, key, sha256 of the compressed bytes) with the
  private key, and store; the first publish of a (kind, key) wins, later ones write
  nothing (tunecache.store.artifacts), except over an entry that load() would refuse:
  that one is replaced (compare-and-swap on the row read), or it would block its key
  for every job forever (after a key rotation, say). A consumer replaces nothing.
- ``load``: read, recompute the digest of the bytes actually read, verify the signature
  with the public key, and only then decompress. An entry that is unsigned, altered,
  truncated, moved under another key or signed with another key is None, so the compiler
  compiles as usual; nothing of it reaches the caller.
- Nothing raises into the caller. Each reason for a refused entry is warned about once
  per process and share (a database full of them logs one line, not one per entry); a
  database error is warned about once and turns that share off in this process, as a
  store failure turns tuning sharing off (docs/design.md, "Failure policy").
"""

from __future__ import annotations

import hashlib
import logging
import threading
import zlib
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from ..errors import SigningKeyError, StoreError
from ..settings import GraphSharing
from .signing import Signer, Verifier, load_signer, load_verifier

if TYPE_CHECKING:  # pragma: no cover - typing only
    from ..store.artifacts import Artifact, ArtifactStore
    from .cache import TuneCache

__all__ = ["SignedArtifactShare"]

log = logging.getLogger("tunecache")

# zlib's default level: a compiled graph (pickle and source) shrinks about 4x, and a
# 10 MB entry compresses in a fraction of a second, once per cluster.
_LEVEL = 6

_Share = TypeVar("_Share", bound="SignedArtifactShare")


class SignedArtifactShare:
    """Signed artifacts of one kind in the shared database (see the module docstring).

    ``cache`` returns the TuneCache whose database holds them (opened lazily, shared
    with tuning); ``signer``: the private key, or None for a consumer that never
    publishes; ``verifier``: the public key every entry must verify with.
    """

    # What the entries are, for messages ("compiled graph"); its plural adds an "s".
    noun: ClassVar[str]
    # Who compiles an entry again when it is refused, and keeps it when it is not
    # published ("Inductor": it stays in Inductor's local cache).
    compiler: ClassVar[str]
    # The largest decompressed entry load() returns. Entries are verified before they
    # are decompressed, so this only bounds what a buggy (or stolen-key) publisher can
    # make a reader allocate.
    max_bytes: ClassVar[int]
    # The largest stored (compressed) entry load() reads: a row that claims more is
    # refused before any of its bytes are read. None: the store's own bound.
    max_stored_bytes: ClassVar[int | None] = None
    # Whether a publish rewrites the entry there (last writer wins): for an artifact that
    # grows as jobs learn (Dynamo's shape profile), unlike a compiled artifact, which is
    # the same wherever it is compiled (first publish wins).
    rewritable: ClassVar[bool] = False
    # Whether load() returns an entry this process compiled itself (compiled_here). A
    # compiled graph: no. The process's own graphs are in Inductor's local cache; one it
    # dropped from there (``FxGraphCache.clear()``, ``fresh_cache()``, as a test or a
    # cold-compile measurement does) is compiled again, as without tunecache.
    loads_own: ClassVar[bool] = True

    def __init__(self, cache: Callable[[], TuneCache], *, signer: Signer | None,
                 verifier: Verifier) -> None:
        self._cache = cache
        self._signer = signer
        self._verifier = verifier
        self._lock = threading.Lock()
        self._store: ArtifactStore | None = None
        self._off: str | None = None  # why this process stopped sharing these entries
        self._warned: set[str] = set()
        # (kind, key) this process has loaded or published: they are in the database.
        self._known: set[tuple[str, str]] = set()
        # (kind, key) this process compiled itself (see loads_own)
        self._own: set[tuple[str, str]] = set()
        # loaded, absent, refused, published, present (published by someone first),
        # replaced (an entry that did not verify, replaced by this process's publish)
        self.counts: Counter[str] = Counter()

    @classmethod
    def from_settings(cls: type[_Share], plan: GraphSharing,
                      cache: Callable[[], TuneCache]) -> _Share:
        """The service ``plan`` asks for (``publish`` or ``verify``;
        :meth:`Settings.graph_sharing` and :meth:`Settings.kernel_sharing` give one); raises
        SigningKeyError for a key file it cannot use."""
        if plan.state not in ("publish", "verify"):
            raise ValueError(f"sharing of {cls.noun}s is {plan.state}")
        signer = load_signer(plan.signing_key) if plan.signing_key else None
        verifier = load_verifier(plan.verify_key) if plan.verify_key else None
        if signer is not None and verifier is not None \
                and signer.verifier.public_raw != verifier.public_raw:
            raise SigningKeyError(
                str(plan.verify_key), f"is not the public half of TUNECACHE_SIGNING_KEY="
                f"{plan.signing_key}; {cls.noun}s this job signs would not verify. Set the pair "
                "`tunecache keygen` wrote, or only one of the two")
        if verifier is None:
            if signer is None:
                raise ValueError(f"sharing of {cls.noun}s names neither a signing nor a "
                                 "verify key")
            verifier = signer.verifier
        return cls(cache, signer=signer if plan.state == "publish" else None,
                   verifier=verifier)

    @property
    def publishes(self) -> bool:
        return self._signer is not None

    @property
    def fingerprint(self) -> str:
        """The public key's short name (for messages)."""
        return self._verifier.fingerprint

    # -- the two calls

    def compiled_here(self, kind: str, key: str) -> None:
        """Note that this process compiled (kind, key) itself (see ``loads_own``)."""
        with self._lock:
            self._own.add((kind, key))

    def load(self, kind: str, key: str) -> bytes | None:
        """The bytes published under (kind, key) if present and signed by our key pair;
        None otherwise (absent, refused, the database failed, or this process compiled
        it and ``loads_own`` is off)."""
        if not self.loads_own:
            with self._lock:
                if (kind, key) in self._own:
                    return None
        store = self._artifacts()
        if store is None:
            return None
        try:
            # The load is counted below.
            artifact = (store.get(kind, key, touch=False) if self.max_stored_bytes is None
                        else store.get(kind, key, touch=False, limit=self.max_stored_bytes))
        except StoreError as e:
            self._stop(e)
            return None
        except Exception as e:  # noqa: BLE001 - never fail the compiler's cache lookup
            self._warn_once("read", f"tunecache: reading a {self.noun} failed "
                            f"({type(e).__name__}: {e}); {self.compiler} compiles as usual")
            return None
        if artifact is None:
            self._count("absent")
            return None
        data = self._verified(kind, key, artifact)
        if isinstance(data, tuple):
            self._refuse(kind, key, *data)
            return None
        with self._lock:
            self._known.add((kind, key))
            self.counts["loaded"] += 1
        try:
            self._cache().note_artifact_use(kind, key)
        except Exception as e:  # noqa: BLE001 - bookkeeping: the load has succeeded
            log.debug("tunecache: a %s's load not counted: %r", self.noun, e)
        return data

    def publish(self, kind: str, key: str, data: bytes, torch_version: str) -> bool:
        """Sign and store ``data`` under (kind, key) unless an entry that verifies is
        there; True when this call published it (or replaced an entry that did not
        verify). A consumer (no private key) publishes nothing."""
        if self._signer is None:
            return False
        with self._lock:
            if (kind, key) in self._known and not self.rewritable:
                return False
        store = self._artifacts()
        if store is None:
            return False
        try:
            payload = zlib.compress(data, _LEVEL)
            signature = self._signer.sign(kind, key, hashlib.sha256(payload).hexdigest())
            published = store.put(kind, key, payload, signature, torch_version)
        except StoreError as e:
            self._stop(e)
            return False
        except Exception as e:  # noqa: BLE001 - an entry not shared is compiled elsewhere
            self._warn_once("write", f"tunecache: publishing a {self.noun} failed "
                            f"({type(e).__name__}: {e}); it stays in {self.compiler}'s local "
                            "cache")
            return False
        outcome = "published" if published else "present"
        if not published:
            try:
                if self.rewritable:
                    outcome = self._rewrite(store, kind, key, payload, signature, torch_version)
                    published = outcome == "rewritten"
                elif self._reclaim(store, kind, key, payload, signature, torch_version):
                    outcome, published = "replaced", True
            except StoreError as e:
                self._stop(e)
                return False
            except Exception as e:  # noqa: BLE001 - the entry stays as it was
                self._warn_once("write", f"tunecache: replacing a {self.noun} failed "
                                f"({type(e).__name__}: {e}); it stays in {self.compiler}'s "
                                "local cache")
                return False
        with self._lock:
            self._known.add((kind, key))
            self.counts[outcome] += 1
        return published

    def _rewrite(self, store: ArtifactStore, kind: str, key: str, payload: bytes,
                 signature: bytes, torch_version: str) -> str:
        """A rewritable entry is there: swap it for ours unless it holds the same bytes
        ("present"); "rewritten" when this call did. The swap is on the row as read, so
        of two jobs writing at once one wins whole; one that loses a few times in a row
        leaves the entry to the other ("raced")."""
        digest = hashlib.sha256(payload).hexdigest()
        for _ in range(3):
            found, old_digest, old_signature = self._examine(store, kind, key)
            if found is None:
                if store.put(kind, key, payload, signature, torch_version):
                    return "rewritten"  # pruned meanwhile: published afresh
                continue
            if old_digest == digest and old_signature == signature:
                return "present"
            if store.replace(kind, key, old_digest, old_signature, payload, signature,
                             torch_version):
                return "rewritten"
        return "raced"

    def _examine(self, store: ArtifactStore, kind: str, key: str
                 ) -> tuple[Artifact | str | None, Any, Any]:
        """The row a publish found there, read within the kind's bound as load() reads
        it."""
        if self.max_stored_bytes is None:
            return store.examine(kind, key)
        return store.examine(kind, key, limit=self.max_stored_bytes)

    def _reclaim(self, store: ArtifactStore, kind: str, key: str, payload: bytes,
                 signature: bytes, torch_version: str) -> bool:
        """Our publish found (kind, key) taken: if the entry there is one load() refuses
        (signed with a retired key, planted, damaged), it would block the key for every
        job forever, so replace it with ours, only if it is still the row we read. True
        when this call replaced it."""
        found, old_digest, old_signature = self._examine(store, kind, key)
        if found is None:
            return False  # deleted meanwhile (a prune): the next compile publishes it
        if not isinstance(found, str):
            refused = self._verified(kind, key, found)
            if not isinstance(refused, tuple):
                return False  # a good entry is never replaced
            found = refused[1]
        if not store.replace(kind, key, old_digest, old_signature, payload, signature,
                             torch_version):
            return False  # another publisher replaced it first (or a prune deleted it)
        with self._lock:
            first = "replaced" not in self._warned
            self._warned.add("replaced")
        log.log(logging.INFO if first else logging.DEBUG,
                "tunecache: %s in the database was refused (%s); replaced with this "
                "job's (further replacements are logged at debug level)",
                self.entry_name(kind, key), found)
        return True

    def _verified(self, kind: str, key: str, artifact: Artifact) -> bytes | tuple[str, str]:
        """The entry's decompressed bytes if it verifies with our public key, else (reason,
        what is wrong) for the one warning per reason."""
        # The digest of the bytes read, not the one stored beside them: the signature
        # must cover exactly what would be unpickled.
        digest = hashlib.sha256(artifact.payload).hexdigest()
        if not artifact.signature:
            return "unsigned", "is not signed"
        if not self._verifier.verify(kind, key, digest, artifact.signature):
            return ("signature", f"does not verify with the public key {self.fingerprint} "
                    "(altered, moved from another key, or signed with another key)")
        data = _decompress(artifact.payload, self.max_bytes)
        if data is None:
            return "payload", "is signed but does not decompress"
        return data

    # -- helpers

    def entry_name(self, kind: str, key: str) -> str:
        """An entry as messages name it: the noun, the kind, the key's start."""
        return f"{self.noun} {kind} {key[:24]}"

    def _artifacts(self) -> ArtifactStore | None:
        if self._off is not None:
            return None
        try:
            db = self._cache().database()
        except Exception as e:  # noqa: BLE001 - the cache could not be opened
            self._stop(e)
            return None
        if db is None:
            return None  # the tuning cache has warned why it does not use the database
        with self._lock:
            if self._store is None or self._store.db is not db:
                from ..store.artifacts import ArtifactStore  # SQLAlchemy: first use only

                self._store = ArtifactStore(db)
            return self._store

    def _count(self, what: str) -> None:
        with self._lock:  # a compiler may load entries on several threads
            self.counts[what] += 1

    def _refuse(self, kind: str, key: str, reason: str, what: str) -> None:
        self._count("refused")
        self._warn_once(
            reason,
            f"tunecache: {self.entry_name(kind, key)} in the database {what}; it is "
            f"ignored and {self.compiler} compiles it as usual (`tunecache prune` removes "
            "such entries; further ones are logged at debug level)")
        return None

    def _stop(self, error: BaseException) -> None:
        with self._lock:
            first = self._off is None
            self._off = str(error) or type(error).__name__
        if first:
            log.warning("tunecache: %ss are not shared in this process from now on: %s",
                        self.noun, error)

    def _warn_once(self, reason: str, message: str) -> None:
        with self._lock:
            first = reason not in self._warned
            self._warned.add(reason)
        log.log(logging.WARNING if first else logging.DEBUG, "%s", message)


def _decompress(payload: bytes, limit: int) -> bytes | None:
    """The decompressed bytes, or None if they are not one whole zlib stream of at most
    ``limit`` bytes."""
    inflater = zlib.decompressobj()
    try:
        data = inflater.decompress(payload, limit)
    except zlib.error:
        return None
    if inflater.unconsumed_tail or not inflater.eof or inflater.unused_data:
        return None
    return data

"""Compiled Triton kernels shared through the database, signed, across graphs and nodes.

Triton asks a cache manager for a kernel's compiled files before it compiles one
(``triton.compile``: ``get_group("<name>.json")`` under Triton's own key, a hash of the
kernel's source, its options, the target GPU and Triton's version) and hands it the files
after (``put`` each, then ``put_group``). The class is named by ``TRITON_CACHE_MANAGER=
module:Class``, read at every compile, so Inductor's compile workers, which inherit the
environment, use it too (read in triton 3.6, ``runtime/cache.py`` and
``compiler/compiler.py``). :class:`KernelCacheManager` keeps Triton's local layout (the
files under ``<cache dir>/<key>/``, a group as ``__grp__<name>.json``), so Inductor's own
use of that directory (the kernels it bundles into FX graph entries) is unchanged, and:

- ``get_group``: the local directory first (a hit never asks the database); on a miss, the
  database's entry for the key, **only if its signature verifies** with the operator's
  key (:class:`tunecache.core.kernels.KernelShare`, kind ``kernel``); its files are written
  locally, then Triton loads them. An entry that is unsigned, altered or signed with
  another key is one warning, and Triton compiles as usual: nothing of it is written.
- ``put_group``: after the local write, the group's files are published, signed. The first
  publish of a key wins; a second process that compiled the same kernel writes nothing.
  Kernels Inductor names (``triton_...``) are the exception: Inductor compiles most of
  them only to benchmark them (template and fusion candidates, every config of a kernel
  it autotunes), and no later job compiles those. They stay local, and a graph's kernel is
  published once Inductor keeps it (:func:`publish_kept`, called by
  ``tunecache.inductor.kernel_sharing`` when a kernel's launcher is chosen).

- ``get_file``/``put`` of a Python extension module Triton builds with the host's C
  compiler (``runtime/build.py``: the driver's utilities, and in Triton 3.6 one launcher
  per kernel signature, each a compiler run of a fraction of a second): the same, one
  signed file per entry. A new node otherwise compiles one launcher per kernel it
  loads, which a restart on the same node finds in its cache directory. Triton keys such
  a module by its C source and the platform (machine and OS; Triton 3.8 adds the include
  and library directories), and its file name carries the Python ABI, which an entry
  must match. A module that does not load on this host (an older C library) is Triton's
  to handle: it warns, builds its own and keeps it locally.

Files of other kinds (Triton's autotuning cache, its dumps) stay local. The
service is built once per process (:func:`share`), over the process's one cache and its
settings (:data:`tunecache.process.PROCESS`: in a compile worker, TUNECACHE_* as the
autoload hook read them from the environment it inherited). Nothing here raises into
Triton: a database that fails turns kernel sharing off in the process with one warning,
and Triton compiles as it would alone.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import sysconfig
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import stored_json
from .files import read_regular
from .process import PROCESS

if TYPE_CHECKING:  # pragma: no cover - typing only
    from .core.kernels import KernelShare

try:  # Triton checks that the class it is named descends from one named CacheManager.
    from triton.runtime.cache import CacheManager as _TritonCacheManager
except ImportError:  # no Triton (a CPU-only torch): nothing will ask for this class
    _TritonCacheManager = object

__all__ = ["MANAGER_VAR", "MANAGER", "KIND", "KernelCacheManager", "pack", "unpack", "share",
           "serve", "stop_serving", "publish_kept", "forget_ptxas_version"]

log = logging.getLogger("tunecache")

# The variable Triton reads its cache manager's class from, and the value that selects
# this module's (tunecache._autoload spells both out, so as not to import this module at
# `import torch`).
MANAGER_VAR = "TRITON_CACHE_MANAGER"
MANAGER = f"{__name__}:KernelCacheManager"
KIND = "kernel"
_MAGIC = b"TCK1"
# What one entry may hold: Triton writes one file per stage (source, ttir, ttgir, llir,
# ptx, cubin, json: 7 on NVIDIA); names are Triton's, "<kernel name>.<stage>".
MAX_FILES = 32
# \Z, not $: "$" also matches before a final newline, which would let "name\n" through.
_FILE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,199}\Z")
_GROUP = "__grp__"
# How the modules Triton builds from C source end (build.py names them "<name><suffix>").
_LIBRARY_SUFFIX = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
# Inductor names a graph's kernels triton_<kind>_<fused ops>_<n>, and where kernels are
# shared n is a 16-digit hash of the kernel's source (tunecache.inductor.kernel_sharing).
# What it compiles only to benchmark is named otherwise: GEMM template candidates
# ("triton_mm", "triton_bmm", ...) and fusion candidates ("triton_"). A later job reads
# their stored timings and never generates them, so publishing them fills the database
# with entries nobody loads (hundreds per recording against tens of graph kernels).
_INDUCTOR_KERNEL = "triton_"
_GRAPH_KERNEL = re.compile(r"triton_\w*_[0-9a-f]{16}\Z")
# A pack's header lists at most MAX_FILES names of 200 characters and their lengths; a
# local group file maps as many names to paths.
_MAX_HEADER = 64 * 1024


def _safe_name(name: Any) -> bool:
    return isinstance(name, str) and bool(_FILE_NAME.match(name)) \
        and not name.startswith(_GROUP) and ".." not in name


def _is_library(filename: str) -> bool:
    return filename.endswith(_LIBRARY_SUFFIX) and _safe_name(filename)


def pack(group: str, files: dict[str, bytes]) -> bytes:
    """The bytes stored for one kernel: ``TCK1``, a JSON header (the group's name and each
    file's name and length), a newline, then the files' bytes in that order."""
    names = sorted(files)
    header = json.dumps({"group": group, "files": [[n, len(files[n])] for n in names]},
                        sort_keys=True)
    return _MAGIC + header.encode() + b"\n" + b"".join(files[n] for n in names)


def unpack(data: bytes) -> tuple[str, dict[str, bytes]] | None:
    """(group name, files) from verified bytes, or None if they are not a well-formed
    entry: every name a plain file name, the lengths adding up, the group's own file
    among them."""
    if not data.startswith(_MAGIC):
        return None
    head, sep, body = data[len(_MAGIC):].partition(b"\n")
    try:
        header = stored_json.loads(head, _MAX_HEADER) if sep else None
    except stored_json.StoredJSONError:
        return None
    if not isinstance(header, dict) or not _safe_name(header.get("group")):
        return None
    listed = header.get("files")
    if not isinstance(listed, list) or not 0 < len(listed) <= MAX_FILES:
        return None
    files: dict[str, bytes] = {}
    at = 0
    for item in listed:
        if not (isinstance(item, list) and len(item) == 2 and _safe_name(item[0])
                and type(item[1]) is int and item[1] >= 0 and item[0] not in files):
            return None
        files[item[0]] = body[at:at + item[1]]
        at += item[1]
    if at != len(body) or header["group"] not in files:
        return None
    return header["group"], files


# -- the process's service ------------------------------------------------------------

def serve() -> None:
    """Name this module's manager in TRITON_CACHE_MANAGER, which Triton reads at every
    compile here and in the compile workers (they inherit the environment), and share
    kernels from the process's one cache (:data:`tunecache.process.PROCESS`'s opener).
    :func:`stop_serving` puts both back."""
    service = PROCESS.kernels
    with service.lock:
        if not service.serving:
            service.serving, service.manager_was = True, os.environ.get(MANAGER_VAR)
        os.environ[MANAGER_VAR] = MANAGER
        service.share, service.built = None, False
        service.kept.clear()


def stop_serving() -> bool:
    """Undo :func:`serve` (the process's settings build the service again at next use);
    returns whether it was in effect."""
    service = PROCESS.kernels
    with service.lock:
        if not service.serving:
            return False
        if service.manager_was:
            os.environ[MANAGER_VAR] = service.manager_was
        else:
            os.environ.pop(MANAGER_VAR, None)
        service.serving, service.manager_was = False, None
        service.share, service.built = None, False
        service.kept.clear()
        return True


def share() -> KernelShare | None:
    """This process's kernel service, or None where kernels are not shared (no key
    configured, kernels not in TUNECACHE_SHARE, TUNECACHE_MODE=off, or a setting it cannot
    use)."""
    service = PROCESS.kernels
    with service.lock:
        if not service.built:
            service.share = _build()
            service.built = True
        found: KernelShare | None = service.share
        return found


def _build() -> KernelShare | None:
    """The service of the process's settings, over its one cache opener (a compile worker
    reads the settings the autoload hook read from the environment it inherited)."""
    try:
        opener = PROCESS.opener
        settings = opener.settings if opener is not None else PROCESS.environment_settings()
        plan = settings.kernel_sharing()
        if plan.state not in ("publish", "verify"):
            return None
        from .core.kernels import KernelShare

        return KernelShare.from_settings(plan, PROCESS.cache_opener(settings))
    except Exception as e:  # noqa: BLE001 - Triton compiles as it would alone
        log.warning("tunecache: compiled kernels are not shared in this process: %s", e)
        return None


def _record_use() -> None:
    """Write the load's use now: a compile worker may be ended with its job before the
    periodic write (usage is what `tunecache prune` keeps by, and what `stats` counts)."""
    try:
        if PROCESS.opener is not None:
            PROCESS.opener().flush_usage()
    except Exception as e:  # noqa: BLE001 - bookkeeping: the kernel has loaded
        log.debug("tunecache: a kernel's use not recorded: %r", e)


def publish_kept(key: str) -> bool:
    """Publish the graph kernel Triton compiled under ``key``, from the local cache
    directory, now that Inductor keeps it for a graph; returns whether a kernel was
    found there to publish. Candidates (names without a content suffix) never are.
    Never raises: the kernel has loaded either way."""
    service = share()
    if service is None or not service.publishes or not _safe_name(key):
        return False
    with PROCESS.kernels.lock:
        if key in PROCESS.kernels.kept:  # coordinate descent may hand the same launcher again
            return False
        PROCESS.kernels.kept.add(key)
    found = False
    try:
        manager = KernelCacheManager(key)
        for path in sorted(Path(manager.cache_dir).glob(_GROUP + "*.json")):
            filename = path.name[len(_GROUP):]
            if _GRAPH_KERNEL.match(filename.removesuffix(".json")) is None:
                continue
            group = manager._local_group(filename)
            if group is not None and filename in group:
                manager._publish(filename, group)
                found = True
    except Exception as e:  # noqa: BLE001 - called from Inductor's compile: never raise into it
        log.debug("tunecache: kernel %s not published: %r", key, e)
    return found


def forget_ptxas_version() -> None:
    """Have Triton read ptxas's version again after TRITON_PTXAS_PATH changed: its CUDA
    backend reads it once per process (``get_ptxas_version``, cached) and puts it in every
    kernel's cache key. Nothing to forget where that backend is not loaded yet."""
    backend = sys.modules.get("triton.backends.nvidia.compiler")
    clear = getattr(getattr(backend, "get_ptxas_version", None), "cache_clear", None)
    if callable(clear):
        clear()


def _versions_label() -> str:
    """The stored entry's version label: torch's and Triton's, where loaded."""
    triton = sys.modules.get("triton")
    torch = sys.modules.get("torch")
    parts = [f"torch {torch.__version__}" if torch is not None else "",
             f"triton {getattr(triton, '__version__', '?')}" if triton is not None else ""]
    return " ".join(p for p in parts if p) or "unknown"


# -- Triton's cache manager -----------------------------------------------------------

def _cache_root(override: bool, dump: bool) -> str:
    """Triton's directory for the cache (or its override or dump directory), as its
    knobs resolve it; the environment's default where Triton is not importable."""
    try:
        from triton import knobs

        found = knobs.cache.override_dir if override else knobs.cache.dump_dir if dump \
            else knobs.cache.dir
        if found:
            return str(found)
    except (ImportError, AttributeError):  # an older or absent Triton: its documented default
        pass
    var = "TRITON_OVERRIDE_DIR" if override else "TRITON_DUMP_DIR" if dump \
        else "TRITON_CACHE_DIR"
    home = os.environ.get("TRITON_HOME") or os.path.expanduser("~")
    return os.environ.get(var) or os.path.join(
        home, ".triton", "override" if override else "dump" if dump else "cache")


class KernelCacheManager(_TritonCacheManager):
    """Triton's cache manager: its local directory, then the database (module docstring).
    Triton makes one per compile, for one key."""

    def __init__(self, key: str, override: bool = False, dump: bool = False) -> None:
        self.key = key
        # Overridden and dumped kernels are a developer's local files, never shared.
        self.shared = not (override or dump)
        self.cache_dir = os.path.join(_cache_root(override, dump), key)
        if not override:
            os.makedirs(self.cache_dir, exist_ok=True)

    # -- Triton's four calls

    def get_file(self, filename: str) -> str | None:
        path = os.path.join(self.cache_dir, filename)
        if os.path.exists(path):
            return path
        if self.shared and _is_library(filename):
            return self._fetch_library(filename)
        return None

    def put(self, data: bytes | str, filename: str, binary: bool = True) -> str:
        path = self._write(data, filename)
        if self.shared and _is_library(filename):
            self._publish(filename, {filename: path})
        return path

    def get_group(self, filename: str) -> dict[str, str] | None:
        local = self._local_group(filename)
        if local is not None or not self.shared:
            return local
        return self._fetch(filename)

    def put_group(self, filename: str, group: dict[str, str]) -> str:
        path = self._put_local_group(filename, group)
        if self.shared and not filename.startswith(_INDUCTOR_KERNEL):
            self._publish(filename, group)
        return path

    # -- helpers

    def _write(self, data: bytes | str, filename: str) -> str:
        """Write one file atomically (a temporary directory, then a rename), as Triton's
        own manager does: a reader never sees a partial file."""
        raw = data if isinstance(data, bytes) else str(data).encode()
        path = os.path.join(self.cache_dir, filename)
        temp_dir = os.path.join(self.cache_dir, f"tmp.pid_{os.getpid()}_{uuid.uuid4()}")
        os.makedirs(temp_dir, exist_ok=True)
        temp = os.path.join(temp_dir, filename)
        with open(temp, "wb") as f:
            f.write(raw)
        os.replace(temp, path)
        os.removedirs(temp_dir)
        return path

    def _put_local_group(self, filename: str, group: dict[str, str]) -> str:
        return self._write(json.dumps({"child_paths": group}), _GROUP + filename)

    def _local_group(self, filename: str) -> dict[str, str] | None:
        path = os.path.join(self.cache_dir, _GROUP + filename)
        if not os.path.exists(path):
            return None
        # Anyone who can write Triton's cache directory can leave a FIFO here (a plain
        # open would wait for a writer forever) or a symlink to /dev/zero: opened without
        # blocking or following a link, a regular file only, read up to a bound.
        try:
            raw, _ = read_regular(path, _MAX_HEADER + 1)
            value = stored_json.loads(raw, _MAX_HEADER)
        except (OSError, stored_json.StoredJSONError):
            return None
        children = value.get("child_paths") if isinstance(value, dict) else None
        if not isinstance(children, dict):
            return None
        return {name: p for name, p in children.items()
                if isinstance(p, str) and os.path.exists(p)}

    def _fetch(self, filename: str) -> dict[str, str] | None:
        files = self._stored_files(filename)
        if files is None:
            return None
        try:
            paths = {name: self._write(raw, name) for name, raw in files.items()}
            self._put_local_group(filename, paths)
        except OSError as e:
            log.debug("tunecache: kernel %s not written locally: %r", self.key, e)
            return None
        _record_use()
        return paths

    def _fetch_library(self, filename: str) -> str | None:
        files = self._stored_files(filename)
        if files is None or set(files) != {filename}:
            return None
        try:
            path = self._write(files[filename], filename)
        except OSError as e:
            log.debug("tunecache: module %s not written locally: %r", self.key, e)
            return None
        _record_use()
        return path

    def _stored_files(self, filename: str) -> dict[str, bytes] | None:
        """The files of the database's entry for this key, if it verifies and is the
        entry of ``filename``."""
        service = share()
        if service is None:
            return None
        data = service.load(KIND, self.key)  # None unless its signature verified
        if data is None:
            return None
        entry = unpack(data)
        if entry is None or entry[0] != filename:
            # Signed with our key, yet not an entry of this shape for this file: a newer
            # tunecache's, or a key holder's mistake. Triton compiles it.
            log.debug("tunecache: kernel %s in the database is not one for %s",
                      self.key, filename)
            return None
        return entry[1]

    def _publish(self, filename: str, group: dict[str, str]) -> None:
        service = share()
        if service is None or not service.publishes:
            return
        from .core.kernels import MAX_KERNEL_BYTES

        root = Path(self.cache_dir).resolve()
        files: dict[str, bytes] = {}
        left = MAX_KERNEL_BYTES
        try:
            for name, path in group.items():
                resolved = Path(path).resolve()
                # Only files under their own names in this key's directory. A kept kernel's
                # group is read back from that directory, which anyone who can write it
                # may have changed: each file is opened without blocking (a FIFO) and read
                # up to what an entry may hold.
                if resolved.parent != root or not _safe_name(name) \
                        or resolved.name != name or len(files) >= MAX_FILES:
                    log.debug("tunecache: kernel %s not published (file %r)", self.key, name)
                    return
                data, _ = read_regular(resolved, left + 1)
                if len(data) > left:
                    log.debug("tunecache: kernel %s not published (over %d bytes)", self.key,
                              MAX_KERNEL_BYTES)
                    return
                files[name] = data
                left -= len(data)
        except OSError as e:
            log.debug("tunecache: kernel %s not published: %r", self.key, e)
            return
        if filename not in files:
            return
        service.publish(KIND, self.key, pack(filename, files), _versions_label())

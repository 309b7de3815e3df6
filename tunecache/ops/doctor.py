"""The doctor's checks: is this cache set up so that a cluster can share it safely?

Each check says ok, warn or fail, in one line, with a one-line fix. The doctor never
writes to the database: SQLite is opened read-only through its own connection (the
engine's connect hook sets journal_mode, which would convert a WAL database), and
PostgreSQL is only read (tunecache.store.probe). On a SQLite path it creates, locks and
removes one scratch file beside the database, because whether POSIX locks work there can
only be learned by taking one.
"""

from __future__ import annotations

import dataclasses
import errno
import fcntl
import os
import stat
import time
import uuid
from typing import Any, Literal

from ..errors import SchemaTooNewError, SigningKeyError, TuneCacheError
from ..parts import REMOTE_FLAGS
from ..settings import Settings, default_db_path, unknown_variables
from ..store import Database, probe
from ..store.migrate import current_revision, head_revision, known_revisions

__all__ = ["Check", "run_checks", "NETWORK_FILESYSTEMS", "filesystem_of", "write_problem"]

Status = Literal["ok", "warn", "fail"]

# Filesystems whose files other hosts see (fstype as /proc/mounts spells it). fuse.* are
# matched by prefix: sshfs, juicefs, s3fs, gcsfuse, glusterfs, ... all serve many hosts.
NETWORK_FILESYSTEMS = frozenset({
    "nfs", "nfs4", "lustre", "gpfs", "cifs", "smb3", "smbfs", "beegfs", "ceph", "cephfs",
    "glusterfs", "9p", "afs", "ocfs2", "gfs2", "panfs", "wekafs", "orangefs", "pvfs2",
    "virtiofs", "davfs", "ncpfs", "fuse",
})


@dataclasses.dataclass(frozen=True)
class Check:
    name: str
    status: Status
    message: str
    fix: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def filesystem_of(path: str, mounts_file: str = "/proc/mounts") -> tuple[str, str]:
    """(mount point, fstype) of the mount holding ``path``: the longest matching prefix."""
    real = os.path.realpath(path)
    best = ("/", "unknown")
    try:
        with open(mounts_file, encoding="utf-8", errors="replace") as f:
            for line in f:
                parts = line.split()
                if len(parts) < 3:
                    continue
                # /proc/mounts escapes spaces and the like as octal (\040).
                point = parts[1].encode().decode("unicode_escape")
                inside = real == point or real.startswith(point.rstrip("/") + "/")
                if inside and len(point) >= len(best[0]):
                    best = (point, parts[2])
    except OSError:
        pass
    return best


def is_network_fs(fstype: str) -> bool:
    return fstype in NETWORK_FILESYSTEMS or fstype.startswith("fuse.")


def _lock_works(path: str) -> tuple[bool | None, str]:
    """Does a POSIX lock taken here stop another process? (True, False, or None: error).

    The parent holds an exclusive fcntl lock on ``path``; a forked child tries a
    non-blocking one and reports whether it was refused. SQLite's own locking is fcntl
    byte-range locks, so this is the property it needs (on one host; across hosts the
    filesystem's lock manager must also be mounted: nfs ``nolock``/``local_lock`` break it).
    """
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o660)
    try:
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            return None, f"taking a lock failed: {os.strerror(e.errno or 0)}"
        pid = os.fork()
        if pid == 0:  # child: exit 0 = refused (locks work), 1 = got it, 2 = error
            code = 2
            try:
                child_fd = os.open(path, os.O_RDWR)
                try:
                    fcntl.lockf(child_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    code = 1
                except OSError as e:
                    code = 0 if e.errno in (errno.EACCES, errno.EAGAIN) else 2
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        code = os.waitstatus_to_exitcode(status)
        if code == 0:
            return True, "a lock held by one process stops another"
        if code == 1:
            return False, "a second process took a lock that another held"
        return None, "the lock test's child process failed"
    finally:
        os.close(fd)


def write_problem(path: str, error: int) -> tuple[str, str]:
    """(what is wrong, the fix) when this user cannot open ``path`` for writing, by the
    errno that opening it gave: a group mode asks for chmod, but an immutable file or a
    read-only mount would refuse root as well, and chmod would change nothing."""
    if error == errno.EPERM:
        return (f"{path} cannot be written by anyone: it is immutable or append-only (a "
                "file attribute; lsattr shows it)", f"as root: chattr -i -a {path}")
    if error == errno.EROFS:
        return (f"{path} is on a filesystem mounted read-only",
                "remount it read-write, or point --db / TUNECACHE_DB at a writable one")
    return (f"this user cannot read and write {path}",
            f"chmod g+rw {path} and add this user to its group")


def _open_error(path: str) -> int | None:
    """The errno of opening ``path`` for reading and writing (nothing is written), or
    None if it opens."""
    try:
        os.close(os.open(path, os.O_RDWR))
    except OSError as e:
        return e.errno or errno.EACCES
    return None


def _describe_mode(st: os.stat_result) -> str:
    return stat.filemode(st.st_mode)


class _Doctor:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.checks: list[Check] = []

    def add(self, name: str, status: Status, message: str, fix: str | None = None) -> None:
        self.checks.append(Check(name, status, message, fix))

    def schema(self, revision: str | None, display: str) -> None:
        head = head_revision()
        if revision == head:
            self.add("schema", "ok", f"revision {revision} (this tunecache's head)")
        elif revision is None:
            self.add("schema", "warn", f"no tunecache schema yet (head is {head})",
                     "run `tunecache upgrade` (readwrite processes also create it on first use)")
        elif revision not in known_revisions():
            self.add("schema", "fail", str(SchemaTooNewError(display, revision)),
                     "pip install -U tunecache on this host")
        else:
            self.add("schema", "warn", f"revision {revision}, older than this tunecache's {head}",
                     "run `tunecache upgrade` (readonly processes refuse an old schema)")

    def variables(self, environ: Any) -> None:
        unknown = unknown_variables(environ)
        if unknown:
            names = ", ".join(name + (f" (did you mean {near}?)" if near else "")
                              for name, near in unknown)
            self.add("variables", "warn", f"not tunecache settings, ignored: {names}",
                     "rename or unset them")
        renamed = [n.removeprefix("tunecache: ") for n in self.settings.notices
                   if "is renamed" in n or "is replaced by" in n]
        if renamed:
            self.add("renamed", "warn", "; ".join(renamed),
                     "set TUNECACHE_SHARE / TUNECACHE_LEVERS instead (docs/configuration.md)")

    def graphs(self) -> None:
        """Compiled graph and kernel sharing as jobs will set it up: the settings, and
        the key files loaded with the checks jobs apply (readable, not writable by other
        users, a private key not readable by all, a matching pair)."""
        from ..core.graphs import GraphShare

        plan = self.settings.graph_sharing()
        kernels = "on" if self.settings.shares("kernels") \
            else "off (TUNECACHE_SHARE without kernels)"
        if plan.state == "invalid":
            self.add("graphs", "fail", f"graph and kernel sharing off: {plan.problem}",
                     "fix TUNECACHE_SIGNING_KEY / TUNECACHE_VERIFY_KEY")
            return
        if plan.state == "off":
            self.add("graphs", "ok", "graph and kernel sharing off (TUNECACHE_SHARE without "
                     "graphs, or TUNECACHE_MODE=off)")
            return
        if plan.state == "unconfigured":
            self.add("graphs", "ok", "graph and kernel sharing off: no key set (tuning is "
                     "shared; `tunecache keygen DIR` and TUNECACHE_SIGNING_KEY share graphs)")
            return
        try:
            share = GraphShare.from_settings(plan, _no_cache)
        except SigningKeyError as e:
            var = "TUNECACHE_SIGNING_KEY" if e.path == plan.signing_key else "TUNECACHE_VERIFY_KEY"
            self.add("graphs", "fail", f"{var}: {e}", f"fix the key file, or unset {var}")
            return
        what = "sign and publish, and load" if share.publishes else "load (publish none)"
        self.add("graphs", "ok", f"{what} graphs signed by key {share.fingerprint}; "
                 f"kernels {kernels}")

    def libraries(self) -> None:
        """The torch and Triton versions, and each part: on, or why it would be off in a
        job on this host (its probe failed, its library is missing, the settings)."""
        from ..switch import PARTS, _wanted
        from .libraries import report

        data = report([e.name for e in PARTS if _wanted(e, self.settings)])
        if "error" in data:
            self.add("libraries", "warn", f"could not probe torch and Triton: {data['error']}")
            return
        torch_v, triton_v = data["torch"] or "not installed", data["triton"] or "not installed"
        keyed = {"graphs": self.settings.graph_sharing().state,
                 "kernels": self.settings.graph_sharing().state,
                 "profiles": self.settings.pgo_sharing().state}
        for part in data["parts"]:
            if part["on"] and keyed.get(part["name"], "publish") not in ("publish", "verify"):
                part["on"], part["why"] = False, "not asked for (no key: the graphs check)"
        on = [p["name"] for p in data["parts"] if p["on"]]
        self.add("libraries", "warn" if data["untested"] else "ok",
                 f"torch {torch_v}, Triton {triton_v}; parts on: {', '.join(on) or 'none'}",
                 data["untested"])
        for part in data["parts"]:
            if not part["on"]:
                asked = not part["why"].startswith("not asked for")
                self.add(f"part {part['name']}", "warn" if asked else "ok",
                         f"{part['what']}: off ({part['why']})")

    def remote_flags(self, environ: Any) -> None:
        """torch's remote-cache flags tunecache turns on only where they are unset: one
        set to 0 in the environment is kept, and what it shares is then not shared."""
        off = [(variable, what) for variable, what in REMOTE_FLAGS.values()
               if environ.get(variable) == "0"]
        if not off:
            self.add("remote flags", "ok", "none of torch's remote-cache flags is turned off "
                     "in the environment (tunecache turns on those left unset)")
            return
        kept = "; ".join(f"{variable}=0 (so {what} are not shared)" for variable, what in off)
        self.add("remote flags", "warn", f"kept as set: {kept}",
                 "unset them to share through tunecache (tunecache never overrides a 0)")

    def pgo(self) -> None:
        """Dynamo's shape profiles (``profiles`` in TUNECACHE_SHARE), with the graphs'
        keys (checked above)."""
        plan = self.settings.pgo_sharing()
        if plan.state == "invalid":
            self.add("pgo", "fail", f"shape profiles off: {plan.problem}",
                     "fix the key settings (the graphs check)")
        elif plan.state in ("publish", "verify"):
            what = "publish and load" if plan.state == "publish" else "load (publish none)"
            self.add("pgo", "ok", f"{what} Dynamo's shape profiles, with the graphs' key; "
                     "jobs of one model need one TORCH_COMPILE_JOB_ID")
        elif plan.state == "unconfigured":
            self.add("pgo", "ok", "shape profiles not shared: no key set (the graphs check)")
        else:
            self.add("pgo", "ok", "shape profiles not shared (TUNECACHE_SHARE without "
                     "profiles)")

    # -- PostgreSQL ----------------------------------------------------------------------

    def postgresql(self) -> None:
        db = Database(self.settings.db_url, min(self.settings.lock_seconds, 10.0))
        try:
            try:
                revision = db.run(current_revision)
            except TuneCacheError as e:
                self.add("reachable", "fail", str(e),
                         "check host, port, database name and credentials in TUNECACHE_DB, "
                         "and that the server accepts this host (pg_hba.conf)")
                return
            version = probe.pg_server_version(db)
            self.add("reachable", "ok", f"{db.display_url} (PostgreSQL {version})")
            user, superuser = probe.pg_login(db)
            if superuser:
                self.add("login", "warn", f"connected as {user}, a superuser: the role's "
                         "CONNECTION LIMIT and the database's do not bind it, so a cold job "
                         "can take every connection the server has",
                         "give tunecache a role of its own: CREATE ROLE tunecache LOGIN; "
                         "CREATE DATABASE tunecache OWNER tunecache CONNECTION LIMIT n; "
                         "and name it in TUNECACHE_DB")
            else:
                self.add("login", "ok", f"connected as {user} (not a superuser)")
            self.schema(revision, db.display_url)
            self.pg_clock(db)
        finally:
            db.dispose()

    def pg_clock(self, db: Database) -> None:
        t0 = time.time()
        server = probe.server_time(db)
        t1 = time.time()
        skew = server - (t0 + t1) / 2
        rtt = t1 - t0
        # Leases and ages are stamped with the server's clock (now()), so host skew does
        # not break claims; it only makes ages in `stats` look off.
        msg = f"this host is {abs(skew):.3f}s {'behind' if skew > 0 else 'ahead of'} the " \
              f"database server (round trip {rtt * 1000:.1f} ms)"
        if abs(skew) < 1.0 + rtt:
            self.add("clock", "ok", msg)
        else:
            self.add("clock", "warn", msg + "; leases use the server's clock, so claims are safe",
                     "run NTP/chrony on this host and on the database server")

    # -- SQLite --------------------------------------------------------------------------

    def sqlite(self, path: str) -> None:
        directory = os.path.dirname(path) or "."
        exists = os.path.exists(path)
        if os.path.isdir(path):
            # SQLite would say "disk I/O error"; named as every other command names it.
            problem = Database(self.settings.db_url).sqlite_path_problem()
            self.add("reachable", "fail", f"{path}: {problem}",
                     "point --db / TUNECACHE_DB at a file")
            return
        if not os.path.isdir(directory) and self.settings.owns_directory:
            self.add("reachable", "warn", f"no database at {path} yet",
                     "jobs create it, and its directory, on first use (or run "
                     "`tunecache upgrade` now)")
            return
        if not os.path.isdir(directory):
            self.add("reachable", "fail", f"directory {directory} does not exist",
                     f"mkdir -p {directory} (with the shared group: chgrp, chmod g+ws)")
            return
        revision: str | None = None
        journal = None
        if not exists:
            self.add("reachable", "warn", f"no database file at {path} yet",
                     "it is created on first use, or run `tunecache upgrade` now")
        else:
            try:
                revision, journal = probe.sqlite_look(path)
                self.add("reachable", "ok", f"{path} (SQLite {probe.SQLITE_VERSION})")
            except Exception as e:  # noqa: BLE001 - any failure to read is the finding
                reason = str(getattr(e, "orig", e)).strip().splitlines()[0]
                self.add("reachable", "fail", f"{path}: {reason}",
                         "point --db / TUNECACHE_DB at a tunecache database (or a new path)")
                return
            self.schema(revision, f"sqlite:///{path}")
        mount, fstype = filesystem_of(directory)
        network = is_network_fs(fstype)
        if network:
            self.add("filesystem", "warn",
                     f"{fstype} (network filesystem, mounted at {mount})",
                     "SQLite is safe there only with working POSIX locks and no WAL (checked "
                     "below); for many hosts prefer PostgreSQL")
        else:
            self.add("filesystem", "ok", f"{fstype} (local, mounted at {mount})")
        scratch = os.path.join(directory, f".tunecache-doctor-{uuid.uuid4().hex[:8]}")
        try:
            self.locks(scratch, network)
            self.sqlite_clock(scratch, network)
        finally:
            try:
                os.unlink(scratch)
            except OSError:
                pass
        self.journal(journal, network)
        self.permissions(path, directory, exists)

    def locks(self, scratch: str, network: bool) -> None:
        try:
            works, message = _lock_works(scratch)
        except OSError as e:
            self.add("locks", "fail", f"cannot create a file in {os.path.dirname(scratch)}: "
                     f"{os.strerror(e.errno or 0)}", "make the directory writable for this user")
            return
        if works:
            note = " (on this host; other hosts need the filesystem's lock manager)" \
                if network else ""
            self.add("locks", "ok", f"POSIX locks work: {message}{note}")
        elif works is False:
            self.add("locks", "fail", f"POSIX locks do not work: {message}",
                     "remount without nolock/local_lock (NFS) or with -o flock (Lustre), "
                     "or use PostgreSQL")
        else:
            self.add("locks", "fail", f"POSIX locks unusable: {message}",
                     "remount with a lock manager, or use PostgreSQL")

    def sqlite_clock(self, scratch: str, network: bool) -> None:
        if not network:
            self.add("clock", "ok", "local filesystem: this host's clock stamps leases; "
                     "nothing to compare")
            return
        # On a network filesystem the file server stamps mtime: the difference to our
        # clock is the skew between this host and the server (the other hosts' reference).
        try:
            with open(scratch, "a", encoding="utf-8") as f:
                f.write("x")
            t0 = time.time()
            os.utime(scratch, None)  # "now" as the server sees it (NFS: set to server time)
            t1 = time.time()
            mtime = os.stat(scratch).st_mtime
        except OSError as e:
            self.add("clock", "warn", f"could not measure skew: {os.strerror(e.errno or 0)}")
            return
        skew = mtime - (t0 + t1) / 2
        msg = (f"this host is {abs(skew):.2f}s {'behind' if skew > 0 else 'ahead of'} "
               "the file server")
        # On SQLite every host stamps leases with its own clock: a host ahead by more than
        # a lease sees live claims as expired and takes them over.
        limit = self.settings.lease_seconds / 3
        if abs(skew) < 1.0:
            self.add("clock", "ok", msg)
        elif abs(skew) < limit:
            self.add("clock", "warn", msg, "run NTP/chrony on every host sharing the cache")
        else:
            self.add("clock", "fail",
                     msg + f" (over a third of the {self.settings.lease_seconds:g}s "
                     "lease: live claims can be taken over)",
                     "run NTP/chrony on every host, or use PostgreSQL (server time)")

    def journal(self, journal: str | None, network: bool) -> None:
        if journal is None:
            return
        journal = journal.lower()
        if journal == "wal":
            if network:
                self.add("journal", "fail", "journal_mode=wal on a network filesystem: "
                         "WAL's index is shared memory, which other hosts cannot see",
                         "run: sqlite3 DB 'PRAGMA journal_mode=DELETE' with no job running")
            else:
                self.add("journal", "warn", "journal_mode=wal: only processes of this host can "
                         "share the file", "sqlite3 DB 'PRAGMA journal_mode=DELETE' to share it")
        else:
            self.add("journal", "ok", f"rollback journal ({journal} in the file; tunecache "
                     "uses TRUNCATE per connection)")

    def permissions(self, path: str, directory: str, exists: bool) -> None:
        dst = os.stat(directory)
        problems: list[str] = []
        fixes: list[str] = []
        if not os.access(directory, os.W_OK | os.X_OK):
            self.add("permissions", "fail", f"this user cannot create files in {directory} "
                     "(SQLite writes its journal beside the database)",
                     f"chmod g+w {directory} and add this user to its group")
            return
        error = _open_error(path) if exists else None
        if error is not None:
            self.add("permissions", "fail", *write_problem(path, error))
            return
        if os.path.realpath(path) == os.path.realpath(default_db_path()):
            # The embedded default lives in this user's own cache directory: a cache of
            # one user, whose directory is private on purpose. Group modes are for a
            # shared TUNECACHE_DB.
            self.add("permissions", "ok", "this user's default database (group sharing not "
                     "checked: set TUNECACHE_DB to a shared path to share a cache)")
            return
        # Other users of the cluster's group write the same file and create the journal.
        if not dst.st_mode & stat.S_IWGRP:
            problems.append(f"directory {_describe_mode(dst)} is not group-writable")
            fixes.append(f"chmod g+w {directory}")
        if not dst.st_mode & stat.S_ISGID:
            problems.append("directory has no setgid bit (new files get the creator's group)")
            fixes.append(f"chmod g+s {directory}")
        if exists:
            fst = os.stat(path)
            if not fst.st_mode & stat.S_IWGRP:
                problems.append(f"database {_describe_mode(fst)} is not group-writable")
                fixes.append(f"chmod g+rw {path}")
            if fst.st_gid != dst.st_gid:
                problems.append("database's group differs from the directory's")
                fixes.append(f"chgrp {dst.st_gid} {path}")
        if problems:
            self.add("permissions", "warn", "for a group-shared cache: " + "; ".join(problems),
                     "; ".join(fixes))
        else:
            self.add("permissions", "ok", f"group-shared (directory {_describe_mode(dst)})")


def _no_cache() -> Any:
    raise AssertionError("the doctor only loads the keys")  # never called: nothing shared


def run_checks(settings: Settings) -> list[Check]:
    """Every check for the database ``settings`` names; never writes to the database."""
    doctor = _Doctor(settings)
    doctor.add("settings", "ok", f"mode={settings.mode}, lease {settings.lease_seconds:g}s, "
               f"wait timeout {settings.wait_timeout:g}s")
    doctor.variables(os.environ)
    doctor.graphs()
    doctor.pgo()
    doctor.libraries()
    doctor.remote_flags(os.environ)
    if settings.is_postgresql:
        doctor.postgresql()
    else:
        doctor.sqlite(probe.sqlite_path_of(settings.db_url))
    return doctor.checks


"""tunecache doctor: each check's verdict and the exit code; the doctor never writes."""

from __future__ import annotations

import json
import os
import sqlite3

from cli_helpers import gemm_key, populate, run

from tunecache.ops import doctor
from tunecache.store.migrate import head_revision


def _checks(*args):
    result = run("doctor", *args, "--json")
    data = json.loads(result.stdout)
    return result.exit_code, {c["name"]: c for c in data["checks"]}, data


def test_doctor_healthy(db_url):
    populate(db_url, [gemm_key()])
    code, checks, data = _checks("--db", db_url)
    assert code == 0 and data["ok"] is True
    assert checks["reachable"]["status"] == "ok"
    assert checks["schema"]["status"] == "ok"
    assert checks["schema"]["message"] == f"revision {head_revision()} (this tunecache's head)"
    assert checks["clock"]["status"] == "ok"
    if db_url.startswith("sqlite"):
        assert checks["locks"]["status"] == "ok"
        assert checks["journal"]["status"] == "ok"
        assert checks["filesystem"]["status"] == "ok"


def test_doctor_human_output_and_fix_lines(sqlite_url, tmp_path):
    populate(sqlite_url, [gemm_key()])
    os.chmod(tmp_path, 0o755)
    result = run("doctor", "--db", sqlite_url)
    assert result.exit_code == 0
    lines = result.stdout.splitlines()
    assert lines[0].startswith("ok    settings     mode=readwrite")
    assert any(line.startswith("warn  permissions  for a group-shared cache: directory "
                               "drwxr-xr-x is not group-writable") for line in lines)
    fix = lines[lines.index(next(x for x in lines if x.startswith("warn  permissions"))) + 1]
    assert fix.startswith("                   fix: chmod g+w ")
    os.chmod(tmp_path, 0o2775)
    os.chmod(tmp_path / "tune.db", 0o664)
    _, checks, _ = _checks("--db", sqlite_url)
    assert checks["permissions"]["status"] == "ok"


def test_doctor_unreachable_postgresql_fails():
    code, checks, data = _checks("--db", "postgresql://127.0.0.1:1/x")
    assert code == 1 and data["ok"] is False
    assert checks["reachable"]["status"] == "fail"
    assert "pg_hba.conf" in checks["reachable"]["fix"]


def test_doctor_garbage_and_missing_files(tmp_path):
    garbage = tmp_path / "g.db"
    garbage.write_bytes(b"garbage" * 1000)
    code, checks, _ = _checks("--db", str(garbage))
    assert code == 1 and checks["reachable"]["message"] == f"{garbage}: file is not a database"
    missing = tmp_path / "new.db"
    code, checks, _ = _checks("--db", str(missing))
    assert code == 0 and checks["reachable"]["status"] == "warn"
    assert not missing.exists(), "the doctor must not create the database"
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".tunecache-doctor")]


def test_doctor_wal_on_network_filesystem_fails_and_is_not_changed(sqlite_url, tmp_path,
                                                                   monkeypatch):
    populate(sqlite_url, [gemm_key()])
    path = str(tmp_path / "tune.db")
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA journal_mode=WAL")
    monkeypatch.setattr(doctor, "filesystem_of", lambda p: ("/shared", "nfs4"))
    code, checks, _ = _checks("--db", sqlite_url)
    assert code == 1
    assert checks["filesystem"]["status"] == "warn"
    assert checks["filesystem"]["message"] == "nfs4 (network filesystem, mounted at /shared)"
    assert checks["journal"]["status"] == "fail"
    assert "journal_mode=DELETE" in checks["journal"]["fix"]
    assert checks["clock"]["status"] == "ok"  # mtime of a real file vs our clock
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_doctor_broken_locks_fail(sqlite_url, monkeypatch):
    populate(sqlite_url, [gemm_key()])
    monkeypatch.setattr(doctor, "_lock_works",
                        lambda p: (False, "a second process took a lock that another held"))
    code, checks, _ = _checks("--db", sqlite_url)
    assert code == 1 and checks["locks"]["status"] == "fail"
    assert "nolock" in checks["locks"]["fix"]


def test_filesystem_of_reads_mounts(tmp_path):
    mounts = tmp_path / "mounts"
    mounts.write_text("rootfs / ext4 rw 0 0\n"
                      "server:/export /shared nfs4 rw 0 0\n"
                      "lustre@tcp:/fs /shared/lustre lustre rw 0 0\n"
                      "sshfs#x /mnt/my\\040disk fuse.sshfs rw 0 0\n")
    assert doctor.filesystem_of("/shared/a/b.db", str(mounts)) == ("/shared", "nfs4")
    assert doctor.filesystem_of("/shared/lustre/x", str(mounts)) == ("/shared/lustre", "lustre")
    assert doctor.filesystem_of("/sharedx/y", str(mounts)) == ("/", "ext4")
    assert doctor.filesystem_of("/mnt/my disk/t.db", str(mounts)) == ("/mnt/my disk", "fuse.sshfs")
    assert all(doctor.is_network_fs(t) for t in ("nfs", "lustre", "gpfs", "cifs", "beegfs",
                                                 "fuse.sshfs"))
    assert not doctor.is_network_fs("ext4") and not doctor.is_network_fs("xfs")


def test_real_lock_probe(tmp_path):
    works, message = doctor._lock_works(str(tmp_path / "probe"))
    assert works is True, message


def test_doctor_does_not_ask_for_group_permissions_on_the_default_database(tmp_path,
                                                                            monkeypatch):
    """The embedded default ($XDG_CACHE_HOME/tunecache/tunecache.db) is one user's cache in
    a private directory: no group-sharing warning there; a shared path still gets one."""
    monkeypatch.delenv("TUNECACHE_DB", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert run("upgrade").exit_code == 0
    os.chmod(tmp_path / "cache" / "tunecache", 0o700)
    code, checks, _ = _checks()
    assert code == 0
    assert checks["permissions"]["status"] == "ok"
    assert checks["permissions"]["message"].startswith("this user's default database")
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    assert run("upgrade", "--db", str(shared / "tune.db")).exit_code == 0
    _, checks, _ = _checks("--db", str(shared / "tune.db"))
    assert checks["permissions"]["status"] == "warn"


def test_doctor_names_a_directory_given_as_the_database(tmp_path):
    code, checks, _ = _checks("--db", str(tmp_path))
    assert code == 1
    assert checks["reachable"]["message"] == (
        f"{tmp_path}: this is a directory, not a database file; name a file in it, e.g. "
        f"{tmp_path / 'tunecache.db'}")


def test_doctor_warns_on_a_missing_default_database_that_jobs_create(tmp_path, monkeypatch):
    monkeypatch.delenv("TUNECACHE_DB", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    code, checks, data = _checks()
    assert code == 0 and data["ok"] is True
    assert checks["reachable"] == {
        "name": "reachable", "status": "warn",
        "message": f"no database at {tmp_path}/cache/tunecache/tunecache.db yet",
        "fix": "jobs create it, and its directory, on first use (or run `tunecache upgrade` "
               "now)"}
    assert not (tmp_path / "cache").exists()


def test_doctor_flags_an_unknown_tunecache_variable_with_the_nearest_name(sqlite_url,
                                                                          monkeypatch):
    monkeypatch.setenv("TUNECACHE_DBB", "/tmp/typo.db")
    code, checks, _ = _checks("--db", sqlite_url)
    assert code == 0 and checks["variables"]["status"] == "warn"
    assert checks["variables"]["message"] == (
        "not tunecache settings, ignored: TUNECACHE_DBB (did you mean TUNECACHE_DB?)")


def test_doctor_checks_graph_settings_and_key_files_as_jobs_load_them(sqlite_url, tmp_path,
                                                                      monkeypatch):
    for var in ("TUNECACHE_SIGNING_KEY", "TUNECACHE_VERIFY_KEY", "TUNECACHE_SHARE"):
        monkeypatch.delenv(var, raising=False)
    _, checks, _ = _checks("--db", sqlite_url)
    assert checks["graphs"]["status"] == "ok"
    assert checks["graphs"]["message"].startswith("graph and kernel sharing off: no key set")

    monkeypatch.setenv("TUNECACHE_SHARE", "maybe")
    done = run("doctor", "--db", sqlite_url)
    assert done.exit_code == 2 and "TUNECACHE_SHARE='maybe' is invalid" in done.output
    monkeypatch.delenv("TUNECACHE_SHARE")

    keys = tmp_path / "keys"
    assert run("keygen", str(keys)).exit_code == 0
    private = keys / "tunecache-signing.key"
    monkeypatch.setenv("TUNECACHE_SIGNING_KEY", str(private))
    code, checks, _ = _checks("--db", sqlite_url)
    assert code == 0 and checks["graphs"]["status"] == "ok", checks["graphs"]
    assert checks["graphs"]["message"].startswith("sign and publish, and load graphs signed")

    os.chmod(private, 0o666)
    code, checks, _ = _checks("--db", sqlite_url)
    assert code == 1 and checks["graphs"]["status"] == "fail"
    assert checks["graphs"]["message"].startswith(
        f"TUNECACHE_SIGNING_KEY: tunecache key file {private}: is writable by other users")
    monkeypatch.delenv("TUNECACHE_SIGNING_KEY")
    monkeypatch.setenv("TUNECACHE_VERIFY_KEY", str(keys / "missing.pub"))
    code, checks, _ = _checks("--db", sqlite_url)
    assert code == 1 and checks["graphs"]["message"].startswith(
        f"TUNECACHE_VERIFY_KEY: tunecache key file {keys / 'missing.pub'}: no such file")


def test_doctor_names_the_replacement_of_a_renamed_variable(sqlite_url, monkeypatch):
    monkeypatch.setenv("TUNECACHE_KERNELS", "0")
    code, checks, _ = _checks("--db", sqlite_url)
    assert code == 0 and checks["renamed"]["status"] == "warn"
    assert checks["renamed"]["message"] == (
        "TUNECACHE_KERNELS is renamed: set TUNECACHE_SHARE=-kernels instead (honoured this "
        "time)")


def test_doctor_flags_a_postgresql_superuser_login_and_passes_a_plain_role(pg_url):
    # The README says not to connect as a superuser (no CONNECTION LIMIT binds one); the
    # doctor did not say so.
    import uuid

    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    from tunecache.settings import resolve_db_url

    populate(pg_url, [gemm_key()])
    code, checks, _ = _checks("--db", pg_url)
    assert code == 0
    assert checks["login"]["status"] == "warn"
    assert checks["login"]["message"] == (
        "connected as postgres, a superuser: the role's CONNECTION LIMIT and the database's "
        "do not bind it, so a cold job can take every connection the server has")
    assert "CREATE ROLE tunecache LOGIN" in checks["login"]["fix"]

    role = f"tc_{uuid.uuid4().hex[:8]}"
    engine = create_engine(resolve_db_url(pg_url))
    with engine.begin() as conn:
        conn.execute(text(f'CREATE ROLE "{role}" LOGIN'))
        conn.execute(text(f'GRANT SELECT ON ALL TABLES IN SCHEMA public TO "{role}"'))
    try:
        plain = make_url(pg_url).set(username=role).render_as_string(hide_password=False)
        code, checks, _ = _checks("--db", plain)
        assert code == 0, checks
        assert checks["login"] == {"name": "login", "status": "ok",
                                   "message": f"connected as {role} (not a superuser)",
                                   "fix": None}
    finally:
        with engine.begin() as conn:
            conn.execute(text(f'DROP OWNED BY "{role}"'))
            conn.execute(text(f'DROP ROLE "{role}"'))
        engine.dispose()


def test_doctor_names_an_immutable_database_file_instead_of_asking_for_chmod(sqlite_url,
                                                                              tmp_path):
    import subprocess

    populate(sqlite_url, [gemm_key()])
    path = tmp_path / "tune.db"
    assert subprocess.run(["chattr", "+i", str(path)]).returncode == 0
    try:
        code, checks, _ = _checks("--db", sqlite_url)
    finally:
        subprocess.run(["chattr", "-i", str(path)], check=True)
    assert code == 1
    assert checks["permissions"]["status"] == "fail"
    assert checks["permissions"]["message"] == (
        f"{path} cannot be written by anyone: it is immutable or append-only (a file "
        "attribute; lsattr shows it)")
    assert checks["permissions"]["fix"] == f"as root: chattr -i -a {path}"
    assert "chmod" not in checks["permissions"]["fix"]


def test_doctor_still_asks_for_group_modes_where_they_are_the_cause(sqlite_url, tmp_path):
    import errno

    from tunecache.ops.doctor import write_problem

    assert write_problem(str(tmp_path / "none"), errno.EACCES) == (
        f"this user cannot read and write {tmp_path / 'none'}",
        f"chmod g+rw {tmp_path / 'none'} and add this user to its group")
    assert write_problem("/x/db", errno.EROFS) == (
        "/x/db is on a filesystem mounted read-only",
        "remount it read-write, or point --db / TUNECACHE_DB at a writable one")


def test_a_missing_directory_reads_the_same_in_the_cli_as_in_a_job(tmp_path):
    # The CLI said "no database file there (nothing recorded yet?)", a job "the directory
    # does not exist".
    missing = tmp_path / "nope" / "tune.db"
    for args in (["stats"], ["ls"], ["export"], ["prune", "--failed", "--dry-run"]):
        result = run(*args, "--db", str(missing))
        assert result.exit_code == 1, result.output
        assert result.stderr == (f"Error: tunecache database sqlite:///{missing}: directory "
                                 f"{missing.parent} does not exist; check --db, or create "
                                 "it first (`tunecache doctor` checks the setup)\n")
    code, checks, _ = _checks("--db", str(missing))
    assert code == 1
    assert checks["reachable"]["message"] == f"directory {missing.parent} does not exist"

"""Key files of compiled-graph signing on storage other users can write: `tunecache keygen`
and the key loaders refuse a key file, or a directory on its path, that another user
could replace it through; a key path that is a FIFO is refused without blocking; and a
keygen directory that cannot be made is a one-line error."""

from __future__ import annotations

import json
import logging
import os
import stat
from pathlib import Path

import pytest
from cli_helpers import run
from fifo_helpers import returns_within

from tunecache.core.signing import (
    PRIVATE_KEY_NAME,
    PUBLIC_KEY_NAME,
    load_signer,
    load_verifier,
    write_key_pair,
)
from tunecache.errors import SigningKeyError

LOADERS = {PRIVATE_KEY_NAME: load_signer, PUBLIC_KEY_NAME: load_verifier}


@pytest.fixture
def keys(tmp_path) -> Path:
    write_key_pair(tmp_path / "keys")
    return tmp_path / "keys"


# -- the key files and their directories


@pytest.mark.parametrize("name", [PRIVATE_KEY_NAME, PUBLIC_KEY_NAME])
@pytest.mark.parametrize("mode", [0o666, 0o662, 0o620])
def test_a_key_file_other_users_can_write_is_refused(keys, name, mode):
    path = keys / name
    path.chmod(mode)
    with pytest.raises(SigningKeyError) as error:
        LOADERS[name](path)
    message = str(error.value)
    assert str(path) in message and "writable by other users" in message
    assert f"chmod go-w {path}" in message and "\n" not in message


@pytest.mark.parametrize("name", [PRIVATE_KEY_NAME, PUBLIC_KEY_NAME])
@pytest.mark.parametrize("mode", [0o777, 0o1777, 0o770])
def test_a_key_directory_other_users_can_write_is_refused(keys, name, mode):
    # Sticky or not: another user may add files to the directory, and a key that is
    # missing (or moved away by its owner) is then theirs to plant.
    keys.chmod(mode)
    with pytest.raises(SigningKeyError) as error:
        LOADERS[name](keys / name)
    message = str(error.value)
    assert str(keys / name) in message and f"chmod go-w {keys}" in message
    assert "\n" not in message


def test_a_directory_above_the_keys_that_others_can_write_is_refused(tmp_path):
    shared = tmp_path / "shared"
    write_key_pair(shared / "keys")
    shared.chmod(0o777)  # anyone may rename keys/ away and put their own in its place
    with pytest.raises(SigningKeyError, match=f"chmod go-w {shared}"):
        load_verifier(shared / "keys" / PUBLIC_KEY_NAME)
    shared.chmod(0o1777)  # sticky, as /tmp: only keys/' owner may rename it
    load_verifier(shared / "keys" / PUBLIC_KEY_NAME)


def test_a_symlinked_key_is_checked_where_it_points(tmp_path):
    write_key_pair(tmp_path / "real")
    (tmp_path / "link").mkdir()
    link = tmp_path / "link" / PUBLIC_KEY_NAME
    link.symlink_to(tmp_path / "real" / PUBLIC_KEY_NAME)
    load_verifier(link)  # a symlink an operator made (a secrets mount) is followed
    (tmp_path / "real").chmod(0o777)
    with pytest.raises(SigningKeyError, match=f"chmod go-w {tmp_path / 'real'}"):
        load_verifier(link)
    (tmp_path / "real").chmod(0o700)
    (tmp_path / "link").chmod(0o777)  # the symlink itself could be swapped
    with pytest.raises(SigningKeyError, match=f"chmod go-w {tmp_path / 'link'}"):
        load_verifier(link)


def test_the_group_layout_loads_under_a_strict_umask(tmp_path):
    old = os.umask(0o077)
    try:
        done = run("keygen", str(tmp_path / "a" / "keys"), "--group", "--json")
    finally:
        os.umask(old)
    assert done.exit_code == 0, done.output
    report = json.loads(done.stdout)
    folder = tmp_path / "a" / "keys"
    # The group can reach and read its key: the modes are set, not left to the umask.
    assert stat.S_IMODE(folder.stat().st_mode) == 0o750
    assert stat.S_IMODE((tmp_path / "a").stat().st_mode) == 0o750
    assert stat.S_IMODE(Path(report["private_key"]).stat().st_mode) == 0o640
    assert stat.S_IMODE(Path(report["public_key"]).stat().st_mode) == 0o644
    load_signer(report["private_key"])
    load_verifier(report["public_key"])


def test_keygen_without_group_makes_its_directory_private_whatever_the_umask(tmp_path):
    old = os.umask(0)
    try:
        done = run("keygen", str(tmp_path / "keys"))
    finally:
        os.umask(old)
    assert done.exit_code == 0, done.output
    assert stat.S_IMODE((tmp_path / "keys").stat().st_mode) == 0o700


@pytest.mark.parametrize("mode", [0o777, 0o1777, 0o775])
def test_keygen_refuses_a_directory_other_users_can_write(tmp_path, mode):
    folder = tmp_path / "keys"
    folder.mkdir()
    folder.chmod(mode)
    done = run("keygen", str(folder))
    assert done.exit_code == 1
    assert done.output == (f"Error: tunecache key file {folder / PRIVATE_KEY_NAME}: its "
                           f"directory {folder} is writable by other users (mode "
                           f"{mode:04o}), so they could replace the key; make it writable by "
                           f"its owner only (chmod go-w {folder})\n")
    assert list(folder.iterdir()) == [] and stat.S_IMODE(folder.stat().st_mode) == mode


def test_keygen_of_a_directory_that_cannot_be_made_is_a_one_line_error():
    done = run("keygen", "/proc/nope")
    assert done.exit_code == 1
    assert done.output == ("Error: tunecache key file /proc/nope/tunecache-signing.key: its "
                           "directory cannot be created: No such file or directory\n")


def test_a_writable_verify_key_turns_graph_sharing_off_with_one_warning(
        keys, sqlite_url, caplog, monkeypatch):
    pytest.importorskip("torch")
    import tunecache
    from tunecache.inductor.state import REGISTRY
    from tunecache.process import PROCESS

    monkeypatch.setattr(PROCESS, "explained", set())
    path = keys / PUBLIC_KEY_NAME
    path.chmod(0o666)
    with caplog.at_level(logging.INFO, logger="tunecache"):
        try:
            assert tunecache.enable(db=sqlite_url, verify_key=str(path))
            assert tunecache.is_enabled() and REGISTRY.graphs is None  # tuning stays on
        finally:
            tunecache.disable()
    lines = [r for r in caplog.records if "compiled graphs" in r.getMessage()]
    assert len(lines) == 1 and lines[0].levelno == logging.WARNING, caplog.text
    assert str(path) in lines[0].getMessage() and f"chmod go-w {path}" in lines[0].getMessage()


# -- FIFOs


@pytest.mark.parametrize("name", [PRIVATE_KEY_NAME, PUBLIC_KEY_NAME])
def test_a_key_path_that_is_a_fifo_is_refused_without_blocking(tmp_path, name):
    folder = tmp_path / "keys"
    folder.mkdir(mode=0o700)
    fifo = folder / name
    os.mkfifo(fifo, 0o600)
    with pytest.raises(SigningKeyError) as error:
        returns_within(lambda: LOADERS[name](fifo), fifo)
    assert str(fifo) in str(error.value) and "not a regular file" in str(error.value)


def test_enable_with_a_fifo_verify_key_returns_with_graph_sharing_off(
        tmp_path, sqlite_url, caplog, monkeypatch):
    pytest.importorskip("torch")
    import tunecache
    from tunecache.inductor.state import REGISTRY
    from tunecache.process import PROCESS

    monkeypatch.setattr(PROCESS, "explained", set())
    folder = tmp_path / "keys"
    folder.mkdir(mode=0o700)
    fifo = folder / PUBLIC_KEY_NAME
    os.mkfifo(fifo, 0o644)

    def enable() -> bool:
        try:
            return tunecache.enable(db=sqlite_url, verify_key=str(fifo)) \
                and REGISTRY.graphs is None
        finally:
            tunecache.disable()

    with caplog.at_level(logging.WARNING, logger="tunecache"):
        assert returns_within(enable, fifo) is True
    assert "not a regular file" in caplog.text

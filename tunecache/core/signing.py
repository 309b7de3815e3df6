"""Ed25519 signatures of compiled graphs: key pairs, signing and verifying.

A compiled graph is a pickle plus generated Python that every job loading it executes,
so whoever can write the database could run code in every job that reads it. Jobs that
publish sign each entry with the cluster's private key; every reader
verifies with the public key alone, so a readonly consumer can check entries but never
forge one.

What is signed: a domain tag, then the entry's kind, its key and the sha256 of its
compressed payload, each length-prefixed. So a signature vouches for these bytes under
this key only: an entry copied under another key (or kind) does not verify, nor does a
signature made by anything else that signs with the same key pair.

Key files are PEM (PKCS#8 private key, SubjectPublicKeyInfo public key), the formats
``openssl pkey`` reads; the private key is not encrypted (jobs read it unattended), so
its file's permissions are what protects it.

Whoever can replace a key file chooses what every job trusts (a public key of their
own: their graphs then run in every job). So ``keygen`` and both loaders refuse a key
file that anyone but its owner may write, a directory holding it that anyone but its
owner may write (sticky or not: another user could add the file when it is missing),
and a directory above it that others may write unless it is sticky (then only the
owner of an entry may rename it, as in /tmp). Group write counts as others' write: the
``--group`` layout lets the group read the keys (directory 750, private key 640, public
key 644), never write them. A symlinked key path (a secrets mount) is followed, and both
the directories holding the symlink and those of the file it points to are checked.
Modes are checked, not owners: jobs of a group run as users other than the key's owner.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import stat
import struct
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import SigningKeyError
from ..files import read_regular

if TYPE_CHECKING:  # cryptography is imported when a key is first used
    from cryptography.hazmat.primitives.asymmetric.ed25519 import (
        Ed25519PrivateKey,
        Ed25519PublicKey,
    )

__all__ = [
    "PRIVATE_KEY_NAME",
    "PUBLIC_KEY_NAME",
    "KeyPairFiles",
    "Signer",
    "Verifier",
    "signed_message",
    "write_key_pair",
    "load_signer",
    "load_verifier",
]

PRIVATE_KEY_NAME = "tunecache-signing.key"
PUBLIC_KEY_NAME = "tunecache-verify.pub"
# Changing what is signed means a new tag: an old signature must not verify a new meaning.
_DOMAIN = b"tunecache compiled graph v1\x00"
_SIGNATURE_BYTES = 64
# A PEM key file is a few hundred bytes; refuse to read anything much larger.
_MAX_KEY_FILE = 16 * 1024
# Write permission of anyone but the owner (group members are other users too).
_OTHERS_WRITE = stat.S_IWGRP | stat.S_IWOTH


def signed_message(kind: str, key: str, digest: str) -> bytes:
    """The bytes a signature covers: the domain tag, kind, key and payload digest."""
    parts = [kind.encode(), key.encode(), digest.encode()]
    return _DOMAIN + b"".join(struct.pack(">I", len(p)) + p for p in parts)


def _fingerprint(public_raw: bytes) -> str:
    """A short name of a public key for messages (not a security boundary)."""
    return hashlib.sha256(public_raw).hexdigest()[:16]


class Verifier:
    """Checks signatures with a public key."""

    def __init__(self, public_key: Ed25519PublicKey) -> None:
        from cryptography.hazmat.primitives import serialization

        self._key = public_key
        raw = public_key.public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw
        )
        self.public_raw: bytes = raw
        self.fingerprint = _fingerprint(raw)

    def verify(self, kind: str, key: str, digest: str, signature: bytes) -> bool:
        from cryptography.exceptions import InvalidSignature

        if len(signature) != _SIGNATURE_BYTES:
            return False
        try:
            self._key.verify(signature, signed_message(kind, key, digest))
        except InvalidSignature:
            return False
        return True


class Signer:
    """Signs with a private key; :attr:`verifier` checks with its public half."""

    def __init__(self, private_key: Ed25519PrivateKey) -> None:
        self._key = private_key
        self.verifier = Verifier(private_key.public_key())

    @property
    def fingerprint(self) -> str:
        return self.verifier.fingerprint

    def sign(self, kind: str, key: str, digest: str) -> bytes:
        return self._key.sign(signed_message(kind, key, digest))


@dataclasses.dataclass(frozen=True)
class KeyPairFiles:
    private_key: Path
    public_key: Path
    fingerprint: str


def write_key_pair(directory: str | os.PathLike[str], *, group: bool = False) -> KeyPairFiles:
    """Make a key pair in ``directory`` (created if missing): the private key readable
    by its owner only (``group``: by its group too), the public key by anyone.

    Refuses (SigningKeyError) if either file exists: a new key pair would orphan every
    entry signed with the old one, and overwriting a private key loses it for good.
    """
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    folder = Path(directory).expanduser().absolute()
    private_path = folder / PRIVATE_KEY_NAME
    public_path = folder / PUBLIC_KEY_NAME
    for path in (private_path, public_path):
        if path.exists() or path.is_symlink():
            raise SigningKeyError(str(path), "exists already; refusing to overwrite it "
                                  "(move it away first, or use another directory)")
    # Refused before anything is written: the loaders would refuse these keys anyway.
    why = _unsafe_location(private_path)
    if why is not None:
        raise SigningKeyError(str(private_path), why)
    _make_directories(folder, 0o750 if group else 0o700, private_path)
    key = Ed25519PrivateKey.generate()
    private_pem = key.private_bytes(serialization.Encoding.PEM,
                                    serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption())
    public_pem = key.public_key().public_bytes(serialization.Encoding.PEM,
                                               serialization.PublicFormat.SubjectPublicKeyInfo)
    _write_new(private_path, private_pem, 0o640 if group else 0o600)
    try:
        _write_new(public_path, public_pem, 0o644)
    except BaseException:
        private_path.unlink(missing_ok=True)  # no half a key pair
        raise
    return KeyPairFiles(private_path, public_path, Signer(key).fingerprint)


def _make_directories(folder: Path, mode: int, private_path: Path) -> None:
    """Create ``folder`` and its missing parents with ``mode``, set explicitly: under a
    strict umask (077) a directory made by mkdir alone would keep the group of --group
    out of its keys. Directories that exist are left as they are."""
    missing: list[Path] = []
    for d in (folder, *folder.parents):
        if d.is_dir():
            break
        missing.append(d)
    for d in reversed(missing):
        try:
            os.mkdir(d, mode)
            os.chmod(d, mode)
        except FileExistsError:
            if not d.is_dir():
                raise SigningKeyError(str(private_path), f"{d} exists and is not a "
                                      "directory") from None
        except OSError as e:
            raise SigningKeyError(str(private_path), "its directory cannot be created: "
                                  f"{os.strerror(e.errno or 0)}") from None


def _unsafe_location(path: Path) -> str | None:
    """Why another user could replace the key file at ``path`` through a directory on
    its path (see the module docstring), or None. Directories that do not exist (yet)
    are skipped."""
    lexical = Path(os.path.abspath(path))
    chains = [lexical.parent]
    real = Path(os.path.realpath(lexical))
    if real.parent != lexical.parent:
        chains.append(real.parent)
    seen: set[Path] = set()
    for own in chains:
        for d in (own, *own.parents):
            if d in seen:
                continue
            seen.add(d)
            try:
                mode = stat.S_IMODE(os.stat(d).st_mode)
            except OSError:
                continue
            if not mode & _OTHERS_WRITE:
                continue
            if d == own:
                return (f"its directory {d} is writable by other users (mode {mode:04o}), "
                        "so they could replace the key; make it writable by its owner only "
                        f"(chmod go-w {d})")
            if not mode & stat.S_ISVTX:
                return (f"the directory {d} above it is writable by other users (mode "
                        f"{mode:04o}), so they could swap the key's directory for theirs; "
                        f"chmod go-w {d} (or chmod +t {d}, as on /tmp)")
    return None


def _write_new(path: Path, data: bytes, mode: int) -> None:
    # O_EXCL: a file that appeared since the check above is never overwritten (nor is a
    # symlink followed). The mode is set on the descriptor before any byte is written,
    # so the umask cannot widen it and the key is never readable by others, even briefly.
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    except FileExistsError:
        raise SigningKeyError(str(path), "exists already; refusing to overwrite it") from None
    except OSError as e:
        raise SigningKeyError(str(path),
                              f"cannot be created: {os.strerror(e.errno or 0)}") from None
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        path.unlink(missing_ok=True)
        raise


def _read_key_file(path: str | os.PathLike[str]) -> tuple[Path, bytes, os.stat_result]:
    """The key file's bytes and fstat, once it is known that no other user could have
    put them there (see the module docstring)."""
    p = Path(path).expanduser()
    try:
        # Not blocking on a FIFO, nor reading a device: a key path may name anything.
        data, st = read_regular(p, _MAX_KEY_FILE + 1, follow_symlinks=True)
    except FileNotFoundError:
        raise SigningKeyError(str(p), "no such file (`tunecache keygen DIR` makes a key "
                              "pair)") from None
    except OSError as e:
        raise SigningKeyError(str(p), f"cannot be read: {e.strerror or e}") from None
    mode = stat.S_IMODE(st.st_mode)
    if mode & _OTHERS_WRITE:
        raise SigningKeyError(str(p), f"is writable by other users (mode {mode:04o}), so "
                              "they could replace the key; make it writable by its owner "
                              f"only (chmod go-w {p})")
    why = _unsafe_location(p)
    if why is not None:
        raise SigningKeyError(str(p), why)
    if len(data) > _MAX_KEY_FILE:
        raise SigningKeyError(str(p), "is too large to be a key file")
    return p, data, st


def load_signer(path: str | os.PathLike[str]) -> Signer:
    """The private key at ``path`` (PEM, as ``tunecache keygen`` writes it)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    p, data, st = _read_key_file(path)
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as e:
        raise SigningKeyError(str(p), f"is not an unencrypted PEM private key ({e})") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise SigningKeyError(str(p), "is not an Ed25519 private key")
    if st.st_mode & stat.S_IROTH:
        raise SigningKeyError(str(p), "is readable by every user; make it private "
                              "(chmod 600, or 640 for a group of jobs)")
    return Signer(key)


def load_verifier(path: str | os.PathLike[str]) -> Verifier:
    """The public key at ``path`` (PEM, as ``tunecache keygen`` writes it)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    p, data, _st = _read_key_file(path)
    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, TypeError) as e:
        raise SigningKeyError(str(p), f"is not a PEM public key ({e})") from None
    if not isinstance(key, Ed25519PublicKey):
        raise SigningKeyError(str(p), "is not an Ed25519 public key")
    return Verifier(key)

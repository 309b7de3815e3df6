"""`tunecache keygen`: the key pair that signs shared compiled graphs (a thin shell over
tunecache.core.signing, imported when the command runs)."""

from __future__ import annotations

from pathlib import Path

import click

from .options import Invocation, json_only

__all__ = ["keygen"]


@click.command()
@click.argument("directory", type=click.Path(file_okay=False, path_type=Path))
@click.option("--group", is_flag=True,
              help="Let the private key's group read it too (mode 640, not 600): for jobs "
                   "that run as several users of one group.")
@json_only
def keygen(inv: Invocation, directory: Path, group: bool) -> None:
    """Make the Ed25519 key pair that signs shared compiled graphs, in DIRECTORY.

    Writes tunecache-signing.key (the private key: set TUNECACHE_SIGNING_KEY to it on jobs
    that publish graphs; readable by its owner only, or by its group with --group) and
    tunecache-verify.pub (the public key: set TUNECACHE_VERIFY_KEY to it on jobs that only
    load graphs). Never overwrites either file, and refuses a DIRECTORY that users other
    than its owner can write (jobs would refuse its keys: anyone could replace them).
    """
    from ..core.signing import write_key_pair

    files = write_key_pair(directory, group=group)
    report = {"private_key": str(files.private_key), "public_key": str(files.public_key),
              "fingerprint": files.fingerprint,
              "private_key_mode": "0640" if group else "0600"}

    def human() -> None:
        click.echo(f"private key: {files.private_key} (mode {report['private_key_mode']}; "
                   f"jobs that publish: TUNECACHE_SIGNING_KEY={files.private_key})")
        click.echo(f"public key:  {files.public_key} (jobs that only load: "
                   f"TUNECACHE_VERIFY_KEY={files.public_key})")
        click.echo(f"fingerprint: {files.fingerprint}")

    inv.emit(report, human)

"""The ``tunecache`` command: a thin click shell over tunecache.ops and tunecache.warm.

Conventions, shared by every command: ``--db PATH|URL`` overrides TUNECACHE_DB; ``--json``
prints one JSON document to stdout for scripts (options.py); progress bars go to stderr
(format.py); library errors become one-line ``Error: ...`` messages in one place (app.py).
Importing it imports neither SQLAlchemy, Alembic nor torch.
"""

from .app import cli
from .exchanging import export, import_, merge
from .inspecting import doctor, ls, show, stats
from .pruning import prune
from .signing import keygen
from .upgrading import upgrade
from .warming import warm

__all__ = ["main", "cli"]

for _command in (stats, prune, export, import_, merge, doctor, ls, show, upgrade, warm, keygen):
    cli.add_command(_command)


def main() -> None:
    cli(prog_name="tunecache")

"""``python -m tunecache.cli``: the ``tunecache`` command (as under torchrun, README)."""

from . import main

main()

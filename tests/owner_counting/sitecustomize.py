"""Loaded at the start of every Python process whose PYTHONPATH holds this directory
(tests/test_process_owner.py puts it there for a job and the processes it starts):
counts the patch ledgers and TuneCaches the process makes and how often it reads the
settings from the environment, and writes them to $OWNER_COUNTS/<pid>.json at exit."""

from __future__ import annotations

import atexit
import json
import os
import sys

from tunecache import patching, settings
from tunecache.core import cache

_counts = {"ledgers": 0, "scoped_ledgers": 0, "tune_caches": 0, "settings_read": 0,
           "argv": sys.argv[:2]}


def _counting(cls: type, field: str) -> None:
    init = cls.__init__

    def __init__(self, *args, **kwargs):
        _counts[field] += 1
        init(self, *args, **kwargs)

    cls.__init__ = __init__


_counting(patching.Ledger, "ledgers")
_counting(cache.TuneCache, "tune_caches")
_enter = patching.Ledger.__enter__


def _scoped(self):
    _counts["scoped_ledgers"] += 1  # a ledger used for one call only (`with Ledger()`)
    return _enter(self)


patching.Ledger.__enter__ = _scoped
_from_env = settings.Settings.from_env.__func__


def _reading(cls, *args, **kwargs):
    if not args and not kwargs:  # the process's environment, not a given mapping
        _counts["settings_read"] += 1
    return _from_env(cls, *args, **kwargs)


settings.Settings.from_env = classmethod(_reading)


@atexit.register
def _write() -> None:
    where = os.environ.get("OWNER_COUNTS")
    if where:
        with open(os.path.join(where, f"{os.getpid()}.json"), "w") as f:
            json.dump(_counts, f)

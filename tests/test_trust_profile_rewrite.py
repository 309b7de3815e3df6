"""A job that rewrites a refused shape profile (unsigned, tampered, planted) reads the
row there within the profile bound (tunecache/core/pgo.py's 16 MiB), as its load does:
the rewrite read a planted row whole (issue 51: +220 MiB of peak RSS)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from test_pgo_sharing import KEY, _publish, keys  # noqa: E402,F401 - fixture

from tunecache.core.pgo import MAX_PROFILE_BYTES  # noqa: E402
from tunecache.core.signing import PRIVATE_KEY_NAME  # noqa: E402
from tunecache.inductor.pgo import KIND  # noqa: E402
from tunecache.store import ArtifactStore, Database  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PLANTED_BYTES = 3 * MAX_PROFILE_BYTES  # incompressible, unsigned: refused on its size

_REWRITE = """
import base64, sys, tracemalloc, torch, tunecache
from tunecache.core.pgo import ProfileShare
from tunecache.inductor.graphs import encode_entry
from tunecache.settings import Settings
url, key_file, kind, key = sys.argv[1:5]
cache = tunecache.open(url)
share = ProfileShare.from_settings(
    Settings.from_env({}, signing_key=key_file).pgo_sharing(), lambda: cache)
frame = encode_entry({"data": base64.b64encode(b"a profile learnt").decode("ascii")})
cache.database()  # the schema checked before measuring
tracemalloc.start()
published = share.publish(kind, key, frame, torch.__version__)
peak = tracemalloc.get_traced_memory()[1]
cache.close()
print(published, peak)
"""


def test_rewriting_a_planted_oversized_profile_reads_it_within_the_bound(db_url, keys):  # noqa: F811
    key_file = keys / PRIVATE_KEY_NAME
    _publish(db_url, key_file, b"x" * 100)
    store = ArtifactStore(Database(db_url))
    _, digest, signature = store.examine(KIND, KEY)
    assert store.replace(KIND, KEY, digest, signature, os.urandom(PLANTED_BYTES), b"planted",
                         torch.__version__)
    store.db.dispose()
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_REWRITE), db_url, str(key_file), KIND, KEY],
        capture_output=True, text=True, check=True, timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT)}).stdout.split()
    assert out[0] == "True"  # the refused row is replaced by this job's profile
    # Read whole, the planted row alone is 48 MiB of the peak.
    assert int(out[1]) < MAX_PROFILE_BYTES
    store = ArtifactStore(Database(db_url))
    try:
        found = store.get(KIND, KEY, touch=False, limit=MAX_PROFILE_BYTES)
    finally:
        store.db.dispose()
    assert found is not None and not isinstance(found, str)

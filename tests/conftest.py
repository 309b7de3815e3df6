"""Fixtures: a fresh SQLite file per test, a fresh database on the real PostgreSQL server,
and the compiles tunecache's compile-ahead threads start.

PostgreSQL is not optional: `.ci/run` starts it. Point TEST_PG_URL at another server
(a libpq URL of a database whose user may CREATE DATABASE) to test against it.
"""

from __future__ import annotations

import concurrent.futures
import os
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

PG_ADMIN_URL = os.environ.get("TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")


def _admin_connect():
    import psycopg

    return psycopg.connect(PG_ADMIN_URL, autocommit=True, connect_timeout=5)


@pytest.fixture
def sqlite_url(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'tune.db'}"


@pytest.fixture
def pg_url() -> Iterator[str]:
    name = f"tunecache_test_{uuid.uuid4().hex[:12]}"
    with _admin_connect() as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    base = PG_ADMIN_URL.rsplit("/", 1)[0]
    try:
        yield f"{base}/{name}"
    finally:
        with _admin_connect() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request) -> str:
    """Run the test once on a SQLite file and once on PostgreSQL."""
    return request.getfixturevalue(f"{'sqlite' if request.param == 'sqlite' else 'pg'}_url")


class CompilesStarted:
    """The compiles started in compile-ahead threads (tunecache/inductor/triton/
    compile_ahead.py), as their thread pools' futures."""

    def __init__(self) -> None:
        self.futures: list[concurrent.futures.Future[Any]] = []

    def wait(self) -> None:
        """Until every compile started so far has ended, as a GPU benchmark outlasts a
        compile."""
        concurrent.futures.wait(list(self.futures))

    @staticmethod
    def join_threads() -> None:
        """Until the process's compile-ahead threads are gone: compiles under way when a
        descent ends finish unused, after it."""
        from tunecache.process import PROCESS

        pool, PROCESS.compile_pool = PROCESS.compile_pool, None
        if pool is not None:
            pool.shutdown(wait=True)


@pytest.fixture
def compiles_started(monkeypatch) -> Iterator[CompilesStarted]:
    from tunecache.inductor.triton import compile_ahead

    started = CompilesStarted()

    class Pool(concurrent.futures.ThreadPoolExecutor):
        def submit(self, *args: Any, **kwargs: Any) -> Any:
            started.futures.append(future := super().submit(*args, **kwargs))
            return future

    monkeypatch.setattr(compile_ahead, "ThreadPoolExecutor", Pool)
    # The process's threads are made afresh, by the class above, and shut down after.
    CompilesStarted.join_threads()
    yield started
    CompilesStarted.join_threads()



# The test files that touch torch or Triton internals (hooks, Inductor's and Triton's own
# objects, real compiles through the parts): marked `internals`. A new such file goes here.
INTERNALS = (
    "test_compile_ahead.py", "test_fusion_candidates.py", "test_fusion_decisions.py",
    "test_gemm_narrowing.py", "test_gemm_transfer.py", "test_graph_sharing.py",
    "test_hooks_compose.py", "test_inductor.py", "test_kernel_sharing.py", "test_patches.py",
    "test_pgo_sharing.py", "test_remote_flags.py", "test_torch_versions.py",
    "test_triton_transfer.py", "test_upgrade.py", "test_user_kernels.py",
    "test_user_kernels_warm.py", "triton_autotune/",
)
# Of those, the files that check every hook point against the installed torch, each part
# through at least one real compile, in about 8 minutes: marked `versions` as well, which
# CI runs on each other tested torch (.ci/run; docs/decisions.md says why not all of
# `internals`: it would take CI past its 60 minutes on two cores).
VERSIONS = (
    "test_compile_ahead.py", "test_fusion_candidates.py", "test_fusion_decisions.py",
    "test_gemm_narrowing.py", "test_hooks_compose.py", "test_inductor.py",
    "test_kernel_sharing.py", "test_patches.py", "test_torch_versions.py",
    "test_triton_transfer.py", "test_user_kernels.py",
    *(f"triton_autotune/test_triton_{name}.py" for name in (
        "attempt", "claims_and_keys", "coordinate_descent", "fusion_timings",
        "plug_in_and_workers", "split_sizes", "stored_config_fallbacks", "stored_configs")),
)


def _listed(path: str, files: tuple[str, ...]) -> bool:
    return path in files or any(f.endswith("/") and path.startswith(f) for f in files)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    for item in items:
        path = os.path.relpath(str(item.path), here).replace(os.sep, "/")
        if _listed(path, INTERNALS):
            item.add_marker(pytest.mark.internals)
        if _listed(path, VERSIONS):
            item.add_marker(pytest.mark.versions)

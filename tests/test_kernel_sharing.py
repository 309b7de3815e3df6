"""Compiled Triton kernels shared through the database (tunecache.triton_cache): real processes,
each a "node" with its own local Triton cache directory, driving the cache manager as
``triton.compile`` does (kernel_worker.py), over real SQLite files and PostgreSQL; and the
operator commands over kernel entries."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
from cli_helpers import run, run_json
from kernel_worker import compiled_files
from sqlalchemy import func, select, update

import tunecache
from tunecache import triton_cache
from tunecache.core.kernels import KernelShare
from tunecache.core.signing import PRIVATE_KEY_NAME, PUBLIC_KEY_NAME, load_signer, write_key_pair
from tunecache.settings import Settings
from tunecache.store import ArtifactStore
from tunecache.store.schema import artifacts

WORKER = str(Path(__file__).with_name("kernel_worker.py"))
KEY = "SOMEBASE32TRITONKEYOFAKERNEL"
NAME = "triton_poi_fused_add_mul_0123456789abcdef"


@pytest.fixture
def keys(tmp_path) -> Path:
    write_key_pair(tmp_path / "keys")
    return tmp_path / "keys"


def _env(url: str, node: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TUNECACHE_", "TRITON_"))}
    env.update(TUNECACHE_DB=url, TRITON_CACHE_DIR=str(node),
               PYTHONPATH=os.pathsep.join([str(Path(__file__).parent), *sys.path]))
    env.update(extra)
    return env


def _compile(url: str, node: Path, *, key: str = KEY, name: str = NAME, seed: str = "a",
             barrier: tuple[Path, int] | None = None, **env: str) -> dict:
    args = [sys.executable, WORKER, key, name, seed]
    if barrier is not None:
        args += [str(barrier[0]), str(barrier[1])]
    done = subprocess.run(args, env=_env(url, node, **env), capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    out["warnings"] = [line for line in done.stderr.splitlines() if "tunecache:" in line]
    return out


# This process's kernel counters that moved, as the worker reports them.
_NONZERO_KERNEL_COUNTS = ("{k: n for k, n in "
                          "dataclasses.asdict(tunecache.stats().kernels).items() if n}")


def _publisher(keys: Path) -> dict[str, str]:
    return {"TUNECACHE_SIGNING_KEY": str(keys / PRIVATE_KEY_NAME)}


def _consumer(keys: Path) -> dict[str, str]:
    return {"TUNECACHE_VERIFY_KEY": str(keys / PUBLIC_KEY_NAME)}


def _sha(files: dict[str, bytes]) -> dict[str, str]:
    return {n: hashlib.sha256(b).hexdigest() for n, b in files.items()}


def _rows(url: str) -> list[tuple]:
    cache = tunecache.open(url)
    try:
        return cache.database().run(lambda c: c.execute(
            select(artifacts.c.kind, artifacts.c.cache_key, artifacts.c.hits)).all())
    finally:
        cache.close()


def test_a_kernel_compiled_on_one_node_loads_on_another_without_compiling(db_url, keys,
                                                                        tmp_path):
    first = _compile(db_url, tmp_path / "node1", **_publisher(keys))
    assert first["outcome"] == "compiled"
    assert first["counts"] == {"absent": 1, "published": 1}
    second = _compile(db_url, tmp_path / "node2", seed="other", **_consumer(keys))
    assert second["outcome"] == "hit"
    assert second["files"] == _sha(compiled_files(NAME, "a")), "the first node's files"
    assert second["counts"] == {"loaded": 1}
    assert f"__grp__{NAME}.json" in second["local"], "written in Triton's local layout"
    again = _compile(db_url, tmp_path / "node2", seed="other", **_consumer(keys))
    assert again["outcome"] == "hit"
    assert again["counts"] == {}, "a local hit never asks the database"
    assert [(kind, key) for kind, key, _ in _rows(db_url)] == [("kernel", KEY)]


@pytest.mark.parametrize("name", ["triton_mm", "triton_mm_plus_mm", "triton_"])
def test_kernels_inductor_compiles_only_to_benchmark_stay_local(sqlite_url, keys, tmp_path,
                                                                name):
    # Inductor's GEMM template candidates and fusion candidates carry these names; a
    # graph's own kernels carry a content suffix (kernel_sharing.content_suffix).
    out = _compile(sqlite_url, tmp_path / "node1", key="BENCHMARKKEY", name=name,
                   **_publisher(keys))
    assert out["outcome"] == "compiled"
    assert f"__grp__{name}.json" in out["local"], "Triton's local cache keeps it"
    assert "published" not in out["counts"]
    graph_kernel = _compile(sqlite_url, tmp_path / "node1", **_publisher(keys))
    assert graph_kernel["counts"] == {"absent": 1, "published": 1}
    assert [(kind, key) for kind, key, _ in _rows(sqlite_url)] == [("kernel", KEY)]


def test_a_graph_kernel_is_published_once_inductor_keeps_it_not_when_compiled(
        sqlite_url, keys, tmp_path):
    # A compile worker compiles every config of a kernel Inductor autotunes; the main
    # process keeps one (tunecache.inductor.kernel_sharing) and publishes that one.
    compiled = _compile(sqlite_url, tmp_path / "node1", KERNEL_WORKER_KEEPS="0",
                        **_publisher(keys))
    assert compiled["outcome"] == "compiled" and "published" not in compiled["counts"]
    assert _rows(sqlite_url) == [] or not Path(sqlite_url.removeprefix("sqlite:///")).exists()
    kept = subprocess.run(
        [sys.executable, "-c", "import dataclasses, tunecache\n"
                               "from tunecache import triton_cache as t\n"
                               f"print(t.publish_kept({KEY!r}), {_NONZERO_KERNEL_COUNTS})"],
        env=_env(sqlite_url, tmp_path / "node1", **_publisher(keys)), capture_output=True,
        text=True, timeout=120)
    assert kept.stdout.split()[0] == "True", kept.stderr
    assert "'published': 1" in kept.stdout
    loaded = _compile(sqlite_url, tmp_path / "node2", **_consumer(keys))
    assert loaded["outcome"] == "hit"
    assert loaded["files"] == _sha(compiled_files(NAME, "a"))


def test_a_fifo_planted_in_a_kept_kernels_directory_publishes_nothing_and_never_blocks(
        sqlite_url, keys, tmp_path):
    node = tmp_path / "node1"
    _compile(sqlite_url, node, KERNEL_WORKER_KEEPS="0", **_publisher(keys))
    cubin = node / KEY / f"{NAME}.cubin"
    cubin.unlink()
    os.mkfifo(cubin)  # no writer: a plain read waits forever
    kept = subprocess.run(
        [sys.executable, "-c", "import dataclasses, tunecache\n"
                               "from tunecache import triton_cache as t\n"
                               f"t.publish_kept({KEY!r}); print({_NONZERO_KERNEL_COUNTS})"],
        env=_env(sqlite_url, node, **_publisher(keys)), capture_output=True, text=True,
        timeout=60)
    assert kept.returncode == 0, kept.stderr
    assert "published" not in kept.stdout
    assert _rows(sqlite_url) == [] or not Path(sqlite_url.removeprefix("sqlite:///")).exists()


def test_a_kernel_not_named_by_inductor_is_published_when_compiled(sqlite_url, keys,
                                                                   tmp_path):
    out = _compile(sqlite_url, tmp_path / "node1", key="USERKEY", name="my_rmsnorm_fwd",
                   KERNEL_WORKER_KEEPS="0", **_publisher(keys))
    assert out["counts"] == {"absent": 1, "published": 1}


def test_two_processes_compiling_the_same_kernel_at_once_publish_it_once(db_url, keys,
                                                                        tmp_path):
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    procs = [subprocess.Popen([sys.executable, WORKER, KEY, NAME, f"seed{i}", str(barrier), "2"],
                              env=_env(db_url, tmp_path / f"node{i}", **_publisher(keys)),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(2)]
    outs = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=120)
        assert p.returncode == 0, stderr
        outs.append(json.loads(stdout.strip().splitlines()[-1]))
    assert [o["outcome"] for o in outs] == ["compiled", "compiled"], "both missed"
    assert sorted(o["counts"].get("published", 0) for o in outs) == [0, 1], outs
    assert sorted(o["counts"].get("present", 0) for o in outs) == [0, 1], outs
    assert len(_rows(db_url)) == 1
    winner = next(i for i, o in enumerate(outs) if o["counts"].get("published"))
    reader = _compile(db_url, tmp_path / "node3", **_consumer(keys))
    assert reader["files"] == _sha(compiled_files(NAME, f"seed{winner}"))


def _plant(url: str, keys: Path, tmp_path: Path, how: str) -> bytes:
    """Put a kernel entry under KEY the way an attacker who can write the database
    would; returns the bytes it carries."""
    evil = triton_cache.pack(f"{NAME}.json", {f"{NAME}.json": b'{"evil": 1}',
                                         f"{NAME}.cubin": b"EVIL" * 100})
    payload = zlib.compress(evil)
    digest = hashlib.sha256(payload).hexdigest()
    if how == "unsigned":
        signature = b"x"
    elif how == "other key pair":
        other = write_key_pair(tmp_path / "attacker")
        signature = load_signer(other.private_key).sign("kernel", KEY, digest)
    elif how == "moved from another kind":
        signature = load_signer(keys / PRIVATE_KEY_NAME).sign("fxgraph", KEY, digest)
    else:  # "altered": signed by the operator's key, then its bytes changed
        signature = load_signer(keys / PRIVATE_KEY_NAME).sign(
            "kernel", KEY, hashlib.sha256(zlib.compress(b"good")).hexdigest())
    cache = tunecache.open(url)
    store = ArtifactStore(cache.database())
    assert store.put("kernel", KEY, payload, signature, "2.11.0")
    if how == "unsigned":
        cache.database().run(lambda c: c.execute(update(artifacts).values(signature=b"")),
                             write=True)
    cache.close()
    return b"EVIL"


@pytest.mark.parametrize("how", ["unsigned", "other key pair", "moved from another kind",
                                 "altered"])
def test_a_kernel_entry_that_does_not_verify_is_never_loaded(db_url, keys, tmp_path, how):
    marker = _plant(db_url, keys, tmp_path, how)
    node = tmp_path / "node"
    out = _compile(db_url, node, **_consumer(keys))
    assert out["outcome"] == "compiled", "Triton compiles the kernel as usual"
    assert out["files"] == _sha(compiled_files(NAME, "a"))
    assert out["counts"] == {"refused": 1}
    assert len(out["warnings"]) == 1 and f"compiled kernel {KEY[:24]}" in out["warnings"][0], \
        out["warnings"]
    assert not any(marker in p.read_bytes() for p in node.rglob("*") if p.is_file()), \
        "nothing of the refused entry was written where Triton reads"
    # The next publisher replaces the entry that blocks the key.
    republished = _compile(db_url, tmp_path / "node2", **_publisher(keys))
    assert republished["counts"] == {"refused": 1, "replaced": 1}
    assert _compile(db_url, tmp_path / "node3", **_consumer(keys))["outcome"] == "hit"


def test_a_signed_entry_with_file_names_outside_the_kernel_directory_is_not_written(
        sqlite_url, keys, tmp_path):
    # Even the key holder cannot make a reader write outside Triton's directory for the key.
    cache = tunecache.open(sqlite_url)
    plan = Settings.from_env({}, signing_key=str(keys / PRIVATE_KEY_NAME)).kernel_sharing()
    share = KernelShare.from_settings(plan, lambda: cache)
    hostile = triton_cache.pack(f"{NAME}.json", {f"{NAME}.json": b"{}", "../escaped": b"x"})
    assert share.publish("kernel", KEY, hostile, "2.11.0")
    cache.close()
    node = tmp_path / "node"
    out = _compile(sqlite_url, node, **_consumer(keys))
    assert out["outcome"] == "compiled" and out["counts"] == {"loaded": 1}
    assert not (node / "escaped").exists() and not (tmp_path / "escaped").exists()


@pytest.mark.parametrize("names", [["../x"], ["a/b"], ["__grp__k.json"], [".."], [""],
                                   [f"f{i}" for i in range(triton_cache.MAX_FILES + 1)]])
def test_unpack_refuses_names_that_are_not_plain_file_names(names):
    files = {n: b"x" for n in names} | {"k.json": b"{}"}
    assert triton_cache.unpack(triton_cache.pack("k.json", files)) is None


def test_unpack_refuses_lengths_that_do_not_add_up_and_a_missing_group_file():
    good = triton_cache.pack("k.json", {"k.json": b"{}", "k.cubin": b"abc"})
    assert triton_cache.unpack(good) == ("k.json", {"k.cubin": b"abc", "k.json": b"{}"})
    assert triton_cache.unpack(good + b"extra") is None
    assert triton_cache.unpack(good[:-1]) is None
    assert triton_cache.unpack(triton_cache.pack("k.json", {"k.cubin": b"abc"})) is None
    assert triton_cache.unpack(b"TCK1not json\n") is None
    assert triton_cache.unpack(b"TCK1" + b"[" * 100_000 + b"\n") is None  # nesting too deep
    assert triton_cache.unpack(b"TCG1{}\n") is None


def test_a_readonly_consumer_writes_nothing(sqlite_url, keys, tmp_path):
    _compile(sqlite_url, tmp_path / "node1", **_publisher(keys))
    db_file = Path(sqlite_url.removeprefix("sqlite:///"))
    before = (db_file.read_bytes(), _rows(sqlite_url))
    readonly = {"TUNECACHE_MODE": "readonly", **_publisher(keys)}
    hit = _compile(sqlite_url, tmp_path / "node2", **readonly)
    new = _compile(sqlite_url, tmp_path / "node2", key="ANOTHERKEY", name="triton_other",
                   **readonly)
    assert hit["outcome"] == "hit" and new["outcome"] == "compiled"
    assert "published" not in new["counts"]
    assert (db_file.read_bytes(), _rows(sqlite_url)) == before


def test_kernels_stay_local_with_TUNECACHE_KERNELS_0(sqlite_url, keys, tmp_path):
    _compile(sqlite_url, tmp_path / "node1", **_publisher(keys))
    out = _compile(sqlite_url, tmp_path / "node2", TUNECACHE_SHARE="-kernels", **_publisher(keys))
    assert out["outcome"] == "compiled" and out["counts"] == {}
    assert len(_rows(sqlite_url)) == 1


def test_without_a_key_kernels_stay_local(sqlite_url, tmp_path):
    out = _compile(sqlite_url, tmp_path / "node1")
    assert out["outcome"] == "compiled" and out["counts"] == {}
    assert _rows(sqlite_url) == [] or not Path(sqlite_url.removeprefix("sqlite:///")).exists()


def test_operator_commands_cover_kernel_entries(db_url, keys, tmp_path):
    _compile(db_url, tmp_path / "node1", **_publisher(keys))
    _compile(db_url, tmp_path / "node1", key="SECONDKEY",
             name="triton_red_fused_sum_fedcba9876543210", **_publisher(keys))
    stats = run_json("stats", "--db", db_url)["graphs"]
    assert [(r["kind"], r["count"]) for r in stats["by_kind"]] == [("kernel", 2)]
    assert "kernel 2" in run("stats", "--db", db_url).stdout
    listed = run_json("ls", "--db", db_url, "--kind", "kernel")
    assert sorted(r["key"] for r in listed) == sorted([KEY, "SECONDKEY"])

    dump = tmp_path / "kernels.jsonl"
    assert run("export", "--db", db_url, "-o", str(dump)).exit_code == 0
    target = f"sqlite:///{tmp_path / 'target.db'}"
    imported = run_json("import", "--db", target, str(dump))
    assert imported["graphs"] == {"new": 2, "kept": 0}
    out = _compile(target, tmp_path / "node2", **_consumer(keys))
    assert out["outcome"] == "hit", "an imported kernel still verifies"

    dry = run_json("prune", "--db", db_url, "--kind", "kernel", "--dry-run")
    assert dry["graphs"]["would_delete"] == 2
    pruned = run_json("prune", "--db", db_url, "--kind", "kernel")
    assert pruned["graphs"]["deleted"] == 2
    assert run_json("ls", "--db", db_url, "--kind", "kernel") == []


def test_a_kernel_load_is_counted_as_a_use(sqlite_url, keys, tmp_path):
    _compile(sqlite_url, tmp_path / "node1", **_publisher(keys))
    _compile(sqlite_url, tmp_path / "node2", **_publisher(keys))
    cache = tunecache.open(sqlite_url)
    hits = cache.database().run(lambda c: c.execute(select(func.sum(artifacts.c.hits))).scalar())
    cache.close()
    assert hits == 1


def test_stats_shows_kernels_published_against_kernels_ever_loaded(sqlite_url, keys, tmp_path):
    _compile(sqlite_url, tmp_path / "node1", **_publisher(keys))
    _compile(sqlite_url, tmp_path / "node1", key="UNUSEDKEY",
             name="triton_red_fused_sum_fedcba9876543210", **_publisher(keys))
    for node in ("node2", "node3"):
        _compile(sqlite_url, tmp_path / node, **_consumer(keys))
    [kernels] = run_json("stats", "--db", sqlite_url)["graphs"]["by_kind"]
    assert (kernels["count"], kernels["loaded"], kernels["hits"]) == (2, 1, 2)
    table = run("stats", "--db", sqlite_url).stdout
    assert "ever loaded" in table
    [row] = [line for line in table.splitlines() if line.lstrip().startswith("kernel ")]
    # kind, the Triton it was compiled by ("triton 3.8.0", or "?" without Triton), entries,
    # ever loaded
    assert re.match(r"\s*kernel\s+(triton \S+|\S+)\s+2\s+1\s", row), table


def test_the_autoload_names_the_manager_before_inductor_starts_its_workers(sqlite_url, keys,
                                                                          tmp_path):
    from tunecache import switch

    assert switch.MANAGER == triton_cache.MANAGER, "spelt out twice: they must agree"
    code = ("import os, torch\n"
            "print(os.environ.get('TRITON_CACHE_MANAGER'))\n")
    env = _env(sqlite_url, tmp_path / "node", **_publisher(keys))
    shared = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                            text=True, timeout=300)
    assert shared.stdout.strip() == triton_cache.MANAGER, shared.stderr
    env["TRITON_CACHE_MANAGER"] = "mine:Manager"
    theirs = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                            text=True, timeout=300)
    assert theirs.stdout.strip() == "mine:Manager", "a manager the user set is kept"


def _enable_in_a_process(env: dict[str, str], db: str) -> dict:
    code = (
        "import json, os, sys, tunecache\n"
        "from torch._inductor.codegen.triton import TritonScheduling\n"
        "before = TritonScheduling.define_kernel\n"
        f"on = tunecache.enable(tunecache.open({db!r}))\n"
        "during = (os.environ.get('TRITON_CACHE_MANAGER'), "
        "TritonScheduling.define_kernel is not before)\n"
        "tunecache.disable()\n"
        "print(json.dumps({'on': on, 'during': during, 'after': "
        "(os.environ.get('TRITON_CACHE_MANAGER'), TritonScheduling.define_kernel is before)}))\n")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    out["stderr"] = done.stderr
    return out


def test_enable_names_kernels_by_content_and_disable_puts_everything_back(sqlite_url, keys,
                                                                         tmp_path):
    env = _env(sqlite_url, tmp_path / "node", **_publisher(keys), TUNECACHE_SHARE="+kernels")
    env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"  # enable() alone sets the variable here
    out = _enable_in_a_process(env, sqlite_url)
    assert out["on"] is True
    assert out["during"] == [triton_cache.MANAGER, True]
    assert out["after"] == [None, True]


def test_kernels_stay_local_when_the_environment_selects_another_database(sqlite_url, keys,
                                                                          tmp_path):
    # The compile workers build the manager's service from TUNECACHE_*: a cache opened on
    # another database must not have them publish into the environment's.
    env = _env(f"sqlite:///{tmp_path / 'other.db'}", tmp_path / "node", **_publisher(keys))
    env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
    out = _enable_in_a_process(env, sqlite_url)
    assert out["during"] == [None, False], out["stderr"]


def test_enable_publishes_the_launchers_inductor_keeps_and_disable_puts_them_back(
        sqlite_url, keys, tmp_path):
    code = (
        "import json, tunecache\n"
        "from torch._inductor.runtime.triton_heuristics import CachingAutotuner as C\n"
        "names = ('precompile', 'autotune_to_one_config', 'coordinate_descent_tuning')\n"
        "before = [C.__dict__[n] for n in names]\n"
        f"on = tunecache.enable(tunecache.open({sqlite_url!r}))\n"
        "during = [C.__dict__[n] is not b for n, b in zip(names, before)]\n"
        "tunecache.disable()\n"
        "after = [C.__dict__[n] is b for n, b in zip(names, before)]\n"
        "print(json.dumps([on, during, after]))\n")
    # Triton sharing (stored configs) off: it wraps the same methods.
    env = _env(sqlite_url, tmp_path / "node", **_publisher(keys),
               TUNECACHE_SHARE="-triton", TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [True, [True] * 3, [True] * 3]
    env["TUNECACHE_SHARE"] = "-triton,-kernels"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=300)
    assert json.loads(done.stdout.strip().splitlines()[-1])[1] == [False] * 3, \
        "kernels not shared: Inductor's methods are its own"


def _ptxas_after_enable(env: dict[str, str], db: str, torch_tree: Path) -> str:
    """TRITON_PTXAS_PATH after enable(), in a process whose torch ships a ptxas of its
    own: Inductor's own _set_triton_ptxas_path finds it beside its module, which is moved
    into ``torch_tree`` (a CUDA wheel's layout; the CPU wheel has none)."""
    module = torch_tree / "_inductor" / "runtime" / "compile_tasks.py"
    code = (
        "import os, tunecache\n"
        "from torch._inductor.runtime import compile_tasks\n"
        f"compile_tasks.__file__ = {str(module)!r}\n"
        f"tunecache.enable(tunecache.open({db!r}))\n"
        "print(os.environ.get('TRITON_PTXAS_PATH'))\n")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]


def _workers_ptxas(env: dict[str, str], torch_tree: Path) -> str:
    """TRITON_PTXAS_PATH as Inductor's compile workers set it, without tunecache."""
    module = torch_tree / "_inductor" / "runtime" / "compile_tasks.py"
    code = ("import os\nfrom torch._inductor.runtime import compile_tasks\n"
            f"compile_tasks.__file__ = {str(module)!r}\n"
            "compile_tasks._set_triton_ptxas_path()\n"
            "print(os.environ.get('TRITON_PTXAS_PATH'))\n")
    done = subprocess.run([sys.executable, "-c", code], env={**env, "TUNECACHE_MODE": "off"},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]


def test_sharing_kernels_compiles_in_this_process_with_the_compile_workers_ptxas(
        sqlite_url, keys, tmp_path):
    # Triton's key holds `ptxas --version`; Inductor's compile workers take torch's own
    # ptxas at start. A kernel compiled here with another ptxas had another key, and a
    # job that compiled it here never found what a worker of another job published.
    # Where the wheel keeps it moved (torch/_inductor/bin in 2.13, torch/bin in 2.15):
    # one in each place, and the one Inductor's own function picks is the workers'.
    for where in ("_inductor/bin", "bin"):
        ptxas = tmp_path / "torch" / where / "ptxas"
        ptxas.parent.mkdir(parents=True)
        ptxas.write_text("#!/bin/sh\necho 'Cuda compilation tools, release 12.9'\n")
        ptxas.chmod(0o755)
    env = _env(sqlite_url, tmp_path / "node", **_publisher(keys))
    env.pop("TRITON_PTXAS_PATH", None)
    workers = _workers_ptxas(env, tmp_path / "torch")
    assert workers.startswith(str(tmp_path / "torch")), workers
    assert _ptxas_after_enable(env, sqlite_url, tmp_path / "torch") == workers
    env["TUNECACHE_SHARE"] = "-kernels"
    assert _ptxas_after_enable(env, sqlite_url, tmp_path / "torch") == "None", \
        "kernels not shared: nothing changes"
    env.pop("TUNECACHE_SHARE")
    env["TRITON_PTXAS_PATH"] = "/opt/cuda/bin/ptxas"
    assert _ptxas_after_enable(env, sqlite_url, tmp_path / "torch") == "/opt/cuda/bin/ptxas", \
        "a ptxas the user named is kept"


class _Emitted:
    """A kernel whose wrapper code is emitted elsewhere (Inductor's hook for external
    template handlers): define_kernel then only names it."""

    def emit_kernel_override(self, *args: object) -> bool:
        return True


def _names_in_one_graph(sources: list[str]) -> list[str]:
    """The names Inductor's own TritonScheduling.define_kernel gives these kernel sources,
    defined in this order in one graph."""
    import torch
    from torch._inductor.codegen.triton import TritonScheduling
    from torch._inductor.codegen.wrapper import PythonWrapperCodegen
    from torch._inductor.graph import GraphLowering
    from torch._inductor.virtualized import V

    graph = GraphLowering(torch.fx.symbolic_trace(torch.nn.Identity()))
    with V.set_graph_handler(graph):
        graph.wrapper_code = PythonWrapperCodegen.create(False, "", None, None)
        scheduling = TritonScheduling(None)
        return [scheduling.define_kernel(src, [], _Emitted()) for src in sources]


def test_a_kernel_is_named_by_its_source_whatever_its_position_in_the_graph():
    from tunecache.inductor import kernel_sharing
    from tunecache.process import PROCESS

    kernel = "@triton_heuristics.pointwise()\n@triton.jit\ndef KERNEL_NAME(x): pass  # {}\n"
    a, b = kernel.format("a"), kernel.format("b")
    assert _names_in_one_graph([a, b]) == ["triton_poi_fused_0", "triton_poi_fused_1"]
    mark = PROCESS.ledger.mark()
    try:
        kernel_sharing._install_content_names()
        first = _names_in_one_graph([a, b, a])
        second = _names_in_one_graph([b, a])  # a graph where the same kernels moved
    finally:
        PROCESS.ledger.undo(mark)
    suffix = kernel_sharing.content_suffix
    assert first == [f"triton_poi_fused_{suffix(a)}", f"triton_poi_fused_{suffix(b)}",
                     f"triton_poi_fused_{suffix(a)}"], "one source, one kernel"
    assert second == [first[1], first[0]]
    assert _names_in_one_graph([b]) == ["triton_poi_fused_0"], "Inductor's names are back"


# A Python extension module in C, as Triton generates its launchers and driver utilities
# and builds them with the host's compiler (triton/runtime/build.py).
_MODULE_SOURCE = """
#include <Python.h>
static PyObject *answer(PyObject *self, PyObject *args) { return PyLong_FromLong(%d); }
static PyMethodDef methods[] = {{"answer", answer, METH_NOARGS, NULL}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "tc_probe", NULL, -1, methods};
PyMODINIT_FUNC PyInit_tc_probe(void) { return PyModule_Create(&module); }
"""
_BUILD_MODULE = (
    "import json, sys\n"
    "from triton.runtime.build import compile_module_from_src\n"
    "import dataclasses, tunecache\n"
    "module = compile_module_from_src(sys.argv[1], 'tc_probe')\n"
    "counts = {k: n for k, n in dataclasses.asdict(tunecache.stats().kernels).items() if n}\n"
    "print(json.dumps({'answer': module.answer(), 'counts': counts}))\n")


def _build_module(url: str, node: Path, answer: int, **env: str) -> subprocess.CompletedProcess:
    pytest.importorskip("triton.runtime.build")
    return subprocess.run(
        [sys.executable, "-c", _BUILD_MODULE, _MODULE_SOURCE % answer],
        env=_env(url, node, TRITON_CACHE_MANAGER=triton_cache.MANAGER, **env),
        capture_output=True, text=True, timeout=300)


def test_a_module_triton_builds_from_c_loads_on_another_node_without_a_compiler(
        sqlite_url, keys, tmp_path):
    built = _build_module(sqlite_url, tmp_path / "node1", 42, **_publisher(keys))
    assert built.returncode == 0, built.stderr
    out = json.loads(built.stdout.strip().splitlines()[-1])
    assert out == {"answer": 42, "counts": {"absent": 1, "published": 1}}
    # CC=false: a build on this node fails, so the module can only come from the store.
    loaded = _build_module(sqlite_url, tmp_path / "node2", 42, CC="false", **_consumer(keys))
    assert loaded.returncode == 0, loaded.stderr
    assert json.loads(loaded.stdout.strip().splitlines()[-1]) == {
        "answer": 42, "counts": {"loaded": 1}}


def test_a_module_signed_with_another_key_is_never_loaded(sqlite_url, keys, tmp_path):
    assert _build_module(sqlite_url, tmp_path / "node1", 42, **_publisher(keys)).returncode == 0
    write_key_pair(tmp_path / "other")
    stranger = {"TUNECACHE_VERIFY_KEY": str(tmp_path / "other" / PUBLIC_KEY_NAME)}
    refused = _build_module(sqlite_url, tmp_path / "node2", 42, CC="false", **stranger)
    assert refused.returncode != 0, "the stored module was loaded without verifying"
    rebuilt = _build_module(sqlite_url, tmp_path / "node3", 42, **stranger)
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert json.loads(rebuilt.stdout.strip().splitlines()[-1])["answer"] == 42

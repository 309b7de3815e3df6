"""Compiled graphs through the operator commands: stats, ls --graphs, prune (age, torch,
size budget, blob files, orphans), export/import/merge, and hostile rows and lines."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import time
from pathlib import Path

import pytest
from cli_helpers import gemm_key, populate, run, run_json
from sqlalchemy import text, update

from tunecache.settings import resolve_db_url
from tunecache.store import ArtifactStore, Database, ensure_schema
from tunecache.store.blobs import ORPHAN_SECONDS
from tunecache.store.schema import artifacts

SIG = b"\x07" * 64


def _store(url: str) -> ArtifactStore:
    db = Database(resolve_db_url(url))
    ensure_schema(db)
    return ArtifactStore(db)


def _publish(url: str, *graphs: tuple[str, str, int, str], age: float = 0.0) -> None:
    """Publish (kind, key, size, torch) graphs; ``age``: pretend their last use was that
    many seconds ago (time is the only thing faked)."""
    store = _store(url)
    for kind, key, size, torch in graphs:
        assert store.put(kind, key, os.urandom(size), SIG, torch)
        if age:
            when = time.time() - age
            statement = (update(artifacts)
                         .where(artifacts.c.kind == kind, artifacts.c.cache_key == key)
                         .values(last_used_at=when, created_at=when))
            store.db.run(lambda c, s=statement: c.execute(s), write=True)
    store.db.dispose()


def _blobs(url: str) -> list[Path]:
    root = Path(url.removeprefix("sqlite:///") + ".blobs")
    return sorted(p for p in root.glob("??/*") if len(p.name) == 64)


def _keys(url: str) -> list[str]:
    return sorted(r["key"] for r in run_json("ls", "--db", url, "--graphs", "--limit", "1000"))


def test_stats_counts_compiled_graphs_by_kind_and_torch(db_url):
    populate(db_url, [gemm_key("mm", 0)])
    _publish(db_url, ("fxgraph", "f1", 1000, "2.13.0"), ("fxgraph", "f2", 3000, "2.13.0"),
             ("autograd", "a1", 500, "2.12.0"))
    data = run_json("stats", "--db", db_url)
    graphs = data["graphs"]
    assert (graphs["count"], graphs["bytes"]) == (3, 4500)
    assert [(r["kind"], r["count"], r["bytes"]) for r in graphs["by_kind"]] == [
        ("fxgraph", 2, 4000), ("autograd", 1, 500)]
    assert [(r["torch"], r["count"], r["bytes"]) for r in graphs["by_torch"]] == [
        ("2.13.0", 2, 4000), ("2.12.0", 1, 500)]
    assert data["entries"]["total"] == 1, "graphs are not tuning entries"
    if db_url.startswith("sqlite"):
        assert (graphs["blob_dir"]["files"], graphs["blob_dir"]["bytes"]) == (3, 4500)
    human = run("stats", "--db", db_url).stdout
    assert "graphs    3 compiled graphs, 4.4 KiB (fxgraph 2, autograd 1)" in human


def test_ls_graphs_lists_most_recently_used_first_and_filters(db_url):
    _publish(db_url, ("fxgraph", "old", 10, "2.12.0"), age=86400)
    _publish(db_url, ("fxgraph", "new", 10, "2.13.0"), ("autograd", "a", 10, "2.13.0"))
    rows = run_json("ls", "--db", db_url, "--graphs")
    assert [r["key"] for r in rows][-1] == "old"
    assert {r["key"] for r in rows} == {"old", "new", "a"}
    assert [r["key"] for r in run_json("ls", "--db", db_url, "--kind", "autograd")] == ["a"]
    assert [r["key"] for r in run_json("ls", "--db", db_url, "--graphs", "--torch",
                                       "2.12.0")] == ["old"]
    assert run_json("ls", "--db", db_url) == [], "plain ls lists tuning entries only"
    bad = run("ls", "--db", db_url, "--graphs", "--op", "mm")
    assert bad.exit_code == 2 and len(bad.stderr.strip().splitlines()) == 1


def test_prune_deletes_graphs_by_age_and_by_torch_with_their_blobs(db_url):
    _publish(db_url, ("fxgraph", "old", 100, "2.13.0"), ("autograd", "old", 100, "2.13.0"),
             age=40 * 86400)
    _publish(db_url, ("fxgraph", "new", 100, "2.13.0"), ("fxgraph", "t12", 100, "2.12.0"))
    # A filter on a label graphs lack selects none of them.
    out = run_json("prune", "--db", db_url, "--older-than", "30d", "--op", "mm")
    assert out["graphs"]["deleted"] == 0
    dry = run_json("prune", "--db", db_url, "--older-than", "30d", "--dry-run")
    assert dry["graphs"]["would_delete"] == 2 and len(_keys(db_url)) == 4
    out = run_json("prune", "--db", db_url, "--older-than", "30d")
    assert (out["graphs"]["deleted"], out["graphs"]["freed_bytes"]) == (2, 200)
    assert _keys(db_url) == ["new", "t12"]
    out = run_json("prune", "--db", db_url, "--torch", "2.12.0")
    assert out["graphs"]["deleted"] == 1 and _keys(db_url) == ["new"]
    if db_url.startswith("sqlite"):
        assert len(_blobs(db_url)) == 1
    human = run("prune", "--db", db_url, "--kind", "fxgraph", "--no-vacuum")
    assert human.stdout.splitlines()[-1] == (
        "deleted 1 compiled graph (100 B), 0 orphan blob files (0 B)")
    assert _keys(db_url) == []


def test_prune_to_a_size_budget_removes_least_recently_used_first(db_url):
    for i, age in enumerate((50, 10, 40, 20, 30)):
        _publish(db_url, ("fxgraph", f"g{i}", 1000, "2.13.0"), age=age * 3600)
    dry = run_json("prune", "--db", db_url, "--max-graph-bytes", "2.5KB", "--dry-run")
    assert sorted(g["key"] for g in dry["graphs"]["graphs"]) == ["g0", "g2", "g4"]
    assert len(_keys(db_url)) == 5
    out = run_json("prune", "--db", db_url, "--max-graph-bytes", "2.5KB")
    assert out["graphs"]["deleted"] == 3 and out["deleted"] == 0
    assert _keys(db_url) == ["g1", "g3"]
    assert run_json("prune", "--db", db_url, "--max-graph-bytes", "2000B")["graphs"][
        "deleted"] == 0
    bad = run("prune", "--db", db_url, "--max-graph-bytes", "2")
    assert bad.exit_code == 2 and "unit" in bad.stderr
    assert run_json("prune", "--db", db_url, "--max-graph-bytes", "0B")["graphs"]["deleted"] == 2


def test_a_graph_used_since_the_prune_read_it_is_kept(db_url):
    _publish(db_url, ("fxgraph", "g", 100, "2.13.0"), age=7200)
    store = _store(db_url)
    [info] = [x for page in store.infos() for x in page]
    assert store.get("fxgraph", "g") is not None  # records the use: older than an hour
    assert store.delete([info]) == (0, 0)
    assert store.get("fxgraph", "g") is not None
    store.db.dispose()


def test_prune_keeps_a_blob_another_row_still_references(sqlite_url):
    store = _store(sqlite_url)
    payload = os.urandom(5000)
    store.put("fxgraph", "a", payload, SIG, "2.12.0")
    store.put("fxgraph", "b", payload, SIG, "2.13.0")
    assert len(_blobs(sqlite_url)) == 1
    run_json("prune", "--db", sqlite_url, "--torch", "2.12.0")
    assert store.get("fxgraph", "b").payload == payload
    run_json("prune", "--db", sqlite_url, "--torch", "2.13.0")
    assert _blobs(sqlite_url) == []
    store.db.dispose()


def test_prune_removes_orphan_blob_files_older_than_an_hour(sqlite_url):
    _publish(sqlite_url, ("fxgraph", "kept", 100, "2.13.0"))
    root = Path(sqlite_url.removeprefix("sqlite:///") + ".blobs")
    old_time = time.time() - ORPHAN_SECONDS - 60

    def orphan(age: float | None) -> Path:
        data = os.urandom(300)
        digest = hashlib.sha256(data).hexdigest()
        path = root / digest[:2] / digest
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        if age is not None:
            os.utime(path, (age, age))
        return path

    old, fresh = orphan(old_time), orphan(None)
    tmp = old.parent / (old.name + ".tmp.123.abcd")
    tmp.write_bytes(b"half")
    os.utime(tmp, (old_time, old_time))
    dry = run_json("prune", "--db", sqlite_url, "--max-graph-bytes", "1GB", "--dry-run")
    assert dry["graphs"]["orphans"]["orphan_blobs"] == 1 and old.exists()
    out = run_json("prune", "--db", sqlite_url, "--max-graph-bytes", "1GB")
    assert out["graphs"]["orphans"] == {"orphan_blobs": 1, "orphan_bytes": 300,
                                        "stale_files": 1}
    assert not old.exists() and not tmp.exists()
    assert fresh.exists(), "a blob younger than an hour may be a publish in flight"
    assert _store(sqlite_url).get("fxgraph", "kept") is not None


def test_export_import_round_trip_carries_graphs_and_signatures(db_url, tmp_path):
    populate(db_url, [gemm_key("mm", 0)])
    payload = os.urandom(100_000)
    store = _store(db_url)
    store.put("fxgraph", "fx", payload, b"signed-by-someone", "2.13.0")
    store.put("autograd", "ag", b"tiny", SIG, "2.12.0")
    store.db.dispose()
    dump = tmp_path / "out.jsonl"
    assert run("export", "--db", db_url, "-o", str(dump)).exit_code == 0
    lines = dump.read_text().splitlines()
    header = json.loads(lines[0])
    assert (header["version"], header["entries"], header["graphs"]) == (2, 1, 2)

    target = f"sqlite:///{tmp_path / 'target.db'}"
    first = run_json("import", "--db", target, str(dump))
    assert (first["new"], first["graphs"]) == (1, {"new": 2, "kept": 0})
    again = run_json("import", "--db", target, str(dump))
    assert again["graphs"] == {"new": 0, "kept": 2}
    got = _store(target).get("fxgraph", "fx")
    assert (got.payload, got.signature, got.torch_version) == (
        payload, b"signed-by-someone", "2.13.0")

    only_torch = tmp_path / "t.jsonl"
    run("export", "--db", db_url, "--torch", "2.12.0", "-o", str(only_torch))
    assert [json.loads(x)["graph"]["key"] for x in only_torch.read_text().splitlines()[1:]
            if x.startswith('{"graph"')] == ["ag"]
    plain = tmp_path / "plain.jsonl"
    run("export", "--db", db_url, "--no-graphs", "-o", str(plain))
    assert json.loads(plain.read_text().splitlines()[0])["version"] == 1
    assert len(plain.read_text().splitlines()) == 2


def test_merge_carries_graphs(db_url, tmp_path):
    _publish(db_url, ("fxgraph", "fx", 1000, "2.13.0"))
    target = f"sqlite:///{tmp_path / 'target.db'}"
    out = run_json("merge", db_url, "--db", target)
    assert out["graphs"] == {"new": 1, "kept": 0}
    assert _store(target).get("fxgraph", "fx") is not None


def _graph_line(**fields) -> str:
    graph = {"kind": "fxgraph", "key": "k", "torch": "2.13.0",
             "signature": base64.b64encode(SIG).decode(),
             "payload": base64.b64encode(b"payload").decode(), **fields}
    return json.dumps({"graph": graph})


HOSTILE = {
    "not an object": json.dumps({"graph": [1, 2]}),
    "path as kind": _graph_line(kind="../../x"),
    "long key": _graph_line(key="k" * 600),
    "huge key": _graph_line(key="k" * 3_000_000),
    "key not text": _graph_line(key={"a": 1}),
    "payload not base64": _graph_line(payload="**not base64**"),
    "payload a number": _graph_line(payload=12),
    "digest mismatch": _graph_line(digest="0" * 64),
    "no signature": _graph_line(signature=None),
    "empty signature": _graph_line(signature=""),
    "huge signature": _graph_line(signature=base64.b64encode(b"s" * 10_000).decode()),
    "torch a number": _graph_line(torch=2.13),
}


def test_import_reports_each_hostile_graph_line_in_one_line_and_keeps_the_good(tmp_path):
    target = f"sqlite:///{tmp_path / 'target.db'}"
    header = json.dumps({"format": "tunecache-export", "version": 2})
    good = _graph_line(key="good")
    dump = tmp_path / "hostile.jsonl"
    dump.write_text("\n".join([header, *HOSTILE.values(), good]) + "\n")
    result = run("import", "--db", target, str(dump))
    assert result.exit_code == 1
    errors = [x for x in result.stderr.splitlines() if x.startswith(str(dump))]
    assert len(errors) == len(HOSTILE), result.stderr
    assert all(len(x) < 300 for x in errors), "one short line each, no key echoed"
    data = run_json("import", "--db", target, str(dump), "--skip-invalid")
    assert data["invalid"] == len(HOSTILE) and data["graphs"]["kept"] == 1
    assert _store(target).get("fxgraph", "good").payload == b"payload"


def test_a_newer_export_version_is_refused_in_one_line(tmp_path):
    dump = tmp_path / "v3.jsonl"
    dump.write_text(json.dumps({"format": "tunecache-export", "version": 3}) + "\n")
    result = run("import", "--db", f"sqlite:///{tmp_path / 't.db'}", str(dump))
    assert result.exit_code == 1
    assert result.stderr.count("\n") == 1 and "versions 1, 2" in result.stderr


@pytest.mark.parametrize("column,value,readable", [
    ("size", "'many'", False), ("digest", "'../../etc/passwd'", False),
    ("created_at", "'yesterday'", False), ("torch_version", "x'00'", False),
    ("signature", "'text'", False),
    # Bookkeeping only: the graph itself still reads.
    ("last_used_at", "x'00'", True),
    # Longer than any key a put accepts: not a key, so not a graph anyone can ask for.
    ("cache_key", "'" + "k" * 100_000 + "'", False),
])
def test_hostile_graph_rows_never_crash_an_operator_command(sqlite_url, tmp_path, column,
                                                            value, readable):
    _publish(sqlite_url, ("fxgraph", "good", 100, "2.13.0"), ("fxgraph", "bad", 100, "2.13.0"))
    store = _store(sqlite_url)
    store.db.run(lambda c: c.execute(text(
        f"UPDATE tunecache_artifacts SET {column} = {value} WHERE cache_key = 'bad'")),
        write=True)
    store.db.dispose()
    for args in (("stats",), ("ls", "--graphs"), ("stats", "--json"),
                 ("ls", "--graphs", "--json"),
                 ("export", "-o", str(tmp_path / "x.jsonl")),
                 ("prune", "--max-graph-bytes", "1GB", "--dry-run")):
        result = run(*args, "--db", sqlite_url)
        assert result.exit_code == 0, (args, result.output)
    exported = (tmp_path / "x.jsonl").read_text().splitlines()
    keys = [json.loads(x)["graph"]["key"] for x in exported if x.startswith('{"graph"')]
    assert keys == (["bad", "good"] if readable else ["good"]), \
        "an unreadable graph is never shipped"
    out = run_json("prune", "--db", sqlite_url, "--max-graph-bytes", "0B")
    assert out["graphs"]["deleted"] == 2
    assert run_json("ls", "--db", sqlite_url, "--graphs") == []


def _graph_rows(url: str) -> dict[str, tuple]:
    rows = run_json("ls", "--db", url, "--graphs", "--limit", "1000")
    return {r["key"]: (r["created_at"], r["last_used_at"], r["hits"]) for r in rows}


def test_import_and_merge_keep_a_graphs_age_and_loads_from_the_source(db_url, tmp_path):
    # They took the import's time as created_at and 0 loads, so `prune --older-than` aged
    # an imported graph from the import, unlike an imported entry.
    src = f"sqlite:///{tmp_path / 'src.db'}"
    _publish(src, ("fxgraph", "old", 100, "2.13.0"), age=40 * 86400)
    _publish(src, ("fxgraph", "new", 100, "2.13.0"))
    store = _store(src)
    store.db.run(lambda c: c.execute(update(artifacts).where(artifacts.c.cache_key == "old")
                                     .values(hits=7)), write=True)
    store.db.dispose()
    source = _graph_rows(src)
    assert source["old"][2] == 7
    out = tmp_path / "graphs.jsonl"
    assert run("export", "--db", src, "-o", str(out)).exit_code == 0
    lines = {g["key"]: g for g in (json.loads(x)["graph"] for x in
                                   out.read_text().splitlines()[1:])}
    assert (lines["old"]["hits"], lines["old"]["last_used_at"]) == (7, source["old"][1])

    target = f"sqlite:///{tmp_path / 'imported.db'}" if db_url.startswith("sqlite") else db_url
    assert run("import", str(out), "--db", target).exit_code == 0
    assert _graph_rows(target) == source
    merged = f"sqlite:///{tmp_path / 'merged.db'}"
    assert run("merge", src, "--into", merged).exit_code == 0
    assert _graph_rows(merged) == source
    dry = run_json("prune", "--db", target, "--older-than", "30d", "--dry-run")
    assert [g["key"] for g in dry["graphs"]["graphs"]] == ["old"]


def test_an_imported_graph_time_in_the_future_becomes_the_imports(sqlite_url, tmp_path):
    src = f"sqlite:///{tmp_path / 'src.db'}"
    _publish(src, ("fxgraph", "g", 100, "2.13.0"))
    out = tmp_path / "graphs.jsonl"
    assert run("export", "--db", src, "-o", str(out)).exit_code == 0
    header, line = out.read_text().splitlines()
    graph = json.loads(line)
    graph["graph"].update(created_at=4e9, last_used_at=4e9)  # the year 2096
    out.write_text(header + "\n" + json.dumps(graph) + "\n")
    before = time.time()
    assert run("import", str(out), "--db", sqlite_url).exit_code == 0
    created, last, _ = _graph_rows(sqlite_url)["g"]
    assert before - 1 <= created <= time.time() + 1 and before - 1 <= last <= time.time() + 1
    graph["graph"]["hits"] = -3
    out.write_text(header + "\n" + json.dumps(graph) + "\n")
    bad = run("import", str(out), "--db", f"sqlite:///{tmp_path / 'other.db'}")
    assert bad.exit_code == 1
    assert "line 2: \"hits\" is -3, not a count of loads" in bad.stderr

"""What the commands say: one-line usage errors, honest words in show, prune and warm."""

from __future__ import annotations

from cli_helpers import run


def test_a_usage_error_is_one_line_naming_the_help_with_exit_2(sqlite_url):
    cases = {
        ("prune", "--bogus"): "Error: No such option '--bogus' (see 'tunecache prune --help')",
        ("bogus",): "Error: No such command 'bogus' (see 'tunecache --help')",
        ("show",): "Error: Missing argument 'KEY_HASH_PREFIX' (see 'tunecache show --help')",
    }
    for args, line in cases.items():
        result = run(*args)
        assert result.exit_code == 2, result.output
        assert result.stderr == line + "\n", result.stderr


def test_show_does_not_call_a_candidate_a_best_only_import_left_unmeasured_failed(
        sqlite_url, tmp_path):
    from cli_helpers import gemm_key, populate

    (entry,) = populate(sqlite_url, [gemm_key("mm", 0)])
    out = tmp_path / "best.jsonl"
    assert run("export", "--db", sqlite_url, "--best-only", "-o", str(out)).exit_code == 0
    target = f"sqlite:///{tmp_path / 'target.db'}"
    assert run("import", str(out), "--db", target).exit_code == 0
    shown = run("show", entry.key_hash, "--db", target)
    assert shown.exit_code == 0
    lines = shown.stdout.splitlines()
    assert lines[lines.index("timings (ms, fastest first):") + 1:] == [
        "             1  aten",
        "     no timing  triton",
        "  (no timing: the candidate failed to run, or was not measured: a --best-only "
        "export keeps only the winner's)"]
    assert "failed" not in shown.stdout.replace("failed to run", "")


def test_one_of_a_thing_is_said_in_the_singular(sqlite_url, tmp_path):
    from cli_helpers import fail_key, gemm_key, populate

    populate(sqlite_url, [gemm_key("mm", 0)])
    fail_key(sqlite_url, gemm_key("mm", 1))
    out = tmp_path / "one.jsonl"
    exported = run("export", "--db", sqlite_url, "-o", str(out))
    assert exported.stderr == "exported 1 entry\n"
    stats = run("stats", "--db", sqlite_url).stdout.splitlines()
    assert "failed    1 key" in stats
    pruned = run("prune", "--db", sqlite_url, "--failed", "--no-vacuum").stdout.splitlines()
    assert pruned[0].startswith("deleted 1 entry in 1 batch (")


def test_merge_says_merged_and_json_keys_are_the_texts_words(sqlite_url, tmp_path):
    import json

    from cli_helpers import gemm_key, populate

    src = f"sqlite:///{tmp_path / 'src.db'}"
    populate(src, [gemm_key("mm", i) for i in range(2)])
    populate(sqlite_url, [gemm_key("mm", 0)])
    text = run("merge", src, "--into", sqlite_url, "--dry-run")
    assert text.stdout == (f"would merge into {sqlite_url}: 1 new, 0 replaced, 1 kept, 0 busy "
                           "(being tuned), 0 invalid (on conflict: keep)\n")
    merged = run("merge", src, "--into", sqlite_url)
    assert merged.stdout == (f"merged into {sqlite_url}: 1 new, 0 replaced, 1 kept, 0 busy "
                             "(being tuned), 0 invalid (on conflict: keep)\n")
    again = json.loads(run("merge", src, "--into", sqlite_url, "--json").stdout)
    assert (again["new"], again["replaced"], again["kept"], again["busy"], again["invalid"]) \
        == (0, 0, 2, 0, 0)
    assert again["graphs"] == {"new": 0, "kept": 0}
    assert "inserted" not in again and "unchanged" not in again

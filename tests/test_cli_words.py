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

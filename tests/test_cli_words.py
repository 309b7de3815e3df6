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

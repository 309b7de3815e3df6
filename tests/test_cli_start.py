"""The CLI starts without SQLAlchemy, Alembic or torch, and its spelled-out lists agree
with the library's and the operator's page (docs/operating.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from cli_helpers import run

from tunecache.cli import exchanging, options
from tunecache.ops import exchange

OPERATING = Path(__file__).resolve().parents[1] / "docs" / "operating.md"
HEAVY = ("sqlalchemy", "alembic", "torch")


def test_cli_help_imports_no_database_library_or_torch():
    """Each command, --help included, took 0.6-1.1 s to start: importing the CLI imported
    SQLAlchemy and Alembic. They load inside the commands that use a database."""
    script = (
        "import sys, json\n"
        "from tunecache.cli import cli\n"
        "try:\n"
        "    cli(['--help'], prog_name='tunecache')\n"
        "except SystemExit:\n"
        "    pass\n"
        f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          check=True, timeout=120)
    assert json.loads(done.stdout.splitlines()[-1]) == []


def test_conflict_policies_offered_by_the_cli_are_the_librarys():
    for command in (exchanging.import_, exchanging.merge):
        (option,) = [p for p in command.params if p.name == "on_conflict"]
        assert tuple(option.type.choices) == exchange.CONFLICT_POLICIES


def test_the_operating_docs_and_prune_help_name_the_same_kinds():
    assert f"# kinds: {options.KINDS}\n" in OPERATING.read_text()
    help_text = " ".join(run("prune", "--help").stdout.split())
    assert f"Only entries of these kinds: {options.KINDS}" in help_text


def test_stats_on_a_current_database_imports_no_alembic(tmp_path):
    """Every command opens the database and compares its revision with the head; on a
    database already at head that needs no Alembic (about 0.2 s of a command's start)."""
    db = tmp_path / "tune.db"
    assert run("upgrade", "--db", str(db)).exit_code == 0
    script = (
        "import sys, json\n"
        "from tunecache.cli import cli\n"
        "try:\n"
        f"    cli(['stats', '--db', {str(db)!r}], prog_name='tunecache')\n"
        "except SystemExit as e:\n"
        "    assert not e.code, e.code\n"
        "print(json.dumps('alembic' in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          check=True, timeout=120)
    assert json.loads(done.stdout.splitlines()[-1]) is False

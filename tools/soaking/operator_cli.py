"""The operator: tunecache's CLI run while jobs run, each command judged on its exit code
and output."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from typing import Any

from .common import CLI_TIMEOUT, OPERATOR_EVERY, read_plants

# Placeholders in a command: the hash of a row the adversary planted (a different case
# each time), and the operator's export file.
PLANTED, EXPORT = "{planted}", "{export}"
OPERATOR_COMMANDS = [
    ("cli_stats", ["stats"]),
    ("cli_ls", ["ls"]),
    ("cli_prune", ["prune", "--max-graph-bytes", "256KiB", "--older-than", "30d"]),
    ("cli_ls", ["ls", "--graphs"]),
    ("cli_stats", ["stats", "--json"]),
    ("cli_ls", ["ls", "--json", "--limit", "200"]),
    ("cli_prune", ["prune", "--max-graph-bytes", "64KiB", "--older-than", "7d", "--dry-run"]),
    ("cli_ls", ["ls", "--graphs", "--json"]),
    ("cli_show", ["show", PLANTED]),
    ("cli_export", ["export", "-o", EXPORT]),
    ("cli_prune", ["prune", "--invalid", "--dry-run"]),
    ("cli_export", ["export", "--best-only", "-o", EXPORT]),
]
# The last round, once every worker has stopped: each symlink planted is seen by a prune.
FINAL_COMMANDS = [
    ("cli_prune", ["prune", "--max-graph-bytes", "256KiB", "--older-than", "30d"]),
    ("cli_ls", ["ls", "--graphs"]),
    ("cli_stats", ["stats"]),
    ("cli_stats", ["stats", "--json"]),
    ("cli_show", ["show", PLANTED]),
    ("cli_prune", ["prune", "--invalid", "--dry-run"]),
    ("cli_export", ["export", "-o", EXPORT]),
    ("cli_export", ["export", "--best-only", "-o", EXPORT]),
]
# What a terminal would act on: C0 controls but tab and newline, DEL and C1 controls.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def _not_json(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def strict_json(text: str) -> bool:
    """Whether ``text`` is one JSON value, or JSON lines, as any parser reads them: no
    NaN or Infinity tokens."""
    try:
        json.loads(text, parse_constant=_not_json)
        return True
    except ValueError:
        pass
    try:
        for line in text.splitlines():
            if line.strip():
                json.loads(line, parse_constant=_not_json)
    except ValueError:
        return False
    return True


def judge_cli(args: list[str], rc: int, out: bytes, err: bytes) -> tuple[str, str]:
    """("ok" | "error" | "failed", why) of one operator command: exit 0 with clean
    output, or 1/2 with a one-line error, and never a traceback."""
    try:
        text, errors = out.decode(), err.decode()
    except UnicodeDecodeError:
        return "failed", "output is not UTF-8"
    if "Traceback (most recent call last)" in errors:
        return "failed", "traceback: " + errors.strip().splitlines()[-1][:200]
    bad = _CONTROL.search(text + errors)
    if bad:
        return "failed", f"raw control character {bad.group()!r} in the output"
    if rc == 0:
        if "--json" in args and not strict_json(text):
            return "failed", "--json output is not strict JSON"
        if args[0] == "export":
            with open(args[args.index("-o") + 1], "rb") as f:
                try:
                    written = f.read().decode()
                except UnicodeDecodeError:
                    return "failed", "the export file is not UTF-8"
            if _CONTROL.search(written) or not strict_json(written):
                return "failed", "the export file is not strict JSON lines"
        return "ok", ""
    lines = [line for line in errors.splitlines() if line.strip()]
    if rc in (1, 2) and len(lines) == 1:
        return "error", lines[0][:200]
    return "failed", f"exit status {rc} with {len(lines)} lines on stderr"


class Operator(threading.Thread):
    """Runs `tunecache stats`, `ls` and `prune` now and then, as an operator would, each
    as a subprocess in a session of its own under CLI_TIMEOUT (past it, its process group
    is killed and it counts as hung). The environment is the operator's: none of the
    workers' TUNECACHE_* settings."""

    def __init__(self, url: str, deadline: float, logdir: str) -> None:
        super().__init__(name="soak-operator", daemon=True)
        self.url, self.deadline, self.logdir = url, deadline, logdir
        self.shown = 0  # show: the planted row of which case comes next
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("TUNECACHE_")}
        self.runs: list[dict[str, Any]] = []
        self._halt = threading.Event()
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None

    def run(self) -> None:
        n = 0
        while not self._halt.wait(OPERATOR_EVERY) and time.time() < self.deadline:
            self.command(*OPERATOR_COMMANDS[n % len(OPERATOR_COMMANDS)])
            n += 1

    def planted(self) -> str | None:
        """The hash of a row the adversary wrote, of the next case by turns."""
        last: dict[str, str] = {}
        for plant in read_plants(self.logdir):
            if plant.get("rows"):
                last[plant["case"]] = plant["rows"][-1]
        if not last:
            return None
        self.shown += 1
        return last[sorted(last)[self.shown % len(last)]]

    def command(self, case: str, args: list[str], final: bool = False) -> None:
        planted = self.planted() if PLANTED in args else None
        if PLANTED in args and planted is None:
            return  # nothing planted yet
        export = os.path.join(self.logdir, "export.jsonl")
        args = [(planted or a) if a == PLANTED else export if a == EXPORT else a for a in args]
        argv = [sys.executable, "-m", "tunecache.cli", *args, "--db", self.url]
        start = time.time()
        with self._lock:
            if self._halt.is_set() and not final:
                return  # stopped meanwhile
            proc = self._proc = subprocess.Popen(
                argv, env=self.env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, start_new_session=True)
        try:
            out, err = proc.communicate(timeout=CLI_TIMEOUT)
            outcome, why = judge_cli(args, proc.returncode, out, err)
            if final and outcome == "error":
                # The last round runs on a quiet database (no chaos, no outage): an error
                # there is the command's own, e.g. a hostile row it cannot get past.
                outcome, why = "failed", f"error with no chaos: {why}"
        except subprocess.TimeoutExpired:
            kill_group(proc)
            proc.communicate()
            outcome, why = "hang", f"still running after {CLI_TIMEOUT:g}s"
        finally:
            with self._lock:
                self._proc = None
        self.runs.append({"case": case, "args": args, "rc": proc.returncode,
                          "start": start, "seconds": round(time.time() - start, 2),
                          "outcome": outcome, "why": why})

    def stop(self, kill: bool) -> None:
        """Start no more commands; ``kill``: kill the one under way (an interrupted soak
        leaves none behind), else let it end (CLI_TIMEOUT bounds it)."""
        self._halt.set()
        if kill:
            with self._lock:
                if self._proc is not None:
                    kill_group(self._proc)
        if self.is_alive() and threading.current_thread() is not self:
            self.join(timeout=30 if kill else CLI_TIMEOUT + 30)


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL a child started in a session of its own, with whatever it started."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGCONT)
        os.killpg(proc.pid, signal.SIGKILL)

"""The device run's command lines, checked on the CPU: every flag it passes a benchmark parses, and every
`-k` it hands pytest selects a GPU test.

A device call costs minutes of a 30-minute budget, and a part that dies on `unrecognized arguments` or runs
no test at all ("58 deselected") returns nothing for them. `tests/gpu/device_run.sh` is read as the shell
would expand it with no overrides set (`${VAR:-default}` -> default, `$OUT`, `$PYT`, the loop variables), so
what is checked here is what a call with the planned parts executes.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import runpy
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from _pytest.mark.expression import Expression

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests/gpu/device_run.sh"
OUT = "/tmp/out"
ENDS = {";", "&&", "||", "|", ">", ">>", "2>", ")", "&"}


@dataclass(frozen=True)
class Command:
    part: str  # the shell function it stands in
    argv: tuple[str, ...]  # from `python3` on


def _logical_lines(text: str) -> list[tuple[str, str]]:
    """(enclosing `part_*` function or "", line) with backslash continuations joined."""
    joined, part, out = "", "", []
    for raw in text.splitlines():
        if raw.rstrip().endswith("\\"):
            joined += raw.rstrip()[:-1] + " "
            continue
        line, joined = joined + raw, ""
        m = re.match(r"(\w+)\(\)\s*\{", line)
        if m:
            part = m.group(1)
        out.append((part, line))
    return out


def _expand(line: str, variables: dict[str, str]) -> str:
    for _ in range(3):  # defaults may name other variables
        line = re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", line)
    line = re.sub(r"\$\(\(([\d\s+*-]+)\)\)", lambda m: str(eval(m.group(1))), line)  # noqa: S307 (digits only)
    for name in sorted(variables, key=len, reverse=True):
        line = re.sub(rf"\$\{{?{name}\}}?\b", variables[name], line)
    return line


def _tokens(line: str) -> list[str]:
    lex = shlex.shlex(line, posix=True, punctuation_chars=";&|<>()")
    lex.whitespace_split = True
    lex.commenters = "#"
    return list(lex)


def device_run_commands() -> list[Command]:
    """Every `python3 benchmarks/*.py ...` and `python3 -m pytest ...` the script can run, expanded."""
    lines = _logical_lines(SCRIPT.read_text())
    variables = {"OUT": OUT}
    loops: dict[str, list[str]] = {}
    for _, line in lines:
        m = re.match(r'\s*PYT="([^"]*)"', line)
        if m:
            variables["PYT"] = m.group(1)
        m = re.match(r"\s*local (\w+)=(\S+)\s*(?:$|#)", line)
        if m:
            variables[m.group(1)] = m.group(2)
        m = re.search(r"\bfor (\w+) in ([^;]*); do", line)
        if m:
            values = m.group(2).split()
            loops[m.group(1)] = ["x"] if values[0].startswith("$(") else values
    commands = []
    for part, line in lines:
        if "python3 benchmarks/" not in line and "$PYT" not in line:
            continue
        variants = [line]
        for name, values in loops.items():
            if re.search(rf"\${name}\b", line):
                variants = [re.sub(rf"\${name}\b", v, line) for v in values for line in variants]
        for variant in variants:
            tokens = _tokens(_expand(variant, variables))
            for i, tok in enumerate(tokens):
                if tok == "python3" and i + 1 < len(tokens) and tokens[i + 1] != "-c":
                    argv = []
                    for t in tokens[i:]:
                        if t in ENDS:
                            break
                        argv.append(t)
                    commands.append(Command(part, tuple(argv)))
    return commands


COMMANDS = device_run_commands()
BENCHMARKS = [c for c in COMMANDS if c.argv[1].startswith("benchmarks/")]
PYTESTS = [c for c in COMMANDS if c.argv[1:3] == ("-m", "pytest")]


def test_the_script_is_read_whole():
    # the parts this check must see: a failed parse would pass every test below vacuously
    parts = {c.part for c in COMMANDS}
    assert {
        "part_kernels",
        "part_fp8",
        "part_decode",
        "part_moeroute",
        "part_skinny",
        "part_onelaunch",
    } <= parts
    assert len(BENCHMARKS) >= 25 and len(PYTESTS) >= 12
    assert not [c for c in COMMANDS if any("$" in a for a in c.argv)], "a variable was left unexpanded"


class _Parsed(Exception):
    pass


@pytest.mark.parametrize("command", BENCHMARKS, ids=lambda c: f"{c.part}:{Path(c.argv[1]).stem}")
def test_every_benchmark_call_parses(command: Command, monkeypatch):
    script = ROOT / command.argv[1]
    assert script.is_file(), f"{command.part} runs {command.argv[1]}, which does not exist"
    if "argparse" not in script.read_text() and "gemv_timing" not in script.read_text():
        return  # takes plain paths (startup_log.py)
    original = argparse.ArgumentParser.parse_args

    def parse_then_stop(self, args=None, namespace=None):
        original(self, args, namespace)  # exits 2 with argparse's message on a bad flag or choice
        raise _Parsed

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_then_stop)
    monkeypatch.setattr(sys, "argv", [str(script), *command.argv[2:]])
    monkeypatch.syspath_prepend(str(ROOT))
    try:
        runpy.run_path(str(script), run_name="__main__")
    except _Parsed:
        return
    except SystemExit as exc:
        pytest.fail(f"{command.part}: `{shlex.join(command.argv)}` does not parse (exit {exc.code})")
    pytest.fail(f"{command.part}: {command.argv[1]} finished without parsing its arguments")


def _pytest_selection(argv: tuple[str, ...]) -> tuple[list[str], str | None]:
    """(test files, -k expression) of a pytest command line."""
    files = [a for a in argv if a.startswith("tests/") and ".py" in a]
    k = argv[argv.index("-k") + 1] if "-k" in argv else None
    return files, k


@pytest.fixture(scope="module")
def gpu_test_keywords(tmp_path_factory) -> dict[str, list[str]]:
    """node id -> its keywords (what `-k` matches), for every GPU test the device run names, collected once."""
    files = sorted({f for c in PYTESTS for f in _pytest_selection(c.argv)[0]})
    plugin_dir = tmp_path_factory.mktemp("plugin")
    dump = plugin_dir / "keywords.json"
    (plugin_dir / "dump_keywords.py").write_text(
        "import json\n"
        "def pytest_collection_finish(session):\n"
        f"    json.dump({{i.nodeid: list(i.keywords) for i in session.items}}, open({str(dump)!r}, 'w'))\n"
    )
    env_path = f"{plugin_dir}:{ROOT}"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "gpu", "-p", "no:cacheprovider",
         "-o", "addopts=", "-p", "dump_keywords", *files],
        cwd=ROOT, capture_output=True, text=True, timeout=240, env={**os.environ, "PYTHONPATH": env_path},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(dump.read_text())


def _pytest_id(command: Command) -> str:
    return f"{command.part}:{'+'.join(Path(f).stem for f in _pytest_selection(command.argv)[0])}"


@pytest.mark.parametrize("command", PYTESTS, ids=_pytest_id)
def test_every_pytest_call_selects_gpu_tests(command: Command, gpu_test_keywords):
    files, k = _pytest_selection(command.argv)
    assert files, f"{command.part}: no test file in `{shlex.join(command.argv)}`"
    for f in files:
        assert (ROOT / f.split("::")[0]).is_file(), f"{command.part} names {f}, which does not exist"
    items = {n: kw for n, kw in gpu_test_keywords.items() if any(n.startswith(f) for f in files)}
    for f in files:
        assert any(n.startswith(f) for n in items), f"{command.part}: {f} has no GPU test"
    if k is None:
        return
    expr = Expression.compile(k)
    chosen = [n for n, kw in items.items() if expr.evaluate(lambda name, kw=kw, **_: _matches(name, kw))]
    assert chosen, f"{command.part}: -k {k!r} selects no test of {files}"


def _matches(name: str, keywords: list[str]) -> bool:
    # pytest's -k: a case-insensitive substring of any keyword of the item
    return any(name.lower() in kw.lower() for kw in keywords)

"""Every results file under benchmarks/results/ says where its figures come from, written by its script.

The provenance block (`tokenspeed/bench_results.py`) names the script and its arguments, the commit, the
device and the time. A file without it is a hand-made or renamed one, and a figure the docs cite from it
cannot be traced to a run: this test fails on it.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tokenspeed.bench_results import PROVENANCE_KEYS

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"

def _has_history() -> bool:
    """A checkout with its whole history (not a shallow clone, not a copy without .git)."""
    run = subprocess.run(["git", "rev-parse", "--is-shallow-repository"], cwd=ROOT, capture_output=True, text=True)
    return run.returncode == 0 and run.stdout.strip() == "false"


def _results() -> list[Path]:
    return sorted(RESULTS.glob("*.json"))


@pytest.mark.parametrize("path", _results(), ids=lambda p: p.name)
def test_results_file_records_its_provenance(path: Path):
    data = json.loads(path.read_text())
    assert "provenance" in data, (
        f"{path.name} has no provenance: results files are written only by their benchmark script "
        "(tokenspeed.bench_results.write_results); run the script again instead of editing or renaming a file"
    )
    prov = data["provenance"]
    assert set(PROVENANCE_KEYS) <= set(prov), f"{path.name}: provenance lacks {set(PROVENANCE_KEYS) - set(prov)}"
    script = prov["script"]
    assert script in ("pytest", "tokenspeed") or (ROOT / script).is_file(), f"{path.name}: no script {script!r}"
    assert isinstance(prov["argv"], list)
    # A device command may name its commit abbreviated (TOKENSPEED_COMMIT=$(git rev-parse --short HEAD)); in a
    # checkout with its history the name must still be a commit of it, so a typo or a lost commit fails here.
    commit = prov["commit"] or ""
    assert re.fullmatch(r"[0-9a-f]{7,40}", commit), f"{path.name}: commit {commit!r}"
    if _has_history():
        known = subprocess.run(["git", "cat-file", "-e", f"{commit}^{{commit}}"], cwd=ROOT, capture_output=True)
        assert known.returncode == 0, f"{path.name}: commit {commit} is not in this repository's history"
    assert prov["device"], path.name
    datetime.datetime.strptime(prov["time"], "%Y-%m-%dT%H:%M:%SZ")


def test_a_benchmark_run_writes_its_provenance(tmp_path: Path):
    """A real (small) run of a CPU benchmark: the file it writes names the script, its arguments, this
    checkout's commit, the device and the time."""
    out = tmp_path / "unix_http_cost.json"
    args = ["--servers", "1", "--requests", "5", "--rounds", "1", "--out", str(out)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.run([sys.executable, "benchmarks/unix_http_cost.py", *args], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    prov = json.loads(out.read_text())["provenance"]
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    assert prov["script"] == "benchmarks/unix_http_cost.py"
    assert prov["argv"] == args
    if head:  # a checkout with its history (CI clones one)
        assert prov["commit"] == head
    assert prov["device"].startswith("CPU ")
    written = datetime.datetime.strptime(prov["time"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.UTC)
    assert abs((datetime.datetime.now(datetime.UTC) - written).total_seconds()) < 300


def test_a_named_commit_wins_over_the_copy_s_own_git(tmp_path: Path):
    """On the device the tree arrives with the .git of the session's start; the command names the commit
    that ran (TOKENSPEED_COMMIT), and that is what the file records. Whether the tree differs from it is
    known only when this .git holds that commit."""
    out = tmp_path / "unix_http_cost.json"
    args = ["--servers", "1", "--requests", "3", "--rounds", "1", "--out", str(out)]
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    for named in ("0" * 40, head):
        env = {**os.environ, "PYTHONPATH": str(ROOT), "TOKENSPEED_COMMIT": named}
        run = subprocess.run([sys.executable, "benchmarks/unix_http_cost.py", *args], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=120)  # fmt: skip
        assert run.returncode == 0, run.stderr[-2000:]
        prov = json.loads(out.read_text())["provenance"]
        assert prov["commit"] == named
        if named == "0" * 40 or not head:
            assert prov["dirty"] is None  # a commit this .git does not hold: unknown, not a guess
        else:
            assert isinstance(prov["dirty"], bool)

"""The demo fleet of the quick start, for real: `tokenspeed up profiles/demo.toml` starts the dense and the
MoE demo models on CPU, both answer in English, the built-in load moves their metrics, `down` leaves nothing.

The profile under test extends profiles/demo.toml and changes only the ports (free ones) and the state
directory, so what runs is what the quick start runs.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import httpx
import psutil
import pytest

from tests.console.conftest import free_base_port, tokenspeed
from tests.demo_english import FUNCTION_WORDS, corpus_share, words_of

ROOT = Path(__file__).resolve().parents[2]
DEMO_PROFILE = ROOT / "profiles" / "demo.toml"
SERVERS = {"demo-dense-0": "demo", "demo-dense-1": "demo", "demo-moe-0": "demo-moe"}


def counter(text: str, name: str) -> float:
    """Sum of a Prometheus counter over its label sets."""
    pattern = re.compile(rf"^tokenspeed:{name}(?:\{{[^}}]*\}})? (\S+)$", re.M)
    return sum(float(v) for v in pattern.findall(text))


def fleet_processes(state_dir: Path) -> list[psutil.Process]:
    """The supervisor, the server processes it recorded and their children, still alive."""
    records = []
    for name, key in (("supervisor.pid", None), ("state.json", "servers")):
        try:
            data = json.loads((state_dir / name).read_text())
        except (OSError, ValueError):
            continue
        records += [data] if key is None else [p for s in data[key] for p in s.get("processes", [])]
    found = []
    for record in records:
        try:
            proc = psutil.Process(record["pid"])
            if abs(proc.create_time() - record["create_time"]) < 0.05:
                found += [proc, *proc.children(recursive=True)]
        except psutil.NoSuchProcess:
            continue
    return [p for p in found if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


@pytest.fixture
def demo_fleet(tmp_path):
    base = free_base_port(3)
    profile = tmp_path / "demo-test.toml"
    profile.write_text(f'extends = "{DEMO_PROFILE}"\n\n[fleet]\nbase_port = {base}\n')
    state_dir = tmp_path / "state"
    yield profile, state_dir
    if state_dir.exists():
        tokenspeed("down", "--state-dir", str(state_dir), "--timeout", "10")
        for proc in fleet_processes(state_dir):
            proc.kill()


def test_demo_fleet_up_answers_moves_metrics_and_goes_down(demo_fleet):
    profile, state_dir = demo_fleet
    started = time.monotonic()
    up = tokenspeed("up", "-d", str(profile), "--state-dir", str(state_dir), "--timeout", "150", timeout=170)
    assert up.returncode == 0, up.stdout + up.stderr
    status = json.loads(tokenspeed("status", "--json", "--state-dir", str(state_dir)).stdout)
    servers = {s["name"]: s for s in status["servers"]}
    assert status["fleet"] == "demo" and set(servers) == set(SERVERS)
    assert all(s["state"] == "READY" for s in servers.values()), servers
    print(f"fleet READY in {time.monotonic() - started:.1f}s")

    with httpx.Client(trust_env=False, timeout=60) as http:
        # Both models continue a prompt with English made of the words of their corpus.
        for name, model in SERVERS.items():
            if name.endswith("-1"):
                continue
            body = {"prompt": "The Python interpreter", "max_tokens": 24, "temperature": 0}
            reply = http.post(servers[name]["url"] + "/v1/completions", json=body).json()
            assert reply["model"] == model
            text = reply["choices"][0]["text"]
            words = words_of(text)
            assert len(words) >= 8 and corpus_share(words) >= 0.9, (name, text)
            assert FUNCTION_WORDS & set(words), (name, text)
        # greedy, as the completions above: a sampled answer is sometimes a short question ("The dict.keys do?")
        chat = {"messages": [{"role": "user", "content": "What is a dictionary?"}], "max_tokens": 24, "temperature": 0}
        answer = http.post(servers["demo-moe-0"]["url"] + "/v1/chat/completions", json=chat).json()
        assert re.search(r"[a-z]+ [a-z]+ [a-z]+", answer["choices"][0]["message"]["content"]), answer

        # The built-in [load] keeps every server busy: requests we did not send arrive at each of them.
        def totals() -> dict[str, float]:
            return {
                n: counter(http.get(s["url"] + "/metrics").text, "num_requests_total")
                for n, s in servers.items()
            }

        mine = {"demo-dense-0": 1, "demo-dense-1": 0, "demo-moe-0": 2}
        deadline = time.monotonic() + 45
        while (seen := totals()) and any(seen[n] <= mine[n] for n in SERVERS) and time.monotonic() < deadline:
            time.sleep(1)
        assert all(seen[n] > mine[n] for n in SERVERS), seen
        moe_metrics = http.get(servers["demo-moe-0"]["url"] + "/metrics").text
        assert counter(moe_metrics, "expert_load") > 0  # per-expert routing counts for the heatmap

    # The supervisor's own 1 Hz scrape sees those requests too (what the console and `status` show).
    time.sleep(1.5)
    fleet = json.loads(tokenspeed("status", "--json", "--state-dir", str(state_dir)).stdout)
    assert all((s.get("metrics") or {}).get("requests_total", 0) > 0 for s in fleet["servers"]), fleet

    alive = fleet_processes(state_dir)
    assert len(alive) >= 4  # the supervisor and three servers (and their scheduler children)
    down = tokenspeed("down", "--state-dir", str(state_dir), "--timeout", "20")
    assert down.returncode == 0, down.stdout + down.stderr
    gone, left = psutil.wait_procs(alive, timeout=10)
    assert not left, [p.cmdline() for p in left]
    print(f"whole test {time.monotonic() - started:.1f}s")

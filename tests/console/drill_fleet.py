"""The fleet the incident drills share, the load they put on it, and the drill times they record.

One supervisor runs three servers of tiny models on the CPU, so the drills pay for one start-up:
- `drill-main-0` (Llama, a 256-token KV pool): stalled scheduler, KV pressure, server lost;
- `drill-copy-0` (a copy of the same model in a folder of its own): crash loop, its weights truncated;
- `drill-moe-0` (Qwen3-MoE, experts over two EP ranks with two redundant slots, the recorder on):
  expert imbalance.

Each drill records, as it runs, the seconds from the fault to what the operator sees and the keys pressed
(`DrillLog`); with TOKENSPEED_DRILL_TIMES=path the module writes them there as JSON when it is done
(`benchmarks/console_drills.py` does that for benchmarks/results/console_drills.json).
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import shutil
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

from console.client import SupervisorClient
from console.tui.launch import start_supervisor
from tests.console.tui_support import free_base_port, shutdown
from tokenspeed.bench_results import write_results

MAIN, COPY, MOE = "drill-main-0", "drill-copy-0", "drill-moe-0"
START_TIMEOUT_S = 420.0  # three servers starting at once on a loaded 2-core machine


@dataclass
class Fleet:
    root: Path
    profile: Path
    state_dir: Path
    client: SupervisorClient
    copy_model: Path  # the crash-loop drill truncates a weights file here


def profile_text(model: Path, copy: Path, moe: Path, port: int) -> str:
    return f"""[server]
device = "cpu"
block_size = 16
max_num_seqs = 4
max_model_len = 512

[groups.main]
model = "{model}"
max_total_tokens = 256

[groups.copy]
model = "{copy}"
max_total_tokens = 1024

[groups.moe]
model = "{moe}"
max_total_tokens = 2048
attn_tp_size = 2
ep_size = 2
ep_num_redundant_experts = 2
expert_distribution_recorder_mode = "stat"
enable_expert_distribution_metrics = true

[env]
OMP_NUM_THREADS = "1"
GLOO_SOCKET_IFNAME = "lo"

[fleet]
name = "drill"
base_port = {port}
restart = "on-failure"
max_restarts = 8
restart_window_s = 300
startup_timeout_s = 300
stop_timeout_s = 10
metrics_interval_s = 0.5

[fleet.backoff]
initial_s = 1
max_s = 2
reset_after_s = 60

[fleet.health]
interval_s = 1.0

[supervisor]
stall_after_s = 2
"""


@contextlib.contextmanager
def drill_fleet():
    from tests.tiny_models import make_tiny_model

    root = Path(tempfile.mkdtemp(prefix="tsd-"))
    model = Path(make_tiny_model("llama", root / "models"))
    copy = root / "copy" / model.name
    shutil.copytree(model, copy)
    moe = Path(make_tiny_model("qwen3_moe", root / "moe"))
    profile = root / "drill.toml"
    profile.write_text(profile_text(model, copy, moe, free_base_port(3)))
    state_dir = root / "state"
    start_supervisor(profile, state_dir)
    client = SupervisorClient(state_dir, timeout=5.0)
    try:
        wait_all_ready(client, START_TIMEOUT_S)
        yield Fleet(root, profile, state_dir, client, copy)
    finally:
        shutdown(client, timeout=30)
        shutil.rmtree(root, ignore_errors=True)


def ready(server: dict) -> bool:
    return server["state"] == "READY" and bool(server["metrics"])


def wait_all_ready(client: SupervisorClient, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        servers = client.fleet()["servers"]
        for s in servers:
            assert s["state"] != "FATAL", "\n".join(client.logs(s["name"], 60)["lines"])
        if all(ready(s) for s in servers):
            return
        time.sleep(0.5)
    raise AssertionError(f"the drill fleet was not READY within {timeout:g}s: {client.fleet()['servers']}")


def wait_ready(client: SupervisorClient, name: str, timeout: float, other_than: int | None = None) -> dict:
    """The server once READY with metrics (and, with `other_than`, a process other than that pid)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        server = client.server(name)
        if ready(server) and server["pid"] != other_than:
            return server
        assert server["state"] != "FATAL", "\n".join(client.logs(name, 60)["lines"])
        time.sleep(0.3)
    raise AssertionError(f"{name} not READY within {timeout:g}s")


class Load:
    """Requests kept in flight from threads: one after another per worker, until the block ends."""

    def __init__(self, url: str, workers: int, body: dict):
        self.url, self.body, self.stop = url, body, threading.Event()
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(workers)]

    @classmethod
    def text(cls, url: str, workers: int, prompt_words: int, max_tokens: int) -> Load:
        return cls(url, workers, {"text": "the quick brown fox " * (prompt_words // 4),
                                  "sampling_params": {"max_new_tokens": max_tokens, "ignore_eos": True}})  # fmt: skip

    def _run(self) -> None:
        with httpx.Client(timeout=120, trust_env=False) as client:
            while not self.stop.is_set():
                with contextlib.suppress(httpx.HTTPError):
                    client.post(self.url + "/generate", json=self.body)

    def __enter__(self) -> Load:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()


def lopsided_prompt(url: str, folder: Path) -> tuple[list[int], float]:
    """A prompt (one token repeated) whose tokens the router sends to experts of one EP rank, and its
    balancedness: each candidate is recorded alone (a recording session restarts the window) and the
    recorder's dump says how balanced its load was. The tiny model's weights are seeded, so the first
    candidate usually does; the search keeps the drill independent of that."""
    best: tuple[list[int], float] = ([], 1.0)
    with httpx.Client(base_url=url, timeout=120, trust_env=False) as http:
        for token in (20, *range(5, 64)):
            prompt = [token] * 48
            http.post("/start_expert_distribution_record").raise_for_status()
            http.post("/generate", json={"input_ids": prompt, "sampling_params": {"max_new_tokens": 1}}).raise_for_status()
            dump = http.post("/dump_expert_distribution_record", json={"dir": str(folder)}).json()
            worst = min(dump["results"][0]["balancedness"])
            if worst < best[1]:
                best = (prompt, worst)
            if worst <= 0.6:
                break
    assert best[1] < 0.75, f"no candidate prompt loads one EP rank more than the other: {best}"
    return best


@dataclass
class Drill:
    """One drill as an operator lives it: seconds from the fault, and the keys pressed."""

    name: str
    fault: str
    started: float = field(default_factory=time.monotonic)
    seen: dict[str, float] = field(default_factory=dict)  # what was on screen -> seconds after the fault
    diagnosis_keys: list[str] = field(default_factory=list)
    fix_keys: list[str] = field(default_factory=list)
    fix_effect_s: float | None = None  # from the fix's last key to its effect on screen

    diagnosis_s: float | None = None  # from the fault to the reason on screen
    notes: dict[str, str] = field(default_factory=dict)  # figures worth keeping with the times

    def saw(self, what: str, diagnosis: bool = False) -> float:
        self.seen[what] = round(time.monotonic() - self.started, 2)
        if diagnosis:
            self.diagnosis_s = self.seen[what]
        return self.seen[what]

    def as_json(self) -> dict:
        out = asdict(self)
        out.pop("started")
        out["notice_s"] = min(self.seen.values(), default=None)  # the first thing the operator saw
        out["keys_to_diagnosis"] = len(self.diagnosis_keys)
        out["keys_to_fix"] = len(self.fix_keys)
        return out


@dataclass
class DrillLog:
    drills: list[Drill] = field(default_factory=list)

    def start(self, name: str, fault: str) -> Drill:
        drill = Drill(name, fault)
        self.drills.append(drill)
        return drill

    def write(self, path: str | None) -> None:
        if not path or not self.drills:
            return
        target = Path(path)
        out = {"machine": f"{platform.machine()}, {os.cpu_count()} cores, CPU only (tiny demo models), "
                              f"load average {os.getloadavg()[0]:.1f} when written",
               "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
               "drills": [d.as_json() for d in self.drills]}  # fmt: skip
        if target.exists():  # drills run separately (-k) add to what is there
            with contextlib.suppress(ValueError, KeyError):
                kept = [d for d in json.loads(target.read_text())["drills"] if d["name"] not in
                        {d.name for d in self.drills}]  # fmt: skip
                out["drills"] = kept + out["drills"]
        write_results(target, out)

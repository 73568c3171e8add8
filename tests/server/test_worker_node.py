"""How a worker node (`tokenspeed serve --nnodes 2 --node-rank 1`) ends, as a supervisor sees it.

Real two-node servers on 127.0.0.1 (tiny Llama, --tp 2 over gloo, one rank per node), started together:
- the head stops normally (SIGTERM): its rank 0 sends the stop message, the worker exits 0 and says why;
- the head is killed (SIGKILL): the worker exits non-zero within seconds, saying it lost the head;
- the worker gets SIGTERM itself: it exits 0, and the head, which lost a rank, exits non-zero.
Every scheduler process of both nodes is gone afterwards.
"""

from __future__ import annotations

import signal
import subprocess

import httpx
import psutil
import pytest

from tests.server.server_proc import ServerProc, free_port_block, launch
from tests.tiny_models import make_tiny_model

ENV = {"GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
# Generous for a loaded 2-core machine; a worker that hangs would never exit at all.
EXIT_WITHIN_S = 90.0
CASES = ("head_sigterm", "head_sigkill", "worker_sigterm")


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    root = tmp_path_factory.mktemp("worker-node")
    model = make_tiny_model("llama", root / "model")
    started: dict[str, tuple[ServerProc, ServerProc]] = {}
    try:
        for case in CASES:
            logs = root / case
            logs.mkdir()
            dist = f"127.0.0.1:{free_port_block()}"
            args = ("--tp", "2", "--nnodes", "2", "--dist-init-addr", dist, "--skip-server-warmup")
            head = launch(model, logs, *args, "--node-rank", "0", env=ENV)
            worker = launch(model, logs, *args, "--node-rank", "1", env=ENV)
            started[case] = (head, worker)
        for head, worker in started.values():
            try:
                head.wait_ready()
            except (RuntimeError, TimeoutError) as exc:
                raise RuntimeError(f"{exc}\n--- worker node's log ---\n{worker.log()[-3000:]}") from exc
        yield started
    finally:
        for head, worker in started.values():
            head.stop(signal.SIGKILL, timeout=10)
            worker.stop(signal.SIGKILL, timeout=10)


def descendants(proc: ServerProc) -> list[psutil.Process]:
    return psutil.Process(proc.proc.pid).children(recursive=True)


def wait_exit(proc: ServerProc, who: str) -> int:
    try:
        return proc.proc.wait(timeout=EXIT_WITHIN_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the {who} did not exit within {EXIT_WITHIN_S:.0f} s:\n{proc.log()[-3000:]}")


def assert_gone(procs: list[psutil.Process]) -> None:
    _, alive = psutil.wait_procs(procs, timeout=20)
    alive = [p for p in alive if p.status() != psutil.STATUS_ZOMBIE]
    assert not alive, f"left running: {[(p.pid, p.name()) for p in alive]}"


def serves(head: ServerProc) -> None:
    r = httpx.post(
        f"{head.url}/generate",
        json={"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 4, "ignore_eos": True}},
        timeout=120,
    )
    assert r.status_code == 200 and len(r.json()["output_ids"]) == 4, r.text


def test_head_stopping_normally_lets_the_worker_exit_0(pairs):
    head, worker = pairs["head_sigterm"]
    serves(head)
    children = descendants(head) + descendants(worker)
    assert len(children) >= 2
    head.proc.send_signal(signal.SIGTERM)
    assert wait_exit(head, "head") == 0, head.log()[-3000:]
    code = wait_exit(worker, "worker")
    log = worker.log()
    assert code == 0, log[-3000:]
    assert "got the stop message from the head node" in log, log[-3000:]
    assert "sent the stop message" in log  # the rank's own account
    assert_gone(children)


def test_head_killed_makes_the_worker_exit_non_zero(pairs):
    head, worker = pairs["head_sigkill"]
    serves(head)
    children = descendants(head) + descendants(worker)
    head.proc.send_signal(signal.SIGKILL)
    head.proc.wait(timeout=30)
    code = wait_exit(worker, "worker")
    log = worker.log()
    assert code != 0, log[-3000:]
    assert "lost rank 0 (node 0)" in log and "lost the head node" in log, log[-3000:]
    assert_gone(children)


def test_worker_sigterm_exits_0_and_the_head_reports_the_lost_rank(pairs):
    head, worker = pairs["worker_sigterm"]
    children = descendants(head) + descendants(worker)
    worker.proc.send_signal(signal.SIGTERM)
    assert wait_exit(worker, "worker") == 0, worker.log()[-3000:]
    log = worker.log()
    assert "SIGTERM: stopping this node's scheduler ranks" in log
    # its rank waits in rank 0's next broadcast, yet it stops on the worker's signal, not by the kill timeout
    assert "did not stop in time" not in log, log[-3000:]
    assert wait_exit(head, "head") != 0, head.log()[-3000:]
    assert_gone(children)

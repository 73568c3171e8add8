"""`benchmarks/startup_log.py` reads a server's start-up phases back from its log, as the GPU fleet test and
`serving_gpu.py` print them after each READY. (A log written by a real start is read in
tests/server/test_lifecycle.py.)"""

from __future__ import annotations

from benchmarks.startup_log import phase_lines

# The H200 fleet's log of one start (2026-12-04), as the supervisor and the server wrote it.
H200_LOG = """\
[supervisor 2026-12-04 12:35:33] gpu-8b-0: started (pid 620)
2026-12-04 12:35:44,604 [main] INFO tokenspeed.launch: started 1 child process(es): {'scheduler dp0 tp0': 655}
2026-12-04 12:35:55,012 [dp0 tp0] INFO tokenspeed.runtime.models.loader: weights: 15.0 GiB of random values in 0.0 s
2026-12-04 12:35:55,118 [dp0 tp0] INFO tokenspeed.runtime.execution.model_runner: KV cache: 14870 pages of 64 \
tokens (116181.2 MiB), allocated in 0.0 s
2026-12-04 12:35:56,015 [dp0 tp0] INFO tokenspeed.runtime.execution.model_runner: sampler flashinfer: warmed up \
in 0.6 s
2026-12-04 12:35:56,834 [dp0 tp0] INFO tokenspeed.runtime.execution.cuda_graph: CUDA graphs captured: 35/35 in 0.8 s
2026-12-04 12:35:57,576 [dp0 tp0] INFO tokenspeed.scheduler: ready: max_total_tokens=951680 max_model_len=131072 \
max_req_input_len=131071
2026-12-04 12:35:57,577 [main] INFO tokenspeed.scheduler_client: scheduler dp0 tp0 ready (1/1) after 13.9 s: \
process start and imports 3.9 s, model and weights 0.2 s, KV cache 0.0 s, sampler 0.6 s, CUDA graphs 0.8 s, \
other 8.4 s
INFO:     Started server process [620]
2026-12-04 12:35:58,391 [main] INFO tokenspeed.warmup: warm-up basic
2026-12-04 12:35:58,402 [main] INFO tokenspeed.serve: the server is ready on http://127.0.0.1:30000 (1 child \
processes), 25.6 s after it started
"""


def test_the_h200_fleet_log_shows_every_phase_not_only_ready():
    lines = phase_lines(H200_LOG)
    text = "\n".join(lines)
    # The READY line says "child processes" and "started": it once looked like a new start, so only it
    # was printed.
    assert len(lines) == 10, text
    assert "started (pid 620)" in lines[0] and lines[0].startswith("+   0.0 s")
    assert "started 1 child process(es)" in lines[1] and lines[1].startswith("+  11.6 s")
    assert "CUDA graphs captured: 35/35" in text
    ready = next(x for x in lines if "scheduler dp0 tp0 ready" in x)
    assert ready.endswith("CUDA graphs 0.8 s, other 8.4 s"), ready  # the whole phases line, not cut short
    assert lines[-1].startswith("+  25.4 s (+  0.0)") and "the server is ready" in lines[-1]


def test_only_the_last_start_up_of_a_log_counts():
    restarted = (
        H200_LOG + "[supervisor 2026-12-04 12:40:00] gpu-8b-0: exited unexpectedly (killed by SIGKILL)\n"
    )
    restarted += H200_LOG.replace("12:35:", "12:40:").replace("[supervisor 2026-12-04 12:40:33]",
                                                                  "[supervisor 2026-12-04 12:40:05]")  # fmt: skip
    lines = phase_lines(restarted)
    # the second start: its supervisor note at 12:40:05, its children spawned at 12:40:44.6
    assert len(lines) == 10 and lines[1].startswith("+  39.6 s"), "\n".join(lines)
    # Started by hand twice into one file (no supervisor notes): the second launch line begins a start-up.
    by_hand = "\n".join(x for x in restarted.splitlines() if not x.startswith("[supervisor"))
    lines = phase_lines(by_hand)
    assert len(lines) == 9 and "started 1 child" in lines[0] and lines[0].startswith("+   0.0 s"), lines
    assert lines[-1].startswith("+  13.8 s")

"""Does one large request stall everyone else? The longest pause of a running stream while 10 MB prompts
and other expensive bodies arrive, on the CPU demo model.

    python benchmarks/stall.py                       # starts `tokenspeed serve demo --device cpu` itself
    python benchmarks/stall.py --base-url http://127.0.0.1:8000 --model demo

A victim process streams completions back to back and records when each chunk arrives; meanwhile this
process sends `--big-requests` prompts of `--big-mb` MB (answered 413 above --max-request-bytes, else
refused by the context-length bound unread by the tokenizer), prompts just under the body limit (refused
by the context-length bound), and chat requests long enough to be
tokenized off the event loop, and polls /health. The figure is the longest gap between two chunks of the
victim's stream while those requests were being answered, next to the same stream's longest gap with
nothing else going on. Results go to benchmarks/results/stall_cpu.json. Goal: < 100 ms (was 8.5 s).

Then, with the server's body limit raised past 10 MB (`--shape-body-bytes`; a server this script starts
gets `--max-request-bytes` above it), bodies that are expensive for their shape rather than their text:
10 MB of token ids, 327,680 chat messages (10 MB), 20,000 prompts (120 kB). Each is refused on its shape
(context, message count, --max-sequences-per-request); `by_shape` gives, per shape, its answers and the
longest gap of the stream while that shape's requests were being answered.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.local_server import start_server  # noqa: E402
from tokenspeed.bench_results import write_results  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "stall_cpu.json"


def _victim(base_url: str, model: str, headers: dict, stop, out) -> None:
    """Stream completions back to back until `stop` is set; send every chunk's arrival time to `out`."""
    body = {
        "model": model,
        "prompt": "To open a file,",
        "max_tokens": 400,
        "stream": True,
        "ignore_eos": True,
    }
    with httpx.Client(base_url=base_url, headers=headers, timeout=120) as c:
        while not stop.is_set():
            with c.stream("POST", "/v1/completions", json=body) as r:
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        out.send(time.monotonic())
    out.send(None)


def _gaps(times: list[float], since: float, until: float) -> list[float]:
    return [b - a for a, b in zip(times, times[1:], strict=False) if b >= since and a <= until]


def _window(args, base_url: str, headers: dict, load: str | None) -> dict:
    """Run the victim for one window, with the large requests (`load`: "large" or "shapes") or without;
    return what was measured."""
    ctx = mp.get_context("spawn")
    stop = ctx.Event()
    recv, send = ctx.Pipe(duplex=False)
    victim = ctx.Process(target=_victim, args=(base_url, args.model, headers, stop, send), daemon=True)
    victim.start()
    times: list[float] = []
    while not times:  # the stream is running
        times.append(recv.recv())
    time.sleep(0.5)
    answers, health = [], []
    since = time.monotonic()
    if load == "large":
        answers, health = _send_large(args, base_url, headers)
    elif load == "shapes":
        answers, health = _send(base_url, headers, _shape_plan(args))
    else:
        time.sleep(args.idle_s)
    until = time.monotonic()
    stop.set()
    while True:
        t = recv.recv()
        if t is None:
            break
        times.append(t)
    victim.join(timeout=60)
    gaps = _gaps(times, since, until)
    by_shape = {}
    for kind in dict.fromkeys(a["kind"] for a in answers if load == "shapes"):
        mine = [a for a in answers if a["kind"] == kind]
        spans = [g for a in mine for g in _gaps(times, a.pop("_since"), a.pop("_until"))]
        by_shape[kind] = {"max_gap_ms": round(max(spans) * 1000, 1) if spans else None, "answers": mine}
    return {
        "window_s": round(until - since, 3),
        "chunks": len(gaps),
        "max_gap_ms": round(max(gaps) * 1000, 1) if gaps else None,
        "p50_gap_ms": round(statistics.median(gaps) * 1000, 1) if gaps else None,
        "p99_gap_ms": round(sorted(gaps)[int(0.99 * (len(gaps) - 1))] * 1000, 1) if gaps else None,
        "answers": answers if load != "shapes" else [],
        "health_max_ms": round(max(health) * 1000, 1) if health else None,
        **({"by_shape": by_shape} if load == "shapes" else {}),
    }


def _shape_plan(args) -> list[tuple[str, str, str]]:
    """Bodies expensive for their shape: what fans out (ids, messages, prompts), not their text."""
    ids = json.dumps({"model": args.model, "prompt": [12345] * (args.shape_mb * 1_000_000 // 7), "max_tokens": 4})
    message = {"role": "user", "content": "hi"}
    chat = json.dumps({"model": args.model, "messages": [message] * 327_680, "max_tokens": 4})
    prompts = json.dumps({"model": args.model, "prompt": ["hi"] * 20_000, "max_tokens": 16})
    return (
        [("token_ids_10mb", "/v1/completions", ids)] * args.shape_requests
        + [("chat_327680_messages", "/v1/chat/completions", chat)] * args.shape_requests
        + [("prompts_20000", "/v1/completions", prompts)] * args.shape_requests
    )


def _send_large(args, base_url: str, headers: dict) -> tuple[list[dict], list[float]]:
    big = json.dumps(
        {"model": args.model, "prompt": "word " * (args.big_mb * 1_000_000 // 5), "max_tokens": 4}
    )
    with httpx.Client(base_url=base_url, headers=headers, timeout=120) as c:
        limit = c.get("/get_server_info").json().get("max_request_bytes") or 4 * 1024 * 1024
        under = json.dumps({"model": args.model, "prompt": "word " * ((limit - 1000) // 5), "max_tokens": 4})
        # Under the context bound of the demo model (512 tokens): tokenized for real, off the loop.
        chat = json.dumps(
            {
                "model": args.model,
                "max_tokens": 4,
                "messages": [{"role": "user", "content": "open a file " * 500}],
            }
        )
        plan = [("big", "/v1/completions", big)] * args.big_requests
        plan += [("under_limit", "/v1/completions", under)] * 2 + [
            ("chat_6k_chars", "/v1/chat/completions", chat)
        ] * 4
    answers, health = _send(base_url, headers, plan)
    for a in answers:
        del a["_since"], a["_until"]
    return answers, health


def _send(base_url: str, headers: dict, plan: list[tuple[str, str, str]]) -> tuple[list[dict], list[float]]:
    """Send each (kind, path, body) in turn, polling /health after each; when each was being answered."""
    answers, health = [], []
    with httpx.Client(base_url=base_url, headers=headers, timeout=120) as c:
        for kind, path, body in plan:
            data = body.encode()
            t = time.monotonic()
            r = c.post(path, content=data, headers={"content-type": "application/json"})
            done = time.monotonic()
            error = r.json().get("error", {}) if r.status_code >= 400 else {}
            answers.append({"kind": kind, "bytes": len(data), "status": r.status_code,
                            "code": error.get("code"), "param": error.get("param"),
                            "seconds": round(done - t, 3), "_since": t, "_until": done})  # fmt: skip
            t = time.monotonic()
            c.get("/health")
            health.append(time.monotonic() - t)
    return answers, health


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base-url", help="a running server (default: start the demo model on the CPU)")
    ap.add_argument("--model", default="demo")
    ap.add_argument("--api-key", default=os.environ.get("TOKENSPEED_API_KEY"))
    ap.add_argument("--big-mb", type=int, default=10)
    ap.add_argument("--big-requests", type=int, default=30)
    ap.add_argument("--idle-s", type=float, default=5.0, help="length of the window without large requests")
    ap.add_argument("--shape-mb", type=int, default=10, help="size of the token-id body")
    ap.add_argument("--shape-requests", type=int, default=3, help="requests of each body shape")
    ap.add_argument("--shape-body-bytes", type=int, default=16 * 1024 * 1024,
                    help="--max-request-bytes of a server this script starts, so the shaped bodies are read")
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args()
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    proc = None
    base_url = args.base_url
    if base_url is None:
        serve_args = ["demo", "--device", "cpu", "--max-request-bytes", str(args.shape_body_bytes)]
        proc, base_url = start_server(serve_args)
    try:
        idle = _window(args, base_url, headers, load=None)
        loaded = _window(args, base_url, headers, load="large")
        shapes = _window(args, base_url, headers, load="shapes")
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=60)
    result = {
        "benchmark": "longest inter-chunk gap of a running stream while large prompts arrive",
        "server": f"tokenspeed serve demo --device cpu --max-request-bytes {args.shape_body_bytes}"
        if proc is not None
        else base_url,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "big_prompt_mb": args.big_mb,
        "without_large_requests": idle,
        "with_large_requests": loaded,
        "with_shaped_bodies": shapes,
        "goal_max_gap_ms": 100,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    print(json.dumps(result, indent=2))
    write_results(args.out, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Serving load generator for any OpenAI-compatible endpoint (`tokenspeed bench serving`).

Sends streamed `/v1/completions` (token-id prompts, exact lengths) or `/v1/chat/completions` (text)
requests, either at a request rate (Poisson arrivals) or at a fixed concurrency, over a sweep of values.
Prompt and output lengths are drawn uniformly within `--*-len-range-ratio` of their means; with
`--shared-prefix-len` every prompt starts with the same tokens (exercising prefix caching). Reports
request/token throughput and TTFT, inter-token latency, TPOT and end-to-end latency percentiles, and writes
everything to a JSON file.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import random
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tokenspeed.bench_results import write_results


@dataclass
class RequestSpec:
    prompt_ids: list[int]
    output_len: int


@dataclass
class RequestResult:
    ok: bool
    prompt_len: int
    output_tokens: int = 0
    ttft: float | None = None
    latency: float = 0.0
    itl: list[float] = field(default_factory=list)
    chunks: int = 0  # stream events that carried text; ITL is measured between them
    error: str | None = None


def build_requests(args: argparse.Namespace, rng: random.Random) -> list[RequestSpec]:
    lo_id, hi_id = (int(x) for x in args.token_id_range.split(","))
    prefix = [rng.randrange(lo_id, hi_id) for _ in range(args.shared_prefix_len)]

    def draw(mean: int, ratio: float) -> int:
        lo, hi = max(1, int(mean * (1 - ratio))), max(1, int(mean * (1 + ratio)))
        return rng.randint(lo, hi)

    specs = []
    for _ in range(args.num_prompts):
        n = draw(args.input_len, args.input_len_range_ratio)
        ids = prefix + [rng.randrange(lo_id, hi_id) for _ in range(max(1, n - len(prefix)))]
        specs.append(RequestSpec(ids, draw(args.output_len, args.output_len_range_ratio)))
    return specs


def _json_schema(args: argparse.Namespace) -> dict[str, Any] | None:
    """--json-schema: JSON text, or @PATH of a file holding it."""
    raw = args.json_schema
    if not raw:
        return None
    text = Path(raw[1:]).read_text() if raw.startswith("@") else raw
    return json.loads(text)


def _payload(args: argparse.Namespace, model: str, spec: RequestSpec) -> tuple[str, dict[str, Any]]:
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": spec.output_len,
        "temperature": args.temperature,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if not args.no_ignore_eos:
        body["ignore_eos"] = True  # an extension vLLM, SGLang and TokenSpeed accept: exact output lengths
    schema = _json_schema(args)
    if args.endpoint == "chat":
        words = " ".join(f"w{t}" for t in spec.prompt_ids)  # roughly one token a word for most tokenizers
        body["messages"] = [{"role": "user", "content": words}]
        if schema is not None:
            body["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "bench", "schema": schema},
            }
        return "/v1/chat/completions", body
    if schema is not None:
        body["guided_json"] = schema  # vLLM's (and TokenSpeed's) structured output on /v1/completions
    body["prompt"] = spec.prompt_ids
    return "/v1/completions", body


async def _one(client: httpx.AsyncClient, args, model: str, spec: RequestSpec) -> RequestResult:
    path, body = _payload(args, model, spec)
    res = RequestResult(ok=False, prompt_len=len(spec.prompt_ids))
    start = time.perf_counter()
    last = start
    try:
        async with client.stream("POST", path, json=body) as r:
            if r.status_code != 200:
                res.error = f"HTTP {r.status_code}: {(await r.aread())[:200]!r}"
                return res
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line[6:])
                if "error" in event:
                    res.error = str(event["error"])
                    return res
                if event.get("usage"):
                    res.output_tokens = event["usage"]["completion_tokens"]
                choices = event.get("choices") or []
                if not choices:
                    continue
                delta = choices[0].get("text") or (choices[0].get("delta") or {}).get("content")
                if not delta:
                    continue
                now = time.perf_counter()
                res.chunks += 1
                if res.ttft is None:
                    res.ttft = now - start
                else:
                    res.itl.append(now - last)
                last = now
        res.latency = time.perf_counter() - start
        res.ok = True
    except httpx.HTTPError as exc:
        res.error = f"{type(exc).__name__}: {exc}"
    return res


async def run_load(args, model: str, specs: list[RequestSpec], rate: float, concurrency: int | None) -> dict:
    limits = httpx.Limits(max_connections=(concurrency or len(specs)) + 8, max_keepalive_connections=64)
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    sem = asyncio.Semaphore(concurrency) if concurrency else None
    rng = random.Random(args.seed + 1)
    async with httpx.AsyncClient(
        base_url=args.base_url, timeout=args.timeout, limits=limits, headers=headers
    ) as c:

        async def guarded(spec: RequestSpec) -> RequestResult:
            if sem is None:
                return await _one(c, args, model, spec)
            async with sem:
                return await _one(c, args, model, spec)

        tasks = []
        start = time.perf_counter()
        for spec in specs:
            tasks.append(asyncio.ensure_future(guarded(spec)))
            if math.isfinite(rate) and rate > 0:
                await asyncio.sleep(rng.expovariate(rate))
        results = await asyncio.gather(*tasks)
        duration = time.perf_counter() - start
    return summarize(results, duration, rate, concurrency)


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    k = (len(s) - 1) * q / 100
    f, c = math.floor(k), math.ceil(k)
    return s[f] + (s[c] - s[f]) * (k - f)


def _dist(values: list[float]) -> dict[str, float | None]:
    ms = [v * 1000 for v in values]
    return {
        "mean_ms": statistics.fmean(ms) if ms else None,
        "p50_ms": _pct(ms, 50),
        "p90_ms": _pct(ms, 90),
        "p99_ms": _pct(ms, 99),
    }


def summarize(results: list[RequestResult], duration: float, rate: float, concurrency: int | None) -> dict:
    ok = [r for r in results if r.ok]
    out_tokens = sum(r.output_tokens for r in ok)
    in_tokens = sum(r.prompt_len for r in ok)
    tpot = [
        (r.latency - r.ttft) / (r.output_tokens - 1) for r in ok if r.ttft is not None and r.output_tokens > 1
    ]
    errors = [r.error for r in results if not r.ok]
    chunks = sum(r.chunks for r in ok)
    return {
        "request_rate": rate if math.isfinite(rate) else "inf",
        "max_concurrency": concurrency,
        "completed": len(ok),
        "failed": len(errors),
        "errors": errors[:5],
        "duration_s": duration,
        "request_throughput": len(ok) / duration,
        "input_token_throughput": in_tokens / duration,
        "output_token_throughput": out_tokens / duration,
        "total_input_tokens": in_tokens,
        "total_output_tokens": out_tokens,
        "ttft": _dist([r.ttft for r in ok if r.ttft is not None]),
        "itl": _dist([g for r in ok for g in r.itl]),
        "tpot": _dist(tpot),
        "e2e_latency": _dist([r.latency for r in ok]),
        # ~1 when every token streams as its own text chunk; more, and ITL is time between chunks of tokens
        "tokens_per_chunk": out_tokens / chunks if chunks else None,
    }


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def print_run(run: dict) -> None:
    label = (
        f"concurrency={run['max_concurrency']}" if run["max_concurrency"] else f"rate={run['request_rate']}"
    )
    print(
        f"{label:>18}  ok={run['completed']:<5} failed={run['failed']:<3} "
        f"req/s={run['request_throughput']:.2f}  out tok/s={run['output_token_throughput']:.1f}  "
        f"TTFT p50/p99={_fmt(run['ttft']['p50_ms'])}/{_fmt(run['ttft']['p99_ms'])} ms  "
        f"ITL p50/p99={_fmt(run['itl']['p50_ms'])}/{_fmt(run['itl']['p99_ms'])} ms  "
        f"TPOT p50={_fmt(run['tpot']['p50_ms'])} ms"
    )
    per_chunk = run.get("tokens_per_chunk")
    if per_chunk is None or per_chunk > 1.5:
        shown = "no text at all" if per_chunk is None else f"{per_chunk:.1f} tokens a text chunk"
        print(
            f"{'':>18}  note: {shown}, so ITL and TTFT measure text chunks, not tokens: a tokenizer that "
            "decodes many of the model's ids to nothing (smaller than its vocabulary) or --stream-interval > 1"
        )


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tokenspeed bench serving", description=__doc__.split("\n\n")[0])
    p.add_argument("--base-url", default="http://127.0.0.1:8000", help="server root (without /v1)")
    p.add_argument("--model", default=None, help="model name to send (default: the first of /v1/models)")
    p.add_argument("--api-key", default=None)
    p.add_argument("--endpoint", choices=["completions", "chat"], default="completions")
    p.add_argument("--num-prompts", type=int, default=200)
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument(
        "--input-len-range-ratio", type=float, default=0.0, help="uniform spread around --input-len"
    )
    p.add_argument("--output-len-range-ratio", type=float, default=0.0)
    p.add_argument("--shared-prefix-len", type=int, default=0, help="tokens every prompt starts with")
    p.add_argument("--token-id-range", default="10,300", help="lo,hi for random prompt token ids")
    p.add_argument("--request-rate", default="inf", help="requests/s (Poisson), or a comma list to sweep")
    p.add_argument("--max-concurrency", default=None, help="in-flight cap, or a comma list to sweep")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--no-ignore-eos", action="store_true", help="let EOS end outputs early")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--warmup-requests", type=int, default=2)
    p.add_argument(
        "--json-schema",
        default=None,
        help="constrain every output to this JSON schema (JSON text or @PATH): structured-output cost",
    )
    p.add_argument(
        "--output", default=None, help="JSON path (default benchmarks/results/serving_<time>.json)"
    )
    return p


def _sweep(args) -> list[tuple[float, int | None]]:
    rates = [float(x) for x in str(args.request_rate).split(",")]
    if args.max_concurrency:
        concs = [int(x) for x in str(args.max_concurrency).split(",")]
        if len(rates) > 1:
            raise ValueError("sweep either --request-rate or --max-concurrency, not both")
        return [(rates[0], c) for c in concs]
    return [(r, None) for r in rates]


def _loadavg() -> float | None:
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def _served_model(args) -> str:
    """The first model `/v1/models` lists, with an error that says what to check when it cannot be had."""
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    url = f"{args.base_url}/v1/models"
    try:
        r = httpx.get(url, headers=headers, timeout=30)
    except httpx.HTTPError as exc:
        raise ValueError(
            f"cannot reach {url} ({type(exc).__name__}: {exc}); is the server running and is --base-url right?"
        ) from exc
    if r.status_code == 401:
        raise ValueError(f"{url} answered 401: pass the server's key with --api-key")
    if r.status_code != 200:
        raise ValueError(f"{url} answered HTTP {r.status_code}: {r.text[:200]}; pass the model with --model")
    return r.json()["data"][0]["id"]


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        sweep = _sweep(args)
    except ValueError as exc:
        print(f"error: {exc}")
        return 2
    try:
        model = args.model or _served_model(args)
    except (httpx.HTTPError, ValueError, KeyError, IndexError) as exc:
        print(f"error: {exc}")
        return 2
    specs = build_requests(args, random.Random(args.seed))
    if args.warmup_requests:
        asyncio.run(run_load(args, model, specs[: args.warmup_requests], float("inf"), None))
    runs = []
    for rate, conc in sweep:
        load_before = _loadavg()
        run = asyncio.run(run_load(args, model, specs, rate, conc))
        # On a shared machine the figures mean little without the load they were taken under.
        run["loadavg_1m"] = {"before": load_before, "after": _loadavg()}
        print_run(run)
        runs.append(run)
    out = args.output or f"benchmarks/results/serving_{time.strftime('%Y%m%d_%H%M%S')}.json"
    config = {k: v for k, v in vars(args).items() if k != "api_key"}
    machine = {"cpus": os.cpu_count(), "platform": platform.platform()}
    write_results(out, {"model": model, "config": config, "machine": machine, "runs": runs})
    return 0 if all(r["failed"] == 0 for r in runs) else 1


if __name__ == "__main__":
    raise SystemExit(main())

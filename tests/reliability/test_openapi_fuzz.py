"""Property-based fuzzing of every operation in the server's own /openapi.json: no answer is a 5xx.

`schemathesis` generates bodies, queries and path parameters from the schema the running server
publishes (bodies that fit it, and bodies that break it), with a fixed seed (`derandomize`) and a bounded
number of examples per operation. Every answer must be below 500, and the server must still be healthy
and hold no request afterwards.
"""

from __future__ import annotations

import time

import httpx
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode

from tests.reliability.conftest import SERVED_NAME, wait_idle

EXAMPLES = {GenerationMode.POSITIVE: 60, GenerationMode.NEGATIVE: 30}
# Valid but expensive values are scaled down so that the run stays within seconds on two cores; absurd
# ones (negative, over 2**31) are sent as generated, since those are what must not become a 5xx.
_TOKEN_FIELDS = ("max_tokens", "max_completion_tokens", "max_new_tokens", "min_tokens", "min_new_tokens")
_COUNT_FIELDS = ("n", "best_of")


def _tame(value):
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if type(v) is int and k in _TOKEN_FIELDS and 8 < v < 2**31:
                v = 8
            elif type(v) is int and k in _COUNT_FIELDS and 2 < v <= 128:
                v = 2
            out[k] = _tame(v)
        return out
    if isinstance(value, list):
        return [_tame(v) for v in value]
    return value


def _tamed(case):
    if isinstance(case.body, (dict, list)):
        case.body = _tame(case.body)
    if isinstance(case.body, dict) and "messages" in case.body:
        # A chat request without a limit runs to the end of the context: a few hundred tokens each.
        case.body.setdefault("max_tokens", 8)
    return case


def test_openapi_json_is_behind_the_api_key(served):
    assert httpx.get(f"{served.url}/openapi.json", timeout=10).status_code == 401
    schema = httpx.get(f"{served.url}/openapi.json", headers=served.headers, timeout=10).json()
    assert {"/v1/completions", "/v1/chat/completions", "/generate"} <= set(schema["paths"])


def _fuzz(served, operation, mode: GenerationMode, examples: int, failures: list[str]) -> int:
    """Call `operation` with `examples` generated cases; 5xx answers go to `failures`. Returns the calls."""
    calls = 0

    @settings(
        max_examples=examples,
        derandomize=True,
        deadline=None,
        database=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(case=operation.as_strategy(generation_mode=mode).map(_tamed))
    def call(case) -> None:
        nonlocal calls
        calls += 1
        response = case.call(base_url=served.url, headers=served.headers, timeout=60)
        if response.status_code >= 500:
            failures.append(
                f"{operation.label} [{mode}] {response.status_code}: {case.body!r:.300} -> {response.text[:300]}"
            )

    try:
        call()
    except Unsatisfiable:
        assert mode is GenerationMode.NEGATIVE, operation.label  # nothing to break in a bare GET
    return calls


def test_no_operation_answers_5xx(served):
    raw = httpx.get(f"{served.url}/openapi.json", headers=served.headers, timeout=10).json()
    schema = schemathesis.openapi.from_dict(raw)
    failures: list[str] = []
    calls = 0
    started = time.monotonic()
    for result in schema.get_all_operations():
        operation = result.ok()
        for mode, examples in EXAMPLES.items():
            if mode is GenerationMode.NEGATIVE and not len(operation.body):
                continue  # a path or query without constraints has no invalid values to find
            calls += _fuzz(served, operation, mode, examples, failures)
    took = time.monotonic() - started
    assert not failures, f"{len(failures)} of {calls} calls answered 5xx:\n" + "\n".join(failures[:20])
    assert calls > 250, calls
    print(f"schemathesis: {calls} calls in {took:.1f} s, none 5xx")
    # Still healthy, still answering, and nothing left behind.
    assert wait_idle(served) == 0
    assert httpx.get(f"{served.url}/health", timeout=10).status_code == 200
    r = httpx.post(
        f"{served.url}/v1/completions",
        headers=served.headers,
        json={"model": SERVED_NAME, "prompt": "Hello", "max_tokens": 4},
        timeout=30,
    )
    assert r.status_code == 200, r.text

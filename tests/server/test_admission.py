"""One request cannot make a server unresponsive (issue 30, items 2 and 3).

- `--max-sequences-per-request` bounds prompts and prompts x n: a 20,000-prompt body (120 kB) is a 400
  naming the field and the flag, at once, instead of 146 s of work that starved every other client.
- `--max-queued-requests` / `--max-queued-tokens` bound what the server holds: past them a request is a
  503 with Retry-After, answered at once.
- Bodies whose shape cannot be served (10 MB of token ids, 327,680 chat messages, nesting past 64 levels)
  are refused on their shape, parsed off the event loop: a running stream keeps flowing meanwhile.
"""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

from tests.server.conftest import SERVED_NAME
from tests.server.server_proc import served
from tests.server.timed_stream import TimedStream

MAX_SEQS = 8
MAX_QUEUED = 10
# A loaded two-core CI machine: far below the 1 to 2.6 s these bodies used to stall a stream.
MAX_GAP_S = 0.6


@pytest.fixture(scope="module")
def limited(tiny_model, tmp_path_factory):
    with served(
        tiny_model,
        tmp_path_factory.mktemp("admission-logs"),
        "--served-model-name", SERVED_NAME,
        "--max-sequences-per-request", str(MAX_SEQS),
        "--max-queued-requests", str(MAX_QUEUED),
        "--max-request-bytes", str(16 * 1024 * 1024),
    ) as srv:  # fmt: skip
        yield srv


def _post(srv, path: str, body: dict | bytes, timeout: float = 120) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {**srv.headers, "content-type": "application/json"}
    return httpx.post(f"{srv.url}{path}", content=content, headers=headers, timeout=timeout)


def _refused(r: httpx.Response, param: str, *words: str) -> dict:
    assert r.status_code == 400, f"{r.status_code}: {r.text[:300]}"
    error = r.json()["error"]
    assert error["param"] == param, error
    for w in words:
        assert w in error["message"], error
    return error


def test_twenty_thousand_prompts_are_refused_at_once(server):
    # the session server runs with the default limit
    started = time.monotonic()
    r = _post(server, "/v1/completions", {"model": SERVED_NAME, "prompt": ["hi"] * 20_000, "max_tokens": 16})
    took = time.monotonic() - started
    _refused(r, "prompt", "20000 prompts", "1024", "--max-sequences-per-request")
    assert took < 5, f"the refusal took {took:.1f} s"


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/completions", {"prompt": ["hi"] * (MAX_SEQS + 1)}, "prompt"),
        ("/v1/completions", {"prompt": [[5, 6]] * (MAX_SEQS + 1)}, "prompt"),
        ("/v1/completions", {"prompt": ["hi", "ho", "ha"], "n": 3}, "n"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "n": MAX_SEQS + 1}, "n"),
        ("/generate", {"text": ["hi"] * (MAX_SEQS + 1)}, "text"),
        ("/generate", {"input_ids": [[5, 6]] * (MAX_SEQS + 1)}, "input_ids"),
        ("/generate", {"text": ["hi", "ho"], "sampling_params": {"n": 5}}, "sampling_params.n"),
    ],
    ids=["prompts", "id-prompts", "prompts-x-n", "chat-n", "native-text", "native-ids", "native-n"],
)
def test_sequences_past_the_limit_name_the_field_and_flag(limited, path, body, param):
    if path != "/generate":
        body = {"model": SERVED_NAME, "max_tokens": 2, **body}
    _refused(_post(limited, path, body), param, str(MAX_SEQS), "--max-sequences-per-request")


def test_at_the_limit_is_served(limited):
    r = _post(limited, "/v1/completions", {"model": SERVED_NAME, "prompt": ["hi", "ho"], "n": 4, "max_tokens": 2})
    assert r.status_code == 200, r.text
    assert len(r.json()["choices"]) == MAX_SEQS


def test_past_the_admission_limit_is_503_with_retry_after(limited):
    hold = {"model": SERVED_NAME, "prompt": "Once", "n": MAX_SEQS, "max_tokens": 500, "ignore_eos": True}
    more = {"model": SERVED_NAME, "prompt": "Hi", "n": 3, "max_tokens": 2}
    holder = threading.Thread(target=_post, args=(limited, "/v1/completions", hold), daemon=True)
    holder.start()
    with httpx.Client(base_url=limited.url, headers=limited.headers, timeout=120) as c:
        deadline = time.monotonic() + 60
        while c.get("/get_server_info").json()["num_inflight_requests"] < MAX_SEQS:
            assert time.monotonic() < deadline, "the holding request never started"
            time.sleep(0.02)
        # its 8 sequences are held now: 3 more do not fit, 2 do
        started = time.monotonic()
        r = c.post("/v1/completions", json=more)
        assert time.monotonic() - started < 5
        assert r.status_code == 503, r.text
        assert r.headers.get("retry-after"), r.headers
        error = r.json()["error"]
        assert error["code"] == "server_overloaded" and "--max-queued-requests" in error["message"], error
        assert c.post("/v1/completions", json={**more, "n": 2}).status_code == 200
    holder.join(timeout=120)
    # the holding request is done: the same request is admitted
    r = _post(limited, "/v1/completions", more)
    assert r.status_code == 200, r.text


def _nested(depth: int) -> dict:
    value: dict = {}
    for _ in range(depth):
        value = {"a": value}
    return value


def test_bodies_refused_on_their_shape_do_not_stall_a_stream(limited):
    ten_mb_ids = {"model": SERVED_NAME, "prompt": [12345] * 1_700_000, "max_tokens": 2}
    messages = {"model": SERVED_NAME, "messages": [{"role": "user", "content": "hi"}] * 327_680, "max_tokens": 2}
    cases = [
        ("/v1/completions", ten_mb_ids, "prompt", "context_length_exceeded"),
        ("/generate", {"input_ids": [12345] * 1_700_000}, "input_ids", "context_length_exceeded"),
        ("/v1/chat/completions", messages, "messages", "context_length_exceeded"),
        ("/v1/completions", {"model": SERVED_NAME, "prompt": ["hi"] * 20_000}, "prompt", "too_many_prompts"),
        ("/v1/chat/completions", {**messages, "messages": [{"role": "user", "content": "hi"}],
                                  "metadata": _nested(100)}, None, "invalid_request"),
    ]  # fmt: skip
    bodies = [(path, json.dumps(body).encode(), param, code) for path, body, param, code in cases]
    stream = TimedStream(limited, SERVED_NAME)
    stream.start()
    assert stream.started.wait(60)
    time.sleep(0.3)
    since = time.monotonic()
    for path, body, param, code in bodies:
        r = _post(limited, path, body)
        assert r.status_code == 400, f"{path}: {r.status_code} {r.text[:300]}"
        error = r.json()["error"]
        assert (error["param"], error["code"]) == (param, code), error
    until = time.monotonic()
    stream.join(timeout=120)
    gap = stream.longest_gap(since, until)
    assert gap < MAX_GAP_S, f"the stream paused {gap:.2f} s while the bodies were refused"


def test_a_request_at_the_sequence_limit_does_not_hold_a_running_stream(server):
    """The largest request the session server admits (1024 prompts, the default limit) is served while a
    stream runs: running requests are scheduled before waiting ones and each step's prefill is bounded by
    the chunked-prefill budget, so the stream keeps its tokens coming while the 1024 sequences are served."""
    stream = TimedStream(server, SERVED_NAME)
    stream.start()
    assert stream.started.wait(60)
    time.sleep(0.3)
    since = time.monotonic()
    big = {"model": SERVED_NAME, "prompt": ["hi there"] * 1024, "max_tokens": 4, "ignore_eos": True}
    r = _post(server, "/v1/completions", big, timeout=300)
    until = time.monotonic()
    assert r.status_code == 200, r.text[:300]
    assert len(r.json()["choices"]) == 1024
    stream.join(timeout=300)
    gap = stream.longest_gap(since, until)
    print(f"1024 prompts served in {until - since:.1f} s; the running stream's longest pause {gap * 1000:.0f} ms")
    # Measured 1.7 s on two loaded cores (the 1024 prompts' admission, prefill steps and answer share the
    # front end's loop with the stream); before the sequence limit one such request starved others for 146 s.
    assert gap < 4.0, f"the stream paused {gap:.2f} s while 1024 prompts were served"

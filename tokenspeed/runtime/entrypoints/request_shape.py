"""What a request body may hold, checked on its shape before any per-item work.

A small body can ask for a lot: `{"prompt": ["hi"] * 20000}` is 120 kB and 20,000 sequences; 10 MB of token
ids or 327,680 chat messages cost seconds of validating, tokenizing and template rendering before the
context bound refuses them. These checks look only at the lengths of the lists that fan out (prompts,
token ids, messages, `n`) and at how deep the body nests, so a request that cannot be served is refused
in time proportional to its prompt count, not its size.

Pure functions of the parsed body: they run on the event loop for small bodies and in the body-parsing
process (`body_parser`) for large ones, and raise `ShapeError` with the status, field and flag to report.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from tokenspeed.runtime.engine.prompt_encoder import InvalidText, check_unicode

# Deeper than any tool schema or chat template argument needs; the recursive walks (unicode check, schema
# check, template rendering) stay far from Python's recursion limit.
MAX_DEPTH = 64
# A raw JSON escape of a UTF-16 surrogate: without one, no string of the body can hold a lone surrogate,
# so the walk that looks for them is skipped (a C-speed scan instead of a Python walk over every item).
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89abcdefABCDEF]")


@dataclass(frozen=True)
class ShapeLimits:
    max_sequences: int  # --max-sequences-per-request: prompts x n
    max_prompt_tokens: int | None  # the longest prompt the context takes (None until the server is ready)

    def to_dict(self) -> dict[str, Any]:
        return {"max_sequences": self.max_sequences, "max_prompt_tokens": self.max_prompt_tokens}


class ShapeError(ValueError):
    def __init__(self, message: str, *, param: str | None, code: str = "invalid_request", status: int = 400):
        super().__init__(message)
        self.param, self.code, self.status = param, code, status

    def to_dict(self) -> dict[str, Any]:
        return {"message": str(self), "param": self.param, "code": self.code, "status": self.status}


def parse_and_check(path: str, body: bytes, limits: ShapeLimits) -> Any:
    """The body as JSON, its shape checked for the route at `path`; ShapeError for anything refused."""
    try:
        value = json.loads(body)
    except json.JSONDecodeError as exc:
        raise ShapeError(f"the body is not valid JSON: {exc.msg}: character {exc.pos}", param=None,
                         code="invalid_json") from None  # fmt: skip
    except UnicodeDecodeError as exc:
        raise ShapeError(f"the body is not UTF-8 text: {exc.reason} at byte {exc.start}", param=None,
                         code="invalid_json") from None  # fmt: skip
    except (ValueError, RecursionError):
        raise ShapeError("the body is not JSON this server can read (nested too deeply?)", param=None,
                         code="invalid_json") from None  # fmt: skip
    check_shape(path, value, limits)
    check_depth(value)
    if _SURROGATE_ESCAPE.search(body):
        try:
            check_unicode(value, "")
        except InvalidText as exc:
            raise ShapeError(str(exc), param=exc.param, code="invalid_text") from None
    return value


def check_depth(value: Any, limit: int = MAX_DEPTH) -> None:
    """ShapeError when containers nest deeper than `limit`. Lists of scalars (token ids, stop strings) are
    looked at through their first item only, so a long prompt costs nothing here."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            raise ShapeError(f"the body nests deeper than {limit} levels; flatten it", param=None)
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values() if isinstance(v, (dict, list)))
        elif isinstance(item, list) and item and isinstance(item[0], (dict, list)):
            stack.extend((v, depth + 1) for v in item if isinstance(v, (dict, list)))
        elif isinstance(item, list) and any(isinstance(v, (dict, list)) for v in item[:1024]):
            stack.extend((v, depth + 1) for v in item if isinstance(v, (dict, list)))


def check_shape(path: str, body: Any, limits: ShapeLimits) -> None:
    if not isinstance(body, dict):
        return  # the route's own validation says what a body must be
    if path == "/v1/completions":
        count = _prompt_list(body.get("prompt"), "prompt", limits)
        _check_sequences(count, body.get("n", 1), "prompt", "n", limits)
    elif path == "/v1/chat/completions":
        messages = body.get("messages")
        # Each message is at least one token of the rendered prompt: more than the context holds cannot fit.
        if isinstance(messages, list) and limits.max_prompt_tokens and len(messages) > limits.max_prompt_tokens:
            raise ShapeError(
                f"messages: {len(messages)} messages cannot fit the context of {limits.max_prompt_tokens} "
                "tokens; send fewer", param="messages", code="context_length_exceeded",
            )  # fmt: skip
        _check_sequences(1, body.get("n", 1), "messages", "n", limits)
    elif path == "/generate":
        field = "text" if "text" in body else "input_ids"
        count = _prompt_list(body.get(field), field, limits)
        sampling = body.get("sampling_params")
        ns = [s.get("n", 1) for s in sampling[: limits.max_sequences] if isinstance(s, dict)] if isinstance(
            sampling, list) else [sampling.get("n", 1) if isinstance(sampling, dict) else 1]  # fmt: skip
        n = max((v for v in ns if isinstance(v, int) and not isinstance(v, bool)), default=1)
        _check_sequences(count, n, field, "sampling_params.n", limits)


def _prompt_list(prompt: Any, field: str, limits: ShapeLimits) -> int:
    """How many prompts `prompt` holds; ShapeError for a token-id prompt longer than the context."""
    if not isinstance(prompt, list) or not prompt:
        return 1
    if isinstance(prompt[0], int):
        _check_ids(len(prompt), field, limits)
        return 1
    _check_count(len(prompt), field, limits)
    for i, item in enumerate(prompt):
        if isinstance(item, list):
            _check_ids(len(item), f"{field}[{i}]", limits)
    return len(prompt)


def _check_ids(count: int, field: str, limits: ShapeLimits) -> None:
    if limits.max_prompt_tokens and count > limits.max_prompt_tokens:
        raise ShapeError(
            f"{field}: {count} token ids; this server accepts at most {limits.max_prompt_tokens} a prompt "
            "(its context); shorten the prompt", param=field.split("[")[0], code="context_length_exceeded",
        )  # fmt: skip


def _check_count(count: int, field: str, limits: ShapeLimits) -> None:
    if count > limits.max_sequences:
        raise ShapeError(
            f"{field}: {count} prompts in one request; this server takes at most {limits.max_sequences} "
            "(--max-sequences-per-request): split them over several requests", param=field,
            code="too_many_prompts",
        )  # fmt: skip


def _check_sequences(prompts: int, n: Any, field: str, n_field: str, limits: ShapeLimits) -> None:
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        return  # the route's own validation names a bad n
    if prompts * n > limits.max_sequences:
        raise ShapeError(
            f"{n_field}: {prompts} prompt(s) x n={n} = {prompts * n} sequences in one request; this server "
            f"runs at most {limits.max_sequences} (--max-sequences-per-request): lower n or split the "
            "prompts over several requests", param=n_field, code="too_many_prompts",
        )  # fmt: skip

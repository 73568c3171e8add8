"""Reading the offline Engine's `generate(..., stream=True)` the way a user would, for the stream tests."""

from __future__ import annotations

from typing import Any


def collect_stream(engine: Any, prompts: list[str], params: dict) -> tuple[list[str], list[list[int]], list]:
    """Text, ids and finish reason of each prompt, added up from the chunks; no chunk may follow the final one."""
    n = len(prompts)
    text, ids, finished = [""] * n, [[] for _ in range(n)], [None] * n
    for chunk in engine.generate(prompts, params, stream=True):
        i = chunk["index"]
        assert finished[i] is None, "no chunk after the final one"
        text[i] += chunk["text"]
        ids[i] += chunk["output_ids"]
        if chunk["finished"]:
            finished[i] = chunk["meta_info"]["finish_reason"]
    return text, ids, finished

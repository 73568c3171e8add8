"""Grammar-constrained requests under overlap scheduling, chunked prefill and preemption give the outputs of
the synchronous step, and every constrained output matches its constraint (the demo model, offline Engine).

A constrained request needs its latest token on the host before its next bitmask (engine/overlap.py), so
its steps fall back to the synchronous order while unconstrained requests in the same batches overlap.
"""

from __future__ import annotations

import json
import math
import re

import pytest

from tests.leak_check import assert_no_kv_leak
from tokenspeed import Engine
from tokenspeed.demo_models import DEMO_MODELS

pytestmark = pytest.mark.usefixtures("one_thread")

SCHEMA = {
    "type": "object",
    "properties": {"id": {"type": "integer", "minimum": 0, "maximum": 999}, "tag": {"enum": ["x", "y"]}},
    "required": ["id", "tag"],
    "additionalProperties": False,
}


def test_constrained_and_free_requests_equal_sync_under_overlap():
    prompts = ["Hello there, general", "In Python the import system", "x x " * 8, "Data:"]
    constraint = [
        {"json_schema": json.dumps(SCHEMA)},
        {"regex": "[a-z]{3}-[0-9]{2}"},
        {},
        {"ebnf": 'root ::= "<" [0-9]+ ">"'},
    ]
    params = [
        {"max_new_tokens": 24, "temperature": 1.0, "seed": 10 + i, **c} for i, c in enumerate(constraint)
    ]
    outputs = {}
    # 48 tokens of KV for four requests: some are preempted and recomputed mid-grammar
    kw = dict(device="cpu", dtype="float32", grammar_backend="xgrammar", disable_any_whitespace=True,
              block_size=4, max_total_tokens=48, chunked_prefill_size=8, enable_mixed_batch=True)  # fmt: skip
    for overlap in (False, True):
        with Engine(model=str(DEMO_MODELS[0].path), disable_overlap_schedule=not overlap, **kw) as engine:
            assert engine.core.overlap == overlap
            outputs[overlap] = engine.generate(prompt=prompts, sampling_params=params)
            assert engine.get_stats().num_preemptions > 0
            assert_no_kv_leak(engine)
    for a, b in zip(outputs[True], outputs[False], strict=True):
        assert a["output_ids"] == b["output_ids"]
    texts = [o["text"] for o in outputs[True]]
    value = json.loads(texts[0])
    assert set(value) == {"id", "tag"} and 0 <= value["id"] <= 999 and value["tag"] in ("x", "y")
    assert re.fullmatch("[a-z]{3}-[0-9]{2}", texts[1])
    assert (
        re.fullmatch("<[0-9]+>", texts[3])
        or outputs[True][3]["meta_info"]["finish_reason"]["type"] == "length"
    )


def test_ignore_eos_past_a_completed_grammar_gives_only_stop_tokens():
    with Engine(model=str(DEMO_MODELS[0].path), device="cpu", grammar_backend="xgrammar") as engine:
        (out,) = engine.generate(
            prompt=["Hi"],
            sampling_params={"max_new_tokens": 12, "regex": "ab", "ignore_eos": True, "temperature": 1.0},
        )
        eos = set(engine.core._eos)
        assert out["text"] == "ab" and len(out["output_ids"]) == 12
        assert set(out["output_ids"][2:]) <= eos


def test_offline_top_logprobs_follow_the_bias_and_the_grammar():
    with Engine(model=str(DEMO_MODELS[0].path), device="cpu", grammar_backend="xgrammar") as engine:
        (out,) = engine.generate(
            prompt=["The answer is"],
            sampling_params={"max_new_tokens": 3, "temperature": 0.0, "logprobs": True, "top_logprobs": 4,
                             "regex": "[0-9]{3}", "logit_bias": {"15": 5.0}},
        )  # fmt: skip
    tops = out["meta_info"]["output_top_logprobs"]
    assert len(tops) == 3 and all(len(alts) == 4 for alts in tops)
    for (lp, tid, _), alts in zip(out["meta_info"]["output_token_logprobs"], tops, strict=True):
        assert alts[0][1] == tid and alts[0][0] == pytest.approx(lp)  # greedy: the chosen is the likeliest
        assert [a[0] for a in alts] == sorted((a[0] for a in alts), reverse=True)
        assert sum(math.exp(a[0]) for a in alts) <= 1 + 1e-5
    assert re.fullmatch("[0-9]{3}", out["text"])

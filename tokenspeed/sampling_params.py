"""Per-request sampling parameters, shared by the offline Engine, the HTTP layer and the scheduler.

Plain data (msgpack-friendly through `to_dict` / `from_dict`); `verify()` raises `ValueError` naming the
field and the accepted range, so the HTTP layer can turn it into a 400.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass, field
from typing import Any

# Seeds key torch generators and travel to the schedulers as msgpack integers: a signed 64-bit value (as
# vLLM takes). n > 1 adds the sequence index, which torch's range (up to 2**64 - 1) still holds.
SEED_MIN, SEED_MAX = -(2**63), 2**63 - 1
# Counts (tokens, top-k) are stored in int32 tensors by the samplers and the scheduler.
_COUNT_MAX = 2**31 - 1
_FLOAT_FIELDS = (
    "temperature",
    "top_p",
    "min_p",
    "repetition_penalty",
    "frequency_penalty",
    "presence_penalty",
)
_INT_FIELDS = (
    "max_new_tokens",
    "min_new_tokens",
    "top_k",
    "seed",
    "n",
    "top_logprobs",
    "prompt_logprobs",
    "logprob_start_len",
)
_BOOL_FIELDS = ("ignore_eos", "skip_special_tokens", "logprobs", "include_stop_str_in_output")
# OpenAI clamps logit_bias to this range; chat top_logprobs and completions logprobs=N go up to 20.
LOGIT_BIAS_LIMIT = 100.0
TOP_LOGPROBS_MAX = 20
# Constraints a grammar backend compiles (SGLang's sampling_params spelling); at most one per request.
GRAMMAR_FIELDS = ("json_schema", "regex", "ebnf")


@dataclass
class SamplingParams:
    max_new_tokens: int | None = 128
    min_new_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1 keeps every token (the OpenAI/SGLang convention for "no top-k")
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    seed: int | None = None
    n: int = 1
    stop: list[str] = field(default_factory=list)
    # vLLM's include_stop_str_in_output: the matched stop string stays at the end of the text
    include_stop_str_in_output: bool = False
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    logprobs: bool = False
    top_logprobs: int = 0  # alternatives per output token (with logprobs), most likely first
    logit_bias: dict[int, float] | None = None  # token id -> added to its logit, within +-100
    # Prompt logprobs (vLLM's prompt_logprobs, SGLang's input logprobs): None computes none; N the logprob
    # and rank of each prompt token from `logprob_start_len` on (the first token has none), with the N most
    # likely tokens at its position. Read from the model's raw logits, as vLLM does.
    prompt_logprobs: int | None = None
    logprob_start_len: int = 0
    json_schema: str | None = None  # a JSON schema (text) the output must match
    regex: str | None = None
    ebnf: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        elif self.stop is None:
            self.stop = []
        if self.stop_token_ids is None:
            self.stop_token_ids = []

    @property
    def grammar(self) -> tuple[str, str] | None:
        """(kind, text) of the request's output constraint, or None."""
        for name in GRAMMAR_FIELDS:
            value = getattr(self, name)
            if value is not None:
                return name, value
        return None

    @property
    def is_greedy(self) -> bool:
        return self.temperature <= 1e-5 or self.top_k == 1

    def verify(self) -> None:
        """ValueError naming the field and its range for anything a sampler could not honour."""
        self._verify_types()
        if self.max_new_tokens is not None and self.max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be >= 0, got {self.max_new_tokens}")
        if self.min_new_tokens < 0:
            raise ValueError(f"min_new_tokens must be >= 0, got {self.min_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k == 0 or self.top_k < -1:
            raise ValueError(f"top_k must be -1 (disabled) or >= 1, got {self.top_k}")
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        if self.repetition_penalty <= 0:
            raise ValueError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")
        if not -2.0 <= self.frequency_penalty <= 2.0:
            raise ValueError(f"frequency_penalty must be in [-2, 2], got {self.frequency_penalty}")
        if not -2.0 <= self.presence_penalty <= 2.0:
            raise ValueError(f"presence_penalty must be in [-2, 2], got {self.presence_penalty}")
        if self.n < 1:
            raise ValueError(f"n must be >= 1, got {self.n}")
        if self.seed is not None and not SEED_MIN <= self.seed <= SEED_MAX:
            raise ValueError(f"seed must be a 64-bit integer in [-2**63, 2**63 - 1], got {self.seed}")
        for name in ("max_new_tokens", "min_new_tokens", "top_k", "n"):
            value = getattr(self, name)
            if value is not None and value > _COUNT_MAX:
                raise ValueError(f"{name} must be at most {_COUNT_MAX}, got {value}")
        for tid in self.stop_token_ids:
            if not 0 <= tid <= _COUNT_MAX:
                raise ValueError(f"stop_token_ids: {tid} is not a token id")
        if not 0 <= self.top_logprobs <= TOP_LOGPROBS_MAX:
            raise ValueError(
                f"top_logprobs must be between 0 and {TOP_LOGPROBS_MAX}, got {self.top_logprobs}"
            )
        if self.prompt_logprobs is not None and not 0 <= self.prompt_logprobs <= TOP_LOGPROBS_MAX:
            raise ValueError(
                f"prompt_logprobs must be between 0 and {TOP_LOGPROBS_MAX}, got {self.prompt_logprobs}"
            )
        if self.logprob_start_len < 0:
            raise ValueError(f"logprob_start_len must be >= 0, got {self.logprob_start_len}")
        self._verify_constraints()

    def _verify_constraints(self) -> None:
        if self.logit_bias is not None:
            if not isinstance(self.logit_bias, dict):
                raise ValueError(f"logit_bias must map token ids to numbers, got {self.logit_bias!r}")
            bias: dict[int, float] = {}
            for key, value in self.logit_bias.items():
                try:
                    tid = int(key)
                except (TypeError, ValueError):
                    raise ValueError(f"logit_bias: {key!r} is not a token id") from None
                if not 0 <= tid <= _COUNT_MAX:
                    raise ValueError(f"logit_bias: {key!r} is not a token id")
                if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
                    raise ValueError(f"logit_bias[{key}] must be a number, got {value!r}")
                # OpenAI's documented range: -100 bans a token, 100 forces it; beyond that is clamped.
                bias[tid] = max(-LOGIT_BIAS_LIMIT, min(LOGIT_BIAS_LIMIT, float(value)))
            self.logit_bias = bias or None
        given = [name for name in GRAMMAR_FIELDS if getattr(self, name) is not None]
        if len(given) > 1:
            raise ValueError(f"{' and '.join(given)}: give at most one output constraint per request")
        for name in given:
            if not isinstance(getattr(self, name), str):
                raise ValueError(f"{name} must be a string, got {getattr(self, name)!r}")

    def _verify_types(self) -> None:
        # JSON callers (/generate) hand the fields over as parsed: a string, a NaN or a 2**70 here would
        # otherwise surface as a crash in a scheduler process instead of a 400.
        for name in _FLOAT_FIELDS:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                raise ValueError(f"{name} must be a number, got {value!r}")
            if not math.isfinite(value):
                raise ValueError(f"{name} must be a finite number, got {value}")
        for name in _INT_FIELDS:
            value = getattr(self, name)
            if value is None and name in ("max_new_tokens", "seed", "prompt_logprobs"):
                continue
            if isinstance(value, bool) or not isinstance(value, numbers.Integral):
                raise ValueError(f"{name} must be an integer, got {value!r}")
        for name in _BOOL_FIELDS:
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be true or false, got {getattr(self, name)!r}")
        if not isinstance(self.stop, (list, tuple)) or not all(isinstance(x, str) for x in self.stop):
            raise ValueError(f"stop must be a string or a list of strings, got {self.stop!r}")
        ids = self.stop_token_ids
        if not isinstance(ids, (list, tuple)) or not all(
            isinstance(x, numbers.Integral) and not isinstance(x, bool) for x in ids
        ):
            raise ValueError(f"stop_token_ids must be a list of integers, got {ids!r}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SamplingParams:
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - names
        if unknown:
            raise ValueError(f"unknown sampling parameter(s): {sorted(unknown)}; accepted: {sorted(names)}")
        return cls(**data)

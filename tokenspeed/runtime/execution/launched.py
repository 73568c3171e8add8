"""What a launched step carries until it is resolved (`LaunchedBatch`), and what it gives (`StepResult`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from tokenspeed.runtime.execution.forward_batch import AuxCapture
from tokenspeed.runtime.execution.prompt_logprobs import DevicePromptLogprobs, PromptRows
from tokenspeed.runtime.scheduler.batch import VerifiedRun
from tokenspeed.runtime.scheduler.request import Request


@dataclass
class StepResult:
    """Per item of the ScheduledBatch: the sampled token (-1 when the item did not sample)."""

    token_ids: list[int]
    logprobs: list[float] | None = None
    errors: list[str | None] | None = None
    # per item, (token id, logprob) of the most likely tokens, for the requests that asked (top_logprobs)
    top_logprobs: list[list[tuple[int, float]]] | None = None
    # item index -> (first scored prompt token, its entries on): prompt logprobs computed this step
    prompt_logprobs: dict[int, tuple[int, list[list]]] | None = None
    # per item, the tokens a verify forward emitted for a drafted item (speculative decoding), else None
    runs: list[VerifiedRun | None] | None = None


@dataclass
class LaunchedBatch:
    """A batch whose forward and sampling are queued on the device; `ModelRunner.resolve` reads it back."""

    num_items: int
    sampled: list[int]  # indices of the items that sample, in the order of `token_ids`' rows
    row_of: dict[Request, int] = field(default_factory=dict)  # request -> its row of `token_ids`
    token_ids: torch.Tensor | None = None  # [len(sampled)] int64 on the device
    host: list[torch.Tensor | None] = field(default_factory=list)  # ids, logprobs, NaN rows, top ids, top lps
    copied: Any = None  # torch.cuda.Event recorded after the copies to the host
    prompt_rows: PromptRows | None = None  # the prompt logprobs this batch computes, if any
    prompt_host: DevicePromptLogprobs | None = None  # their host copies
    result: StepResult | None = None  # a verify step's tokens, already on the host (it is synchronous)
    aux_capture: AuxCapture | None = None  # the target states an EAGLE3 draft reads next


def to_host(t: torch.Tensor | None) -> torch.Tensor | None:
    if t is None or t.device.type != "cuda":
        return t
    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    return host.copy_(t, non_blocking=True)

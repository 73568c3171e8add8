"""Prompt logprobs: the logprob of each prompt token under the model, read from the prefill's own logits.

A forward normally keeps one row of logits per request (its last new token). For a request with
`sampling.prompt_logprobs`, a prefill chunk computing positions [s, e) also keeps the rows of the positions
whose next token is a prompt token: the row of position p scores token p + 1. So a prompt split over several
chunks gets every logprob once its last chunk ran, and a batch without such requests computes nothing more.

    prompt:     t0   t1   t2   t3   t4  | (sampled)
    chunk:      [ s = 0 ....... e = 3 )   [ 3 ... 5 )
    rows kept:  p0   p1   p2              p3            (p4 is the sampling row)
    scores:     t1   t2   t3              t4

Logprobs are log_softmax of the model's raw logits (no penalties, bias or grammar: those belong to the
output), with the rank of the prompt token (1 + how many tokens are likelier) and the N most likely tokens,
as vLLM returns them. Everything is computed on the device and copied to the host without waiting.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tokenspeed.runtime.scheduler.batch import ScheduledRequest


@dataclass(frozen=True)
class PromptRows:
    """Which extra logits rows a batch keeps: for item `items[k]`, `counts[k]` rows of the positions from
    `firsts[k]` on, laid out after the batch's last-token rows in item order."""

    items: list[int]  # indices into batch.items
    firsts: list[int]  # first position whose row is kept (it scores token first + 1)
    counts: list[int]
    token_indices: list[int]  # index of each kept row's token in the forward batch
    targets: list[int]  # the prompt token each row scores
    wanted: list[int]  # per kept item, the alternatives its request asked for

    @property
    def num_rows(self) -> int:
        return len(self.targets)

    @property
    def top(self) -> int:
        """The most alternatives any of these requests asked for."""
        return max(self.wanted)


def plan_prompt_rows(items: list[ScheduledRequest]) -> PromptRows | None:
    """The extra rows `items` need (host data only), or None when no item computes a scored position."""
    kept, firsts, counts, token_indices, targets, wanted = [], [], [], [], [], []
    offset = 0  # index of the item's first new token in the forward batch
    for k, it in enumerate(items):
        req = it.req
        if req.prompt_logprobs is not None:
            # position p scores token p + 1: only tokens from prompt_logprobs_from to the prompt's last
            first = max(it.start, req.prompt_logprobs_from - 1)
            end = min(it.start + it.num_new_tokens, req.num_prompt_tokens - 1)
            if first < end:
                kept.append(k)
                firsts.append(first)
                counts.append(end - first)
                token_indices.extend(range(offset + first - it.start, offset + end - it.start))
                targets.extend(req.prompt_ids[first + 1 : end + 1])
                wanted.append(req.sampling.prompt_logprobs or 0)
        offset += it.num_new_tokens
    return PromptRows(kept, firsts, counts, token_indices, targets, wanted) if targets else None


def _to_device(values: list[int], device: torch.device) -> torch.Tensor:
    host = torch.tensor(values, dtype=torch.int64)
    if device.type == "cuda":
        host = host.pin_memory()
    return host.to(device, non_blocking=True)


def row_indices(plan: PromptRows, device: torch.device) -> torch.Tensor:
    """The forward-batch token indices whose logits the model should also return (after the usual ones)."""
    return _to_device(plan.token_indices, device)


@dataclass
class DevicePromptLogprobs:
    """Per kept row, on the device until `to_host` lands: the target's logprob and rank, the top tokens."""

    logprobs: torch.Tensor  # [R] float32
    ranks: torch.Tensor  # [R] int64
    top_ids: torch.Tensor | None  # [R, K] int64
    top_logprobs: torch.Tensor | None  # [R, K] float32


def score_prompt_rows(plan: PromptRows, logits: torch.Tensor) -> DevicePromptLogprobs:
    """[R, V] raw logits of the kept rows -> what the requests asked for, without a host sync."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    targets = _to_device(plan.targets, logits.device)
    chosen = logp.gather(1, targets.unsqueeze(1))
    ranks = (logp > chosen).sum(dim=-1) + 1
    top_ids = top_lps = None
    if plan.top > 0:
        top_lps, top_ids = logp.topk(min(plan.top, logp.shape[1]), dim=-1)
    return DevicePromptLogprobs(chosen.squeeze(1), ranks, top_ids, top_lps)


def entries_per_item(plan: PromptRows, host: DevicePromptLogprobs) -> dict[int, tuple[int, list[list]]]:
    """batch item index -> (first scored token, [[logprob, rank, [[id, logprob], ...]], ...]) once the
    results are on the host."""
    lps, ranks = host.logprobs.tolist(), host.ranks.tolist()
    ids = host.top_ids.tolist() if host.top_ids is not None else None
    tops = host.top_logprobs.tolist() if host.top_logprobs is not None else None
    out: dict[int, tuple[int, list[list]]] = {}
    row = 0
    for j, item in enumerate(plan.items):
        n = plan.wanted[j]
        entries = []
        for r in range(row, row + plan.counts[j]):
            alts = [[ids[r][a], tops[r][a]] for a in range(n)] if n and ids is not None else []
            entries.append([lps[r], ranks[r], alts])
        out[item] = (plan.firsts[j] + 1, entries)
        row += plan.counts[j]
    return out

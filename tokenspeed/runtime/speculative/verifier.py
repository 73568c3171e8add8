"""Verify forward results -> the tokens each drafted request emits (`VerifiedRun`).

A drafted item's forward computed its last known token and k drafts, so the model returned k+1 logit rows:
row j is the target's next-token distribution after the drafts before j. Each row is read as the sampler
would read a request whose tokens already include those drafts (penalties count them, min_new_tokens counts
them as outputs), so `target_probs` gives exactly the distribution plain decoding would sample from there.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from tokenspeed.runtime.grammar.bitmask import fill_token_bitmask
from tokenspeed.runtime.layers.sampling.logit_adjust import read_logprobs
from tokenspeed.runtime.layers.sampling.sampler import Sampler
from tokenspeed.runtime.scheduler.batch import ScheduledRequest, VerifiedRun
from tokenspeed.runtime.scheduler.sample_row import SampleRow
from tokenspeed.runtime.speculative.rejection import greedy_verify, is_greedy, rejection_sample, target_probs


def logit_row_spans(items: Sequence[ScheduledRequest]) -> list[tuple[int, int]]:
    """Per item, its rows [a, b) of the step's logits: one per draft plus one (the runner's layout)."""
    spans, start = [], 0
    for it in items:
        spans.append((start, start + len(it.draft_ids) + 1))
        start += len(it.draft_ids) + 1
    return spans


def drafted_rows(item: ScheduledRequest) -> list[SampleRow]:
    """Row j: the request after its first j drafts, sampling output item.output_index + j."""
    d = tuple(item.draft_ids)
    return [SampleRow(item.req, item.output_index + j, d[:j]) for j in range(len(d) + 1)]


def verify(
    logits: torch.Tensor,
    items: Sequence[ScheduledRequest],
    greedy_backend: bool = False,
    nan_detection: bool = False,
) -> list[VerifiedRun | None]:
    """logits: [sum(k_i + 1), V], the rows of `items` (all drafted) in order. None marks an item whose
    logits held NaN (with --enable-nan-detection; the caller aborts it)."""
    rows = [r for it in items for r in drafted_rows(it)]
    nan_rows = torch.isnan(logits).any(dim=-1).tolist() if nan_detection else None
    if nan_rows is not None and any(nan_rows):
        logits = torch.nan_to_num(logits, nan=0.0)
    probs, adjusted = target_probs(logits, rows, greedy_backend)
    argmax = probs.argmax(dim=-1).tolist()  # a greedy row's one-hot peak
    runs: list[VerifiedRun | None] = []
    tokens_at: list[int] = []  # for logprobs: per emitted token, its row and id
    rows_at: list[int] = []
    start = 0
    for it in items:
        k = len(it.draft_ids)
        end = start + k + 1
        if nan_rows is not None and any(nan_rows[start:end]):
            runs.append(None)
            start = end
            continue
        if is_greedy(it.req, greedy_backend):
            tokens = greedy_verify(argmax[start:end], it.draft_ids)
        else:
            tokens = rejection_sample(probs[start:end], it.draft_ids, None, it.req.generator)
        runs.append(VerifiedRun(tokens=tokens, num_drafted=k))
        if it.req.sampling.logprobs:
            rows_at.extend(range(start, start + len(tokens)))
            tokens_at.extend(tokens)
        start = end
    if rows_at:
        _attach_logprobs(runs, items, adjusted, rows_at, tokens_at)
    return runs


def _attach_logprobs(
    runs: list[VerifiedRun | None],
    items: Sequence[ScheduledRequest],
    adjusted: torch.Tensor,
    rows_at: list[int],
    tokens_at: list[int],
) -> None:
    dev = adjusted.device
    top = max(it.req.sampling.top_logprobs for it in items if it.req.sampling.logprobs)
    chosen, top_ids, top_lps = read_logprobs(
        adjusted[torch.tensor(rows_at, device=dev)], torch.tensor(tokens_at, device=dev), top
    )
    chosen = chosen.tolist()
    top_ids = top_ids.tolist() if top_ids is not None else None
    top_lps = top_lps.tolist() if top_lps is not None else None
    pos = 0
    for it, run in zip(items, runs, strict=True):
        if run is None or not it.req.sampling.logprobs:
            continue
        n = len(run.tokens)
        run.logprobs = chosen[pos : pos + n]
        if top_ids is not None:
            run.top_logprobs = [
                list(zip(top_ids[pos + j], top_lps[pos + j], strict=True)) for j in range(n)
            ]
        pos += n


@dataclass
class VerifiedBatch:
    """Per item of a batch with drafts: what the runner's StepResult carries."""

    token_ids: list[int]  # the last token each sampling item emitted (-1: none)
    runs: list[VerifiedRun | None]  # drafted items: every token they emitted
    logprobs: list[float] | None = None  # plain sampling items' (drafted ones carry theirs in the run)
    top_logprobs: list[list[tuple[int, float]]] | None = None
    errors: list[str | None] | None = None


def verify_batch(
    items: Sequence[ScheduledRequest],
    logits: torch.Tensor,
    sampler: Sampler,
    nan_error: str,
) -> VerifiedBatch:
    """Drafted items are verified; the others that sample draw from their one row through `sampler` (with
    their grammar's bitmask), as in a step without drafts."""
    spans = logit_row_spans(items)
    dev = logits.device
    n = len(items)
    out = VerifiedBatch(token_ids=[-1] * n, runs=[None] * n)
    plain = [i for i, it in enumerate(items) if it.sample and not it.draft_ids]
    if plain:
        rows = logits[torch.tensor([spans[i][0] for i in plain], device=dev)]
        bitmask = fill_token_bitmask([items[i].req.grammar for i in plain], rows.shape[1], dev)
        drawn = sampler(rows, [SampleRow(items[i].req, items[i].output_index) for i in plain], bitmask)
        for j, i in enumerate(plain):
            out.token_ids[i] = drawn.token_ids[j]
        if drawn.logprobs is not None:
            out.logprobs = [0.0] * n
            for j, i in enumerate(plain):
                out.logprobs[i] = drawn.logprobs[j]
        if drawn.top_ids is not None:
            out.top_logprobs = [[] for _ in items]
            for j, i in enumerate(plain):
                out.top_logprobs[i] = list(zip(drawn.top_ids[j], drawn.top_logprobs[j], strict=True))
        if drawn.nan_rows is not None and any(drawn.nan_rows):
            out.errors = [None] * n
            for j, i in enumerate(plain):
                if drawn.nan_rows[j]:
                    out.errors[i] = nan_error
    drafted = [i for i, it in enumerate(items) if it.draft_ids]
    rows = torch.cat([torch.arange(*spans[i], device=dev) for i in drafted])
    runs = verify(
        logits[rows],
        [items[i] for i in drafted],
        greedy_backend=sampler.name == "greedy",
        nan_detection=sampler.enable_nan_detection,
    )
    for i, run in zip(drafted, runs, strict=True):
        if run is None:
            out.errors = out.errors or [None] * n
            out.errors[i] = nan_error
        else:
            out.runs[i] = run
            out.token_ids[i] = run.tokens[-1]
    return out

"""Warm-up requests run once the schedulers are ready and before the server reports healthy.

The default warm-up generates a few tokens (first-call costs: allocator paths, kernels, sampling).
`--warmups a,b` adds named ones from `WARMUPS`; an unknown name fails start-up and lists the known ones.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from tokenspeed.config.server_args import ServerArgs
from tokenspeed.runtime.engine.async_llm import AsyncLLM
from tokenspeed.runtime.engine.tokenizer import apply_chat_template
from tokenspeed.sampling_params import SamplingParams

logger = logging.getLogger("tokenspeed.warmup")

_PROMPT = "The capital city of France is"


def _prompt_ids(llm: AsyncLLM, text: str = _PROMPT) -> list[int]:
    if llm.tokenizer is not None:
        return llm.tokenizer.encode(text)
    return [1, 2, 3, 4, 5, 6, 7, 8]


async def _run(llm: AsyncLLM, ids: list[int], max_new_tokens: int, **sampling: float) -> None:
    params = SamplingParams(
        max_new_tokens=max_new_tokens, ignore_eos=True, **({"temperature": 0.0} | sampling)
    )
    async for out in llm.generate(ids, params, rid=None, stream=False, internal=True):
        if out.finished and out.error:
            raise RuntimeError(f"warm-up request failed: {out.error}")


async def basic(llm: AsyncLLM) -> None:
    ids = _prompt_ids(llm)
    await _run(llm, ids, 8)
    # A sampled request too: greedy steps never reach the sampling kernels, and FlashInfer compiles its
    # sampling family on first use (about 90 s on a fresh machine), which must not be the first user's wait.
    # No seed: seeded rows are drawn by our own Triton kernel, not FlashInfer's.
    await _run(llm, ids, 2, temperature=0.8, top_p=0.9, top_k=20, min_p=0.01)


async def batch(llm: AsyncLLM) -> None:
    """Eight requests at once: exercises batched decode."""
    ids = _prompt_ids(llm)
    await asyncio.gather(*(_run(llm, ids[: max(1, len(ids) - k % 3)], 4) for k in range(8)))


async def chat(llm: AsyncLLM) -> None:
    if llm.tokenizer is None:
        return
    ids = apply_chat_template(llm.tokenizer, [{"role": "user", "content": "Hello!"}])
    await _run(llm, ids, 4)


async def long_prompt(llm: AsyncLLM) -> None:
    """A prompt of about half the accepted length: exercises chunked prefill."""
    limit = llm.limits.max_req_input_len if llm.limits else 256
    base = _prompt_ids(llm, _PROMPT + " Paris.")
    ids = (base * (limit // (2 * len(base)) + 1))[: max(1, limit // 2)]
    await _run(llm, ids, 2)


WARMUPS: dict[str, Callable[[AsyncLLM], Awaitable[None]]] = {
    "basic": basic,
    "batch": batch,
    "chat": chat,
    "long_prompt": long_prompt,
}


def warmup_names(server_args: ServerArgs) -> list[str]:
    """The warm-ups to run, validated (ValueError names the unknown one and the known ones)."""
    names = [] if server_args.skip_server_warmup else ["basic"]
    extra = server_args.warmups
    for name in [n.strip() for n in (extra or "").split(",") if n.strip()]:
        if name not in WARMUPS:
            raise ValueError(f"--warmups: unknown warm-up {name!r}; available: {', '.join(WARMUPS)}")
        if name not in names:
            names.append(name)
    return names


async def run_warmups(llm: AsyncLLM, names: list[str]) -> None:
    for name in names:
        logger.info("warm-up %s", name)
        await WARMUPS[name](llm)

"""Checks of a request's logit bias and output constraint before its sequences start (a 400 if wrong).

The grammar is compiled here, in the grammar backend's thread pool, within --grammar-compile-timeout-secs:
a schema that does not compile, or not in time, is the client's 400 naming the problem, never a failure
inside a scheduler. The scheduler compiles it again from its own cache.
"""

from __future__ import annotations

import asyncio

from tokenspeed.runtime.entrypoints.openai.errors import bad_request
from tokenspeed.runtime.entrypoints.server_state import ServerState
from tokenspeed.runtime.grammar.backend import GrammarBackend, GrammarError
from tokenspeed.sampling_params import SamplingParams


async def _backend(state: ServerState, field: str) -> GrammarBackend:
    if state.grammar is not None:
        return state.grammar
    if state.server_args.grammar_backend == "none":
        raise bad_request(
            f"{field}: structured output is off on this server; start it with --grammar-backend xgrammar "
            "(or llguidance)",
            param=field,
        )
    if state.tokenizer is None:
        raise bad_request(f"{field}: structured output needs the tokenizer (--skip-tokenizer-init is set)")
    args = state.server_args
    # Built on first use, off the event loop: reading a large vocabulary takes a moment.
    backend = await asyncio.to_thread(
        GrammarBackend,
        state.tokenizer,
        state.llm.vocab_size or len(state.tokenizer),
        # only checks that the grammar compiles; the schedulers' matchers know the model's stop tokens
        [state.tokenizer.eos_token_id] if state.tokenizer.eos_token_id is not None else [],
        timeout_s=args.grammar_compile_timeout_secs,
        max_retries=args.grammar_compile_max_retries,
        any_whitespace=not args.disable_any_whitespace,
        name=args.grammar_backend,
    )
    if state.grammar is None:
        state.grammar = backend
    return state.grammar


async def check_constraints(state: ServerState, params: SamplingParams) -> None:
    if params.logit_bias:
        try:
            state.llm.check_token_ids("logit_bias", list(params.logit_bias))
        except ValueError as exc:
            raise bad_request(str(exc), param="logit_bias") from exc
    if params.grammar is None:
        return
    kind, text = params.grammar
    backend = await _backend(state, kind)
    try:
        await backend.check(kind, text)
    except GrammarError as exc:
        raise bad_request(str(exc), param=kind) from exc
